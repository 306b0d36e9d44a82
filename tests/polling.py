"""Waiting in tests for something another thread or process does: a bounded poll of its condition,
never a fixed sleep that decides a result (a sleep is too short on a loaded machine and too long
on an idle one)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    condition: Callable[[], object], what: str, timeout_s: float = 30.0, every_s: float = 0.01
) -> None:
    """Return once ``condition()`` is true; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(every_s)
