"""Work in a daemon thread, its result or error held in a future.

Used where training must not wait: a checkpoint written while the next steps run, the next shard
read while this one is trained on. Daemon threads: a process that is going down does not wait for
them (a checkpoint only counts once its ``COMPLETE`` is written; an abandoned read is dropped).
``exit_with_parent`` is for helper processes (the shard read-ahead): they end with their parent.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


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


def exit_with_parent(parent_pid: int, poll_s: float = 1.0) -> None:
    """In a helper process: exit as soon as ``parent_pid`` is no longer its parent (the parent died,
    even by SIGKILL, where no shutdown message ever comes). Starts a daemon thread that polls."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
