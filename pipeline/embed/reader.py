"""Reading any output of ``elmo embed`` back: one function for every layout and format.

    from pipeline.embed import read_embeddings

    for line, vectors in read_embeddings("work/emb"):   # a folder, an s3:// prefix or one .hdf5 file
        ...   # vectors: (tokens, 2P), (N+1, tokens, 2P) for layers=all; pooled (2P,) or (N+1, 2P)

A sharded output (HDF5 in AllenNLP's or the packed layout, or Parquet) is read through its
``manifest.json`` (written last: an output without one is not finished), a shard at a time, each
shard's bytes checked against the manifest's sha256 before they are parsed, its line numbers against
its range. A single AllenNLP-style file (``--output file.hdf5``) has no manifest: its datasets are
read one at a time, each checked to be stored in the file itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator

import h5py
import numpy as np

from pipeline import storage
from pipeline.embed import manifest, parquet_shard
from pipeline.embed.config import is_single_file
from pipeline.embed.errors import EmbedError
from pipeline.embed.hdf5_shard import iter_hdf5, iter_line_datasets

SHARD_NAME = re.compile(rf"embeddings-\d{{6,}}\.({'|'.join(manifest.FILE_FORMATS)})")


def read_embeddings(output: str) -> Iterator[tuple[int, np.ndarray]]:
    """``(line, vectors)`` of every line ``output`` holds, in line order (memory: one shard)."""
    if is_single_file(output):
        yield from _single_file(output)
        return
    document = _manifest(output)
    pooled = document.get("pool") == "mean"
    for entry in document["shards"]:
        yield from _shard(output, entry, pooled)


def _manifest(output: str) -> dict:
    path = manifest.manifest_path(output)
    try:
        data = storage.read_bytes(path)
    except storage.StorageError as err:
        raise EmbedError(
            f"{output}: no readable {manifest.MANIFEST_FILE} ({err}): not an elmo embed output, or one "
            "still being written (rerun its command to finish it)"
        ) from None
    try:
        document = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        document = None
    if not isinstance(document, dict) or document.get("format") != manifest.FORMAT:
        raise EmbedError(f"{path}: not an elmo embed manifest ({manifest.FORMAT})")
    return document


def _shard(output: str, entry: dict, pooled: bool) -> Iterator[tuple[int, np.ndarray]]:
    name = entry.get("name", "")
    if not SHARD_NAME.fullmatch(str(name)):  # a shard of this output, nothing outside it
        raise EmbedError(f"{manifest.manifest_path(output)}: {name!r} is not a shard name of this output")
    path = storage.join(output, name)
    try:
        data = storage.read_bytes(path)
    except storage.StorageError as err:
        raise EmbedError(str(err)) from None
    if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise EmbedError(f"{path} is damaged or was replaced: its sha256 is not the manifest's")
    rows = (
        parquet_shard.iter_shard(data, path, pooled) if name.endswith(".parquet") else iter_hdf5(data, path)
    )
    expected = int(entry["first_line"])
    for line, value in rows:
        if line != expected:
            raise EmbedError(f"{path}: expected line {expected}, found {line}")
        yield line, value
        expected += 1
    if expected != int(entry["end_line"]):
        raise EmbedError(
            f"{path}: holds lines up to {expected - 1}, its manifest says {int(entry['end_line']) - 1}"
        )


def _single_file(output: str) -> Iterator[tuple[int, np.ndarray]]:
    with tempfile.TemporaryDirectory(prefix="elmo-read-") as tmp:
        local = output
        if storage.is_s3(output):
            local = os.path.join(tmp, "embeddings.hdf5")
            storage.download_file(output, local)
        try:
            handle = h5py.File(local, "r")
        except OSError as err:
            raise EmbedError(f"{output}: not a readable HDF5 file ({str(err).splitlines()[0]})") from None
        with handle:
            yield from iter_line_datasets(handle, output)
