"""Work in a daemon thread, its result or error held in a future.

Used where training must not wait: a checkpoint written while the next steps run, the next shard
read while this one is trained on. Daemon threads: a process that is going down does not wait for
them (a checkpoint only counts once its ``COMPLETE`` is written; an abandoned read is dropped).
"""

from __future__ import annotations

import threading
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
