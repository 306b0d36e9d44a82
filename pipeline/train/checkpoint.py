"""Training checkpoints in the run directory (local or ``s3://``), through pipeline.runtime.storage.

A checkpoint holds the ``state_dict()`` of every stateful part of a run, by name: the parts every
rank holds alike (model, softmax, optimizer) once, the parts each rank holds for itself (its data
stream position, carried LSTM state, RNG states) once per rank. `Checkpointer` decides when to save
(every N steps and at the last step), writes, prunes and restores them.

Layout: ``RUN/checkpoints/step-000001250/`` holds
- ``model.pt`` (rank 0): the shared parts, the step, and the run's options, config and vocabulary;
- ``rank-00000.pt`` ... (every rank): its own parts;
- ``COMPLETE`` (rank 0, last, after every rank's file is written): ``{"step", "world_size"}``.

A checkpoint counts only once ``COMPLETE`` exists, so a run killed while writing one resumes from
the previous one.

Saving is off the training step's critical path: at a save point every rank takes a snapshot of its
parts (pipeline.train.snapshot: on a GPU a device-to-host copy queued into reused pinned buffers,
which the host does not wait for; CPU tensors are copied, since training goes on changing them) and
the run's checkpoint write queue (``run_dir.RunWriter``: a background thread) waits for the copy
and streams it with ``torch.save`` straight into
``storage.open_write`` (a temp file + rename, or an S3 multipart upload), so no serialised copy is
ever held in memory: a save costs about one state size of host memory, the snapshot. Rank 0's thread
then waits until every rank's file exists and writes ``COMPLETE``; no collective runs in the thread
(gloo and NCCL process groups are not safe to share with the training's collectives). The next save,
the last step's save (which finishes before it returns) and ``wait()`` wait for the previous save
and raise its error; ``restore`` first deletes the incomplete checkpoints an earlier attempt left,
whose rank files rank 0 would otherwise count.

Files hold only tensors and plain containers and are read with
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
import shutil
import time
from typing import Any, Protocol

import numpy as np
import torch

from pipeline.runtime import storage
from pipeline.runtime.background import WriteQueue
from pipeline.train.distributed import barrier
from pipeline.train.errors import TrainError
from pipeline.train.run_dir import RunDir
from pipeline.train.snapshot import HostSnapshot, Snapshot

FORMAT = 2
"""Checkpoint layout version (1: RNG states pickled as numpy and Python objects)."""
MODEL_FILE = "model.pt"
COMPLETE_FILE = "COMPLETE"
RANKS_TIMEOUT_S = 1800.0
"""How long rank 0 waits for the other ranks' files of a checkpoint before giving up on it."""
_STEP_DIR = re.compile(r"step-(\d{9})$")


class CheckpointError(TrainError):
    """A checkpoint that cannot be used; one line naming it."""


def checkpoints_root(run_dir: str) -> str:
    return RunDir(run_dir).checkpoints


def checkpoint_path(run_dir: str, step: int) -> str:
    """``RUN/checkpoints/step-000001250``."""
    return RunDir(run_dir).checkpoint(step)


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


def _save_file(file: str, payload: Any) -> None:
    """``torch.save`` streamed into ``file``: each tensor goes from its memory to the file (or the
    S3 upload's parts) as it is written, never into a serialised copy of the whole payload."""
    with storage.open_write(file) as stream:
        torch.save(payload, stream)


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
    _save_file(storage.join(path, MODEL_FILE), payload)


def save_rank(path: str, rank: int, payload: dict) -> None:
    """One rank's part (data position, LSTM states, RNG states)."""
    _save_file(storage.join(path, rank_file(rank)), payload)


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
    doomed = [path for step, path in _step_dirs(run_dir) if step < oldest_kept]
    for path in doomed:
        delete_checkpoint(path)
    return doomed


def drop_incomplete(run_dir: str) -> list[str]:
    """Delete every checkpoint directory without ``COMPLETE`` (what a killed attempt left); returns
    their paths. Rank 0 counts a checkpoint's rank files to complete it, so a rerun must not find
    an earlier attempt's files under a step it saves again."""
    complete = {path for _, path in list_checkpoints(run_dir)}
    doomed = [path for _, path in _step_dirs(run_dir) if path not in complete]
    for path in doomed:
        delete_checkpoint(path)
    return doomed


def _step_dirs(run_dir: str) -> list[tuple[int, str]]:
    """Every checkpoint directory holding a file, complete or not, as ``(step, path)``, oldest first."""
    parents = {p.rstrip("/").rpartition("/")[0] for p in storage.list_prefix(checkpoints_root(run_dir) + "/")}
    found = [(int(m.group(1)), path) for path in parents if (m := _STEP_DIR.search(path))]
    return sorted(found)


def delete_checkpoint(path: str) -> None:
    """Delete checkpoint directory ``path``, ``COMPLETE`` first, so that a half-deleted checkpoint is
    never taken for a usable one."""
    files = storage.list_prefix(path + "/")
    for file in sorted(files, key=lambda f: not f.endswith(COMPLETE_FILE)):
        storage.delete(file)
    if not storage.is_s3(path) and os.path.isdir(path):
        # listings skip the temp files of a write that a killed process left behind
        shutil.rmtree(path, ignore_errors=True)


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


def await_rank_files(path: str, world_size: int, timeout_s: float, poll_s: float = 0.05) -> None:
    """Wait until every rank's file of checkpoint ``path`` exists (rank 0 marks it complete then).

    Polls storage rather than joining a barrier: this runs in the saving thread, beside the training
    step's collectives. A TimeoutError after ``timeout_s``: a rank that never writes its file was
    lost, and another attempt may succeed (``launch`` retries what is not a PipelineError)."""
    deadline = time.monotonic() + timeout_s
    for rank in range(1, world_size):
        file = storage.join(path, rank_file(rank))
        while not storage.exists(file):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"checkpoint {path}: rank {rank}'s {rank_file(rank)} did not appear within "
                    f"{timeout_s:g} s; was that worker lost?"
                )
            time.sleep(poll_s)
            poll_s = min(2 * poll_s, 1.0)


class Checkpointer:
    """Saves and restores a run's parts (``state_dict()`` of each) in ``run_dir``.

    ``shared``: parts every rank holds alike, written by rank 0; ``own``: parts each rank writes for
    itself; ``meta``: facts rank 0 writes beside the shared parts (the model's options, which a
    restore checks, the config, the vocabulary for export). Saves every ``every`` steps and at the
    last step, keeping the newest ``keep`` checkpoints.

    ``background`` (default): a save takes a snapshot and queues its writing on ``writes`` (the run's
    checkpoint ``WriteQueue``, ``run_dir.RunWriter``; one of its own when None) while training goes
    on (module docstring); otherwise it writes the parts themselves, streamed, before it returns
    (no snapshot, so no extra memory, but the loop waits). ``ranks_timeout_s``: how long rank 0
    waits for the other ranks' files.

    What saving costs the loop is counted for the train rows (`take_metrics`): a save waits for the
    previous one, so storage slower than the checkpoint interval holds training back, and the
    step rate, which leaves checkpoints out, does not show it.
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
        background: bool = True,
        ranks_timeout_s: float = RANKS_TIMEOUT_S,
        writes: WriteQueue | None = None,
    ):
        self.run_dir, self.rank, self.world_size = run_dir, rank, world_size
        self.every, self.keep = every, keep
        self.shared, self.own, self.meta = shared, own, meta
        self.background, self.ranks_timeout_s = background, ranks_timeout_s
        self.writes = writes if writes is not None else WriteQueue("checkpoints")
        self._host = HostSnapshot()
        self._save_s = self._wait_s = 0.0

    def due(self, step: int, last_step: bool) -> bool:
        """Whether ``step`` saves. Also raises the error of a background save that failed since."""
        self.writes.check()
        return last_step or step % self.every == 0

    def save(self, step: int, last_step: bool = False) -> bool:
        """Save the checkpoint of ``step`` if one is due; every rank calls it alike. Returns whether
        it saved. It first waits for the previous save (raising its error); in the background
        mode it returns once the snapshot is taken, except at the last step, whose checkpoint is
        complete (rank 0) or written (other ranks) when it returns."""
        if not self.due(step, last_step):
            return False
        start = time.perf_counter()
        if not self.writes.idle:  # one save in flight at a time: its snapshot's buffers are the next one's
            self.writes.wait()
            self._wait_s += time.perf_counter() - start
        self.writes.check()
        path = checkpoint_path(self.run_dir, step)
        own = {name: part.state_dict() for name, part in self.own.items()}
        shared = {name: part.state_dict() for name, part in self.shared.items()} if self.rank == 0 else {}
        if not self.background or last_step:
            self._write(path, step, own, shared)
        else:
            taken = self._host.take({"own": own, "shared": shared})
            self.writes.submit(lambda: self._write_snapshot(path, step, taken))
        self._save_s += time.perf_counter() - start
        return True

    def take_metrics(self) -> dict[str, float]:
        """Seconds the loop spent in `save` calls since the last call, ``checkpoint/save_s``, and of
        those the seconds it waited for a previous save to finish writing, ``checkpoint/wait_s``;
        counting starts again from zero."""
        metrics = {"checkpoint/save_s": self._save_s, "checkpoint/wait_s": self._wait_s}
        self._save_s = self._wait_s = 0.0
        return metrics

    def _write_snapshot(self, path: str, step: int, taken: Snapshot) -> None:
        taken.wait()
        self._write(path, step, taken.payload["own"], taken.payload["shared"])

    def _write(self, path: str, step: int, own: dict, shared: dict) -> None:
        """This rank's files of checkpoint ``path``; rank 0 then completes it and prunes."""
        save_rank(path, self.rank, own)
        if self.rank != 0:
            return
        save_model(path, {**self.meta, **shared, "step": step, "format": FORMAT})
        await_rank_files(path, self.world_size, self.ranks_timeout_s)
        mark_complete(path, step, self.world_size)
        prune(self.run_dir, self.keep)

    def wait(self) -> None:
        """Wait for the save in flight, if any; raises the error it failed with."""
        self.writes.wait()

    def restore(self) -> int | None:
        """Load every part from the newest complete checkpoint; returns its step (None: no checkpoint).

        Every rank calls it before training: rank 0 first deletes incomplete checkpoints, and all
        ranks meet at a barrier before any of them can save again."""
        self.wait()
        if self.rank == 0:
            drop_incomplete(self.run_dir)
        barrier()
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
            if name in payload or not getattr(part, "optional", False):
                part.load_state_dict(payload[name])
        mine = load_rank(path, self.rank, self.world_size)
        for name, part in self.own.items():
            part.load_state_dict(mine[name])
        return int(payload["step"])
