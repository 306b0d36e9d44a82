"""The Kneser-Ney pass's scratch files: n-gram tables on storage between its steps.

The pass (pipeline/shard/baseline.py) keeps nothing large in Ray's object store: each group of
training shards writes its counts as one sorted run per partition, each partition merges its runs
and writes its adjusted counts, and the scoring step reads those back. They live in
:data:`SCRATCH_FOLDER` under the shard output (any task of the cluster can read them, local or
``s3://``) and are deleted as soon as the pass no longer needs them; a run that stopped halfway
leaves them for the next run of the same output to delete.

A file is ``MAGIC``, a little-endian uint32 length and a JSON header, then each table's rows and
counts, raw little-endian: rows as one packed uint64 key each where the order's words fit 64 bits
(``bits`` per word, the first column most significant), else as uint32 columns; counts as uint32
where they fit, else int64. The header is checked against the file's size before anything is read.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

import numpy as np

from pipeline.formats.kneser_ney import Table, pack_rows, unpack_rows, word_bits
from pipeline.output_folder import remove_empty_dirs
from pipeline.runtime import storage
from pipeline.shard.errors import ShardError

SCRATCH_FOLDER = "kneser_ney"
MAGIC = b"ELMO-NGRAM-TABLES-1\n"
SCRATCH_PATTERN = rf"{SCRATCH_FOLDER}/(counts-g\d{{6}}-p\d{{4}}|adjusted-p\d{{4}})\.tables"
"""The scratch files' names, relative to the shard output (the stage's own files)."""


def counts_name(group: int, part: int) -> str:
    """A group's sorted run of partition ``part``."""
    return f"{SCRATCH_FOLDER}/counts-g{group:06d}-p{part:04d}.tables"


def adjusted_name(part: int) -> str:
    """Partition ``part``'s adjusted counts."""
    return f"{SCRATCH_FOLDER}/adjusted-p{part:04d}.tables"


def write_tables(path: str, tables: Sequence[Table], tokens: int = 0) -> int:
    """Write ``tables`` (and a token count the reader gets back) to ``path``: the bytes written."""
    pieces: list[np.ndarray] = []
    described = []
    for cols, counts in tables:
        n, m = cols.shape
        bits = word_bits(cols)
        packed = n * bits <= 64
        wide = bool(m) and int(counts.max()) >= 2**32
        pieces.append(pack_rows(cols, bits).astype("<u8") if packed else cols.astype("<u4"))
        pieces.append(counts.astype("<i8" if wide else "<u4"))
        described.append({"columns": n, "rows": m, "bits": bits if packed else 0, "wide": wide})
    header = json.dumps({"tables": described, "tokens": int(tokens)}).encode()
    with storage.open_write(path) as out:
        out.write(MAGIC + struct.pack("<I", len(header)) + header)
        for piece in pieces:
            out.write(memoryview(np.ascontiguousarray(piece)).cast("B"))
    return len(MAGIC) + 4 + len(header) + sum(p.nbytes for p in pieces)


def _bad(path: str, why: str) -> ShardError:
    return ShardError(f"{path} is not a Kneser-Ney scratch file ({why}); delete the output and rerun")


def _header(path: str, data: memoryview) -> tuple[list[dict], int, int]:
    """``(tables, tokens, offset of the first table)``, checked against the file's size."""
    start = len(MAGIC) + 4
    if bytes(data[: len(MAGIC)]) != MAGIC or len(data) < start:
        raise _bad(path, "no header")
    (length,) = struct.unpack("<I", data[len(MAGIC) : start])
    try:
        header = json.loads(bytes(data[start : start + length]))
        tables, tokens = header["tables"], int(header["tokens"])
        need = start + length
        for t in tables:
            n, m, bits = int(t["columns"]), int(t["rows"]), int(t["bits"])
            if not (1 <= n and m >= 0 and 0 <= bits and n * bits <= 64):
                raise ValueError(t)
            need += m * (8 if bits else 4 * n) + m * (8 if t["wide"] else 4)
    except (ValueError, KeyError, TypeError) as err:
        raise _bad(path, f"its header: {err}") from None
    if need != len(data):
        raise _bad(path, f"{len(data)} bytes where its header says {need}")
    return tables, tokens, start + length


def read_tables(path: str) -> tuple[list[Table], int]:
    """The tables and token count :func:`write_tables` wrote to ``path``."""
    try:
        data = memoryview(storage.read_bytes(path))
    except storage.StorageError as err:
        raise ShardError(f"cannot read the Kneser-Ney pass's scratch file {err}") from None
    described, tokens, at = _header(path, data)
    tables: list[Table] = []
    for t in described:
        n, m, bits = t["columns"], t["rows"], t["bits"]
        if bits:
            cols = unpack_rows(np.frombuffer(data, "<u8", m, at), n, bits)
            at += 8 * m
        else:
            cols = np.frombuffer(data, "<u4", n * m, at).reshape(n, m).astype(np.uint32)
            at += 4 * n * m
        width = 8 if t["wide"] else 4
        counts = np.frombuffer(data, "<i8" if t["wide"] else "<u4", m, at).astype(np.int64)
        at += width * m
        tables.append((cols, counts))
    return tables, tokens


def clear(output: str) -> None:
    """Delete every scratch file under ``output`` (a run that stopped halfway left them), and the
    scratch folder itself where it is a local one."""
    folder = storage.join(output, SCRATCH_FOLDER)
    for path in storage.list_prefix(folder + "/"):
        storage.delete(path)
    if not storage.is_s3(folder):
        remove_empty_dirs([folder])
