"""Shard boundaries off the step: per-step time around shard boundaries with the next shard read when
the stream reaches it, read ahead in a thread, and read ahead in a process, on synthetic shards in the
shard format. A step is ``next(batches)`` plus a stand-in for the device's step (``--boundary-step-ms``
of sleep: on a GPU the host waits for the device with the GIL released).

    python benchmarks/shard_boundaries.py
    python benchmarks/shard_boundaries.py --boundary-steps 900 --boundary-sentences 60000
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.step_setup import synthetic_cache  # noqa: E402
from pipeline.formats import shard_format  # noqa: E402
from pipeline.formats.shard_manifest import ShardManifest  # noqa: E402
from pipeline.runtime import storage  # noqa: E402
from pipeline.train.data import open_lm_batches  # noqa: E402
from pipeline.train.sentence_source import ReadAhead  # noqa: E402
from pipeline.train.shard_reading import read_shard_sentences  # noqa: E402


def write_synthetic_shards(
    root: str, n_shards: int, sentences: int, vocab: int, seed: int = 0
) -> ShardManifest:
    """``n_shards`` train shards of ``sentences`` Zipf(1.1) sentences of 5..44 words ``w<id>`` each
    (blocks of 1000), in the shard format; returns the manifest (none is written: pass it on)."""
    rng = np.random.default_rng(seed)
    words = np.array(["<S>", "</S>", "<UNK>", *(f"w{i}" for i in range(vocab - 3))], dtype=object)
    vocab_bytes = shard_format.encode_vocab(list(words))
    storage.write_bytes(os.path.join(root, shard_format.VOCAB_FILE), vocab_bytes)
    entries = []
    for s in range(n_shards):
        name, tokens = shard_format.shard_name("train", s), 0
        with storage.open_write(os.path.join(root, name)) as f:
            writer = shard_format.tar_writer(f)
            for b, start in enumerate(range(0, sentences, 1000)):
                lengths = rng.integers(5, 45, size=min(1000, sentences - start)).astype(np.int32)
                ids = np.minimum(rng.zipf(1.1, size=int(lengths.sum())) + 2, vocab - 1).astype(np.int32)
                ends = np.cumsum(lengths)
                text = "".join(
                    " ".join(words[ids[e - n : e]]) + "\n" for e, n in zip(ends, lengths, strict=True)
                )
                key = shard_format.block_key("train", s, b)
                writer.write(shard_format.encode_text_block(text.encode(), ids, lengths, key))
                tokens += int(lengths.sum())
            writer.close()
        digest = hashlib.sha256(storage.read_bytes(os.path.join(root, name))).hexdigest()
        entries.append({"name": name, "sentences": sentences, "tokens": tokens, "sha256": digest})
    none = {"sentences": 0, "tokens": 0, "unk_tokens": 0}
    train = {"sentences": n_shards * sentences, "tokens": sum(e["tokens"] for e in entries), "unk_tokens": 0}
    record = {
        "shards": {"train": entries, "heldout": []},
        "totals": {"train": train, "heldout": none},
        "vocab": {
            "file": shard_format.VOCAB_FILE,
            "counts_file": shard_format.COUNTS_FILE,
            "size": vocab,
            "sha256": hashlib.sha256(vocab_bytes).hexdigest(),
        },
    }
    return ShardManifest.of(record, root)


def shard_boundary_table(args: argparse.Namespace) -> None:
    """Per-step time around shard boundaries, with and without reading the next shard ahead. The
    step is ``next(batches)`` plus a stand-in for the device's step (``--boundary-step-ms`` of
    sleep: on a GPU the host waits for the device with the GIL released)."""
    batch, step_s = args.boundary_batch_size, args.boundary_step_ms / 1e3
    cache = synthetic_cache(args.vocab)
    with tempfile.TemporaryDirectory(prefix="elmo-bench-shards-") as tmp:
        manifest = write_synthetic_shards(tmp, args.boundary_shards, args.boundary_sentences, args.vocab)
        read = []
        for url in manifest.urls("train"):
            t0 = time.perf_counter()
            read_shard_sentences(url, args.vocab)
            read.append(time.perf_counter() - t0)
        tokens = manifest.shards["train"][0].tokens
        print(
            f"\nshard boundaries: {args.boundary_shards} shards of {args.boundary_sentences:,} sentences "
            f"({tokens:,} tokens, read + decoded in {np.median(read) * 1e3:.0f} ms), batch {batch} x unroll "
            f"{args.unroll_steps}, {args.boundary_steps} steps of next(batches) + {args.boundary_step_ms:g} ms "
            "stand-in device step"
        )
        print(
            "| next shard | boundary steps | median step ms | max step at a boundary ms | max step elsewhere ms | median next() ms | max next() at a boundary ms |"
        )
        print("|---|---|---|---|---|---|---|")
        labels = {
            ReadAhead.off: "read when reached (before)",
            ReadAhead.thread: "read ahead in a thread",
            ReadAhead.process: "read ahead in a process",
        }
        for prefetch, label in labels.items():
            stream = open_lm_batches(
                tmp, "train", cache, batch, args.unroll_steps, seed=1, manifest=manifest, prefetch=prefetch
            )
            next(stream)  # the first shard's read is the run's start, not a boundary
            rows = [_boundary_step(stream, step_s) for _ in range(args.boundary_steps)]
            at = [r for r in rows if r[2]]
            other = [r for r in rows if not r[2]]
            print(
                f"| {label} | {len(at)} | "
                f"{np.median([r[0] for r in rows]) * 1e3:.1f} | {max((r[0] for r in at), default=0) * 1e3:.1f} | "
                f"{max(r[0] for r in other) * 1e3:.1f} | {np.median([r[1] for r in rows]) * 1e3:.1f} | "
                f"{max((r[1] for r in at), default=0) * 1e3:.1f} |"
            )
            stream.close()


def _boundary_step(stream, step_s: float) -> tuple[float, float, bool]:
    """One step: (its seconds, next()'s seconds, whether either direction started a shard in it)."""
    before = [rows.source.position() for rows in stream.streams]
    t0 = time.perf_counter()
    next(stream)
    data = time.perf_counter() - t0
    time.sleep(step_s)
    after = [rows.source.position() for rows in stream.streams]
    crossed = any(
        (a["pass"], a["shard"]) != (b["pass"], b["shard"]) for a, b in zip(after, before, strict=True)
    )
    return time.perf_counter() - t0, data, crossed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unroll-steps", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=100_000, help="synthetic vocabulary size")
    parser.add_argument("--boundary-shards", type=int, default=4)
    parser.add_argument("--boundary-sentences", type=int, default=20_000, help="sentences per shard")
    parser.add_argument("--boundary-batch-size", type=int, default=128)
    parser.add_argument("--boundary-steps", type=int, default=600)
    parser.add_argument("--boundary-step-ms", type=float, default=30.0, help="stand-in device step")
    shard_boundary_table(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
