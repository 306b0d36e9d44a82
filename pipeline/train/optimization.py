"""Optimizer, learning-rate schedule and global-norm clipping (spec 7.5).

bilm-tf: Adagrad (lr 0.2, initial accumulator 1.0, no epsilon) over all parameters, after clipping
the global norm of every gradient together (the sparse softmax rows included) to 10.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import nn

SCHEDULES = ("constant", "linear", "cosine")
OPTIMIZERS = ("adagrad", "adam")


def build_optimizer(cfg, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer of ``cfg`` (an OptimizerConfig) over ``params``.

    Adagrad takes sparse softmax gradients (zero-gradient rows are untouched, as in dense Adagrad);
    eps is tiny because TF's Adagrad has none and the accumulator starts at 1.0 anyway.
    """
    name = str(cfg.name)
    if name == "adagrad":
        return torch.optim.Adagrad(
            params,
            lr=float(cfg.lr),
            initial_accumulator_value=float(cfg.initial_accumulator),
            eps=1e-10,
            foreach=False,
        )
    if name == "adam":
        betas = tuple(float(b) for b in cfg.adam_betas)
        if len(betas) != 2:
            raise ValueError(f"optimizer.adam_betas must be two numbers, got {list(cfg.adam_betas)}")
        return torch.optim.Adam(params, lr=float(cfg.lr), betas=betas, eps=float(cfg.adam_eps))
    raise ValueError(f"optimizer.name must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


def takes_sparse_gradients(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer accepts sparse COO gradients (Adagrad does, Adam does not)."""
    return isinstance(optimizer, torch.optim.Adagrad)


def lr_factor(step: int, total_steps: int, schedule: str, warmup_steps: int, final_fraction: float) -> float:
    """Multiplier of the peak lr for the optimizer step numbered ``step`` (0-based) of ``total_steps``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"optimizer.schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    if schedule == "linear":
        return 1.0 - (1.0 - final_fraction) * progress
    return final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_global_norm(grads: Sequence[torch.Tensor], max_norm: float) -> float:
    """Scale dense tensors ``grads`` in place so their joint L2 norm is at most ``max_norm``
    (TF clip_by_global_norm: g * clip / max(norm, clip)); returns the norm before clipping."""
    if not grads:
        return 0.0
    norms = torch._foreach_norm([g.float() for g in grads])
    total = float(torch.linalg.vector_norm(torch.stack([n.to(grads[0].device) for n in norms])))
    if math.isfinite(total) and total > max_norm > 0:
        torch._foreach_mul_(list(grads), max_norm / total)
    return total
