"""The input corpus as fixed line ranges ("shard specs"), and reading one range back.

Three kinds of input: sentence-per-line text, a shard directory, and record corpora (Parquet, JSON
Lines), whose shards are whole records planned by Ray tasks (``record_inputs``).

The driver makes one streaming pass over the input (:func:`plan_shards`) and cuts it into ranges of
``lines_per_shard`` lines; shard k is always lines ``[k * lines_per_shard, (k + 1) * lines_per_shard)``
of the concatenated input, so a rerun knows exactly which shards exist. Each spec records where its
lines are (byte ranges of text files, sentence ranges of a shard directory's tars) and a sha256 of its
input, so a worker reads only its own range (S3 reads are ranged) and a rerun can tell whether the input
changed under a half-finished output. Memory stays O(number of shards).

Plain text: lines are split on ``\\n``; a final line without a newline still counts; file boundaries
end a line. Shard directory: the sentences of ``shard_splits`` in manifest order, tokens joined by spaces.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from pipeline.embed.errors import EmbedError
from pipeline.embed.record_inputs import (
    RECORD_KINDS,
    RecordPlan,
    RecordReading,
    RecordStreams,
    count_units,
    read_records,
    record_kind,
    units_of,
)
from pipeline.embed.shard_vectors import RecordKeys
from pipeline.formats import shard_format
from pipeline.formats.compression import HEAD_BYTES, compression_of
from pipeline.formats.shard_format import FormatError
from pipeline.formats.shard_manifest import manifest_path, read_manifest
from pipeline.runtime import storage

READ_CHUNK = 4 * 1024 * 1024
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip")


@dataclass(frozen=True)
class Segment:
    """Part of one input file: ``kind`` ``text`` = bytes [start, end); ``tar`` = sentences [start, end)
    of a shard tar, counted from its first block, and the tar's sha256 from the shard manifest
    (checked over the whole file at every read); ``last``: the range ends where the manifest says
    the tar does (its reader checks that no sentence follows). ``parquet`` = rows [start, end);
    ``jsonl`` = bytes [start, end) of whole lines, the first of them the file's line
    ``first_record`` (0-based); ``jsonl-stream`` = lines [start, end) of a compressed JSON Lines file."""

    kind: str
    path: str
    start: int
    end: int
    sha256: str = ""
    last: bool = False
    first_record: int = 0


@dataclass(frozen=True)
class ShardSpec:
    """Input lines [first_line, first_line + num_lines) and where they are."""

    index: int
    first_line: int
    num_lines: int
    segments: tuple[Segment, ...]
    input_sha256: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ShardSpec:
        segments = tuple(Segment(**s) for s in data["segments"])
        return cls(**{**data, "segments": segments})


def is_shard_dir(path: str) -> bool:
    """Whether ``path`` is a shard directory (it holds the shard stage's manifest.json)."""
    return not storage.has_glob(path) and storage.exists(manifest_path(path))


def resolve_inputs(patterns: Sequence[str]) -> tuple[str, list[str]]:
    """``("shards", [dir])``, ``("text", sorted files)`` or ``("records", sorted files)`` (Parquet
    and JSON Lines, known by their content); EmbedError when nothing usable is named, or text and
    records are mixed."""
    if not patterns:
        raise EmbedError("no input given: pass --input FILES or input=[...]")
    if len(patterns) == 1 and is_shard_dir(patterns[0]):
        return "shards", [patterns[0]]
    try:
        paths = storage.expand(list(patterns))
    except storage.StorageError as err:
        raise EmbedError(f"input: {err}") from None
    try:
        kinds = {path: record_kind(path) for path in paths}
    except (storage.StorageError, FormatError) as err:
        raise EmbedError(f"input: {err}") from None
    records = [path for path, kind in kinds.items() if kind]
    if records and len(records) < len(paths):
        text = next(path for path, kind in kinds.items() if not kind)
        raise EmbedError(
            f"input mixes records ({records[0]}) and sentence-per-line text ({text}): embed them in two runs"
        )
    for path in paths:
        if not records and path.endswith(COMPRESSED_SUFFIXES):
            raise EmbedError(
                f"input {path}: compressed files are not read (shards are read by byte range); decompress it first"
            )
    return ("records" if records else "text"), paths


class _Planner:
    """Accumulates segments until a shard's worth of lines, then emits a ShardSpec."""

    def __init__(self, lines_per_shard: int):
        self.lines_per_shard = lines_per_shard
        self.specs: list[ShardSpec] = []
        self._reset(first_line=0)

    def _reset(self, first_line: int) -> None:
        self.first_line = first_line
        self.lines = 0
        self.segments: list[Segment] = []
        self.hash = hashlib.sha256()

    @property
    def room(self) -> int:
        return self.lines_per_shard - self.lines

    def add(self, segment: Segment, lines: int, digest_data: bytes) -> None:
        if lines == 0:
            return
        self.segments.append(segment)
        self.lines += lines
        self.hash.update(digest_data)
        if self.room == 0:
            self.flush()

    def flush(self) -> None:
        if self.lines:
            self.specs.append(
                ShardSpec(
                    len(self.specs), self.first_line, self.lines, tuple(self.segments), self.hash.hexdigest()
                )
            )
        self._reset(self.first_line + self.lines)


def _text_segments(path: str, planner: _Planner) -> None:
    """Cut one text file into segments at shard boundaries (one streaming pass)."""
    try:
        stream = storage.open_read(path)
    except storage.StorageError as err:
        raise EmbedError(f"input: {err}") from None
    with stream:
        start = pos = 0  # byte offsets: start of the open segment, end of the bytes read so far
        lines = 0
        digest = hashlib.sha256()
        last_byte = b"\n"  # an unterminated final line is one more line
        while True:
            chunk = stream.read(READ_CHUNK)
            if not chunk:
                break
            if pos == 0 and (kind := compression_of(chunk[:HEAD_BYTES])):
                raise EmbedError(
                    f"input {path}: {kind}-compressed data (shards are read by byte range); decompress it first"
                )
            view_start = 0
            while True:
                need = planner.room - lines
                cut = _nth_newline(chunk, view_start, need)
                if cut is None:
                    count = chunk.count(b"\n", view_start)
                    lines += count
                    digest.update(chunk[view_start:])
                    break
                digest.update(chunk[view_start : cut + 1])
                end = pos + cut + 1
                planner.add(Segment("text", path, start, end), lines + need, digest.digest())
                start, lines, digest = end, 0, hashlib.sha256()
                view_start = cut + 1
            last_byte = chunk[-1:]
            pos += len(chunk)
        if pos > start:
            lines += last_byte != b"\n"
            planner.add(Segment("text", path, start, pos), lines, digest.digest())


def _nth_newline(data: bytes, start: int, n: int) -> int | None:
    """Index of the n-th ``\\n`` in ``data[start:]`` (n >= 1), or None when there are fewer."""
    if data.count(b"\n", start) < n:
        return None
    pos = start - 1
    for _ in range(n):
        pos = data.index(b"\n", pos + 1)
    return pos


def _tar_segments(shard_dir: str, splits: Sequence[str], planner: _Planner) -> None:
    """Cut the tars of a shard directory into sentence ranges, from its manifest alone."""
    for split in splits:
        if split not in shard_format.SPLITS:
            raise EmbedError(
                f"shard_splits: unknown split {split!r}; expected some of {', '.join(shard_format.SPLITS)}"
            )
    try:
        manifest = read_manifest(shard_dir)
        manifest.check_listed_shards(splits)
    except (shard_format.FormatError, storage.StorageError) as err:
        raise EmbedError(f"input: {err}") from None
    for split in splits:
        for entry in manifest.shards[split]:
            path = storage.join(shard_dir, entry.name)
            done, total = 0, entry.sentences
            while done < total:
                take = min(planner.room, total - done)
                segment = Segment("tar", path, done, done + take, entry.sha256, last=done + take == total)
                planner.add(segment, take, tar_key(segment))
                done += take


def plan_shards(
    kind: str, paths: Sequence[str], lines_per_shard: int, shard_splits: Sequence[str] = ()
) -> list[ShardSpec]:
    """The shard specs of text or a shard directory, in line order (one streaming pass over text
    input); a record corpus's: :func:`plan_records`."""
    if lines_per_shard < 1:
        raise EmbedError(f"lines_per_shard must be >= 1, got {lines_per_shard}")
    planner = _Planner(lines_per_shard)
    if kind == "shards":
        _tar_segments(paths[0], shard_splits, planner)
    else:
        for path in paths:
            _text_segments(path, planner)
    planner.flush()
    return planner.specs


def plan_records(paths: Sequence[str], lines_per_shard: int, reading: RecordReading) -> RecordPlan:
    """The shards of a record corpus: its units named here, counted by Ray tasks
    (``record_inputs.count_units``), a shard per piece, lines numbered in input order."""
    try:
        units = [u for path in paths for u in units_of(path, record_kind(path) or "", reading)]
    except (storage.StorageError, FormatError) as err:
        raise EmbedError(f"input: {err}") from None
    plan = RecordPlan([])
    line, file_lines = 0, dict.fromkeys(paths, 0)
    for unit, count in zip(units, count_units(units, reading, lines_per_shard), strict=True):
        base = file_lines[unit.path]  # JSON Lines: the file's lines before the unit
        for piece in count.pieces:
            segment = Segment(
                unit.kind, unit.path, piece.start, piece.end, first_record=base + piece.first_record
            )
            plan.specs.append(ShardSpec(len(plan.specs), line, piece.sentences, (segment,), piece.sha256))
            line += piece.sentences
        counts = plan.counts
        if count.skipped and not counts.first_skipped:
            where = (
                f"record {base + count.first_skipped}"
                if count.first_skipped >= 0
                else "a line over max_record_bytes"
            )
            counts.first_skipped = f"{unit.path} {where}"
        counts.records += count.records
        counts.skipped += count.skipped
        file_lines[unit.path] = base + count.lines
    return plan


def tar_key(segment: Segment) -> bytes:
    """What a shard's input hash takes from a tar segment: the tar's own sha256 (checked over the
    whole file at every read) and the sentence range."""
    return f"{segment.sha256}:{segment.start}:{segment.end}\n".encode()


def _text_lines(segment: Segment) -> tuple[list[bytes], bytes]:
    """The segment's lines, and what the shard's input hash takes from it (its bytes' sha256)."""
    with storage.open_read(segment.path) as stream:
        stream.seek(segment.start)
        data = _read_exactly(stream, segment.end - segment.start, segment.path)
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    return lines, hashlib.sha256(data).digest()


def _read_exactly(stream: io.IOBase, size: int, path: str) -> bytes:
    parts, left = [], size
    while left > 0:
        chunk = stream.read(left)
        if not chunk:
            raise EmbedError(
                f"input {path}: file shrank while reading (expected {size} bytes); the input changed"
            )
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _tar_lines(segment: Segment) -> list[bytes]:
    """The segment's sentences; blocks past it are not decoded, but the whole tar is read and
    checked against its sha256 (a damaged shard is named, not embedded)."""
    lines: list[bytes] = []
    seen = 0
    with shard_format.open_shard(segment.path, segment.sha256) as blocks:
        for block in blocks:
            count = len(block.sentences)
            lo, hi = max(segment.start - seen, 0), min(segment.end - seen, count)
            lines.extend(" ".join(sentence).encode("utf-8") for sentence in block.sentences[lo:hi])
            seen += count
            if seen >= segment.end and not segment.last:
                break
    if segment.last and seen > segment.end:
        raise EmbedError(
            f"input {segment.path}: holds {seen:,} sentences, its manifest says {segment.end:,}; "
            "the manifest is not this shard's"
        )
    return lines


def read_input(
    spec: ShardSpec, reading: RecordReading | None, streams: RecordStreams | None = None
) -> tuple[list[bytes], RecordKeys | None]:
    """:func:`read_lines` of any shard; a record corpus's (``reading``: how its records become
    sentences; ``streams``: where its compressed files are read on from) with each sentence's
    record keys, checked against the plan's hash of its records."""
    if not spec.segments or spec.segments[0].kind not in RECORD_KINDS:
        return read_lines(spec), None
    (segment,) = spec.segments
    lines, keys, digest = read_records(segment, reading or RecordReading(), streams)
    if len(lines) != spec.num_lines or digest != spec.input_sha256:
        raise EmbedError(
            f"input {segment.path}: the records of lines {spec.first_line}-{spec.first_line + spec.num_lines - 1} "
            "changed since this run planned them; a rerun plans the input again and keeps the shards done if "
            "their records are unchanged (if any changed, it refuses: then use another output)"
        )
    return lines, keys


def read_lines(spec: ShardSpec) -> list[bytes]:
    """The raw lines (no newline) of one shard of text or a shard directory, ``spec.num_lines`` of
    them, checked against the input hash the plan recorded (a line edited since the run was planned
    is refused, not embedded under the planned line's key)."""
    lines: list[bytes] = []
    digest = hashlib.sha256()
    try:
        for segment in spec.segments:
            if segment.kind == "text":
                got, key = _text_lines(segment)
            else:
                got, key = _tar_lines(segment), tar_key(segment)
            lines.extend(got)
            digest.update(key)
    except (storage.StorageError, shard_format.FormatError) as err:
        raise EmbedError(f"input: {err}") from None
    where = spec.segments[0].path if spec.segments else "input"
    if len(lines) != spec.num_lines:
        raise EmbedError(
            f"input {where}: shard {spec.index} should hold {spec.num_lines} lines, read {len(lines)}; the input changed"
        )
    if digest.hexdigest() != spec.input_sha256:
        raise EmbedError(
            f"input {where}: lines {spec.first_line}-{spec.first_line + spec.num_lines - 1} changed since "
            "this run read them (their sha256 differs); a rerun plans the input again and keeps the shards "
            "done if their lines are unchanged (if any changed, it refuses: then use another output)"
        )
    return lines
