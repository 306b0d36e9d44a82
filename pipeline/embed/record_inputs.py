"""Record corpora (Parquet, JSON Lines) as embed shards: whole records, their sentences numbered in
input order, each sentence keeping its record's id and its index in the record.

Planning is two steps, neither of which reads the corpus on the driver:

1. The driver names the input's **units** from metadata alone (:func:`units_of`): a Parquet file's
   row groups gathered into runs of about ``UNIT_BYTES`` (uncompressed, from the footer), a JSON
   Lines file's byte ranges of about ``UNIT_BYTES`` cut at a line end (a ranged read of the bytes
   around each cut), a compressed (gzip, zstd) JSON Lines file whole. O(files + units).
2. A Ray task per unit (:func:`count_unit`) reads its records, splits them into sentences and
   answers with its **pieces**: runs of whole records of at least ``lines_per_shard`` sentences (a
   unit's last may hold fewer), each with its sentence count and the sha256 of its records' ids
   and texts; O(pieces) comes back.

Each piece is one shard (``inputs.plan_records``): a shard never splits a record, so a record's
sentences are in one shard, and its sentences' line numbers follow the input's order (files in the
order given, then records, then sentences). The plan depends on the input and the settings alone:
a rerun plans the same shards and resumes them (exactly-once as for text), and a shard whose
records changed since is refused by its hash when it is read (:func:`read_records`).

A compressed JSON Lines file cannot be entered in the middle: its count task streams it whole, its
pieces are line ranges (``jsonl-stream``), and the preparing side reads its shards in order from one
stream (:class:`RecordStreams`; the embed graph hands one task all of a file's shards), so the file
is decompressed once per run, not once per shard. Records the text reader would skip (no string text field, an id that is not
a string or an integer, a line that is no JSON object, a line over ``max_record_bytes``) are
skipped and counted here too, the first one named by file and record number.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.embed.errors import EmbedError
from pipeline.embed.shard_vectors import RecordKeys
from pipeline.formats import records as record_files
from pipeline.formats.compression import HEAD_BYTES, compression_of
from pipeline.formats.records import RecordFields, Records
from pipeline.formats.sentence_split import document_sentences
from pipeline.formats.shard_format import FormatError
from pipeline.runtime import storage

UNIT_BYTES = 64 * 1024 * 1024
"""Input bytes a count task reads (a Parquet file's, uncompressed); a larger row group is a unit of
its own. It sets the planning tasks' size only: the shards are the same whatever it is."""
CUT_SEARCH_BYTES = 1024 * 1024
"""Bytes read at a time past a JSON Lines cut to find the line end that the unit ends at."""
RECORD_KINDS = ("jsonl", "parquet", "jsonl-stream")
"""A record shard's segment kinds: Parquet rows, a plain JSON Lines file's bytes of whole lines, a
compressed one's lines (read by streaming it from its start)."""
STREAM_BLOCK_BYTES = 4 * 1024 * 1024
"""Decompressed bytes of whole lines a compressed JSON Lines file is read in."""


@dataclass(frozen=True)
class RecordReading:
    """How records become sentences: which fields, whether documents are split into sentences,
    and the longest JSON Lines line read (0: no limit)."""

    fields: RecordFields = field(default_factory=RecordFields)
    split: bool = True
    max_record_bytes: int = 16 * 1024 * 1024


@dataclass(frozen=True)
class Unit:
    """Part of one record file that one count task reads: ``parquet`` rows [start, end) (whole row
    groups), ``jsonl`` bytes [start, end) (whole lines), or ``jsonl-stream`` a compressed file whole
    (start 0, end -1)."""

    kind: str
    path: str
    start: int
    end: int


@dataclass(frozen=True)
class Piece:
    """A shard-to-be: records [start, end) of its unit (rows, bytes of whole lines, or lines of a
    compressed file), the number of its first record (its row; its line, counted from the unit's
    start in a plain JSON Lines file), its sentences and the sha256 of its records."""

    start: int
    end: int
    first_record: int
    sentences: int
    sha256: str


@dataclass
class UnitCount:
    """What a count task answers: the unit's pieces, its lines (JSON Lines), and its records."""

    pieces: list[Piece]
    lines: int
    records: int
    skipped: int
    first_skipped: int
    """The unit's number (from its first line or row) of its first skipped record; -1: none."""


@dataclass
class RecordCounts:
    """What planning a record corpus counted: its records read, those skipped, and the first of those."""

    records: int = 0
    skipped: int = 0
    first_skipped: str = ""
    """``FILE record N`` of the first skipped record (N: its line or row in the file, from 0); empty: none."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class RecordPlan:
    """The shards of a record corpus (``inputs.ShardSpec``) and what the planning counted."""

    specs: list
    counts: RecordCounts = field(default_factory=RecordCounts)


def record_kind(path: str) -> str | None:
    """``parquet``, ``jsonl`` or ``jsonl-stream`` (gzip or zstd) for a record file, known by its
    content; None for text."""
    kind, compression = record_files.file_kind(path)
    if kind == "jsonl" and compression:
        return "jsonl-stream"
    return None if kind == "text" else kind


def units_of(path: str, kind: str, reading: RecordReading, unit_bytes: int = UNIT_BYTES) -> list[Unit]:
    """The units of one record file, from its footer (Parquet) or from ranged reads at each cut
    (JSON Lines); the file's columns are checked here."""
    if kind == "jsonl-stream":
        return [Unit(kind, path, 0, -1)]
    if kind == "parquet":
        layout = record_files.parquet_row_groups(path, reading.fields)
        units = []
        for run, first_row in record_files.parquet_runs(layout, unit_bytes):
            rows = sum(layout[g][0] for g in run)
            if rows:
                units.append(Unit(kind, path, first_row, first_row + rows))
        return units
    size = storage.size(path)
    cuts = [0]
    with storage.open_read(path) as stream:
        while cuts[-1] + unit_bytes < size:
            cuts.append(_line_end_after(stream, cuts[-1] + unit_bytes, size))
    if cuts[-1] < size:
        cuts.append(size)
    return [Unit(kind, path, a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def _line_end_after(stream, offset: int, size: int) -> int:
    """The offset just past the first newline at or after ``offset`` (``size`` if none)."""
    while offset < size:
        stream.seek(offset)
        window = stream.read(CUT_SEARCH_BYTES)
        newline = window.find(b"\n")
        if newline >= 0:
            return offset + newline + 1
        offset += len(window) or size
    return size


def unit_blocks(unit: Unit, reading: RecordReading) -> Iterator[tuple[Records, np.ndarray, int]]:
    """The records of ``unit``, a block at a time: ``(records, positions, lines)``. A record's
    number is its row (Parquet), its line in the unit (plain JSON Lines, from 0 at ``unit.start``) or
    in the file (a compressed one); ``positions`` int64 (kept records,) is where each begins as a
    piece boundary says it (its row, its line's first byte in the file, its line); ``lines``: the
    block's lines (JSON Lines), for the file's line numbers."""
    if unit.kind == "parquet":
        found = record_files.parquet_rows(unit.path, range(unit.start, unit.end), reading.fields)
        yield found, np.asarray(found.numbers, dtype=np.int64), 0
        return
    if unit.kind == "jsonl-stream":
        line = 0
        for block, overlong in _stream_blocks(unit.path, reading):
            found = record_files.jsonl_records(block, reading.fields, line + overlong)
            found.skipped += overlong
            lines = overlong + block.count(b"\n") + (1 if block and not block.endswith(b"\n") else 0)
            yield found, np.asarray(found.numbers, dtype=np.int64), lines
            line += lines
        return
    with storage.open_read(unit.path) as stream:
        stream.seek(unit.start)
        data = stream.read(unit.end - unit.start)
    if len(data) != unit.end - unit.start:
        raise EmbedError(f"input {unit.path}: file shrank while reading; the input changed")
    found = record_files.jsonl_records(data, reading.fields, 0, reading.max_record_bytes)
    line_starts = np.concatenate([[0], np.flatnonzero(np.frombuffer(data, np.uint8) == 10) + 1])
    lines = len(line_starts) - (1 if data.endswith(b"\n") else 0)
    yield found, unit.start + line_starts[np.asarray(found.numbers, dtype=np.int64)], lines


def _stream_blocks(path: str, reading: RecordReading) -> Iterator[tuple[bytes, int]]:
    """``record_files.line_blocks`` of a compressed JSON Lines file, decompressed as it is read."""
    raw = storage.open_read(path)
    try:
        head = raw.read(HEAD_BYTES)
        raw.seek(0)
        with record_files.decompressed(raw, compression_of(head), path) as stream:
            yield from record_files.line_blocks(stream, path, STREAM_BLOCK_BYTES, reading.max_record_bytes)
    finally:
        raw.close()


def records_digest(ids: Sequence[str], texts: Sequence[str]) -> str:
    """The sha256 of records' ids and texts, as a piece's plan and its read both compute it."""
    digest = hashlib.sha256()
    for ident, text in zip(ids or [""] * len(texts), texts, strict=True):  # once per record
        _digest_record(digest, ident, text)
    return digest.hexdigest()


def _digest_record(digest, ident: str, text: str) -> None:
    digest.update(ident.encode("utf-8", "surrogatepass") + b"\0")
    digest.update(text.encode("utf-8", "surrogatepass") + b"\0")


def count_unit(unit: Unit, reading: RecordReading, lines_per_shard: int) -> UnitCount:
    """A count task: ``unit``'s pieces (see the module docstring)."""
    # the unit's first record: its first row (Parquet), or the first line of the unit
    cutter = _Cutter(lines_per_shard, unit.start, unit.start if unit.kind == "parquet" else 0)
    lines = records = skipped = 0
    first_skipped = -1
    try:
        for found, positions, block_lines in unit_blocks(unit, reading):
            _, counts = document_sentences(found.texts, reading.split)
            ids = found.ids or [""] * len(found.texts)
            # numbers: as unit_blocks gives them (a plain JSON Lines unit is one block)
            for record in range(len(found.texts)):  # once per record: its hash is the piece's
                number = found.numbers[record]
                cutter.add(
                    int(positions[record]), number, ids[record], found.texts[record], int(counts[record])
                )
            if found.skipped and first_skipped < 0:
                first_skipped = found.first_skipped
            lines += block_lines
            records += len(found.texts)
            skipped += found.skipped + found.overlong
    except (FormatError, storage.StorageError) as err:
        raise EmbedError(str(err)) from None
    end = unit.end if unit.end >= 0 else lines
    return UnitCount(cutter.finish(end), lines, records, skipped, first_skipped)


class _Cutter:
    """Cuts a unit's records, as they come, into pieces: a piece that has reached ``lines_per_shard``
    sentences ends where the next record with a sentence begins (records without one stay in it),
    the last at the unit's end."""

    def __init__(self, lines_per_shard: int, start: int, first_record: int):
        self.lines_per_shard = lines_per_shard
        self.pieces: list[Piece] = []
        self._open(start, first_record)

    def _open(self, start: int, before: int) -> None:
        self.start, self.before, self.sentences, self.digest = start, before, 0, hashlib.sha256()

    def add(self, position: int, number: int, ident: str, text: str, sentences: int) -> None:
        if sentences and self.sentences >= self.lines_per_shard:
            self._close(position)
            self._open(position, number)
        _digest_record(self.digest, ident, text)
        self.sentences += sentences

    def _close(self, end: int) -> None:
        self.pieces.append(Piece(self.start, end, self.before, self.sentences, self.digest.hexdigest()))

    def finish(self, end: int) -> list[Piece]:
        if self.sentences:
            self._close(end)
        return self.pieces


class RecordStreams:
    """Compressed JSON Lines files read forward, one open at a time, its current block's records
    parsed once: a shard's lines [start, end) are read from where the previous shard of the same
    file ended, and from the file's start only when they come before it (or another file came
    between). A preparing task keeps one for the shards it is handed."""

    def __init__(self) -> None:
        self._path: str | None = None
        self._blocks: Iterator[tuple[Records, np.ndarray, int]] | None = None
        self._block: Records | None = None
        self._numbers = np.zeros(0, dtype=np.int64)  # the current block's record numbers (its lines)
        self._first = self._end = 0  # the current block's lines [first, end)

    def read(self, path: str, start: int, end: int, reading: RecordReading) -> Records:
        """The records of lines [start, end) of the compressed JSON Lines file ``path``."""
        if path != self._path or self._block is None or start < self._first:
            self._open(path, reading)
        out = Records()
        while self._block is not None:
            lo, hi = np.searchsorted(self._numbers, [start, end]).tolist()
            out.texts += self._block.texts[lo:hi]
            out.ids += self._block.ids[lo:hi]
            out.numbers += self._block.numbers[lo:hi]
            if self._end >= end or not self._advance():
                break
        return out

    def _open(self, path: str, reading: RecordReading) -> None:
        self._path, self._end = path, 0
        self._blocks = unit_blocks(Unit("jsonl-stream", path, 0, -1), reading)
        self._advance()

    def _advance(self) -> bool:
        try:
            found, numbers, lines = next(self._blocks)  # a line's position is its number here
        except StopIteration:
            self._block = None
            return False
        self._block, self._numbers = found, numbers
        self._first, self._end = self._end, self._end + lines
        return True


def read_records(
    segment, reading: RecordReading, streams: RecordStreams | None = None
) -> tuple[list[bytes], RecordKeys, str]:
    """A shard's sentences (UTF-8, no newline), their record keys, and the sha256 of its records
    (to compare with the plan's); ``segment``: the shard's ``inputs.Segment`` of a kind of
    :data:`RECORD_KINDS`; ``streams``: where compressed files are read from (a new one: from their start)."""
    try:
        if segment.kind == "jsonl-stream":
            found = (streams or RecordStreams()).read(segment.path, segment.start, segment.end, reading)
        else:
            ((found, _, _),) = unit_blocks(
                Unit(segment.kind, segment.path, segment.start, segment.end), reading
            )
    except (FormatError, storage.StorageError) as err:
        raise EmbedError(str(err)) from None
    sentences, counts = document_sentences(found.texts, reading.split)
    if reading.fields.id:
        ids = found.ids
    else:
        name = os.path.basename(segment.path.rstrip("/"))
        shift = segment.first_record if segment.kind == "jsonl" else 0
        ids = [f"{name}:{number + shift}" for number in found.numbers]
    firsts = np.cumsum(counts) - counts
    sentence = (np.arange(len(sentences)) - np.repeat(firsts, counts)).astype(np.int32)
    keys = RecordKeys(list(np.repeat(np.asarray(ids, dtype=object), counts)), sentence)
    lines = [s.encode("utf-8", "surrogatepass") for s in sentences]
    return lines, keys, records_digest(found.ids, found.texts)


COUNTS_IN_FLIGHT = 64
"""Count tasks submitted ahead of the one the driver waits for (their answers are small)."""


def _count_task(unit: Unit, reading: RecordReading, lines_per_shard: int) -> tuple[str, object]:
    try:
        return "ok", count_unit(unit, reading, lines_per_shard)
    except EmbedError as err:
        return "error", str(err)


def count_units(units: Sequence[Unit], reading: RecordReading, lines_per_shard: int) -> list[UnitCount]:
    """:func:`count_unit` of every unit, as Ray tasks on the connected cluster, in order; a unit's
    one-line problem is raised here as EmbedError."""
    import ray

    task = ray.remote(num_cpus=1, max_retries=0)(_count_task)
    pending = [task.remote(u, reading, lines_per_shard) for u in units[:COUNTS_IN_FLIGHT]]
    counts: list[UnitCount] = []
    for i in range(len(units)):
        if i + COUNTS_IN_FLIGHT < len(units):
            pending.append(task.remote(units[i + COUNTS_IN_FLIGHT], reading, lines_per_shard))
        status, value = ray.get(pending[i])
        pending[i] = None  # its answer is held in ``counts`` only
        if status == "error":
            raise EmbedError(value)
        counts.append(value)
    return counts
