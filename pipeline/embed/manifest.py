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

SCHEMA = "elmo-embeddings/2"
"""The schema of this stage's ``run.json`` and ``manifest.json``, under the key ``schema``."""
FIRST_SCHEMA = "elmo-embeddings/1"
"""The first schema, under the key ``format`` (which the config uses for the file format); its
records may lack the settings of ``RUN_DEFAULTS``, added later."""
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
"""Entry fields summed into ``totals``: every entry has them (``resume.complete_shards`` gives a
first-schema entry the ones it lacks as 0)."""


RUN_DEFAULTS = {"precision": "float32", "pool": "none", "layout": "allennlp", "file_format": "hdf5"}
"""Run settings added during the first schema: a first-schema run that does not record one had this
value."""


def schema_of(document: object) -> str | None:
    """The schema of a ``run.json`` or ``manifest.json`` document this stage wrote, None for any
    other document."""
    if not isinstance(document, dict):
        return None
    if document.get("schema") == SCHEMA:
        return SCHEMA
    if "schema" not in document and document.get("format") == FIRST_SCHEMA:
        return FIRST_SCHEMA
    return None


def current(document: dict) -> dict:
    """A ``run.json`` or ``manifest.json`` document in this schema: a first-schema one gets its key
    renamed and ``RUN_DEFAULTS`` for the settings it did not record (the only schema that may lack
    them); one in this schema is as it is."""
    if schema_of(document) != FIRST_SCHEMA:
        return dict(document)
    recorded = {k: v for k, v in document.items() if k != "format"}
    return {"schema": SCHEMA, **RUN_DEFAULTS, **recorded}


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
    out = {key: sum(e[key] for e in entries) for key in COUNTED}
    out["shards"] = len(entries)
    return out


def build_manifest(
    run: dict, model: dict, entries: list[dict], config: dict, records: dict | None = None
) -> dict:
    """The manifest document: ``run`` settings, ``model`` (paths, sha256, dims), shards in line
    order; ``records``: a record corpus's counts (``record_inputs.RecordCounts``)."""
    ordered = sorted(entries, key=lambda e: e["index"])
    run = current(run)
    return {
        "schema": SCHEMA,
        "layers": run["layers"],
        "dtype": run["dtype"],
        "layout": run["layout"],
        "file_format": run["file_format"],
        "pool": run["pool"],
        **({"pool_over": run["pool_over"]} if "pool_over" in run else {}),
        "precision": run["precision"],
        "stateful": run["stateful"],
        "lines_per_shard": run["lines_per_shard"],
        "input": run["input"],
        "model": model,
        "totals": totals(ordered),
        **({"records": records} if records is not None else {}),
        "shards": ordered,
        "config": config,
    }


def write_json(path: str, document: dict) -> None:
    storage.write_bytes(path, (json.dumps(document, indent=2, sort_keys=False) + "\n").encode("utf-8"))
