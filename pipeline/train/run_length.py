"""How long a run trains: its planned steps, fitted to a time budget, and its training clock
(docs/training.md#a-run-planned-to-its-budget).

A run's length is a number of steps: ``max_steps``, else ``max_tokens`` over the tokens of a step,
else ``n_epochs`` epochs (``launch.prepare_run``). A ``time_budget`` makes that number a ceiling:
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


class RunLength:
    """The run's last step and its training clock.

    ``ceiling``: the steps of ``max_steps`` / ``max_tokens`` / ``n_epochs``; ``deadline``: the
    ``time.time()`` by which the run must have ended (0: no time budget); ``log_every``: the loop's
    log interval, at which a budgeted run plans again (every rank takes rank 0's plan, broadcast).
    """

    optional = True  # a checkpoint written before time budgets lacks this part

    def __init__(self, ceiling: int, deadline: float = 0.0, log_every: int = 100):
        self.ceiling, self.deadline, self.log_every = ceiling, deadline, log_every
        self.total_steps = ceiling
        """The run's last step: the ceiling until a time budget plans fewer."""
        self.planned = False
        """Whether ``total_steps`` is a time budget's plan (kept by a resume: no plan is made again)."""
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
        return self.total_steps

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
            planned = self.total_steps if self.planned else 0
        else:
            first_step, first_time = self._origin
            pace = (now - first_time) / (step - first_step)  # wall seconds a step, everything counted
            left = self.deadline - now - self.end_s - END_SLACK_S
            planned = min(self.ceiling, step + max(0, math.floor(left / pace)))
        planned = int(broadcast_from_rank0(torch.tensor([planned], dtype=torch.int64, device=device))[0])
        if planned and (
            not self.planned
            or planned <= step
            or abs(planned - self.total_steps) > REPLAN_TOLERANCE * self.total_steps
        ):
            self.total_steps, self.planned = max(planned, step), True
        return self.total_steps

    # -- a checkpoint part ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"total_steps": self.total_steps, "planned": self.planned, "train_s": self.train_s}

    def load_state_dict(self, state: dict) -> None:
        self.train_s = float(state["train_s"])
        if state["planned"]:
            self.total_steps, self.planned, self._resumed_plan = int(state["total_steps"]), True, True
