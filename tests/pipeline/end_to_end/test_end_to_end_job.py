"""pipeline.end_to_end.job: how the stages' paths are derived from ``storage``/``name``."""

from __future__ import annotations

import os

from pipeline.config import resolve_config
from pipeline.end_to_end.config import PipelineConfig
from pipeline.end_to_end.job import SAMPLE_CORPUS, derive_stage_configs


def _derive(*overrides: str):
    return derive_stage_configs(
        resolve_config(PipelineConfig, overrides=list(overrides), preset="tiny", allow_missing=True)
    )


def test_relative_local_storage_becomes_absolute(tmp_path, monkeypatch):
    # Ray Train runs its workers in directories of their own, so a relative path would point elsewhere there
    monkeypatch.chdir(tmp_path)
    cfg = _derive("storage=runs", "name=r1")
    root = os.path.join(str(tmp_path), "runs", "r1")
    assert cfg.shard.output == os.path.join(root, "shards") == cfg.train.shards
    assert cfg.train.output == os.path.join(root, "train")
    assert cfg.embed.model == "" and cfg.probe.model == ""  # the export training's result names
    assert list(cfg.embed.input) == [cfg.shard.output] and cfg.embed.output == os.path.join(
        root, "embeddings"
    )
    assert list(cfg.shard.input) == [str(SAMPLE_CORPUS)] and cfg.train.name == "r1"
    assert cfg.train.wandb.group == "r1"  # the pipeline's runs show as one group on the dashboard


def test_s3_storage_and_user_set_paths_are_kept():
    cfg = _derive(
        "storage=s3://bucket/runs", "name=r2", "train.output=s3://other/run", "corpus=[s3://data/c.txt]"
    )
    assert cfg.shard.output == "s3://bucket/runs/r2/shards"
    assert cfg.train.output == "s3://other/run"
    assert list(cfg.shard.input) == ["s3://data/c.txt"]
    assert list(cfg.embed.shard_splits) == ["heldout"]
    assert _derive("name=r3", "train.wandb.group=sweep-7").train.wandb.group == "sweep-7"


def test_embed_and_probe_read_the_export_the_training_made_unless_told_otherwise():
    from pipeline.embed.config import EmbedConfig
    from pipeline.end_to_end.job import _reading

    assert _reading(EmbedConfig(), "s3://b/run/export").model == "s3://b/run/export"
    assert _reading(EmbedConfig(model="mine"), "s3://b/run/export").model == "mine"
    theirs = EmbedConfig(options_file="o.json", weights_file="w.hdf5")
    assert _reading(theirs, "s3://b/run/export") == theirs
