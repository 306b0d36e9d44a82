"""Storage's paths and errors, pure: ``s3://bucket/key`` urls and local paths told apart, joined and
globbed the same way; the one-line ``StorageError``."""

from __future__ import annotations

import os
import re

from pipeline.errors import PipelineError
from pipeline.runtime.redaction import redact

S3_SCHEME = "s3://"
PARTIAL_SUFFIX = ".elmo-partial"
"""Suffix of in-progress local writes; listings and globs never return these files."""


class StorageError(PipelineError):
    """A storage operation failed; the message is one line naming the path and the cause."""


class OutOfSpace(StorageError):
    """A local write found its filesystem full (or over quota). Unlike an outage, trying again
    fails the same way until someone frees space, so callers do not retry it."""


# ---------------------------------------------------------------- paths (pure)


def is_s3(path: str | os.PathLike) -> bool:
    """True for an ``s3://bucket/key`` url."""
    return isinstance(path, str) and path.startswith(S3_SCHEME)


def absolute(path: str) -> str:
    """An s3:// url unchanged, a local path made absolute: paths handed to Ray workers must not
    depend on the worker's current directory (Ray Train moves its workers into their own)."""
    return path if is_s3(path) or not path else os.path.abspath(path)


def split_s3(path: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``; the key may be empty (a whole bucket)."""
    bucket, _, key = path[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise StorageError(f"{path}: not an s3 url of the form s3://bucket/key (no bucket name)")
    return bucket, key


def join(base: str | os.PathLike, *parts: str) -> str:
    """Join path components; ``s3://`` urls always use ``/`` whatever the local OS."""
    if not is_s3(base):
        return os.path.join(os.fspath(base), *parts)
    pieces = [base.rstrip("/")] + [p.strip("/") for p in parts if p.strip("/")]
    return "/".join(pieces)


def has_glob(pattern: str) -> bool:
    """Whether ``pattern`` contains a glob metacharacter (``*``, ``?``, ``[``)."""
    return any(c in pattern for c in "*?[")


def glob_regex(pattern: str) -> re.Pattern[str]:
    """Compile a glob into a regex with local-glob semantics for ``/``-separated keys.

    ``*`` and ``?`` stay inside one path segment, ``**/`` matches zero or more whole segments,
    ``[...]`` / ``[!...]`` are character classes.
    """
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and pattern.find("]", i + 2) > 0:
            # as in fnmatch: a ']' right after '[' (or '[!') is a member, not the end
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def literal_prefix(pattern: str) -> str:
    """The part of ``pattern`` before its first glob metacharacter (what a listing can narrow to)."""
    cut = min((pattern.index(c) for c in "*?[" if c in pattern), default=len(pattern))
    return pattern[:cut]


def _one_line(text: str) -> str:
    return redact(" ".join(str(text).split()))


def _is_partial(path: str) -> bool:
    return path.endswith(PARTIAL_SUFFIX)


def _prefix_overlaps(directory: str, prefix: str) -> bool:
    """Whether files under ``directory`` can start with ``prefix`` (prunes the walk)."""
    directory = directory.rstrip(os.sep) + os.sep
    return directory.startswith(prefix) or prefix.startswith(directory)
