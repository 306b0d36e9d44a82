"""The embed output's names and manifest (pipeline/embed/manifest.py)."""

from __future__ import annotations

import json

from pipeline.embed import manifest
from pipeline.embed.file_format import format_named

RUN = {"layers": "top", "dtype": "float16", "stateful": False, "lines_per_shard": 2, "input": ["c.txt"]}


def test_the_manifest_lists_shards_in_line_order_with_their_totals_and_the_run(tmp_path):
    entries = [
        {"index": 1, "name": "embeddings-000001.hdf5", "sentences": 2, "tokens": 9, "bytes": 100},
        # written by an older version: no split_sentences field, which counts 0
        {"index": 0, "name": "embeddings-000000.hdf5", "sentences": 2, "tokens": 5, "bytes": 80,
         "split_sentences": 1, "empty_sentences": 1},
    ]  # fmt: skip
    document = manifest.build_manifest(RUN, {"sha256": "m"}, entries, {"workers": 1})
    assert [s["index"] for s in document["shards"]] == [0, 1]
    assert document["totals"] == {
        "sentences": 4, "tokens": 14, "empty_sentences": 1, "invalid_utf8_lines": 0,
        "control_char_lines": 0, "split_sentences": 1, "bytes": 180, "shards": 2,
    }  # fmt: skip
    # settings an older run.json did not record are their defaults
    assert (document["layout"], document["pool"], document["precision"]) == ("allennlp", "none", "float32")
    assert document["format"] == manifest.FORMAT and document["model"] == {"sha256": "m"}
    path = str(tmp_path / "manifest.json")
    manifest.write_json(path, document)
    assert json.loads((tmp_path / "manifest.json").read_text()) == document


def test_the_names_of_an_output():
    hdf5, parquet = format_named("hdf5"), format_named("parquet")
    assert (
        hdf5.file_name(7) == "embeddings-000007.hdf5" and parquet.file_name(7) == "embeddings-000007.parquet"
    )
    assert hdf5.file_name(1234567) == "embeddings-1234567.hdf5"
    assert hdf5.path("s3://b/out", 3) == "s3://b/out/embeddings-000003.hdf5"
    assert manifest.entry_path("/o", 3) == "/o/_progress/embeddings-000003.json"
    assert manifest.run_path("/o") == "/o/_progress/run.json"
    assert manifest.manifest_path("/o") == "/o/manifest.json"
