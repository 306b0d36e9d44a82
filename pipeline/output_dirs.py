"""Local output folders a run creates, and taking them back when the run fails before writing.

Checking that an output is writable (``storage.probe_writable``) creates its local folder and any
missing parents; a run that then fails (an empty corpus, an unreadable input, a refused setting)
would leave them behind, empty. :func:`missing_dirs`, taken before the run touches the output,
names the folders it is about to create; :func:`remove_empty_dirs` removes them again, deepest
first, as long as they are empty. It never deletes a file and never touches a folder that existed
before the run, so an output the run already wrote to (a resumable one) stays as it is.

S3 has no folders: a prefix exists only through its objects, so there is nothing to take back.
Shared by the shard and embed stages (no stage imports another).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from pipeline import storage


def missing_dirs(path: str) -> list[str]:
    """The local folders of ``path`` (itself, then its parents) that do not exist yet, deepest
    first; ``[]`` for an s3:// url or a path that exists."""
    if storage.is_s3(path):
        return []
    found = []
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        found.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return found


def remove_empty_dirs(dirs: Sequence[str]) -> None:
    """Remove ``dirs`` (deepest first) while they are empty; stop at the first that is not."""
    for path in dirs:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            continue
        except OSError:  # not empty (the run wrote into it), or not ours to remove
            return


@contextmanager
def removed_on_failure(path: str) -> Iterator[None]:
    """On an exception inside the block, remove the folders of ``path`` that the block created
    and left empty (see the module docstring), then re-raise."""
    created = missing_dirs(path)
    try:
        yield
    except BaseException:
        remove_empty_dirs(created)
        raise
