"""Training-step throughput: tokens/s and model FLOP utilisation of the full step (forward, backward,
softmax gradient exchange, clipping, optimizer) that ``elmo train`` runs.

    python benchmarks/train_step.py                     # small, CPU: 1 worker and 2 workers, 1 thread each
    python benchmarks/train_step.py --device cuda       # one GPU: small and original, bf16 and float32
    python benchmarks/train_step.py --device cuda --presets original --dtypes bf16 --batch-sizes 128,1024

Tokens are counted as both streams' positions: 2 x batch x unroll per worker per step. MFU = model
FLOPs per second / (workers x the measured matmul peak of one worker: float32 on CPU; on a GPU the
peak of the step's dtype, bf16 or float32 with TF32 off). Model FLOPs count every token of both
streams through the char CNN, highway, projection, LSTM and the sampled softmax, times 3 for forward
+ backward (the encoder runs once per distinct token, so the real work is a little smaller).
Batches are synthetic: Zipf-distributed word ids over a synthetic vocabulary, spelled with the
trainer's CharCache, so the step and the sparse softmax exchange see realistic repeats.

On a GPU each configuration runs in this process, one after the other: the step is captured as a
CUDA graph (``--modes graph``; ``eager`` runs it without) and the phase split comes from CUDA events
recorded inside it. ``host ms`` is the step's own host work (distinct spellings, negatives, copies),
which overlaps the device's work of the previous step. ``--profile DIR`` adds a kernel summary of
one configuration from the PyTorch profiler and writes its trace there.

Checkpoints and shard reads off the critical path (issue 14): ``--tables`` adds, on either device,

    python benchmarks/train_step.py --tables io      # = checkpoints,memory,shards (CPU: ~6 min, ~10 GB RAM)

- ``checkpoints``: step time of the first preset without checkpoints, with a background checkpoint
  every ``--checkpoint-every`` steps, and with a synchronous (streamed) one, the modes taking turns;
- ``memory``: peak resident memory while saving each of ``--memory-presets`` at full size (the
  original: 93.6M LSTM/CNN parameters and a 793,471-row softmax, with their Adagrad accumulators),
  against the state's size, for the background save, the synchronous streamed one and (states under
  ``--in-memory-max-gib``) the serialise-into-memory-first save used before;
- ``shards``: per-step time around shard boundaries with the next shard read when the stream
  reaches it (before) and read ahead in a thread, on synthetic shards in the shard format.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline import shard_format, storage  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.model_config import to_options  # noqa: E402
from pipeline.train import checkpoint as ckpt  # noqa: E402
from pipeline.train.char_cache import CharCache  # noqa: E402
from pipeline.train.checkpoint import Checkpointer, RNGStates  # noqa: E402
from pipeline.train.config import TrainConfig  # noqa: E402
from pipeline.train.data import LMBatch, open_lm_batches  # noqa: E402
from pipeline.train.metrics import measure_matmul_peak  # noqa: E402
from pipeline.train.objective import sample_negatives  # noqa: E402
from pipeline.train.sentence_source import ReadAhead  # noqa: E402
from pipeline.train.shard_reading import read_shard_sentences  # noqa: E402
from pipeline.train.snapshot import HostSnapshot  # noqa: E402
from pipeline.train.step import PHASES, PhaseTimer, StepRunner  # noqa: E402
from pipeline.train.step_inputs import step_inputs  # noqa: E402


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


def make_runner(args: argparse.Namespace, preset: str, batch_size: int, overrides: list[str]):
    cfg = load_config(
        TrainConfig,
        preset=preset,
        overrides=[
            "shards=unused",
            "output=unused",
            f"batch_size={batch_size}",
            f"unroll_steps={args.unroll_steps}",
            f"softmax.negatives={args.negatives}",
            "softmax.sampled=true",
            *overrides,
        ],
    )
    options = to_options(cfg.model)
    cache = CharCache(["<S>", "</S>", "<UNK>", *(f"w{i}" for i in range(args.vocab - 3))])
    return StepRunner(cfg, options, cache.vocab_size, torch.device(args.device)), cache


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
        last = None
        for batch in batches[args.warmup :]:
            last = runner.train_step(batch, 10**6)
        _barrier(world)
        elapsed = time.perf_counter() - start
        if rank == 0:
            with open(out_file, "w") as f:
                json.dump(
                    {
                        "elapsed": elapsed,
                        "flops_per_step": runner.flops_per_step(args.batch_size, args.unroll_steps),
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
    if "steps" in args.tables.split(","):
        steps_table(args)
    io_tables(args)
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


# ---- checkpoints and shard reads off the critical path ---------------------------------------


def checkpointer_for(runner: StepRunner, run_dir: str, every: int, background: bool) -> Checkpointer:
    """The trainer's Checkpointer over ``runner``'s parts (one rank; no data stream)."""
    return Checkpointer(
        run_dir,
        0,
        1,
        every=every,
        keep=2,
        shared={"bilm": runner.bilm, "softmax": runner.softmax, "optimizer": runner.optimizer},
        own={"lstm": runner.state, "rng": RNGStates(runner.generator)},
        meta={"options": runner.options},
        background=background,
    )


def saver_state(saver: Checkpointer) -> dict:
    """What a checkpoint of ``saver`` holds: each shared and own part's ``state_dict()``, by name."""
    return {name: part.state_dict() for name, part in {**saver.shared, **saver.own}.items()}


def state_bytes(saver: Checkpointer) -> int:
    """Bytes of the distinct tensors a checkpoint of ``saver`` holds (its shared and own parts)."""
    seen: dict[int, int] = {}

    def walk(value) -> None:
        if isinstance(value, torch.Tensor):
            seen[id(value)] = value.numel() * value.element_size()
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(saver_state(saver))
    return sum(seen.values())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


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
        _sync(runner.device)
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


def _rss(field: str = "VmRSS") -> int:
    """This process's resident memory (``VmRSS``) or its peak since the last reset (``VmHWM``), bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


class PeakRSS:
    """The peak resident memory of this process within a ``with`` block: the kernel's high-water
    mark, reset on entry (``/proc/self/clear_refs``), or sampled every millisecond where it cannot be."""

    def __enter__(self) -> PeakRSS:
        gc.collect()
        self.before = _rss()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.sampler = None
        except OSError:
            self.samples = [self.before]
            self.stop = threading.Event()
            self.sampler = threading.Thread(target=self._sample, daemon=True)
            self.sampler.start()
        return self

    def _sample(self) -> None:
        while not self.stop.wait(0.001):
            self.samples.append(_rss())

    def __exit__(self, *exc) -> None:
        if self.sampler is None:
            self.peak = _rss("VmHWM")
        else:
            self.stop.set()
            self.sampler.join()
            self.peak = max(self.samples)


def _save_in_memory(file: str, payload) -> None:
    """How a checkpoint file was written before issue 14: serialised into memory, then written."""
    buf = io.BytesIO()
    torch.save(payload, buf)
    storage.write_bytes(file, buf.getvalue())


def memory_table(args: argparse.Namespace) -> None:
    """Peak memory while saving each preset's full-size state (model, softmax, optimizer)."""
    print(
        f"\nmemory while saving a checkpoint (device {args.device}; peak resident memory of this process "
        "during the save, from the save call until its files are written)"
    )
    print(
        "| preset | save | state GiB | resident before GiB | peak GiB | added GiB | added / state | peak / state | loop waits s | written after s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for preset, vocab in zip(args.memory_presets.split(","), args.memory_vocabs.split(","), strict=True):
        cfg = load_config(
            TrainConfig, preset=preset, overrides=["shards=unused", "output=unused", "batch_size=2"]
        )
        runner = StepRunner(cfg, to_options(cfg.model), int(vocab), torch.device(args.device))
        with tempfile.TemporaryDirectory(prefix="elmo-bench-mem-", dir=args.checkpoint_dir or None) as tmp:
            size = state_bytes(checkpointer_for(runner, tmp, 1, True))
            modes = [("background (snapshot, streamed)", True, None), ("streamed, synchronous", False, None)]
            if size <= args.in_memory_max_gib * 2**30:
                modes.append(("serialised in memory first (before)", False, _save_in_memory))
            for step, (mode, background, writer) in enumerate(modes, start=1):
                saver = checkpointer_for(runner, tmp, 1, background)
                with PeakRSS() as rss, mock.patch.object(ckpt, "_save_file", writer or ckpt._save_file):
                    t0 = time.perf_counter()
                    saver.save(step)
                    waits = time.perf_counter() - t0
                    saver.wait()
                    total = time.perf_counter() - t0
                added = rss.peak - rss.before
                print(
                    f"| {preset} | {mode} | {size / 2**30:.2f} | {rss.before / 2**30:.2f} | {rss.peak / 2**30:.2f} | "
                    f"{added / 2**30:.2f} | {added / size:.2f}x | {rss.peak / size:.2f}x | {waits:.2f} | {total:.2f} |"
                )
        del runner
        gc.collect()


def write_synthetic_shards(root: str, n_shards: int, sentences: int, vocab: int, seed: int = 0) -> dict:
    """``n_shards`` train shards of ``sentences`` Zipf(1.1) sentences of 5..44 words ``w<id>`` each
    (blocks of 1000), in the shard format; returns the manifest (none is written: pass it on)."""
    rng = np.random.default_rng(seed)
    words = np.array(["<S>", "</S>", "<UNK>", *(f"w{i}" for i in range(vocab - 3))], dtype=object)
    storage.write_bytes(os.path.join(root, shard_format.VOCAB_FILE), shard_format.encode_vocab(list(words)))
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
        entries.append({"name": name, "sentences": sentences, "tokens": tokens})
    return {"shards": {"train": entries}, "vocab": {"file": shard_format.VOCAB_FILE, "size": vocab}}


def shard_boundary_table(args: argparse.Namespace) -> None:
    """Per-step time around shard boundaries, with and without reading the next shard ahead. The
    step is ``next(batches)`` plus a stand-in for the device's step (``--boundary-step-ms`` of
    sleep: on a GPU the host waits for the device with the GIL released)."""
    batch, step_s = args.boundary_batch_size, args.boundary_step_ms / 1e3
    cache = CharCache(["<S>", "</S>", "<UNK>", *(f"w{i}" for i in range(args.vocab - 3))])
    with tempfile.TemporaryDirectory(prefix="elmo-bench-shards-") as tmp:
        manifest = write_synthetic_shards(tmp, args.boundary_shards, args.boundary_sentences, args.vocab)
        read = []
        for entry in manifest["shards"]["train"]:
            t0 = time.perf_counter()
            read_shard_sentences(os.path.join(tmp, entry["name"]), args.vocab)
            read.append(time.perf_counter() - t0)
        tokens = manifest["shards"]["train"][0]["tokens"]
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


def io_tables(args: argparse.Namespace) -> None:
    tables = args.tables.split(",")
    if "checkpoints" in tables:
        checkpoint_table(args)
    if "memory" in tables:
        memory_table(args)
    if "shards" in tables:
        shard_boundary_table(args)


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
    for i in range(args.warmup, total):
        result = runner.train_step(batches[i % len(batches)], 10**6)
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
        "mfu": runner.flops_per_step(batch_size, args.unroll_steps) / step_s / peak,
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


KERNEL_KINDS = (
    ("LSTM cell (Triton)", r"_cell_(forward|backward)_kernel"),
    ("matrix products", r"gemm|xmma|cutlass|sm90|sm80|ampere|hopper|cublas|nvjet|splitK"),
    ("fused optimizer", r"[Ff]used|multi_tensor|adagrad|adam"),
    ("softmax/logsumexp", r"softmax|logsumexp|LogSumExp"),
    ("reductions", r"reduce|Reduce|norm"),
    ("index/gather/scatter", r"index|gather|scatter|embedding"),
    ("sort/scan", r"sort|Sort|radix|scan|Scan|cumsum"),
    ("copies/memset", r"copy|Memcpy|Memset|memcpy|memset|fill|cat|CatArray"),
    ("elementwise", r"elementwise|vectorized|unrolled|Elementwise"),
)


def profile_steps(args, runner: StepRunner, batches: list[LMBatch]) -> dict:
    """Kernel time per kind over ``args.profile_steps`` steps, from the PyTorch profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for i in range(args.profile_steps):
            runner.train_step(batches[i % len(batches)], 10**6)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    os.makedirs(args.profile, exist_ok=True)
    name = f"trace_{runner.cfg.batch_size}_{'bf16' if runner.cfg.bf16 else 'float32'}.json"
    prof.export_chrome_trace(os.path.join(args.profile, name))
    kinds: dict[str, float] = {}
    counts: dict[str, int] = {}
    top: dict[str, float] = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
        kind = next((k for k, pattern in KERNEL_KINDS if re.search(pattern, event.name)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + us
        counts[kind] = counts.get(kind, 0) + 1
        top[event.name[:90]] = top.get(event.name[:90], 0.0) + us
    steps = args.profile_steps
    return {
        "wall_ms_per_step": wall * 1e3 / steps,
        "kernel_ms_per_step": sum(kinds.values()) / 1e3 / steps,
        "kinds": {
            k: (v / 1e3 / steps, counts[k] / steps) for k, v in sorted(kinds.items(), key=lambda x: -x[1])
        },
        "top": sorted(((v / 1e3 / steps, k) for k, v in top.items()), reverse=True)[:15],
    }


def cuda_main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        sys.exit("train_step: --device cuda but no CUDA device")
    if "steps" not in args.tables.split(","):
        io_tables(args)
        return 0
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
    io_tables(args)
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
    p = row["profile"]
    print(
        f"\nkernel time of {row['preset']} {row['dtype']} batch {row['batch']} {row['mode']}: "
        f"{p['kernel_ms_per_step']:.2f} ms of kernels in {p['wall_ms_per_step']:.2f} ms per step (profiled)"
    )
    print("| kernels | ms/step | launches/step |")
    print("|---|---|---|")
    for kind, (ms, count) in p["kinds"].items():
        print(f"| {kind} | {ms:.2f} | {count:.0f} |")
    print("top kernels (ms/step):")
    for ms, name in p["top"]:
        print(f"  {ms:7.3f}  {name}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--presets", default=None, help="comma-separated (CPU: the first; default small)")
    parser.add_argument("--workers", default="1,2", help="CPU: comma-separated worker counts")
    parser.add_argument("--threads", type=int, default=1, help="CPU: torch threads per worker")
    parser.add_argument("--batch-size", type=int, default=32, help="CPU: rows per worker")
    parser.add_argument("--batch-sizes", default="128,256,512,1024", help="GPU: rows per GPU")
    parser.add_argument("--dtypes", default="bf16,float32", help="GPU: bf16 (autocast) and/or float32")
    parser.add_argument("--modes", default="graph,eager", help="GPU: graph (CUDA graph) and/or eager")
    parser.add_argument("--eager-batches", default="128", help="GPU: batch sizes that also run eagerly")
    parser.add_argument("--unroll-steps", type=int, default=20)
    parser.add_argument("--negatives", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=100_000, help="synthetic vocabulary size (softmax rows)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (CPU 3, GPU 20)")
    # CPU: DDP rebuilds its gradient buckets after the first iteration, so step 2 is not steady state
    # either; GPU: the graph is captured after 3 eager steps
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (CPU 2, GPU 6)")
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
    parser.add_argument(
        "--tables",
        default="steps",
        help="comma-separated: steps (the throughput table), checkpoints, memory, shards; io = the last three",
    )
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--checkpoint-steps", type=int, default=60, help="timed steps per mode and round")
    parser.add_argument("--checkpoint-repeats", type=int, default=2, help="rounds of the modes")
    parser.add_argument("--checkpoint-batch-size", type=int, default=8)
    parser.add_argument(
        "--checkpoint-dir", default="", help="where checkpoints are written (default: a temp dir)"
    )
    parser.add_argument("--memory-presets", default="small,original")
    parser.add_argument(
        "--memory-vocabs",
        default="100000,793471",
        help="softmax rows of each memory preset (the original's: 1B Word)",
    )
    parser.add_argument(
        "--in-memory-max-gib",
        type=float,
        default=1.0,
        help="largest state also saved the old way (3x its size)",
    )
    parser.add_argument("--boundary-shards", type=int, default=4)
    parser.add_argument("--boundary-sentences", type=int, default=20_000, help="sentences per shard")
    parser.add_argument("--boundary-batch-size", type=int, default=128)
    parser.add_argument("--boundary-steps", type=int, default=600)
    parser.add_argument("--boundary-step-ms", type=float, default=30.0, help="stand-in device step")
    args = parser.parse_args(argv)
    args.tables = args.tables.replace("io", "checkpoints,memory,shards")
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
