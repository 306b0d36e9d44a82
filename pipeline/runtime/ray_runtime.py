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
import resource
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import ray

from pipeline.errors import PipelineError, Terminated
from pipeline.runtime import stopping
from pipeline.runtime.cluster_watchdog import MARKER_VAR, Watchdog

LOOPBACK = "127.0.0.1"


_embedded = False


def embedded() -> bool:
    """Whether this process runs on an embedded cluster that `ray_session` started: one that never
    grows (a joined cluster may autoscale, see ``pipeline.runtime.cluster_capacity``)."""
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


def state_api_available() -> bool:
    """Whether the connected cluster serves Ray's State API, which its dashboard serves: a cluster
    started without one (a minimal Ray lacks the packages) fails every State API call, and a
    caller that asks in a loop warns in a loop."""
    try:
        return bool(ray._private.worker.get_dashboard_url())
    except (AttributeError, ray.exceptions.RaySystemError):  # the helper moved, or no Ray: assume so
        return True


@contextmanager
def ray_processes_in_own_session() -> Iterator[None]:
    """While an embedded cluster starts: every process Ray starts (its GCS, raylet, dashboard; the
    raylet then starts the workers and agents as its own children) leads a session of its own,
    outside the driver's process group. A scheduler stops a job by signalling its whole group
    (Slurm's scancel, systemd, a container's init, a terminal's Ctrl-C, coreutils ``timeout``):
    the signal then reaches the driver alone, which stops the stage and then the cluster, instead
    of the cluster dying under a driver that waits 60 s for its GCS (docs/reliability.md#stopping).
    Ray still ties each of them to the driver's life (Linux's parent-death signal), and the watchdog
    stops the cluster when the driver is gone. A Ray without ``ConsolePopen`` starts them as before."""
    from ray._private import services

    original = getattr(services, "ConsolePopen", None)
    if original is None or sys.platform == "win32":
        yield
        return

    class OwnSession(original):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnSession
    try:
        yield
    finally:
        services.ConsolePopen = original


class RayStartError(PipelineError):
    """Ray could not start (an embedded cluster) or be joined (an address)."""


def _init_or_terminated(**kwargs):
    """``ray.init``, whose own SIGTERM handler (in place once its processes start) exits the process
    from inside it: that exit is a `Terminated` like any other SIGTERM. A start that fails is one
    line (`RayStartError`), not Ray's traceback of 50 lines with its process's log inside."""
    try:
        with logger_level(SERVICES_LOGGER, logging.CRITICAL):  # its lines repeat the error below
            return ray.init(**kwargs)
    except SystemExit as exit_:
        if exit_.code in (signal.SIGTERM, 128 + signal.SIGTERM):
            raise Terminated() from None
        raise
    except Exception as err:
        raise RayStartError(_start_failure(err, kwargs.get("address"))) from err


SERVICES_LOGGER = "ray._private.services"
"""Ray's logger that prints a failed process's log before ``ray.init`` raises it again."""


def _start_failure(err: Exception, address: str | None) -> str:
    """One line for a failed ``ray.init``: what failed, the last line Ray gave, and the file size
    limit where one is set (Ray's processes write logs and spill objects, and die past it)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    said = lines[-1] if lines else type(err).__name__
    what = (
        f"could not join the Ray cluster at {address}"
        if address
        else "the embedded Ray cluster could not start"
    )
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        said += (
            f"; the file size limit (ulimit -f) is {limit:,} bytes, which Ray's logs and spilled objects "
            "outgrow: raise it (ulimit -f unlimited)"
        )
    return f"{what}: {said}"


def _raise_on_sigterm():
    """SIGTERM raises `Terminated` (``pipeline.runtime.stopping``), so a stage stops the same way
    as on Ctrl-C (Ray shut down, the cluster stopped, outputs left whole). Put in place again after
    ``ray.init``, which sets handlers of its own: one that exits the process from inside the stage
    with status 15, and a C++ one that prints a stack trace as if Ray had crashed. Returns the
    handler replaced (None where signals cannot be set: not the main thread)."""
    return stopping.install(signal.SIGTERM, stopping.raise_terminated)


EMBEDDED_DEFAULTS = {
    # one node that no scheduler takes away: Ray Train's preemption watcher has nothing to watch (and,
    # restartable with arguments in the object store, it logs an error-level line, ray#53727)
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}
"""Environment of an embedded cluster's processes, where the user has not set these."""


TOKEN_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
"""Without ``RAY_AUTH_MODE`` a new local cluster turns token authentication on (a token in
``~/.ray/auth_token``) and says so in a WARNING line that users read as a fault; the choice is the
right one for a cluster on this machine, so this logger is quieted while it starts. (Setting the
mode in the environment instead would leave this process's cached Ray config behind it.)"""


@contextmanager
def logger_level(name: str, level: int) -> Iterator[None]:
    """Logger ``name`` at ``level`` for the body, as it was afterwards: one of Ray's loggers whose
    lines at a lower level are noise where they come (the stages quiet nothing else)."""
    logger = logging.getLogger(name)
    previous = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)


def _embedded_environment(
    temp_dir: str, dashboard_port: int | None
) -> tuple[dict[str, str | None], str | None]:
    """Set the environment an embedded cluster starts with (inherited by every process Ray starts);
    returns what to restore (the variables, ``tempfile.tempdir``).

    ``TMPDIR`` points into the cluster's own temp dir: Python's ``pymp-*`` folders of Ray's
    dashboard processes, wandb's temporary folders and Ray Train's storage folder go when the
    cluster goes, with its temp dir, even after a SIGKILL of the driver (the watchdog removes it).

    ``RAY_API_SERVER_ADDRESS`` names this cluster's dashboard (its port is chosen before the
    cluster starts) to the State API clients inside the cluster's workers: Ray Train's
    placement-group cleaner asks whether the controller lives, and without an address it looks for
    "the" Ray on this machine, which fails with a traceback every run when a second Ray runs here
    (another user's, a test's). The GCS address would serve as ``RAY_ADDRESS``, but it is only
    known once the workers' environment is fixed. (No dashboard: no State API to name.)"""
    scratch = os.path.join(temp_dir, "tmp")
    os.makedirs(scratch, exist_ok=True)
    wanted = {"TMPDIR": scratch}
    if dashboard_port is not None:
        wanted["RAY_API_SERVER_ADDRESS"] = f"http://{LOOPBACK}:{dashboard_port}"
    wanted |= {name: value for name, value in EMBEDDED_DEFAULTS.items() if name not in os.environ}
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    saved_tempdir, tempfile.tempdir = tempfile.tempdir, scratch
    return saved, saved_tempdir


def _restore_environment(saved: tuple[dict[str, str | None], str | None] | None) -> None:
    if saved is None:
        return
    variables, tempfile.tempdir = saved
    for name, value in variables.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[None]:
    """Run the body with Ray initialised.

    ``address``: a cluster address (``auto``, ``ray://...``, ``host:port``); default ``RAY_ADDRESS``.
    ``num_cpus``: CPUs of an embedded cluster (default: all of this machine's).
    Joins an already-initialised Ray untouched (tests start one per session). An embedded cluster
    gets a temp dir of its own and a watchdog (``pipeline.runtime.cluster_watchdog``) that stops it and
    removes that dir when the driver exits, however it exits.
    """
    global _embedded
    if ray.is_initialized():
        yield
        return
    stopping.forget_sigterm()
    address = address or os.environ.get("RAY_ADDRESS") or None
    kwargs = {"logging_level": logging.WARNING}
    watchdog = saved_env = None
    previous = os.environ.get("RAY_ADDRESS")
    # from the first moment: a SIGTERM while Ray starts stops it like one later (the cluster stopped,
    # "terminated", 143), not Python's default death that leaves Ray's agents behind
    previous_sigterm = _raise_on_sigterm()  # None where signals cannot be set: not the main thread
    try:
        if address:
            context = _init_or_terminated(address=address, **kwargs)
        else:
            # short: Ray's unix socket paths live under it and must stay within ~107 characters
            watchdog = Watchdog(tempfile.mkdtemp(prefix="elmo-ray-", dir="/tmp"))
            os.environ[MARKER_VAR] = watchdog.marker  # inherited by every process of the cluster
            dashboard, dashboard_port = _dashboard_installed(), _free_port()
            saved_env = _embedded_environment(watchdog.temp_dir, dashboard_port if dashboard else None)
            try:
                with logger_level(TOKEN_AUTH_LOGGER, logging.ERROR), ray_processes_in_own_session():
                    context = _init_or_terminated(
                        num_cpus=num_cpus,
                        # Ray Train's placement-group cleaner asks the State API (served by the
                        # dashboard) whether the controller lives; without it, it warns every second
                        include_dashboard=dashboard,
                        dashboard_host=LOOPBACK,
                        dashboard_port=dashboard_port,
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
        _raise_on_sigterm()  # again: ray.init put its own in place
        yield
    finally:
        _embedded = False
        stopping.restore(signal.SIGTERM, previous_sigterm)
        # no thread still running (a library's) may find this cluster's address and ray.init() again
        # into it while it stops, or after
        if previous is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = previous
        ray.shutdown()
        if watchdog is not None:
            watchdog.stop()
            _restore_environment(saved_env)


class RaySession:
    """The one Ray session of a command: every entry point (``elmo shard|train|embed|pipeline``,
    the ``ray job submit`` entries, which are the same modules) opens one with ``with`` and hands it
    to the stages it runs; a stage calls ``start()`` once it has work for Ray, so a rerun with
    nothing to do starts no cluster; the session closes when the entry point's ``with`` ends.
    Stages never open a session of their own, so nothing nests. ``address``/``num_cpus`` as for
    :func:`ray_session`.

    ``RaySession.joined()``: for callers that have initialised Ray themselves (tests, notebooks);
    its ``start()`` refuses when Ray is not running."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None, join_only: bool = False):
        self.address, self.num_cpus, self.join_only = address, num_cpus, join_only
        self._context = None

    @classmethod
    def joined(cls) -> RaySession:
        return cls(join_only=True)

    def start(self) -> None:
        if self.join_only:
            if not ray.is_initialized():
                raise PipelineError(
                    "no Ray session: call ray.init() first, or run the stage from its entry point "
                    "(elmo shard|train|embed|pipeline), which opens one"
                )
            return
        if self._context is None:
            context = ray_session(self.address, self.num_cpus)
            context.__enter__()
            self._context = context

    def __enter__(self) -> RaySession:
        return self

    def __exit__(self, *exc) -> None:
        context, self._context = self._context, None
        if context is not None:
            context.__exit__(*exc)
