"""The Kneser-Ney baseline's cost per order on a shard directory: time and peak memory of each step.

    python benchmarks/kneser_ney.py SHARD_DIR                 # orders 2..5, one process each
    python benchmarks/kneser_ney.py SHARD_DIR --orders 3 5
    python benchmarks/kneser_ney.py SHARD_DIR --orders 3 5 --kenlm   # and KenLM's lmplz beside each

Each order runs in a fresh process (its peak resident memory is its own) doing what the shard
stage's tasks do, one after another and in one partition (the whole corpus: what
``kneser_ney.parts_for`` divides by the partitions), in memory rather than through sorted runs on
storage: count every training shard, merge the counts two at a time (the smallest first; the stage
merges a partition's runs in one k-way merge), estimate the model, score the held-out shards. The table gives seconds per
step (one core), the peak memory, the n-grams per order and the held-out perplexity; the bytes per
training token project the memory to a larger corpus (an upper bound: distinct n-grams grow
slower than the corpus).

``--kenlm``: after each order, KenLM's ``lmplz -o N`` (built by ``pipeline/tools/kenlm_build.py``) on
the same training text (the training shards' sentences, written out once), timed the same way
(wall seconds, peak memory from its own report; it uses the machine's threads and up to 40% of
its memory for sorting, ``-S 40%``), and its held-out
perplexity from KenLM's query module on the same targets: the relative difference to ours is the
agreement check at scale.
"""

from __future__ import annotations

import argparse
import heapq
import json
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.formats import kneser_ney, shard_format  # noqa: E402
from pipeline.formats.shard_manifest import ShardManifest, read_manifest  # noqa: E402
from pipeline.shard.baseline import _sentences, _Shard  # noqa: E402


def _shards(manifest: ShardManifest, split: str) -> list[_Shard]:
    return [
        _Shard(url, r.sha256, r.sentences, r.tokens)
        for url, r in zip(manifest.urls(split), manifest.shards[split], strict=True)
    ]


def measure(shard_dir: str, order: int) -> dict:
    """One order's steps, in this process, in one partition (the whole: what ``parts_for`` divides)."""
    manifest = read_manifest(shard_dir)
    vocab_size = manifest.vocab.size
    started = time.perf_counter()
    parts = [
        (s.tokens, i, kneser_ney.count_ngrams(*_sentences([s]), order))
        for i, s in enumerate(_shards(manifest, "train"))
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
    model = kneser_ney.estimate(adjusted.tables, statistics)
    del adjusted
    built = time.perf_counter()
    targets = kneser_ney.Targets.of(*_sentences(_shards(manifest, "heldout")), order, vocab_size)
    nll = kneser_ney.part_cost(model, targets, statistics)
    scored = time.perf_counter()
    return {
        "order": order,
        "train_tokens": manifest.totals["train"].tokens,
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


def write_training_text(shard_dir: str, path: Path) -> None:
    """The training split's sentences, one a line, as lmplz reads them."""
    manifest = read_manifest(shard_dir)
    with open(path, "w", encoding="utf-8") as out:
        for url, record in zip(manifest.urls("train"), manifest.shards["train"], strict=True):
            with shard_format.open_shard(url, record.sha256) as blocks:
                for block in blocks:
                    out.writelines(" ".join(sentence) + "\n" for sentence in block.sentences)


def measure_kenlm(shard_dir: str, text: Path, order: int, scratch: Path) -> dict:
    """lmplz on the training text, and its held-out perplexity on the shards' held-out targets."""
    from pipeline.tools.kenlm_build import find_or_build

    kenlm = find_or_build()
    started = time.perf_counter()
    report = kenlm.estimate(text, order, scratch / "model.arpa", scratch, memory="40%")
    seconds = time.perf_counter() - started
    rss = re.search(r"RSSMax:(\d+) kB", report)
    model = kenlm.query_module().Model(str(scratch / "model.arpa"))
    manifest = read_manifest(shard_dir)
    total, targets = 0.0, 0
    for url, record in zip(manifest.urls("heldout"), manifest.shards["heldout"], strict=True):
        with shard_format.open_shard(url, record.sha256) as blocks:
            for block in blocks:
                for sentence in block.sentences:
                    scores = [lp for lp, _, _ in model.full_scores(" ".join(sentence), bos=True, eos=True)]
                    total, targets = total + sum(scores), targets + len(scores)
    (scratch / "model.arpa").unlink()
    return {"seconds": seconds, "peak_gb": int(rss.group(1)) / 2**20 if rss else float("nan"),
            "perplexity": 10 ** (-total / targets), "targets": targets}  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shards", help="a shard directory (the shard stage's output)")
    parser.add_argument("--orders", type=int, nargs="+", default=[2, 3, 4, 5])
    parser.add_argument("--kenlm", action="store_true", help="KenLM's lmplz beside each order")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process: one order
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.shards, args.one)))
        return 0
    print(f"{'order':>5} {'count s':>8} {'merge s':>8} {'build s':>8} {'score s':>8} {'peak GB':>8} "
          f"{'B/token':>8} {'perplexity':>10}  n-grams per order")  # fmt: skip
    scratch = Path(tempfile.mkdtemp(prefix="kneser-ney-bench-"))
    text = scratch / "train.txt"
    if args.kenlm:
        write_training_text(args.shards, text)
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
        if args.kenlm:
            k = measure_kenlm(args.shards, text, order, scratch)
            ours = r["count_s"] + r["merge_s"] + r["build_s"] + r["score_s"]
            print(
                f"{'lmplz':>5} {k['seconds']:>8.1f} {'':>8} {'':>8} {'':>8} {k['peak_gb']:>8.2f} "
                f"{k['peak_gb'] * 2**30 / r['train_tokens']:>8.0f} {k['perplexity']:>10.1f}  "
                f"(ours: {ours:.1f} s in all; perplexity relative difference "
                f"{abs(r['perplexity'] - k['perplexity']) / k['perplexity']:.1e}, targets {k['targets']:,} / {r['targets']:,})",
                flush=True,
            )
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"training tokens {r['train_tokens']:,}; held-out targets {r['targets']:,}; one core each step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
