"""What a shard directory records about itself: the plan (written after counting) and the
manifest (written last).

A run is identified by its *identity*: the content-relevant config (everything except
:data:`pipeline.shard.config.RUNTIME_KEYS`), the input paths and their versions (size and
modification time, or ETag on S3). Reruns compare identities:

- ``manifest.json`` present with the same identity: the output is complete; nothing to do.
- ``shard_plan.json`` present with the same identity (a killed run): the counting pass and the
  vocabulary are reused, and shards already written are kept (writes are atomic, so a shard file
  under its final name is whole; the plan fixes its content, so it is the right one).
- anything else under a different identity: refused, rather than mixing two corpora.

JSON is written with sorted keys and fixed indentation, so equal content gives equal bytes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.formats.shard_format import COUNTS_FILE, MANIFEST_FILE, SPLITS, VOCAB_FILE
from pipeline.formats.shard_manifest import FORMAT_VERSION, SplitTotals
from pipeline.output_folder import LEASE_FILE, OwnFiles
from pipeline.shard.baseline import ARPA_FILE
from pipeline.shard.config import RUNTIME_KEYS, record_defaults
from pipeline.shard.duplicates import DROPS_FOLDER
from pipeline.shard.passes import ChunkSummary
from pipeline.shard.sentences import LineStats
from pipeline.shard.sorted_runs import SCRATCH_PATTERN
from pipeline.shard.vocabulary import Vocabulary
from pipeline.shard.writer import ShardRecord
from pipeline.tracking.offline_files import RUNS_PATTERN

RUN_FILE = "shard_run.json"
"""The run's identity, written before anything else: it makes the folder this stage's
(``pipeline/output_folder.py``), and a rerun with another identity is refused."""
PLAN_FILE = "shard_plan.json"
"""Record of the counting pass (identity, chunk summaries, vocabulary hash), written before any
shard and kept after the manifest; unlike the shards and manifest it depends on ``chunk_bytes``."""


OWN_FILES = OwnFiles(
    "shard",
    RUN_FILE,
    re.compile(
        "|".join(
            re.escape(n)
            for n in (RUN_FILE, PLAN_FILE, MANIFEST_FILE, VOCAB_FILE, COUNTS_FILE, LEASE_FILE, ARPA_FILE)
        )
        + rf"|({'|'.join(SPLITS)})-\d{{6,}}\.tar|{DROPS_FOLDER}/chunk-\d{{6,}}\.u32|{SCRATCH_PATTERN}|{RUNS_PATTERN}|\.write-probe"
    ),
)
"""What the stage writes into its output; a folder with anything else is refused."""


def encode_json(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


IDENTITY_KEYS = ("config", "inputs", "heldout_inputs", "input_versions")


def run_identity(
    config: Mapping[str, Any],
    inputs: Sequence[str],
    heldout_inputs: Sequence[str],
    versions: Mapping[str, dict],
) -> dict:
    """The part of a run that determines its output bytes: the content-relevant config, the input
    paths and each input's version (``versions``: path -> ``storage.version``; an edited corpus is
    another run's)."""
    defaults = record_defaults()
    content = {
        k: v for k, v in config.items() if k not in RUNTIME_KEYS and not (k in defaults and v == defaults[k])
    }
    return {
        "config": content,
        "inputs": list(inputs),
        "heldout_inputs": list(heldout_inputs),
        "input_versions": {path: dict(versions[path]) for path in [*inputs, *heldout_inputs]},
    }


def identity_of(record: Mapping[str, Any]) -> dict:
    """The identity stored in a plan or manifest."""
    return {k: record.get(k) for k in IDENTITY_KEYS}


def build_plan(identity: dict, chunk_bytes: int, chunks: Sequence[ChunkSummary], vocab: Vocabulary) -> dict:
    return {
        **identity,
        "format_version": FORMAT_VERSION,
        "chunk_bytes": chunk_bytes,
        "chunks": [c.to_dict() for c in chunks],
        "vocab_sha256": vocab.sha256,
    }


def plan_chunks(plan: Mapping[str, Any], identity: dict, chunk_bytes: int) -> list[ChunkSummary] | None:
    """The plan's chunk summaries when it belongs to this run (same identity and chunking), else None."""
    if identity_of(plan) != identity or plan.get("chunk_bytes") != chunk_bytes:
        return None
    if plan.get("format_version") != FORMAT_VERSION:
        return None
    return [ChunkSummary.from_dict(c) for c in plan["chunks"]]


def input_records(paths: Sequence[str], main_sources: int, chunks: Sequence[ChunkSummary]) -> list[dict]:
    """Per input file: path, role and its line accounting."""
    per_source = [LineStats() for _ in paths]
    for chunk in chunks:
        per_source[chunk.source].add(chunk.stats)
    return [
        {"path": path, "role": "train+heldout" if i < main_sources else "heldout", **_line_record(stats)}
        for i, (path, stats) in enumerate(zip(paths, per_source, strict=True))
    ]


def _line_record(stats: LineStats) -> dict:
    return {
        "lines": stats.lines,
        "sentences": {"train": stats.train_sentences, "heldout": stats.heldout_sentences},
        "skipped": {"empty": stats.empty, "overlong": stats.overlong},
        "duplicates": {
            "train": {"sentences": stats.train_duplicates, "tokens": stats.train_duplicate_tokens},
            "heldout": {"sentences": stats.heldout_duplicates, "tokens": stats.heldout_duplicate_tokens},
        },
        "invalid_utf8_replaced": stats.invalid_utf8,
        "control_chars_replaced": stats.control_chars,
        # documents only where some were split (record corpora): a text corpus's record is as before
        **(
            {
                "documents": stats.documents,
                "records_skipped": stats.records_skipped,
                **({"first_skipped_record": stats.first_skipped_record} if stats.records_skipped else {}),
            }
            if stats.documents or stats.records_skipped
            else {}
        ),
    }


def build_manifest(
    identity: dict,
    paths: Sequence[str],
    main_sources: int,
    chunks: Sequence[ChunkSummary],
    vocab: Vocabulary,
    distinct_train_tokens: int,
    shards: Mapping[str, Sequence[ShardRecord]],
    baselines: Mapping[str, Any],
) -> dict:
    """The manifest of a finished run, as written (see docs/architecture.md for the fields other
    stages use; they read it as a ``pipeline.formats.shard_manifest.ShardManifest``).
    ``baselines``: the held-out baselines beyond the shard records' unigram (pipeline.formats.kneser_ney).

    ``lines.read == lines.sentences.train + lines.sentences.heldout + sum(lines.skipped)
    + lines.duplicates.train.sentences + lines.duplicates.heldout.sentences``.
    """
    total = LineStats()
    for chunk in chunks:
        total.add(chunk.stats)
    totals = {}
    for split in SPLITS:
        records = shards[split]
        totals[split] = {
            "sentences": sum(r.sentences for r in records),
            "tokens": sum(r.tokens for r in records),
            "shards": len(records),
            "blocks": sum(r.blocks for r in records),
            "unk_tokens": sum(r.unk_tokens for r in records),
            "bytes": sum(r.bytes for r in records),
        }
        split_total = totals[split]
        split_total["unk_rate"] = SplitTotals(
            split_total["sentences"], split_total["tokens"], split_total["unk_tokens"], len(records)
        ).unk_rate
    lines = _line_record(total)
    lines["read"] = lines.pop("lines")
    lines["longest_sentence_tokens"] = total.max_sentence_tokens
    return {
        **identity,
        "format_version": FORMAT_VERSION,
        "inputs_detail": input_records(paths, main_sources, chunks),
        "lines": lines,
        "vocab": {
            "file": VOCAB_FILE,
            "counts_file": COUNTS_FILE,
            "size": vocab.size,
            "sha256": vocab.sha256,
            "distinct_train_tokens": distinct_train_tokens,
        },
        "shards": {split: [r.to_dict() for r in shards[split]] for split in SPLITS},
        "totals": totals,
        "baselines": dict(baselines),
    }
