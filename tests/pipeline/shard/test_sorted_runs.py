"""The Kneser-Ney pass's scratch files: tables written and read back exactly, bad files refused."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.shard import sorted_runs
from pipeline.shard.errors import ShardError


def _table(rng, n: int, m: int, high: int, count_high: int = 5):
    cols = np.unique(rng.integers(0, high, size=(m, n)), axis=0).T.astype(np.uint32)
    return np.ascontiguousarray(cols), rng.integers(1, count_high, size=cols.shape[1]).astype(np.int64)


@pytest.mark.parametrize(
    ("n", "high", "count_high", "packed"),
    [
        (3, 800_000, 5, True),  # order 3 of the benchmark's vocabulary: one uint64 a row
        (5, 800_000, 5, False),  # 100 bits: columns
        (2, 90, 2**40, True),  # counts past uint32
    ],
)
def test_tables_come_back_exactly(tmp_path, n, high, count_high, packed):
    rng = np.random.default_rng(n)
    tables = [_table(rng, n, 5000, high, count_high), _table(rng, n - 1 if n > 2 else n, 0, high)]
    path = str(tmp_path / "t.tables")
    size = sorted_runs.write_tables(path, tables, tokens=123_456)
    assert size == (tmp_path / "t.tables").stat().st_size
    row_bytes = 8 if packed else 4 * n
    count_bytes = 8 if count_high > 2**32 else 4
    assert size < len(sorted_runs.MAGIC) + 200 + tables[0][1].shape[0] * (row_bytes + count_bytes)
    got, tokens = sorted_runs.read_tables(path)
    assert tokens == 123_456 and len(got) == 2
    for (cols, counts), (want_cols, want_counts) in zip(got, tables, strict=True):
        assert cols.dtype == np.uint32 and counts.dtype == np.int64
        np.testing.assert_array_equal(cols, want_cols)
        np.testing.assert_array_equal(counts, want_counts)


def test_a_damaged_file_is_one_clear_error(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "t.tables"
    sorted_runs.write_tables(str(path), [_table(rng, 3, 100, 1000)])
    data = path.read_bytes()
    path.write_bytes(data[:-3])  # cut short
    with pytest.raises(
        ShardError,
        match=r"t\.tables is not a Kneser-Ney scratch file \(\d+ bytes where its header says \d+\); delete",
    ):
        sorted_runs.read_tables(str(path))
    path.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(ShardError, match="not a Kneser-Ney scratch file .no header."):
        sorted_runs.read_tables(str(path))
    with pytest.raises(
        ShardError, match=r"cannot read the Kneser-Ney pass.s scratch file \S*missing.tables: no such file"
    ):
        sorted_runs.read_tables(str(tmp_path / "missing.tables"))


def test_clear_deletes_the_scratch_and_nothing_else(tmp_path):
    rng = np.random.default_rng(1)
    for name in (sorted_runs.counts_name(0, 3), sorted_runs.adjusted_name(3)):
        sorted_runs.write_tables(str(tmp_path / name), [_table(rng, 2, 10, 50)])
    (tmp_path / "manifest.json").write_text("{}")
    sorted_runs.clear(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]
    sorted_runs.clear(str(tmp_path))  # nothing there: nothing to do
