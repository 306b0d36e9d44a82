"""pipeline/runtime/stopping.py's handlers one by one, in this process (the stop contract across
whole stages, in subprocesses: test_stopping.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from pipeline.errors import Terminated
from pipeline.runtime import stopping

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture
def saved_handlers():
    """The test process's handlers, put back whatever the test set."""
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)
    stopping.forget_sigterm()


def test_an_exit_status_says_which_signal_stopped_the_work(saved_handlers):
    stopping.forget_sigterm()
    assert stopping.exit_status(Terminated()) == ("terminated", 143)
    assert stopping.exit_status(KeyboardInterrupt()) == ("interrupted", 130)
    with pytest.raises(Terminated):
        stopping.raise_terminated(signal.SIGTERM, None)
    # Ray's blocking calls raise an interrupt of their own for the SIGTERM they caught
    assert stopping.exit_status(KeyboardInterrupt()) == ("terminated", 143)
    stopping.forget_sigterm()
    assert stopping.exit_status(KeyboardInterrupt()) == ("interrupted", 130)
    assert isinstance(stopping.stop_error(signal.SIGTERM, "kept x"), Terminated)
    assert str(stopping.stop_error(signal.SIGINT, "kept x")) == "kept x"


def test_an_entry_point_hears_every_stop_but_keeps_what_someone_else_chose(saved_handlers):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a command started with `&` by a script
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
    stopping.hear_stops()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is stopping.raise_terminated
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    mine = lambda signum, frame: None  # noqa: E731
    signal.signal(signal.SIGTERM, mine)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    stopping.hear_stops()
    assert signal.getsignal(signal.SIGTERM) is mine
    assert signal.getsignal(signal.SIGHUP) is not signal.SIG_DFL  # a closed terminal: a SIGTERM now


def test_a_graceful_stop_asks_once_then_aborts_and_puts_the_handlers_back(saved_handlers):
    before = signal.getsignal(signal.SIGTERM)
    asked, aborted = [], []
    with stopping.GracefulStop(lambda: asked.append(1), grace_s=60.0, promise="stopping soon") as graceful:
        assert signal.getsignal(signal.SIGTERM) == graceful.handle
        graceful.handle(signal.SIGTERM, None)
        assert (asked, graceful.received) == ([1], signal.SIGTERM)
        with pytest.raises(Terminated):  # a second signal before the framework's abort is known
            graceful.handle(signal.SIGINT, None)
        graceful.install(abort=lambda signum, frame: aborted.append(signum))
        graceful.handle(signal.SIGINT, None)
        assert aborted == [signal.SIGINT] and asked == [1] and not graceful.grace_over
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_graceful_stop_aborts_when_its_grace_period_runs_out(saved_handlers):
    aborted = []
    with stopping.GracefulStop(lambda: None, grace_s=0.2, promise="stopping soon") as graceful:
        graceful.install(abort=lambda signum, frame: aborted.append(signum))
        graceful.handle(signal.SIGTERM, None)
        deadline = time.time() + 10
        while not aborted and time.time() < deadline:
            time.sleep(0.01)  # the timer's SIGINT is handled here, in the main thread
    assert aborted == [signal.SIGINT] and graceful.grace_over


CHILD = """
import sys, time
from pipeline.runtime import stopping
stopping.child_process(exit_on_sigterm=True)
print("ready", flush=True)
try:
    time.sleep(60)
finally:
    print("cleaned up", flush=True)
"""


@pytest.mark.subprocess
def test_a_helper_ignores_ctrl_c_and_leaves_on_sigterm_by_an_exception():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGINT)  # the terminal's Ctrl-C: the parent decides
        time.sleep(0.3)
        assert child.poll() is None
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 143
        assert child.stdout.read() == "cleaned up\n"  # left by SystemExit: its cleanup ran
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
