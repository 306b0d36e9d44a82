"""Training-step throughput: tokens/s and model FLOP utilisation of the full step (forward, backward,
softmax gradient exchange, clipping, optimizer) that ``elmo train`` runs, for 1 and 2 DDP workers.

    python benchmarks/train_step.py                       # small, CPU: 1 worker and 2 workers, 1 thread each
    python benchmarks/train_step.py --preset original --device cuda --batch-size 128   # GPU, bf16

MFU = model FLOPs per second / (workers x the measured matmul peak of one worker: float32 on CPU,
bf16 on GPU with autocast). Model FLOPs count every token of both streams through the char CNN,
highway, projection, LSTM and the sampled softmax, times 3 for forward + backward (the token
encoder's de-duplication of repeated tokens makes the real work a little smaller).
Batches are synthetic: Zipf-distributed word ids over a synthetic vocabulary, spelled with the
trainer's CharCache, so the step and the sparse softmax exchange see realistic repeats.
"""

from __future__ import annotations

import argparse
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

from pipeline.config import load_config  # noqa: E402
from pipeline.model_config import to_options  # noqa: E402
from pipeline.train.char_cache import CharCache  # noqa: E402
from pipeline.train.config import TrainConfig  # noqa: E402
from pipeline.train.data import LMBatch  # noqa: E402
from pipeline.train.metrics import measure_matmul_peak  # noqa: E402
from pipeline.train.step import StepRunner  # noqa: E402


def synthetic_batches(cache: CharCache, count: int, batch: int, unroll: int, seed: int) -> list[LMBatch]:
    """``count`` batches of Zipf(1.1)-distributed ids (ids 3.. are words), spelled by ``cache``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = np.minimum(rng.zipf(1.1, size=(2, batch, unroll + 1)) + 2, cache.vocab_size - 1).astype(
            np.int64
        )
        tokens, targets = ids[..., :-1], ids[..., 1:]
        out.append(
            LMBatch(
                char_ids=torch.from_numpy(cache.spell(tokens)),
                token_ids=torch.from_numpy(np.ascontiguousarray(tokens)),
                targets=torch.from_numpy(np.ascontiguousarray(targets)),
            )
        )
    return out


def run_worker(rank: int, world: int, port: int, args: argparse.Namespace, out_file: str) -> None:
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
    try:
        cfg = load_config(
            TrainConfig,
            preset=args.preset,
            overrides=[
                "shards=unused",
                "output=unused",
                f"batch_size={args.batch_size}",
                f"unroll_steps={args.unroll_steps}",
                f"softmax.negatives={args.negatives}",
                "softmax.sampled=true",
            ],
        )
        options = to_options(cfg.model)
        cache = CharCache(["<S>", "</S>", "<UNK>", *(f"w{i}" for i in range(args.vocab - 3))])
        runner = StepRunner(cfg, options, cache.vocab_size, device)
        runner.distribute()
        batches = synthetic_batches(
            cache, args.warmup + args.steps, args.batch_size, args.unroll_steps, seed=rank
        )
        for batch in batches[: args.warmup]:
            runner.train_step(batch, 10**6)
        _sync(device, world)
        start = time.perf_counter()
        last = {}
        for batch in batches[args.warmup :]:
            last = runner.train_step(batch, 10**6)
        _sync(device, world)
        elapsed = time.perf_counter() - start
        if rank == 0:
            with open(out_file, "w") as f:
                json.dump(
                    {
                        "elapsed": elapsed,
                        "flops_per_step": runner.flops_per_step(args.batch_size, args.unroll_steps),
                        "exchange_bytes": last["exchange_bytes"],
                        "dense_bytes": last["dense_bytes"],
                        "rows": last["rows"],
                    },
                    f,
                )
    finally:
        if world > 1:
            dist.destroy_process_group()


def _sync(device: torch.device, world: int) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if world > 1:
        dist.barrier()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args: argparse.Namespace, world: int) -> dict:
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts (CPU); GPU runs 1")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--unroll-steps", type=int, default=20)
    parser.add_argument("--negatives", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=100_000, help="synthetic vocabulary size (softmax rows)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps")
    # DDP rebuilds its gradient buckets after the first iteration, so step 2 is not steady state either
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    bf16 = device.type == "cuda"
    if bf16:
        torch.backends.cuda.matmul.allow_tf32 = False
    peak = measure_matmul_peak(
        device, torch.bfloat16 if bf16 else torch.float32, size=4096 if bf16 else 1024, seconds=1.0
    )
    counts = [1] if device.type == "cuda" else [int(w) for w in args.workers.split(",")]
    print(
        f"preset {args.preset}, batch {args.batch_size} x unroll {args.unroll_steps} per worker, "
        f"{args.negatives} negatives, vocab {args.vocab}, {args.threads} thread(s)/worker, device {args.device}"
        f"{' (bf16 autocast)' if bf16 else ''}"
    )
    print(f"measured matmul peak per worker: {peak / 1e9:.1f} GFLOP/s ({'bf16' if bf16 else 'float32'})")
    print(
        f"{'workers':>7} {'step s':>8} {'tokens/s':>10} {'MFU':>6} {'speedup':>8} {'softmax rows':>12} {'exchange B/step':>15} {'dense B/step':>13}"
    )
    base = None
    for world in counts:
        r = measure(args, world)
        step_s = r["elapsed"] / args.steps
        tokens = world * 2 * args.batch_size * args.unroll_steps / step_s
        mfu = r["flops_per_step"] / step_s / peak
        base = base or tokens
        print(
            f"{world:>7} {step_s:>8.3f} {tokens:>10.0f} {mfu:>6.1%} {tokens / base:>7.2f}x {r['rows']:>12} "
            f"{r['exchange_bytes']:>15,} {r['dense_bytes']:>13,}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
