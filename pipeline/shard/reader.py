"""Streaming input: files (local or ``s3://``, plain, gzip or zstd) -> chunks of whole lines.

The driver reads sequentially and cuts the byte stream into chunks of about ``chunk_bytes`` that
end at a newline; the Ray tasks do everything per line. Memory stays bounded by the chunk size
whatever the corpus size, and because every per-line decision depends on the line alone, where
the chunks are cut does not change the output.

Record corpora (:mod:`pipeline.formats.records`) are chunked the same way: a JSON Lines file as
whole lines (a record each, up to ``max_record_bytes``), a Parquet file as runs of its row groups of
about ``chunk_bytes``, which the driver only names (from the footer): the task reads its row groups
itself, so the driver's work is O(files + row groups), not O(corpus). The task turns a chunk's records into sentence-per-line text
(:func:`chunk_text`), split into sentences by :mod:`pipeline.formats.sentence_split` or not.

A line longer than ``max_line_bytes`` is dropped here already when it would otherwise have to be
held in memory whole (no newline within the limit): the reader skips to the next newline and
reports it in :attr:`Chunk.overlong`, so a corrupt multi-GB "line" cannot exhaust the driver.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from pipeline.formats import records as record_files
from pipeline.formats.compression import HEAD_BYTES, compression_of
from pipeline.formats.records import RecordFields
from pipeline.formats.sentence_split import document_lines
from pipeline.formats.shard_format import FormatError
from pipeline.runtime import storage
from pipeline.shard.errors import ShardError


@dataclass(frozen=True)
class Chunk:
    """Whole lines of one input file.

    ``index``: position among all chunks of the run (inputs in order); ``source``: index of the
    input file; ``data``: lines, each ending in ``\\n`` except perhaps the file's last one;
    ``overlong``: lines the reader dropped before this chunk for exceeding ``max_line_bytes``
    (``max_record_bytes`` for JSON Lines). ``kind``: the file's (``text``, ``jsonl``, ``parquet``);
    ``first_record``: the file's number of the chunk's first line (JSON Lines) or row (Parquet);
    a Parquet chunk holds no data but names its ``path`` and ``row_groups`` (consecutive, about
    ``chunk_bytes`` uncompressed together).
    """

    index: int
    source: int
    data: bytes
    overlong: int = 0
    kind: str = "text"
    first_record: int = 0
    path: str = ""
    row_groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class Reading:
    """How the input files are read (one for the run; the driver and the tasks both read it)."""

    chunk_bytes: int = 4 * 1024 * 1024
    max_line_bytes: int = 0
    """Text lines longer than this are dropped and counted (0: no limit)."""
    max_record_bytes: int = 16 * 1024 * 1024
    """Documents (JSON Lines records, text lines to split) longer than this are dropped and counted (0: no limit)."""
    input_format: str = "auto"
    """``auto`` (each file's kind from its content) or one of :data:`pipeline.formats.records.KINDS`."""
    fields: RecordFields = field(default_factory=RecordFields)
    split_sentences: bool | None = None
    """Split documents into sentences; None: for records (JSON Lines, Parquet), not for text."""

    def kind_of(self, path: str) -> str:
        if self.input_format != "auto":
            return self.input_format
        try:
            return record_files.input_kind(path)
        except storage.StorageError as err:
            raise ShardError(f"cannot read input: {err}") from None

    def splits(self, kind: str) -> bool:
        return kind != "text" if self.split_sentences is None else self.split_sentences


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
    if kind is None and path.endswith((".gz", ".zst")):
        raw.close()
        raise ShardError(
            f"input {path}: named {path[path.rfind('.') :]} but is not {'gzip' if path.endswith('.gz') else 'zstd'} data"
        )
    try:
        return record_files.decompressed(raw, kind, path)
    except FormatError as err:
        raw.close()
        raise ShardError(str(err)) from None


def file_chunks(
    stream: BinaryIO, path: str, chunk_bytes: int, max_line_bytes: int
) -> Iterator[tuple[bytes, int]]:
    """``record_files.line_blocks`` of one stream, a read error as ShardError; see :class:`Chunk`."""
    try:
        yield from record_files.line_blocks(stream, path, chunk_bytes, max_line_bytes)
    except FormatError as err:
        raise ShardError(str(err)) from None


def iter_chunks(
    paths: Sequence[str], reading: Reading, first_index: int = 0, first_source: int = 0
) -> Iterator[Chunk]:
    """Chunks of all ``paths`` in order, numbered from ``first_index``; ``paths[0]`` is input
    number ``first_source`` (reading the inputs from the middle of the list)."""
    index = first_index
    for source, path in enumerate(paths, first_source):
        kind = reading.kind_of(path)
        if kind == "parquet":
            try:
                runs = list(record_files.iter_parquet_chunks(path, reading.fields, reading.chunk_bytes))
            except storage.StorageError as err:
                raise ShardError(f"cannot read input: {err}") from None
            for groups, first_row in runs:
                yield Chunk(
                    index, source, b"", kind=kind, first_record=first_row, path=path, row_groups=tuple(groups)
                )
                index += 1
            continue
        # a document (a record, or a text line to split) may be longer than a sentence
        limit = (
            reading.max_record_bytes if reading.splits(kind) or kind == "jsonl" else reading.max_line_bytes
        )
        line = 0
        with open_input(path) as stream:
            for data, overlong in file_chunks(stream, path, reading.chunk_bytes, limit):
                yield Chunk(index, source, data, overlong, kind=kind, first_record=line + overlong)
                line += overlong + data.count(b"\n")
                index += 1


@dataclass(frozen=True)
class ChunkText:
    """A chunk as the sentence-per-line text that is tokenized: ``data`` (UTF-8 lines), and for
    a chunk of documents (records, or text lines split into sentences) ``documents`` (how many)
    and ``records_skipped`` (records without a string text field, lines that are no JSON object)."""

    data: bytes
    documents: int = 0
    records_skipped: int = 0
    first_skipped: int = -1
    """The file's number of the first skipped record (-1: none)."""
    overlong: int = 0
    """Records over ``max_record_bytes`` that the reader passed on (it drops only those it would hold whole)."""


def chunk_text(chunk: Chunk, reading: Reading) -> ChunkText:
    """What the tasks tokenize of a chunk (its data as it is, for sentence-per-line text)."""
    split = reading.splits(chunk.kind)
    if chunk.kind == "text" and not split:
        return ChunkText(chunk.data)
    if chunk.kind == "parquet":
        found = record_files.parquet_records(chunk.path, chunk.row_groups, chunk.first_record, reading.fields)
    elif chunk.kind == "jsonl":
        found = record_files.jsonl_records(
            chunk.data, reading.fields, chunk.first_record, reading.max_record_bytes
        )
    else:  # a text line is a document (invalid UTF-8 replaced here, so not counted as such)
        lines = chunk.data.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        limit = reading.max_record_bytes or len(chunk.data) + 1
        kept = [line for line in lines if len(line) <= limit]
        found = record_files.Records(texts=[line.decode("utf-8", errors="replace") for line in kept])
        found.overlong = len(lines) - len(kept)
    lines, _ = document_lines(found.texts, split)
    return ChunkText(
        lines.encode("utf-8"), len(found.texts), found.skipped, found.first_skipped, found.overlong
    )
