"""One rank's training: the step and the loop around it, top to bottom (docs/training.md).

The driver side (checks, plan, Ray Train launch) is ``launch.py``; this is what every worker runs.

The step (``StepRunner``) owns the model, softmax and optimizer of one rank and nothing about data,
checkpoints or logging, so ``benchmarks/train_step.py`` runs the very same step. It never
synchronises with the host: its shapes are fixed (B x U positions, a spelling buffer of K rows,
2 (B U + S) softmax rows), the negatives are drawn and the distinct spellings found on the host
before the device needs them, the softmax rows are summed and exchanged in fixed slots, and
clipping and the skip of a non-finite step are device tensors that the fused optimizer reads. Its
results stay on the device until the loop reads them. So on a GPU the host runs ahead of the
device, and the whole step can be one CUDA graph (``cuda_graph``): forward, backward, exchange and
update replayed with one launch.

The loop (``Trainer``) feeds it batches and asks its components whether they are due: the run
log (every ``log_every`` steps), the evaluator (every ``eval_every``), the checkpointer (every
``checkpoint_every``, and each at the last step). Only then does it wait for the device. The
token encoder and LSTM are under DDP; the softmax is not (its gradient travels as touched rows,
see ``distributed``). Every rank runs the same number of steps, because the row streams never run
dry (``data``).
"""

from __future__ import annotations

import itertools
import logging
import os
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from elmo_model import BiLM, TrainingLM
from elmo_model.cuda_graph import WARMUP_DDP, WARMUP_SINGLE, GraphedStep
from elmo_model.flops import train_flops_per_token
from pipeline import shard_format, storage
from pipeline.config import to_dict
from pipeline.train import export as export_mod
from pipeline.train.char_cache import CharCache
from pipeline.train.checkpoint import Checkpointer, CheckpointError, RNGStates, latest_checkpoint
from pipeline.train.config import OnDivergence, TrainConfig
from pipeline.train.data import LMBatch, ReadAhead, open_lm_batches
from pipeline.train.distributed import (
    RowGradient,
    all_reduce_sum,
    dense_allreduce_mean,
    dense_exchange_bytes,
    exchange_rows,
    rows_exchange_bytes,
    world,
)
from pipeline.train.divergence import DivergenceGuard, GuardReading
from pipeline.train.errors import TrainError
from pipeline.train.evaluate import EVAL_UNROLL_STEPS, Evaluator, perplexity
from pipeline.train.metrics import PLOT_FILE, RunLog, measure_matmul_peak, plot_perplexity
from pipeline.train.objective import SharedSoftmax, SoftmaxRows, bidirectional_loss, sample_negatives
from pipeline.train.optimization import (
    adagrad_rows_,
    apply_update,
    build_optimizer,
    clip_scale,
    global_norm,
    lr_factor,
    takes_sparse_gradients,
)
from pipeline.train.plan import RunPlan
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

    def flops_per_step(self, batch_size: int, unroll_steps: int) -> int:
        """Model FLOPs of one rank's step (forward + backward, both directions)."""
        columns = self.negatives + 1 if self.negatives else self.vocab_size
        return 2 * batch_size * unroll_steps * train_flops_per_token(self.options, columns)

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
    def train_step(self, batch: LMBatch, total_steps: int) -> StepResult:
        """Forward, backward, softmax gradient exchange, clipping and the update for one batch.

        Returns without waiting for the device; a non-finite step changes nothing and counts in
        ``nonfinite``.
        """
        opt = self.cfg.optimizer
        lr = (
            opt.lr
            * self.lr_scale
            * lr_factor(self.step, total_steps, opt.schedule, opt.warmup_steps, opt.final_lr_fraction)
        )
        self.optimizer.set_lr(lr)
        negatives = (
            sample_negatives(self.negatives, self.vocab_size, self.generator) if self.negatives else None
        )
        if self.graph is None:
            host = step_inputs(batch, negatives)
            self.inputs = host.pin_memory().to(self.device) if self.device.type == "cuda" else host
            out = self._run()
        else:
            out = self._graph_step(batch, negatives)
        self.step += 1
        return StepResult(
            losses=out["losses"],
            grad_norm=out["grad_norm"],
            skipped=out["skipped"],
            rows=out["rows"],
            lr=lr,
            exchange_bytes=self.exchange_bytes,
            dense_bytes=self.dense_bytes,
        )

    def _graph_step(self, batch: LMBatch, negatives) -> dict[str, torch.Tensor]:
        host = step_inputs(batch, negatives)
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


# ---- the loop ----------------------------------------------------------------------------------


class Trainer:
    """One rank's training run: data, checkpoints, evaluation and logging around a ``StepRunner``.

    ``cfg`` is the resolved TrainConfig. ``report``: also send the final status row to
    ``ray.train.report`` (under Ray Train; every rank alike).
    Outside Ray Train (``report=False``, no process group) it runs as a single rank in-process.
    """

    def __init__(self, cfg: TrainConfig, plan: RunPlan, device: torch.device, report: bool = False):
        self.cfg, self.plan, self.device = cfg, plan, device
        if plan.storage_endpoint:
            storage.configure(endpoint_url=plan.storage_endpoint)
        self.runner = runner = StepRunner(cfg, plan.options, plan.vocab_size, device)
        self.rank, self.world = runner.rank, runner.world
        self.vocab_bytes = storage.read_bytes(shard_format.vocab_path(plan.shards, plan.manifest))
        self.cache = CharCache(shard_format.parse_vocab(self.vocab_bytes.decode("utf-8")))
        self.batches = self._batches("train", cfg.batch_size, cfg.unroll_steps, seed=cfg.seed)
        self.guard = DivergenceGuard(cfg.guard, self._guard_sample()) if cfg.guard.enabled else None
        guarded = {"guard": self.guard} if self.guard is not None else {}
        self.checkpointer = Checkpointer(
            plan.run_dir,
            self.rank,
            self.world,
            every=cfg.checkpoint_every,
            keep=cfg.keep_checkpoints,
            shared={"bilm": runner.bilm, "softmax": runner.softmax, "optimizer": runner.optimizer, **guarded},
            own={"data": self.batches, "lstm": runner.state, "rng": RNGStates(runner.generator)},
            meta={"options": plan.options, "config": to_dict(cfg), "vocab": self.vocab_bytes},
        )
        self.resumed_from = self.checkpointer.restore()
        if self.resumed_from is not None:
            runner.step = self.resumed_from
            runner.lr_scale = self.guard.lr_scale if self.guard is not None else 1.0
        elif plan.init_from:
            self._init_from(plan.init_from)
        runner.distribute()
        self.evaluator = Evaluator(
            cfg,
            # a thread reads ahead here: a process per evaluation would cost more than it saves
            lambda: self._batches(
                "heldout", cfg.eval_batch_size, EVAL_UNROLL_STEPS, test=True, prefetch=ReadAhead.thread
            ),
            plan.unigram_perplexity,
            self.world,
        )
        self.log = RunLog(cfg, plan, self.rank, self.resumed_from, report)
        self.flops_per_step = runner.flops_per_step(cfg.batch_size, cfg.unroll_steps)
        self.peak_flops = measure_matmul_peak(device, runner.autocast_dtype or torch.float32)

    def _batches(self, split: str, batch_size: int, unroll_steps: int, **kwargs):
        return open_lm_batches(
            self.plan.shards,
            split,
            self.cache,
            batch_size,
            unroll_steps,
            rank=self.rank,
            world_size=self.world,
            manifest=self.plan.manifest,
            **kwargs,
        )

    def _guard_sample(self) -> list:
        """The guard's fixed sample: this rank's first ``guard.batches`` held-out batches."""
        batches = self._batches(
            "heldout", self.cfg.eval_batch_size, EVAL_UNROLL_STEPS, test=True, prefetch=ReadAhead.off
        )
        return list(itertools.islice(batches, self.cfg.guard.batches))

    @property
    def step(self) -> int:
        return self.runner.step

    def _init_from(self, source: str) -> None:
        """Continue pretraining from released weights (and their softmax when the vocabulary matches)."""
        names = (
            export_mod.OPTIONS_FILE,
            export_mod.WEIGHTS_FILE,
            export_mod.SOFTMAX_FILE,
            export_mod.VOCAB_FILE,
        )
        with tempfile.TemporaryDirectory(prefix="elmo-init-") as tmp:
            local = {}
            for name in names:
                if storage.exists(storage.join(source, name)):
                    local[name] = os.path.join(tmp, name)
                    storage.download_file(storage.join(source, name), local[name])
            loaded = BiLM.from_files(local[export_mod.OPTIONS_FILE], local[export_mod.WEIGHTS_FILE])
            self.runner.bilm.load_state_dict(loaded.state_dict())
            if export_mod.SOFTMAX_FILE in local and export_mod.VOCAB_FILE in local:
                with open(local[export_mod.VOCAB_FILE], "rb") as f:
                    same_vocab = f.read() == self.vocab_bytes
                if same_vocab:
                    weight, bias = export_mod.read_softmax(local[export_mod.SOFTMAX_FILE])
                    if weight.shape != tuple(self.runner.softmax.weight.shape):
                        raise TrainError(
                            f"init_from {source}: softmax of shape {weight.shape}, the model's is "
                            f"{tuple(self.runner.softmax.weight.shape)}"
                        )
                    with torch.no_grad():
                        self.runner.softmax.weight.copy_(torch.from_numpy(weight))
                        self.runner.softmax.bias.copy_(torch.from_numpy(bias))

    def _read_guard(self) -> GuardReading | None:
        if self.guard is None:
            return None
        runner = self.runner
        return self.guard.read(self.step, runner.lm, runner.softmax, self.device, runner.autocast_dtype)

    def _on_divergence(self, reading: GuardReading) -> dict | None:
        """Act on a divergence as ``guard.on_divergence`` says; returns the run's final status row
        when the run stops, None when it goes on (after a warning, or rolled back)."""
        cfg, guard, runner = self.cfg.guard, self.guard, self.runner
        message, action = reading.message(cfg.factor), cfg.on_divergence
        row = {"kind": "guard", "step": self.step, "guard/diverged": 1, **reading.metrics()}
        if action is OnDivergence.rollback and guard.rollbacks >= cfg.max_rollbacks:
            action = OnDivergence.stop
            message += f"; it already rolled back {guard.rollbacks} times (guard.max_rollbacks)"
        if action is OnDivergence.rollback:
            rollbacks, lr_scale = guard.rollbacks, guard.lr_scale
            self.checkpointer.wait()
            restored = self.checkpointer.restore()  # every part, the guard's too
            if restored is None:
                action = OnDivergence.stop
                message += "; no checkpoint to roll back to"
            else:
                # what this run went through stays: the restored guard state is of before it
                guard.rollbacks, guard.lr_scale = rollbacks, lr_scale
                guard.rolled_back()
                runner.step, runner.lr_scale = restored, guard.lr_scale
                runner.reset_graph()  # the optimizer's state tensors are new ones
                message += (
                    f"; rolled back to the checkpoint of step {restored}, learning rate x{guard.lr_scale:g} "
                    f"(rollback {guard.rollbacks} of at most {cfg.max_rollbacks})"
                )
                row.update({"guard/rollbacks": guard.rollbacks, "to_step": restored})
        row.update(action=action.value, message=message)
        self.log.emit(row)
        if action is not OnDivergence.stop:
            return None
        self.checkpointer.wait()
        return {
            "kind": "status",
            "step": self.step,
            "status": "diverged",
            "message": f"{message}; stopped (guard.on_divergence={cfg.on_divergence.value}), the last "
            f"checkpoint is {latest_checkpoint(self.plan.run_dir) or 'none'}",
        }

    def evaluate(self, final: bool = True) -> dict:
        runner = self.runner
        return self.evaluator.run(runner.lm, runner.softmax, self.device, runner.autocast_dtype, final)

    def _train_row(self, out: StepResult, steps_timed: int, compute: float, elapsed: float) -> dict:
        cfg = self.cfg
        fwd, bwd = out.losses.tolist()
        tokens = 2 * cfg.batch_size * cfg.unroll_steps * self.world * steps_timed
        return {
            "kind": "train",
            "step": self.step,
            "epoch": self.step / max(self.plan.steps_per_epoch, 1),
            "train/loss": 0.5 * (fwd + bwd),
            "train/sampled_perplexity": perplexity(0.5 * (fwd + bwd)),
            "train/sampled_perplexity_fwd": perplexity(fwd),
            "train/sampled_perplexity_bwd": perplexity(bwd),
            "train/lr": out.lr,
            "train/grad_norm": float(out.grad_norm),
            "train/tokens_per_s": tokens / compute,
            "train/mfu": self.flops_per_step * steps_timed / compute / self.peak_flops,
            "train/softmax_rows": int(out.rows),
            "train/softmax_exchange_bytes": out.exchange_bytes,
            "train/softmax_dense_bytes": out.dense_bytes,
            **self.checkpointer.take_metrics(),
            "time": elapsed,
        }

    def run(self) -> dict:
        """Train to the plan's last step, then evaluate and export; returns the status row."""
        plan, runner, log = self.plan, self.runner, self.log
        try:
            status = self._train()
        finally:
            self.batches.close()  # its read-ahead processes
        status["step"] = self.step
        if status["status"] == "done":
            final = {"kind": "eval", "step": self.step, **self.evaluate()}
            log.emit(final)
            if self.rank == 0:
                with torch.no_grad():
                    export_mod.export_model(
                        runner.bilm,
                        runner.softmax,
                        self.vocab_bytes,
                        storage.join(plan.run_dir, export_mod.EXPORT_DIR),
                    )
                plot_perplexity(log.rows, storage.join(plan.run_dir, PLOT_FILE))
            status.update({k: v for k, v in final.items() if k != "kind"})
        log.finish_with(status)
        return status

    def _train(self) -> dict:
        """The step loop: steps until the run's last step, a non-finite step or a divergence that
        stops the run; returns the run's status row."""
        plan, runner, log = self.plan, self.runner, self.log
        status = {"kind": "status", "step": self.step, "status": "done"}
        # The step never waits for the device; the loop does, only where a component is due (a log
        # line, an evaluation, a checkpoint), so the host prepares the next batches meanwhile.
        compute, steps_timed, start = 0.0, 0, time.perf_counter()
        window = start
        while self.step < plan.total_steps:
            out = runner.train_step(next(self.batches), plan.total_steps)
            steps_timed += 1
            last = self.step == plan.total_steps
            due = [c.due(self.step, last) for c in (log, self.evaluator, self.checkpointer)]
            if not any(due):
                continue
            skipped = runner.nonfinite_steps()  # waits for the device
            compute += time.perf_counter() - window
            if skipped:
                self.checkpointer.wait()  # a save still in flight is the last good checkpoint
                status = {
                    "kind": "status",
                    "step": self.step,
                    "status": "nan",
                    "message": f"non-finite loss or gradient in {skipped} of the steps up to step {self.step} "
                    f"(nothing was updated in those); stopped, the last good checkpoint is "
                    f"{latest_checkpoint(plan.run_dir) or 'none'}",
                }
                break
            # the guard reads before every log line and every checkpoint: a checkpoint is saved only
            # after a reading, so a rollback finds the state of before a divergence
            reading = self._read_guard() if due[0] or due[2] else None
            if due[0]:
                row = self._train_row(out, steps_timed, compute, time.perf_counter() - start)
                if reading is not None:
                    row.update(reading.metrics(), **{"guard/rollbacks": self.guard.rollbacks})
                log.emit(row)
                compute, steps_timed = 0.0, 0
            if reading is not None and reading.diverged:
                stop = self._on_divergence(reading)
                if stop is not None:
                    status = stop
                    break
                if self.step < reading.step:  # rolled back: that step's evaluation and checkpoint are moot
                    window = time.perf_counter()
                    continue
            if due[1]:
                log.emit({"kind": "eval", "step": self.step, **self.evaluate(final=False)})
            if self.checkpointer.save(self.step, last):
                log.save_tracking()  # the wandb history reaches an s3 run directory with each checkpoint
            window = time.perf_counter()  # evaluation and checkpoints are not training time
        return status


def _quiet_report_log() -> None:
    """Ray Train V2 logs every ``ray.train.report`` call at INFO, one long line on the driver's
    console; the status row it would show is the stage's summary already, so keep its warnings
    only. The logger is internal (named by its file), so a Ray without it is simply left alone."""
    try:
        from ray.train.v2._internal.execution import context
    except ImportError:
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def train_loop_per_worker(loop_config: dict) -> None:
    """The function Ray Train runs on every worker."""
    import ray.train.torch

    _quiet_report_log()

    cfg = loop_config["config"]
    plan = RunPlan(**loop_config["plan"])
    torch.set_num_threads(cfg.threads_per_worker)
    device = ray.train.torch.get_device() if plan.use_gpu else torch.device("cpu")
    Trainer(cfg, plan, device, report=True).run()
