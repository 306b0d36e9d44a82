"""Memory of a checkpoint save: the peak resident memory of this process while saving each preset's
full-size state (model, softmax, optimizer), against the state's size, for the background save (a
snapshot, streamed) and the synchronous streamed one.

    python benchmarks/checkpoint_memory.py                  # small and original (CPU: ~10 GB RAM)
    python benchmarks/checkpoint_memory.py --memory-presets small --memory-vocabs 100000

(The serialise-into-memory-first save that came before is gone; its figures stay in docs/benchmarks.md.)
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.step_setup import checkpointer_for, state_bytes  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.model_config import to_options  # noqa: E402
from pipeline.train.config import TrainConfig  # noqa: E402
from pipeline.train.step import StepRunner  # noqa: E402


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
            modes = [("background (snapshot, streamed)", True), ("streamed, synchronous", False)]
            for step, (mode, background) in enumerate(modes, start=1):
                saver = checkpointer_for(runner, tmp, 1, background)
                with PeakRSS() as rss:
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--memory-presets", default="small,original")
    parser.add_argument(
        "--memory-vocabs",
        default="100000,793471",
        help="softmax rows of each preset (the original's: 1B Word)",
    )
    parser.add_argument(
        "--checkpoint-dir", default="", help="where checkpoints are written (default: a temp dir)"
    )
    memory_table(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
