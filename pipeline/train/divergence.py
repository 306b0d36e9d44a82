"""The divergence guard: a full-softmax perplexity of each direction on a fixed held-out sample,
read at every log interval and before every checkpoint (docs/training.md#divergence).

The sampled softmax trains against a few thousand rows of the vocabulary; the rest can drift so
far that the full-softmax perplexity explodes while the sampled training loss keeps falling. The
guard reads what the sampled loss cannot see, on the same ``guard.batches`` held-out batches every
time (each rank its part, summed over ranks, so every rank reaches the same verdict).

A direction diverges when its guard perplexity exceeds ``guard.factor`` x its best so far; the
verdict is raised once per episode (a direction that diverged is reported again only after it came
back under the bound). The guard's state (best values, learning-rate scale, rollbacks) is a part
of every checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from pipeline.train.config import OnDivergence
from pipeline.train.data import LMBatch
from pipeline.train.evaluate import heldout_perplexities

DIRECTIONS = ("fwd", "bwd")


@dataclass(frozen=True)
class GuardReading:
    """One reading at ``step``: ``perplexity`` (fwd, bwd) on the sample, ``best`` (fwd, bwd) so far
    (this reading included), and ``diverged``: the directions whose divergence starts here."""

    step: int
    perplexity: tuple[float, float]
    best: tuple[float, float]
    diverged: tuple[str, ...]

    def metrics(self) -> dict[str, float]:
        """``guard/perplexity_fwd``, ``guard/perplexity_bwd`` for the train row."""
        return {f"guard/perplexity_{d}": p for d, p in zip(DIRECTIONS, self.perplexity, strict=True)}

    def message(self, factor: float) -> str:
        parts = [
            f"{'forward' if d == 'fwd' else 'backward'} LM full-softmax perplexity "
            f"{self.perplexity[i]:,.1f} > {factor:g} x its best {self.best[i]:,.1f}"
            for i, d in enumerate(DIRECTIONS)
            if d in self.diverged
        ]
        return f"divergence at step {self.step}: " + "; ".join(parts)


@dataclass(frozen=True)
class GuardDecision:
    """What the loop does about a divergence: ``action`` (warn and train on, roll back to the last
    checkpoint, or stop the run) and the ``message`` that says why."""

    action: OnDivergence
    message: str

    def stopped(self, why: str) -> GuardDecision:
        return GuardDecision(OnDivergence.stop, f"{self.message}; {why}")

    def trained_on(self, why: str) -> GuardDecision:
        return GuardDecision(OnDivergence.warn, f"{self.message}; {why}: trained on")

    def noting(self, what: str) -> GuardDecision:
        return GuardDecision(self.action, f"{self.message}; {what}")


class DivergenceGuard:
    """``cfg``: the GuardConfig; ``sample``: this rank's fixed held-out batches.

    ``lr_scale`` multiplies the run's learning rate (each rollback scales it by ``lr_factor``);
    ``rollbacks`` counts them. Checkpoints hold ``state_dict()``; a checkpoint from before the
    guard existed restores without it (``optional``).
    """

    optional = True

    def __init__(self, cfg, sample: Sequence[LMBatch]):
        self.cfg, self.sample = cfg, list(sample)
        self.best = [math.inf, math.inf]
        self.lr_scale = 1.0
        self.rollbacks = 0
        self._diverged: set[str] = set()

    def read(self, step: int, lm, softmax, device: torch.device, autocast_dtype) -> GuardReading:
        """Score the sample (every rank calls it alike: the sums are all-reduced) and judge it."""
        ppl = heldout_perplexities(lm, softmax, self.sample, device, autocast_dtype)
        return self.judge(step, (ppl["eval/perplexity_fwd"], ppl["eval/perplexity_bwd"]))

    def judge(self, step: int, perplexity: tuple[float, float]) -> GuardReading:
        """Update the best values with ``perplexity`` (fwd, bwd) and return the reading."""
        starting = []
        for i, direction in enumerate(DIRECTIONS):
            value = perplexity[i]
            bad = not math.isfinite(value) or value > self.cfg.factor * self.best[i]
            if bad and direction not in self._diverged:
                starting.append(direction)
            if bad:
                self._diverged.add(direction)
            else:
                self._diverged.discard(direction)
                self.best[i] = min(self.best[i], value)
        return GuardReading(step, tuple(perplexity), tuple(self.best), tuple(starting))

    def decide(self, reading: GuardReading) -> GuardDecision:
        """The action ``guard.on_divergence`` asks for a reading that diverged: a rollback becomes a
        stop once ``guard.max_rollbacks`` were taken."""
        decision = GuardDecision(self.cfg.on_divergence, reading.message(self.cfg.factor))
        if decision.action is OnDivergence.rollback and self.rollbacks >= self.cfg.max_rollbacks:
            return decision.stopped(f"it already rolled back {self.rollbacks} times (guard.max_rollbacks)")
        return decision

    def roll_back(self, restore: Callable[[], int | None]) -> int | None:
        """Roll back: ``restore()`` loads every part of the run from its last checkpoint (this
        guard's state too) and returns its step, None when there is none. What this run went
        through stays (the restored state is of before it): one more rollback, a lower rate."""
        rollbacks, lr_scale = self.rollbacks, self.lr_scale
        step = restore()
        if step is not None:
            self.rollbacks, self.lr_scale = rollbacks + 1, lr_scale * self.cfg.lr_factor
            self._diverged.clear()
        return step

    def state_dict(self) -> dict:
        return {"best": list(self.best), "lr_scale": self.lr_scale, "rollbacks": self.rollbacks}

    def load_state_dict(self, state: dict) -> None:
        self.best = [float(v) for v in state["best"]]
        self.lr_scale = float(state["lr_scale"])
        self.rollbacks = int(state["rollbacks"])
        self._diverged.clear()
