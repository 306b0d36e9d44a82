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

Timestamps are off, so the same vectors always give the same bytes (a rerun reproduces a shard's
sha256).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping, Sequence

import h5py
import numpy as np

from pipeline import storage
from pipeline.embed.errors import EmbedError

SENTENCE_TO_INDEX = "sentence_to_index"


def write_datasets(out: h5py.File, first_line: int, values: Sequence[np.ndarray], dtype: str) -> None:
    """Add one dataset per value, keys ``str(first_line + i)``, cast to ``dtype``."""
    for offset, value in enumerate(values):
        out.create_dataset(str(first_line + offset), data=value.astype(dtype, copy=False), track_times=False)


LAYOUTS = ("allennlp", "packed")
PACKED = ("vectors", "offsets", "lines")


def write_packed(
    out: h5py.File, first_line: int, values: Sequence[np.ndarray], dtype: str, pooled: bool
) -> None:
    """The ``packed`` datasets of ``values`` (AllenNLP-shaped, one per line from ``first_line``)."""
    if pooled:
        rows = [v[None] for v in values]
    else:  # (N+1, n, 2P) -> (n, N+1, 2P): a sentence's tokens are contiguous rows
        rows = [v.transpose(1, 0, 2) if v.ndim == 3 else v for v in values]
    sizes = np.array([r.shape[0] for r in rows], dtype=np.int64)
    out.create_dataset("vectors", data=np.concatenate(rows).astype(dtype, copy=False), track_times=False)
    out.create_dataset(
        "offsets", data=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), track_times=False
    )
    out.create_dataset(
        "lines", data=np.arange(first_line, first_line + len(rows), dtype=np.int64), track_times=False
    )
    out.attrs["layout"] = "packed"
    out.attrs["pooled"] = pooled


def encode_shard(
    first_line: int, values: Sequence[np.ndarray], dtype: str, layout: str = "allennlp", pooled: bool = False
) -> bytes:
    """The bytes of an HDF5 shard holding ``values`` (one per line, AllenNLP-shaped) for lines
    ``first_line ..`` in ``layout``; ``pooled``: the values are one vector per sentence."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w", track_order=False) as out:
        if layout == "packed":
            write_packed(out, first_line, values, dtype, pooled)
        else:
            write_datasets(out, first_line, values, dtype)
    return buffer.getvalue()


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
    with _open(data, path) as shard:
        if shard.attrs.get("layout") == "packed":
            yield from _iter_packed(shard, path)
            return
        keys = sorted(int(k) for k in shard.keys() if k != SENTENCE_TO_INDEX)
        for key in keys:
            yield key, shard[str(key)][()]


def _iter_packed(shard: h5py.File, path: str) -> Iterator[tuple[int, np.ndarray]]:
    """A packed shard's sentences in the AllenNLP shapes, its datasets checked before use."""
    if not all(isinstance(shard.get(name, getlink=True), h5py.HardLink) for name in PACKED):
        raise EmbedError(f"{path}: a packed shard needs the datasets {', '.join(PACKED)} in the file itself")
    vectors, offsets, lines = (shard[name] for name in PACKED)
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
    pooled = bool(shard.attrs.get("pooled", False))
    for i, line in enumerate(lines.tolist()):
        value = vectors[offsets[i] : offsets[i + 1]]
        if pooled:
            yield line, value[0]
        else:
            yield line, value.transpose(1, 0, 2) if value.ndim == 3 else value


def write_sentence_to_index(out: h5py.File, sentence_to_index: Mapping[str, str]) -> None:
    """AllenNLP's index: dataset of shape (1,), one variable-length UTF-8 string holding
    ``json.dumps({sentence text: key string})``."""
    dataset = out.create_dataset(
        SENTENCE_TO_INDEX, (1,), dtype=h5py.string_dtype(encoding="utf-8"), track_times=False
    )
    dataset[0] = json.dumps(sentence_to_index)
