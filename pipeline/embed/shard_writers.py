"""Writer processes: an embed actor's shards committed beside it, in processes of their own.

Committing a shard (``resume.commit_shard``: the file written and hashed as it is written, synced,
renamed, then its entry) is bulk work on whole arrays, but on threads of one process it stops
scaling near 2.3 cores: h5py runs one call at a time in a process, and the rest of a commit takes
the GIL between its bulk steps (docs/benchmarks.md, "The actor's host side alone"). So an actor
hands each shard to one of its writer processes, which commits it and answers with the shard's
entry:

    actor thread: passes -> ShardAssembler -> vectors on a SharedBuffers buffer
                  -> ShardWriters.commit ------(socket: entry fields, the buffer's fd)-----> writer
                  <----------------------------(child_process.outcome: the entry or an error)--- commit_shard

The vectors are never copied between processes: the actor's ``BufferPool`` allocates its buffers
as memfds (:class:`SharedBuffers`), and a writer maps each buffer once, read-only, the first time
it is handed one (its file descriptor travels with the request, ``SCM_RIGHTS``). A memfd is not a
file in ``/dev/shm`` (64 MB in a default container): it has no size limit but memory's, and its
pages go when the last process holding them lets go, so a kill leaves nothing behind. A pooled
shard's small array (not a pooled buffer) travels in the request itself.

Exactly-once is ``commit_shard``'s, unchanged: each shard is written under a temp name and
renamed, then its entry written, by whichever writer takes it; the driver writes the manifest last.
A writer's lifetime is its actor's: started with it (their imports overlap the model's load),
it stops when the actor closes its socket or when the actor is gone (killed: the writer notices
within a quarter of a second), or on a SIGTERM (the embedded cluster's watchdog), discarding the
partial file of a commit it is in, which the rerun redoes. Writers lead sessions of their own
(as the embedded cluster's processes do) and ignore SIGINT: a Ctrl-C or a scheduler's signal to
the job's group is the driver's to act on. They import neither torch nor Ray.
"""

from __future__ import annotations

import mmap
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np

from pipeline.embed.errors import WORKER_ERRORS, EmbedError
from pipeline.embed.file_format import EmbeddingFormat
from pipeline.embed.resume import commit_shard
from pipeline.embed.shard_vectors import ShardVectors
from pipeline.runtime import stopping
from pipeline.runtime.background import STOPPED_STATES, process_state, when_parent_goes
from pipeline.runtime.child_process import Channel, outcome, result_of, start_python

_MAX_FDS = 1
"""File descriptors a request carries: its buffer's, when its vectors are on one."""

PARENT_POLL_S = 0.25
"""How often a writer checks that its actor is still there."""

_MAIN = "import pipeline.embed.shard_writers as elmo_shard_writer; elmo_shard_writer.serve()"
"""A writer process's program (its command line names it, for ``ps`` and the benchmarks' tables)."""

STOP_WAIT_S = 10.0
"""How long :meth:`ShardWriters.close` waits for a writer to finish before it is killed."""

ANSWER_MIN_S = 120.0
ANSWER_BYTES_PER_S = 20e6
"""A commit's answer is waited for ``ANSWER_MIN_S`` plus its vectors' bytes at ``ANSWER_BYTES_PER_S``
(a 1 GB shard: 170 s; a commit of it takes about 1 s on a local disk), then the writer is ended: one
blocked in the kernel (a hung NFS or FUSE mount) or stopped would hold the run for ever, silently."""

STOPPED_S = 10.0
"""A writer stopped by a signal (SIGSTOP, SIGTSTP, a debugger) this long is ended at once: it does
not run again until someone continues it."""

POLL_S = 1.0
"""How often the wait for a commit's answer looks at the writer's state."""


@dataclass(frozen=True)
class SharedArray:
    """Where an array lies on a :class:`SharedBuffers` buffer: its ``buffer``, the ``offset`` of its
    first byte, its ``shape`` and ``dtype`` (C-contiguous)."""

    buffer: int
    offset: int
    shape: tuple[int, ...]
    dtype: str


class SharedBuffers:
    """``BufferPool``'s allocator in an actor with writer processes: each buffer a memfd, mapped
    here read-write and by a writer read-only. Thread-safe. A buffer's file descriptor is closed
    when the pool has dropped the buffer and no array views it any more."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self._open: dict[int, tuple[int, int, int]] = {}  # buffer -> (fd, first byte's address, bytes)

    def __call__(self, nbytes: int) -> np.ndarray:
        fd = os.memfd_create("elmo-shard-vectors", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
            mapping = mmap.mmap(fd, nbytes)
        except BaseException:
            os.close(fd)
            raise
        array = np.frombuffer(mapping, dtype=np.uint8)
        with self._lock:
            key, self._next = self._next, self._next + 1
            self._open[key] = (fd, _address(array), nbytes)
        weakref.finalize(array, self._close, key)
        return array

    def _close(self, key: int) -> None:
        with self._lock:
            fd, _, _ = self._open.pop(key)
        os.close(fd)

    def find(self, array: np.ndarray) -> tuple[int, SharedArray] | None:
        """(fd, where) of a C-contiguous ``array`` on one of these buffers; None when it is not
        on one (it then travels by value)."""
        if not array.flags.c_contiguous:
            return None
        start = _address(array)
        with self._lock:
            for key, (fd, base, nbytes) in self._open.items():
                if base <= start and start + array.nbytes <= base + nbytes:
                    return fd, SharedArray(key, start - base, array.shape, array.dtype.str)
        return None

    def live(self) -> list[int]:
        """The buffers still open (a writer lets go of the others' mappings)."""
        with self._lock:
            return list(self._open)


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


class ShardWriters:
    """``count`` writer processes and the shared buffers they read. ``commit`` is called from any
    of the actor's threads; each call takes an idle writer (waiting for one when all are busy)."""

    def __init__(self, count: int):
        self.buffers = SharedBuffers()
        self._writers: list[_Writer] = []
        try:
            for _ in range(max(1, count)):
                self._writers.append(_Writer())
        except BaseException:
            self.close()  # the ones already started
            raise
        self._idle: queue.SimpleQueue[_Writer] = queue.SimpleQueue()
        for writer in self._writers:
            self._idle.put(writer)

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._writers]

    def commit(self, output: str, stats: dict, shard: ShardVectors, fmt: EmbeddingFormat) -> dict:
        """``resume.commit_shard(output, stats, shard, fmt)`` in a writer process (``fmt``, bound to
        its layout, travels whole); the shard's entry. A writer's one-line error is raised as
        EmbedError."""
        found = self.buffers.find(shard.vectors)
        fds, vectors = ([], shard.vectors) if found is None else ([found[0]], found[1])
        request = {
            "output": output,
            "stats": stats,
            "file_format": fmt,
            "shard": (
                shard.first_line,
                vectors,
                shard.offsets,
                shard.pooled,
                shard.tokens,
                shard.records,
                shard.lines,
            ),
            "live": self.buffers.live(),
        }
        writer = self._idle.get()
        try:
            return writer.commit(request, fds, shard.vectors.nbytes)
        finally:
            self._idle.put(writer)

    def close(self) -> None:
        """Stop every writer (each finishes the commit it is in)."""
        for writer in self._writers:
            writer.close()


class _Writer:
    """One writer process and the actor's end of its channel (Linux: memfds travel beside it)."""

    def __init__(self) -> None:
        self.channel, theirs = Channel.pair(_MAX_FDS)
        try:
            # a session (and group) of its own: a Ctrl-C or a scheduler's signal to the job's group is
            # the driver's to act on; a writer stops with its actor (see serve)
            self.process = start_python(
                ["-c", _MAIN, str(theirs.fileno())], pass_fds=[theirs.fileno()], own_session=True
            )
        except BaseException:
            self.channel.close()
            raise
        finally:
            theirs.close()

    def commit(self, request: dict, fds: list[int], nbytes: int) -> dict:
        """The entry of the shard ``request`` carries (its vectors ``nbytes``), from the writer."""
        index = request["stats"]["index"]
        try:
            self.channel.send(request, fds)
            self._await_answer(index, ANSWER_MIN_S + nbytes / ANSWER_BYTES_PER_S)
            answer, _ = self.channel.receive()
        except (EOFError, OSError):
            raise EmbedError(
                f"the writer process of shard {index} (pid {self.process.pid}) {self._ended()} before committing it; "
                "rerun the same command to redo it"
            ) from None
        try:
            return result_of(answer)
        except WORKER_ERRORS as err:
            raise EmbedError(str(err)) from None

    def _await_answer(self, index: int, limit_s: float) -> None:
        """Return once the writer's answer is there; past ``limit_s``, or once the writer has been
        stopped ``STOPPED_S``, end it and raise an EmbedError naming its pid and state."""
        started = time.monotonic()
        stopped_since = None
        while not select.select([self.channel], [], [], POLL_S)[0]:
            code, state = process_state(self.process.pid)
            now = time.monotonic()
            stopped_since = (stopped_since or now) if code in STOPPED_STATES else None
            if now - started > limit_s or (stopped_since is not None and now - stopped_since > STOPPED_S):
                self.process.kill()  # a stopped process dies of SIGKILL too; its partial file stays for the rerun
                self.process.wait()
                raise EmbedError(
                    f"the writer process of shard {index} (pid {self.process.pid}, {state}) did not answer "
                    f"within {now - started:.0f} s; it was ended; rerun the same command to redo the shard"
                )

    def _ended(self) -> str:
        try:
            code = self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"

    def close(self) -> None:
        self.channel.close()  # the writer's next read ends: it exits
        try:
            self.process.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# ---------------------------------------------------------------- the writer process


def serve() -> None:
    """A writer process's loop: requests in, ``commit_shard``, entries out, until the actor closes
    its end or is gone."""
    # SIGTERM leaves by an exception, so a commit in progress discards its partial file (once: the
    # watchdog's SIGTERM and the parent watch's can both come)
    stopping.child_process(exit_on_sigterm=True)
    # a SIGTERM to this process once its actor is gone (killed: its socket may live on in a process it forked)
    when_parent_goes(os.getppid(), lambda: os.kill(os.getpid(), signal.SIGTERM), PARENT_POLL_S)
    channel = Channel.from_fd(int(sys.argv[1]), _MAX_FDS)
    mapped: dict[int, np.ndarray] = {}
    while True:
        try:
            request, fds = channel.receive()
        except (EOFError, ConnectionError):
            return
        answer = outcome(_commit, request, fds, mapped, expected=WORKER_ERRORS)
        try:
            channel.answer(answer)
        except (BrokenPipeError, ConnectionError):
            return


def _commit(request: dict, fds: list[int], mapped: dict[int, np.ndarray]) -> dict:
    first_line, vectors, offsets, pooled, tokens, records, lines = request["shard"]
    if isinstance(vectors, SharedArray):
        vectors = _shared_view(vectors, fds, mapped)
    for fd in fds:
        os.close(fd)
    for key in set(mapped) - set(request["live"]):
        del mapped[key]  # buffers the actor has dropped (the request's own is live: the actor views it)
    shard = ShardVectors(first_line, vectors, offsets, pooled, tokens, records, lines)
    return commit_shard(request["output"], request["stats"], shard, request["file_format"])


def _shared_view(where: SharedArray, fds: list[int], mapped: dict[int, np.ndarray]) -> np.ndarray:
    """The array ``where`` describes, on the buffer mapped the first time it came (read-only)."""
    if where.buffer not in mapped:
        (fd,) = fds
        # populated at once: one call maps the buffer's pages rather than a fault per page on first read
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapped[where.buffer] = np.frombuffer(
            mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ), dtype=np.uint8
        )
    dtype = np.dtype(where.dtype)
    nbytes = int(np.prod(where.shape, dtype=np.int64)) * dtype.itemsize
    return mapped[where.buffer][where.offset : where.offset + nbytes].view(dtype).reshape(where.shape)
