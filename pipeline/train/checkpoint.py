"""Training checkpoints in the run directory (local or ``s3://``), through pipeline.storage.

Layout: ``RUN/checkpoints/step-000001250/`` holds
- ``model.pt`` (rank 0): options, model and softmax weights, optimizer state, step, config;
- ``rank-00000.pt`` ... (every rank): its data position, LSTM states and RNG states;
- ``COMPLETE`` (rank 0, last, after every rank's file is written): ``{"step", "world_size"}``.

A checkpoint counts only once ``COMPLETE`` exists, so a run killed while writing one resumes from
the previous one. Ray's own checkpoint storage is not used: the run directory must hold the
checkpoints whether it is local or on S3 (through the one storage layer), and a rerun with the same
name must find them without Ray's experiment state.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
from typing import Any

import numpy as np
import torch

from pipeline import storage

CHECKPOINTS = "checkpoints"
MODEL_FILE = "model.pt"
COMPLETE_FILE = "COMPLETE"
_STEP_DIR = re.compile(r"step-(\d{9})$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; one line naming it."""


def checkpoints_root(run_dir: str) -> str:
    return storage.join(run_dir, CHECKPOINTS)


def checkpoint_path(run_dir: str, step: int) -> str:
    """``RUN/checkpoints/step-000001250``."""
    return storage.join(checkpoints_root(run_dir), f"step-{step:09d}")


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def list_checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """Complete checkpoints of a run as ``(step, path)``, oldest first."""
    found = []
    for path in storage.list_prefix(checkpoints_root(run_dir) + "/"):
        parent, _, name = path.rstrip("/").rpartition("/")
        match = _STEP_DIR.search(parent)
        if name == COMPLETE_FILE and match:
            found.append((int(match.group(1)), parent))
    return sorted(found)


def latest_checkpoint(run_dir: str) -> str | None:
    """Path of the newest complete checkpoint, or None."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def _to_bytes(payload: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(payload, buf)
    return buf.getvalue()


def _from_bytes(data: bytes, where: str) -> Any:
    try:
        # our own files: they hold numpy / python RNG states, which the weights-only loader refuses
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means an unusable file
        raise CheckpointError(f"checkpoint file {where} cannot be read: {str(err).splitlines()[0]}") from None


def save_model(path: str, payload: dict) -> None:
    """Rank 0's part (weights, optimizer, step, config)."""
    storage.write_bytes(storage.join(path, MODEL_FILE), _to_bytes(payload))


def save_rank(path: str, rank: int, payload: dict) -> None:
    """One rank's part (data position, LSTM states, RNG states)."""
    storage.write_bytes(storage.join(path, rank_file(rank)), _to_bytes(payload))


def mark_complete(path: str, step: int, world_size: int) -> None:
    """Written last: makes the checkpoint visible to ``list_checkpoints``."""
    storage.write_bytes(
        storage.join(path, COMPLETE_FILE), json.dumps({"step": step, "world_size": world_size}).encode()
    )


def read_complete(path: str) -> dict:
    marker = storage.join(path, COMPLETE_FILE)
    if not storage.exists(marker):
        raise CheckpointError(f"{path} is not a complete checkpoint (no {COMPLETE_FILE})")
    return json.loads(storage.read_bytes(marker))


def load_model(path: str) -> dict:
    """Rank 0's part of checkpoint ``path``."""
    file = storage.join(path, MODEL_FILE)
    if not storage.exists(file):
        raise CheckpointError(f"{path}: no {MODEL_FILE}; not a training checkpoint")
    return _from_bytes(storage.read_bytes(file), file)


def load_rank(path: str, rank: int, world_size: int) -> dict:
    """Rank ``rank``'s part; a CheckpointError when the checkpoint was written by another world size."""
    written = int(read_complete(path)["world_size"])
    if written != world_size:
        raise CheckpointError(
            f"checkpoint {path} was written by {written} workers; resume it with workers={written} (got {world_size})"
        )
    file = storage.join(path, rank_file(rank))
    return _from_bytes(storage.read_bytes(file), file)


def prune(run_dir: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` complete checkpoints (and incomplete ones older than them);
    returns the deleted checkpoint paths."""
    complete = list_checkpoints(run_dir)
    if len(complete) <= keep:
        return []
    oldest_kept = complete[-keep][0] if keep > 0 else complete[-1][0] + 1
    doomed = sorted(
        {p.rstrip("/").rpartition("/")[0] for p in storage.list_prefix(checkpoints_root(run_dir) + "/")}
    )
    deleted = []
    for path in doomed:
        match = _STEP_DIR.search(path)
        if not match or int(match.group(1)) >= oldest_kept:
            continue
        # COMPLETE goes first so a half-deleted checkpoint is never taken for a usable one
        files = storage.list_prefix(path + "/")
        for file in sorted(files, key=lambda f: not f.endswith(COMPLETE_FILE)):
            storage.delete(file)
        if not storage.is_s3(path) and os.path.isdir(path):
            os.rmdir(path)
        deleted.append(path)
    return deleted


# ---- RNG states ------------------------------------------------------------------------------


def rng_states(generator: torch.Generator) -> dict:
    """Every RNG a rank draws from: torch (CPU, CUDA), numpy, python, and the negatives sampler's."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "sampler": generator.get_state(),
    }


def restore_rng_states(states: dict, generator: torch.Generator) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])
    generator.set_state(states["sampler"])
