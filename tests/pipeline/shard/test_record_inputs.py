"""The shard stage on record corpora: Parquet and JSON Lines (plain, gzip, zstd) documents, split
into sentences, locally and on the S3 test server."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline.formats.sentence_split import document_lines
from pipeline.formats.shard_format import FormatError
from pipeline.formats.shard_manifest import read_manifest
from pipeline.runtime import storage
from tests.pipeline.shard.test_job import SAMPLE, _config, run, run_shard

LINES = 2500


@pytest.fixture(scope="module")
def documents() -> list[str]:
    """The sample corpus's first lines as documents of 5-50 verses (a seeded draw)."""
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as f:
        lines = [next(f).rstrip("\n") for _ in range(LINES)]
    rng, docs, start = random.Random(0), [], 0
    while start < len(lines):
        size = rng.randint(5, 50)
        docs.append(" ".join(lines[start : start + size]))
        start += size
    return docs


@pytest.fixture(scope="module")
def files(documents, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("records")
    ids = [f"doc-{i}" for i in range(len(documents))]
    paths = {name: folder / name for name in ("docs.parquet", "docs.jsonl", "docs.jsonl.gz", "docs.data")}
    pq.write_table(pa.table({"id": ids, "body": documents}), paths["docs.parquet"], row_group_size=10)
    jsonl = "".join(
        json.dumps({"id": i, "body": d}) + "\n" for i, d in zip(ids, documents, strict=True)
    ).encode()
    paths["docs.jsonl"].write_bytes(jsonl)
    paths["docs.jsonl.gz"].write_bytes(gzip.compress(jsonl, mtime=0))
    paths["docs.data"].write_bytes(zstandard.ZstdCompressor().compress(jsonl))  # zstd, known by its bytes
    sentences, _ = document_lines(documents, split=True)
    paths["sentences.txt"] = folder / "sentences.txt"
    paths["sentences.txt"].write_text(sentences, encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def as_text(ray_local, files, tmp_path_factory) -> tuple[Path, dict]:
    """The documents' sentences as sentence-per-line text, sharded."""
    out = tmp_path_factory.mktemp("as-text") / "shards"
    return out, run([files["sentences.txt"]], out, workers=2)


def _same_shards(manifest: dict, text: dict) -> None:
    assert manifest["shards"] == text["shards"] and manifest["vocab"] == text["vocab"]
    assert manifest["totals"] == text["totals"]
    assert manifest["baselines"] == text["baselines"]


def test_parquet_documents_shard_to_their_sentences(as_text, files, documents, tmp_path):
    out, text = as_text
    manifest = run([files["docs.parquet"]], tmp_path / "pq", workers=2, text_field="body")
    _same_shards(manifest, text)
    assert (tmp_path / "pq" / "vocab.txt").read_bytes() == (out / "vocab.txt").read_bytes()
    lines = manifest["lines"]
    assert lines["documents"] == len(documents) and lines["records_skipped"] == 0
    assert lines["read"] == text["lines"]["read"]  # the sentences the documents became
    assert "documents" not in text["lines"]  # a text corpus's manifest is as before


def test_json_lines_plain_gzip_and_zstd_give_the_same_shards(as_text, files, tmp_path):
    _, text = as_text
    for name in ("docs.jsonl", "docs.jsonl.gz", "docs.data"):
        manifest = run([files[name]], tmp_path / name, workers=2, text_field="body", chunk_bytes=20000)
        _same_shards(manifest, text)


def test_records_without_text_are_skipped_and_counted(ray_local, files, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    good = files["docs.jsonl"].read_text().splitlines()
    bad.write_text("\n".join([good[0], '{"id": "x"}', good[1], '{"body": "torn']) + "\n")
    result = run_shard(
        _config(
            [bad], tmp_path / "out", workers=1, text_field="body", heldout_fraction=0.0, kneser_ney_orders=[]
        )
    )
    lines = result.details.manifest.lines
    assert (lines.documents, lines.records_skipped, lines.first_skipped) == (2, 2, (str(bad), 1))
    said = capsys.readouterr().out
    assert (
        f"documents read 2, split into sentences; warning: 2 records skipped (no string field 'body', or not a JSON object), the first {bad} record 1"
        in said
    )


def test_a_parquet_without_the_field_is_refused_in_one_line(ray_local, files, tmp_path):
    with pytest.raises(
        FormatError,
        match=r"docs.parquet: no column 'text' for the records' text \(it has id, body\); name another with text_field=",
    ):
        run([files["docs.parquet"]], tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists()


def test_unsplit_records_are_a_line_each(ray_local, files, documents, tmp_path):
    manifest = run(
        [files["docs.parquet"]],
        tmp_path / "out",
        workers=1,
        text_field="body",
        split_sentences=False,
        max_line_bytes=0,
    )
    assert manifest["lines"]["read"] == manifest["lines"]["documents"] == len(documents)


def test_s3_parquet_and_a_rerun_that_reads_row_groups_again(as_text, files, s3_prefix):
    _, text = as_text
    source = storage.join(s3_prefix, "in/docs.parquet")
    storage.upload_file(str(files["docs.parquet"]), source)
    target = storage.join(s3_prefix, "shards")
    manifest = run([source], target, workers=2, text_field="body")
    _same_shards(manifest, text)
    # an interrupted run: the manifest and a shard gone; the rerun reads their row groups again
    first = read_manifest(target).urls("train")[0]
    written = storage.read_bytes(first)
    storage.delete(storage.join(target, "manifest.json"))
    storage.delete(first)
    assert run([source], target, workers=2, text_field="body") == manifest
    assert storage.read_bytes(first) == written


def test_a_mix_of_text_and_records_reads_each_by_its_kind(ray_local, files, tmp_path):
    """A text file beside a Parquet file: the text's lines are sentences as they are, the records
    are split; the documents counted are the Parquet file's alone."""
    text = tmp_path / "verses.txt"
    text.write_text("In the beginning. Two sentences on one line\nsecond line\n")
    manifest = run([text, files["docs.parquet"]], tmp_path / "out", workers=2, text_field="body")
    detail = {Path(i["path"]).name: i for i in manifest["inputs_detail"]}
    assert detail["verses.txt"]["lines"] == 2 and "documents" not in detail["verses.txt"]
    parquet = detail["docs.parquet"]
    assert parquet["documents"] == manifest["lines"]["documents"] > 0
    assert manifest["lines"]["read"] == 2 + parquet["lines"]
