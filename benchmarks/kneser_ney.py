"""The Kneser-Ney baseline's cost per order on a shard directory: time and peak memory of each step.

    python benchmarks/kneser_ney.py SHARD_DIR                 # orders 2..5, one process each
    python benchmarks/kneser_ney.py SHARD_DIR --orders 3 5

Each order runs in a fresh process (its peak resident memory is its own) doing what the shard
stage's tasks do, one after another and in one partition (the whole corpus: what
``kneser_ney.parts_for`` divides by the partitions): count every training shard, merge the counts
two at a time (the smallest first), estimate the model, score the held-out shards. The table gives seconds per
step (one core), the peak memory, the n-grams per order and the held-out perplexity; the bytes per
training token project the memory to a larger corpus (an upper bound: distinct n-grams grow
slower than the corpus).
"""

from __future__ import annotations

import argparse
import heapq
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.formats import kneser_ney, shard_format  # noqa: E402
from pipeline.shard.baseline import _sentences, _Shard  # noqa: E402


def _shards(shard_dir: str, manifest: dict, split: str) -> list[_Shard]:
    urls = shard_format.shard_urls(shard_dir, split, manifest)
    return [
        _Shard(url, r["sha256"], r["sentences"], r["tokens"])
        for url, r in zip(urls, manifest["shards"][split], strict=True)
    ]


def measure(shard_dir: str, order: int) -> dict:
    """One order's steps, in this process, in one partition (the whole: what ``parts_for`` divides)."""
    manifest = shard_format.read_manifest(shard_dir)
    vocab_size = manifest["vocab"]["size"]
    started = time.perf_counter()
    parts = [
        (s.tokens, i, kneser_ney.count_ngrams(*_sentences([s]), order))
        for i, s in enumerate(_shards(shard_dir, manifest, "train"))
    ]
    counted = time.perf_counter()
    heapq.heapify(parts)
    tie = len(parts)
    while len(parts) > 1:
        (a_tokens, _, a), (b_tokens, _, b) = heapq.heappop(parts), heapq.heappop(parts)
        heapq.heappush(parts, (a_tokens + b_tokens, tie, kneser_ney.merge_counts(a, b)))
        tie += 1
        del a, b
    merged = time.perf_counter()
    counts = parts.pop()[2]
    counts_bytes = counts.nbytes
    adjusted = kneser_ney.adjust(counts, vocab_size)
    del counts
    statistics = kneser_ney.global_statistics([adjusted])
    model = kneser_ney.estimate(adjusted, statistics)
    del adjusted
    built = time.perf_counter()
    targets = kneser_ney.Targets.of(*_sentences(_shards(shard_dir, manifest, "heldout")), order, vocab_size)
    nll = kneser_ney.part_cost(model, targets, statistics)
    scored = time.perf_counter()
    return {
        "order": order,
        "train_tokens": manifest["totals"]["train"]["tokens"],
        "count_s": counted - started,
        "merge_s": merged - counted,
        "build_s": built - merged,
        "score_s": scored - built,
        "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "counts_gb": counts_bytes / 2**30,
        "ngrams": [int((statistics.unigram_counts > 0).sum()), *model.ngrams],
        "perplexity": kneser_ney.perplexity(nll, int(targets.words.shape[0])),
        "targets": int(targets.words.shape[0]),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shards", help="a shard directory (the shard stage's output)")
    parser.add_argument("--orders", type=int, nargs="+", default=[2, 3, 4, 5])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process: one order
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.shards, args.one)))
        return 0
    print(f"{'order':>5} {'count s':>8} {'merge s':>8} {'build s':>8} {'score s':>8} {'peak GB':>8} "
          f"{'B/token':>8} {'perplexity':>10}  n-grams per order")  # fmt: skip
    for order in args.orders:
        child = subprocess.run(
            [sys.executable, __file__, args.shards, "--one", str(order)],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(child.stdout.splitlines()[-1])
        per_token = r["peak_gb"] * 2**30 / r["train_tokens"]
        print(
            f"{order:>5} {r['count_s']:>8.1f} {r['merge_s']:>8.1f} {r['build_s']:>8.1f} {r['score_s']:>8.1f} "
            f"{r['peak_gb']:>8.2f} {per_token:>8.0f} {r['perplexity']:>10.1f}  {', '.join(f'{n:,}' for n in r['ngrams'])}",
            flush=True,
        )
    print(f"training tokens {r['train_tokens']:,}; held-out targets {r['targets']:,}; one core each step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
