"""The embed actor's host side alone: the CPU-measurable budget of the GPU pipeline.

    python benchmarks/embed_host.py                    # the table of docs/benchmarks.md
    python benchmarks/embed_host.py --shards 2 --lines 1000   # a quick run

What an actor does with a shard after its passes, without the model: synthetic pass outputs of
``original``'s width (2P = 1024, N+1 = 3 layers) in the compact form a pass hands over
(``OutputSpec.shape``), for sentences with the sample corpus's lengths grouped into the CUDA bucket
passes the stage plans, are placed into the shard's vectors (``ShardAssembler``, pooled buffers)
and committed to a local folder (``resume.commit_shard``: the HDF5 or Parquet file written and
hashed as it is written, synced, renamed, its entry written). ``--threads N`` commits N shards at
once: N threads each assemble a shard and commit it themselves (writers on threads: h5py lets one
call run at a time, in any thread), or, with ``--processes``, hand it to one of N writer processes
(the stage's design, ``pipeline/embed/shard_writers.py``: the shard assembled in shared memory,
committed by a process of its own; the hand-over is counted). Tokens/s per writer = tokens/s / N;
CPU seconds are this process's and the writers', so per-core figures can be read against them.
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from elmo_model.static_batches import BucketPlan, plan_batches  # noqa: E402
from pipeline.embed.file_format import chosen_format  # noqa: E402
from pipeline.embed.resume import commit_shard  # noqa: E402
from pipeline.embed.shard_vectors import BufferPool, ShardAssembler  # noqa: E402
from pipeline.embed.shard_writers import ShardWriters  # noqa: E402

SAMPLE = REPO / "pipeline" / "data" / "kjv-sample.txt.gz"
WIDTH, LAYERS = 1024, 3
CASES = {
    # name: (file format, layout, row shape, pooled)
    "packed top float16": ("hdf5", "packed", (WIDTH,), False),
    "packed all float16": ("hdf5", "packed", (LAYERS, WIDTH), False),
    "pooled top float16": ("hdf5", "packed", (WIDTH,), True),
    "allennlp top float16": ("hdf5", "allennlp", (WIDTH,), False),
    "parquet top float16": ("parquet", "packed", (WIDTH,), False),
}


def sample_lengths(lines: int) -> np.ndarray:
    """Tokens per line of the sample corpus, cycled to ``lines`` lines."""
    with gzip.open(SAMPLE, "rb") as f:
        lengths = np.array([len(line.split()) for line in f.read().split(b"\n") if line.strip()])
    return np.resize(lengths, lines).astype(np.int64)


class SyntheticShard:
    """One shard's pieces (a line each) and its passes' compact outputs, made once and reused."""

    def __init__(self, sizes: np.ndarray, row_shape: tuple[int, ...], pooled: bool, batch_tokens: int):
        self.sizes, self.row_shape, self.pooled = sizes, row_shape, pooled
        plan = BucketPlan(batch_tokens, batch_tokens // 16, fixed=True)
        rng = np.random.default_rng(0)
        self.passes = []
        for indices in plan_batches(sizes.tolist(), plan):
            rows = len(indices) if pooled else int(sizes[indices].sum())
            values = rng.standard_normal((rows, *row_shape), dtype=np.float32).astype(np.float16)
            self.passes.append((np.asarray(indices), values))

    @property
    def tokens(self) -> int:
        return int(self.sizes.sum())


def commit_one(
    shard: SyntheticShard, index: int, output: str, case: tuple, pool: BufferPool, keep: bool, writers=None
) -> None:
    """Assemble and commit one shard: in this thread, or by a writer process (``writers``)."""
    fmt = chosen_format(case[0], case[1])
    lines = len(shard.sizes)
    assembler = ShardAssembler(
        index * lines, lines, range(lines), shard.sizes, shard.row_shape, np.float16, shard.pooled, pool
    )
    for indices, values in shard.passes:
        assembler.place(indices, values)
    vectors = assembler.finish()
    try:
        if writers is None:
            entry = commit_shard(output, {"index": index}, vectors, fmt)
        else:
            entry = writers.commit(output, {"index": index}, vectors, fmt)
    finally:
        pool.release(vectors)
    if not keep:
        os.remove(os.path.join(output, entry["name"]))


def measure(shard: SyntheticShard, case: tuple, writers: int, args) -> dict:
    """``args.shards`` shards per writer on ``writers`` threads at once, each committing its own
    shards, or, with ``args.processes``, handing them to ``writers`` writer processes (the stage's
    design: ``shard_writers``): tokens/s and CPU-s per token (this process's and the writers')."""
    pool, shards, output, keep = BufferPool(), args.shards, args.output, args.keep
    processes = ShardWriters(writers) if args.processes else None
    if processes is not None:
        pool = BufferPool(processes.buffers)
    try:

        def worker(t: int) -> None:
            for k in range(shards):
                commit_one(shard, t * shards + k, output, case, pool, keep, processes)

        with ThreadPoolExecutor(writers) as threads:
            # the pool's buffers, h5py's first file, each writer's imports and mappings; a thread's
            # error is raised here (a benchmark whose commits fail reports no rate)
            warm = [
                threads.submit(commit_one, shard, 10**6 + t, output, case, pool, False, processes)
                for t in range(writers)
            ]
            for done in warm:
                done.result()
            cpu, start = _cpu_seconds(processes), time.perf_counter()
            for done in [threads.submit(worker, t) for t in range(writers)]:
                done.result()
            wall, cpu = time.perf_counter() - start, _cpu_seconds(processes) - cpu
    finally:
        if processes is not None:
            processes.close()
    tokens = shard.tokens * shards * writers
    return {"tokens_s": tokens / wall, "per_core": tokens / wall / writers, "cpu_per_token": cpu / tokens}


def _cpu_seconds(writers) -> float:
    """CPU seconds of this process and of the writer processes."""
    total = time.process_time()
    for pid in writers.pids if writers is not None else ():
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=5000, help="lines per shard")
    parser.add_argument("--shards", type=int, default=4, help="shards per thread")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="writers at once")
    parser.add_argument(
        "--processes", action="store_true", help="each writer a process of its own (default: threads of one)"
    )
    parser.add_argument("--batch-tokens", type=int, default=32768)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--dir", default=None, help="where the shards go (default: a temp folder)")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the shards (default: each is removed once committed, so the page cache reuses its "
        "pages, as it does in a long job once it has filled the memory)",
    )
    args = parser.parse_args(argv)

    sizes = sample_lengths(args.lines)
    print(
        f"host side: {args.lines:,} lines ({int(sizes.sum()):,} tokens) a shard, width {WIDTH}, passes of "
        f"{args.batch_tokens:,} tokens, {args.shards} shards per thread, {os.cpu_count()} CPUs"
    )
    kind = "processes" if args.processes else "threads"
    print(f"| case | {kind} | tokens/s | tokens/s per writer | CPU µs per token |")
    print("|---|---|---|---|---|")
    for name in args.cases:
        case = CASES[name]
        shard = SyntheticShard(sizes, case[2], case[3], args.batch_tokens)
        for threads in args.threads:
            with tempfile.TemporaryDirectory(prefix="elmo-embed-host-", dir=args.dir) as args.output:
                row = measure(shard, case, threads, args)
            print(
                f"| {name} | {threads} | {row['tokens_s']:,.0f} | {row['per_core']:,.0f} | "
                f"{1e6 * row['cpu_per_token']:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
