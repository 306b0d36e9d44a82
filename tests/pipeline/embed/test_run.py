"""The embed stage end to end on Ray (the session's 2-CPU cluster) against the S3 test server and
local paths: every sentence equals a direct BiLM call, a killed run finishes exactly once on rerun,
single-file output has AllenNLP's layout, stateful mode reproduces the original fixture."""

from __future__ import annotations

import hashlib
import io
import json

import h5py
import numpy as np
import pytest
from embed_fixtures import (
    OPTIONS,
    WEIGHTS,
    direct,
    expected_value,
    line_tokens,
    load_model,
    read_hdf5,
    sample_lines,
)
from tests_reference import fixture_expected, fixture_sentences_batch_major

from pipeline.config import load_config
from pipeline.embed import manifest
from pipeline.embed.config import EmbedConfig
from pipeline.embed.errors import EmbedError
from pipeline.embed.stage import EMBED
from pipeline.runtime import storage
from pipeline.stage import closing_lines, run_stage
from pipeline.tracking import offline_reader

MAX_TOKENS = 100


def run_embed(cfg: EmbedConfig):
    """The stage as its entry point runs it: the work, the dashboard, the closing lines."""
    return run_stage(EMBED, cfg)


def _config(**overrides) -> EmbedConfig:
    base = {
        "progress": False,
        "workers": 1,
        "lines_per_shard": 40,
        "max_sentence_tokens": MAX_TOKENS,
        "wandb.mode": "disabled",
    }
    items = [f"{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in {**base, **overrides}.items()]
    return load_config(EmbedConfig, overrides=items)


def _corpus() -> list[bytes]:
    """150 sample lines plus one of each bad kind: empty, invalid UTF-8, control characters, over
    max_sentence_tokens."""
    lines = sample_lines(150)
    lines[7] = b""
    lines[50] = b"In the \xff beginning"
    lines[60] = b"God\x00created\x07 the heaven"
    lines[90] = b" ".join([b"word"] * (2 * MAX_TOKENS + 5))
    return lines


def _shard_values(output: str) -> list[tuple[int, np.ndarray]]:
    pairs = []
    for path in storage.list_prefix(storage.join(output, "embeddings-")):
        with h5py.File(io.BytesIO(storage.read_bytes(path)), "r") as f:
            pairs.extend((int(k), f[k][()]) for k in f.keys())
    return pairs


@pytest.fixture(scope="module")
def model():
    return load_model()


def test_the_embed_run_is_on_the_dashboard_and_a_rerun_adds_none(ray_local, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"\n".join(sample_lines(90)) + b"\n")
    output = tmp_path / "out"
    args = {
        "options_file": OPTIONS,
        "weights_file": WEIGHTS,
        "input": [str(corpus)],
        "output": str(output),
        "wandb.mode": "offline",
        "wandb.group": "g2",
    }
    cfg = _config(**args)
    result = run_embed(cfg)
    (path,) = offline_reader.run_files(output / "wandb")
    recs = offline_reader.records(path)
    run = offline_reader.run_record(recs)
    assert (run["run_group"], run["job_type"], run["display_name"]) == ("g2", "embed", "g2-embed")
    got = offline_reader.summary(recs)
    totals = json.loads((output / "manifest.json").read_text())["totals"]
    assert {k: got[f"output/{k}"] for k in totals} == totals and totals["shards"] == 3
    assert got["run/tokens"] == result.tokens == totals["tokens"] and got["run/shards"] == 3
    assert got["run/tokens_per_s"] == pytest.approx(result.tokens_per_second) and got["complete"] == 1
    assert "wandb sync --id" in closing_lines(EMBED, cfg, result)
    # where its start-up went, and its pace after the first shard, start-up apart
    startup = result.details.startup
    actor_phases = {"actor_start_s", "actor_model_load_s", "actor_first_passes_s", "actor_first_write_s"}
    assert {"checks_s", "ray_s", "first_shard_s", *actor_phases} <= set(startup)
    # the actor's phases happen within the first shard's (its start is counted from Ray's being up)
    assert sum(startup[k] for k in actor_phases) <= startup["first_shard_s"] + 0.05
    assert got["startup/first_commit_s"] == startup["first_commit_s"] > 0
    assert "  start-up: checks " in closing_lines(EMBED, cfg, result)
    manifest_doc = json.loads((output / "manifest.json").read_text())
    assert not any("startup" in shard for shard in manifest_doc["shards"])  # the report is not recorded
    # as it goes: a row per committed shard, its tokens and throughput so far
    rows = [r for r in offline_reader.history(recs) if "shards_done" in r]
    assert sorted(r["shards_done"] for r in rows) == [1, 2, 3]
    assert max(r["run/tokens"] for r in rows) == result.tokens and all(
        r["run/tokens_per_s"] > 0 for r in rows
    )
    # the lineage: the model read, the embeddings written (their manifest checked, the shards listed)
    (used,) = [a for a in offline_reader.artifacts(recs) if a.get("use_after_commit")]
    (made,) = [a for a in offline_reader.artifacts(recs) if not a.get("use_after_commit")]
    assert used["artifact_type"] == "model" and made["artifact_type"] == "embeddings"
    assert sorted(c["path"] for c in made["manifest"]["contents"]) == sorted(
        ["manifest.json", *(s["name"] for s in json.loads((output / "manifest.json").read_text())["shards"])]
    )
    again = run_embed(_config(**args))  # every shard done: no work, no second run
    assert again.tokens == 0 and [p.name for p in (output / "wandb").iterdir()] == ["attempt-001"]


def test_killed_run_on_s3_finishes_exactly_once(ray_local, s3_prefix, model):
    lines = _corpus()
    corpus = storage.join(s3_prefix, "in", "corpus.txt")
    storage.write_bytes(corpus, b"\n".join(lines) + b"\n")
    model_dir = storage.join(s3_prefix, "model")
    storage.upload_file(OPTIONS, storage.join(model_dir, "options.json"))
    storage.upload_file(WEIGHTS, storage.join(model_dir, "weights.hdf5"))
    output = storage.join(s3_prefix, "out")
    args = {"model": model_dir, "input": [corpus], "output": output}

    first = run_embed(_config(**args, stop_after_shards=1))  # "killed" after its first shard
    assert not first.complete and first.details.new_shards == 1
    assert not storage.exists(manifest.manifest_path(output))
    # shards already in flight when the driver stopped may have been committed too
    done = storage.list_prefix(storage.join(output, "embeddings-"))
    entries = storage.list_prefix(storage.join(output, "_progress", "embeddings-"))
    assert first.details.new_shards <= len(entries) <= len(done) <= 4
    storage.write_bytes(done[0], b"not hdf5: damaged after the kill")  # verify_resume must redo it

    second = run_embed(_config(**args))
    # the damaged shard is redone; at most the shards without an entry when we looked (a file whose
    # entry was not yet written counts as missing) are added to it
    assert second.complete and 1 <= second.details.new_shards <= 4 - len(entries) + 1

    pairs = _shard_values(output)
    keys = [k for k, _ in pairs]
    assert sorted(keys) == list(range(len(lines)))  # every line exactly once
    for key, value in pairs:
        expected = expected_value(model, lines[key], "all", MAX_TOKENS)
        np.testing.assert_allclose(value, expected, atol=1e-6, rtol=1e-5, err_msg=f"line {key}")
    assert dict(pairs)[7].shape == (3, 0, 32) and dict(pairs)[90].shape == (3, 2 * MAX_TOKENS + 5, 32)
    # control characters are spaces: the line's vectors are those of "God created the heaven"
    np.testing.assert_allclose(
        dict(pairs)[60], direct(model, ["God", "created", "the", "heaven"]), atol=1e-6, rtol=1e-5
    )

    doc = json.loads(storage.read_bytes(manifest.manifest_path(output)))
    assert doc["totals"]["sentences"] == len(lines) and doc["totals"]["shards"] == 4
    assert (
        doc["totals"]["empty_sentences"],
        doc["totals"]["invalid_utf8_lines"],
        doc["totals"]["control_char_lines"],
        doc["totals"]["split_sentences"],
    ) == (1, 1, 1, 1)
    assert doc["totals"]["tokens"] == sum(len(line_tokens(x)) for x in lines)
    assert [(s["first_line"], s["end_line"]) for s in doc["shards"]] == [
        (0, 40),
        (40, 80),
        (80, 120),
        (120, 150),
    ]
    for shard in doc["shards"]:
        assert (shard["layers"], shard["dtype"], shard["model_sha256"]) == (
            "all",
            "float32",
            doc["model"]["sha256"],
        )
        data = storage.read_bytes(storage.join(output, shard["name"]))
        assert hashlib.sha256(data).hexdigest() == shard["sha256"] and len(data) == shard["bytes"]
    assert doc["layers"] == "all" and doc["dtype"] == "float32" and len(doc["model"]["sha256"]) == 64

    third = run_embed(_config(**args))  # a rerun of a finished output redoes nothing
    assert third.complete and third.details.new_shards == 0
    assert json.loads(storage.read_bytes(manifest.manifest_path(output)))["shards"] == doc["shards"]


def test_packed_mean_pooled_run_on_a_shard_of_lines(ray_local, tmp_path, model):
    from pipeline.embed.hdf5_shard import iter_shard

    lines = sample_lines(30, start=100)
    lines[5] = b""
    corpus = tmp_path / "in.txt"
    corpus.write_bytes(b"\n".join(lines))
    out = tmp_path / "out"
    args = {"options_file": str(OPTIONS), "weights_file": str(WEIGHTS), "input": [str(corpus)]}
    result = run_embed(_config(**args, output=str(out), layout="packed", pool="mean", lines_per_shard=16))
    assert result.complete and result.details.shards == 2
    document = json.loads((out / "manifest.json").read_text())
    assert document["layout"] == "packed" and document["pool"] == "mean"
    assert {(e["layout"], e["pool"]) for e in document["shards"]} == {("packed", "mean")}
    values = dict(pair for path in sorted(out.glob("embeddings-*.hdf5")) for pair in iter_shard(str(path)))
    assert sorted(values) == list(range(len(lines)))
    for i, line in enumerate(lines):
        if line:
            np.testing.assert_allclose(
                values[i], expected_value(model, line, "all").mean(axis=1), atol=1e-6, rtol=1e-5
            )
    assert values[5].shape == (3, 32) and not values[5].any()
    with pytest.raises(Exception, match="layout=packed writes shards into a folder"):
        _config(**args, output=str(tmp_path / "one.hdf5"), layout="packed")


def test_single_file_has_allennlp_layout(ray_local, tmp_path, model):
    lines = sample_lines(30, start=200) + [b"same sentence", b"  same sentence  "]
    corpus = tmp_path / "in.txt"
    corpus.write_bytes(b"\n".join(lines))
    out = tmp_path / "out.hdf5"
    out.write_bytes(b"an older file")
    args = {
        "options_file": str(OPTIONS),
        "weights_file": str(WEIGHTS),
        "input": [str(corpus)],
        "output": str(out),
        "layers": "top",
        "lines_per_shard": 12,
        "workers": 2,
    }
    with pytest.raises(EmbedError, match=r"out.hdf5 already exists; pass --overwrite \(overwrite=true\)"):
        run_embed(_config(**args))
    assert out.read_bytes() == b"an older file" and not (tmp_path / "out.hdf5.parts").exists()
    # wandb offline, as by default: a single file logs no run (no folder of its own for the files)
    result = run_embed(_config(**args, overwrite=True, **{"wandb.mode": "offline"}))
    assert result.complete and result.details.shards == 3 and result.wandb_sync is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "in.txt",
        "out.hdf5",
    ]  # parts removed after the merge
    data = read_hdf5(out)
    assert sorted(data) == sorted([str(i) for i in range(len(lines))] + ["sentence_to_index"])
    with h5py.File(out, "r") as f:
        assert f["sentence_to_index"].shape == (1,)
        assert h5py.check_string_dtype(f["sentence_to_index"].dtype).encoding == "utf-8"
    index = data["sentence_to_index"]
    assert index["same sentence"] == str(len(lines) - 1)  # stripped text; a repeat keeps the last key
    assert index[lines[0].decode().strip()] == "0"
    for i, line in enumerate(lines):
        assert data[str(i)].dtype == np.float32
        np.testing.assert_allclose(data[str(i)], expected_value(model, line, "top"), atol=1e-6, rtol=1e-5)


def test_stateful_run_reproduces_the_original_fixture(ray_local, tmp_path):
    corpus = tmp_path / "fixture.txt"
    corpus.write_text("\n".join(" ".join(s) for s in fixture_sentences_batch_major()) + "\n")
    out = tmp_path / "out"
    args = {
        "options_file": str(OPTIONS),
        "weights_file": str(WEIGHTS),
        "input": [str(corpus)],
        "output": str(out),
    }
    result = run_embed(
        _config(
            **args,
            stateful=True,
            stateful_batch_size=3,
            lines_per_shard=6,
            layers="top",
            max_sentence_tokens=1000,
        )
    )
    assert result.complete and result.details.shards == 5
    values = dict(_shard_values(str(out)))
    expected = fixture_expected()  # E[row][batch]; line i = batch i // 3, row i % 3
    worst = max(float(np.abs(values[i] - expected[i % 3][i // 3]).max()) for i in range(30))
    assert worst < 1e-5


def test_parquet_holds_what_hdf5_holds_bit_for_bit(ray_local, tmp_path):
    """The same run in both formats: the same vectors, float16 and float32 alike, per token, with
    every layer, and pooled."""
    from pipeline.embed import read_embeddings

    lines = sample_lines(50, start=300)
    lines[3] = b""
    corpus = tmp_path / "in.txt"
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    args = {
        "options_file": str(OPTIONS),
        "weights_file": str(WEIGHTS),
        "input": [str(corpus)],
        "lines_per_shard": 20,
    }
    for layers, pool, dtype in [
        ("all", "none", "float16"),
        ("top", "mean", "float16"),
        ("top", "none", "float32"),
    ]:
        settings = {**args, "layers": layers, "pool": pool, "dtype": dtype}
        hdf5, parquet = tmp_path / f"h5-{layers}-{pool}-{dtype}", tmp_path / f"pq-{layers}-{pool}-{dtype}"
        run_embed(_config(**settings, output=str(hdf5), layout="packed"))
        run_embed(_config(**settings, output=str(parquet), format="parquet"))
        assert sorted(p.name for p in parquet.glob("embeddings-*")) == [
            f"embeddings-00000{i}.parquet" for i in range(3)
        ]
        document = json.loads((parquet / "manifest.json").read_text())
        assert document["file_format"] == "parquet" and {e["file_format"] for e in document["shards"]} == {
            "parquet"
        }
        got, want = list(read_embeddings(str(parquet))), list(read_embeddings(str(hdf5)))
        assert [line for line, _ in got] == [line for line, _ in want] == list(range(len(lines)))
        for (line, a), (_, b) in zip(got, want, strict=True):
            assert a.dtype == b.dtype == np.dtype(dtype) and a.shape == b.shape, line
            assert np.array_equal(a, b), (layers, pool, dtype, line)


def test_a_killed_parquet_run_resumed_writes_each_line_once(ray_local, tmp_path):
    from pipeline.embed import read_embeddings

    lines = sample_lines(90, start=400)
    corpus = tmp_path / "in.txt"
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    args = {"options_file": str(OPTIONS), "weights_file": str(WEIGHTS), "input": [str(corpus)]}
    out = str(tmp_path / "out")
    first = run_embed(_config(**args, output=out, format="parquet", lines_per_shard=20, stop_after_shards=1))
    assert not first.complete and not (tmp_path / "out" / "manifest.json").exists()
    second = run_embed(_config(**args, output=out, format="parquet", lines_per_shard=20))
    assert second.complete and second.details.new_shards <= 4
    assert [line for line, _ in read_embeddings(out)] == list(range(len(lines)))
    with pytest.raises(EmbedError, match=r"other settings \(file_format: 'parquet', now 'hdf5'\)"):
        run_embed(_config(**args, output=out, lines_per_shard=20))
    with pytest.raises(Exception, match="format=parquet writes shards into a folder"):
        _config(**args, output=str(tmp_path / "one.hdf5"), format="parquet")
