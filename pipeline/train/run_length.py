"""How long a run trains: its ceiling, its planned last step fitted to a time budget, what its end
costs, and its training clock (docs/training.md#a-run-planned-to-its-budget). One module owns the
run's length: the driver asks it for the ceiling and the deadline (`ceiling_steps`, `deadline`),
the loop for the last step (`RunLength`).

A run's length is a number of steps: ``max_steps``, else ``max_tokens`` over the tokens of a step,
else ``n_epochs`` epochs (`ceiling_steps`). A ``time_budget`` makes that number a ceiling:
the driver turns the budget into a deadline (its own start + the budget), and `RunLength` plans
the steps that end the run by then, the end-of-run evaluation and export included. It plans from
the loop's measured wall seconds per step once the first steps are past (a CUDA graph's capture
and the first batches' reads are not the run's pace), counting the evaluations and checkpoints
that happened since, and it plans again at every log line as the pace becomes better known; rank
0's plan is every rank's (one broadcast at those steps, which every rank reaches alike). The
learning-rate schedule decays over the planned steps, so a run that ends on time ends with its
schedule finished; before the first plan the rate holds its peak after warm-up.

The plan is a checkpoint part: a resumed run finishes the steps its first invocation planned, on
the same schedule, whatever time it now has. The training clock (``train_s``: seconds of
training steps, evaluations and checkpoint waits not counted) is one too, so time-to-target curves
run on across a resume.
"""

from __future__ import annotations

import math
import time

import torch

from pipeline.formats.shard_manifest import ShardManifest
from pipeline.train.config import TrainConfig, budget_seconds
from pipeline.train.distributed import broadcast_from_rank0

FIRST_CHECKS = (16, 32, 64, 128)
"""Steps at which a budgeted run reads the clock besides its log lines (none before the first of
these): the pace is measured from the first reading, past the eager steps of a CUDA graph's warm-up
(3 on one GPU, 11 under DDP), and planned at every reading after it."""
REPLAN_TOLERANCE = 0.01
"""A new plan replaces the old one only when it moves the last step by more than this fraction:
the schedule's shape does not jitter with every reading of the clock."""
END_SLACK_S = 5.0
"""Seconds kept free at the end beside the measured end of the run (the driver's last lines)."""
EXPORT_BYTES_PER_S = 50e6
"""A cautious write speed of the export's files (float32 weights to HDF5), for the end's price."""


def steps_per_epoch(manifest: ShardManifest, batch_size: int, unroll_steps: int, world_size: int) -> int:
    """bilm-tf's ``n_batches_per_epoch`` (docs/training.md#schedule-and-checkpoints): ``int(n_train_tokens / (B * U * W))`` with
    the training token count (words, no boundaries) from the manifest. Every rank gets the same
    number; it may be 0 for a corpus smaller than one global batch."""
    for name, value in (
        ("batch_size", batch_size),
        ("unroll_steps", unroll_steps),
        ("world_size", world_size),
    ):
        if value < 1:
            raise ValueError(f"steps_per_epoch: {name} must be >= 1, got {value}")
    return int(manifest.totals["train"].tokens / (batch_size * unroll_steps * world_size))


def ceiling_steps(cfg: TrainConfig, manifest: ShardManifest) -> tuple[int, int]:
    """(the run's ceiling in steps, the steps of an epoch) for ``cfg`` on the shards of
    ``manifest``: ``max_steps``, else ``max_tokens`` over a step's tokens, else ``n_epochs``
    epochs. The ceiling is 0 for a corpus smaller than one global batch (the caller refuses it)."""
    per_epoch = steps_per_epoch(manifest, cfg.batch_size, cfg.unroll_steps, cfg.workers)
    ceiling = (
        cfg.max_steps or -(-cfg.max_tokens // cfg.tokens_per_step(cfg.workers)) or cfg.n_epochs * per_epoch
    )
    return ceiling, per_epoch


def deadline(cfg: TrainConfig, now: float) -> float:
    """The ``time.time()`` by which a run with a ``time_budget`` must have ended (0: no budget)."""
    budget = budget_seconds(cfg.time_budget)
    return now + budget if budget else 0.0


def end_cost_s(eval_seconds: float, eval_batches: int, final_batches: int, export_bytes: int) -> float:
    """Seconds the end of the run should take, priced from an evaluation during it (``eval_seconds``
    for ``eval_batches`` of a rank): the final evaluation's ``final_batches`` at that pace, the
    export's ``export_bytes`` at `EXPORT_BYTES_PER_S`, and 2 s of bookkeeping."""
    return eval_seconds * final_batches / max(1, eval_batches) + 2.0 + export_bytes / EXPORT_BYTES_PER_S


class RunLength:
    """The run's last step and its training clock.

    ``ceiling``: the steps of ``max_steps`` / ``max_tokens`` / ``n_epochs``; ``deadline``: the
    ``time.time()`` by which the run must have ended (0: no time budget); ``log_every``: the loop's
    log interval, at which a budgeted run plans again (every rank takes rank 0's plan, broadcast).
    """

    optional = True  # a checkpoint written before time budgets lacks this part

    def __init__(self, ceiling: int, deadline: float = 0.0, log_every: int = 100):
        self.ceiling, self.deadline, self.log_every = ceiling, deadline, log_every
        self.last_step = ceiling
        """The run's last step: the ceiling until a time budget plans fewer."""
        self.planned = False
        """Whether ``last_step`` is a time budget's plan (kept by a resume: no plan is made again)."""
        self.train_s = 0.0
        """Seconds of training steps so far (all attempts)."""
        self._origin: tuple[int, float] | None = None
        self._resumed_plan = False  # a resume's plan is kept: no clock is read again
        self.end_s = 0.0
        """What the end of the run costs (its evaluation and export), as `note_end_cost` last set it."""
        self.clock = time.time
        """The wall clock the deadline is on (a test gives it one of its own)."""

    @property
    def resumed_plan(self) -> bool:
        """Whether this run resumed with its first invocation's plan (which it keeps)."""
        return self._resumed_plan

    # -- the schedule's view ------------------------------------------------------------------------
    @property
    def schedule_steps(self) -> int | None:
        """The steps the learning rate decays over: None while a time budget's first plan is not
        made (the rate holds its peak after warm-up), the planned last step otherwise."""
        if self.deadline and not self.planned:
            return None
        return self.last_step

    # -- the clock ------------------------------------------------------------------------------
    def add_training(self, seconds: float) -> None:
        self.train_s += seconds

    def note_end_cost(self, seconds: float) -> None:
        """The end of the run's expected seconds (its evaluation, the export): kept free of steps."""
        self.end_s = seconds

    # -- planning -------------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        """Whether the loop should read the clock after ``step`` (only a budgeted run that has not
        been resumed with a plan)."""
        if not self.deadline or self._resumed_plan:
            return False
        return step in FIRST_CHECKS or (step > FIRST_CHECKS[0] and step % self.log_every == 0)

    def replan(self, step: int, device: torch.device, now: float | None = None) -> int:
        """Read the clock after ``step`` and plan the last step from the pace since the first
        reading; every rank calls it at the same step and gets rank 0's plan (sent on ``device``,
        the ranks' collective device). Returns the last step."""
        now = self.clock() if now is None else now
        if self._origin is None or step <= self._origin[0]:
            self._origin = (step, now)
            planned = self.last_step if self.planned else 0
        else:
            first_step, first_time = self._origin
            pace = (now - first_time) / (step - first_step)  # wall seconds a step, everything counted
            left = self.deadline - now - self.end_s - END_SLACK_S
            planned = min(self.ceiling, step + max(0, math.floor(left / pace)))
        planned = int(broadcast_from_rank0(torch.tensor([planned], dtype=torch.int64, device=device))[0])
        if planned and (
            not self.planned
            or planned <= step
            or abs(planned - self.last_step) > REPLAN_TOLERANCE * self.last_step
        ):
            self.last_step, self.planned = max(planned, step), True
        return self.last_step

    # -- a checkpoint part ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"total_steps": self.last_step, "planned": self.planned, "train_s": self.train_s}

    def load_state_dict(self, state: dict) -> None:
        self.train_s = float(state["train_s"])
        if state["planned"]:
            self.last_step, self.planned, self._resumed_plan = int(state["total_steps"]), True, True
