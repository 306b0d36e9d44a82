"""The names ``elmo config`` knows: every stage of ``pipeline.stage.STAGES`` and ``pipeline`` (the
whole job), each with its config schema (``elmo config NAME``, the infra manifests' checks).
Schemas are imported lazily, so that ``elmo config shard`` imports neither torch nor Ray."""

from __future__ import annotations

from pipeline.config import ConfigError
from pipeline.stage import STAGES as STAGE_NAMES
from pipeline.stage import schema_named

STAGES = (*STAGE_NAMES, "pipeline")
"""What ``elmo config`` knows: the stages and the whole pipeline."""


def stage_schema(stage: str) -> type:
    """The schema dataclass of a stage name (``shard``, ``train``, ``embed``, ``probe``, ``pipeline``)."""
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}; choose one of {', '.join(STAGES)}")
    if stage == "pipeline":
        from pipeline.end_to_end.config import PipelineConfig

        return PipelineConfig
    return schema_named(stage)
