"""A one-shot stage's wandb run in tests, logged as ``pipeline.stage.run_stage`` logs one: opened,
then finished with the stage's `StageLog` (the real library, offline)."""

from __future__ import annotations

from pipeline.tracking.config import WandbConfig
from pipeline.tracking.stage_run import StageLog, StageRun


def log_stage_run(settings: WandbConfig, output: str, log: StageLog) -> str | None:
    """Log ``log`` under ``output``'s ``wandb/``; the offline run's sync command (None when disabled)."""
    return StageRun(settings, output, log.job_type, log.config).finish(log)
