"""read_embeddings (pipeline/embed/reader.py): one reader for every output of the stage (AllenNLP
layout, packed, Parquet, one file), locally and on S3, checking what it opens."""

from __future__ import annotations

import json

import numpy as np
import pytest
from embed_fixtures import OPTIONS, WEIGHTS, expected_value, load_model, sample_lines

from pipeline import storage
from pipeline.config import load_config
from pipeline.embed import read_embeddings
from pipeline.embed.config import EmbedConfig
from pipeline.embed.errors import EmbedError
from pipeline.embed.runner import run_embed

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
        "layers": "all", "lines_per_shard": 20, "progress": False, "workers": 1, **settings,
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
    with pytest.raises(EmbedError, match=r"'../in.txt' is not a shard name of this output"):
        list(read_embeddings(output))
