"""Where an embed run's time goes before its first shard is committed, and its pace after.

A small job is mostly start-up: the checks on the driver (the model's files hashed and loaded once,
the input and the output), Ray's start, and the first shard, in which an actor starts (Ray's worker
process, its imports), loads the model, runs its first passes (a GPU captures its graphs then) and
writes its first shard. `StartupClock` marks those phases on the driver; an actor reports its own
(under :data:`ACTOR_KEY`) with its first committed shard: when it began (wall clock, which the
driver turns into seconds after Ray was up), its model load, first passes and first write. The throughput after the first commit (tokens and seconds from it to the end) is
the figure a long job runs at, start-up apart (``benchmarks/embed.py`` reads it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

ACTOR_KEY = "startup"
"""The key of an actor's start-up report in the first entry it returns (taken off before the entry
is recorded: it is not part of the manifest)."""


@dataclass
class StartupClock:
    """Marks on the driver, in seconds from ``started`` (``time.monotonic()`` when the stage began)."""

    started: float
    phases: dict[str, float] = field(default_factory=dict)
    actor: dict[str, float] = field(default_factory=dict)
    first_commit: float | None = None
    first_tokens: int = 0
    _last: float | None = None
    _marks: dict[str, float] = field(default_factory=dict)
    _wall_offset: float = field(default_factory=lambda: time.time() - time.monotonic())

    def mark(self, phase: str) -> None:
        """End ``phase`` now: its seconds are those since the previous mark (or the start)."""
        now = time.monotonic()
        self.phases[phase] = now - (self._last if self._last is not None else self.started)
        self._last = self._marks[phase] = now

    def committed(self, entry: dict) -> None:
        """A shard committed: the first one ends the start-up (its ``entry`` may carry an actor's
        report, taken off here; its ``began_at``, a wall-clock time on the same node or a synced
        one, becomes ``start``: seconds from Ray's being up to the actor's constructor)."""
        report = entry.pop(ACTOR_KEY, None)
        if report and not self.actor:
            report = dict(report)
            began = report.pop("began_at", None)
            if began is not None and "ray" in self._marks:
                report = {"start": max(0.0, began - self._wall_offset - self._marks["ray"]), **report}
            self.actor = report
        if self.first_commit is None:
            self.mark("first_shard")
            self.first_commit = self._last
            self.first_tokens = entry["tokens"]

    def startup(self) -> dict[str, float]:
        """Phase -> seconds (``checks_s``, ``ray_s``, ``first_shard_s``, the actor's phases as
        ``actor_*_s``, and ``first_commit_s``: from the start); empty where no shard was committed."""
        if self.first_commit is None:
            return {}
        startup = {f"{phase}_s": round(s, 3) for phase, s in self.phases.items()}
        startup.update({f"actor_{phase}_s": round(s, 3) for phase, s in self.actor.items()})
        startup["first_commit_s"] = round(self.first_commit - self.started, 3)
        return startup

    def after_first_commit(self, tokens: int) -> AfterFirstCommit | None:
        """The run's pace from its first commit to now (``tokens``: the run's in all); None where
        no shard was committed."""
        if self.first_commit is None:
            return None
        return AfterFirstCommit(tokens - self.first_tokens, round(time.monotonic() - self.first_commit, 3))


@dataclass(frozen=True)
class AfterFirstCommit:
    """Tokens and seconds from a run's first committed shard to its end: the pace a long job runs
    at, start-up apart."""

    tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


_ACTOR_PHASES = (
    ("start", "an actor's start"),
    ("model_load", "its model load"),
    ("first_passes", "its first passes"),
    ("first_write", "its first write"),
)
"""An actor's start-up phases, in their order, as the closing line says them."""


def summary_lines(startup: dict[str, float], after: AfterFirstCommit | None) -> list[str]:
    """The closing lines of a run's ``startup`` (`StartupClock.startup`) and its pace ``after`` it
    (none where nothing was committed)."""
    if not startup or after is None:
        return []
    parts = [
        f"{words} {startup[f'actor_{phase}_s']:.1f} s"
        for phase, words in _ACTOR_PHASES
        if f"actor_{phase}_s" in startup
    ]
    actor = f" ({', '.join(parts)})" if parts else ""
    lines = [
        f"  start-up: checks {startup['checks_s']:.1f} s, Ray {startup['ray_s']:.1f} s, first shard "
        f"{startup['first_shard_s']:.1f} s{actor}: committed {startup['first_commit_s']:.1f} s after the start"
    ]
    if after.tokens and after.seconds > 0:
        lines.append(
            f"  after the first shard: {after.tokens:,} tokens in {after.seconds:.1f} s = "
            f"{after.tokens_per_second:,.0f} tokens/s"
        )
    return lines
