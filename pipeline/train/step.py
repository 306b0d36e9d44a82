"""One rank's training step: the model, softmax and optimizer of a rank, and nothing about data,
checkpoints or logging (docs/training.md), so ``benchmarks/`` run the very same step.

It never synchronises with the host: its shapes are fixed (B x U positions, a spelling buffer of K
rows, 2 (B U + S) softmax rows), the negatives are drawn and the distinct spellings found on the
host before the device needs them, the softmax rows are summed and exchanged in fixed slots, and
clipping and the skip of a non-finite step are device tensors that the fused optimizer reads. Its
results stay on the device until the loop reads them. So on a GPU the host runs ahead of the
device, and the whole step can be one CUDA graph (``cuda_graph``): forward, backward, exchange and
update replayed with one launch. The token encoder and LSTM are under DDP; the softmax is not (its
gradient travels as touched rows, see ``distributed``).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from elmo_model import BiLM, TrainingLM
from elmo_model.cuda_graph import WARMUP_DDP, WARMUP_SINGLE, GraphedStep
from elmo_model.flops import train_step_flops
from pipeline.train.checkpoint import CheckpointError
from pipeline.train.config import TrainConfig
from pipeline.train.data import LMBatch
from pipeline.train.distributed import (
    RowGradient,
    all_reduce_sum,
    dense_allreduce_mean,
    dense_exchange_bytes,
    exchange_rows,
    rows_exchange_bytes,
    world,
)
from pipeline.train.objective import SharedSoftmax, SoftmaxRows, bidirectional_loss, sample_negatives
from pipeline.train.optimization import (
    adagrad_rows_,
    apply_update,
    build_optimizer,
    clip_scale,
    global_norm,
    lr_factor,
    peak_lr,
    takes_sparse_gradients,
)
from pipeline.train.step_inputs import StepInputs, padded_capacity, step_inputs

PHASES = ("forward", "backward", "exchange", "update")
"""The parts of a step that `PhaseTimer` separates: forward (encoder, LSTM, loss), backward, the
gradient exchange (the softmax rows, and DDP's all-reduce where it did not overlap the backward),
and the update (norm, clip, optimizer)."""


@dataclass
class StepResult:
    """One step's results, on the device (reading them synchronises; read them when logging).

    losses (2,) [fwd, bwd] averaged over ranks; grad_norm (): the norm before clipping; skipped ():
    1.0 when the losses or gradients were not finite and nothing was updated; rows (): softmax rows
    the step touched on all ranks. lr, exchange_bytes (softmax gradient bytes this rank received)
    and dense_bytes (what a dense ring all-reduce of the softmax gradient would have received) are
    known on the host.
    """

    losses: torch.Tensor
    grad_norm: torch.Tensor
    skipped: torch.Tensor
    rows: torch.Tensor
    lr: float
    exchange_bytes: int
    dense_bytes: int
    flops: int
    """Model FLOPs of this rank's step (`elmo_model.flops.train_step_flops`), known on the host."""


class PhaseTimer:
    """Marks the end of each of `PHASES` inside a step: CUDA events on a GPU (recorded inside a
    CUDA graph too, as external events, so attach the timer before the graph is captured), the
    host clock on a CPU. `durations` gives seconds per phase of the last step run; on a GPU read it
    after synchronising. ``available`` is False where this torch cannot record events in a graph.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: dict[str, Any] = {}
        self.available = True

    def mark(self, name: str) -> None:
        if not self.cuda:
            self.marks[name] = time.perf_counter()
            return
        try:
            event = torch.cuda.Event(enable_timing=True, external=True)
        except TypeError:  # a torch without external events
            self.available = False
            return
        event.record()
        self.marks[name] = event

    def durations(self) -> dict[str, float] | None:
        names = ("start", *PHASES)
        if not self.available or any(n not in self.marks for n in names):
            return None
        pairs = list(zip(names, names[1:], strict=False))
        if self.cuda:
            return {b: self.marks[a].elapsed_time(self.marks[b]) / 1e3 for a, b in pairs}
        return {b: self.marks[b] - self.marks[a] for a, b in pairs}


class CarriedState:
    """The LSTM state carried from one window to the next, a checkpoint part: c (N, 2, B, C) and
    h (N, 2, B, P), updated in place by the step (a CUDA graph reads and writes these tensors)."""

    def __init__(self, c: torch.Tensor, h: torch.Tensor):
        self.c, self.h = c, h

    def state_dict(self) -> dict:
        return {"c": self.c.cpu(), "h": self.h.cpu()}

    def load_state_dict(self, state: dict) -> None:
        if state["c"].shape != self.c.shape or state["h"].shape != self.h.shape:
            raise CheckpointError(
                f"the checkpoint holds LSTM states of shape {tuple(state['c'].shape)} for "
                f"{tuple(self.c.shape)}; was batch_size changed?"
            )
        self.c.copy_(state["c"])
        self.h.copy_(state["h"])


class StepRunner:
    """The trainable state of one rank. ``cfg``: a TrainConfig; ``options``: inference options.json dict.

    Every rank seeds the initialisation with ``cfg.seed`` (identical weights), then reseeds its
    dropout and its negatives sampler with its rank. Call ``distribute()`` once any state is
    restored: it wraps the encoder + LSTM in DDP and makes rank 0's softmax everyone's.
    ``state``: the LSTM state carried from window to window.
    """

    def __init__(self, cfg: TrainConfig, options: dict, vocab_size: int, device: torch.device):
        self.cfg, self.options, self.vocab_size, self.device = cfg, options, vocab_size, device
        self.rank, self.world = world()
        self.autocast_dtype = torch.bfloat16 if device.type == "cuda" and cfg.bf16 else None
        seed = cfg.seed
        torch.manual_seed(seed)
        self.bilm = BiLM.from_options({**options, "dropout": cfg.dropout})
        self.softmax = SharedSoftmax(vocab_size, int(options["lstm"]["projection_dim"])).to(device)
        self.lm = TrainingLM(self.bilm, cfg.dropout).to(device)
        self.optimizer = build_optimizer(
            cfg.optimizer, [*self.lm.parameters(), *self.softmax.parameters()], device
        )
        self.negatives = cfg.softmax.negatives if cfg.softmax.sampled else None
        self.sparse_rows = self.negatives is not None and takes_sparse_gradients(self.optimizer)
        self.generator = torch.Generator().manual_seed(seed * 1000 + self.rank)
        torch.manual_seed(seed * 1000 + 7919 + self.rank)  # dropout masks differ per rank
        lstm = self.bilm.lstm
        batch = cfg.batch_size
        self.state = CarriedState(
            torch.zeros(lstm.n_layers, 2, batch, lstm.dim, device=device),
            torch.zeros(lstm.n_layers, 2, batch, lstm.projection_dim, device=device),
        )
        self.nonfinite = torch.zeros((), device=device)
        """Steps skipped for a non-finite loss or gradient, counted on the device."""
        self.peak_lr = peak_lr(cfg.optimizer, cfg.batch_size * self.world, device.type == "cuda")
        """The configured rate under its batch rule (docs/training.md#the-batch-on-a-gpu)."""
        self.step = 0
        self.lr_scale = 1.0
        """Multiplies the configured learning rate (the divergence guard lowers it on a rollback)."""
        self.model: nn.Module = self.lm
        self.timer: PhaseTimer | None = None
        self.inputs: StepInputs | None = None
        self.capacity = 0
        self.graph = (
            GraphedStep(self._run, WARMUP_DDP if self.world > 1 else WARMUP_SINGLE)
            if device.type == "cuda" and cfg.cuda_graph
            else None
        )
        self._dense_softmax_grads: tuple[torch.Tensor, torch.Tensor] | None = None
        self._vocab_rows = torch.tensor(vocab_size, device=device)  # made here: no copy inside a capture
        width = int(options["lstm"]["projection_dim"]) + 1
        self.dense_bytes = dense_exchange_bytes(self.world, vocab_size * width)
        """Softmax gradient bytes a rank receives per step from a dense ring all-reduce."""
        rows = 2 * (batch * cfg.unroll_steps + (self.negatives or 0))
        sparse_bytes = rows_exchange_bytes(self.world, rows, width)
        # the rows exchange moves world x K rows with their repeats: with a small vocabulary and
        # many ranks the dense all-reduce is cheaper, and then it is used instead
        self.sparse_exchange = (
            self.negatives is not None and cfg.softmax.sparse_exchange and sparse_bytes < self.dense_bytes
        ) or self.world == 1
        self.exchange_bytes = sparse_bytes if self.sparse_exchange else self.dense_bytes
        """Softmax gradient bytes this rank receives per step."""

    def distribute(self) -> None:
        if self.world == 1:
            return
        ids = [self.device] if self.device.type == "cuda" else None
        # PyTorch's recipe for capturing DDP's backward: construct it on a side stream
        stream = self.graph.stream if self.graph is not None else None
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            self.model = nn.parallel.DistributedDataParallel(self.lm, device_ids=ids)
        for tensor in (self.softmax.weight.data, self.softmax.bias.data):
            dist.broadcast(tensor, src=0)

    def step_flops(self, inputs: StepInputs) -> int:
        """Model FLOPs of one rank's step (forward + backward, both streams) from its host inputs."""
        columns = self.negatives + 1 if self.negatives else self.vocab_size
        return train_step_flops(self.options, columns, inputs.positions.numel(), inputs.chars.shape[0])

    def autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        # no weight-cast cache: a CUDA graph must re-run the casts on every replay
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, cache_enabled=False)

    def reset_graph(self) -> None:
        """Capture the step again at its next run (after state tensors were replaced)."""
        if self.graph is not None:
            self.graph.reset()

    def nonfinite_steps(self) -> int:
        """Steps skipped so far for a non-finite loss or gradient (synchronises with the device)."""
        return int(self.nonfinite.item())

    # -- one step ------------------------------------------------------------------------------
    def train_step(self, batch: LMBatch, schedule_steps: int | None) -> StepResult:
        """Forward, backward, softmax gradient exchange, clipping and the update for one batch;
        the learning rate's schedule decays over ``schedule_steps`` (None: not yet planned).

        Returns without waiting for the device; a non-finite step changes nothing and counts in
        ``nonfinite``.
        """
        opt = self.cfg.optimizer
        lr = (
            self.peak_lr
            * self.lr_scale
            * lr_factor(self.step, schedule_steps, opt.schedule, opt.warmup_steps, opt.final_lr_fraction)
        )
        self.optimizer.set_lr(lr)
        negatives = (
            sample_negatives(self.negatives, self.vocab_size, self.generator) if self.negatives else None
        )
        host = step_inputs(batch, negatives)
        if self.graph is None:
            self.inputs = host.pin_memory().to(self.device) if self.device.type == "cuda" else host
            out = self._run()
        else:
            out = self._graph_step(host, negatives)
        self.step += 1
        return StepResult(
            losses=out["losses"],
            grad_norm=out["grad_norm"],
            skipped=out["skipped"],
            rows=out["rows"],
            lr=lr,
            exchange_bytes=self.exchange_bytes,
            dense_bytes=self.dense_bytes,
            flops=self.step_flops(host),
        )

    def _graph_step(self, host: StepInputs, negatives) -> dict[str, torch.Tensor]:
        distinct = host.chars.shape[0]
        if distinct > self.capacity:
            # a larger spelling buffer: the graph reads fixed addresses, so it is captured again
            self.capacity = padded_capacity(distinct, host.positions.numel())
            self.inputs = StepInputs(
                chars=torch.zeros(self.capacity, host.chars.shape[1], dtype=torch.long, device=self.device),
                positions=torch.empty_like(host.positions, device=self.device),
                targets=torch.empty_like(host.targets, device=self.device),
                negatives=None if negatives is None else negatives.to(self.device),
            )
            self.graph.reset()
        self.inputs.copy_(host.pin_memory())
        return self.graph()

    def _run(self) -> dict[str, torch.Tensor]:
        """The step on the device, from ``self.inputs``: no host synchronisation (see the module doc)."""
        inputs, timer = self.inputs, self.timer
        mark = timer.mark if timer is not None else (lambda name: None)
        mark("start")
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            top, c, h = self.model(inputs.chars, inputs.positions, self.state.c, self.state.h)
        step_loss = bidirectional_loss(
            top,
            inputs.targets,
            self.softmax,
            inputs.negatives,
            self.autocast_dtype,
            self.cfg.softmax.offset_penalty,
        )
        mark("forward")
        # bilm-tf differentiates total_loss * unroll_steps: a sum over time, a mean over rows
        (step_loss.loss * inputs.targets.shape[-1]).backward()
        mark("backward")
        rows = self._exchange_softmax(step_loss.rows)
        losses = all_reduce_sum(step_loss.per_direction.float().clone()) / self.world
        mark("exchange")
        grads = [p.grad for p in self.lm.parameters() if p.grad is not None]
        grads += [self.softmax.weight.grad, self.softmax.bias.grad] if rows is None else [rows.values]
        norm = global_norm(grads)
        skipped = (~(torch.isfinite(norm) & torch.isfinite(losses).all())).float()
        with torch.no_grad():  # a skipped step leaves the carried state as it was, too
            self.state.c.copy_(torch.where(skipped.bool(), self.state.c, c))
            self.state.h.copy_(torch.where(skipped.bool(), self.state.h, h))
        scale = clip_scale(norm, self.cfg.clip_norm)
        if rows is not None:
            self._softmax_rows_update(rows, scale, skipped)
        apply_update(self.optimizer, scale, skipped)
        self.nonfinite += skipped
        mark("update")
        count = rows.count() if rows is not None else self._vocab_rows
        return {"losses": losses, "grad_norm": norm, "skipped": skipped, "rows": count}

    def _exchange_softmax(self, rows: SoftmaxRows | None) -> RowGradient | None:
        """The softmax gradient averaged over ranks: summed rows (sampled), or the dense matrix in
        place in the module's ``.grad`` (full softmax; returns None)."""
        if rows is None:
            for grad in (self.softmax.weight.grad, self.softmax.bias.grad):
                dense_allreduce_mean(grad)
            return None
        grad = rows.grad()
        if self.sparse_exchange:
            return exchange_rows(rows.ids, grad, self.vocab_size)[0]
        dense = RowGradient(rows.ids, grad, torch.ones_like(rows.ids, dtype=torch.bool)).to_dense(
            self.vocab_size
        )
        dense_allreduce_mean(dense)
        # every row is a slot; the untouched ones carry zeros, which the updates leave alone
        ids = torch.arange(self.vocab_size, device=dense.device)
        return RowGradient(ids, dense, dense.ne(0).any(dim=1))

    def _softmax_rows_update(self, rows: RowGradient, scale: torch.Tensor, skipped: torch.Tensor) -> None:
        """Adagrad: update the touched rows only. Adam: hand it a dense gradient (its moments move
        every row, as dense Adam does)."""
        dim = self.softmax.weight.shape[1]
        if self.sparse_rows:
            adagrad_rows_(self.optimizer, self.softmax.weight, rows.ids, rows.values[:, :dim], scale, skipped)
            adagrad_rows_(self.optimizer, self.softmax.bias, rows.ids, rows.values[:, dim], scale, skipped)
            return
        if self._dense_softmax_grads is None:
            self._dense_softmax_grads = (
                torch.zeros_like(self.softmax.weight),
                torch.zeros_like(self.softmax.bias),
            )
        weight, bias = self._dense_softmax_grads
        weight.zero_().index_add_(0, rows.ids, rows.values[:, :dim])
        bias.zero_().index_add_(0, rows.ids, rows.values[:, dim])
        self.softmax.weight.grad, self.softmax.bias.grad = weight, bias
