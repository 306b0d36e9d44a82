"""The Parquet form of an embedding shard (``format=parquet``; docs/outputs.md#embeddings).

``embeddings-NNNNNN.parquet``, one row per input line, in line order:

- ``line`` int64: the line's 0-based number in the input;
- ``tokens`` int32: its tokens (boundaries excluded; 0 for an empty line);
- ``vectors``: per token, in order, the token's vector (``list<fixed_size_list<float, 2P>>``: n x 2P),
  or with ``layers=all`` its N+1 layers' vectors (``list<fixed_size_list<fixed_size_list<float,
  2P>, N+1>>``: n x (N+1) x 2P, tokens first, as the packed HDF5 layout); pooled (``pool=mean``) the
  one vector of the line (``fixed_size_list<float, 2P>``, or ``(N+1) x 2P`` for ``all``). ``float``
  is float16 or float32 as ``dtype`` says.

A record corpus's shard adds ``record`` (string: each line's record id) and ``sentence`` (int32: its
index in that record).

The columns are Arrow views of the shard's one array (no copy); the file is written uncompressed
(embedding values do not compress) and hashed as it is written. The same vectors give the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.embed.errors import EmbedError
from pipeline.embed.shard_vectors import RecordKeys, ShardVectors, line_value
from pipeline.runtime import storage

COLUMNS = ("line", "tokens", "vectors")
RECORD_COLUMNS = ("record", "sentence")
ARROW_FLOATS = {np.dtype(np.float16): pa.float16(), np.dtype(np.float32): pa.float32()}


def vectors_column(shard: ShardVectors) -> pa.Array:
    """The ``vectors`` column: Arrow arrays over ``shard.vectors``'s own memory."""
    vectors = np.ascontiguousarray(shard.vectors)
    floats = pa.Array.from_buffers(ARROW_FLOATS[vectors.dtype], vectors.size, [None, pa.py_buffer(vectors)])
    column: pa.Array = floats
    for size in reversed(vectors.shape[1:]):  # innermost first: 2P, then N+1 for ``all``
        column = pa.FixedSizeListArray.from_arrays(column, size)
    if shard.pooled:
        return column
    return pa.ListArray.from_arrays(pa.array(shard.offsets, pa.int32()), column)


def shard_table(shard: ShardVectors) -> pa.Table:
    columns = {
        "line": pa.array(shard.line_numbers, pa.int64()),
        "tokens": pa.array(np.asarray(shard.tokens, dtype=np.int32), pa.int32()),
        "vectors": vectors_column(shard),
    }
    if shard.records is not None:
        columns["record"] = pa.array(shard.records.ids, pa.string())
        columns["sentence"] = pa.array(np.asarray(shard.records.sentence, dtype=np.int32), pa.int32())
    return pa.table(columns)


def write_shard(shard: ShardVectors, out: BinaryIO) -> str:
    """Write ``shard`` as a Parquet file to the stream ``out``; the sha256 (hex) of its bytes."""
    sink = storage.HashingWriter(out)
    pq.write_table(shard_table(shard), sink, compression="none", use_dictionary=False, write_statistics=False)
    return sink.hexdigest()


def _leaf(kind: pa.DataType) -> tuple[pa.DataType, tuple[int, ...]]:
    """The float type under nested fixed-size lists and their sizes, outermost first."""
    sizes = []
    while pa.types.is_fixed_size_list(kind):
        sizes.append(kind.list_size)
        kind = kind.value_type
    return kind, tuple(sizes)


def _check_metadata(data: bytes, where: str) -> None:
    """Before the table is read: what decoding would allocate is bounded by the file. The stage
    writes its shards uncompressed, plainly encoded and without nulls, so every value a column
    chunk counts is stored in the file: a compressed chunk, or one counting more values than the
    file has bytes (run-length-encoded nulls cost a bit each), is refused."""
    try:
        meta = pq.ParquetFile(pa.BufferReader(data)).metadata
    except (pa.ArrowInvalid, OSError) as err:
        raise EmbedError(f"{where}: not a readable Parquet file ({str(err).splitlines()[0]})") from None
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.compression != "UNCOMPRESSED" or chunk.num_values > len(data):
                raise EmbedError(
                    f"{where}: column {chunk.path_in_schema} is {chunk.compression.lower()} with "
                    f"{chunk.num_values:,} values in a {len(data):,}-byte file: not a shard this stage wrote"
                )


def iter_shard(
    data: bytes, where: str, pooled: bool, rows: int | None = None
) -> Iterator[tuple[int, np.ndarray]]:
    """``(line, value)`` of a Parquet shard's bytes in line order, in AllenNLP's shapes ((n, 2P),
    (N+1, n, 2P); pooled (2P,) or (N+1, 2P)), its schema and counts checked before use: what
    reading it allocates is bounded by the file first (``_check_metadata``). ``rows``: the vectors
    the manifest counts (tokens; lines when pooled)."""
    _check_metadata(data, where)
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as err:
        raise EmbedError(f"{where}: not a readable Parquet file ({str(err).splitlines()[0]})") from None
    if table.column_names not in (list(COLUMNS), [*COLUMNS, *RECORD_COLUMNS]):
        raise EmbedError(
            f"{where}: a Parquet shard has the columns {', '.join(COLUMNS)} (and, of records, "
            f"{', '.join(RECORD_COLUMNS)}), found {table.column_names}"
        )
    vectors = table.column("vectors").combine_chunks()
    kind = vectors.type
    if not pooled:
        if not pa.types.is_list(kind):
            raise EmbedError(f"{where}: vectors is {kind}, not a list of token vectors")
        kind = kind.value_type
    leaf, sizes = _leaf(kind)
    if leaf not in ARROW_FLOATS.values() or len(sizes) not in (1, 2) or vectors.null_count:
        raise EmbedError(
            f"{where}: vectors is {vectors.type}, not float16/float32 vectors of the stage's shapes"
        )
    lines = table.column("line").to_numpy()
    tokens = table.column("tokens").to_numpy()
    if rows is not None and (len(lines) if pooled else int(tokens.sum())) != rows:
        raise EmbedError(f"{where}: holds vectors other than the {rows:,} its manifest counts")
    if not pooled:
        offsets = vectors.offsets.to_numpy()
        if not np.array_equal(np.diff(offsets), tokens):
            raise EmbedError(f"{where}: the tokens column and the vectors' lengths disagree")
        flat = vectors.flatten()
    else:
        offsets, flat = np.arange(len(lines) + 1), vectors
    values = flat.flatten()
    while pa.types.is_fixed_size_list(values.type):
        values = values.flatten()
    array = values.to_numpy(zero_copy_only=False).reshape(-1, *sizes)
    for i, line in enumerate(lines.tolist()):
        yield line, line_value(array, offsets, i, pooled)


def read_record_keys(data: bytes, where: str, lines: int) -> RecordKeys | None:
    """A shard's record keys (None for a shard of text), checked: a string and an int32 column
    without nulls, one value per each of its ``lines`` lines."""
    _check_metadata(data, where)
    try:
        names = pq.ParquetFile(pa.BufferReader(data)).schema_arrow.names
        if not set(RECORD_COLUMNS) <= set(names):
            return None
        table = pq.read_table(pa.BufferReader(data), columns=list(RECORD_COLUMNS))
    except (pa.ArrowInvalid, OSError) as err:
        raise EmbedError(f"{where}: not a readable Parquet file ({str(err).splitlines()[0]})") from None
    ids, sentence = table.column("record"), table.column("sentence")
    if (
        ids.type != pa.string()
        or sentence.type != pa.int32()
        or ids.null_count
        or sentence.null_count
        or len(table) != lines
    ):
        raise EmbedError(f"{where}: record and sentence are not {lines:,} strings and integers")
    return RecordKeys(ids.to_pylist(), sentence.to_numpy())
