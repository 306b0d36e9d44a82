"""An output folder's life, one module for every stage: who owns it, the one run that writes it
at a time, and what a failed run takes back.

**Ownership.** A stage writes only into a folder (or ``s3://`` prefix) that is new, empty, or its
own. Its own means: the folder holds the stage's *marker* (the file the stage writes before
anything else, naming the run: ``run.json`` for train, ``_progress/run.json`` for embed,
``shard_run.json`` for shard, ``export.json`` for an export, ``probe_run.json`` for a probe) and
nothing but files the stage writes. A folder of anyone else's files, or of files that look like the
stage's but without its marker (a user's ``vocab_counts.tsv``, released ``options.json`` +
``weights.hdf5``), is refused in one line naming a file, never written over (:func:`check_owned`);
whether a marked folder holds this very run (the same settings and data) is each stage's own check
of the marker's content, read through :func:`read_marker`: a JSON object naming the stage
(``"stage"``) and the run.

**One run at a time** (:class:`Lease`, ``OUTPUT/lease.json``). Two ``elmo train`` launched into the
same ``--output`` would both resume from the same checkpoint and overwrite each other's checkpoints
and records; two ``elmo shard`` runs into one folder would write each other's vocabulary. The
driver that writes a folder (train and shard) holds its lease: ``{"owner", "host", "pid",
"heartbeat"}``, the heartbeat rewritten every ``beat_s`` seconds by a thread.
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

**A failed run leaves no debris** (:func:`taken_back_on_failure`, every stage): checking that an
output is writable creates its local folder and any missing parents, and a run writes its marker
first; a run that then fails before writing anything else (an empty corpus, an unreadable input, a
refused setting) takes its marker back and removes the folders it created, deepest first, as long
as they are empty. It never deletes another file and never touches a folder that existed before
the run, so an output the run already wrote to (a resumable one) stays as it is. S3 has no
folders: a prefix exists only through its objects.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from pipeline.errors import PipelineError
from pipeline.runtime import storage

# ---------------------------------------------------------------- ownership


@dataclass(frozen=True)
class OwnFiles:
    """What stage ``stage`` writes into its output: ``marker`` (a relative path, written first) and
    ``pattern``, which every relative path (``/``-separated) of its files matches."""

    stage: str
    marker: str
    pattern: re.Pattern[str]


def check_owned(folder: str, own: OwnFiles, error: type[PipelineError], overwrite_hint: str = "") -> bool:
    """Whether ``folder`` holds ``own.stage``'s earlier output (its marker); False when it is new or
    empty. ``error`` (one line) for anything else. ``overwrite_hint``: how the stage lets a user
    write into such a folder anyway (its ``--overwrite``), said in the message; none by default."""
    way_out = f"choose an empty or new output folder{overwrite_hint}"
    if storage.is_file(folder):  # refused before any work, not when the first file is written
        raise error(f"output {folder} is a file, not a folder; {way_out}")
    links = storage.folder_links_out(folder)
    if links:  # not listed below, and a run would write through one into someone else's folder
        raise error(
            f"output {folder} holds {links[0]}, a link to a folder outside it (a run would write "
            f"through it); {way_out}"
        )
    names = storage.list_names(folder)
    if not names:
        return False
    foreign = [name for name in names if not own.pattern.fullmatch(name)]
    if foreign:
        raise error(f"output {folder} holds {foreign[0]}, which elmo {own.stage} did not write; {way_out}")
    if own.marker not in names:
        raise error(
            f"output {folder} holds {names[0]} but no {own.marker}: not an elmo {own.stage} output "
            f"(or one from before {own.marker} was written); {way_out}"
        )
    return True


def withdraw_claim(folder: str, own: OwnFiles) -> None:
    """After a run failed: delete its marker when that is all the folder holds (the run wrote
    nothing else), so a rerun with corrected settings is not refused as another run's. A storage
    error here is swallowed: the run's own error matters more, and the claim only stays behind."""
    try:
        if storage.list_names(folder) == [own.marker]:
            storage.delete(storage.join(folder, own.marker))
    except storage.StorageError:
        pass


def read_marker(folder: str, own: OwnFiles, error: type[PipelineError]) -> dict:
    """The marker of a folder ``check_owned`` found to be ``own.stage``'s: a JSON object whose
    ``"stage"`` is that stage (markers written before the key was added have none). ``error``, one
    line, for anything else (``{}``-like damage is the stage's own check of the object's fields)."""
    path = storage.join(folder, own.marker)
    try:
        data = json.loads(storage.read_bytes(path))
    except (ValueError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict) or data.get("stage", own.stage) != own.stage:
        raise error(
            f"{path} is not an elmo {own.stage} marker (a JSON object naming the run that wrote the "
            f"folder): restore it from a copy, or choose another output"
        )
    return data


# ---------------------------------------------------------------- one run at a time

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


# ---------------------------------------------------------------- what a failed run takes back


def missing_dirs(path: str) -> list[str]:
    """The local folders of ``path`` (itself, then its parents) that do not exist yet, deepest
    first; ``[]`` for an s3:// url or a path that exists."""
    if storage.is_s3(path):
        return []
    found = []
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        found.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return found


def remove_empty_dirs(dirs: Sequence[str]) -> None:
    """Remove ``dirs`` (deepest first) while they are empty; stop at the first that is not."""
    for path in dirs:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            continue
        except OSError:  # not empty (the run wrote into it), or not ours to remove
            return


class Claim:
    """What a run has put into its output: ``claimed`` while the marker there is this run's (a
    run that resumes an earlier run's output sets it False: that marker is not its to take back)."""

    def __init__(self, claimed: bool = True):
        self.claimed = claimed


@contextmanager
def taken_back_on_failure(
    folder: str, own: OwnFiles, created_under: str = "", claimed: bool = True
) -> Iterator[Claim]:
    """The one lifecycle of every stage's output: on an exception inside the block, take the run's
    marker back when the folder holds nothing else (and ``claim.claimed``), remove the local
    folders the block created and left empty (``created_under``: the deepest folder the run makes,
    default the marker's own, ``_progress/`` for embed), and re-raise. A run that wrote something
    keeps it, for a rerun."""
    marker_dir = os.path.dirname(own.marker)
    created = missing_dirs(created_under or (storage.join(folder, marker_dir) if marker_dir else folder))
    claim = Claim(claimed)
    try:
        yield claim
    except BaseException:
        if claim.claimed:
            withdraw_claim(folder, own)
        remove_empty_dirs(created)
        raise
