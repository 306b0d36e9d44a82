"""Storage's S3 backend: one boto3 client per process and endpoint, bounded retries and timeouts
(an endpoint that never answered is not waited for again for a minute), streamed reads that
reopen at their offset, multipart uploads completed only on a clean exit."""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import BinaryIO

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

from pipeline.runtime.redaction import redact
from pipeline.runtime.storage.paths import (
    S3_SCHEME,
    StorageError,
    _one_line,
    glob_regex,
    has_glob,
    literal_prefix,
    split_s3,
)

log = logging.getLogger("pipeline.runtime.storage")

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
"""Total tries per request to an endpoint that has not yet answered this process (AWS_MAX_ATTEMPTS
overrides): bounded so a wrong or unreachable endpoint fails within seconds (a refused connection:
~0.5 s here), while throttling still gets three jittered backoffs."""
OUTAGE_ATTEMPTS = 12
"""Total tries per request to an endpoint that has answered this process (AWS_MAX_ATTEMPTS
overrides): a long run rides out a pause or restart of its object store of a minute or two (up to
12 x READ_TIMEOUT_S, plus botocore's backoff of up to 20 s a try), where 4 tries gave out after
about 30 s, mid-run, with the work done so far left to a resume."""
UNANSWERED_HOLD_S = 60.0
"""An endpoint that has never answered this process and let every attempt of a request time out is
not waited for again for this long: the stage's next request (its error path's, another input's)
fails at once, so a stage given an endpoint that never answers fails within a minute, not one
full wait per request. An endpoint that has answered before (a pause in a long run) gets every
request's full attempts, so runs ride out an outage as before."""


# ---------------------------------------------------------------- s3 backend

_endpoint_override: str | None = None
_clients: dict[tuple[int, str | None, bool], object] = {}
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


def _retry_config(answered: bool | None = None) -> dict:
    """botocore's retries for a request to the current endpoint; ``answered``: whether it has
    answered this process (None: look it up)."""
    if answered is None:
        answered = _endpoint_label() in _answered
    raw = os.environ.get("AWS_MAX_ATTEMPTS", str(OUTAGE_ATTEMPTS if answered else DEFAULT_MAX_ATTEMPTS))
    if not raw.isdigit() or int(raw) < 1:
        raise StorageError(f"AWS_MAX_ATTEMPTS={raw!r}: not a positive integer")
    # total_max_attempts counts the first try, like AWS_MAX_ATTEMPTS (botocore's max_attempts does not)
    return {"mode": os.environ.get("AWS_RETRY_MODE", "standard"), "total_max_attempts": int(raw)}


def _new_client(endpoint: str | None, answered: bool):
    config = Config(
        retries=_retry_config(answered),
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
    """The boto3 S3 client of this process for the current endpoint (cached, keyed by pid), with
    the retries of an endpoint that has answered this process or not (``OUTAGE_ATTEMPTS``)."""
    key = (os.getpid(), endpoint_url(), _endpoint_label() in _answered)
    client = _clients.get(key)
    if client is None:
        with _clients_lock:
            client = _clients.get(key) or _new_client(key[1], key[2])
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
