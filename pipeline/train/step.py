"""One rank's model, softmax and optimizer, and the training step (spec 7.3-7.5).

``StepRunner`` owns everything a step touches and nothing about data, checkpoints or logging, so
the trainer and ``benchmarks/train_step.py`` run the very same step.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from elmo_model import BiLM
from elmo_model.lstm import LSTMState
from pipeline.train.data import LMBatch
from pipeline.train.metrics import train_flops_per_token
from pipeline.train.objective import SharedSoftmax, SoftmaxRows, bidirectional_loss
from pipeline.train.optimization import (
    build_optimizer,
    clip_global_norm,
    lr_factor,
    set_lr,
    takes_sparse_gradients,
)
from pipeline.train.softmax_exchange import RowGradient, dense_allreduce_mean, exchange_rows


class TrainingLM(nn.Module):
    """A BiLM's training forward: both streams through the token encoder and LSTM stack.

    char_ids (2, B, U, 50) [0] forward stream, [1] reversed stream; c (N, 2, B, C), h (N, 2, B, P)
    the carried state (None = zeros) -> top (2, B, U, P) (dropout applied in training, spec 7.3),
    and the new c, h. Dropout on every layer's input comes from ``bilm.lstm.dropout``.
    """

    def __init__(self, bilm: BiLM, dropout: float):
        super().__init__()
        self.bilm = bilm
        self.dropout = dropout
        bilm.lstm.dropout = dropout

    def forward(self, char_ids: torch.Tensor, c: torch.Tensor | None, h: torch.Tensor | None):
        _, batch, steps, chars = char_ids.shape
        tokens = self.bilm.token_encoder(char_ids.reshape(2 * batch, steps, chars)).view(2, batch, steps, -1)
        mask = torch.ones(batch, steps, dtype=torch.bool, device=char_ids.device)
        state = LSTMState(c, h) if c is not None else None
        outs, final = self.bilm.lstm(tokens, mask, state)
        top = F.dropout(outs[-1], self.dropout, training=self.training)
        return top, final.c, final.h


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor


class StepRunner:
    """The trainable state of one rank. ``cfg``: a TrainConfig; ``options``: inference options.json dict.

    Every rank seeds the initialisation with ``cfg.seed`` (identical weights), then reseeds its
    dropout and its negatives sampler with its rank. Call ``distribute()`` once any state is
    restored: it wraps the encoder + LSTM in DDP and makes rank 0's softmax everyone's.
    """

    def __init__(self, cfg: Any, options: dict, vocab_size: int, device: torch.device):
        self.cfg, self.options, self.vocab_size, self.device = cfg, options, vocab_size, device
        # the softmax gradients are sparse tensors we build ourselves (sorted unique rows): opt out of
        # the per-tensor invariant checks explicitly, which is also what silences torch's warning
        torch.sparse.check_sparse_tensor_invariants.disable()
        self.rank, self.world = world()
        self.autocast_dtype = torch.bfloat16 if device.type == "cuda" and cfg.bf16 else None
        seed = int(cfg.seed)
        torch.manual_seed(seed)
        self.bilm = BiLM.from_options({**options, "dropout": float(cfg.dropout)})
        self.softmax = SharedSoftmax(vocab_size, int(options["lstm"]["projection_dim"])).to(device)
        self.lm = TrainingLM(self.bilm, float(cfg.dropout)).to(device)
        self.optimizer = build_optimizer(cfg.optimizer, [*self.lm.parameters(), *self.softmax.parameters()])
        self.sparse_optimizer = takes_sparse_gradients(self.optimizer)
        self.negatives = int(cfg.softmax.negatives) if cfg.softmax.sampled else None
        self.generator = torch.Generator().manual_seed(seed * 1000 + self.rank)
        torch.manual_seed(seed * 1000 + 7919 + self.rank)  # dropout masks differ per rank
        self.c: torch.Tensor | None = None
        self.h: torch.Tensor | None = None
        self.step = 0
        self.model: nn.Module = self.lm

    def distribute(self) -> None:
        if self.world == 1:
            return
        ids = [self.device] if self.device.type == "cuda" else None
        self.model = nn.parallel.DistributedDataParallel(self.lm, device_ids=ids)
        for tensor in (self.softmax.weight.data, self.softmax.bias.data):
            dist.broadcast(tensor, src=0)

    def flops_per_step(self, batch_size: int, unroll_steps: int) -> int:
        """Model FLOPs of one rank's step (forward + backward, both directions)."""
        columns = self.negatives + 1 if self.negatives else self.vocab_size
        return 2 * batch_size * unroll_steps * train_flops_per_token(self.options, columns)

    def autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def train_step(self, batch: LMBatch, total_steps: int) -> dict:
        """Forward, backward, softmax gradient exchange, clipping and the update for one batch.

        Returns ``finite`` (False: nothing was updated), ``losses`` [fwd, bwd] averaged over ranks,
        ``grad_norm`` (before clipping), ``lr``, ``rows`` (softmax rows touched by the step on all
        ranks), ``exchange_bytes`` (softmax gradient bytes this rank received) and ``dense_bytes``
        (what a dense ring all-reduce of the softmax gradient would have received).
        """
        cfg = self.cfg
        char_ids, targets = batch.char_ids.to(self.device), batch.targets.to(self.device)
        opt = cfg.optimizer
        set_lr(
            self.optimizer,
            float(opt.lr)
            * lr_factor(
                self.step, total_steps, str(opt.schedule), int(opt.warmup_steps), float(opt.final_lr_fraction)
            ),
        )
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            top, c, h = self.model(char_ids, self.c, self.h)
        self.c, self.h = c.detach(), h.detach()
        step_loss = bidirectional_loss(top, targets, self.softmax, self.negatives, self.generator)
        # bilm-tf differentiates total_loss * unroll_steps: a sum over time, a mean over rows
        (step_loss.loss * targets.shape[-1]).backward()
        rows, exchanged = self._exchange_softmax(step_loss.rows)
        grads = [p.grad for p in self.lm.parameters() if p.grad is not None]
        grads += [self.softmax.weight.grad, self.softmax.bias.grad] if rows is None else [rows.values]
        grad_norm = clip_global_norm(grads, float(cfg.clip_norm))
        if rows is not None:
            self._set_softmax_grads(rows)
        # on the device: NCCL reduces only CUDA tensors
        losses = all_reduce_sum(step_loss.per_direction.float().clone()).cpu() / self.world
        if not bool(torch.isfinite(losses).all()) or not math.isfinite(grad_norm):
            return {"finite": False, "losses": losses.tolist()}
        self.optimizer.step()
        self.step += 1
        width = self.softmax.weight.shape[1] + 1
        return {
            "finite": True,
            "losses": losses.tolist(),
            "grad_norm": grad_norm,
            "lr": self.optimizer.param_groups[0]["lr"],
            "rows": int(rows.ids.shape[0]) if rows is not None else self.vocab_size,
            "exchange_bytes": exchanged,
            "dense_bytes": 2 * (self.world - 1) * self.vocab_size * width * 4 // self.world,
        }

    def _exchange_softmax(self, rows: SoftmaxRows | None) -> tuple[RowGradient | None, int]:
        """Average the softmax gradient over ranks: touched rows only (sparse), or the dense matrix."""
        if rows is None:  # full softmax: every row has a gradient, held by the module itself
            return None, sum(
                dense_allreduce_mean(g) for g in (self.softmax.weight.grad, self.softmax.bias.grad)
            )
        grad = rows.grad()
        if self.cfg.softmax.sparse_exchange:
            return exchange_rows(rows.ids, grad)
        dense = RowGradient(rows.ids, grad).to_dense(self.vocab_size)
        received = dense_allreduce_mean(dense)
        touched = dense.abs().sum(dim=1).nonzero().squeeze(1)
        return RowGradient(touched, dense[touched]), received

    def _set_softmax_grads(self, rows: RowGradient) -> None:
        weight, bias = rows.to_sparse(self.vocab_size)
        if not self.sparse_optimizer:
            weight, bias = weight.to_dense(), bias.to_dense()
        self.softmax.weight.grad, self.softmax.bias.grad = weight, bias
