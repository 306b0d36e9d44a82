"""One run at a time per output folder: a lease with a heartbeat (``OUTPUT/lease.json``).

Two ``elmo train`` launched into the same ``--output`` would both resume from the same checkpoint
and overwrite each other's checkpoints and records; two ``elmo shard`` runs into one folder would
write each other's vocabulary. The driver that writes a folder holds its lease: ``{"owner",
"host", "pid", "heartbeat"}``, the heartbeat rewritten every ``beat_s`` seconds by a thread.
Another driver is refused while the heartbeat is younger than ``ttl_s``; a driver that crashed (or
was SIGKILLed) stops beating, and its lease is taken over once it is that old. Local folders and
``s3://`` alike (S3's reads after a write are consistent): after writing its lease a driver reads
it back, so of two drivers starting at the same moment only the last writer runs. Used by the
train and shard stages (``error``: the stage's error class, ``what``: how it names its folder).

A lease is taken over only when its holder stopped beating, but a holder can come back: a driver
stopped for longer than ``ttl_s`` (Ctrl-Z, a frozen VM, swapping) whose workers trained on. So the
owner token is a fence: the heartbeat reads the lease before rewriting it and stops for good once
another owner holds it (never writing it back), and every write of the run checks first that the
lease is still its own (``verify``, or ``fence(folder, owner)`` in a process that does not hold the
``Lease`` object: the training workers), so a woken run stops at its next write, in one line,
instead of writing beside the run that took over. On the same host, a lease whose process is gone
is taken over at once rather than after ``ttl_s``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time

from pipeline import storage
from pipeline.errors import PipelineError

LEASE_FILE = "lease.json"
TTL_S = 90.0
"""A lease whose heartbeat is older than this is a crashed run's."""
BEAT_S = 15.0
SETTLE_S = 0.5
"""Between writing a new lease and reading it back (two drivers starting at once)."""


class Lease:
    """The lease of ``folder`` for this process: ``check()`` refuses one held by another live
    run; ``acquire()`` takes it (and starts the heartbeat); ``release()`` gives it back."""

    def __init__(
        self,
        folder: str,
        error: type[PipelineError] = PipelineError,
        what: str = "output",
        ttl_s: float = TTL_S,
        beat_s: float = BEAT_S,
    ):
        self.path = storage.join(folder, LEASE_FILE)
        self.folder, self.error, self.what = folder, error, what
        self.ttl_s, self.beat_s = ttl_s, beat_s
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._stop = threading.Event()
        self._beating: threading.Thread | None = None
        self.lost: dict | None = None
        """The lease of the run that took this one's over, once the heartbeat saw it."""

    def _read(self) -> dict | None:
        try:
            return json.loads(storage.read_bytes(self.path))
        except (storage.StorageError, ValueError):  # none yet (or unreadable: a lease still being written)
            return None

    def _write(self) -> None:
        record = {
            "owner": self.owner,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "heartbeat": time.time(),
        }
        storage.write_bytes(self.path, json.dumps(record).encode())

    def check(self) -> None:
        """``error`` when another run's lease is live."""
        lease = self._read()
        if lease is None or lease.get("owner") == self.owner or _holder_gone(lease):
            return
        age = time.time() - float(lease.get("heartbeat", 0))
        if age < self.ttl_s:
            raise self.error(
                f"{self.what} {self.folder} is in use by another run (host {lease.get('host')}, pid "
                f"{lease.get('pid')}, its heartbeat {max(age, 0):.0f} s ago): wait for it to end, or use another "
                f"output (a crashed run's lease expires {self.ttl_s:.0f} s after its last heartbeat)"
            )

    def acquire(self) -> None:
        self.check()
        self._write()
        time.sleep(SETTLE_S)
        lease = self._read()
        if lease is None or lease.get("owner") != self.owner:
            self.check()  # another driver wrote after this one: it runs
        self._stop.clear()
        self._beating = threading.Thread(target=self._beat, name="lease", daemon=True)
        self._beating.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                lease = self._read()
                if lease is not None and lease.get("owner") != self.owner:
                    self.lost = lease  # taken over while this process was stopped: never written back
                    return
                self._write()
            except storage.StorageError:
                pass  # a passing outage: the next beat tries again, well within the ttl

    def verify(self) -> None:
        """``error`` unless this process still holds the lease (before a write)."""
        fence(self.folder, self.owner, self.error, self.what)

    def release(self) -> None:
        if self._beating is None:
            return
        self._stop.set()
        self._beating.join()
        self._beating = None
        lease = self._read()
        if lease is not None and lease.get("owner") == self.owner:
            storage.delete(self.path)

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def fence(folder: str, owner: str, error: type[PipelineError] = PipelineError, what: str = "output") -> None:
    """``error`` unless ``folder``'s lease is still ``owner``'s: the check before each write of a
    run whose driver holds the lease (an unreadable lease is a passing state, not a takeover)."""
    try:
        lease = json.loads(storage.read_bytes(storage.join(folder, LEASE_FILE)))
    except ValueError:
        return
    except storage.StorageError:
        if storage.exists(storage.join(folder, LEASE_FILE)):
            raise
        raise error(
            f"{what} {folder} lost its lease (lease.json is gone: another run ended there): this run "
            "stops without writing more; rerun it to resume from its last checkpoint"
        ) from None
    if isinstance(lease, dict) and lease.get("owner") != owner:
        raise error(
            f"{what} {folder} was taken over by another run (host {lease.get('host')}, pid {lease.get('pid')}) "
            f"while this one was stopped for over {TTL_S:.0f} s: this run stops without writing more; the "
            "other run carries on from the checkpoints"
        )


def _holder_gone(lease: dict) -> bool:
    """Whether ``lease``'s process is known to be gone: on this host, no process has its pid."""
    if lease.get("host") != socket.gethostname() or not isinstance(lease.get("pid"), int):
        return False
    if lease["pid"] == os.getpid():
        return False
    try:
        os.kill(lease["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False
