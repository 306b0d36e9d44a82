"""The two HDF5 layouts of an embedding shard (docs/outputs.md#embeddings).

``allennlp`` (the default, and the single file's): the layout of AllenNLP's ``elmo`` command, one
dataset per sentence, named by the sentence's 0-based input line number (``"0"``, ``"1"``, ...),
holding (N+1, n, 2P) for ``all`` or (n, 2P) for ``top``/``average``. The single file adds
AllenNLP's ``sentence_to_index``.

``packed`` (for large corpora: three datasets per shard instead of one per sentence):
``vectors`` every token's vectors in line order, (tokens, N+1, 2P) for ``all`` or (tokens, 2P);
``offsets`` int64 (S+1,), sentence i's tokens are ``vectors[offsets[i]:offsets[i+1]]``; ``lines``
int64 (S,), sentence i's input line. Pooled (``pool=mean``) a sentence is one row of ``vectors``
(``offsets`` is then 0..S). The file's ``layout`` attribute says which layout it has.

A record corpus's shard (either layout) also holds ``record_ids`` (S,) UTF-8 strings, each
sentence's record id, and ``record_sentences`` int32 (S,), its index in that record.

Timestamps are off, so the same vectors always give the same bytes (a rerun reproduces a shard's
sha256).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from typing import BinaryIO

import h5py
import numpy as np

from elmo_model.hdf5_storage import require_stored_here
from pipeline.embed.errors import EmbedError
from pipeline.embed.shard_vectors import RecordKeys, ShardVectors, line_value
from pipeline.runtime import storage

SENTENCE_TO_INDEX = "sentence_to_index"
LAYOUTS = ("allennlp", "packed")
PACKED = ("vectors", "offsets", "lines")
RECORD_DATASETS = ("record_ids", "record_sentences")
"""A record corpus's shard: each sentence's record id and index in the record."""
WRITE_CHUNK = 4 * 1024 * 1024
"""Bytes written and hashed per step: each chunk is hashed while it is still in the CPU's cache."""


def write_shard(shard: ShardVectors, layout: str, out: BinaryIO) -> str:
    """Write ``shard`` as an HDF5 file in ``layout`` to the stream ``out`` (``storage.open_write``:
    a local file or an S3 upload); the sha256 (hex) of the bytes written.

    ``packed``: HDF5 lays out a skeleton of the file in a local temp file (its metadata, ``offsets``,
    ``lines``, and room for ``vectors`` reserved at a fixed address and never written: a sparse
    hole), then the file goes to ``out`` in order, the skeleton's bytes before the room, the
    vectors straight from their array, the skeleton's bytes after it, each hashed as it is
    written: the vectors are neither copied into an HDF5 buffer nor read back. ``allennlp``: a
    dataset per line (the format's cost; docs/outputs.md#embeddings) into a local temp file, then
    copied to ``out``. Timestamps are off: the same vectors give the same bytes."""
    sink = storage.HashingWriter(out)
    with tempfile.TemporaryDirectory(prefix="elmo-shard-") as tmp:
        local = os.path.join(tmp, "shard.hdf5")
        if layout == "packed":
            vectors = np.ascontiguousarray(shard.vectors)
            address = _packed_skeleton(shard, vectors, local)
            data = memoryview(vectors.reshape(-1)).cast("B")
            with open(local, "rb") as skeleton:
                sink.write(skeleton.read(address))
                for start in range(0, len(data), WRITE_CHUNK):
                    sink.write(data[start : start + WRITE_CHUNK])
                skeleton.seek(address + len(data))
                sink.write(skeleton.read())
        else:
            with h5py.File(local, "w", track_order=False) as file:
                for i in range(shard.num_lines):
                    file.create_dataset(str(shard.first_line + i), data=shard.value(i), track_times=False)
                _write_record_keys(file, shard)
            with open(local, "rb") as written:
                while chunk := written.read(WRITE_CHUNK):
                    sink.write(chunk)
    return sink.hexdigest()


def _packed_skeleton(shard: ShardVectors, vectors: np.ndarray, path: str) -> int:
    """Write the packed file without its vectors at ``path``; the vectors' address in it."""
    with h5py.File(path, "w", track_order=False) as out:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.CONTIGUOUS)
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)  # the room exists, at a known address, now
        dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)  # and HDF5 never writes into it
        room = out.create_dataset("vectors", vectors.shape, vectors.dtype, dcpl=dcpl, track_times=False)
        # no room for no vectors (an address HDF5 leaves undefined): nothing goes between the parts
        address = room.id.get_offset() if vectors.nbytes else 0
        out.create_dataset("offsets", data=np.asarray(shard.offsets, dtype=np.int64), track_times=False)
        out.create_dataset("lines", data=shard.line_numbers, track_times=False)
        _write_record_keys(out, shard)
        out.attrs["layout"] = "packed"
        out.attrs["pooled"] = shard.pooled
    return address


def _write_record_keys(out: h5py.File, shard: ShardVectors) -> None:
    if shard.records is None:
        return
    strings = h5py.string_dtype(encoding="utf-8")
    out.create_dataset(
        "record_ids", data=np.asarray(shard.records.ids, dtype=object), dtype=strings, track_times=False
    )
    out.create_dataset(
        "record_sentences", data=np.asarray(shard.records.sentence, dtype=np.int32), track_times=False
    )


def read_record_keys(data: bytes, where: str, lines: int) -> RecordKeys | None:
    """A shard's record keys (None for a shard of text), checked: stored in the file itself,
    strings and integers, one per each of its ``lines`` sentences."""
    with _open(data, where) as shard:
        present = [name for name in RECORD_DATASETS if name in shard]
        if not present:
            return None
        if len(present) < len(RECORD_DATASETS):
            raise EmbedError(
                f"{where}: has {present[0]} without {set(RECORD_DATASETS).difference(present).pop()}"
            )
        for name in RECORD_DATASETS:
            require_stored_here(shard, name, where, EmbedError)
        ids, sentence = shard["record_ids"], shard["record_sentences"]
        if (
            not isinstance(ids, h5py.Dataset)
            or not isinstance(sentence, h5py.Dataset)
            or h5py.check_string_dtype(ids.dtype) is None
            or sentence.dtype.kind != "i"
            or ids.shape != (lines,)
            or sentence.shape != (lines,)
        ):
            raise EmbedError(
                f"{where}: record_ids and record_sentences are not {lines:,} strings and integers"
            )
        return RecordKeys([s.decode("utf-8") for s in ids[()]], sentence[()].astype(np.int32))


def _open(data: bytes, where: str) -> h5py.File:
    try:
        return h5py.File(io.BytesIO(data), "r")
    except OSError as err:
        raise EmbedError(f"{where}: not a readable HDF5 file ({str(err).splitlines()[0]})") from None


def iter_shard(path: str) -> Iterator[tuple[int, np.ndarray]]:
    """``(line, value)`` pairs of one shard (local or s3://), in line order."""
    try:
        data = storage.read_bytes(path)
    except storage.StorageError as err:
        raise EmbedError(str(err)) from None
    yield from iter_hdf5(data, path)


def iter_hdf5(data: bytes, where: str, rows: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """``(line, value)`` pairs of a shard's bytes (either layout), in line order, in AllenNLP's
    shapes; every dataset checked before it is read (stored in the file itself, floats, no more
    bytes than the file holds: a tiny file cannot make a reader allocate gigabytes). ``rows``: the
    vectors the manifest counts (tokens; sentences when pooled), which the packed layout's must
    equal before any is read."""
    with _open(data, where) as shard:
        if shard.attrs.get("layout") == "packed":
            yield from _iter_packed(shard, where, rows)
            return
        yield from iter_line_datasets(shard, where)


def iter_line_datasets(handle: h5py.File, where: str) -> Iterator[tuple[int, np.ndarray]]:
    """The AllenNLP layout's ``(line, value)`` pairs of an open file (a shard or a single file), in
    line order, one dataset read at a time, each checked first (``checked_dataset``)."""
    try:
        keys = sorted(int(k) for k in handle.keys() if k != SENTENCE_TO_INDEX and k not in RECORD_DATASETS)
    except ValueError:
        raise EmbedError(f"{where}: holds a dataset that is not named by a line number") from None
    for key in keys:
        yield key, checked_dataset(handle, str(key), where)[()]


def checked_dataset(shard: h5py.File, key: str, where: str) -> h5py.Dataset:
    """Dataset ``key``, stored in the file itself (no link, external storage or virtual dataset
    takes values from elsewhere), holding numbers, and no larger than the file: the stage writes
    every dataset uncompressed, so a shape that claims more bytes than the file has (a 1,400-byte
    file whose dataset claims (3, 2,000,000, 1024)) is refused before a read allocates it."""
    require_stored_here(shard, key, where, EmbedError)
    dataset = shard.get(key)
    if not isinstance(dataset, h5py.Dataset) or dataset.dtype.kind not in "fi":
        raise EmbedError(f"{where}: '{key}' is not a dataset of numbers")
    held = shard.id.get_filesize()
    if dataset.nbytes > held:
        raise EmbedError(
            f"{where}: '{key}' claims shape {dataset.shape} ({dataset.nbytes:,} bytes), more than the file's "
            f"{held:,} bytes: damaged"
        )
    return dataset


def _iter_packed(shard: h5py.File, path: str, rows: int | None) -> Iterator[tuple[int, np.ndarray]]:
    """A packed shard's sentences in the AllenNLP shapes, its datasets checked before use."""
    if not all(isinstance(shard.get(name, getlink=True), h5py.HardLink) for name in PACKED):
        raise EmbedError(f"{path}: a packed shard needs the datasets {', '.join(PACKED)} in the file itself")
    vectors, offsets, lines = (checked_dataset(shard, name, path) for name in PACKED)
    offsets, lines = offsets[()], lines[()]
    if (
        offsets.dtype.kind != "i"
        or lines.dtype.kind != "i"
        or offsets.shape != (lines.shape[0] + 1,)
        or offsets[0] != 0
        or np.any(np.diff(offsets) < 0)
        or offsets[-1] != vectors.shape[0]
        or vectors.ndim not in (2, 3)
    ):
        raise EmbedError(f"{path}: packed datasets do not agree (offsets, lines and vectors' shapes)")
    if rows is not None and vectors.shape[0] != rows:
        raise EmbedError(f"{path}: holds {vectors.shape[0]:,} vectors, its manifest counts {rows:,}")
    pooled = bool(shard.attrs.get("pooled", False))
    for i, line in enumerate(lines.tolist()):
        yield line, line_value(vectors, offsets, i, pooled)


def write_sentence_to_index(out: h5py.File, sentence_to_index: Mapping[str, str]) -> None:
    """AllenNLP's index: dataset of shape (1,), one variable-length UTF-8 string holding
    ``json.dumps({sentence text: key string})``."""
    dataset = out.create_dataset(
        SENTENCE_TO_INDEX, (1,), dtype=h5py.string_dtype(encoding="utf-8"), track_times=False
    )
    dataset[0] = json.dumps(sentence_to_index)
