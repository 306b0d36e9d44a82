"""Reading wandb's offline run files back (the tests, ``pipeline/tools/dashboard_picture.py``):
wandb 0.31 ships no Python reader.

A ``run-<id>.wandb`` file is a LevelDB-style log: a 7-byte header (``:W&B``, 0xBEE1, a version),
then 32 KiB blocks of records, each with a 7-byte header (crc32 of its type and payload, uint32
little-endian; its length, uint16; its type, FULL 1 / FIRST 2 / MIDDLE 3 / LAST 4), a record that
does not fit a block's end continuing in the next; zeros pad a block's tail. Joined, the pieces are
wandb's protobuf ``Record`` messages (``wandb.proto.wandb_internal_pb2``).

They are parsed in a child process, so wandb is never imported into the calling process (a test
process also drives Ray); the child prints each record as JSON (protobuf's own mapping, field names
as in the ``.proto``).

A run file is untrusted input (a tool reads whatever folder it is given): it must be a regular file
of at most ``MAX_BYTES``, read block by block; a run killed mid-write leaves a torn last record,
which is left out (the records before it are whole); anything else that is not what wandb writes (no
header, a bad crc, a record protobuf cannot parse, a value nested deeper than JSON's parser goes) is
an `OfflineFileError`: one line naming the file.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from pipeline.errors import PipelineError

MAX_BYTES = 4 << 30
"""The largest run file read (a training run's history of a million rows is a few hundred MB)."""


class OfflineFileError(PipelineError):
    """A wandb offline file that cannot be read: one line naming it and what is wrong."""


_READER = r"""
import json, struct, sys, zlib
from google.protobuf.json_format import MessageToDict
from wandb.proto import wandb_internal_pb2

def fail(text):
    sys.stderr.write(text)
    raise SystemExit(3)

BLOCK = 32 * 1024
out, payload, pos = [], b"", 7
with open(sys.argv[1], "rb") as f:
    if f.read(7)[:4] != b":W&B":
        fail("not a wandb run file (no :W&B header)")
    block = f.read(BLOCK - 7)  # the first block, after the file's header
    base = 7
    while block:
        at = 0
        while at + 7 <= len(block):
            crc, length, kind = struct.unpack("<IHB", block[at : at + 7])
            if length == 0 and kind == 0:  # the block's zero tail
                break
            room = BLOCK - (base + at) % BLOCK - 7  # a piece never crosses its block's end
            if kind not in (1, 2, 3, 4) or length > room:
                fail(f"a damaged record at byte {base + at} (its kind or length is not wandb's)")
            piece = block[at + 7 : at + 7 + length]
            if len(piece) < length:  # torn: the run was killed while writing this record
                block = b""
                break
            if zlib.crc32(bytes([kind]) + piece) & 0xFFFFFFFF != crc:
                fail(f"a damaged record at byte {base + at} (its crc is not its bytes')")
            payload += piece
            at += 7 + length
            if kind in (1, 4):  # FULL or LAST: a whole record
                record = wandb_internal_pb2.Record()
                try:
                    record.ParseFromString(payload)
                except Exception as err:
                    fail(f"a record at byte {base + at} is not a wandb record ({type(err).__name__})")
                payload = b""
                kind_name = record.WhichOneof("record_type")
                if kind_name is None:
                    continue
                body = MessageToDict(getattr(record, kind_name), preserving_proto_field_name=True)
                if "type" in body:  # an artifact record's own type (dataset, model ...)
                    body[kind_name + "_type"] = body.pop("type")
                out.append({"type": kind_name, **body})
        base += len(block) if block else 0
        block = f.read(BLOCK) if block else b""
print(json.dumps(out))
"""


def run_files(root: str | Path) -> list[Path]:
    """Every offline run file under ``root`` (``.../offline-run-<time>-<id>/run-<id>.wandb``)."""
    return sorted(Path(root).rglob("offline-run-*/run-*.wandb"))


def records(path: str | Path) -> list[dict]:
    """The records of one run file, in order: ``{"type": "history" | "run" | "metric" | "summary"
    | "artifact" | ..., **fields}`` (a record's own ``type`` field as ``<record type>_type``:
    an artifact's ``artifact_type``)."""
    try:
        info = os.stat(path)
    except OSError as err:
        raise OfflineFileError(f"wandb run file {path}: {err.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise OfflineFileError(f"wandb run file {path}: not a regular file")
    if info.st_size > MAX_BYTES:
        raise OfflineFileError(f"wandb run file {path}: {info.st_size:,} bytes, more than {MAX_BYTES:,}")
    out = subprocess.run([sys.executable, "-c", _READER, str(path)], capture_output=True, text=True)
    if out.returncode == 3:
        raise OfflineFileError(f"wandb run file {path}: {out.stderr.strip()}")
    if out.returncode != 0:  # the reader itself failed (wandb missing ...): its last line
        lines = out.stderr.strip().splitlines() or [f"exit status {out.returncode}"]
        raise OfflineFileError(f"wandb run file {path}: cannot be read ({lines[-1]})")
    return json.loads(out.stdout)


def _put(out: dict, item: dict) -> None:
    """An item of a record into ``out``: ``key`` -> value, or a media value's field under its
    ``nested_key`` (``["probe/table", "path"]``: ``out["probe/table"]["path"]``)."""
    keys = [item["key"]] if item.get("key") else item["nested_key"]
    for key in keys[:-1]:
        out = out.setdefault(key, {})
    out[keys[-1]] = value(item["value_json"], keys[-1])


def value(text: str, key: str) -> object:
    """A logged value's JSON; an `OfflineFileError` for one no reader should take (nested past
    Python's recursion limit, or not JSON)."""
    try:
        return json.loads(text)
    except (RecursionError, ValueError) as err:
        raise OfflineFileError(
            f"logged value {key!r} is not JSON a reader takes ({type(err).__name__})"
        ) from None


def history(recs: list[dict]) -> list[dict]:
    """The logged rows: ``{key: value}`` per ``history`` record (``_step`` among them)."""
    rows = []
    for r in recs:
        if r["type"] == "history":
            rows.append({})
            for item in r["item"]:
                _put(rows[-1], item)
    return rows


def summary(recs: list[dict]) -> dict:
    """The run's summary as its last ``summary`` records leave it."""
    out: dict = {}
    for r in recs:
        if r["type"] == "summary":
            for item in r.get("update", []):
                _put(out, item)
    return out


def run_record(recs: list[dict]) -> dict:
    """The ``run`` record: ``run_id``, ``run_group``, ``job_type``, ``display_name`` ..."""
    found = next((r for r in recs if r["type"] == "run"), None)
    if found is None:
        raise OfflineFileError("no run record (a run killed before wandb wrote one, or not a run file)")
    return found


def config(recs: list[dict]) -> dict:
    """The run's config, as its ``run`` record holds it (wandb's own ``_wandb`` entry left out)."""
    items = run_record(recs).get("config", {}).get("update", [])
    return {i["key"]: value(i["value_json"], i["key"]) for i in items if i["key"] != "_wandb"}


def artifacts(recs: list[dict]) -> list[dict]:
    """The run's artifact records: ``name``, ``artifact_type``, ``digest``, ``manifest`` (its
    ``contents``: ``path``, ``ref``, ``digest``), and ``use_after_commit`` on those the run used."""
    return [r for r in recs if r["type"] == "artifact"]


def step_metrics(recs: list[dict]) -> dict[str, str]:
    """``define_metric``'s step metrics: a metric's name or glob -> its step metric."""
    return {
        r.get("name") or r.get("glob_name"): r["step_metric"]
        for r in recs
        if r["type"] == "metric" and r.get("step_metric")
    }
