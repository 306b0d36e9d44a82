"""Connecting to Ray: an existing cluster when one is named, else an embedded local one.

Every stage runs inside ``ray_session``. On a laptop (the embedded default) it starts a local
cluster and shuts it down afterwards; under ``ray job submit`` or with ``RAY_ADDRESS`` set it joins
the running cluster and leaves it alone, because the job does not own that cluster.

No runtime_env is set here, and no secret ever goes into one: Ray writes a runtime_env in plain text
to its agent log, keeps it in the cluster's metadata and shows it on the dashboard. Workers of an
embedded cluster inherit the driver's environment (S3 and wandb credentials included, read when the
cluster starts); workers of a real cluster get theirs from the cluster (node environment, instance
profile, Kubernetes Secrets), and a job's own ``--runtime-env-json`` applies unchanged.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import ray

from pipeline.cluster_watchdog import MARKER_VAR, Watchdog
from pipeline.errors import Terminated

LOOPBACK = "127.0.0.1"


_embedded = False


def embedded() -> bool:
    """Whether this process runs on an embedded cluster that `ray_session` started: one that never
    grows (a joined cluster may autoscale, see ``pipeline.cluster_capacity``)."""
    return _embedded


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def _say_dashboard(url: str | None, embedded: bool) -> None:
    """One line naming the Ray dashboard (none when the cluster runs without one)."""
    if url:
        where = "embedded cluster, stops with this run" if embedded else "the job's cluster"
        print(f"ray dashboard: http://{url} ({where})", file=sys.stderr, flush=True)


def _dashboard_installed() -> bool:
    """Whether Ray's dashboard can start: a minimal Ray (``pip install ray``, no ``[default]``
    extra) lacks its packages, and ``include_dashboard=True`` would then refuse to start Ray."""
    try:
        from ray._private.utils import get_dashboard_dependency_error
    except ImportError:  # the helper moved: let Ray decide
        return True
    if get_dashboard_dependency_error() is None:
        return True
    print(
        "ray dashboard: off (this Ray lacks the dashboard's packages: pip install 'ray[default]')",
        file=sys.stderr,
        flush=True,
    )
    return False


def _raise_terminated(signum, frame) -> None:
    raise Terminated(f"signal {signum}")


def _raise_on_sigterm():
    """Make SIGTERM raise `Terminated` in the main thread, as Ctrl-C raises KeyboardInterrupt, so a
    stage stops the same way (Ray shut down, the cluster stopped, outputs left whole). Installed
    after ``ray.init``, which sets handlers of its own: one that exits the process from inside the
    stage with status 15, and a C++ one that prints a stack trace as if Ray had crashed. Returns the
    handler replaced (None where signals cannot be set: not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def _scratch_inside(temp_dir: str) -> tuple[str | None, str | None]:
    """Point this process's and the cluster's temporary files into the cluster's own temp dir
    (``TMPDIR``, inherited by every process Ray starts): Python's ``pymp-*`` folders of Ray's
    dashboard processes, wandb's temporary folders, Ray Train's storage folder. They go when the
    cluster goes, with its temp dir, even after a SIGKILL of the driver (the watchdog removes
    it). Returns what to restore."""
    scratch = os.path.join(temp_dir, "tmp")
    os.makedirs(scratch, exist_ok=True)
    saved = (os.environ.get("TMPDIR"), tempfile.tempdir)
    os.environ["TMPDIR"] = scratch
    tempfile.tempdir = scratch
    return saved


def _restore_scratch(saved: tuple[str | None, str | None] | None) -> None:
    if saved is None:
        return
    environ, tempdir = saved
    if environ is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = environ
    tempfile.tempdir = tempdir


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[None]:
    """Run the body with Ray initialised.

    ``address``: a cluster address (``auto``, ``ray://...``, ``host:port``); default ``RAY_ADDRESS``.
    ``num_cpus``: CPUs of an embedded cluster (default: all of this machine's).
    Joins an already-initialised Ray untouched (tests start one per session). An embedded cluster
    gets a temp dir of its own and a watchdog (``pipeline.cluster_watchdog``) that stops it and
    removes that dir when the driver exits, however it exits.
    """
    global _embedded
    if ray.is_initialized():
        yield
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    kwargs = {"logging_level": logging.WARNING}
    watchdog = previous_sigterm = saved_tmp = None
    previous = os.environ.get("RAY_ADDRESS")
    try:
        if address:
            context = ray.init(address=address, **kwargs)
        else:
            # short: Ray's unix socket paths live under it and must stay within ~107 characters
            watchdog = Watchdog(tempfile.mkdtemp(prefix="elmo-ray-", dir="/tmp"))
            os.environ[MARKER_VAR] = watchdog.marker  # inherited by every process of the cluster
            saved_tmp = _scratch_inside(watchdog.temp_dir)
            try:
                dashboard = _dashboard_installed()
                context = ray.init(
                    num_cpus=num_cpus,
                    # Ray Train's placement-group cleaner asks the State API (served by the
                    # dashboard) whether the controller lives; without it, it warns every second
                    include_dashboard=dashboard,
                    dashboard_host=LOOPBACK,
                    dashboard_port=_free_port(),
                    _temp_dir=watchdog.temp_dir,
                    **kwargs,
                )
            finally:
                os.environ.pop(MARKER_VAR, None)
                watchdog.start()
        # Library components (Ray Train's controller, for one) look the cluster up again by address;
        # with several Ray clusters on one machine that lookup is ambiguous unless RAY_ADDRESS names ours.
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        _embedded = watchdog is not None
        _say_dashboard(context.dashboard_url, embedded=watchdog is not None)
        previous_sigterm = _raise_on_sigterm()
        yield
    finally:
        _embedded = False
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
        ray.shutdown()
        if watchdog is not None:
            watchdog.stop()
            _restore_scratch(saved_tmp)
        if previous is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = previous
