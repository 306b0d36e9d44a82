"""Exactly-once output: committing shards, and finding what a previous run already finished.

A shard is committed in two atomic writes: its file (HDF5 or Parquet, the run's format), then its
entry under ``_progress/``. A
shard counts as complete only when its entry exists (so a job killed between the two writes redoes
that shard, overwriting the file atomically), its input hash matches, and, with ``verify``, the
file's sha256 matches the entry (a damaged file is redone). Shard k always holds the same lines, so
whatever the order of kills and reruns, the finished output holds every input line exactly once.

``_progress/run.json`` pins the settings that decide the vectors (input, model hash, layers, dtype,
...): a rerun with different ones is refused instead of mixing two kinds of vectors in one output.

Before any of that, an output this stage does not own is refused (:func:`check_output`): a folder
(or prefix) that holds anything but this stage's own files (a shard directory, a user's files, stray
shards without ``_progress/run.json``), or an existing single file unless ``overwrite``. A run that
fails before committing a shard takes its claim back (``output_folder.taken_back_on_failure``, every
stage's lifecycle), so it leaves neither ``run.json`` nor a folder of its own making.
"""

from __future__ import annotations

import json
import os
import re

from pipeline.embed import manifest
from pipeline.embed.errors import EmbedError
from pipeline.embed.file_format import EmbeddingFormat
from pipeline.embed.inputs import ShardSpec
from pipeline.embed.shard_vectors import ShardVectors
from pipeline.formats import shard_format, shard_manifest
from pipeline.output_folder import (
    OwnFiles,
    check_owned,
    read_marker,
)
from pipeline.runtime import storage
from pipeline.tracking.offline_files import RUNS_PATTERN

OWN_FILES = OwnFiles(
    "embed",
    f"{manifest.PROGRESS_DIR}/{manifest.RUN_FILE}",
    re.compile(
        rf"({manifest.SHARD_NAME.pattern}|{re.escape(manifest.MANIFEST_FILE)}|{RUNS_PATTERN}"
        rf"|{re.escape(manifest.PROGRESS_DIR)}/({re.escape(manifest.RUN_FILE)}|{manifest.ENTRY_NAME.pattern}|\.write-probe))"
    ),
)
"""The files this stage writes into an output (``pipeline/output_folder.py``)."""


def check_output(output: str, folder: str, single: bool, overwrite: bool) -> None:
    """Refuse an output this stage does not own (EmbedError, one line), before anything is written:
    ``output`` as the user named it, ``folder`` where the shards go (``output`` itself, or the parts
    folder of a single-file output). See :func:`check_single_file` and :func:`check_own_folder`."""
    try:
        if single:
            check_single_file(output, overwrite)
        check_own_folder(folder)
    except storage.StorageError as err:
        check_writable(folder)  # the usual causes (no bucket, denied, unreachable), said as always
        raise EmbedError(f"output {output} cannot be listed: {err}") from None


def check_single_file(output: str, overwrite: bool) -> None:
    """Single-file mode: refuse an ``output`` that is a folder, or that exists unless ``overwrite``
    (EmbedError, one line). The parts folder is checked by :func:`check_own_folder`."""
    if (not storage.is_s3(output) and os.path.isdir(output)) or storage.list_names(output):
        raise EmbedError(
            f"output {output} is a folder, not a file; name a new .hdf5 file, or the folder without the suffix"
        )
    if storage.exists(output) and not overwrite:
        raise EmbedError(
            f"output {output} already exists; pass --overwrite (overwrite=true) to replace it, or choose another path"
        )


def check_own_folder(output: str) -> None:
    """Refuse a folder/prefix that holds files this stage did not write, or its files without the
    ``_progress/run.json`` that makes them a resumable run (``output_folder.check_owned``); a shard
    directory is named as such. New or empty: fine."""
    if manifest.MANIFEST_FILE in storage.list_names(output):
        _check_own_manifest(output)
    check_owned(output, OWN_FILES, EmbedError)


def _check_own_manifest(output: str) -> None:
    """Refuse a ``manifest.json`` that is not this stage's (the shard stage's, above all)."""
    path = manifest.manifest_path(output)
    data = storage.read_bytes(path)
    try:
        document = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        document = None
    if manifest.schema_of(document) is not None:
        return
    try:
        shard_manifest.parse_manifest(data, output)
    except shard_format.FormatError:
        raise EmbedError(
            f"output {output} holds a {manifest.MANIFEST_FILE} that elmo embed did not write; "
            "choose an empty or new output folder"
        ) from None
    raise EmbedError(
        f"output {output} is a shard directory (its {manifest.MANIFEST_FILE} is the shard stage's); "
        "write the embeddings to another folder"
    )


def check_writable(output: str) -> None:
    """Fail fast when the output cannot be written (missing bucket, denied, unreachable endpoint)."""
    try:
        storage.probe_writable(manifest.progress_dir(output))
    except storage.StorageError as err:
        raise EmbedError(f"output is not writable: {err}") from None


def claim_output(output: str, run: dict) -> bool:
    """Record ``run`` as the owner of ``output``; True when an earlier run with the same settings is resumed.

    EmbedError when the output holds a run with other settings, naming the first difference. A
    first-schema run (``manifest.current``) counts the settings it did not record as their defaults.
    """
    path = manifest.run_path(output)
    if storage.exists(path):
        previous = manifest.current(read_marker(output, OWN_FILES, EmbedError))
        current = manifest.current(run)
        for key in sorted(set(current) | set(previous)):
            if previous.get(key) != current.get(key):
                raise EmbedError(
                    f"output {output} holds a run with other settings ({key}: {previous.get(key)!r}, now {current.get(key)!r}); "
                    "use another output or delete it"
                )
        return True
    manifest.write_json(path, run)
    return False


def _entry_ok(output: str, entry: dict, verify: bool, fmt: EmbeddingFormat) -> bool:
    path = fmt.path(output, entry["index"])
    if not storage.exists(path):
        return False
    return not verify or storage.sha256(path) == entry["sha256"]


def _well_formed(entry: object, index: int, schema: str) -> bool:
    """Whether ``entry`` is a shard record as ``commit_shard`` writes it, for shard ``index``, in
    the output's ``schema`` (a first-schema entry may lack counts added later)."""
    if not (
        isinstance(entry, dict)
        and entry.get("index") == index
        and all(isinstance(entry.get(k), str) for k in ("name", "sha256", "input_sha256"))
    ):
        return False
    counts = [entry.get(k) for k in manifest.COUNTED]
    if schema == manifest.FIRST_SCHEMA:
        counts = [c for c in counts if c is not None]
    return all(type(c) is int and c >= 0 for c in counts)


def complete_shards(
    output: str, specs: list[ShardSpec], verify: bool, fmt: EmbeddingFormat
) -> dict[int, dict]:
    """Entries of the shards a previous run finished in the run's format ``fmt`` (index -> entry),
    checked against ``specs``. A first-schema output's entries get the counts they lack as 0
    (``manifest.COUNTED``); an entry of this schema that lacks one is redone."""
    schema = manifest.schema_of(read_marker(output, OWN_FILES, EmbedError))
    found: dict[int, dict] = {}
    for path in storage.list_prefix(manifest.progress_dir(output) + "/"):
        match = manifest.ENTRY_NAME.fullmatch(path.rsplit("/", 1)[-1])
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
        if not _well_formed(entry, index, schema):
            continue  # not a record commit_shard wrote ([], {}, torn): redone the same way
        spec = specs[index]
        if entry.get("input_sha256") != spec.input_sha256:
            raise EmbedError(
                f"output {output}: input lines {spec.first_line}-{spec.first_line + spec.num_lines - 1} changed "
                "since the previous run; use another output or delete it"
            )
        if _entry_ok(output, entry, verify, fmt):
            found[index] = {**dict.fromkeys(manifest.COUNTED, 0), **entry}
    return found


def commit_shard(output: str, stats: dict, shard: ShardVectors, fmt: EmbeddingFormat) -> dict:
    """Write a shard in the run's format ``fmt`` (bound to its layout; hashed as it is written),
    then its entry (both atomic); returns the entry. The output folder is the run's claim's: a commit never
    creates it, so a folder moved away mid-run is not re-created without its ``run.json``."""
    if not storage.is_s3(output) and not os.path.exists(output):
        raise EmbedError(
            f"output {output}: the folder is gone (moved or deleted while the run wrote it), and a commit "
            "never creates it: move it back and rerun, or rerun into a new output"
        )
    index = stats["index"]
    with storage.open_write(fmt.path(output, index)) as out:
        digest = fmt.write(shard, out)
        size = out.tell()
    entry = {"name": fmt.file_name(index), **stats, "bytes": size, "sha256": digest}
    manifest.write_json(manifest.entry_path(output, index), entry)
    return entry
