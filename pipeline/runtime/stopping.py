"""How a process is asked to stop, in one place: every signal handler of the package is set here.

- **Entry points** (``jobs/stage_args.run_main``): :func:`hear_stops` makes Ctrl-C, SIGTERM and a
  closed terminal (SIGHUP) stop a stage the same way, by an exception (``KeyboardInterrupt`` or
  :class:`~pipeline.errors.Terminated`), so outputs are left whole; :func:`exit_status` says how
  the run ended (``interrupted`` 130, ``terminated`` 143: 128 + the signal, as a shell reports it).
- **Ray sessions** (``runtime/ray_runtime.py``) put :func:`raise_terminated` back on SIGTERM after
  ``ray.init`` (which sets handlers of its own) and restore the one before (:func:`install`,
  :func:`restore`); :func:`as_heard` turns the KeyboardInterrupt that Ray's blocking calls raise
  for a SIGTERM back into a ``Terminated``.
- **Training** (``train/fit.py``): :class:`GracefulStop`: the first signal asks the run to stop at
  a step boundary within a grace period, a second one (or the period's end) aborts it.
- **Helper processes** (the cluster watchdog, embed's shard writers): :func:`child_process` ignores
  the terminal's Ctrl-C (their parent decides when they stop) and, where asked, leaves on SIGTERM
  by ``SystemExit`` once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from pipeline.errors import Terminated

Handler = Any
"""What ``signal.signal`` takes and returns: a callable, ``SIG_DFL``, ``SIG_IGN`` or None."""

INTERRUPTED, TERMINATED = 130, 128 + signal.SIGTERM
"""Exit statuses of a stage stopped by Ctrl-C and by SIGTERM."""

_heard_sigterm = False
"""Whether :func:`raise_terminated` ran since :func:`forget_sigterm`."""


def in_main_thread() -> bool:
    """Signal handlers can be set only here."""
    return threading.current_thread() is threading.main_thread()


def install(signum: int, handler: Handler) -> Handler:
    """Put ``handler`` on ``signum`` (main thread only); returns the handler replaced, None where
    none could be set."""
    if not in_main_thread():
        return None
    return signal.signal(signum, handler)


def restore(signum: int, previous: Handler) -> None:
    """Put back a handler :func:`install` replaced (nothing when it replaced none)."""
    if previous is not None and in_main_thread():
        signal.signal(signum, previous)


def current(signum: int) -> Handler:
    return signal.getsignal(signum)


# ---------------------------------------------------------------- SIGTERM as an exception


def raise_terminated(signum, frame) -> None:
    """SIGTERM raises `Terminated` in the main thread, as Ctrl-C raises KeyboardInterrupt."""
    global _heard_sigterm
    _heard_sigterm = True
    raise Terminated()


def forget_sigterm() -> None:
    """Start a new span for :func:`as_heard` (a Ray session's start)."""
    global _heard_sigterm
    _heard_sigterm = False


def as_heard(stop: KeyboardInterrupt) -> KeyboardInterrupt:
    """``stop`` as the signal that caused it. Ray's blocking calls (``ray.get``, ``ray.wait``) catch
    what a signal handler raises and raise a KeyboardInterrupt of their own, so a SIGTERM heard
    while the driver waits on a task (the shard stage writing its ARPA file, say) comes out as an
    interrupt (130) instead of a termination (143): here it is a `Terminated` again."""
    if _heard_sigterm and not isinstance(stop, Terminated):
        return Terminated(*stop.args)
    return stop


def stop_error(signum: int | None, message: str = "") -> KeyboardInterrupt:
    """What the entry point reports for work stopped by ``signum``: `Terminated` for SIGTERM, else
    KeyboardInterrupt, with ``message`` (what a rerun continues from) after it."""
    kind = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    return kind(message) if message else kind()


# ---------------------------------------------------------------- entry points


def hear_stops() -> None:
    """Ctrl-C, SIGTERM and SIGHUP stop an entry point's stage by an exception, from its start.

    - SIGINT: a command started in the background by a non-interactive shell (``cmd &`` in a
      script, some CI runners) inherits SIGINT ignored, and Python then raises no
      KeyboardInterrupt; Ray Train installs its own handler once training starts, so a ``kill
      -INT`` was lost in a run's first seconds and obeyed after them. Here it is heard throughout.
    - SIGTERM: `Terminated`, as in a Ray session (which puts its own in place while it runs and
      restores this one); without it a stage that runs no Ray (``elmo probe``) died silently.
    - SIGHUP (a closed terminal): a SIGTERM to this process, so whichever SIGTERM handler is in
      place then (this one, a Ray session's, train's graceful stop) ends the work.

    A handler someone else set, or an ignored SIGTERM or SIGHUP (``nohup``), is theirs to keep."""
    if not in_main_thread():
        return
    if current(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum, handler in ((signal.SIGTERM, raise_terminated), (signal.SIGHUP, _hang_up_as_sigterm)):
        if current(signum) in (signal.SIG_DFL, None):
            signal.signal(signum, handler)


def _hang_up_as_sigterm(signum, frame) -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def exit_status(caught: KeyboardInterrupt) -> tuple[str, int]:
    """``(word, status)`` for a stage ended by ``caught``: ``terminated`` 143 for SIGTERM (also one
    that Ray's calls turned into an interrupt), else ``interrupted`` 130."""
    stop = as_heard(caught)
    return ("terminated", TERMINATED) if isinstance(stop, Terminated) else ("interrupted", INTERRUPTED)


# ---------------------------------------------------------------- a graceful stop


class GracefulStop:
    """SIGINT and SIGTERM while work runs that can stop at a boundary (a training step): the first
    signal calls ``request`` and gives the work ``grace_s`` seconds; a second signal, or the grace
    period passed, calls ``abort`` (the handler the work's own framework put on SIGINT, given by
    :meth:`install`; without one, the first signal's error is raised). ``received``: the first
    signal, None before one; ``promise``: what the first signal's line says will happen."""

    def __init__(self, request: Callable[[], None], grace_s: float, promise: str):
        self.request, self.grace_s, self.promise = request, grace_s, promise
        self.received: int | None = None
        self.grace_over = False
        """Whether the grace period ran out (rather than a second signal coming)."""
        self._abort: Handler = None
        self._timer: threading.Timer | None = None
        self._saved: dict[int, Handler] = {}

    def __enter__(self) -> GracefulStop:
        self._saved = {s: current(s) for s in (signal.SIGINT, signal.SIGTERM)} if in_main_thread() else {}
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for signum, previous in self._saved.items():
            restore(signum, previous)  # the framework leaves its own handler installed

    def install(self, abort: Handler = None) -> None:
        """Handle SIGINT and SIGTERM (main thread only); ``abort``: the framework's SIGINT handler,
        which aborts the work (None before it put one in place)."""
        if abort is not None:
            self._abort = abort
        install(signal.SIGINT, self.handle)
        install(signal.SIGTERM, self.handle)

    def handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum
            self.request()
            print(
                f"{signal.Signals(signum).name}: {self.promise} (at most {self.grace_s:.0f} s; a second "
                "signal stops at once)",
                file=sys.stderr,
                flush=True,
            )
            self._timer = threading.Timer(self.grace_s, self._run_out)
            self._timer.daemon = True
            self._timer.start()
            return
        if self._abort is None:
            raise stop_error(self.received)
        self._abort(signal.SIGINT, frame)

    def _run_out(self) -> None:
        self.grace_over = True
        os.kill(os.getpid(), signal.SIGINT)


# ---------------------------------------------------------------- helper processes


def child_process(exit_on_sigterm: bool = False) -> None:
    """A helper process's signals: the terminal's Ctrl-C ignored (it reaches the whole process
    group; the parent decides when its helpers stop) and, with ``exit_on_sigterm``, SIGTERM leaves
    by ``SystemExit(143)``, once: a second SIGTERM (the watchdog's and the parent watch's can both
    come) is ignored, so the cleanup the first one started (discarding a partial file) finishes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if exit_on_sigterm:
        signal.signal(signal.SIGTERM, _exit_once)


def _exit_once(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)
