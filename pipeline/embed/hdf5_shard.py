"""The HDF5 layout of AllenNLP's ``elmo`` command (docs/outputs.md#embeddings), for shards and the single file.

One dataset per sentence, named by the sentence's 0-based input line number (``"0"``, ``"1"``, ...),
holding (N+1, n, 2P) for ``all`` or (n, 2P) for ``top``/``average``. Nothing else is in a shard;
the single file adds AllenNLP's ``sentence_to_index``. Timestamps are off, so the same vectors
always give the same bytes (a rerun reproduces a shard's sha256).
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


def encode_shard(first_line: int, values: Sequence[np.ndarray], dtype: str) -> bytes:
    """The bytes of an HDF5 shard holding ``values`` for lines ``first_line ..``."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w", track_order=False) as out:
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
        keys = sorted(int(k) for k in shard.keys() if k != SENTENCE_TO_INDEX)
        for key in keys:
            yield key, shard[str(key)][()]


def write_sentence_to_index(out: h5py.File, sentence_to_index: Mapping[str, str]) -> None:
    """AllenNLP's index: dataset of shape (1,), one variable-length UTF-8 string holding
    ``json.dumps({sentence text: key string})``."""
    dataset = out.create_dataset(
        SENTENCE_TO_INDEX, (1,), dtype=h5py.string_dtype(encoding="utf-8"), track_times=False
    )
    dataset[0] = json.dumps(sentence_to_index)
