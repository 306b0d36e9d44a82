"""Exactly-once output: committing shards, and finding what a previous run already finished.

A shard is committed in two atomic writes: the HDF5 file, then its entry under ``_progress/``. A
shard counts as complete only when its entry exists (so a job killed between the two writes redoes
that shard, overwriting the file atomically), its input hash matches, and, with ``verify``, the
file's sha256 matches the entry (a damaged file is redone). Shard k always holds the same lines, so
whatever the order of kills and reruns, the finished output holds every input line exactly once.

``_progress/run.json`` pins the settings that decide the vectors (input, model hash, layers, dtype,
...): a rerun with different ones is refused instead of mixing two kinds of vectors in one output.
"""

from __future__ import annotations

import hashlib
import json
import re

from pipeline import storage
from pipeline.embed import manifest
from pipeline.embed.errors import EmbedError
from pipeline.embed.inputs import ShardSpec

ENTRY_RE = re.compile(r"embeddings-(\d{6,})\.json$")


def check_writable(output: str) -> None:
    """Fail fast when the output cannot be written (missing bucket, denied, unreachable endpoint)."""
    try:
        storage.probe_writable(manifest.progress_dir(output))
    except storage.StorageError as err:
        raise EmbedError(f"output is not writable: {err}") from None


def claim_output(output: str, run: dict) -> bool:
    """Record ``run`` as the owner of ``output``; True when an earlier run with the same settings is resumed.

    EmbedError when the output holds a run with other settings, naming the first difference.
    """
    path = manifest.run_path(output)
    if storage.exists(path):
        try:
            previous = json.loads(storage.read_bytes(path))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EmbedError(f"{path} is damaged (not JSON); delete the output {output} and rerun") from None
        for key in sorted(set(run) | set(previous)):
            if previous.get(key) != run.get(key):
                raise EmbedError(
                    f"output {output} holds a run with other settings ({key}: {previous.get(key)!r}, now {run.get(key)!r}); "
                    "use another output or delete it"
                )
        return True
    manifest.write_json(path, run)
    return False


def _entry_ok(output: str, entry: dict, verify: bool) -> bool:
    path = manifest.shard_path(output, entry["index"])
    if not storage.exists(path):
        return False
    return not verify or storage.sha256(path) == entry["sha256"]


def complete_shards(output: str, specs: list[ShardSpec], verify: bool) -> dict[int, dict]:
    """Entries of the shards a previous run finished (index -> entry), checked against ``specs``."""
    found: dict[int, dict] = {}
    for path in storage.list_prefix(manifest.progress_dir(output) + "/"):
        match = ENTRY_RE.search(path)
        if not match:
            continue
        index = int(match.group(1))
        if index >= len(specs):
            raise EmbedError(
                f"output {output} has shard {index} but the input now makes only {len(specs)} shards: "
                "the input changed; use another output or delete it"
            )
        try:
            entry = json.loads(storage.read_bytes(path))
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # unreadable entry: the shard is simply redone
        spec = specs[index]
        if entry.get("input_sha256") != spec.input_sha256:
            raise EmbedError(
                f"output {output}: input lines {spec.first_line}-{spec.first_line + spec.num_lines - 1} changed "
                "since the previous run; use another output or delete it"
            )
        if _entry_ok(output, entry, verify):
            found[index] = entry
    return found


def commit_shard(output: str, stats: dict, payload: bytes) -> dict:
    """Write a shard, then its entry (both atomic); returns the entry."""
    index = stats["index"]
    entry = {
        "name": manifest.shard_name(index),
        **stats,
        "bytes": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }
    storage.write_bytes(manifest.shard_path(output, index), payload)
    manifest.write_json(manifest.entry_path(output, index), entry)
    return entry
