"""read_embeddings (pipeline/embed/reader.py): one reader for every output of the stage (AllenNLP
layout, packed, Parquet, one file), locally and on S3, checking what it opens."""

from __future__ import annotations

import hashlib
import json
import os

import h5py
import numpy as np
import pytest
from embed_fixtures import OPTIONS, WEIGHTS, expected_value, load_model, sample_lines

from pipeline.config import load_config
from pipeline.embed import read_embeddings
from pipeline.embed.config import EmbedConfig
from pipeline.embed.errors import EmbedError
from pipeline.embed.runner import run_embed
from pipeline.runtime import storage

LINES = sample_lines(45, start=500)
OUTPUTS = {
    "allennlp": ("out-allennlp", {}),
    "packed": ("out-packed", {"layout": "packed"}),
    "parquet": ("out-parquet", {"format": "parquet"}),
    "single file": ("one.hdf5", {}),
}


def _embed(root: str, name: str, settings: dict) -> str:
    corpus = storage.join(root, "in.txt")
    if not storage.exists(corpus):
        storage.write_bytes(corpus, b"\n".join(LINES) + b"\n")
    output = storage.join(root, name)
    items = {
        "options_file": str(OPTIONS), "weights_file": str(WEIGHTS), "input": f"[{corpus}]", "output": output,
        "layers": "all", "lines_per_shard": 20, "progress": False, "workers": 1, "wandb.mode": "disabled", **settings,
    }  # fmt: skip
    run_embed(load_config(EmbedConfig, overrides=[f"{k}={v}" for k, v in items.items()]))
    return output


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("kind", list(OUTPUTS))
def test_every_output_reads_back_in_line_order_with_the_stages_vectors(
    ray_local, tmp_path, request, kind, where
):
    root = str(tmp_path) if where == "local" else request.getfixturevalue("s3_prefix")
    name, settings = OUTPUTS[kind]
    output = _embed(root, name, settings)
    model = load_model()
    read = list(read_embeddings(output))
    assert [line for line, _ in read] == list(range(len(LINES)))
    for line, value in read:
        np.testing.assert_allclose(value, expected_value(model, LINES[line], "all"), atol=1e-6, rtol=1e-5)


def test_what_the_manifest_does_not_vouch_for_is_refused(ray_local, tmp_path):
    output = _embed(str(tmp_path), "out", {"format": "parquet"})
    with pytest.raises(EmbedError, match=r"no readable manifest.json .*not an elmo embed output"):
        list(read_embeddings(str(tmp_path / "elsewhere")))
    shard = tmp_path / "out" / "embeddings-000001.parquet"
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + b"X")
    with pytest.raises(EmbedError, match=r"embeddings-000001.parquet is damaged or was replaced"):
        list(read_embeddings(output))
    shard.write_bytes(data)
    manifest_file = tmp_path / "out" / "manifest.json"
    document = json.loads(manifest_file.read_text())
    document["shards"][0]["name"] = "../in.txt"
    manifest_file.write_text(json.dumps(document))
    with pytest.raises(
        EmbedError, match=r"'../in.txt' is not the name of its shard 0 in this output's format"
    ):
        list(read_embeddings(output))


def _rewrite(manifest_file, change) -> None:
    document = json.loads(manifest_file.read_text())
    change(document)
    manifest_file.write_text(json.dumps(document))


def test_a_manifest_is_checked_whole_and_each_shard_sized_before_it_is_read(ray_local, tmp_path):
    output = _embed(str(tmp_path), "out", {})
    manifest_file = tmp_path / "out" / "manifest.json"
    original = manifest_file.read_text()
    cases = [
        (lambda d: d["shards"].insert(1, dict(d["shards"][0])), r"shard entry 1 \(embeddings-000000.hdf5\) is out of place"),
        (lambda d: d["shards"].pop(1), r"shard entry 1 \(embeddings-000002.hdf5\) is out of place"),
        (lambda d: d["shards"][0].update(first_line="zero"), r"shard entry 0 is malformed"),
        (lambda d: d["shards"].__setitem__(0, []), r"shard entry 0 is malformed"),
        (lambda d: d["shards"][2].pop("sha256"), r"shard entry 2 is malformed"),
        (lambda d: d["shards"][1].pop("bytes"), r"shard entry 1 is malformed"),  # every schema's entries count it
        (lambda d: d["totals"].update(tokens=d["totals"]["tokens"] + 1), r"do not add up to its totals"),
        (lambda d: d.update(shards={}), r"not an elmo embed manifest"),
    ]  # fmt: skip
    for change, message in cases:
        manifest_file.write_text(original)
        _rewrite(manifest_file, change)
        with pytest.raises(EmbedError, match=message):
            list(read_embeddings(output))
    manifest_file.write_text(original)
    shard = tmp_path / "out" / "embeddings-000001.hdf5"
    data = shard.read_bytes()
    shard.write_bytes(data + b"\0")
    with pytest.raises(
        EmbedError,
        match=rf"is damaged or was replaced: {len(data) + 1:,} bytes, its manifest says {len(data):,}",
    ):
        list(read_embeddings(output))
    shard.unlink()
    shard.symlink_to("/dev/zero")  # read whole, it would never end
    with pytest.raises(EmbedError, match="embeddings-000001.hdf5: not a regular file"):
        list(read_embeddings(output))
    shard.unlink()
    os.mkfifo(shard)  # opened for reading, it would wait for a writer for ever
    with pytest.raises(EmbedError, match="embeddings-000001.hdf5: not a regular file"):
        list(read_embeddings(output))
    shard.unlink()
    shard.write_bytes(data)
    assert len(list(read_embeddings(output))) == len(LINES)


def test_a_tiny_shard_whose_dataset_claims_gigabytes_is_refused_before_it_is_read(ray_local, tmp_path):
    """Manifest and shard can both be forged (the sha256 vouches only for consistency): a
    1,400-byte file whose dataset claims (3, 2,000,000, 1024) floats would allocate 22.9 GiB."""
    output = _embed(str(tmp_path), "out", {})
    shard = tmp_path / "out" / "embeddings-000000.hdf5"
    with h5py.File(shard, "w") as forged:
        forged.create_dataset("0", shape=(3, 2_000_000, 1024), dtype="float32")  # no storage allocated
    assert shard.stat().st_size < 4096
    data = shard.read_bytes()

    def forge(document):
        entry = document["shards"][0]
        document["totals"]["bytes"] += len(data) - entry["bytes"]
        entry.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))

    _rewrite(tmp_path / "out" / "manifest.json", forge)
    with pytest.raises(
        EmbedError,
        match=r"'0' claims shape \(3, 2000000, 1024\) \(24,576,000,000 bytes\), more than the file's",
    ):
        list(read_embeddings(output))
    single = tmp_path / "single.hdf5"
    single.symlink_to("/dev/zero")
    with pytest.raises(EmbedError, match="single.hdf5: not a regular file"):
        list(read_embeddings(str(single)))


def test_an_output_of_the_first_schema_is_still_read_and_resumed(ray_local, tmp_path):
    """Outputs written before the schema got its own key (``"format": "elmo-embeddings/1"``, and no
    record of the settings added later) read the same and a rerun into them resumes."""
    output = _embed(str(tmp_path), "out", {})
    expected = list(read_embeddings(output))
    later = ("schema", "file_format", "layout", "pool", "precision")
    for path in (tmp_path / "out" / "manifest.json", tmp_path / "out" / "_progress" / "run.json"):
        document = json.loads(path.read_text())
        path.write_text(
            json.dumps(
                {"format": "elmo-embeddings/1", **{k: v for k, v in document.items() if k not in later}}
            )
        )
    got = list(read_embeddings(output))
    assert [line for line, _ in got] == [line for line, _ in expected]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(got, expected, strict=True))
    _embed(str(tmp_path), "out", {})  # the same settings: a resume with nothing to do, not a refusal
    assert [line for line, _ in read_embeddings(output)] == [line for line, _ in expected]
