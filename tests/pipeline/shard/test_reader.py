import gzip
import itertools

import pytest

from pipeline.formats.records import RecordFields
from pipeline.shard.errors import ShardError
from pipeline.shard.reader import Reading, iter_chunks, resolve_inputs
from pipeline.shard.sentences import raw_lines


def _lines_of(chunks):
    return [line for c in chunks for line in raw_lines(c.data)]


def test_chunks_end_at_newlines_whatever_the_chunk_size(tmp_path):
    lines = [f"line {i} ".encode() * (i % 7 + 1) for i in range(300)]
    path = tmp_path / "corpus.txt.gz"
    path.write_bytes(gzip.compress(b"\n".join(lines)))  # last line without newline
    for chunk_bytes in (7, 100, 1 << 20):
        chunks = list(iter_chunks([str(path)], Reading(chunk_bytes, max_line_bytes=0)))
        assert _lines_of(chunks) == lines
        assert all(c.data.endswith(b"\n") for c in chunks[:-1])
        assert [c.index for c in chunks] == list(range(len(chunks)))


def test_reader_skips_an_overlong_line_without_holding_it(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"short\n" + b"y" * 5000 + b"\nafter\n" + b"z" * 5000)
    chunks = list(iter_chunks([str(path), str(path)], Reading(chunk_bytes=64, max_line_bytes=100)))
    assert _lines_of(chunks) == [b"short", b"after"] * 2
    assert max(len(c.data) for c in chunks) <= 64 + 100
    assert sum(c.overlong for c in chunks) == 4
    assert {c.source for c in chunks} == {0, 1}


def test_input_errors(tmp_path):
    (tmp_path / "a.txt").write_text("x\n")
    (tmp_path / "b.txt").write_text("y\n")
    assert resolve_inputs([str(tmp_path / "*.txt"), str(tmp_path / "a.txt")], "input") == [
        str(tmp_path / "a.txt"),
        str(tmp_path / "b.txt"),
    ]
    with pytest.raises(ShardError, match="input .*missing.txt: no such file"):
        resolve_inputs([str(tmp_path / "missing.txt")], "input")
    with pytest.raises(ShardError, match="no file or object matches"):
        resolve_inputs([str(tmp_path / "*.gz")], "input")
    fake = tmp_path / "fake.gz"
    fake.write_text("not gzip\n")
    with pytest.raises(ShardError, match="fake.gz: named .gz but is not gzip"):
        list(iter_chunks([str(fake)], Reading(100)))
    truncated = tmp_path / "cut.txt.gz"
    truncated.write_bytes(gzip.compress(b"abc\n" * 1000)[:-20])
    with pytest.raises(ShardError, match="cannot read input .*cut.txt.gz"):
        list(iter_chunks([str(truncated)], Reading(100)))
    xz = tmp_path / "corpus.txt"  # compressed data is known by its bytes, not its name
    xz.write_bytes(b"\xfd7zXZ\x00" + b"\x00" * 20)
    with pytest.raises(
        ShardError, match="corpus.txt: xz-compressed data; decompress it, or compress it with gzip or zstd"
    ):
        list(iter_chunks([str(xz)], Reading(100)))


def test_record_files_are_chunked_as_lines_or_row_groups(tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    from pipeline.shard.reader import chunk_text

    docs = [f"Document {i} begins. It ends here." for i in range(50)]
    pq.write_table(pa.table({"body": docs}), tmp_path / "docs.parquet", row_group_size=20)
    jsonl = "".join(json.dumps({"body": d}) + "\n" for d in docs).encode()
    (tmp_path / "docs.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl))
    reading = Reading(chunk_bytes=300, fields=RecordFields(text="body"))
    parquet = list(iter_chunks([str(tmp_path / "docs.parquet")], reading))  # a group's ~1 kB > chunk_bytes
    assert [(c.kind, c.row_groups, c.first_record, c.data) for c in parquet] == [
        ("parquet", (0,), 0, b""),
        ("parquet", (1,), 20, b""),
        ("parquet", (2,), 40, b""),
    ]
    together = list(iter_chunks([str(tmp_path / "docs.parquet")], Reading(fields=RecordFields(text="body"))))
    assert [(c.row_groups, c.first_record) for c in together] == [((0, 1, 2), 0)]
    jsonl_chunks = list(
        iter_chunks([str(tmp_path / "docs.jsonl.zst")], reading, first_index=3, first_source=1)
    )
    assert len(jsonl_chunks) > 3 and {c.kind for c in jsonl_chunks} == {"jsonl"}
    assert [c.index for c in jsonl_chunks] == list(range(3, 3 + len(jsonl_chunks)))
    starts = [c.first_record for c in jsonl_chunks]  # each chunk knows its first record's line
    assert starts == [0] + list(itertools.accumulate(c.data.count(b"\n") for c in jsonl_chunks[:-1]))
    expected = "".join(f"Document {i} begins.\nIt ends here.\n" for i in range(50)).encode()
    for chunks in (parquet, jsonl_chunks):
        texts = [chunk_text(c, reading) for c in chunks]
        assert b"".join(t.data for t in texts) == expected
        assert sum(t.documents for t in texts) == 50 and sum(t.records_skipped for t in texts) == 0
    whole = [chunk_text(c, Reading(fields=RecordFields(text="body"), split_sentences=False)) for c in parquet]
    assert b"".join(t.data for t in whole) == "".join(d + "\n" for d in docs).encode()


def test_text_lines_as_documents_with_split_sentences(tmp_path):
    from pipeline.shard.reader import chunk_text

    path = tmp_path / "one-document-a-line.txt"
    path.write_bytes(b"One. Two.\nThree\n")
    (chunk,) = iter_chunks([str(path)], Reading(split_sentences=True))
    assert chunk_text(chunk, Reading(split_sentences=True)).data == b"One.\nTwo.\nThree\n"
    assert chunk_text(chunk, Reading()).data == b"One. Two.\nThree\n"  # text: not split by default
    # a document line is held to max_record_bytes, not max_line_bytes, however the file is chunked
    path.write_bytes(b"A long line. " * 100 + b"\nShort one.\n" + b"x" * 3000 + b"\n")
    for chunk_bytes in (50, 1 << 20):
        reading = Reading(chunk_bytes, max_line_bytes=100, max_record_bytes=2000, split_sentences=True)
        chunks = list(iter_chunks([str(path)], reading))
        texts = [chunk_text(c, reading) for c in chunks]
        assert b"".join(t.data for t in texts) == b"A long line.\n" * 100 + b"Short one.\n"
        assert sum(c.overlong for c in chunks) + sum(t.overlong for t in texts) == 1
    with pytest.raises(ShardError, match="named .zst but is not zstd data"):
        (tmp_path / "x.txt.zst").write_bytes(b"plain\n")
        list(iter_chunks([str(tmp_path / "x.txt.zst")], Reading()))


def test_a_chunk_knows_its_first_record_past_overlong_ones(tmp_path):
    import json

    from pipeline.shard.reader import chunk_text

    lines = [json.dumps({"text": f"Record {i}."}) for i in range(30)]
    lines[7] = json.dumps({"text": "x" * 500})  # over max_record_bytes: dropped, still numbered
    lines[8] = '{"text": 5}'  # skipped: its number is the one reported
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(lines) + "\n")
    for chunk_bytes in (40, 100, 333, 1 << 20):
        reading = Reading(chunk_bytes=chunk_bytes, max_record_bytes=200)
        chunks = list(iter_chunks([str(path)], reading))
        texts = [chunk_text(c, reading) for c in chunks]
        assert sum(c.overlong for c in chunks) + sum(t.overlong for t in texts) == 1, chunk_bytes
        assert [t.first_skipped for t in texts if t.records_skipped] == [8], chunk_bytes
        assert b"".join(t.data for t in texts) == b"".join(
            f"Record {i}.\n".encode() for i in range(30) if i not in (7, 8)
        )
