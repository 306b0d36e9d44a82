"""Training-step throughput: tokens/s and model FLOP utilisation of the full step (forward, backward,
softmax gradient exchange, clipping, optimizer) that ``elmo train`` runs.

    python benchmarks/train_step.py                     # small, CPU: 1 worker and 2 workers, 1 thread each
    python benchmarks/train_step.py --device cuda       # one GPU: small and original, bf16 and float32
    python benchmarks/train_step.py --device cuda --presets original --dtypes bf16 --batch-sizes 128,1024

Tokens are counted as both streams' positions: 2 x batch x unroll per worker per step. MFU = model
FLOPs per second / (workers x the measured matmul peak of one worker: float32 on CPU; on a GPU the
peak of the step's dtype, bf16 or float32 with TF32 off). Model FLOPs are each step's own
(`StepResult.flops`): the char CNN, highway and projection once per distinct spelling of the step,
the LSTM and the sampled softmax once per position of both streams, times 3 for forward + backward.
Batches are synthetic: Zipf-distributed word ids over a synthetic vocabulary, spelled with the
trainer's CharCache, so the step and the sparse softmax exchange see realistic repeats.

On a GPU each configuration runs in this process, one after the other: the step is captured as a
CUDA graph (``--modes graph``; ``eager`` runs it without) and the phase split comes from CUDA events
recorded inside it. ``host ms`` is the step's own host work (distinct spellings, negatives, copies),
which overlaps the device's work of the previous step. ``--profile DIR`` adds a kernel summary of
one configuration from the PyTorch profiler and writes its trace there.

The checkpoint stall, a save's memory and shard boundaries are their own benchmarks:
``checkpoint_stall.py``, ``checkpoint_memory.py``, ``shard_boundaries.py`` (``step_setup.py`` is
what they share).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kernel_profile import print_kernel_summary, profile_kernels  # noqa: E402
from benchmarks.step_setup import add_step_args, make_runner, synthetic_batches  # noqa: E402
from pipeline.train.data import LMBatch  # noqa: E402
from pipeline.train.metrics import measure_matmul_peak  # noqa: E402
from pipeline.train.objective import sample_negatives  # noqa: E402
from pipeline.train.step import PHASES, PhaseTimer, StepRunner  # noqa: E402
from pipeline.train.step_inputs import step_inputs  # noqa: E402

# ---- CPU: 1 and 2 DDP workers --------------------------------------------------------------


def run_worker(rank: int, world: int, port: int, args: argparse.Namespace, out_file: str) -> None:
    torch.set_num_threads(args.threads)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        runner, cache = make_runner(args, args.presets.split(",")[0], args.batch_size, [])
        runner.distribute()
        batches = synthetic_batches(
            cache, args.warmup + args.steps, args.batch_size, args.unroll_steps, seed=rank
        )
        for batch in batches[: args.warmup]:
            runner.train_step(batch, 10**6)
        _barrier(world)
        start = time.perf_counter()
        last, flops = None, 0
        for batch in batches[args.warmup :]:
            last = runner.train_step(batch, 10**6)
            flops += last.flops
        _barrier(world)
        elapsed = time.perf_counter() - start
        if rank == 0:
            with open(out_file, "w") as f:
                json.dump(
                    {
                        "elapsed": elapsed,
                        "flops_per_step": flops / args.steps,
                        "exchange_bytes": last.exchange_bytes,
                        "dense_bytes": last.dense_bytes,
                        "rows": int(last.rows),
                    },
                    f,
                )
    finally:
        if world > 1:
            dist.destroy_process_group()


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_workers(args: argparse.Namespace, world: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="elmo-bench-") as tmp:
        out_file = os.path.join(tmp, "rank0.json")
        mp.start_processes(
            run_worker,
            args=(world, _free_port(), args, out_file),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        with open(out_file) as f:
            return json.load(f)


def cpu_main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    steps_table(args)
    return 0


def steps_table(args: argparse.Namespace) -> None:
    peak = measure_matmul_peak(torch.device("cpu"), torch.float32, size=1024, seconds=1.0)
    print(
        f"preset {args.presets.split(',')[0]}, batch {args.batch_size} x unroll {args.unroll_steps} per worker, "
        f"{args.negatives} negatives, vocab {args.vocab}, {args.threads} thread(s)/worker, device cpu"
    )
    print(f"measured matmul peak per worker: {peak / 1e9:.1f} GFLOP/s (float32)")
    print(
        f"{'workers':>7} {'step s':>8} {'tokens/s':>10} {'MFU':>6} {'speedup':>8} {'softmax rows':>12} {'exchange B/step':>15} {'dense B/step':>13}"
    )
    base = None
    for world in [int(w) for w in args.workers.split(",")]:
        r = measure_workers(args, world)
        step_s = r["elapsed"] / args.steps
        tokens = world * 2 * args.batch_size * args.unroll_steps / step_s
        mfu = r["flops_per_step"] / step_s / peak
        base = base or tokens
        print(
            f"{world:>7} {step_s:>8.3f} {tokens:>10.0f} {mfu:>6.1%} {tokens / base:>7.2f}x {r['rows']:>12} "
            f"{r['exchange_bytes']:>15,} {r['dense_bytes']:>13,}"
        )


# ---- GPU: configurations one after the other ------------------------------------------------


def cuda_config(args, preset: str, dtype: str, batch_size: int, mode: str, peak: float) -> dict:
    """Time one configuration; returns a table row (or the reason it could not run)."""
    overrides = [f"bf16={str(dtype == 'bf16').lower()}", f"cuda_graph={str(mode == 'graph').lower()}"]
    runner, cache = make_runner(args, preset, batch_size, overrides)
    batches = synthetic_batches(cache, args.cuda_batches, batch_size, args.unroll_steps, seed=0)
    total = args.warmup + args.steps
    torch.cuda.reset_peak_memory_stats()
    for i in range(args.warmup):
        runner.train_step(batches[i % len(batches)], 10**6)
    torch.cuda.synchronize()
    start = time.perf_counter()
    flops = 0
    for i in range(args.warmup, total):
        result = runner.train_step(batches[i % len(batches)], 10**6)
        flops += result.flops
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - start) / args.steps
    losses = result.losses.tolist()  # before the phase split runs more steps
    phases = phase_split(runner, batches)
    host = []
    for batch in batches[:4]:
        t0 = time.perf_counter()
        negatives = sample_negatives(args.negatives, cache.vocab_size, torch.Generator().manual_seed(0))
        step_inputs(batch, negatives).pin_memory()
        host.append(time.perf_counter() - t0)
    graph = runner.graph
    row = {
        "preset": preset,
        "dtype": dtype,
        "batch": batch_size,
        "mode": mode + (" (capture failed)" if graph is not None and graph.failure else ""),
        "step_ms": step_s * 1e3,
        "tokens_s": 2 * batch_size * args.unroll_steps / step_s,
        "mfu": flops / args.steps / step_s / peak,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "host_ms": float(np.median(host)) * 1e3,
        "phases_ms": {k: v * 1e3 for k, v in phases.items()} if phases else None,
        "loss": losses,
        "skipped": runner.nonfinite_steps(),
        "captures": graph.captures if graph is not None else 0,
        "failure": graph.failure if graph is not None else None,
    }
    if args.profile and [preset, dtype, batch_size, mode] in args.profile_config:
        try:
            row["profile"] = profile_steps(args, runner, batches)
        except Exception as err:  # noqa: BLE001 - a failed profile must not cost the table
            print(
                f"profile of {preset} {dtype} batch {batch_size} {mode} failed: {type(err).__name__}: {err}"
            )
    del runner, batches
    gc.collect()
    torch.cuda.empty_cache()
    return row


def phase_split(runner: StepRunner, batches: list[LMBatch]) -> dict[str, float] | None:
    """Seconds per phase of one step, from CUDA events recorded inside the step: a graph is
    captured again with the timer's events in it (apart from the timed steps, which run without)."""
    runner.timer = PhaseTimer(runner.device)
    if runner.graph is not None:
        if runner.graph.failure is not None:
            return None
        runner.graph.reset()
    try:
        for i in range(runner.graph.warmup + 2 if runner.graph is not None else 2):
            runner.train_step(batches[i % len(batches)], 10**6)
        torch.cuda.synchronize()
        return runner.timer.durations()
    finally:
        runner.timer = None


def profile_steps(args, runner: StepRunner, batches: list[LMBatch]) -> dict:
    """Kernel time per kind over ``args.profile_steps`` steps (benchmarks/kernel_profile.py)."""
    steps = iter(range(10**9))

    def step():
        runner.train_step(batches[next(steps) % len(batches)], 10**6)

    name = f"trace_{runner.cfg.batch_size}_{'bf16' if runner.cfg.bf16 else 'float32'}.json"
    return profile_kernels(step, args.profile_steps, os.path.join(args.profile, name))


def cuda_main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        sys.exit("train_step: --device cuda but no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    peaks = {
        "bf16": measure_matmul_peak(torch.device("cuda"), torch.bfloat16, size=8192, seconds=1.0),
        "float32": measure_matmul_peak(torch.device("cuda"), torch.float32, size=8192, seconds=1.0),
    }
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(
        f"measured matmul peak: bf16 {peaks['bf16'] / 1e12:.0f} TFLOP/s, float32 (TF32 off) "
        f"{peaks['float32'] / 1e12:.1f} TFLOP/s; unroll {args.unroll_steps}, {args.negatives} negatives, "
        f"vocab {args.vocab}"
    )
    rows = []
    for preset in args.presets.split(","):
        for dtype in args.dtypes.split(","):
            for mode in args.modes.split(","):
                for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
                    if mode == "eager" and batch_size not in args.eager_batches:
                        continue
                    try:
                        row = cuda_config(args, preset, dtype, batch_size, mode, peaks[dtype])
                    except torch.OutOfMemoryError:
                        gc.collect()
                        torch.cuda.empty_cache()
                        print(f"{preset} {dtype} batch {batch_size} {mode}: out of GPU memory")
                        break
                    rows.append(row)
                    print_row(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "peaks": peaks, "rows": rows}, f, indent=1)
    print()
    print_table(rows)
    for row in rows:
        if "profile" in row:
            print_profile(row)
    return 0


def print_row(row: dict) -> None:
    phases = row["phases_ms"]
    split = " ".join(f"{k} {phases[k]:.2f}" for k in PHASES) if phases else "n/a"
    print(
        f"{row['preset']} {row['dtype']} batch {row['batch']} {row['mode']}: {row['step_ms']:.2f} ms/step, "
        f"{row['tokens_s']:,.0f} tokens/s, MFU {row['mfu']:.1%}, peak {row['peak_gib']:.1f} GiB, "
        f"host {row['host_ms']:.1f} ms; phases ms: {split}; loss {row['loss']}, skipped {row['skipped']}"
        + (f"; capture failed: {row['failure']}" if row["failure"] else "")
    )


def print_table(rows: list[dict]) -> None:
    print(
        "| preset | dtype | batch/GPU | mode | ms/step | tokens/s/GPU | MFU | peak GiB | host ms | "
        "forward | backward | exchange | update (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        phases = r["phases_ms"]
        split = " | ".join(f"{phases[k]:.2f}" for k in PHASES) if phases else "n/a | n/a | n/a | n/a"
        print(
            f"| {r['preset']} | {r['dtype']} | {r['batch']} | {r['mode']} | {r['step_ms']:.2f} | "
            f"{r['tokens_s']:,.0f} | {r['mfu']:.1%} | {r['peak_gib']:.1f} | {r['host_ms']:.1f} | {split} |"
        )


def print_profile(row: dict) -> None:
    what = f"{row['preset']} {row['dtype']} batch {row['batch']} {row['mode']}"
    print_kernel_summary(what, "step", row["profile"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_args(parser)
    parser.add_argument("--workers", default="1,2", help="CPU: comma-separated worker counts")
    parser.add_argument("--threads", type=int, default=1, help="CPU: torch threads per worker")
    parser.add_argument("--batch-size", type=int, default=32, help="CPU: rows per worker")
    parser.add_argument("--batch-sizes", default="128,256,512,1024", help="GPU: rows per GPU")
    parser.add_argument("--dtypes", default="bf16,float32", help="GPU: bf16 (autocast) and/or float32")
    parser.add_argument("--modes", default="graph,eager", help="GPU: graph (CUDA graph) and/or eager")
    parser.add_argument("--eager-batches", default="128", help="GPU: batch sizes that also run eagerly")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (CPU 3, GPU 20)")
    # CPU: DDP rebuilds its gradient buckets after the first iteration, so step 2 is not steady state
    # either; GPU: the graph is captured after 3 eager steps
    parser.add_argument("--cuda-batches", type=int, default=8, help="GPU: distinct batches cycled through")
    parser.add_argument(
        "--profile", default="", help="GPU: write a profiler trace here and print kernel times"
    )
    parser.add_argument(
        "--profile-config",
        default="original,bf16,128,graph;original,bf16,1024,graph",
        help="GPU: preset,dtype,batch,mode of the configurations to profile, separated by ';'",
    )
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--json", default="", help="GPU: also write the rows as JSON here")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    args.presets = args.presets or ("small,original" if cuda else "small")
    args.steps = args.steps or (20 if cuda else 3)
    args.warmup = args.warmup if args.warmup is not None else (6 if cuda else 2)
    args.eager_batches = [int(b) for b in args.eager_batches.split(",")]
    args.profile_config = [
        [p, d, int(b), m] for p, d, b, m in (c.split(",") for c in args.profile_config.split(";"))
    ]
    return cuda_main(args) if cuda else cpu_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
