"""Optimizer, learning-rate schedule and global-norm clipping (docs/training.md#optimisation).

bilm-tf: Adagrad (lr 0.2, initial accumulator 1.0, no epsilon) over all parameters, after clipping
the global norm of every gradient together (the sparse softmax rows included) to 10.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from pipeline.train.config import LRRule, OptimizerName, Schedule

RECIPE_ROWS = 384
"""bilm-tf's global batch (3 GPUs x 128 rows), the one its learning rate was tuned for."""


def peak_lr(cfg, global_rows: int, cuda: bool) -> float:
    """The peak learning rate of ``cfg`` (an OptimizerConfig) for ``global_rows`` rows a step over
    all workers: ``cfg.lr`` scaled by sqrt(global_rows / 384) under the ``sqrt`` rule (``auto`` on
    GPUs; docs/training.md#the-batch-on-a-gpu), as given otherwise."""
    rule = cfg.lr_rule
    if rule is LRRule.auto:
        rule = LRRule.sqrt if cuda else LRRule.as_given
    return cfg.lr * math.sqrt(global_rows / RECIPE_ROWS) if rule is LRRule.sqrt else cfg.lr


def build_optimizer(cfg, params: Iterable[nn.Parameter], device: torch.device) -> torch.optim.Optimizer:
    """The optimizer of ``cfg`` (an OptimizerConfig) over ``params``, in torch's fused form.

    The fused kernels update every tensor in one pass, read the learning rate from a 0-dim device
    tensor (see `DeviceLR`), and take the clipping scale and the skip flag as device tensors
    (``grad_scale`` / ``found_inf``, see `apply_update`), so a step needs no host synchronisation
    and a CUDA graph can capture it. Adagrad: eps is tiny because TF's Adagrad has none and the
    accumulator starts at 1.0 anyway; the sampled softmax's rows are updated by `adagrad_rows_`.
    """
    if cfg.name is OptimizerName.adagrad:
        optimizer = Adagrad(
            params,
            lr=cfg.lr,
            initial_accumulator_value=cfg.initial_accumulator,
            eps=1e-10,
            fused=True,
        )
    else:
        adamw = cfg.name is OptimizerName.adamw
        optimizer = (AdamW if adamw else Adam)(
            params,
            lr=cfg.lr,
            betas=tuple(cfg.adam_betas),
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay if adamw else 0.0,
            fused=True,
            capturable=device.type == "cuda",
        )
    optimizer.bind_lr(torch.zeros((), device=device))
    return optimizer


class DeviceLR:
    """Mixin for a torch optimizer: every group reads its learning rate from one 0-dim float32
    tensor on the parameters' device, so changing it (`set_lr`) puts no host value into a captured
    step. ``state_dict`` stores the rate as a number; ``load_state_dict`` (also of a checkpoint
    written by the unfused optimizer) binds the tensor again and keeps the fused kernels.
    """

    _lr: torch.Tensor

    def bind_lr(self, lr: torch.Tensor) -> None:
        self._lr = lr
        for group in self.param_groups:
            lr.fill_(float(group["lr"]))
            group["lr"] = lr
            group["fused"], group["foreach"] = True, None
            if "capturable" in group:
                group["capturable"] = lr.device.type == "cuda"

    def set_lr(self, lr: float) -> None:
        self._lr.fill_(lr)

    def state_dict(self) -> dict:
        state = super().state_dict()
        for group in state["param_groups"]:
            group["lr"] = float(group["lr"])
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.bind_lr(self._lr)


class Adam(DeviceLR, torch.optim.Adam):
    """torch's fused Adam with its learning rate on the device (`DeviceLR`)."""


class AdamW(DeviceLR, torch.optim.AdamW):
    """torch's fused AdamW with its learning rate on the device (`DeviceLR`)."""


class Adagrad(DeviceLR, torch.optim.Adagrad):
    """torch's fused Adagrad (the same state and ``state_dict``) with its learning rate on the
    device (`DeviceLR`), whose step on CUDA runs `pipeline.train.adagrad_kernel` per tensor:
    torch's fused kernel is CPU-only before torch 2.8, and its unfused steps read the step count on
    the host, which a CUDA graph cannot capture. Reads ``grad_scale`` / ``found_inf`` (see
    `apply_update`)."""

    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"]]
        # the kernel also runs on CPU tensors under Triton's interpreter, which is how tests check it
        if not params or not (params[0].is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
            return super().step(closure)
        from pipeline.train.adagrad_kernel import adagrad_dense_

        found_inf = (
            self.found_inf
            if getattr(self, "found_inf", None) is not None
            else torch.zeros((), device=params[0].device)
        )
        scale = (
            self.grad_scale if getattr(self, "grad_scale", None) is not None else torch.ones_like(found_inf)
        )
        steps = []
        with torch.no_grad():
            for group in self.param_groups:
                if group["lr_decay"] or group["weight_decay"] or group["maximize"]:
                    raise ValueError("Adagrad on CUDA supports lr_decay = weight_decay = 0, maximize = False")
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    adagrad_dense_(p, p.grad, state["sum"], group["lr"], group["eps"], scale, found_inf)
                    steps.append(state["step"])
            if steps:
                torch._foreach_add_(steps, 1.0)
                torch._foreach_sub_(steps, [found_inf] * len(steps))
        return None


def takes_sparse_gradients(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer accepts sparse COO gradients (Adagrad does, Adam does not)."""
    return isinstance(optimizer, torch.optim.Adagrad)


def lr_factor(
    step: int, schedule_steps: int | None, schedule: Schedule, warmup_steps: int, final_fraction: float
) -> float:
    """Multiplier of the peak lr for the optimizer step numbered ``step`` (0-based) of ``schedule_steps``
    (None: not yet known, as before a time budget's first plan: the peak after warm-up)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule is Schedule.constant or schedule_steps is None:
        return 1.0
    span = max(schedule_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    if schedule is Schedule.linear:
        return 1.0 - (1.0 - final_fraction) * progress
    return final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + math.cos(math.pi * progress))


def global_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """The joint L2 norm of ``grads`` as a 0-dim float32 tensor (no host synchronisation)."""
    norms = torch._foreach_norm([g.float() for g in grads])
    return torch.linalg.vector_norm(torch.stack([n.to(grads[0].device) for n in norms]))


def clip_scale(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The divisor that clips gradients of joint norm ``norm`` to ``max_norm`` (TF
    clip_by_global_norm: g * clip / max(norm, clip)); 1 when ``max_norm`` <= 0 (no clipping)."""
    if max_norm <= 0:
        return torch.ones_like(norm)
    return (norm / max_norm).clamp_min(1.0)


def adagrad_rows_(
    optimizer: Adagrad,
    param: nn.Parameter,
    ids: torch.Tensor,
    grads: torch.Tensor,
    grad_scale: torch.Tensor,
    found_inf: torch.Tensor,
) -> None:
    """Sparse Adagrad on rows ``ids`` (K,) of ``param`` (V, ...) with gradients ``grads`` (K, ...).

    torch's sparse Adagrad arithmetic (sum[ids] += g^2; p[ids] -= lr * g / (sqrt(sum[ids]) + eps))
    with g = grads / grad_scale, and nothing changed when ``found_inf`` is 1. ``ids`` must be
    distinct except for slots whose gradient is zero (they add zeros). The state lives in the
    optimizer (``sum`` and ``step`` of ``param``), so checkpoints hold it.
    """
    group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
    state = optimizer.state[param]
    with torch.no_grad():
        g = torch.where(found_inf.bool(), 0.0, grads / grad_scale)
        state["sum"].index_add_(0, ids, g * g)
        std = state["sum"].index_select(0, ids).sqrt_().add_(group["eps"])
        param.index_add_(0, ids, (g / std) * -group["lr"])
        state["step"] += 1.0 - found_inf


def apply_update(optimizer: torch.optim.Optimizer, grad_scale: torch.Tensor, found_inf: torch.Tensor) -> None:
    """The fused optimizer step over every parameter holding a gradient, each gradient divided by
    ``grad_scale`` and nothing changed when ``found_inf`` (0-dim float32) is 1."""
    optimizer.grad_scale, optimizer.found_inf = grad_scale, found_inf
    try:
        optimizer.step()
    finally:
        optimizer.grad_scale = optimizer.found_inf = None
