"""Streaming input: files (local or ``s3://``, plain or gzip) -> chunks of whole lines.

The driver reads sequentially and cuts the byte stream into chunks of about ``chunk_bytes`` that
end at a newline; the Ray tasks do everything per line. Memory stays bounded by the chunk size
whatever the corpus size, and because every per-line decision depends on the line alone, where
the chunks are cut does not change the output.

A line longer than ``max_line_bytes`` is dropped here already when it would otherwise have to be
held in memory whole (no newline within the limit): the reader skips to the next newline and
reports it in :attr:`Chunk.overlong`, so a corrupt multi-GB "line" cannot exhaust the driver.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from pipeline.formats.compression import HEAD_BYTES, compression_of
from pipeline.runtime import storage
from pipeline.shard.errors import ShardError


@dataclass(frozen=True)
class Chunk:
    """Whole lines of one input file.

    ``index``: position among all chunks of the run (inputs in order); ``source``: index of the
    input file; ``data``: lines, each ending in ``\\n`` except perhaps the file's last one;
    ``overlong``: lines the reader dropped before this chunk for exceeding ``max_line_bytes``.
    """

    index: int
    source: int
    data: bytes
    overlong: int = 0


def resolve_inputs(patterns: Sequence[str], role: str) -> list[str]:
    """Expand paths and globs (local or s3) in order, without duplicates; ShardError if none match."""
    paths: list[str] = []
    for pattern in patterns:
        try:
            found = storage.expand(pattern)
        except storage.StorageError as err:
            raise ShardError(f"{role} {err}") from None
        paths.extend(p for p in found if p not in paths)
    return paths


def open_input(path: str) -> BinaryIO:
    """A binary stream of the file's text, gunzipped when it starts with the gzip magic bytes;
    other compressed data (known by its first bytes) is refused."""
    try:
        raw = storage.open_read(path)
        head = raw.read(HEAD_BYTES)
        raw.seek(0)
    except storage.StorageError as err:
        raise ShardError(f"cannot read input: {err}") from None
    except OSError as err:
        raise ShardError(f"cannot read input {path}: {err}") from None
    kind = compression_of(head)
    if kind == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if kind is not None:
        raw.close()
        raise ShardError(f"input {path}: {kind}-compressed data; decompress it, or compress it with gzip")
    if path.endswith(".gz"):
        raw.close()
        raise ShardError(f"input {path}: named .gz but is not gzip data")
    return raw


def _read(stream: BinaryIO, size: int, path: str) -> bytes:
    try:
        return stream.read(size)
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise ShardError(f"cannot read input {path}: {err}") from None


def file_chunks(
    stream: BinaryIO, path: str, chunk_bytes: int, max_line_bytes: int
) -> Iterator[tuple[bytes, int]]:
    """``(lines, overlong_dropped)`` pairs for one stream, about ``chunk_bytes`` each; see :class:`Chunk`."""
    carry = b""  # the unfinished last line of what was read so far
    overlong = 0
    skipping = False  # inside an overlong line: discard up to its newline
    while block := _read(stream, chunk_bytes, path):
        if skipping:
            newline = block.find(b"\n")
            if newline < 0:
                continue
            skipping = False
            block = block[newline + 1 :]
        buf = carry + block
        cut = buf.rfind(b"\n") + 1
        complete, carry = buf[:cut], buf[cut:]
        if max_line_bytes and len(carry) > max_line_bytes:
            carry = b""
            overlong += 1
            skipping = True
        if complete:
            yield complete, overlong
            overlong = 0
    if carry or overlong:
        yield carry, overlong


def iter_chunks(
    paths: Sequence[str], chunk_bytes: int, max_line_bytes: int, first_index: int = 0, first_source: int = 0
) -> Iterator[Chunk]:
    """Chunks of all ``paths`` in order, numbered from ``first_index``; ``paths[0]`` is input
    number ``first_source`` (reading the inputs from the middle of the list)."""
    index = first_index
    for source, path in enumerate(paths, first_source):
        with open_input(path) as stream:
            for data, overlong in file_chunks(stream, path, chunk_bytes, max_line_bytes):
                yield Chunk(index=index, source=source, data=data, overlong=overlong)
                index += 1
