"""One storage layer for local paths and ``s3://bucket/key`` urls; the only module that touches boto3.

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

import ctypes
import errno
import glob as globlib
import hashlib
import io
import logging
import os
import re
import secrets
import shutil
import stat
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, BinaryIO

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    IncompleteReadError,
    NoCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from pipeline.errors import PipelineError
from pipeline.runtime.redaction import redact

log = logging.getLogger(__name__)

S3_SCHEME = "s3://"
PARTIAL_SUFFIX = ".elmo-partial"
"""Suffix of in-progress local writes; listings and globs never return these files."""
PART_SIZE = 8 * 1024 * 1024
"""Multipart part size (S3 needs >= 5 MiB for all but the last part); doubles every 2000 parts so a
streamed object can reach hundreds of GB within S3's 10000-part limit."""
UPLOAD_THREADS = 4
"""Multipart parts uploaded concurrently per stream (bounds memory to about this many parts)."""
COPY_CHUNK = 8 * 1024 * 1024
READ_BUFFER = 1024 * 1024
READ_RETRIES = 3
"""Times a broken S3 read stream is reopened at its current offset before the read fails."""
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 10
"""Seconds without a byte from the endpoint before a request is tried again: an endpoint that
accepts connections and never answers fails in about DEFAULT_MAX_ATTEMPTS x this (and the
first wait is said on stderr), while a transfer that keeps moving is never cut."""
DEFAULT_MAX_ATTEMPTS = 4
"""Total tries per request (AWS_MAX_ATTEMPTS overrides): bounded so an unreachable endpoint fails within
seconds (a refused connection: ~0.5 s here), while throttling still gets three jittered backoffs."""
UNANSWERED_HOLD_S = 60.0
"""An endpoint that has never answered this process and let every attempt of a request time out is
not waited for again for this long: the stage's next request (its error path's, another input's)
fails at once, so a stage given an endpoint that never answers fails within a minute, not one
full wait per request. An endpoint that has answered before (a pause in a long run) gets every
request's full attempts, so runs ride out an outage as before."""


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


# ---------------------------------------------------------------- local backend


def _local_cause(exc: OSError) -> str:
    causes = {
        FileNotFoundError: "no such file or directory",
        PermissionError: "permission denied",
        IsADirectoryError: "is a directory",
        NotADirectoryError: "a parent of the path is not a directory",
        FileExistsError: "a parent of the path is a file",
    }
    for kind, text in causes.items():
        if isinstance(exc, kind):
            return text
    return _one_line(exc.strerror or exc)


@contextmanager
def _local_errors(path: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        if _full_device(exc):
            raise _out_of_space(path) from exc
        raise StorageError(f"{path}: {_local_cause(exc)}") from exc


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _full_device(exc: BaseException | None) -> bool:
    """Whether ``exc`` or an exception it was raised from is a full filesystem or quota (writers
    such as ``torch.save`` wrap the OSError in their own error)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _mount_point(path: str) -> str:
    folder = os.path.abspath(path)
    while not os.path.ismount(folder):
        folder = os.path.dirname(folder)
    return folder


def _out_of_space(path: str) -> OutOfSpace:
    mount = _mount_point(path)
    free = shutil.disk_usage(mount).free
    return OutOfSpace(
        f"{path}: no space left on the filesystem mounted at {mount} ({free:,} bytes free); free space "
        "there or write elsewhere"
    )


def _libc_sync_file_range():
    try:
        call = ctypes.CDLL("libc.so.6", use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux with glibc
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    return call


_SYNC_FILE_RANGE = _libc_sync_file_range()
SYNC_FILE_RANGE_WRITE = 2
WRITEBACK_BYTES = 32 * 1024 * 1024
"""A local write asks the kernel to start writing each this many bytes back to the disk as soon as
they are written (``sync_file_range``), so the sync at commit finds little left: measured on the
2-core machine, a 268 MB shard's final fsync went from 90-130 ms to 5 ms."""


class _WritebackFile(io.FileIO):
    """A file written front to back whose bytes start going to the disk as they are written."""

    def __init__(self, fd: int):
        super().__init__(fd, "wb")
        self._started = self._written = 0

    def write(self, data) -> int:
        count = super().write(data) or 0
        self._written += count
        if _SYNC_FILE_RANGE is not None and self._written - self._started >= WRITEBACK_BYTES:
            _SYNC_FILE_RANGE(
                self.fileno(), self._started, self._written - self._started, SYNC_FILE_RANGE_WRITE
            )
            self._started = self._written
        return count


class _LocalWrite:
    """A temp file next to the target, renamed onto it by :meth:`commit`."""

    def __init__(self, path: str):
        self.path = path
        parent, name = os.path.split(os.path.abspath(path))
        self.tmp = os.path.join(parent, f".{name}.{secrets.token_hex(6)}{PARTIAL_SUFFIX}")
        with _local_errors(path):
            if os.path.isdir(path):
                raise IsADirectoryError(path)
            os.makedirs(parent, exist_ok=True)
            # os.open (not tempfile) so the final file gets the usual umask-derived mode
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        self.file = io.BufferedWriter(_WritebackFile(fd))

    def commit(self) -> None:
        try:
            with _local_errors(self.path):
                if not self.file.closed:  # the caller may have closed it already
                    self.file.flush()
                    os.fsync(self.file.fileno())
                    self.file.close()
                os.replace(self.tmp, self.path)
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        self.file.close()
        try:
            os.remove(self.tmp)
        except FileNotFoundError:
            pass


def _is_partial(path: str) -> bool:
    return path.endswith(PARTIAL_SUFFIX)


def _prefix_overlaps(directory: str, prefix: str) -> bool:
    """Whether files under ``directory`` can start with ``prefix`` (prunes the walk)."""
    directory = directory.rstrip(os.sep) + os.sep
    return directory.startswith(prefix) or prefix.startswith(directory)


class LocalBackend:
    """Plain files; directories are created on write, as S3 has none."""

    def open_read(self, path: str) -> BinaryIO:
        with _local_errors(path):
            mode = os.stat(path).st_mode  # follows a link, never blocks (opening a FIFO would)
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(path)
            if not stat.S_ISREG(mode):  # a device (a link to /dev/zero reads forever), FIFO or socket
                raise StorageError(f"{path}: not a regular file (a device, FIFO or socket)")
            return open(path, "rb")

    def size(self, path: str) -> int:
        with _local_errors(path):
            found = os.stat(path)
            if not stat.S_ISREG(found.st_mode):
                raise StorageError(f"{path}: not a regular file")
            return found.st_size

    def start_write(self, path: str) -> _LocalWrite:
        return _LocalWrite(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def delete(self, path: str) -> None:
        with _local_errors(path):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass

    def list_sizes(self, prefix: str) -> dict[str, int]:
        root = os.path.dirname(prefix)
        found = {}
        for dirpath, dirnames, filenames in os.walk(root or "."):
            shown = dirpath if root else os.path.relpath(dirpath)
            shown = "" if shown == "." else shown
            dirnames[:] = [d for d in dirnames if _prefix_overlaps(os.path.join(shown, d), prefix)]
            for name in filenames:
                full = os.path.join(shown, name)
                if full.startswith(prefix) and not _is_partial(full):
                    try:
                        found[full] = os.stat(full).st_size
                    except FileNotFoundError:  # removed since the walk listed it
                        continue
        return found

    def is_object(self, path: str) -> bool:
        return os.path.isfile(path)

    def glob(self, pattern: str) -> list[str]:
        hits = globlib.glob(pattern, recursive=True)
        return sorted(p for p in hits if os.path.isfile(p) and not _is_partial(p))


# ---------------------------------------------------------------- s3 backend

_endpoint_override: str | None = None
_clients: dict[tuple[int, str | None], object] = {}
_clients_lock = threading.Lock()


def configure(endpoint_url: str | None = None) -> None:
    """Use ``endpoint_url`` for S3 in this process (``None``: ``AWS_ENDPOINT_URL`` or AWS itself).

    Also drops cached clients, so credentials changed in the environment take effect.
    """
    global _endpoint_override
    _endpoint_override = endpoint_url
    _forget_clients()


def _forget_clients() -> None:
    global _clients_lock
    _clients.clear()
    _clients_lock = threading.Lock()


# a forked child (Ray, DataLoader workers) must not reuse the parent's sockets or a held lock
os.register_at_fork(after_in_child=_forget_clients)


def endpoint_url() -> str | None:
    """The S3 endpoint in effect: :func:`configure`'s, else ``AWS_ENDPOINT_URL``, else AWS's own."""
    return _endpoint_override or os.environ.get("AWS_ENDPOINT_URL") or None


def _retry_config() -> dict:
    raw = os.environ.get("AWS_MAX_ATTEMPTS", str(DEFAULT_MAX_ATTEMPTS))
    if not raw.isdigit() or int(raw) < 1:
        raise StorageError(f"AWS_MAX_ATTEMPTS={raw!r}: not a positive integer")
    # total_max_attempts counts the first try, like AWS_MAX_ATTEMPTS (botocore's max_attempts does not)
    return {"mode": os.environ.get("AWS_RETRY_MODE", "standard"), "total_max_attempts": int(raw)}


def _new_client(endpoint: str | None):
    config = Config(
        retries=_retry_config(),
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        # custom endpoints (SeaweedFS, MinIO, an IP) rarely resolve bucket subdomains
        s3={"addressing_style": "path"} if endpoint else None,
    )
    client = boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)
    client.meta.events.register("needs-retry.s3", _say_waiting)
    client.meta.events.register("before-call.s3", _fail_fast_when_never_answered)
    client.meta.events.register("after-call.s3", _note_answered)
    return client


_answered: set[str] = set()
_unanswered: dict[str, float] = {}
"""Endpoint label -> when a request to it, never answered in this process, last ran out of attempts."""


class _NeverAnswered(Exception):
    """Raised before a request to an endpoint known not to answer (``UNANSWERED_HOLD_S``)."""

    def __init__(self, seconds_ago: float):
        super().__init__(seconds_ago)
        self.seconds_ago = seconds_ago


def _note_answered(**_) -> None:
    label = _endpoint_label()
    _answered.add(label)
    _unanswered.pop(label, None)


def _fail_fast_when_never_answered(**_) -> None:
    since = _unanswered.get(_endpoint_label())
    if since is not None and time.monotonic() - since < UNANSWERED_HOLD_S:
        raise _NeverAnswered(time.monotonic() - since)


_said_waiting: set[str] = set()
_said_lock = threading.Lock()


def _say_waiting(attempts: int = 0, caught_exception: BaseException | None = None, **_) -> None:
    """botocore's retry hook (no say in the decision): the first time in this process that an
    endpoint does not answer, one line on stderr, so a wait of up to a minute is not silent."""
    if not isinstance(caught_exception, (ReadTimeoutError, ConnectTimeoutError)):
        return
    label = _endpoint_label()
    with _said_lock:  # several threads time out at once (a checkpoint's parts, the records)
        if label in _said_waiting:
            return
        _said_waiting.add(label)
    print(
        f"storage: S3 endpoint {label} did not answer within {READ_TIMEOUT_S} s; trying again "
        f"(attempt {attempts + 1} of {_retry_config()['total_max_attempts']})",
        file=sys.stderr,
        flush=True,
    )


def s3_client():
    """The boto3 S3 client of this process for the current endpoint (cached, keyed by pid)."""
    key = (os.getpid(), endpoint_url())
    client = _clients.get(key)
    if client is None:
        with _clients_lock:
            client = _clients.get(key) or _new_client(key[1])
            _clients[key] = client
    return client


_CLIENT_CAUSES = {
    "NoSuchKey": "no such object",
    "404": "no such object",
    "NotFound": "no such object",
    "InvalidAccessKeyId": "credentials rejected: the access key id is unknown to the endpoint (InvalidAccessKeyId)",
    "SignatureDoesNotMatch": "credentials rejected: the secret key does not match the access key (SignatureDoesNotMatch)",
    "AccessDenied": "access denied: the credentials lack permission or no credentials were sent (AccessDenied)",
    "403": "access denied (403 Forbidden): wrong secret key, unknown access key or missing permission",
    "InvalidBucketName": "invalid bucket name",
    "PreconditionFailed": "the object was replaced while it was being read (PreconditionFailed)",
}


def _client_cause(exc: ClientError, bucket: str) -> str:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", "unknown"))
    if code == "NoSuchBucket":
        return f"bucket '{bucket}' does not exist (NoSuchBucket)"
    cause = _CLIENT_CAUSES.get(code) or f"{code}: {error.get('Message', 'no message')}"
    return _one_line(cause)


def _endpoint_label() -> str:
    return redact(endpoint_url() or "the default AWS endpoint")


@contextmanager
def _s3_errors(path: str) -> Iterator[None]:
    """Turn botocore exceptions into a one-line StorageError naming ``path`` and the cause."""
    bucket = split_s3(path)[0]
    try:
        yield
    except ClientError as exc:
        raise StorageError(f"{path}: {_client_cause(exc, bucket)}") from exc
    except NoCredentialsError as exc:
        raise StorageError(
            f"{path}: no AWS credentials found (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile)"
        ) from exc
    except (ReadTimeoutError, ConnectTimeoutError) as exc:
        if _endpoint_label() not in _answered:
            _unanswered[_endpoint_label()] = time.monotonic()
        raise StorageError(
            f"{path}: S3 endpoint {_endpoint_label()} did not answer (no byte within {READ_TIMEOUT_S} s, "
            f"{_retry_config()['total_max_attempts']} attempts)"
        ) from exc
    except _NeverAnswered as exc:
        raise StorageError(
            f"{path}: S3 endpoint {_endpoint_label()} did not answer (no byte within {READ_TIMEOUT_S} s, "
            f"{_retry_config()['total_max_attempts']} attempts, {exc.seconds_ago:.0f} s ago); not waited for again"
        ) from None
    except BotoConnectionError as exc:
        raise StorageError(
            f"{path}: cannot reach S3 endpoint {_endpoint_label()} ({type(exc).__name__})"
        ) from exc
    except BotoCoreError as exc:
        raise StorageError(f"{path}: {_one_line(exc)}") from exc


def _object(path: str) -> tuple[str, str]:
    bucket, key = split_s3(path)
    if not key or key.endswith("/"):
        raise StorageError(f"{path}: not an object url (no key after the bucket, or ends with '/')")
    return bucket, key


class _S3Reader(io.RawIOBase):
    """A seekable read stream over one object version; a broken stream is reopened at its offset."""

    def __init__(self, path: str):
        self.path = self.name = path
        self.bucket, self.key = _object(path)
        with _s3_errors(path):
            response = s3_client().get_object(Bucket=self.bucket, Key=self.key)
        self.size = response["ContentLength"]
        self.etag = response["ETag"]
        self.body = response["Body"]
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        if base + offset != self.pos:
            self._drop_body()
            self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer) -> int:
        data = self._read_some(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        chunks = []
        while chunk := self._read_some(COPY_CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)

    def _read_some(self, limit: int) -> bytes:
        """Up to ``limit`` bytes from the current offset; b"" only at the end of the object."""
        if self.pos >= self.size or limit == 0:
            return b""
        for attempt in range(READ_RETRIES + 1):
            try:
                data = self._body().read(min(limit, self.size - self.pos))
                break
            except (
                ReadTimeoutError,
                ResponseStreamingError,
                IncompleteReadError,
                BotoConnectionError,
            ) as exc:
                self._drop_body()
                if attempt == READ_RETRIES:
                    raise StorageError(
                        f"{self.path}: read failed at byte {self.pos}: {_one_line(exc)}"
                    ) from exc
        self.pos += len(data)
        return data

    def _body(self):
        if self.body is None:
            # IfMatch: a resumed stream must not splice in a concurrently replaced object
            with _s3_errors(self.path):
                self.body = s3_client().get_object(
                    Bucket=self.bucket, Key=self.key, Range=f"bytes={self.pos}-", IfMatch=self.etag
                )["Body"]
        return self.body

    def _drop_body(self) -> None:
        if self.body is not None:
            self.body.close()
            self.body = None

    def close(self) -> None:
        self._drop_body()
        super().close()


class _S3Write(io.BufferedIOBase):
    """A write stream: one PUT if the object stays under a part, else a multipart upload.

    Parts upload on ``UPLOAD_THREADS`` threads while the caller keeps writing (at most that many in
    flight, so memory stays bounded). Nothing is visible under the key until :meth:`commit`;
    :meth:`discard` waits for in-flight parts and aborts the upload. ``close()`` only closes the
    stream: committing is the job of :func:`open_write`.
    """

    def __init__(self, path: str):
        self.path = self.name = path
        self.bucket, self.key = _object(path)
        self.buffer = bytearray()
        self.written = 0
        self.upload_id: str | None = None
        self.part_count = 0
        self.in_flight: list[Future] = []
        self.parts: list[dict] = []
        self.pool: ThreadPoolExecutor | None = None
        self.file = self

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.written

    def write(self, data) -> int:
        if self.closed:
            raise ValueError(f"{self.path}: write to a closed stream")
        view = memoryview(data)
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
        size = view.nbytes
        self.written += size
        # a part at a time: torch.save hands over a whole multi-GB tensor in one write, and
        # appending it to the buffer at once would hold a second copy of it in memory
        while view.nbytes:
            room = self._part_size() - len(self.buffer)
            self.buffer += view[:room]
            view = view[room:]
            if len(self.buffer) >= self._part_size():
                self._start_part(self._part_size())
        return size

    def _part_size(self) -> int:
        return PART_SIZE * 2 ** (self.part_count // 2000)

    def _start_part(self, size: int) -> None:
        if self.upload_id is None:
            with _s3_errors(self.path):
                response = s3_client().create_multipart_upload(Bucket=self.bucket, Key=self.key)
            self.upload_id = response["UploadId"]
            self.pool = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="s3-part")
        if len(self.in_flight) >= UPLOAD_THREADS:
            self.parts.append(self.in_flight.pop(0).result())
        self.part_count += 1
        chunk = bytes(self.buffer[:size])
        del self.buffer[:size]
        self.in_flight.append(self.pool.submit(self._send_part, self.part_count, chunk))

    def _send_part(self, number: int, chunk: bytes) -> dict:
        with _s3_errors(self.path):
            response = s3_client().upload_part(
                Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number, Body=chunk
            )
        return {"ETag": response["ETag"], "PartNumber": number}

    def commit(self) -> None:
        try:
            self._finish()
        except BaseException:
            self.discard()
            raise
        self.close()

    def _finish(self) -> None:
        client = s3_client()
        if self.upload_id is None:
            with _s3_errors(self.path):
                client.put_object(Bucket=self.bucket, Key=self.key, Body=bytes(self.buffer))
            return
        if self.buffer:
            self._start_part(len(self.buffer))
        self.parts += [future.result() for future in self.in_flight]
        self.in_flight = []
        self._stop_pool()
        with _s3_errors(self.path):
            client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=self.key,
                UploadId=self.upload_id,
                MultipartUpload={"Parts": self.parts},
            )

    def discard(self) -> None:
        self.close()
        self.buffer = bytearray()
        # parts still uploading after the abort would be stored again: let them land first
        self._stop_pool()
        self.in_flight = []
        if self.upload_id is None:
            return
        try:
            s3_client().abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)
        except (BotoCoreError, ClientError) as exc:
            # the caller's original error matters more; a stale upload is invisible and expires
            log.warning("%s: could not abort multipart upload: %s", self.path, _one_line(exc))
        self.upload_id = None

    def _stop_pool(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def _head(bucket: str, key: str) -> bool:
    """HEAD an object: True if it exists, False on 404/403 (which carry no detail)."""
    try:
        s3_client().head_object(Bucket=bucket, Key=key)
        return True
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "403", "NoSuchKey"):
            return False
        raise


def _first_keys(bucket: str, prefix: str, count: int = 1) -> list[str]:
    response = s3_client().list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=count)
    return [o["Key"] for o in response.get("Contents", [])]


class S3Backend:
    """Objects in S3 (or an S3-compatible server) through boto3."""

    def open_read(self, path: str) -> BinaryIO:
        return io.BufferedReader(_S3Reader(path), buffer_size=READ_BUFFER)

    def start_write(self, path: str) -> _S3Write:
        return _S3Write(path)

    def exists(self, path: str) -> bool:
        bucket, key = split_s3(path)
        with _s3_errors(path):
            if key and not key.endswith("/") and _head(bucket, key):
                return True
            # a HEAD miss says nothing about the bucket and a 403 has no detail: a listing tells both
            return bool(_first_keys(bucket, key.rstrip("/") + "/" if key else ""))

    def size(self, path: str) -> int:
        bucket, key = _object(path)
        with _s3_errors(path):
            return int(s3_client().head_object(Bucket=bucket, Key=key)["ContentLength"])

    def is_object(self, path: str) -> bool:
        bucket, key = split_s3(path)
        with _s3_errors(path):
            # the key itself sorts before every longer key it prefixes
            return bool(key) and _first_keys(bucket, key) == [key]

    def delete(self, path: str) -> None:
        bucket, key = _object(path)
        with _s3_errors(path):
            s3_client().delete_object(Bucket=bucket, Key=key)

    def list_sizes(self, prefix: str) -> dict[str, int]:
        bucket, key = split_s3(prefix)
        paginator = s3_client().get_paginator("list_objects_v2")
        found = {}
        with _s3_errors(prefix):
            for page in paginator.paginate(Bucket=bucket, Prefix=key):
                for o in page.get("Contents", []):
                    if not o["Key"].endswith("/"):
                        found[f"{S3_SCHEME}{bucket}/{o['Key']}"] = int(o["Size"])
        return found

    def glob(self, pattern: str) -> list[str]:
        bucket, key = split_s3(pattern)
        if has_glob(bucket):
            raise StorageError(f"{pattern}: globs in the bucket name are not supported")
        regex = glob_regex(key)
        listed = sorted(self.list_sizes(f"{S3_SCHEME}{bucket}/{literal_prefix(key)}"))
        return [p for p in listed if regex.match(split_s3(p)[1])]


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


class HashingWriter(io.RawIOBase):
    """``out`` (a stream of :func:`open_write`, or any binary sink) with every byte written also
    hashed (sha256) and counted: what a stage writes is known by its hash without reading it
    back. ``hexdigest()`` and ``size`` once written; ``tell()`` is the bytes written so far."""

    def __init__(self, out: BinaryIO):
        self.out, self.digest, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.out.write(data)
        self.digest.update(data)
        size = memoryview(data).nbytes
        self.size += size
        return size

    def tell(self) -> int:
        return self.size

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


class HashingReader(io.RawIOBase):
    """``raw`` (a stream of :func:`open_read`) with every byte read also hashed (sha256) and
    counted, keeping the last ``tail`` bytes read (a tar's end-of-archive marker, say);
    ``drain()`` reads the rest, so that ``hexdigest()`` is the whole file's."""

    def __init__(self, raw: BinaryIO, tail: int = 0):
        self.raw, self.digest, self.size = raw, hashlib.sha256(), 0
        self.keep, self.tail = tail, b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.digest.update(data)
        self.size += len(data)
        if self.keep:  # the last bytes, without copying a large read whole
            self.tail = data[-self.keep :] if len(data) >= self.keep else (self.tail + data)[-self.keep :]
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        while self.read(HASH_CHUNK):
            pass

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


HASH_CHUNK = 8 * 1024 * 1024
"""Bytes read per step when hashing a file, streamed so memory stays flat for any file size."""


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


def _gopen_s3(url: str, mode: str = "rb", bufsize: int = 8192, **kwargs) -> BinaryIO:
    if mode != "rb":
        raise StorageError(f"{url}: webdataset can only read s3:// urls here; write with storage.open_write")
    return open_read(url)


def register_webdataset_s3() -> None:
    """Let ``webdataset`` open ``s3://`` urls through boto3 (its gopen has no s3 scheme).

    Per process: call it in each Ray worker that builds a ``WebDataset`` over S3 urls.
    """
    # the module, not webdataset.gopen (the package rebinds that name to the function)
    from webdataset.gopen import gopen_schemes

    gopen_schemes["s3"] = _gopen_s3
