"""Record corpora in ``elmo embed`` (pipeline/embed/record_inputs.py, through inputs.py and the
stage): units named from metadata, pieces of whole records counted by tasks, each shard's
sentences read back with their record keys; end to end, every sentence found by (record id,
sentence index) with the vectors of a direct BiLM call, and a killed run finished exactly once."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from embed_fixtures import OPTIONS, WEIGHTS, direct, load_model, sample_lines

from pipeline.config import load_config
from pipeline.embed import inputs, read_embeddings, read_record_vectors
from pipeline.embed.config import EmbedConfig
from pipeline.embed.errors import EmbedError
from pipeline.embed.record_inputs import (
    RecordReading,
    RecordStreams,
    count_unit,
    read_records,
    record_kind,
    units_of,
)
from pipeline.embed.stage import EMBED
from pipeline.formats.records import RecordFields
from pipeline.formats.sentence_split import split_document
from pipeline.formats.tokenizer import make_tokenizer
from pipeline.runtime import storage
from pipeline.stage import run_stage

READING = RecordReading(RecordFields(text="text", id="id"))


def _documents(count: int, start: int = 0) -> list[dict]:
    """Documents of 1 to 6 sample verses each (verses ending in '.' split back into themselves)."""
    verses = [line.decode() for line in sample_lines(400, start=start)]
    docs, at = [], 0
    for i in range(count):
        take = 1 + i % 6
        docs.append({"id": f"doc-{i}", "text": " ".join(verses[at : at + take])})
        at += take
    return docs


def _parquet(path, docs, row_group_size=4) -> None:
    table = pa.table({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs]})
    pq.write_table(table, path, row_group_size=row_group_size)


def _jsonl(path, docs, extra_lines=()) -> None:
    data = ("\n".join([json.dumps(d) for d in docs] + list(extra_lines)) + "\n").encode()
    if path.name.endswith(".zst"):
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    elif path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)


def _sentences(docs) -> list[tuple[str, int, str]]:
    """(record id, sentence index, sentence) of every document, in order, as the splitter splits."""
    return [(d["id"], i, s) for d in docs for i, s in enumerate(split_document(d["text"]))]


@pytest.mark.parametrize(
    ("kind", "name"),
    [("parquet", "docs.parquet"), ("jsonl", "docs.jsonl"), ("jsonl-stream", "docs.jsonl.zst")],
)
def test_units_tile_the_file_and_pieces_hold_whole_records_of_at_least_a_shards_sentences(
    tmp_path, kind, name
):
    docs = _documents(30)
    path = tmp_path / name
    _parquet(path, docs) if kind == "parquet" else _jsonl(path, docs)
    assert record_kind(str(path)) == kind
    units = units_of(str(path), kind, READING, unit_bytes=600)  # several units, but a compressed file's one
    assert (len(units) == 1) if kind == "jsonl-stream" else (len(units) > 2 and units[0].start == 0)
    streams = RecordStreams()  # the shards of a compressed file read on from one stream
    assert all(a.end == b.start for a, b in zip(units, units[1:], strict=False))
    expected = _sentences(docs)
    got, line = [], 0
    for unit in units:
        count = count_unit(unit, READING, lines_per_shard=5)
        assert count.pieces[0].start == unit.start and count.pieces[-1].end == (
            unit.end if unit.end >= 0 else count.lines
        )
        assert all(a.end == b.start for a, b in zip(count.pieces, count.pieces[1:], strict=False))
        assert count.pieces[0].first_record == (unit.start if kind == "parquet" else 0)
        assert all(p.sentences >= 5 for p in count.pieces[:-1])
        for piece in count.pieces:
            segment = inputs.Segment(kind, str(path), piece.start, piece.end, first_record=piece.first_record)
            lines, keys, digest = read_records(segment, READING, streams)
            assert digest == piece.sha256 and len(lines) == piece.sentences
            assert read_records(segment, READING)[2] == digest  # read from the start as well
            assert keys.sentence[0] == 0  # a piece starts with a record's first sentence
            got += list(zip(keys.ids, keys.sentence.tolist(), (s.decode() for s in lines), strict=True))
            line += piece.sentences
    assert got == expected and line == len(expected)


def test_records_without_text_are_skipped_and_counted_and_an_id_defaults_to_file_and_line(tmp_path):
    path = tmp_path / "docs.jsonl"
    _jsonl(path, _documents(3), extra_lines=['{"id": "x", "text": 5}', "not json", '{"text": "A last one."}'])
    reading = RecordReading(RecordFields(text="text"))  # no id field
    (unit,) = units_of(str(path), "jsonl", reading)
    count = count_unit(unit, reading, lines_per_shard=1000)
    assert (count.records, count.skipped, count.first_skipped, count.lines) == (4, 2, 3, 6)
    (piece,) = count.pieces
    _, keys, _ = read_records(inputs.Segment("jsonl", str(path), piece.start, piece.end), reading)
    assert keys.ids[0] == "docs.jsonl:0" and keys.ids[-1] == "docs.jsonl:5"


def test_text_and_records_do_not_mix_and_compressed_text_is_refused(tmp_path):
    _jsonl(tmp_path / "a.jsonl", _documents(2))
    (tmp_path / "b.txt").write_text("plain text\n")
    with pytest.raises(EmbedError, match=r"input mixes records \(.*a.jsonl\) and sentence-per-line text"):
        inputs.resolve_inputs([str(tmp_path / "a.jsonl"), str(tmp_path / "b.txt")])
    _jsonl(tmp_path / "c.jsonl.gz", _documents(2))
    _parquet(tmp_path / "d.parquet", _documents(2))
    assert inputs.resolve_inputs([str(tmp_path / "c.jsonl.gz"), str(tmp_path / "d.parquet")])[0] == "records"
    (tmp_path / "e.txt.gz").write_bytes(gzip.compress(b"plain text\n"))
    with pytest.raises(EmbedError, match="e.txt.gz: compressed files are not read"):
        inputs.resolve_inputs([str(tmp_path / "e.txt.gz")])


def _config(**overrides) -> EmbedConfig:
    base = {
        "options_file": str(OPTIONS),
        "weights_file": str(WEIGHTS),
        "progress": False,
        "workers": 1,
        "wandb.mode": "disabled",
        "id_field": "id",
    }
    items = [f"{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in {**base, **overrides}.items()]
    return load_config(EmbedConfig, overrides=items)


@pytest.mark.parametrize("file_format", ["hdf5", "parquet"])
def test_each_sentence_of_a_record_corpus_is_found_by_its_record_and_a_killed_run_finishes_once(
    ray_local, tmp_path, file_format
):
    docs = _documents(24)
    _parquet(tmp_path / "part-0.parquet", docs[:14])
    _parquet(tmp_path / "part-1.parquet", docs[14:])
    out = str(tmp_path / "out")
    args = {
        "input": [str(tmp_path / "*.parquet")],
        "output": out,
        "format": file_format,
        "lines_per_shard": 8,
    }
    first = run_stage(EMBED, _config(**args, stop_after_shards=1))
    assert not first.complete
    second = run_stage(EMBED, _config(**args))
    assert second.complete and second.details.records.records == 24
    expected = _sentences(docs)
    found = list(read_embeddings(out, records=True))
    assert [(r, s) for _, r, s, _ in found] == [(r, s) for r, s, _ in expected]
    assert [line for line, *_ in found] == list(range(len(expected)))
    model = load_model()
    for (_, record, index, vectors), (_, _, text) in list(zip(found, expected, strict=True))[::9]:
        np.testing.assert_allclose(
            vectors, direct(model, text.split()), atol=2e-5, err_msg=f"{record} {index}"
        )
    document = json.loads(storage.read_bytes(storage.join(out, "manifest.json")))
    assert document["records"] == {"records": 24, "skipped": 0, "first_skipped": ""}
    with pytest.raises(EmbedError, match=r"other settings \(records:"):
        run_stage(EMBED, _config(**args, split_sentences="false"))
    with pytest.raises(EmbedError, match="holds no record ids"):
        text = tmp_path / "t.txt"
        text.write_text("in the beginning\n")
        run_stage(EMBED, _config(input=[str(text)], output=str(tmp_path / "text-out")))
        list(read_embeddings(str(tmp_path / "text-out"), records=True))


def test_a_records_pooled_vector_is_the_mean_of_its_sentences_token_vectors(ray_local, tmp_path):
    docs = _documents(12, start=100)
    _jsonl(tmp_path / "docs.jsonl.gz", docs)  # compressed: its shards read from one stream
    args = {"input": [str(tmp_path / "docs.jsonl.gz")], "lines_per_shard": 10, "layers": "top"}
    tokens_out, records_out = str(tmp_path / "tokens"), str(tmp_path / "records")
    run_stage(EMBED, _config(**args, output=tokens_out))
    pooled = run_stage(
        EMBED, _config(**args, output=records_out, pool="mean", pool_over="record", layout="packed")
    )
    assert pooled.complete
    by_record: dict[str, list[np.ndarray]] = {}
    for _, record, _, vectors in read_embeddings(tokens_out, records=True):
        by_record.setdefault(record, []).append(vectors)
    got = list(read_record_vectors(records_out))
    assert [record for record, _ in got] == [d["id"] for d in docs]
    for record, vector in got:
        expected = np.concatenate(by_record[record]).mean(axis=0)
        np.testing.assert_allclose(vector, expected, rtol=0, atol=1e-6, err_msg=record)
    with pytest.raises(EmbedError, match="holds a vector per record .* read_record_vectors"):
        next(read_embeddings(records_out))
    with pytest.raises(Exception, match="pool_over=record writes a vector per record: it needs pool=mean"):
        _config(**args, output=str(tmp_path / "x"), pool_over="record", layout="packed")


def test_raw_documents_are_tokenized_as_the_shard_stage_tokenizes_them(ray_local, tmp_path):
    docs = [{"id": "a", "text": 'He said, "Let there be light." And there was light.'}, *_documents(3)]
    _parquet(tmp_path / "docs.parquet", docs)
    out = str(tmp_path / "out")
    run_stage(EMBED, _config(input=[str(tmp_path / "docs.parquet")], output=out, tokenizer="moses"))
    moses = make_tokenizer("moses", "en")
    assert moses("He said, ") == ["He", "said", ","]
    model = load_model()
    expected = _sentences(docs)
    found = list(read_embeddings(out, records=True))
    assert len(found) == len(expected)
    for (_, record, index, vectors), (_, _, text) in zip(found, expected, strict=True):
        np.testing.assert_allclose(
            vectors, direct(model, moses(text)), atol=2e-5, err_msg=f"{record} {index}"
        )
    with pytest.raises(EmbedError, match=r"other settings \(tokenizer: 'moses:en', now None\)"):
        run_stage(EMBED, _config(input=[str(tmp_path / "docs.parquet")], output=out))
    with pytest.raises(Exception, match="config key 'moses_lang' must be a language the Moses rules know"):
        _config(input=[str(tmp_path / "docs.parquet")], output=out, tokenizer="moses", moses_lang="zz")
