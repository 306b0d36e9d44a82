"""The checkpoint stall: step time of the ``elmo train`` step without checkpoints, with a background
checkpoint every ``--checkpoint-every`` steps, and with a synchronous (streamed) one, the modes taking
turns; and whether the storage writes a checkpoint faster than the steps between two saves take.

    python benchmarks/checkpoint_stall.py                               # CPU, small
    python benchmarks/checkpoint_stall.py --device cuda --presets original --checkpoint-batch-size 128
    python benchmarks/checkpoint_stall.py --checkpoint-dir /dev/shm     # storage out of the picture

Target (GPU): with a checkpoint every 20 steps, the step within 5% of none.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.step_setup import (  # noqa: E402
    add_step_args,
    checkpointer_for,
    make_runner,
    saver_state,
    state_bytes,
    synchronize,
    synthetic_batches,
)
from pipeline.train import checkpoint as ckpt  # noqa: E402
from pipeline.train.checkpoint import Checkpointer  # noqa: E402
from pipeline.train.snapshot import HostSnapshot  # noqa: E402


def timed_steps(
    runner, batches, steps: int, saver: Checkpointer | None
) -> tuple[list[float], float, list[float]]:
    """Seconds of each of ``steps`` training steps (each with ``saver.save`` when one is due, the
    device synchronised: the loop waits for it at a save point anyway), the seconds the last
    background save still needed after them, and the seconds each ``save`` call that saved took
    (what the loop waits for at a save point)."""
    times, save_calls = [], []
    for i in range(steps):
        t0 = time.perf_counter()
        runner.train_step(batches[i % len(batches)], 10**6)
        synchronize(runner.device)
        if saver is not None:
            t1 = time.perf_counter()
            if saver.save(i + 1):
                save_calls.append(time.perf_counter() - t1)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    if saver is not None:
        saver.wait()
    return times, time.perf_counter() - t0, save_calls


def write_seconds(saver: Checkpointer, run_dir: str) -> float:
    """Seconds to write one checkpoint of ``saver``'s parts to ``run_dir`` from host memory (the
    saving thread's work, without the snapshot): whether the storage keeps up with the interval."""
    taken = HostSnapshot().take(saver_state(saver))
    taken.wait()
    t0 = time.perf_counter()
    ckpt.save_model(ckpt.checkpoint_path(run_dir, 1), taken.payload)
    return time.perf_counter() - t0


CHECKPOINT_MODES = {"none": None, "background": True, "streamed, synchronous": False}


def checkpoint_table(args: argparse.Namespace) -> None:
    """Step time without checkpoints vs with one every ``--checkpoint-every`` steps."""
    preset, batch = args.presets.split(",")[0], args.checkpoint_batch_size
    runner, cache = make_runner(args, preset, batch, [])
    batches = synthetic_batches(cache, 8, batch, args.unroll_steps, seed=0)
    timed_steps(runner, batches, args.warmup, None)
    results: dict[str, list] = {mode: [] for mode in CHECKPOINT_MODES}
    order = list(CHECKPOINT_MODES)
    with tempfile.TemporaryDirectory(prefix="elmo-bench-ckpt-", dir=args.checkpoint_dir or None) as tmp:
        for repeat in range(args.checkpoint_repeats):
            # the modes take turns, in reversed order every other round, so drift in the machine's
            # load does not favour one of them
            for mode in order if repeat % 2 == 0 else order[::-1]:
                background = CHECKPOINT_MODES[mode]
                saver = None
                if background is not None:
                    run_dir = os.path.join(tmp, f"{mode}-{repeat}")
                    saver = checkpointer_for(runner, run_dir, args.checkpoint_every, background)
                results[mode].append(timed_steps(runner, batches, args.checkpoint_steps, saver))
        whole = checkpointer_for(runner, tmp, 1, True)
        size, write_s = state_bytes(whole), write_seconds(whole, os.path.join(tmp, "write"))
    print(
        f"\ncheckpoint every {args.checkpoint_every} steps vs none: preset {preset}, batch {batch} x unroll "
        f"{args.unroll_steps}, state {size / 2**20:,.0f} MiB, {args.checkpoint_steps} steps x "
        f"{args.checkpoint_repeats} rounds per mode, device {runner.device.type}, {torch.get_num_threads()} thread(s)"
    )
    print(
        "| checkpoints | mean step s | median step s | max step s | vs none | save call ms, first / median | "
        "last save after the steps s |"
    )
    print("|---|---|---|---|---|---|---|")
    base = None
    for mode, runs in results.items():
        times = [t for run, _, _ in runs for t in run]
        mean = float(np.mean(times))
        base = base or mean
        label = mode if mode == "none" else f"{mode}, every {args.checkpoint_every}"
        drain = max(d for _, d, _ in runs)
        calls = [c for _, _, run_calls in runs for c in run_calls]
        call_ms = f"{calls[0] * 1e3:.1f} / {np.median(calls[1:] or calls) * 1e3:.1f}" if calls else ""
        print(
            f"| {label} | {mean:.3f} | {np.median(times):.3f} | {max(times):.3f} | "
            f"{mean / base - 1:+.1%} | {call_ms} | {drain:.2f} |"
        )
    interval = args.checkpoint_every * float(np.median([t for run, _, _ in results["none"] for t in run]))
    print(
        f"writing one checkpoint from host memory (torch.save streamed to {args.checkpoint_dir or 'a temp dir'}, "
        f"fsync'd): {write_s:.2f} s, {size / 2**20 / write_s:,.0f} MiB/s; the steps between two saves take "
        f"{interval:.2f} s, so the storage {'keeps up' if write_s < interval else 'does not keep up: a save waits for the previous one'}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_args(parser, presets="small")
    parser.add_argument("--threads", type=int, default=1, help="CPU: torch threads")
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--checkpoint-steps", type=int, default=60, help="timed steps per mode and round")
    parser.add_argument("--checkpoint-repeats", type=int, default=2, help="rounds of the modes")
    parser.add_argument("--checkpoint-batch-size", type=int, default=8)
    parser.add_argument(
        "--checkpoint-dir", default="", help="where checkpoints are written (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    args.warmup = args.warmup if args.warmup is not None else (6 if args.device == "cuda" else 2)
    torch.set_num_threads(args.threads)
    checkpoint_table(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
