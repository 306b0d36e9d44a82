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
        if lease is None or lease.get("owner") == self.owner:
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
                self._write()
            except storage.StorageError:
                pass  # a passing outage: the next beat tries again, well within the ttl

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
