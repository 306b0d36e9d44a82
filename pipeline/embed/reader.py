"""Reading any output of ``elmo embed`` back: one function for every layout and format.

    from pipeline.embed import read_embeddings

    for line, vectors in read_embeddings("work/emb"):   # a folder, an s3:// prefix or one .hdf5 file
        ...   # vectors: (tokens, 2P), (N+1, tokens, 2P) for layers=all; pooled (2P,) or (N+1, 2P)

    # an output of records (Parquet, JSON Lines): each sentence's record id and index in the record too
    for line, record, sentence, vectors in read_embeddings("work/emb-docs", records=True):
        ...
    # one pooled per record (pool=mean pool_over=record): a vector per record
    for record, vector in read_record_vectors("work/doc-vectors"):
        ...

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
import tempfile
from collections.abc import Iterator

import h5py
import numpy as np

from pipeline.embed import manifest
from pipeline.embed.config import is_single_file
from pipeline.embed.errors import EmbedError
from pipeline.embed.file_format import EmbeddingFormat, format_named
from pipeline.embed.hdf5_shard import iter_line_datasets
from pipeline.embed.shard_vectors import RecordKeys
from pipeline.runtime import storage


def read_embeddings(output: str, records: bool = False) -> Iterator[tuple]:
    """``(line, vectors)`` of every line ``output`` holds, in line order (memory: one shard);
    ``records``: ``(line, record id, sentence index in the record, vectors)``, for an output of a
    record corpus (EmbedError for one of text)."""
    if is_single_file(output):
        if records:
            raise EmbedError(f"{output}: a single-file output holds no record ids (its input was text)")
        yield from _single_file(output)
        return
    document = _manifest(output)
    if document.get("pool_over") == "record":
        raise EmbedError(
            f"{output}: holds a vector per record (pool_over=record): read it with read_record_vectors"
        )
    pooled = document.get("pool") == "mean"
    fmt = format_named(document["file_format"])
    for entry in _entries(output, document):
        yield from _shard(output, entry, pooled, fmt, records)


def read_record_vectors(output: str) -> Iterator[tuple[str, np.ndarray]]:
    """``(record id, vector)`` of every record of an output pooled per record (``pool=mean
    pool_over=record``), in input order (memory: one shard): the mean of the record's sentences'
    token vectors, ([L,] 2P)."""
    document = _manifest(output)
    if document.get("pool_over") != "record":
        raise EmbedError(
            f"{output}: holds no vector per record (pool_over=record): read it with read_embeddings"
        )
    fmt = format_named(document["file_format"])
    for entry in _entries(output, document):
        if type(entry.get("rows")) is not int or entry["rows"] < 0:
            raise EmbedError(
                f"{manifest.manifest_path(output)}: shard entry {entry['index']} does not count its rows"
            )
        data, path = _shard_bytes(output, entry, fmt)
        keys = _record_keys(output, fmt, data, path, entry["rows"])
        previous = int(entry["first_line"]) - 1
        for i, (line, value) in enumerate(fmt.read(data, path, True, entry["rows"])):
            if not previous < line < int(entry["end_line"]):  # each record's first line, in order
                raise EmbedError(f"{path}: record {keys.ids[i]!r} is out of place (line {line})")
            previous = line
            yield keys.ids[i], value


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
    if manifest.schema_of(document) is None:
        raise EmbedError(f"{path}: not an elmo embed manifest ({manifest.SCHEMA} or {manifest.FIRST_SCHEMA})")
    return manifest.current(document)


CHECKED = ("sentences", "tokens", "bytes")
"""Counts every entry has had since the first schema; checked against the shard and the totals."""
REQUIRED = {
    "name": str,
    "index": int,
    "first_line": int,
    "end_line": int,
    "sha256": str,
    **dict.fromkeys(CHECKED, int),
}


def _entries(output: str, document: dict) -> list[dict]:
    """The manifest's shard entries, checked as a whole before any shard is read: well formed,
    indices 0, 1, ... covering the input's lines once each in order (a shard listed twice or left
    out is refused, not read twice or silently missing), and adding up to the manifest's totals."""
    path = manifest.manifest_path(output)
    entries, totals = document.get("shards"), document.get("totals")
    if not isinstance(entries, list) or not isinstance(totals, dict):
        raise EmbedError(f"{path}: not an elmo embed manifest (no list of shards and their totals)")
    end = 0
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not all(
            type(entry.get(k)) is kind and (kind is str or entry[k] >= 0) for k, kind in REQUIRED.items()
        ):
            raise EmbedError(
                f"{path}: shard entry {i} is malformed (it needs {', '.join(REQUIRED)}; counts are whole numbers)"
            )
        if entry["index"] != i or entry["first_line"] != end or entry["end_line"] < end:
            raise EmbedError(
                f"{path}: shard entry {i} ({entry['name']}) is out of place: the entries must cover lines 0 "
                f"to the end once each, in order (it holds lines {entry['first_line']}-{entry['end_line'] - 1}, "
                f"line {end} comes next)"
            )
        if entry["sentences"] != entry["end_line"] - end:
            raise EmbedError(
                f"{path}: shard entry {i} ({entry['name']}) counts sentences other than its lines"
            )
        end = entry["end_line"]
    if totals.get("shards") != len(entries) or any(
        totals.get(key) != sum(e[key] for e in entries) for key in CHECKED
    ):
        raise EmbedError(
            f"{path}: its {len(entries)} shard entries do not add up to its totals (a shard listed twice or "
            "left out)"
        )
    return entries


def _shard(output: str, entry: dict, pooled: bool, fmt: EmbeddingFormat, records: bool) -> Iterator[tuple]:
    data, path = _shard_bytes(output, entry, fmt)
    rows_expected = entry["end_line"] - entry["first_line"] if pooled else entry["tokens"]
    rows = fmt.read(data, path, pooled, rows_expected)
    expected = int(entry["first_line"])
    lines = int(entry["end_line"]) - expected
    keys = _record_keys(output, fmt, data, path, lines) if records else None
    for line, value in rows:
        if line != expected:
            raise EmbedError(f"{path}: expected line {expected}, found {line}")
        if keys is None:
            yield line, value
        else:
            i = line - int(entry["first_line"])
            yield line, keys.ids[i], int(keys.sentence[i]), value
        expected += 1
    if expected != int(entry["end_line"]):
        raise EmbedError(
            f"{path}: holds lines up to {expected - 1}, its manifest says {int(entry['end_line']) - 1}"
        )


def _shard_bytes(output: str, entry: dict, fmt: EmbeddingFormat) -> tuple[bytes, str]:
    """A shard's bytes and path, checked against its entry: its name, size and sha256."""
    name = entry["name"]
    if name != fmt.file_name(entry["index"]):  # a shard of this output, nothing outside it
        raise EmbedError(
            f"{manifest.manifest_path(output)}: {name!r} is not the name of its shard {entry['index']} "
            f"in this output's format ({fmt.name})"
        )
    path = storage.join(output, name)
    try:
        size = storage.size(path)  # before reading: a regular file of the manifest's size
        if size != entry["bytes"]:
            raise EmbedError(
                f"{path} is damaged or was replaced: {size:,} bytes, its manifest says {entry['bytes']:,}"
            )
        data = storage.read_bytes(path)
    except storage.StorageError as err:
        raise EmbedError(str(err)) from None
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise EmbedError(f"{path} is damaged or was replaced: its sha256 is not the manifest's")
    return data, path


def _record_keys(output: str, fmt: EmbeddingFormat, data: bytes, path: str, rows: int) -> RecordKeys:
    keys = fmt.read_record_keys(data, path, rows)
    if keys is None:
        raise EmbedError(f"{output}: holds no record ids (its input was text): read it without records=True")
    return keys


def _single_file(output: str) -> Iterator[tuple[int, np.ndarray]]:
    with tempfile.TemporaryDirectory(prefix="elmo-read-") as tmp:
        local = output
        try:
            storage.size(output)  # a regular file (not a device or a FIFO, which h5py would read)
        except storage.StorageError as err:
            raise EmbedError(str(err)) from None
        if storage.is_s3(output):
            local = os.path.join(tmp, "embeddings.hdf5")
            storage.download_file(output, local)
        try:
            handle = h5py.File(local, "r")
        except OSError as err:
            raise EmbedError(f"{output}: not a readable HDF5 file ({str(err).splitlines()[0]})") from None
        with handle:
            yield from iter_line_datasets(handle, output)
