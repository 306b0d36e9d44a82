"""How the shard stage's driver waits on its Ray tasks: a window of unfinished tasks, and the
``ray.get`` that re-raises the stage's own errors as themselves."""

from __future__ import annotations

from collections.abc import Callable

import ray
from ray.exceptions import RayTaskError

from pipeline.formats.shard_format import FormatError
from pipeline.runtime import storage
from pipeline.shard.errors import ShardError


def get(refs):
    """``ray.get`` that re-raises our own errors from a task as themselves (one line)."""
    try:
        return ray.get(refs)
    except RayTaskError as err:
        cause = err.cause
        if isinstance(cause, ShardError | storage.StorageError | FormatError):
            raise cause from None
        raise


class TaskWindow:
    """Unfinished tasks, at most ``limit``; as a task with a tag finishes, ``on_done(tag, its
    result)`` (the result fetched by :func:`get`, so its error is raised here)."""

    def __init__(self, limit: int, on_done: Callable):
        self.limit = max(1, limit)
        self.on_done = on_done
        self.refs: list = []
        self.tags: dict = {}

    def add(self, ref, tag=None) -> None:
        self.refs.append(ref)
        self.tags[ref] = tag
        while len(self.refs) >= self.limit:
            self._wait_one()

    def _wait_one(self) -> None:
        done, self.refs = ray.wait(self.refs, num_returns=1, fetch_local=False)
        tag = self.tags.pop(done[0])
        if tag is not None:
            self.on_done(tag, get(done[0]))

    def drain(self) -> None:
        while self.refs:
            self._wait_one()
