"""Training checkpoints in the run directory (local or ``s3://``), through pipeline.storage.

A checkpoint holds the ``state_dict()`` of every stateful part of a run, by name: the parts every
rank holds alike (model, softmax, optimizer) once, the parts each rank holds for itself (its data
stream position, carried LSTM state, RNG states) once per rank. `Checkpointer` decides when to save
(every N steps and at the last step), writes, prunes and restores them.

Layout: ``RUN/checkpoints/step-000001250/`` holds
- ``model.pt`` (rank 0): the shared parts, the step, and the run's options, config and vocabulary;
- ``rank-00000.pt`` ... (every rank): its own parts;
- ``COMPLETE`` (rank 0, last, after every rank's file is written): ``{"step", "world_size"}``.

A checkpoint counts only once ``COMPLETE`` exists, so a run killed while writing one resumes from
the previous one. Files hold only tensors and plain containers and are read with
``torch.load(weights_only=True)``: loading a checkpoint never runs code from it. Ray's own
checkpoint storage is not used: the run directory must hold the checkpoints whether it is local or
on S3 (through the one storage layer), and a rerun with the same name must find them without Ray's
experiment state.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
from typing import Any, Protocol

import numpy as np
import torch

from pipeline import storage
from pipeline.train.distributed import barrier
from pipeline.train.errors import TrainError

FORMAT = 2
"""Checkpoint layout version (1: RNG states pickled as numpy and Python objects)."""
CHECKPOINTS = "checkpoints"
MODEL_FILE = "model.pt"
COMPLETE_FILE = "COMPLETE"
_STEP_DIR = re.compile(r"step-(\d{9})$")


class CheckpointError(TrainError):
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
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means an unusable file
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(
            f"checkpoint file {where} cannot be read as tensors and plain data ({reason}); "
            "it is damaged, not a checkpoint of this program, or tampered with"
        ) from None


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


# ---- the parts a run saves ---------------------------------------------------------------------


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> Any: ...


class RNGStates:
    """Every RNG a rank draws from, as one checkpoint part: torch (CPU, CUDA), numpy, python, and
    the negatives sampler's ``generator``. Stored as tensors and plain containers."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def state_dict(self) -> dict:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        version, internal, gauss_next = random.getstate()
        return {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": {
                "name": name,
                "keys": torch.from_numpy(keys.astype(np.int64)),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached),
            },
            "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
            "sampler": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])
        if state["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
        n = state["numpy"]
        keys = n["keys"].numpy().astype(np.uint32)
        np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
        p = state["python"]
        random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
        self.generator.set_state(state["sampler"])


class Checkpointer:
    """Saves and restores a run's parts (``state_dict()`` of each) in ``run_dir``.

    ``shared``: parts every rank holds alike, written by rank 0; ``own``: parts each rank writes for
    itself; ``meta``: facts rank 0 writes beside the shared parts (the model's options, which a
    restore checks, the config, the vocabulary for export). Saves every ``every`` steps and at the
    last step, keeping the newest ``keep`` checkpoints.
    """

    def __init__(
        self,
        run_dir: str,
        rank: int,
        world_size: int,
        every: int,
        keep: int,
        shared: dict[str, Stateful],
        own: dict[str, Stateful],
        meta: dict[str, Any],
    ):
        self.run_dir, self.rank, self.world_size = run_dir, rank, world_size
        self.every, self.keep = every, keep
        self.shared, self.own, self.meta = shared, own, meta

    def due(self, step: int, last_step: bool) -> bool:
        return last_step or step % self.every == 0

    def save(self, step: int, last_step: bool = False) -> bool:
        """Save the checkpoint of ``step`` if one is due; every rank calls it alike (it waits for
        all ranks before marking the checkpoint complete). Returns whether it saved."""
        if not self.due(step, last_step):
            return False
        path = checkpoint_path(self.run_dir, step)
        save_rank(path, self.rank, {name: part.state_dict() for name, part in self.own.items()})
        if self.rank == 0:
            shared = {name: part.state_dict() for name, part in self.shared.items()}
            save_model(path, {**self.meta, **shared, "step": step, "format": FORMAT})
        barrier()
        if self.rank == 0:
            mark_complete(path, step, self.world_size)
            prune(self.run_dir, self.keep)
        return True

    def restore(self) -> int | None:
        """Load every part from the newest complete checkpoint; returns its step (None: no checkpoint)."""
        path = latest_checkpoint(self.run_dir)
        if path is None:
            return None
        payload = load_model(path)
        if payload.get("format") != FORMAT:
            raise CheckpointError(
                f"checkpoint {path} was written in another format ({payload.get('format', 1)}, this program "
                f"reads {FORMAT}); start a new run directory or export it with the version that wrote it"
            )
        if payload["options"] != self.meta["options"]:
            raise CheckpointError(f"checkpoint {path} holds a different model than the config asks for")
        for name, part in self.shared.items():
            part.load_state_dict(payload[name])
        mine = load_rank(path, self.rank, self.world_size)
        for name, part in self.own.items():
            part.load_state_dict(mine[name])
        return int(payload["step"])
