"""Record corpora (Parquet, JSON Lines) as embed shards: whole records, their sentences numbered in
input order, each sentence keeping its record's id and its index in the record.

Planning is two steps, neither of which reads the corpus on the driver:

1. The driver names the input's **units** from metadata alone (:func:`units_of`): a Parquet file's
   row groups gathered into runs of about ``UNIT_BYTES`` (uncompressed, from the footer), a JSON
   Lines file's byte ranges of about ``UNIT_BYTES`` cut at a line end (a ranged read of the bytes
   around each cut). O(files + units).
2. A Ray task per unit (:func:`count_unit`) reads its records, splits them into sentences and
   answers with its **pieces**: runs of whole records of at least ``lines_per_shard`` sentences (a
   unit's last may hold fewer), each with its sentence count and the sha256 of its records' ids
   and texts; O(pieces) comes back.

Each piece is one shard (:func:`plan_record_shards`): a shard never splits a record, so a record's
sentences are in one shard, and its sentences' line numbers follow the input's order (files in the
order given, then records, then sentences). The plan depends on the input and the settings alone:
a rerun plans the same shards and resumes them (exactly-once as for text), and a shard whose
records changed since is refused by its hash when it is read (:func:`read_records`).

A compressed JSON Lines file cannot be entered in the middle, so it would be read from its start
once per shard: it is refused in one line (decompress it, or convert it to Parquet); the shard
stage reads it whole. Records the text reader would skip (no string text field, an id that is not
a string or an integer, a line that is no JSON object, a line over ``max_record_bytes``) are
skipped and counted here too, the first one named by file and record number.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
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
RECORD_KINDS = ("jsonl", "parquet")


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
    groups), or ``jsonl`` bytes [start, end) (whole lines)."""

    kind: str
    path: str
    start: int
    end: int


@dataclass(frozen=True)
class Piece:
    """A shard-to-be: records [start, end) of its unit (rows, or bytes of whole lines), the unit's
    ``lines`` before it (JSON Lines: for the file's line numbers; 0 for Parquet), its sentences and
    the sha256 of its records."""

    start: int
    end: int
    lines_before: int
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
    """``parquet`` or ``jsonl`` for a record file (known by its content), None for text; a
    compressed JSON Lines file is refused."""
    kind = record_files.input_kind(path)
    if kind == "text":
        return None
    if kind == "jsonl":
        with storage.open_read(path) as stream:
            compressed = compression_of(stream.read(HEAD_BYTES))
        if compressed:
            raise EmbedError(
                f"input {path}: {compressed}-compressed JSON Lines (elmo embed reads a record file by byte "
                "range, and a compressed one would be read from its start for every shard): decompress it, "
                "or convert it to Parquet"
            )
    return kind


def units_of(path: str, kind: str, reading: RecordReading, unit_bytes: int = UNIT_BYTES) -> list[Unit]:
    """The units of one record file, from its footer (Parquet) or from ranged reads at each cut
    (JSON Lines); the file's columns are checked here."""
    if kind == "parquet":
        layout = record_files.parquet_row_groups(path, reading.fields)
        units = []
        for run, first_row in record_files.iter_parquet_chunks(path, reading.fields, unit_bytes):
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


def unit_records(unit: Unit, reading: RecordReading) -> tuple[Records, bytes]:
    """The records of ``unit``: Parquet rows numbered as in the file; JSON Lines lines numbered
    from 0 at ``unit.start``, with the bytes read."""
    if unit.kind == "parquet":
        layout = record_files.parquet_row_groups(unit.path, reading.fields)
        group_starts = np.concatenate([[0], np.cumsum([rows for rows, _ in layout])])
        first = int(np.searchsorted(group_starts, unit.start, side="right")) - 1
        last = int(np.searchsorted(group_starts, unit.end, side="left"))
        rows = range(unit.start, unit.end)
        groups = range(first, last)
        return record_files.parquet_records(
            unit.path, groups, int(group_starts[first]), reading.fields, rows
        ), b""
    with storage.open_read(unit.path) as stream:
        stream.seek(unit.start)
        data = stream.read(unit.end - unit.start)
    if len(data) != unit.end - unit.start:
        raise EmbedError(f"input {unit.path}: file shrank while reading; the input changed")
    return record_files.jsonl_records(data, reading.fields, 0, reading.max_record_bytes), data


def records_digest(ids: Sequence[str], texts: Sequence[str]) -> str:
    """The sha256 of records' ids and texts, as a piece's plan and its read both compute it."""
    digest = hashlib.sha256()
    for ident, text in zip(ids or [""] * len(texts), texts, strict=True):  # once per record
        digest.update(ident.encode("utf-8", "surrogatepass") + b"\0")
        digest.update(text.encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()


def count_unit(unit: Unit, reading: RecordReading, lines_per_shard: int) -> UnitCount:
    """A count task: ``unit``'s pieces (see the module docstring)."""
    try:
        found, data = unit_records(unit, reading)
    except (FormatError, storage.StorageError) as err:
        raise EmbedError(str(err)) from None
    _, counts = document_sentences(found.texts, reading.split)
    numbers = np.asarray(found.numbers, dtype=np.int64)
    parquet = unit.kind == "parquet"
    lines = 0
    if not parquet:
        line_starts = np.concatenate([[0], np.flatnonzero(np.frombuffer(data, np.uint8) == 10) + 1])
        lines = len(line_starts) - (1 if data.endswith(b"\n") else 0)
    pieces: list[Piece] = []
    for first, last in _piece_bounds(np.cumsum(counts), lines_per_shard):
        # a record's number: its row in the file (Parquet) or its line in the unit (JSON Lines)
        begin = int(numbers[first]) if first else (unit.start if parquet else 0)
        follow = int(numbers[last + 1]) if last + 1 < len(numbers) else None
        if parquet:
            start, end, before = begin, unit.end if follow is None else follow, 0
        else:
            start = unit.start + int(line_starts[begin])
            end = unit.end if follow is None else unit.start + int(line_starts[follow])
            before = begin
        span = slice(first, last + 1)
        digest = records_digest(found.ids[span], found.texts[span])
        pieces.append(Piece(start, end, before, int(counts[span].sum()), digest))
    return UnitCount(pieces, lines, len(found.texts), found.skipped + found.overlong, found.first_skipped)


def _piece_bounds(cum: np.ndarray, lines_per_shard: int) -> list[tuple[int, int]]:
    """``(first, last)`` kept records of each piece, from ``cum`` the sentences through each: a
    piece ends at the first record that brings it to ``lines_per_shard`` sentences; the last piece
    takes every record left (those without sentences too). O(pieces)."""
    total = int(cum[-1]) if len(cum) else 0
    bounds, first, done = [], 0, 0
    while done < total:
        last = int(np.searchsorted(cum, done + lines_per_shard, side="left"))
        if last >= len(cum) - 1 or cum[last] == total:
            last = len(cum) - 1
        bounds.append((first, last))
        first, done = last + 1, int(cum[last])
    return bounds


def read_records(segment, reading: RecordReading) -> tuple[list[bytes], RecordKeys, str]:
    """A shard's sentences (UTF-8, no newline), their record keys, and the sha256 of its records
    (to compare with the plan's); ``segment``: the shard's ``inputs.Segment`` of kind ``parquet``
    or ``jsonl``."""
    unit = Unit(segment.kind, segment.path, segment.start, segment.end)
    try:
        found, _ = unit_records(unit, reading)
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
