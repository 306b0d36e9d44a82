"""The embed output's names and manifest (pipeline/embed/manifest.py)."""

from __future__ import annotations

import json

from pipeline.embed import manifest
from pipeline.embed.file_format import format_named

RUN = {"layers": "top", "dtype": "float16", "stateful": False, "lines_per_shard": 2, "input": ["c.txt"]}
FIRST_RUN = {"format": manifest.FIRST_SCHEMA, **RUN}
"""A run.json of the first schema, which did not record the settings added later."""


def test_the_manifest_lists_shards_in_line_order_with_their_totals_and_the_run(tmp_path):
    zero = dict.fromkeys(manifest.COUNTED, 0)
    entries = [
        {**zero, "index": 1, "name": "embeddings-000001.hdf5", "sentences": 2, "tokens": 9, "bytes": 100},
        {**zero, "index": 0, "name": "embeddings-000000.hdf5", "sentences": 2, "tokens": 5, "bytes": 80,
         "split_sentences": 1, "empty_sentences": 1},
    ]  # fmt: skip
    document = manifest.build_manifest(FIRST_RUN, {"sha256": "m"}, entries, {"workers": 1})
    assert [s["index"] for s in document["shards"]] == [0, 1]
    assert document["totals"] == {
        "sentences": 4, "tokens": 14, "empty_sentences": 1, "invalid_utf8_lines": 0,
        "control_char_lines": 0, "split_sentences": 1, "bytes": 180, "shards": 2,
    }  # fmt: skip
    # settings a first-schema run.json did not record are their defaults; the manifest is of this schema
    assert (document["layout"], document["pool"], document["precision"]) == ("allennlp", "none", "float32")
    assert (
        document["schema"] == manifest.SCHEMA
        and "format" not in document
        and document["model"] == {"sha256": "m"}
    )
    path = str(tmp_path / "manifest.json")
    manifest.write_json(path, document)
    assert json.loads((tmp_path / "manifest.json").read_text()) == document


def test_the_schema_is_named_by_its_own_key_and_the_first_one_is_still_read():
    now = {"schema": manifest.SCHEMA, **RUN, **manifest.RUN_DEFAULTS, "file_format": "parquet"}
    assert manifest.schema_of(now) == manifest.SCHEMA and manifest.current(now) == now  # nothing filled in
    assert manifest.schema_of(FIRST_RUN) == manifest.FIRST_SCHEMA
    assert manifest.current(FIRST_RUN) == {"schema": manifest.SCHEMA, **manifest.RUN_DEFAULTS, **RUN}
    # another stage's document, or one that only looks like ours
    for other in ({"format": "elmo-shards"}, {"schema": "elmo-embeddings/9"}, [], None):
        assert manifest.schema_of(other) is None
    assert manifest.schema_of({"schema": "x", "format": manifest.FIRST_SCHEMA}) is None


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
