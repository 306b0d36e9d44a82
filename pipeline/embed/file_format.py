"""The file formats of embedding shards, one object each (docs/outputs.md#embeddings).

A format is its name (the config's ``format``, the manifest's ``file_format``, and the shard
file's suffix), how a shard is written (hashed as it is written) and how one is read back. The
formats are listed once, in :data:`FORMATS`; the config's choice (:class:`FileFormat`) is made
from that list. The stage picks a format once from the config (:func:`format_named`), records its
name once in the manifest, and :func:`pipeline.embed.reader.read_embeddings` finds it there again.
A third format (Arrow IPC, NumPy's ``.npz``) is one new module with a ``write`` and a ``read`` and
one entry in :data:`FORMATS`.

The functions import their format's library on first use, so this module (and the names built
from it, ``manifest.SHARD_NAME``) stays light.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from pipeline.embed.errors import EmbedError
from pipeline.embed.shard_vectors import ShardVectors

Rows = Iterator[tuple[int, np.ndarray]]


@dataclass(frozen=True)
class ShardFormat:
    """One shard file format. ``write(shard, layout, out)``: the shard into the stream ``out`` (a
    storage stream), its sha256 returned (``layout``: HDF5's ``allennlp`` or ``packed``; other
    formats have one). ``read(data, where, pooled, rows)``: a shard's bytes -> ``(line, value)``
    in line order, in AllenNLP's shapes, checked before use (``rows``: the vectors the manifest
    counts, or None)."""

    name: str
    write: Callable[[ShardVectors, str, BinaryIO], str]
    read: Callable[[bytes, str, bool, int | None], Rows]

    @property
    def suffix(self) -> str:
        return f".{self.name}"


def _write_hdf5(shard: ShardVectors, layout: str, out: BinaryIO) -> str:
    from pipeline.embed.hdf5_shard import write_shard

    return write_shard(shard, layout, out)


def _read_hdf5(data: bytes, where: str, pooled: bool, rows: int | None) -> Rows:
    from pipeline.embed.hdf5_shard import iter_hdf5

    return iter_hdf5(data, where, rows)  # the file says whether it is pooled


def _write_parquet(shard: ShardVectors, layout: str, out: BinaryIO) -> str:
    from pipeline.embed.parquet_shard import write_shard

    return write_shard(shard, out)


def _read_parquet(data: bytes, where: str, pooled: bool, rows: int | None) -> Rows:
    from pipeline.embed.parquet_shard import iter_shard

    return iter_shard(data, where, pooled, rows)


FORMATS = {
    f.name: f
    for f in (
        # HDF5 shards, in ``layout`` (AllenNLP's, or packed)
        ShardFormat("hdf5", _write_hdf5, _read_hdf5),
        # Parquet shards: a row per line, the vectors as Arrow lists (pandas, Polars, DuckDB, Spark, Ray Data)
        ShardFormat("parquet", _write_parquet, _read_parquet),
    )
}
"""Every shard file format by name: the one list of them."""

FileFormat = enum.Enum("FileFormat", [(name, name) for name in FORMATS], module=__name__)
"""The config's ``format`` choice: one member per entry of :data:`FORMATS`."""


def format_named(name: str) -> ShardFormat:
    """The format called ``name``; EmbedError, one line, for one this version does not know (a
    manifest written by a newer one)."""
    try:
        return FORMATS[name]
    except KeyError:
        raise EmbedError(
            f"shard file format {name!r} is not one this version reads ({', '.join(FORMATS)})"
        ) from None
