"""pipeline.lease: one run at a time per output folder, and a crashed run's lease expires."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from pipeline import storage
from pipeline.lease import LEASE_FILE, Lease, fence
from pipeline.train.errors import TrainError


def RunLease(folder: str, **timing) -> Lease:  # noqa: N802 (as train names its lease)
    return Lease(folder, TrainError, "run directory", **timing)


def test_a_live_lease_refuses_another_run_and_is_given_back(tmp_path):
    run_dir = str(tmp_path / "run")
    first = RunLease(run_dir, beat_s=0.2)
    with first:
        time.sleep(0.5)  # a few heartbeats
        with pytest.raises(TrainError) as err:
            RunLease(run_dir).acquire()
        assert str(err.value).startswith(f"run directory {run_dir} is in use by another run (host ")
        assert f"pid {os.getpid()}, its heartbeat 0 s ago" in str(err.value)
        assert json.loads((tmp_path / "run" / LEASE_FILE).read_text())["owner"] == first.owner
    assert not (tmp_path / "run" / LEASE_FILE).exists()
    with RunLease(run_dir):  # free again
        pass


def test_a_crashed_runs_lease_is_taken_over_once_stale(tmp_path):
    run_dir = str(tmp_path / "run")
    stale = {"owner": "elsewhere:1:ab", "host": "elsewhere", "pid": 1, "heartbeat": time.time() - 5}
    storage.write_bytes(storage.join(run_dir, LEASE_FILE), json.dumps(stale).encode())
    with pytest.raises(TrainError, match="its heartbeat 5 s ago"):
        RunLease(run_dir, ttl_s=60).check()
    lease = RunLease(run_dir, ttl_s=3)
    with lease:
        assert json.loads(storage.read_bytes(storage.join(run_dir, LEASE_FILE)))["owner"] == lease.owner


def test_on_s3_too(s3_prefix):
    run_dir = storage.join(s3_prefix, "run")
    with RunLease(run_dir):
        with pytest.raises(TrainError, match="is in use by another run"):
            RunLease(run_dir).check()
    assert not storage.exists(storage.join(run_dir, LEASE_FILE))


def test_a_holder_that_wakes_after_a_takeover_never_writes_the_lease_back(tmp_path):
    """The heartbeat reads before it beats: once another run holds the lease (this one was stopped
    past the ttl) it stops for good, and every write of the run is refused by the fence."""
    run_dir = str(tmp_path / "run")
    first = RunLease(run_dir, beat_s=0.1)
    with first:
        first.verify()  # its own: writes go on
        fence(run_dir, first.owner, TrainError, "run directory")
        taken = {"owner": "later:7:cd", "host": "elsewhere", "pid": 7, "heartbeat": time.time()}
        storage.write_bytes(storage.join(run_dir, LEASE_FILE), json.dumps(taken).encode())
        time.sleep(0.5)  # several beats
        assert json.loads(storage.read_bytes(storage.join(run_dir, LEASE_FILE)))["owner"] == "later:7:cd"
        assert first.lost is not None and first.lost["owner"] == "later:7:cd"
        with pytest.raises(TrainError) as err:
            first.verify()
        assert str(err.value).startswith(
            f"run directory {run_dir} was taken over by another run (host elsewhere, pid 7)"
        )
    assert storage.exists(storage.join(run_dir, LEASE_FILE))  # the other run's lease stays


def test_a_lease_that_vanished_under_its_holder_stops_its_writes(tmp_path):
    run_dir = str(tmp_path / "run")
    with pytest.raises(TrainError, match="lost its lease"):
        fence(run_dir, "nobody:1:aa", TrainError, "run directory")


def test_a_lease_whose_process_is_gone_on_this_host_is_taken_over_at_once(tmp_path):
    run_dir = str(tmp_path / "run")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = {"owner": "here:1:aa", "host": socket.gethostname(), "pid": gone.pid, "heartbeat": time.time()}
    storage.write_bytes(storage.join(run_dir, LEASE_FILE), json.dumps(dead).encode())
    with RunLease(run_dir) as lease:  # no 90 s wait: its heartbeat is fresh but its process is gone
        assert json.loads(storage.read_bytes(storage.join(run_dir, LEASE_FILE)))["owner"] == lease.owner
    alive = {**dead, "pid": os.getppid()}  # a live process on this host keeps its lease
    storage.write_bytes(storage.join(run_dir, LEASE_FILE), json.dumps(alive).encode())
    with pytest.raises(TrainError, match="is in use by another run"):
        RunLease(run_dir).check()
