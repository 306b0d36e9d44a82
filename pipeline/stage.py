"""One stage's shape: what it is (`Stage`), what a run of it did (`StageResult`), and the one way
every entry point runs it (`run_stage`).

A stage is its name, its config schema, its work (``run``), what it puts on the dashboard
(``dashboard``) and the lines that close a run (``summary``). `run_stage` owns the rest, the same
for every stage: the stage's wandb run (``pipeline/tracking/stage_run.py``), logged once the work is
done, and the closing lines with the run's sync command. The stages' own `Stage` objects live in
``pipeline/<stage>/stage.py``; ``jobs/`` runs one, ``pipeline/end_to_end`` runs them in order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pipeline.config import to_dict
from pipeline.runtime.ray_runtime import RaySession
from pipeline.tracking.config import WandbMode
from pipeline.tracking.stage_run import StageLog, StageRun


@dataclass
class StageResult:
    """What one run of a stage did, the same shape for every stage.

    ``output``: where the stage's results are; ``seconds`` and ``tokens``: this run's own work (a
    rerun that resumed or found its output complete counts only what it did); ``complete``: False
    when the run stopped early on purpose and a rerun with the same arguments finishes it;
    ``details``: the stage's own facts (shard: ``manifest``; train: the final ``status`` row of
    metrics.jsonl and the run directory's ``export``, ``plot`` and ``metrics``; embed: shard and
    sentence counts, the output's ``totals``, and its ``manifest`` once complete; probe: the
    report, ``probe.json``'s document), and ``wandb_sync``: the command that uploads the stage's
    offline wandb run, when it logged one.
    """

    stage: str
    output: str
    seconds: float
    tokens: int
    complete: bool = True
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class Stage(ABC):
    """A stage: ``name`` (its command, ``elmo NAME``, and its wandb ``job_type``), ``schema`` (its
    config dataclass), and the three things only it knows."""

    name: ClassVar[str]
    schema: ClassVar[type]
    system_stats: ClassVar[bool] = False
    """Whether its wandb run charts the node (GPU, CPU, memory): for a stage that logs as it goes."""

    @abstractmethod
    def run(self, cfg: Any, session: RaySession, tracking: StageRun) -> StageResult:
        """The stage's work for a resolved ``cfg``. Ray: ``session``, started only when there is
        work for it. ``tracking``: the stage's wandb run, for a stage that logs rows as it goes
        (embed); a stage that logs nothing before its end leaves it alone."""

    def dashboard(self, cfg: Any, result: StageResult) -> StageLog | None:
        """What the run puts on the dashboard once done; None: nothing (a rerun that did no
        work, or a stage whose workers keep a wandb run of their own)."""
        return None

    def tracking_folder(self, cfg: Any) -> str | None:
        """The folder whose ``wandb/`` holds the stage's wandb files (its output); None: the stage
        logs no run for this config."""
        return cfg.output

    @abstractmethod
    def summary(self, cfg: Any, result: StageResult) -> str:
        """The lines that close a run: what it did and where its results are."""


def run_stage(stage: Stage, cfg: Any, session: RaySession | None = None) -> StageResult:
    """Run ``stage`` for ``cfg`` in the entry point's ``session`` (default: the Ray this process
    initialised), log its dashboard, print its closing lines; its result, with ``wandb_sync``
    among the details when it logged an offline run."""
    folder = stage.tracking_folder(cfg)
    settings = cfg.wandb if folder is not None else type(cfg.wandb)(mode=WandbMode.disabled)
    tracking = StageRun(settings, folder or "", stage.name, to_dict(cfg))
    tracking.system_stats = stage.system_stats
    try:
        result = stage.run(cfg, session or RaySession.joined(), tracking)
        log = stage.dashboard(cfg, result)
        if log is not None:
            sync = tracking.finish(log)
            if sync:
                result.details["wandb_sync"] = sync
    except BaseException:
        tracking.abandon()
        raise
    print(closing_lines(stage, cfg, result), flush=True)
    return result


def closing_lines(stage: Stage, cfg: Any, result: StageResult) -> str:
    """The stage's summary, then the command that uploads its offline wandb run."""
    lines = stage.summary(cfg, result)
    sync = result.details.get("wandb_sync")
    return f"{lines}\n  wandb: offline; upload it with: {sync}" if sync else lines
