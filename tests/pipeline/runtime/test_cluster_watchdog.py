"""An embedded Ray cluster does not outlive its driver, however the driver ends (a SIGTERM is a
clean stop: ``terminated``, exit 143); its dashboard (the State API) answers and its URL is printed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pipeline.runtime.cluster_watchdog import marked_pids, stop_marked

pytestmark = pytest.mark.subprocess

DRIVER = """
import os, sys, time
import ray
from jobs.stage_args import run_main
from pipeline.runtime.cluster_watchdog import MARKER_VAR
from pipeline.runtime.ray_runtime import ray_session

def body():
    with ray_session(num_cpus=1):
        @ray.remote
        def marker():
            return os.environ.get(MARKER_VAR)

        assert MARKER_VAR not in os.environ  # the driver's own later children are not the cluster's
        # the State API answers (Ray Train's placement-group cleaner relies on it)
        from ray.util.state import list_actors
        list_actors(limit=1)
        print(ray.get(marker.remote()), ray._private.worker._global_node.get_temp_dir_path(), flush=True)
        if sys.argv[1] == "wait":
            time.sleep(600)

sys.exit(run_main(body))
"""


def _start_driver(mode: str) -> tuple[subprocess.Popen, str, str]:
    """A driver with an embedded cluster; returns it, its cluster's marker and temp dir."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # embedded, not the session's
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    line = proc.stdout.readline().split()
    if len(line) != 2:
        proc.kill()
        raise AssertionError(f"driver did not start: {proc.communicate()[1][-2000:]}")
    return proc, line[0], line[1]


def _gone(marker: str, temp_dir: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not marked_pids(marker) and not os.path.exists(temp_dir):
            return True
        time.sleep(0.5)
    return False


@pytest.mark.parametrize("ending", ["SIGKILL", "SIGTERM", "clean exit"])
def test_cluster_stops_with_its_driver(ending):
    proc, marker, temp_dir = _start_driver("exit" if ending == "clean exit" else "wait")
    try:
        assert marked_pids(marker), "the cluster's processes do not carry the marker"
        if ending != "clean exit":
            proc.send_signal(getattr(signal, ending))
        proc.wait(timeout=60)
        err = proc.stderr.read()
        if ending == "clean exit":
            assert proc.returncode == 0 and "ray dashboard: http://127.0.0.1:" in err
        if ending == "SIGTERM":  # a scheduler stopping the job: a clean stop, not Ray's crash report
            assert proc.returncode == 143 and err.strip().splitlines()[-1] == "terminated", err[-2000:]
            assert "SIGTERM received" not in err
        assert _gone(marker, temp_dir, timeout=30), [
            open(f"/proc/{pid}/cmdline", "rb").read()[:80] for pid in marked_pids(marker)
        ]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop_marked(marker, grace=1.0)  # whatever a failure left
