"""pipeline.embed.dataflow on the session's 2-CPU Ray cluster: the CPU side (reading, tokenizing,
character ids) runs as its own operator ahead of the model actors, and the pool's readers take the
CPUs that the actors leave."""

from __future__ import annotations

import json

from embed_fixtures import OPTIONS, WEIGHTS, sample_lines

from pipeline.config import load_config
from pipeline.embed import dataflow
from pipeline.embed.config import EmbedConfig
from pipeline.embed.dataflow import ActorPool, build_dataset, spec_blocks
from pipeline.embed.inputs import plan_shards
from pipeline.embed.runner import actor_pool, default_readers, settings_for
from pipeline.model_loader import resolve_model


def _config(**overrides) -> EmbedConfig:
    items = [f"{k}={v}" for k, v in {"progress": False, "output": "/tmp/unused", **overrides}.items()]
    return load_config(EmbedConfig, overrides=items)


def test_reading_runs_as_its_own_operator_before_the_actors(ray_local, tmp_path):
    corpus = tmp_path / "in.txt"
    corpus.write_bytes(b"\n".join(sample_lines(12)) + b"\n")
    cfg = _config(options_file=OPTIONS, weights_file=WEIGHTS, input=f"[{corpus}]", output=tmp_path / "out")
    specs = plan_shards("text", [str(corpus)], 4)
    source = resolve_model("", str(OPTIONS), str(WEIGHTS))
    (tmp_path / "out").mkdir()
    ds = build_dataset(
        [(s, True) for s in specs],
        source,
        settings_for(cfg, "cpu"),
        str(tmp_path / "out"),
        ActorPool(1, 1, 0, 1),
    )
    entries = sorted((json.loads(row["entry"]) for row in ds.iter_rows()), key=lambda e: e["index"])
    assert [e["index"] for e in entries] == [0, 1, 2] and all("error" not in e for e in entries)
    assert [e["sentences"] for e in entries] == [4, 4, 4]
    stats = ds.stats()
    # two operators, not one fused task: fused, the actor would read and tokenize between its passes
    assert "MapBatches(prepare_rows)" in stats and "MapBatches(EmbedActor)" in stats
    assert "prepare_rows)->MapBatches(EmbedActor)" not in stats, stats


def test_readers_take_the_cpus_the_actors_leave(ray_local):
    # the session cluster has 2 CPUs
    assert actor_pool(_config(workers=1), 0.0).readers == 1
    assert actor_pool(_config(workers=2), 0.0).readers == 1  # none left: still one, reserving no CPU
    assert actor_pool(_config(workers=1, cpus_per_worker=0.5), 0.0).readers == 1
    assert actor_pool(_config(workers=2, readers=5), 0.0).readers == 5
    assert actor_pool(_config(workers=2, readers=50), 0.0).readers == 50  # asked for: as asked
    assert (
        actor_pool(_config(workers=2, stateful=True, stateful_batch_size=8, lines_per_shard=8), 0.0).workers
        == 1
    )


def test_default_readers_fill_the_free_cpus_up_to_eight_per_actor():
    assert default_readers(16, 1, 2) == 8  # a 16-core GPU node, one actor of 2 CPUs: 14 free, 8 per actor
    assert default_readers(1024, 2, 1) == 16  # a large cluster: not a thousand processes
    assert default_readers(2, 2, 1) == 1 and default_readers(4, 1, 1) == 3


def test_many_shards_ride_in_few_blocks_and_each_goes_on_alone(ray_local, tmp_path, monkeypatch):
    """The specs fill SPEC_BLOCKS input blocks (the driver makes each block before anything runs),
    and a preparing task hands every shard on as its own block: all of them, each once."""
    monkeypatch.setattr(dataflow, "SPEC_BLOCKS", 2)
    assert spec_blocks(12, readers=0) == 2 and spec_blocks(1, readers=0) == 1
    assert spec_blocks(15_000, readers=8) == 32 and spec_blocks(10, readers=8) == 10
    corpus = tmp_path / "in.txt"
    corpus.write_bytes(b"\n".join(sample_lines(12)) + b"\n")
    cfg = _config(options_file=OPTIONS, weights_file=WEIGHTS, input=f"[{corpus}]", output=tmp_path / "out")
    specs = plan_shards("text", [str(corpus)], 1)
    (tmp_path / "out").mkdir()
    with dataflow._data_context(
        preserve_order=False
    ):  # as embed_stream builds it: the dataset keeps its context
        ds = build_dataset(
            [(s, True) for s in specs],
            resolve_model("", str(OPTIONS), str(WEIGHTS)),
            settings_for(cfg, "cpu"),
            str(tmp_path / "out"),
            ActorPool(1, 1, 0, 1),
        )
        indices = [json.loads(row["entry"])["index"] for row in ds.iter_rows()]
    assert sorted(indices) == list(range(12))
    stats = ds.stats()
    assert "FromItems: 1 tasks executed, 4 blocks produced" in stats, stats
    assert "MapBatches(prepare_rows): 4 tasks executed, 12 blocks produced" in stats, stats
