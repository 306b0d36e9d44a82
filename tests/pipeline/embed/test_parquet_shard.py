"""The Parquet form of an embedding shard (pipeline/embed/parquet_shard.py): the columns and types
data tools read, the same values as the HDF5 layouts, the same bytes every time, and what a reader
refuses."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from embed_fixtures import shard_of

from pipeline.embed.errors import EmbedError
from pipeline.embed.parquet_shard import iter_shard, write_shard

WIDTH = 8


def _values(lengths, layers: bool, pooled: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    values = [
        rng.standard_normal((3, n, WIDTH) if layers else (n, WIDTH)).astype(np.float32) for n in lengths
    ]
    if pooled:
        return [
            v.mean(axis=-2) if v.shape[-2] else np.zeros(v.shape[:-2] + (WIDTH,), np.float32) for v in values
        ]
    return values


def _bytes(shard) -> tuple[bytes, str]:
    out = io.BytesIO()
    digest = write_shard(shard, out)
    return out.getvalue(), digest


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("pooled", [False, True], ids=["tokens", "pooled"])
@pytest.mark.parametrize("layers", [True, False], ids=["all", "top"])
def test_a_row_per_line_with_the_vectors_as_arrow_lists(layers, pooled, dtype):
    values = _values([4, 1, 0, 7], layers, pooled)
    data, digest = _bytes(shard_of(20, values, dtype, pooled))
    assert (
        digest == hashlib.sha256(data).hexdigest() and _bytes(shard_of(20, values, dtype, pooled))[0] == data
    )
    table = pq.read_table(io.BytesIO(data))
    assert table.column_names == ["line", "tokens", "vectors"]
    assert table.column("line").to_pylist() == [20, 21, 22, 23]
    leaf = pa.float16() if dtype == "float16" else pa.float32()
    row = pa.list_(leaf, WIDTH)
    if layers:
        row = pa.list_(row, 3)
    assert table.schema.field("vectors").type == (row if pooled else pa.list_(row))
    # pandas reads it as it is: a line's vectors come back as nested arrays of the stored dtype
    frame = pd.read_parquet(io.BytesIO(data))
    first = np.stack(frame.vectors[0]) if not layers and not pooled else None
    if first is not None:
        np.testing.assert_array_equal(first, values[0].astype(dtype))
    read = list(iter_shard(data, "shard", pooled))
    assert [line for line, _ in read] == [20, 21, 22, 23]
    for (_, got), want in zip(read, values, strict=True):
        assert got.dtype == np.dtype(dtype) and got.shape == want.shape
        np.testing.assert_array_equal(got, want.astype(dtype))


def test_what_is_not_the_stages_parquet_is_refused():
    data, _ = _bytes(shard_of(0, _values([2, 3], False, False)))
    with pytest.raises(EmbedError, match="shard: not a readable Parquet file"):
        list(iter_shard(b"PAR1 not really", "shard", False))
    table = pq.read_table(io.BytesIO(data))
    for change, message in [
        (table.drop(["tokens"]), "has the columns line, tokens, vectors"),
        (
            table.set_column(1, "tokens", pa.array([2, 9], pa.int32())),
            "the tokens column and the vectors' lengths disagree",
        ),
        (
            table.set_column(2, "vectors", pa.array([[1], [2]], pa.list_(pa.int64()))),
            "not float16/float32 vectors",
        ),
    ]:
        out = io.BytesIO()
        pq.write_table(change, out, compression="none")
        with pytest.raises(EmbedError, match=message):
            list(iter_shard(out.getvalue(), "shard", False))


def test_what_decoding_would_allocate_is_bounded_by_the_file_before_it_is_read():
    """The stage writes uncompressed, plain, null-free columns: a compressed chunk (a few bytes
    that decode to gigabytes), or a chunk counting more values than the file has bytes (nulls
    run-length encoded), is refused before the table is decoded; so is a count of vectors other
    than the manifest's."""
    data, _ = _bytes(shard_of(0, _values([2, 3], False, False)))
    table = pq.read_table(io.BytesIO(data))
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd")
    with pytest.raises(EmbedError, match="column line is zstd with 2 values in a .*-byte file"):
        list(iter_shard(out.getvalue(), "shard", False))
    nulls = pa.table({"line": pa.nulls(200_000, pa.int64())})
    out = io.BytesIO()
    pq.write_table(nulls, out, compression="none")
    with pytest.raises(EmbedError, match="column line is uncompressed with 200,000 values"):
        list(iter_shard(out.getvalue(), "shard", False))
    with pytest.raises(EmbedError, match="holds vectors other than the 6 its manifest counts"):
        list(iter_shard(data, "shard", False, rows=6))
    assert len(list(iter_shard(data, "shard", False, rows=5))) == 2
