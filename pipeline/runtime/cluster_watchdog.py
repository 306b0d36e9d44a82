"""An embedded Ray cluster must not outlive its driver: a watchdog process that stops it.

Ray ties its GCS and raylet to the driver that started them, but the raylet's agents
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) and idle workers survive a driver killed with
SIGKILL, re-parented to init, some ignoring SIGTERM for a minute. So the driver starts the cluster
with a marker variable in its environment, which every process of the cluster inherits whatever
title it gives itself, and starts this watchdog beside it. The watchdog waits until its pipe from
the driver closes (the driver exited, however it died, or closed it after ``ray.shutdown()``) or
its parent changes, then stops every process that carries the marker (SIGTERM, SIGKILL after
``GRACE_SECONDS``) and removes the cluster's temp dir.

``python -m pipeline.runtime.cluster_watchdog MARKER TEMP_DIR`` is the watchdog; :class:`Watchdog` starts one.
"""

from __future__ import annotations

import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import threading
import time

from pipeline.runtime import stopping
from pipeline.runtime.background import when_parent_goes
from pipeline.runtime.child_process import start_python

MARKER_VAR = "ELMO_EMBEDDED_RAY"
"""Environment variable whose value names one embedded cluster."""
GRACE_SECONDS = 5.0
"""How long the processes get to stop on SIGTERM before SIGKILL."""
POLL_SECONDS = 1.0


def new_marker() -> str:
    return f"{os.getpid()}-{secrets.token_hex(8)}"


def marked_pids(marker: str) -> list[int]:
    """Pids of the processes (other than this one) whose environment has ``MARKER_VAR=marker``."""
    needle = f"{MARKER_VAR}={marker}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ:
            pids.append(int(entry))
    return pids


def stop_marked(marker: str, grace: float = GRACE_SECONDS) -> list[int]:
    """SIGTERM every process with the marker, SIGKILL those still there after ``grace`` seconds;
    returns the pids signalled."""
    signalled: set[int] = set()
    deadline = time.monotonic() + grace
    sig = signal.SIGTERM
    while pids := marked_pids(marker):
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        for pid in pids:
            try:
                os.kill(pid, sig)
                signalled.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    return sorted(signalled)


def watch(marker: str, temp_dir: str) -> None:
    """Wait for the driver (this process's parent, writer of stdin) to go, then stop the cluster."""
    parent_gone = threading.Event()
    when_parent_goes(os.getppid(), parent_gone.set, POLL_SECONDS)
    while not parent_gone.is_set():
        ready, _, _ = select.select([sys.stdin], [], [], POLL_SECONDS)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break  # EOF: the driver closed the pipe, or died
    stop_marked(marker)
    shutil.rmtree(temp_dir, ignore_errors=True)


class Watchdog:
    """The driver's side: ``marker`` for the cluster's environment, ``start()`` once the cluster is
    up, ``stop()`` after ``ray.shutdown()`` (sweeps what shutdown left and waits for the watchdog)."""

    def __init__(self, temp_dir: str):
        self.temp_dir = temp_dir
        self.marker = new_marker()
        self._process: subprocess.Popen | None = None

    def start(self) -> None:
        self._process = start_python(
            ["-m", "pipeline.runtime.cluster_watchdog", self.marker, self.temp_dir],
            stdin=subprocess.PIPE,
            quiet=True,
            without_env=[MARKER_VAR],  # not one of the processes it stops
            # its own session: a Ctrl-C to the terminal's process group must not stop the watchdog
            # before the cluster it watches
            own_session=True,
        )

    def stop(self, timeout: float = 30.0) -> None:
        if self._process is None:
            return
        self._process.stdin.close()
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None


if __name__ == "__main__":
    stopping.child_process()
    watch(sys.argv[1], sys.argv[2])
