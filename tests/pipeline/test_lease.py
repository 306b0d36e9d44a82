"""pipeline.lease: one run at a time per output folder, and a crashed run's lease expires."""

from __future__ import annotations

import json
import os
import time

import pytest

from pipeline import storage
from pipeline.lease import LEASE_FILE, Lease
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
