"""Work off the caller's path: in a daemon thread, or in a helper process, its result or error held
in a future; or writes queued in order (:class:`WriteQueue`).

Used where training must not wait: a checkpoint, metrics or wandb files written while the next
steps run, the next shard read while this one is trained on. Daemon threads: a process that is going down does not wait for
them (a checkpoint only counts once its ``COMPLETE`` is written; an abandoned read is dropped).

:class:`HelperProcess` runs picklable work in a child started as ``python -m pipeline.runtime.background``
(``child_process.start_python``: not multiprocessing's spawn), jobs and answers over a
``child_process.Channel``. The child imports only what the work needs and ends with its parent
(:func:`when_parent_goes`), even one killed by SIGKILL, where no shutdown message ever comes.
"""

from __future__ import annotations

import collections
import os
import pickle
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from pipeline.runtime.child_process import Channel, HelperProcessError, outcome, start_python


def in_thread(work: Callable[[], Any], name: str) -> Future:
    """Run ``work()`` in a daemon thread called ``name``; the future holds its result or the
    exception it raised, raised again by ``future.result()`` where the result is needed."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as err:  # noqa: BLE001 - handed to whoever waits on the future
            future.set_exception(err)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


class WriteQueue:
    """Writes done off the caller's path, one at a time in the order submitted, by one daemon thread.

    The one rule for everything a training run writes in the background (its metrics, wandb files
    and checkpoints: ``pipeline.train.run_dir``): ``submit`` returns at once; a write that fails
    keeps its error for the next call to ``submit``, ``check`` or ``wait`` (the writes after it
    still run: a later write of the whole record repairs an earlier failed one); ``wait`` returns
    once everything submitted is written, and ``close`` (the end of the run) waits too.
    ``submit(..., latest=KEY)`` marks a write that writes the newest state when it runs, so one
    such write queued and not yet started stands for any later one of the same KEY.

    ``fence``: called before each write; once it raises, that write and every later one are
    dropped and its error is raised by every later call (a run that lost its output folder to
    another run writes nothing more there: ``pipeline.output_folder.fence``).
    """

    def __init__(self, name: str, fence: Callable[[], None] | None = None):
        self.name = name
        self.fence = fence
        self._fenced: BaseException | None = None
        self._jobs: collections.deque[tuple[Callable[[], Any], str | None]] = collections.deque()
        self._queued_latest: set[str] = set()
        self._busy = False
        self._error: BaseException | None = None
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, work: Callable[[], Any], latest: str | None = None) -> None:
        """Queue ``work()``; first raises the error of an earlier write that failed."""
        with self._changed:
            self._raise_error()
            if latest is not None and latest in self._queued_latest:
                return
            if latest is not None:
                self._queued_latest.add(latest)
            self._jobs.append((work, latest))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def check(self) -> None:
        """Raise the error of a write that failed since the last call, without waiting."""
        with self._changed:
            self._raise_error()

    @property
    def idle(self) -> bool:
        """Nothing queued or being written."""
        with self._changed:
            return not self._jobs and not self._busy

    def wait(self) -> None:
        """Wait until every write submitted so far is done; raises the error of one that failed."""
        with self._changed:
            self._changed.wait_for(lambda: not self._jobs and not self._busy)
            self._raise_error()

    def close(self) -> None:
        """`wait`, then end the thread (a later `submit` starts another)."""
        try:
            self.wait()
        finally:
            with self._changed:
                thread, self._thread = self._thread, None
                if thread is not None:
                    self._jobs.append((None, None))  # the thread's signal to end
                    self._changed.notify_all()
            if thread is not None:
                thread.join()

    def _raise_error(self) -> None:
        if self._fenced is not None:
            raise self._fenced
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._jobs))
                work, latest = self._jobs.popleft()
                if work is None:
                    return
                self._queued_latest.discard(latest)
                self._busy = True
            try:
                if self._fenced is None and self.fence is not None:
                    try:
                        self.fence()
                    except BaseException as err:  # noqa: BLE001 - sticky: nothing more is written
                        self._fenced = err
                if self._fenced is None:
                    work()
            except BaseException as err:  # noqa: BLE001 - raised in the caller by its next call
                with self._changed:
                    self._error = self._error or err
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()


def when_parent_goes(parent_pid: int, then: Callable[[], None], poll_s: float = 1.0) -> threading.Thread:
    """In a helper process: call ``then`` (in a daemon thread) as soon as ``parent_pid`` is no
    longer its parent: the parent died, even by SIGKILL, and the child was re-parented. The one
    parent watch of the package's helpers (the shard read-ahead, embed's writers, the cluster
    watchdog): a pipe to the parent can outlive it in a process it forked, its parent pid cannot."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        then()

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


class HelperProcess:
    """A child process that runs ``fn(*args)`` calls one at a time, in the order submitted; it
    starts at the first ``submit`` and ends with ``close`` (or when this object is collected).

    ``fn``, ``args`` and the result travel pickled (functions by module and name: the child imports
    them with the parent's ``sys.path``). An exception raised by ``fn`` is raised again by the
    future's ``result()``, as ``HelperProcessError`` naming it if it cannot be pickled.
    """

    def __init__(self) -> None:
        self._child: subprocess.Popen | None = None
        self._channel: Channel | None = None
        self._pending: collections.deque[Future] = collections.deque()
        self._lock = threading.Lock()
        self._collector: threading.Thread | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def pid(self) -> int | None:
        """The child's pid while it runs (None before the first submit and after close)."""
        return self._child.pid if self._child is not None else None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Queue ``fn(*args)``; a job that cannot be pickled raises here and is not queued."""
        job = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        future: Future = Future()
        with self._lock:
            if self._child is None:
                self._start()
            self._pending.append(future)
            try:
                self._channel.send_pickled(job)
            except OSError:
                pass  # the child is gone: the collector fails every pending future, this one too
        return future

    def wait(self, future: Future, timeout_s: float, what: str) -> Any:
        """``future.result()`` within ``timeout_s`` seconds; past it the child (stopped, hung or
        starved: its state is said) is ended and HelperProcessError names it and ``what``."""
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            pid = self.pid
            state = process_state(pid)[1] if pid is not None else "gone"
            self.close()
            raise HelperProcessError(
                f"the helper process {pid} ({state}) did not answer {what} within {timeout_s:g} s; it was ended"
            ) from None

    def close(self) -> None:
        """End the child now (work in flight is abandoned; its futures fail)."""
        with self._lock:
            child, self._child = self._child, None
            if child is not None:
                self._finalizer.detach()
                child.kill()
                self._channel.stop_sending()
                self._collector.join(timeout=10)
                self._channel.close()

    def _start(self) -> None:
        channel, theirs = Channel.pair()
        try:
            child = start_python(
                ["-m", "pipeline.runtime.background", str(theirs.fileno()), str(os.getpid())],
                pass_fds=[theirs.fileno()],
            )
        except BaseException:
            channel.close()
            raise
        finally:
            theirs.close()
        collector = threading.Thread(
            target=_collect, args=(child, channel, self._pending), name="helper-results", daemon=True
        )
        collector.start()
        self._child, self._channel, self._collector = child, channel, collector
        # collected without a close: the child answers what was submitted, then sees its jobs end
        # (no reference to self here, or this object would never be collected)
        self._finalizer = weakref.finalize(self, channel.stop_sending)


_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "waiting for I/O",
    "T": "stopped by a signal",
    "t": "stopped by a debugger",
    "Z": "exited",
}


STOPPED_STATES = ("T", "t")
"""The ``/proc/PID/stat`` states of a process that runs no more until it is continued."""


def process_state(pid: int) -> tuple[str, str]:
    """What ``/proc/PID/stat`` says the process is doing: its state's letter and the state in
    words (``("?", "state unknown")`` when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            code = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?", "state unknown"
    return code, _STATES.get(code, f"state {code}")


def _collect(child: subprocess.Popen, channel: Channel, pending: collections.deque) -> None:
    """Hands each answer to the oldest pending future; when the child ends, fails the rest."""
    reason = ""
    while True:
        try:
            (ok, value), _ = channel.receive()
        except (EOFError, OSError):  # the child ended (or this end was closed)
            break
        except Exception as err:  # noqa: BLE001 - an answer this process cannot read: stop the child
            reason = f"; its answer could not be read: {err}"
            child.kill()
            break
        future = pending.popleft()
        future.set_result(value) if ok else future.set_exception(value)
    code = child.wait()
    while pending:
        pending.popleft().set_exception(
            HelperProcessError(
                f"the helper process {child.pid} ended (exit code {code}) before it answered{reason}"
            )
        )


def _serve(channel: Channel, parent_pid: int) -> None:
    """The child's loop: a job, its answer, until the parent stops sending (or is gone)."""
    # jobs end with the parent, even if a fork kept its end of the channel open
    when_parent_goes(parent_pid, lambda: os._exit(0))
    while True:
        try:
            (fn, args), _ = channel.receive()
        except EOFError:
            return
        except Exception as err:  # noqa: BLE001 - a job that does not unpickle here: say so, and stop
            channel.send((False, HelperProcessError(f"the helper process cannot read a job: {err}")))
            return
        channel.answer(outcome(fn, *args))


if __name__ == "__main__":
    # run the module's own copy, not __main__'s, so what it defines pickles under its real name
    from pipeline.runtime import background

    background._serve(Channel.from_fd(int(sys.argv[1])), int(sys.argv[2]))
