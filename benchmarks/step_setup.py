"""What the training-step benchmarks share: the step of ``elmo train`` (``StepRunner``) built from a
preset over a synthetic vocabulary, synthetic batches with realistic repeats, its checkpointer, and
the arguments every one of them takes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import load_config  # noqa: E402
from pipeline.model_config import to_options  # noqa: E402
from pipeline.train.char_cache import CharCache  # noqa: E402
from pipeline.train.checkpoint import Checkpointer, RNGStates  # noqa: E402
from pipeline.train.config import TrainConfig  # noqa: E402
from pipeline.train.data import LMBatch  # noqa: E402
from pipeline.train.step import StepRunner  # noqa: E402


def add_step_args(parser: argparse.ArgumentParser, presets: str | None = None) -> None:
    """The arguments of the step every benchmark builds."""
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--presets", default=presets, help="comma-separated preset names")
    parser.add_argument("--unroll-steps", type=int, default=20)
    parser.add_argument("--negatives", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=100_000, help="synthetic vocabulary size (softmax rows)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first")


def synthetic_cache(vocab: int) -> CharCache:
    """The spellings of a synthetic vocabulary of ``vocab`` words ``w<id>`` after the specials."""
    return CharCache(["<S>", "</S>", "<UNK>", *(f"w{i}" for i in range(vocab - 3))])


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
    cache = synthetic_cache(args.vocab)
    return StepRunner(cfg, options, cache.vocab_size, torch.device(args.device)), cache


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


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
