"""One stage's shape: what it is (`Stage`), what a run of it did (`StageResult`), the stages there
are (`STAGES`), and the one way every entry point runs one (`run_stage`, `run_alone`).

A stage is its name, its config schema, the Ray session it needs (``session``), its work (``run``),
what it puts on the dashboard (``dashboard``) and the lines that close a run (``summary``).
`run_stage` owns the rest, the same for every stage: the stage's wandb run
(``pipeline/tracking/stage_run.py``), logged once the work is done, and the closing lines with the
run's sync command. The stages' own `Stage` objects live in ``pipeline/<stage>/stage.py``, their
configs in ``pipeline/<stage>/config.py``; ``jobs/`` runs one, ``pipeline/end_to_end`` runs them in
order, both by the names here.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from pipeline.config import to_dict
from pipeline.tracking.config import WandbMode
from pipeline.tracking.stage_run import StageLog, StageRun

if TYPE_CHECKING:  # Ray is imported where a session is made: ``elmo config`` reads this module too
    from pipeline.runtime.ray_runtime import RaySession

STAGES = ("shard", "train", "embed", "probe")
"""Every stage, in the pipeline's order: ``pipeline/<name>/stage.py`` holds its `Stage` as
``<NAME>`` and ``pipeline/<name>/config.py`` its schema as ``<Name>Config``."""

C = TypeVar("C")
"""A stage's config dataclass."""
D = TypeVar("D")
"""A stage's details dataclass (frozen): what only that stage's run knows."""


def stage_named(name: str) -> Stage:
    """The `Stage` of one of `STAGES` (its module imported now: torch and Ray with it)."""
    return getattr(importlib.import_module(f"pipeline.{name}.stage"), name.upper())


def schema_named(name: str) -> type:
    """The config schema of one of `STAGES`, without importing the stage's work."""
    return getattr(importlib.import_module(f"pipeline.{name}.config"), f"{name.capitalize()}Config")


@dataclass
class StageResult(Generic[D]):
    """What one run of a stage did, the same shape for every stage.

    ``output``: where the stage's results are; ``seconds`` and ``tokens``: this run's own work (a
    rerun that resumed or found its output complete counts only what it did); ``details``: the
    stage's own facts, a frozen dataclass of that stage's (``ShardDetails``, ``TrainDetails``,
    ``EmbedDetails``, ``ProbeDetails``), read only by that stage and by what runs the stages in
    order through its attributes; ``complete``: False when the run stopped early on purpose and a
    rerun with the same arguments finishes it; ``wandb_sync``: the command that uploads the stage's
    offline wandb run, when it logged one.
    """

    stage: str
    output: str
    seconds: float
    tokens: int
    details: D
    complete: bool = True
    wandb_sync: str | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class StageContext:
    """What a stage's ``run`` gets beside its config: the entry point's Ray ``session`` (started
    only when there is work for it) and ``tracking``, the stage's wandb run, for a stage that logs
    rows as it goes (embed); a stage that logs nothing before its end leaves it alone."""

    session: RaySession
    tracking: StageRun


class Stage(ABC, Generic[C, D]):
    """A stage: ``name`` (its command, ``elmo NAME``, and its wandb ``job_type``), ``schema`` (its
    config dataclass), and the things only it knows."""

    name: ClassVar[str]
    schema: ClassVar[type]
    system_stats: ClassVar[bool] = False
    """Whether its wandb run charts the node (GPU, CPU, memory): for a stage that logs as it goes."""

    def session(self, cfg: C) -> RaySession | None:
        """The Ray session an entry point runs the stage in (joined under ``ray job submit``, an
        embedded cluster otherwise, sized as the stage needs); None: the stage needs no Ray."""
        from pipeline.runtime.ray_runtime import RaySession

        return RaySession(cfg.ray_address or None)

    @abstractmethod
    def run(self, cfg: C, ctx: StageContext) -> StageResult[D]:
        """The stage's work for a resolved ``cfg``."""

    def dashboard(self, cfg: C, result: StageResult[D]) -> StageLog | None:
        """What the run puts on the dashboard once done; None: nothing (a rerun that did no
        work, or a stage whose workers keep a wandb run of their own)."""
        return None

    def tracking_folder(self, cfg: C) -> str | None:
        """The folder whose ``wandb/`` holds the stage's wandb files (its output); None: the stage
        logs no run for this config."""
        return cfg.output

    @abstractmethod
    def summary(self, cfg: C, result: StageResult[D]) -> str:
        """The lines that close a run: what it did and where its results are."""


def run_alone(stage: Stage[C, D], cfg: C) -> StageResult[D]:
    """An entry point's run of ``stage``: in the session the stage asks for (none: no Ray), stopped
    when the stage ends."""
    session = stage.session(cfg)
    if session is None:
        return run_stage(stage, cfg)
    with session:
        return run_stage(stage, cfg, session)


def run_stage(stage: Stage[C, D], cfg: C, session: RaySession | None = None) -> StageResult[D]:
    """Run ``stage`` for ``cfg`` in ``session`` (default: the Ray this process initialised, started
    only when the stage asks), log its dashboard, print its closing lines; its result, with
    ``wandb_sync`` set when it logged an offline run."""
    from pipeline.runtime.ray_runtime import RaySession

    folder = stage.tracking_folder(cfg)
    settings = cfg.wandb if folder is not None else type(cfg.wandb)(mode=WandbMode.disabled)
    tracking = StageRun(settings, folder or "", stage.name, to_dict(cfg))
    tracking.system_stats = stage.system_stats
    try:
        result = stage.run(cfg, StageContext(session or RaySession.joined(), tracking))
        log = stage.dashboard(cfg, result)
        if log is not None:
            result.wandb_sync = tracking.finish(log) or result.wandb_sync
    except BaseException:
        tracking.abandon()
        raise
    print(closing_lines(stage, cfg, result), flush=True)
    return result


def closing_lines(stage: Stage[C, D], cfg: C, result: StageResult[D]) -> str:
    """The stage's summary, then the command that uploads its offline wandb run."""
    lines = stage.summary(cfg, result)
    sync = result.wandb_sync
    return f"{lines}\n  wandb: offline; upload it with: {sync}" if sync else lines
