"""One storage layer for local paths and ``s3://bucket/key`` urls; the only package that touches boto3.

Every stage passes paths as plain strings and calls the functions here, so the same code reads and
writes a laptop directory or an S3 bucket. Writes are atomic: nothing ever appears under a final
name half-written (a temp file + ``os.replace`` locally; a single PUT or a multipart upload that is
completed only on a clean exit on S3).

S3 endpoint: ``AWS_ENDPOINT_URL`` or :func:`configure`; credentials come from boto3's standard chain
only and are never printed or logged. Throttling and 5xx answers are retried with backoff
(botocore's ``standard`` mode; ``AWS_RETRY_MODE`` / ``AWS_MAX_ATTEMPTS`` override it). Every failure
is a one-line :class:`StorageError` naming the path and the cause.

:func:`configure` only affects this process; Ray workers read ``AWS_ENDPOINT_URL`` from their own
environment (inherited from the driver on an embedded cluster; see ``pipeline.runtime.ray_runtime``).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

# the public names of the parts (``storage.X``), re-exported as they are
from pipeline.runtime.storage.hashing import HASH_CHUNK as HASH_CHUNK
from pipeline.runtime.storage.hashing import HashingReader as HashingReader
from pipeline.runtime.storage.hashing import HashingWriter as HashingWriter
from pipeline.runtime.storage.local import LocalBackend, _full_device, _local_errors, _out_of_space
from pipeline.runtime.storage.paths import S3_SCHEME as S3_SCHEME
from pipeline.runtime.storage.paths import OutOfSpace as OutOfSpace
from pipeline.runtime.storage.paths import StorageError as StorageError
from pipeline.runtime.storage.paths import absolute as absolute
from pipeline.runtime.storage.paths import glob_regex as glob_regex
from pipeline.runtime.storage.paths import has_glob as has_glob
from pipeline.runtime.storage.paths import is_s3 as is_s3
from pipeline.runtime.storage.paths import join as join
from pipeline.runtime.storage.paths import literal_prefix as literal_prefix
from pipeline.runtime.storage.paths import split_s3 as split_s3
from pipeline.runtime.storage.s3 import COPY_CHUNK, S3Backend, _object, _s3_errors
from pipeline.runtime.storage.s3 import PART_SIZE as PART_SIZE
from pipeline.runtime.storage.s3 import configure as configure
from pipeline.runtime.storage.s3 import endpoint_url as endpoint_url
from pipeline.runtime.storage.s3 import s3_client as s3_client

_LOCAL = LocalBackend()
_S3 = S3Backend()


def _backend(path: str) -> LocalBackend | S3Backend:
    return _S3 if is_s3(path) else _LOCAL


def _local_only(path: str | os.PathLike, role: str) -> str:
    if is_s3(path):
        raise StorageError(f"{path}: {role} must be a local path, not an s3:// url")
    return os.fspath(path)


# ---------------------------------------------------------------- public API


def _path(path: str | os.PathLike) -> str:
    return path if isinstance(path, str) else os.fspath(path)


def open_read(path: str | os.PathLike) -> BinaryIO:
    """A binary stream over a file or object (S3: streamed and seekable, not downloaded first)."""
    path = _path(path)
    return _backend(path).open_read(path)


@contextmanager
def open_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Yield a binary stream; its bytes appear under ``path`` only if the block exits cleanly.

    On an exception nothing is left under ``path`` (an object already there stays untouched).
    S3 streams are not seekable: write seek-needing formats (HDF5) locally and :func:`upload_file`.
    """
    path = _path(path)
    pending = _backend(path).start_write(path)
    try:
        yield pending.file
    except BaseException as exc:
        pending.discard()
        if not is_s3(path) and _full_device(exc):
            raise _out_of_space(path) from exc
        raise
    pending.commit()


def read_bytes(path: str | os.PathLike) -> bytes:
    """The whole content of a file or object."""
    with open_read(path) as stream:
        return stream.read()


def append_local(path: str | os.PathLike, data: bytes) -> None:
    """Append ``data`` to a local file (created when missing). S3 has no appends: there the caller
    writes the whole object again."""
    path = _path(path)
    if is_s3(path):
        raise ValueError(f"{path}: appends are for local files only")
    with _local_errors(path):
        if os.path.islink(path):  # appending would write into whatever it points to
            raise StorageError(f"{path}: a link, not a file this run wrote; not appended to")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "ab") as f:
            f.write(data)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``."""
    with open_write(path) as stream:
        stream.write(data)


def exists(path: str | os.PathLike) -> bool:
    """True for an existing file/directory, an object, or an S3 prefix with objects under ``prefix/``."""
    path = _path(path)
    return _backend(path).exists(path)


def folder_links_out(folder: str | os.PathLike) -> list[str]:
    """The links inside a local ``folder`` to folders outside it (``/``-separated, relative to it,
    sorted): ``list_names`` does not descend into them, and a file written under one lands in
    someone else's folder. Links within the folder (wandb's ``latest-run``) and links to files
    (every write replaces the link itself; ``append_local`` refuses one) are not listed; S3 has
    no links."""
    folder = _path(folder)
    if is_s3(folder) or not os.path.isdir(folder):
        return []
    root = os.path.realpath(folder)
    found = []
    for dirpath, dirnames, _ in os.walk(folder):
        for name in dirnames:
            full = os.path.join(dirpath, name)
            target = os.path.realpath(full)
            if os.path.islink(full) and os.path.commonpath([root, target]) != root:
                found.append(os.path.relpath(full, folder).replace(os.sep, "/"))
    return sorted(found)


def size(path: str | os.PathLike) -> int:
    """Bytes of the file or object ``path`` (StorageError for a missing one, a folder, or a local
    path that is not a regular file)."""
    path = _path(path)
    return _backend(path).size(path)


def is_file(path: str | os.PathLike) -> bool:
    """True for an existing file or object at exactly ``path`` (not a folder or a prefix)."""
    path = _path(path)
    return _backend(path).is_object(path)


def delete(path: str | os.PathLike) -> None:
    """Remove one file or object; a missing one is not an error (a missing bucket is)."""
    path = _path(path)
    _backend(path).delete(path)


def list_prefix(prefix: str | os.PathLike) -> list[str]:
    """Sorted full paths of all files/objects whose path starts with ``prefix`` (recursive).

    ``prefix`` is a string prefix, as in S3: ``out/shard`` also matches ``out/shard-2/x``; end it
    with ``/`` for one directory. A missing directory lists as empty.
    """
    return sorted(list_sizes(prefix))


def version(path: str | os.PathLike) -> dict:
    """What tells this version of a file from an edited one without reading it: its size and
    modification time (local, nanoseconds) or its size and ETag (S3). A rerun compares versions to
    find an input edited under a half-finished output (an edit that keeps the size and the time
    passes: only the content's hash, which means reading it, would tell)."""
    path = _path(path)
    if is_s3(path):
        bucket, key = _object(path)
        with _s3_errors(path):
            head = s3_client().head_object(Bucket=bucket, Key=key)
        return {"bytes": int(head["ContentLength"]), "etag": str(head.get("ETag", ""))}
    with _local_errors(path):
        info = os.stat(path)
    return {"bytes": info.st_size, "modified_ns": info.st_mtime_ns}


def list_sizes(prefix: str | os.PathLike) -> dict[str, int]:
    """Full path -> size in bytes of every file/object :func:`list_prefix` lists (one listing: the
    sizes come with it on S3)."""
    prefix = _path(prefix)
    return _backend(prefix).list_sizes(prefix)


def list_names(folder: str | os.PathLike) -> list[str]:
    """The files under the folder/prefix ``folder`` (recursive), as sorted ``/``-separated paths
    relative to it; a missing folder lists as empty."""
    prefix = _path(folder).rstrip("/") + "/"
    return [path[len(prefix) :].replace(os.sep, "/") for path in list_prefix(prefix)]


def expand(pattern_or_paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """Sorted, de-duplicated paths from a glob, a path, or a list of them.

    Globs (``*``, ``?``, ``[..]``, ``**``) work locally and on S3 with the same meaning; a glob that
    matches nothing or a plain path that does not exist is a StorageError.
    """
    items = [pattern_or_paths] if isinstance(pattern_or_paths, str | os.PathLike) else list(pattern_or_paths)
    found: set[str] = set()
    for item in map(_path, items):
        found.update(_expand_one(item))
    return sorted(found)


def _expand_one(item: str) -> list[str]:
    backend = _backend(item)
    if not has_glob(item):
        if not backend.is_object(item):
            if not is_s3(item) and os.path.islink(item) and not os.path.exists(item):
                raise StorageError(_broken_link(item))
            if not is_s3(item) and os.path.isdir(item):
                raise StorageError(
                    f"{item}: a folder, not a file; name its files or a glob ({join(item, '*.txt')})"
                )
            if not is_s3(item) and os.path.exists(item):
                raise StorageError(f"{item}: not a regular file (a device, FIFO or socket); name a file")
            raise StorageError(f"{item}: no such file or object")
        return [item]
    hits = backend.glob(item)
    if not hits:
        raise StorageError(f"{item}: no file or object matches this pattern")
    return hits


def _broken_link(path: str) -> str:
    """What is wrong with a symbolic link that names no file (a loop, or a missing target)."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{path}: a symbolic link loop (it leads back to itself); name the file it should reach"
    return f"{path}: a symbolic link to {os.readlink(path)!r}, which does not exist"


def _copy(source: str, target: str) -> None:
    with open_read(source) as src, open_write(target) as dst:
        shutil.copyfileobj(src, dst, COPY_CHUNK)


def upload_file(local_path: str | os.PathLike, path: str | os.PathLike) -> None:
    """Copy a local file to ``path`` (S3 or local), atomically."""
    _copy(_local_only(local_path, "upload source"), _path(path))


def probe_writable(prefix: str | os.PathLike) -> None:
    """Write and delete a small probe object under ``prefix``, so a missing bucket, denied
    credentials or an unreachable endpoint fail before any work starts (StorageError)."""
    probe = join(str(prefix), ".write-probe")
    write_bytes(probe, b"")
    delete(probe)


def hash_into(digest: Any, path: str | os.PathLike) -> None:
    """Feed a local or s3:// file into ``digest`` (a hashlib object), streamed."""
    with open_read(path) as stream:
        while chunk := stream.read(HASH_CHUNK):
            digest.update(chunk)


def sha256(path: str | os.PathLike) -> str:
    """sha256 hex digest of a local or s3:// file, streamed."""
    with open_read(path) as stream:
        reader = HashingReader(stream)
        reader.drain()
    return reader.hexdigest()


def download_file(path: str | os.PathLike, local_path: str | os.PathLike) -> None:
    """Copy ``path`` (S3 or local) to a local file, atomically."""
    _copy(_path(path), _local_only(local_path, "download target"))
