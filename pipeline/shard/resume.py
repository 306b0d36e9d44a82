"""What a shard run finds in its output and reuses: the manifest and plan of a run with the same
identity, the vocabulary it wrote, and the counting pass's kept chunks.

A rerun with the same inputs and settings (its *identity*, recorded first in ``shard_run.json``) is
safe everywhere: a complete output is left alone, a plan (the counting pass's result, written
before any shard) spares the counting pass, a vocabulary that matches the plan spares rebuilding
it, and shards already written under their final names are described and kept
(``job._reusable_shards``). An output that holds another run's files, anyone else's files, or this
stage's file names without ``shard_run.json``, is refused, never overwritten
(``pipeline/output_folder.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from pipeline.formats.shard_format import (
    COUNTS_FILE,
    MANIFEST_FILE,
    VOCAB_FILE,
    FormatError,
    read_counts,
    read_vocab,
)
from pipeline.formats.shard_manifest import ShardManifest, parse_manifest
from pipeline.output_folder import check_owned
from pipeline.runtime import storage
from pipeline.shard.errors import ShardError
from pipeline.shard.manifest import OWN_FILES, PLAN_FILE, RUN_FILE, encode_json, identity_of
from pipeline.shard.passes import ChunkSummary
from pipeline.shard.reader import Reading, iter_chunks
from pipeline.shard.vocabulary import Vocabulary


def output_prefix(output: str) -> str:
    return output.rstrip("/") + "/"


def inspect_output(output: str, identity: dict) -> tuple[ShardManifest | None, dict | None]:
    """``(manifest, plan)`` already in ``output`` for this run; ShardError when the output is not
    this stage's (``OWN_FILES``) or holds another run's shards."""
    if not check_owned(output, OWN_FILES, ShardError):
        return None, None
    run_path = storage.join(output, RUN_FILE)
    try:
        claimed = json.loads(storage.read_bytes(run_path))
    except (UnicodeDecodeError, json.JSONDecodeError):
        claimed = None
    if not isinstance(claimed, dict):
        raise ShardError(f"{run_path} is damaged (not a JSON object); delete the output {output} and rerun")
    check_identity(identity_of(claimed), identity, run_path)
    manifest_path, plan_path = storage.join(output, MANIFEST_FILE), storage.join(output, PLAN_FILE)
    manifest = plan = None
    if storage.exists(manifest_path):
        data = storage.read_bytes(manifest_path)
        manifest = parse_manifest(data, output)
        check_identity(identity_of(json.loads(data)), identity, manifest_path)
    if storage.exists(plan_path):
        try:
            plan = json.loads(storage.read_bytes(plan_path).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            plan = None
        if not isinstance(plan, dict) or "config" not in plan or "chunks" not in plan:
            plan = None  # a plan is only a cache of the counting pass: an unreadable one means recount
        else:
            check_identity(identity_of(plan), identity, plan_path)
    return manifest, plan


def claim_output(output: str, identity: dict) -> None:
    """Write the run's marker (``RUN_FILE``) unless the output holds it: before anything else."""
    path = storage.join(output, RUN_FILE)
    if not storage.exists(path):
        storage.write_bytes(path, encode_json(identity))


def check_identity(found: dict, wanted: dict, path: str) -> None:
    if found == wanted:
        return
    differing = sorted(
        [
            k
            for k in set(found["config"] or {}) | set(wanted["config"])
            if (found["config"] or {}).get(k) != wanted["config"].get(k)
        ]
        + [k for k in ("inputs", "heldout_inputs") if found[k] != wanted[k]]
    )
    if not differing:  # the same paths and settings: an input was edited since (or an older run's record)
        edited = [
            p
            for p in wanted["input_versions"]
            if (found["input_versions"] or {}).get(p) != wanted["input_versions"][p]
        ]
        raise ShardError(
            f"{path} belongs to a run of other input versions ({edited[0] if edited else 'unrecorded'} "
            "changed since: size, modification time or ETag); use another output, or delete the old one "
            "to shard the corpus as it is now"
        )
    raise ShardError(
        f"{path} belongs to a run with different {', '.join(differing)}; "
        "use another output or delete the old one"
    )


def is_complete(manifest: ShardManifest) -> bool:
    """Every file the manifest lists is in its directory."""
    present = set(storage.list_prefix(output_prefix(manifest.folder)))
    return all(storage.join(manifest.folder, n) in present for n in manifest.files())


def read_vocabulary(output: str, expected_sha: str) -> Vocabulary | None:
    """The vocabulary an earlier run of this plan wrote, or None when it is missing or differs."""
    vocab_path, counts_path = storage.join(output, VOCAB_FILE), storage.join(output, COUNTS_FILE)
    if not (storage.exists(vocab_path) and storage.exists(counts_path)):
        return None
    try:
        tokens = read_vocab(vocab_path)
        counts = [count for _, count in read_counts(counts_path)]
    except FormatError:
        return None
    vocab = Vocabulary(tokens, counts)
    return vocab if vocab.sha256 == expected_sha and len(counts) == len(tokens) else None


def chunk_sources(
    paths, reading: Reading, chunks: Sequence[ChunkSummary], feeding: set[int], kept: dict
) -> Iterator[tuple[int, Any]]:
    """``(chunk index, source)`` for the chunks in ``feeding``, in order: the source is the
    counting pass's ObjectRef when it was kept (taken out of ``kept``, so the object store frees
    it once its pieces are cut), else the chunk read again. Only inputs holding a chunk that was
    not kept are read."""
    for index in [i for i in kept if i not in feeding]:
        del kept[index]  # feeds only shards already written
    first: dict[int, int] = {}  # input -> index of its first chunk
    for chunk in chunks:
        first.setdefault(chunk.source, chunk.index)
    by_source: dict[int, list[int]] = {}
    for index in sorted(feeding):
        by_source.setdefault(chunks[index].source, []).append(index)
    for source, indices in sorted(by_source.items()):
        if all(i in kept for i in indices):
            yield from ((i, kept.pop(i)) for i in indices)
            continue
        reader = iter_chunks([paths[source]], reading, first[source], source)
        for chunk in reader:
            if chunk.index >= len(chunks) or chunks[chunk.index].source != source:
                raise ShardError(f"input {source} changed between the counting and writing passes (it grew)")
            if chunk.index in feeding:
                yield chunk.index, kept.pop(chunk.index, chunk)
