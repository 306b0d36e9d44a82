"""Throughput of the shard stage: tokens/s with 1 and 2 Ray workers next to a plain Python loop.

    python benchmarks/shard.py            # the sample corpus (~0.8M tokens)
    python benchmarks/shard.py --big      # also a synthetic corpus of >= 50M tokens (the sample
                                          # repeated); minutes on 2 cores, hence opt-in

The plain loop is the floor a Ray job is measured against: one process reads the corpus twice,
splits on whitespace, counts, builds the same vocabulary and writes tars of the same block format
(no held-out hashing, no shuffle, no UTF-8 accounting). Each Ray run gets its own embedded cluster
with exactly ``workers`` CPUs; the time is the shard job alone: it excludes starting that cluster
and its worker processes and shutting it down afterwards (fixed costs per cluster, which a job
submitted to a running cluster does not pay), reported separately as ``ray start s`` / ``ray stop s``.
Targets (issue 4): 2 workers >= 1.6x the 1-worker job; the 1-worker job within 1.5x of the plain
loop. Numbers from a shared machine are noisy; rerun on an idle one before drawing conclusions.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import ray

from pipeline.config import load_config
from pipeline.formats.shard_format import UNK, encode_joined_block, shard_name, tar_writer
from pipeline.shard.config import ShardConfig
from pipeline.shard.job import run_shard
from pipeline.shard.vocabulary import build_vocabulary
from pipeline.shard.writer import block_bounds

SAMPLE = Path(__file__).resolve().parent.parent / "pipeline" / "data" / "kjv-sample.txt.gz"
SHARD_TOKENS = 250_000
BLOCK_TOKENS = 4096


def _lines(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        yield from f


def plain_loop(path: Path, output: Path) -> int:
    """Count, build the vocabulary, write tars; single process. Returns tokens written."""
    counts: Counter = Counter()
    sentences = 0
    for line in _lines(path):
        tokens = line.split()
        if tokens:
            counts.update(tokens)
            sentences += 1
    vocab = build_vocabulary(counts, sentences)
    index, unk = vocab.index, vocab.index[UNK]
    output.mkdir(parents=True, exist_ok=True)
    (output / "vocab.txt").write_bytes(vocab.vocab_bytes)
    shard, written = 0, 0
    lines: list[str] = []
    ids: list[int] = []
    lengths: list[int] = []

    def flush() -> None:
        nonlocal shard, lines, ids, lengths
        with open(output / shard_name("train", shard), "wb") as f, tar_writer(f) as tar:
            starts = [0]
            for n in lengths:
                starts.append(starts[-1] + n)
            for b, (lo, hi) in enumerate(block_bounds(_array(lengths), BLOCK_TOKENS)):
                key = f"train-{shard:06d}-{b:06d}"
                tar.write(
                    encode_joined_block(lines[lo:hi], ids[starts[lo] : starts[hi]], lengths[lo:hi], key)
                )
        shard, lines, ids, lengths = shard + 1, [], [], []

    for line in _lines(path):
        tokens = line.split()
        if not tokens:
            continue
        lines.append(" ".join(tokens))
        ids.extend(index.get(t, unk) for t in tokens)
        lengths.append(len(tokens))
        written += len(tokens)
        if len(ids) >= SHARD_TOKENS:
            flush()
    if lines:
        flush()
    return written


def _array(values):
    import numpy as np

    return np.asarray(values, dtype=np.int32)


@ray.remote
def _warm_up() -> int:
    import pipeline.shard.passes  # noqa: F401  (numpy, webdataset, boto3: the worker's imports)

    time.sleep(0.5)  # held, so that each warm-up task lands on its own worker process
    return 0


def ray_job(path: Path, output: Path, workers: int) -> tuple[int, float, float, float]:
    """Run the shard job on an embedded cluster of ``workers`` CPUs; (tokens, job seconds, startup
    seconds, shutdown seconds).

    Startup (cluster start, worker processes, their imports) and shutdown are fixed costs per
    cluster, not per token, so they are measured apart: one warm-up task per worker runs before
    the clock starts, and the clock stops when the job returns."""
    started = time.perf_counter()
    ray.init(num_cpus=workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    ray.get([_warm_up.remote() for _ in range(workers)])
    startup = time.perf_counter() - started
    try:
        cfg = load_config(
            ShardConfig,
            overrides=[f"input=['{path}']", f"output='{output}'", f"workers={workers}", "progress=false"],
        )
        started = time.perf_counter()
        manifest = run_shard(cfg).details.manifest
        seconds = time.perf_counter() - started
    finally:
        stopping = time.perf_counter()
        ray.shutdown()
        shutdown = time.perf_counter() - stopping
    tokens = manifest.totals["train"].tokens + manifest.totals["heldout"].tokens
    return tokens, seconds, startup, shutdown


def make_big(target_tokens: int, directory: Path) -> Path:
    """The sample corpus repeated until it has at least ``target_tokens`` tokens (plain text)."""
    text = gzip.decompress(SAMPLE.read_bytes())
    per_copy = len(text.split())
    copies = -(-target_tokens // per_copy)
    path = directory / f"kjv-x{copies}.txt"
    with open(path, "wb") as f:
        for _ in range(copies):
            f.write(text)
    return path


def measure(name: str, path: Path, work: Path) -> list[tuple]:
    rows = []
    out = work / "plain"
    t0 = time.perf_counter()
    tokens = plain_loop(path, out)
    plain_s = time.perf_counter() - t0
    shutil.rmtree(out)
    rows.append((name, "plain loop", 1, tokens, plain_s, None))
    for workers in (1, 2):
        out = work / f"ray{workers}"
        tokens, seconds, startup, shutdown = ray_job(path, out, workers)
        shutil.rmtree(out)
        rows.append((name, "shard job", workers, tokens, seconds, (startup, shutdown)))
    return rows


def print_table(rows: list[tuple]) -> None:
    print(
        f"{'corpus':<14} {'method':<11} {'workers':>7} {'tokens':>11} {'seconds':>8} {'tokens/s':>10} "
        f"{'vs 1 worker':>11} {'plain/job per core':>18} {'ray start s':>11} {'ray stop s':>10}"
    )
    by_corpus: dict[str, dict] = {}
    for corpus, method, workers, tokens, seconds, _ in rows:
        by_corpus.setdefault(corpus, {})[(method, workers)] = tokens / seconds
    for corpus, method, workers, tokens, seconds, cluster in rows:
        rate = tokens / seconds
        rates = by_corpus[corpus]
        job = method == "shard job"
        speedup = f"{rate / rates[('shard job', 1)]:.2f}x" if job else ""
        per_core = f"{rates[('plain loop', 1)] / (rate / workers):.2f}x" if job else ""
        start, stop = (f"{cluster[0]:.1f}", f"{cluster[1]:.1f}") if job else ("", "")
        print(
            f"{corpus:<14} {method:<11} {workers:>7} {tokens:>11} {seconds:>8.2f} {rate:>10.0f} "
            f"{speedup:>11} {per_core:>18} {start:>11} {stop:>10}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", action="store_true", help="also run the synthetic >= 50M-token corpus")
    parser.add_argument("--big-tokens", type=int, default=50_000_000, help="size of the synthetic corpus")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shard-bench-") as tmp:
        work = Path(tmp)
        rows = measure("sample", SAMPLE, work)
        if args.big:
            big = make_big(args.big_tokens, work)
            rows += measure(f"synthetic {args.big_tokens // 1_000_000}M", big, work)
    print_table(rows)


if __name__ == "__main__":
    main()
