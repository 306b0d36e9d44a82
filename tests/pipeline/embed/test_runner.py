"""The embed driver's decisions (pipeline/embed/runner.py) that need no cluster: what a run records
as its identity, the workers' settings and the GPU choice (the readers: test_dataflow.py). Runs
end to end are test_run.py's and test_dataflow.py's."""

from __future__ import annotations

import pytest

from pipeline.config import UseGPU, load_config
from pipeline.embed import runner
from pipeline.embed.config import EmbedConfig, LayerMode, Precision
from pipeline.embed.errors import EmbedError

BASE = ["model=m", "input=[c.txt]", "output=out"]


def cfg(*overrides: str) -> EmbedConfig:
    return load_config(EmbedConfig, overrides=[*BASE, *overrides])


def test_the_run_identity_holds_what_decides_the_vectors_and_nothing_else():
    plain = runner.run_settings(cfg(), "text", ["c.txt"], "abc")
    assert plain["model_sha256"] == "abc" and plain["layers"] == "all" and plain["shard_splits"] == []
    assert plain["stateful_batch_size"] == 0  # not a setting of a stateless run
    # how the run runs (workers, readers, GPU share) is not part of it: another rerun resumes
    assert (
        runner.run_settings(cfg("workers=4", "readers=3", "gpu_share=0.5"), "text", ["c.txt"], "abc") == plain
    )
    other = runner.run_settings(cfg("layers=top", "precision=bf16"), "text", ["c.txt"], "abc")
    assert {k for k in plain if plain[k] != other[k]} == {"layers", "precision"}
    shards = runner.run_settings(cfg(), "shards", ["s"], "abc")
    assert shards["shard_splits"] == list(cfg().shard_splits)


def test_the_workers_get_the_configs_choices_and_a_thread_per_cpu():
    settings = runner.settings_for(cfg("layers=average", "precision=tf32", "cpus_per_worker=3"), "cuda")
    assert (settings.config.layers, settings.config.precision, settings.threads, settings.device) == (
        LayerMode.average, Precision.tf32, 3, "cuda",
    )  # fmt: skip
    assert runner.settings_for(cfg("cpus_per_worker=0.5"), "cpu").threads == 1


def test_a_gpu_is_taken_only_where_asked_for_or_there(monkeypatch):
    monkeypatch.setattr(runner.cluster_capacity, "gpus_to_be_had", lambda embedded: False)
    assert runner.gpus_per_worker(UseGPU.false, 0.5, embedded=True) == 0.0
    assert runner.gpus_per_worker(UseGPU.auto, 0.5, embedded=True) == 0.0
    assert runner.gpus_per_worker(UseGPU.true, 0.5, embedded=False) == 0.5  # an autoscaler may add one
    with pytest.raises(EmbedError, match="use_gpu=true but the Ray cluster has no GPU"):
        runner.gpus_per_worker(UseGPU.true, 0.5, embedded=True)
    monkeypatch.setattr(runner.cluster_capacity, "gpus_to_be_had", lambda embedded: True)
    assert runner.gpus_per_worker(UseGPU.auto, 0.25, embedded=True) == 0.25
