"""Record corpora: documents stored as Parquet (a string column) or JSON Lines (one object a line,
plain, gzip or zstd), local or ``s3://``, as FineWeb, Wikipedia, C4, Dolma and the Pile publish them.

A file's kind is known by its content, not its name (:func:`input_kind`): Parquet by its magic
bytes, JSON Lines by a first object ``{`` after any decompression, anything else is text.

Reading is in bounded memory: a Parquet file a run of row groups at a time (:func:`parquet_records`;
the footer's row counts and sizes say where each starts, without reading it), JSON Lines as whole lines cut from a
stream, as text is (:func:`jsonl_records` parses the lines one task was handed). A record whose
text field is missing, null or not a string, or a line that is not a JSON object (a torn last line)
is skipped and counted; a Parquet file without the column, or whose column holds no strings, or a
row group that cannot be decoded, is refused in one line naming the file (and the row group).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from pipeline.formats.compression import HEAD_BYTES, compression_of
from pipeline.formats.shard_format import FormatError
from pipeline.runtime import storage

PARQUET_MAGIC = b"PAR1"
KINDS = ("text", "jsonl", "parquet")
"""What an input file holds: sentence-per-line text, JSON Lines records, Parquet records."""


@dataclass(frozen=True)
class RecordFields:
    """Which fields of a record the stages read."""

    text: str = "text"
    """The document's text."""
    id: str = ""
    """The record's id (a string or an integer); empty: records are known by their number in the file."""


@dataclass
class Records:
    """The documents of some records of one file, in order.

    ``texts``: each kept record's text; ``ids``: each kept record's id as a string (``[]`` without
    an id field); ``numbers``: int ``(D,)`` each kept record's number in its file (0-based: a JSON
    Lines file's line, a Parquet file's row); ``skipped``: records without a string text field (or
    id), or lines that are not a JSON object; ``first_skipped``: the file's number of the first of
    them (-1: none).
    """

    texts: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    skipped: int = 0
    first_skipped: int = -1
    overlong: int = 0
    """JSON Lines lines longer than the reader's limit, dropped unread (not among ``skipped``)."""

    def add(self, number: int, text: str, ident: str | None) -> None:
        """Keep record ``number`` (``ident``: its id, None without an id field)."""
        self.texts.append(text)
        self.numbers.append(number)
        if ident is not None:
            self.ids.append(ident)

    def skip(self, number: int) -> None:
        self.skipped += 1
        if self.first_skipped < 0:
            self.first_skipped = number


def input_kind(path: str) -> str:
    """``parquet``, ``jsonl`` or ``text``, from the file's first bytes (decompressed when gzip or
    zstd; data that does not decompress is ``text``, for the reader to refuse); StorageError when
    it cannot be read."""
    return file_kind(path)[0]


def file_kind(path: str) -> tuple[str, str | None]:
    """:func:`input_kind` and the file's compression (``compression_of`` its first bytes), from
    one read of its start."""
    with storage.open_read(path) as raw:
        head = raw.read(max(HEAD_BYTES, len(PARQUET_MAGIC)))
        if head.startswith(PARQUET_MAGIC):
            return "parquet", None
        raw.seek(0)
        kind = compression_of(head)
        stream = decompressed(raw, kind, path) if kind in ("gzip", "zstd") else raw
        try:
            start = stream.read(4096).lstrip()
        except (OSError, EOFError):  # damaged data: the reader names it, as for any text
            return "text", kind
    return ("jsonl" if start.startswith(b"{") else "text"), kind


def decompressed(raw, kind: str | None, path: str):
    """A binary stream of ``raw``'s data: gunzipped (``gzip``), unzstd'ed (``zstd``, every frame)
    or as it is (None)."""
    if kind == "gzip":
        import gzip

        return gzip.GzipFile(fileobj=raw, mode="rb")
    if kind == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
    if kind is None:
        return raw
    raise FormatError(
        f"input {path}: {kind}-compressed data; decompress it, or compress it with gzip or zstd"
    )


def line_blocks(
    stream: BinaryIO, path: str, chunk_bytes: int, max_line_bytes: int
) -> Iterator[tuple[bytes, int]]:
    """``(lines, overlong_dropped)`` pairs for one stream, about ``chunk_bytes`` each: ``lines`` whole
    lines (each with its newline, but a last line without one), ``overlong_dropped`` the lines
    longer than ``max_line_bytes`` (0: no limit) dropped unread just before them (a record's number
    follows from both). A stream that cannot be read (a damaged gzip or zstd frame) is a FormatError
    naming ``path``."""
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
        dropped = 0  # a line after ``complete``: told with the next chunk (a record's number follows from it)
        if max_line_bytes and len(carry) > max_line_bytes:
            carry = b""
            dropped = 1
            skipping = True
        if complete:
            yield complete, overlong
            overlong = 0
        overlong += dropped
    if carry or overlong:
        yield carry, overlong


def _read(stream: BinaryIO, size: int, path: str) -> bytes:
    try:
        return stream.read(size)
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile and zstandard.ZstdError are OSErrors
        raise FormatError(f"cannot read input {path}: {err}") from None


def jsonl_records(data: bytes, fields: RecordFields, first_number: int, max_bytes: int = 0) -> Records:
    """The records of whole JSON Lines ``data`` whose first line is the file's ``first_number``;
    blank lines are not records (they keep their number), lines over ``max_bytes`` (0: no limit)
    are dropped unread, as the reader drops those it would have to hold whole."""
    records = Records()
    for number, line in enumerate(data.split(b"\n"), first_number):  # once per record
        if not line.strip():
            continue
        if max_bytes and len(line) > max_bytes:
            records.overlong += 1
            continue
        try:
            record = json.loads(line)
        except ValueError:  # a torn line, or not JSON at all (UnicodeDecodeError is one)
            record = None
        _keep(records, record if isinstance(record, dict) else {}, fields, number)
    return records


def _keep(records: Records, record: dict, fields: RecordFields, number: int) -> None:
    text = record.get(fields.text)
    ident = record.get(fields.id) if fields.id else ""
    if not isinstance(text, str) or (
        fields.id and (isinstance(ident, bool) or not isinstance(ident, str | int))
    ):
        records.skip(number)
        return
    records.add(number, text, str(ident) if fields.id else None)


@contextlib.contextmanager
def _parquet(path: str):
    import pyarrow.parquet as pq

    with storage.open_read(path) as stream:
        try:
            parquet = pq.ParquetFile(stream)
        except Exception as err:  # pyarrow's ArrowInvalid / OSError for a damaged footer
            raise FormatError(f"input {path}: not a readable Parquet file ({_first_line(err)})") from None
        yield parquet


def _first_line(err: Exception) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0]


def _check_column(path: str, schema, name: str, role: str, integers: bool) -> None:
    import pyarrow as pa

    names = schema.names
    if name not in names:
        raise FormatError(
            f"input {path}: no column {name!r} for the records' {role} (it has {', '.join(names[:8])}"
            f"{', ...' if len(names) > 8 else ''}); name another with {role}_field="
        )
    kind = schema.field(name).type
    strings = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
    if not (strings or (integers and pa.types.is_integer(kind))):
        raise FormatError(
            f"input {path}: column {name!r} holds {kind}, not strings{' or integers' if integers else ''}"
        )


def parquet_row_groups(path: str, fields: RecordFields) -> list[tuple[int, int]]:
    """``(rows, bytes)`` of each row group of a Parquet file (its uncompressed size, as the footer
    says), whose columns are checked for ``fields``: from the footer alone, no row is read."""
    with _parquet(path) as parquet:
        schema = parquet.schema_arrow
        _check_column(path, schema, fields.text, "text", integers=False)
        if fields.id:
            _check_column(path, schema, fields.id, "id", integers=True)
        meta = parquet.metadata
        groups = (meta.row_group(i) for i in range(meta.num_row_groups))
        return [(group.num_rows, group.total_byte_size) for group in groups]


def parquet_records(path: str, groups: Sequence[int], first_number: int, fields: RecordFields) -> Records:
    """The records of row groups ``groups`` (consecutive) of a Parquet file, whose first row is
    the file's ``first_number``; a null text (or id) is a skipped record."""
    with _parquet(path) as parquet:
        table = _read_groups(parquet, path, groups, fields)
    return _table_records(table, first_number, fields)


def parquet_rows(path: str, rows: range, fields: RecordFields) -> Records:
    """The records of the file's rows ``rows`` (numbered as in the file): the row groups that hold
    them, found in the footer and read in the same open."""
    with _parquet(path) as parquet:
        meta = parquet.metadata
        starts = [0]
        for g in range(meta.num_row_groups):
            starts.append(starts[-1] + meta.row_group(g).num_rows)
        first = bisect.bisect_right(starts, rows.start) - 1
        last = bisect.bisect_left(starts, rows.stop)
        table = _read_groups(parquet, path, range(first, last), fields)
    return _table_records(table.slice(rows.start - starts[first], len(rows)), rows.start, fields)


def _read_groups(parquet, path: str, groups: Sequence[int], fields: RecordFields):
    columns = [fields.text] + ([fields.id] if fields.id else [])
    try:
        return parquet.read_row_groups(list(groups), columns=columns)
    except Exception as err:  # a damaged page: pyarrow raises OSError or ArrowInvalid
        named = f"row group {groups[0]}" if len(groups) == 1 else f"row groups {groups[0]}-{groups[-1]}"
        raise FormatError(f"input {path}: {named} cannot be read ({_first_line(err)})") from None


def _table_records(table, first_number: int, fields: RecordFields) -> Records:
    texts = table.column(fields.text).to_pylist()
    ids = table.column(fields.id).to_pylist() if fields.id else [""] * len(texts)
    records = Records()
    for number, (text, ident) in enumerate(zip(texts, ids, strict=True), first_number):  # once per record
        if text is None or ident is None:
            records.skip(number)
        else:
            records.add(number, text, str(ident) if fields.id else None)
    return records


def iter_parquet_chunks(path: str, fields: RecordFields, chunk_bytes: int) -> Iterator[tuple[range, int]]:
    """``(groups, first_row)``: a Parquet file's row groups, in order, gathered into runs of about
    ``chunk_bytes`` (uncompressed; a larger group is a run of its own)."""
    return parquet_runs(parquet_row_groups(path, fields), chunk_bytes)


def parquet_runs(layout: Sequence[tuple[int, int]], chunk_bytes: int) -> Iterator[tuple[range, int]]:
    """:func:`iter_parquet_chunks` of a file's ``parquet_row_groups`` layout, already read."""
    first = start = 0
    size = rows = 0
    for group, (group_rows, group_bytes) in enumerate(layout):
        if group > start and size + group_bytes > chunk_bytes:
            yield range(start, group), first
            start, first, size, rows = group, first + rows, 0, 0
        size += group_bytes
        rows += group_rows
    if layout:
        yield range(start, len(layout)), first
