import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline.formats.records import (
    RecordFields,
    input_kind,
    iter_parquet_chunks,
    jsonl_records,
    parquet_records,
    parquet_row_groups,
)
from pipeline.formats.shard_format import FormatError

ROWS = [
    {"id": "a", "text": "First doc. Two sentences.", "n": 7},
    {"id": None, "text": "No id.", "n": 8},
    {"id": "c", "text": None, "n": 9},
    {"id": "d", "text": "Last.", "n": 10},
]


@pytest.fixture
def parquet_file(tmp_path):
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=3)
    return str(path)


def test_kinds_are_known_by_content_not_by_name(tmp_path, parquet_file):
    lines = b'  {"text": "x"}\n'
    (tmp_path / "a.txt").write_bytes(zstandard.ZstdCompressor().compress(lines))
    (tmp_path / "b.bin").write_bytes(gzip.compress(lines))
    (tmp_path / "c.jsonl").write_bytes(b"plain text, though named .jsonl\n")
    (tmp_path / "d.txt").write_bytes(open(parquet_file, "rb").read())
    assert [input_kind(str(tmp_path / n)) for n in ("a.txt", "b.bin", "c.jsonl", "d.txt")] == [
        "jsonl",
        "jsonl",
        "text",
        "parquet",
    ]


def test_parquet_row_groups_and_their_records(parquet_file):
    fields = RecordFields(id="id")
    assert [rows for rows, _ in parquet_row_groups(parquet_file, fields)] == [3, 1]
    assert list(iter_parquet_chunks(parquet_file, fields, chunk_bytes=1)) == [
        (range(0, 1), 0),
        (range(1, 2), 3),
    ]
    assert list(iter_parquet_chunks(parquet_file, fields, chunk_bytes=1 << 20)) == [(range(0, 2), 0)]
    both = parquet_records(parquet_file, range(0, 2), 0, fields)
    assert both.numbers == [0, 3] and both.skipped == 2
    first = parquet_records(parquet_file, [0], 0, fields)
    assert first.texts == ["First doc. Two sentences."] and first.ids == ["a"] and first.numbers == [0]
    assert (first.skipped, first.first_skipped) == (2, 1)  # a null id, a null text
    last = parquet_records(parquet_file, [1], 3, RecordFields(id="n"))  # integer ids become strings
    assert (last.texts, last.ids, last.numbers) == (["Last."], ["10"], [3])
    assert (
        parquet_records(parquet_file, [0], 0, RecordFields()).skipped == 1
    )  # no id asked: only the null text


def test_parquet_columns_are_checked_from_the_footer(parquet_file, tmp_path):
    with pytest.raises(FormatError, match=r"no column 'body' for the records' text \(it has id, text, n\)"):
        list(iter_parquet_chunks(parquet_file, RecordFields(text="body"), 1))
    with pytest.raises(FormatError, match="column 'n' holds int64, not strings$"):
        list(iter_parquet_chunks(parquet_file, RecordFields(text="n"), 1))
    floats = tmp_path / "floats.parquet"
    pq.write_table(pa.table({"text": ["a"], "score": [0.5]}), floats)
    with pytest.raises(FormatError, match="column 'score' holds double, not strings or integers"):
        list(iter_parquet_chunks(str(floats), RecordFields(id="score"), 1))
    damaged = tmp_path / "damaged.parquet"
    data = bytearray(open(parquet_file, "rb").read())
    data[-12:-8] = b"\xff\xff\xff\x7f"  # the footer's length
    damaged.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="damaged.parquet: not a readable Parquet file"):
        list(iter_parquet_chunks(str(damaged), RecordFields(), 1))


def test_a_damaged_row_group_is_refused_naming_it(tmp_path):
    path = tmp_path / "pages.parquet"
    texts = [f"document number {i} " * 40 for i in range(400)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=200, compression="none")
    data = bytearray(path.read_bytes())
    start = data.index(b"document number 250")
    data[start - 40 : start + 4000] = b"\xff" * 4040  # inside the second row group's pages
    path.write_bytes(bytes(data))
    assert parquet_records(str(path), [0], 0, RecordFields()).texts == texts[:200]
    with pytest.raises(FormatError, match=r"pages.parquet: row group 1 cannot be read \("):
        parquet_records(str(path), [1], 200, RecordFields())
    with pytest.raises(FormatError, match=r"pages.parquet: row groups 0-1 cannot be read \("):
        parquet_records(str(path), range(0, 2), 0, RecordFields())


def test_jsonl_records_skip_what_is_not_a_record_with_a_string_text():
    lines = [
        json.dumps({"text": "kept", "id": 3}),
        "",
        json.dumps({"text": 5}),
        json.dumps(["not", "an", "object"]),
        json.dumps({"text": "no id"}),
        json.dumps({"text": "bool id", "id": True}),
        '{"text": "torn',
    ]
    records = jsonl_records("\n".join(lines).encode(), RecordFields(id="id"), first_number=10)
    assert (records.texts, records.ids, records.numbers) == (["kept"], ["3"], [10])
    assert (records.skipped, records.first_skipped) == (5, 12)
    plain = jsonl_records("\n".join(lines).encode(), RecordFields(), first_number=0)
    assert plain.texts == ["kept", "no id", "bool id"] and plain.ids == []
