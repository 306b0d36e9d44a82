"""The output folder's names and its ``manifest.json`` (pure functions + one write).

Layout of a sharded output (local folder or s3 prefix)::

    embeddings-000000.hdf5 ...   one shard per ``lines_per_shard`` input lines (``.parquet`` with format=parquet)
    manifest.json                written last: every shard, totals, model, settings
    _progress/run.json           the settings of the run that owns this output
    _progress/embeddings-000000.json ...   one entry per complete shard (written after its shard)

A shard entry: ``name``, ``index``, ``first_line``, ``end_line`` (exclusive), ``sentences``, ``tokens``,
``empty_sentences``, ``invalid_utf8_lines``, ``control_char_lines``, ``split_sentences``, ``layers``,
``dtype``, ``layout`` (``allennlp`` or ``packed``), ``file_format`` (``hdf5`` or ``parquet``), ``pool``,
``model_sha256``, ``bytes``, ``sha256`` (of the shard file) and ``input_sha256`` (of the input lines it holds).
"""

from __future__ import annotations

import json
import re

from pipeline.embed.file_format import FORMATS
from pipeline.runtime import storage

FORMAT = "elmo-embeddings/1"
MANIFEST_FILE = "manifest.json"
PROGRESS_DIR = "_progress"
RUN_FILE = "run.json"
COUNTED = (
    "sentences",
    "tokens",
    "empty_sentences",
    "invalid_utf8_lines",
    "control_char_lines",
    "split_sentences",
    "bytes",
)
"""Entry fields summed into ``totals`` (a field missing from an entry, written by an older
version of the stage, counts 0)."""


RUN_DEFAULTS = {"precision": "float32", "pool": "none", "layout": "allennlp", "file_format": "hdf5"}
"""Run settings added after ``run.json`` was first written: an older run had these values."""


def with_defaults(run: dict) -> dict:
    """``run`` (a ``run.json``) with ``RUN_DEFAULTS`` for the settings an older version did not record."""
    return {**RUN_DEFAULTS, **run}


SHARD_NAME = re.compile(rf"embeddings-(\d{{6,}})\.({'|'.join(FORMATS)})")
"""A shard's file name, as ``EmbeddingFormat.file_name`` spells it: its index and its format's suffix."""
ENTRY_NAME = re.compile(r"embeddings-(\d{6,})\.json")
"""A shard's progress record under ``_progress/``."""


def progress_dir(output: str) -> str:
    return storage.join(output, PROGRESS_DIR)


def entry_path(output: str, index: int) -> str:
    return storage.join(output, PROGRESS_DIR, f"embeddings-{index:06d}.json")  # ENTRY_NAME


def run_path(output: str) -> str:
    return storage.join(output, PROGRESS_DIR, RUN_FILE)


def manifest_path(output: str) -> str:
    return storage.join(output, MANIFEST_FILE)


def totals(entries: list[dict]) -> dict:
    """Sums of the counted fields, plus the number of shards."""
    out = {key: sum(int(e.get(key, 0)) for e in entries) for key in COUNTED}
    out["shards"] = len(entries)
    return out


def build_manifest(run: dict, model: dict, entries: list[dict], config: dict) -> dict:
    """The manifest document: ``run`` settings, ``model`` (paths, sha256, dims), shards in line order."""
    ordered = sorted(entries, key=lambda e: e["index"])
    run = with_defaults(run)
    return {
        "format": FORMAT,
        "layers": run["layers"],
        "dtype": run["dtype"],
        "layout": run["layout"],
        "file_format": run["file_format"],
        "pool": run["pool"],
        "precision": run["precision"],
        "stateful": run["stateful"],
        "lines_per_shard": run["lines_per_shard"],
        "input": run["input"],
        "model": model,
        "totals": totals(ordered),
        "shards": ordered,
        "config": config,
    }


def write_json(path: str, document: dict) -> None:
    storage.write_bytes(path, (json.dumps(document, indent=2, sort_keys=False) + "\n").encode("utf-8"))
