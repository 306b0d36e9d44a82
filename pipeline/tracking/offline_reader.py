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
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_READER = r"""
import json, struct, sys, zlib
from google.protobuf.json_format import MessageToDict
from wandb.proto import wandb_internal_pb2

data = open(sys.argv[1], "rb").read()
assert data[:4] == b":W&B", "not a wandb run file"
pos, block, payload, out = 7, 32 * 1024, b"", []
while pos + 7 <= len(data):
    room = block - (pos % block)
    if room < 7:
        pos += room
        continue
    crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
    if length == 0 and kind == 0:
        pos += room
        continue
    piece = data[pos + 7 : pos + 7 + length]
    assert zlib.crc32(bytes([kind]) + piece) & 0xFFFFFFFF == crc, f"bad crc at byte {pos}"
    payload += piece
    pos += 7 + length
    if kind in (1, 4):  # FULL or LAST: a whole record
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        payload = b""
        kind_name = record.WhichOneof("record_type")
        body = MessageToDict(getattr(record, kind_name), preserving_proto_field_name=True)
        if "type" in body:  # an artifact record's own type (dataset, model ...)
            body[kind_name + "_type"] = body.pop("type")
        out.append({"type": kind_name, **body})
print(json.dumps(out))
"""


def run_files(root: str | Path) -> list[Path]:
    """Every offline run file under ``root`` (``.../offline-run-<time>-<id>/run-<id>.wandb``)."""
    return sorted(Path(root).rglob("offline-run-*/run-*.wandb"))


def records(path: str | Path) -> list[dict]:
    """The records of one run file, in order: ``{"type": "history" | "run" | "metric" | "summary"
    | "artifact" | ..., **fields}`` (a record's own ``type`` field as ``<record type>_type``:
    an artifact's ``artifact_type``)."""
    out = subprocess.run(
        [sys.executable, "-c", _READER, str(path)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def _put(out: dict, item: dict) -> None:
    """An item of a record into ``out``: ``key`` -> value, or a media value's field under its
    ``nested_key`` (``["probe/table", "path"]``: ``out["probe/table"]["path"]``)."""
    keys = [item["key"]] if item.get("key") else item["nested_key"]
    for key in keys[:-1]:
        out = out.setdefault(key, {})
    out[keys[-1]] = json.loads(item["value_json"])


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
    return next(r for r in recs if r["type"] == "run")


def config(recs: list[dict]) -> dict:
    """The run's config, as its ``run`` record holds it (wandb's own ``_wandb`` entry left out)."""
    items = run_record(recs).get("config", {}).get("update", [])
    return {i["key"]: json.loads(i["value_json"]) for i in items if i["key"] != "_wandb"}


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
