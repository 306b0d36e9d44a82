"""The stages the entry points know by name, each with its config schema (``elmo config STAGE``, the
infra manifests' checks). The registry lives here, with the entry points, not in ``pipeline.config``:
the config base knows no stage."""

from __future__ import annotations

import importlib

from pipeline.config import ConfigError

STAGES = {
    "shard": "pipeline.shard.config:ShardConfig",
    "train": "pipeline.train.config:TrainConfig",
    "embed": "pipeline.embed.config:EmbedConfig",
    "pipeline": "pipeline.end_to_end.config:PipelineConfig",
    "probe": "pipeline.probe.config:ProbeConfig",
}
"""Stage name -> ``module:Class`` of its schema, imported lazily so that ``elmo config shard``
does not import torch or Ray."""


def stage_schema(stage: str) -> type:
    """The schema dataclass of a stage name (``shard``, ``train``, ``embed``, ``pipeline``, ``probe``)."""
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}; choose one of {', '.join(STAGES)}")
    module_name, class_name = STAGES[stage].split(":")
    return getattr(importlib.import_module(module_name), class_name)
