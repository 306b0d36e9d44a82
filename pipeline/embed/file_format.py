"""The file formats of embedding shards, one object each (docs/outputs.md#embeddings).

A format is its name (the config's ``format``, the manifest's ``file_format``, and the shard
file's suffix), how a shard is written (hashed as it is written) and how one is read back. The
formats are listed once, in :data:`FORMATS`; the config's choice (:class:`FileFormat`) is made
from that list. The stage picks a format once from the config (:func:`chosen_format`, bound to its
layout there), hands that object whole to whoever writes a shard (the actors, their writer
processes), records its name once in the manifest, and
:func:`pipeline.embed.reader.read_embeddings` finds it there again (:func:`format_named`).
A third format (Arrow IPC, NumPy's ``.npz``) is one new module with a ``write`` and a ``read`` and
one entry in :data:`FORMATS`.

The functions import their format's library on first use, so this module (and the names built
from it, ``manifest.SHARD_NAME``) stays light.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from pipeline.embed.errors import EmbedError
from pipeline.embed.shard_vectors import RecordKeys, ShardVectors
from pipeline.runtime import storage

Rows = Iterator[tuple[int, np.ndarray]]


@dataclass(frozen=True)
class EmbeddingFormat:
    """One shard file format, bound to the run's ``layout`` once chosen (HDF5's ``allennlp`` or
    ``packed``; other formats have one layout and ignore it). ``writer(shard, layout, out)`` and
    ``reader(data, where, pooled, rows)``: the format's module's functions, found by name (the
    object crosses into writer processes whole)."""

    name: str
    writer: Callable[[ShardVectors, str, BinaryIO], str]
    reader: Callable[[bytes, str, bool, int | None], Rows]
    keys_reader: Callable[[bytes, str, int], RecordKeys | None]
    layout: str = ""
    """Empty while unbound: a format found in a manifest only reads."""

    @property
    def suffix(self) -> str:
        return f".{self.name}"

    def bound(self, layout: str) -> EmbeddingFormat:
        """This format writing shards in ``layout``."""
        return dataclasses.replace(self, layout=layout)

    def file_name(self, index: int) -> str:
        """Shard ``index``'s file name (``embeddings-000007.hdf5``; ``manifest.SHARD_NAME`` reads it)."""
        return f"embeddings-{index:06d}{self.suffix}"

    def path(self, output: str, index: int) -> str:
        return storage.join(output, self.file_name(index))

    def write(self, shard: ShardVectors, out: BinaryIO) -> str:
        """``shard`` into the stream ``out`` (a storage stream); its sha256."""
        if not self.layout:
            raise ValueError(
                f"the {self.name} format writes only once bound to a layout (EmbeddingFormat.bound)"
            )
        return self.writer(shard, self.layout, out)

    def read(self, data: bytes, where: str, pooled: bool, rows: int | None) -> Rows:
        """A shard's bytes -> ``(line, value)`` in line order, in AllenNLP's shapes, checked before
        use (``where``: its path, for errors; ``rows``: the vectors the manifest counts, or None)."""
        return self.reader(data, where, pooled, rows)

    def read_record_keys(self, data: bytes, where: str, lines: int) -> RecordKeys | None:
        """A shard's record keys, one per each of its ``lines`` lines (None: a shard of text)."""
        return self.keys_reader(data, where, lines)


def _write_hdf5(shard: ShardVectors, layout: str, out: BinaryIO) -> str:
    from pipeline.embed.hdf5_shard import write_shard

    return write_shard(shard, layout, out)


def _read_hdf5(data: bytes, where: str, pooled: bool, rows: int | None) -> Rows:
    from pipeline.embed.hdf5_shard import iter_hdf5

    return iter_hdf5(data, where, rows)  # the file says whether it is pooled


def _hdf5_keys(data: bytes, where: str, lines: int) -> RecordKeys | None:
    from pipeline.embed.hdf5_shard import read_record_keys

    return read_record_keys(data, where, lines)


def _write_parquet(shard: ShardVectors, layout: str, out: BinaryIO) -> str:
    from pipeline.embed.parquet_shard import write_shard

    return write_shard(shard, out)


def _read_parquet(data: bytes, where: str, pooled: bool, rows: int | None) -> Rows:
    from pipeline.embed.parquet_shard import iter_shard

    return iter_shard(data, where, pooled, rows)


def _parquet_keys(data: bytes, where: str, lines: int) -> RecordKeys | None:
    from pipeline.embed.parquet_shard import read_record_keys

    return read_record_keys(data, where, lines)


FORMATS = {
    f.name: f
    for f in (
        # HDF5 shards, in ``layout`` (AllenNLP's, or packed)
        EmbeddingFormat("hdf5", _write_hdf5, _read_hdf5, _hdf5_keys),
        # Parquet shards: a row per line, the vectors as Arrow lists (pandas, Polars, DuckDB, Spark, Ray Data)
        EmbeddingFormat("parquet", _write_parquet, _read_parquet, _parquet_keys),
    )
}
"""Every shard file format by name: the one list of them."""

FileFormat = enum.Enum("FileFormat", [(name, name) for name in FORMATS], module=__name__)
"""The config's ``format`` choice: one member per entry of :data:`FORMATS`."""


def chosen_format(name: str, layout: str) -> EmbeddingFormat:
    """The config's ``format`` writing in its ``layout``: the one object a run's shards are
    written by."""
    return format_named(name).bound(layout)


def format_named(name: str) -> EmbeddingFormat:
    """The format called ``name`` (unbound: it reads); EmbedError, one line, for one this version
    does not know (a manifest written by a newer one)."""
    try:
        return FORMATS[name]
    except KeyError:
        raise EmbedError(
            f"shard file format {name!r} is not one this version reads ({', '.join(FORMATS)})"
        ) from None
