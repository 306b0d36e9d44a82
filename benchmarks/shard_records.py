"""The shard stage on record corpora against the same sentences as text (issue 63's target: Parquet
or ``jsonl.zst`` within 1.3x of plain text's time on the same tokens), and the sentence splitter's
own cost per core.

    python benchmarks/shard_records.py --copies 8 [--json FILE]

The sample corpus, repeated ``--copies`` times, is cut into documents of 5-50 verses
(``benchmarks/record_corpus.py``) and written as Parquet (row groups of 200 documents) and JSON
Lines compressed with zstd; the text input is the sentences those documents split into, one per
line, so every run shards the same tokens. Whitespace tokenizer by default (the Moses tokenizer's
cost hides the reading's: ``--tokenizer moses``), ``dedup=false`` (the copies are kept), no Kneser-Ney pass. One embedded Ray
cluster of ``--workers`` CPUs for all runs, warmed up first; each format runs ``--repeats`` times,
in turn, and the job's seconds are timed (the cluster's start and stop are not).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import ray  # noqa: E402

from benchmarks.record_corpus import documents  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.formats.sentence_split import document_lines  # noqa: E402
from pipeline.shard.config import ShardConfig  # noqa: E402
from pipeline.shard.job import run_shard  # noqa: E402

SAMPLE = REPO / "pipeline" / "data" / "kjv-sample.txt.gz"


def write_inputs(copies: int, folder: Path) -> tuple[dict[str, Path], list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    with gzip.open(SAMPLE, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    docs = documents(lines * copies, seed=0)
    ids = [f"doc-{i}" for i in range(len(docs))]
    paths = {
        "text": folder / "sentences.txt",
        "parquet": folder / "docs.parquet",
        "jsonl.zst": folder / "docs.jsonl.zst",
    }
    paths["text"].write_text(document_lines(docs, split=True)[0], encoding="utf-8")
    pq.write_table(pa.table({"id": ids, "text": docs}), paths["parquet"], row_group_size=200)
    jsonl = "".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in zip(ids, docs, strict=True)).encode()
    paths["jsonl.zst"].write_bytes(zstandard.ZstdCompressor(level=3).compress(jsonl))
    return paths, docs


def splitter_rate(docs: list[str]) -> tuple[float, float]:
    """(documents' words per second, seconds) of the splitter alone, in this process (one core)."""
    words = sum(len(d.split()) for d in docs)
    started = time.perf_counter()
    document_lines(docs, split=True)
    seconds = time.perf_counter() - started
    return words / seconds, seconds


@ray.remote
def _warm_up() -> int:
    import pipeline.shard.passes  # noqa: F401

    time.sleep(0.5)
    return 0


def shard_once(path: Path, output: Path, workers: int, tokenizer: str) -> tuple[int, float]:
    cfg = load_config(
        ShardConfig,
        overrides=[
            f"input=['{path}']",
            f"output='{output}'",
            f"workers={workers}",
            "progress=false",
            "dedup=false",
            "kneser_ney_orders=[]",
            "wandb.mode=disabled",
            f"tokenizer={tokenizer}",
        ],
    )
    started = time.perf_counter()
    manifest = run_shard(cfg).details.manifest
    seconds = time.perf_counter() - started
    return manifest.totals["train"].tokens + manifest.totals["heldout"].tokens, seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokenizer", default="whitespace", help="whitespace (the reading's cost) or moses")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shard-records-") as tmp:
        folder = Path(tmp)
        paths, docs = write_inputs(args.copies, folder)
        rate, split_seconds = splitter_rate(docs)
        ray.init(num_cpus=args.workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        try:
            ray.get([_warm_up.remote() for _ in range(args.workers)])
            times: dict[str, list[float]] = {name: [] for name in paths}
            tokens: dict[str, int] = {}
            for repeat in range(args.repeats):
                for name, path in paths.items():
                    tokens[name], seconds = shard_once(
                        path, folder / f"out-{name}-{repeat}", args.workers, args.tokenizer
                    )
                    times[name].append(seconds)
        finally:
            ray.shutdown()
    text = statistics.median(times["text"])
    print(f"{len(docs):,} documents; splitter alone: {rate:,.0f} words/s on one core ({split_seconds:.1f} s)")
    print("| input | tokens | job seconds (each run) | tokens/s (median) | vs text |")
    print("|---|---|---|---|---|")
    rows = {}
    for name in paths:
        median = statistics.median(times[name])
        rows[name] = {"tokens": tokens[name], "seconds": times[name], "vs_text": median / text}
        print(
            f"| {name} | {tokens[name]:,} | {' / '.join(f'{s:.1f}' for s in times[name])} | "
            f"{tokens[name] / median:,.0f} | {median / text:.2f}x |"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "documents": len(docs),
                    "tokenizer": args.tokenizer,
                    "splitter_words_per_s": rate,
                    "runs": rows,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
