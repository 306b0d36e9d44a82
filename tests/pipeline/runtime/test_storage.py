"""pipeline.runtime.storage against a local tmp directory and a real SeaweedFS S3 server (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import boto3
import numpy as np
import pytest
import torch
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError, ResponseStreamingError

from pipeline.runtime import storage
from pipeline.runtime.storage import StorageError, join
from pipeline.runtime.storage import s3 as s3_files

MB = 1024 * 1024


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> str:
    """A fresh empty location, ending in '/', on each backend."""
    if request.param == "local":
        return str(tmp_path) + "/"
    return request.getfixturevalue("s3_prefix")


@pytest.fixture
def fresh_clients():
    """Drop cached S3 clients before and after a test that changes credentials or the endpoint."""
    storage.configure()
    yield
    storage.configure()


def payload(size: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def put_tree(root: str, names: list[str]) -> None:
    for name in names:
        storage.write_bytes(join(root, name), name.encode())


def one_line_error(excinfo, *needles: str) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


# ---------------------------------------------------------------- pure helpers


def test_join_and_is_s3():
    assert join("s3://b/", "x/", "/y.tar") == "s3://b/x/y.tar"
    assert join("s3://b", "x") == "s3://b/x"
    assert join("/tmp/a", "b", "c") == os.path.join("/tmp/a", "b", "c")
    assert storage.is_s3("s3://b/k") and not storage.is_s3("/s3://x") and not storage.is_s3("b/k")
    assert storage.split_s3("s3://bkt/a/b") == ("bkt", "a/b")
    with pytest.raises(StorageError, match="no bucket name"):
        storage.split_s3("s3:///key")


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("d/*.tar", "d/a.tar", True),
        ("d/*.tar", "d/sub/a.tar", False),
        ("d/**/*.tar", "d/a.tar", True),
        ("d/**/*.tar", "d/x/y/a.tar", True),
        ("d/s-00?.tar", "d/s-001.tar", True),
        ("d/s-00?.tar", "d/s-0001.tar", False),
        ("d/s-00[12].tar", "d/s-002.tar", True),
        ("d/s-00[!12].tar", "d/s-002.tar", False),
        ("d/a+b.tar", "d/a+b.tar", True),
        ("d/a.tar", "d/aXtar", False),
    ],
)
def test_glob_regex_follows_local_glob_rules(pattern, key, matches):
    assert bool(storage.glob_regex(pattern).match(key)) is matches


# ---------------------------------------------------------------- both backends


def test_bytes_round_trip_and_overwrite(root):
    path = join(root, "a/b/c.bin")
    data = payload(1000)
    storage.write_bytes(path, data)
    assert storage.read_bytes(path) == data
    storage.write_bytes(path, b"second")
    assert storage.read_bytes(path) == b"second"
    storage.write_bytes(join(root, "empty"), b"")
    assert storage.read_bytes(join(root, "empty")) == b""


def test_streaming_write_and_read(root):
    path = join(root, "stream.bin")
    data = payload(300_000, seed=1)
    with storage.open_write(path) as out:
        for start in range(0, len(data), 70_001):
            out.write(memoryview(data)[start : start + 70_001])
        assert out.tell() == len(data)
    with storage.open_read(path) as stream:
        head = stream.read(10)
        rest = b"".join(iter(lambda: stream.read(65_536), b""))
        assert head + rest == data
        stream.seek(123_456)
        assert stream.read(5) == data[123_456:123_461]
        stream.seek(-3, io.SEEK_END)
        assert stream.read() == data[-3:]


def test_lines_stream(root):
    path = join(root, "lines.txt")
    storage.write_bytes(path, b"one\ntwo\nthree\n")
    with storage.open_read(path) as stream:
        assert [line.decode().strip() for line in stream] == ["one", "two", "three"]


def test_list_prefix(root):
    put_tree(root, ["a/1", "a/2", "a/sub/3", "ab/4", "b/5"])
    assert storage.list_prefix(join(root, "a") + "/") == [join(root, n) for n in ["a/1", "a/2", "a/sub/3"]]
    assert storage.list_prefix(join(root, "a")) == [join(root, n) for n in ["a/1", "a/2", "a/sub/3", "ab/4"]]
    assert storage.list_prefix(root) == [join(root, n) for n in ["a/1", "a/2", "a/sub/3", "ab/4", "b/5"]]
    assert storage.list_prefix(join(root, "missing/")) == []
    # a folder's own files, named relative to it ("ab/4" is not under "a")
    assert (
        storage.list_names(join(root, "a"))
        == ["1", "2", "sub/3"]
        == storage.list_names(join(root, "a") + "/")
    )
    assert storage.list_names(join(root, "missing")) == []


def test_exists_and_delete(root):
    put_tree(root, ["d/x.bin"])
    path = join(root, "d/x.bin")
    assert storage.exists(path)
    assert storage.exists(join(root, "d"))  # a directory / a prefix with objects under it
    assert not storage.exists(join(root, "d/y.bin"))
    storage.delete(path)
    assert not storage.exists(path)
    storage.delete(path)  # deleting what is gone is fine


def test_expand_globs_and_lists(root):
    put_tree(root, ["x/s-000.tar", "x/s-001.tar", "x/s-002.txt", "x/sub/s-003.tar"])
    tars = [join(root, n) for n in ["x/s-000.tar", "x/s-001.tar"]]
    assert storage.expand(join(root, "x/*.tar")) == tars
    assert storage.expand(join(root, "x/**/*.tar")) == tars + [join(root, "x/sub/s-003.tar")]
    assert storage.expand(join(root, "x/s-00[01].*")) == tars
    mixed = [join(root, "x/s-002.txt"), join(root, "x/s-00?.tar"), tars[0]]
    assert storage.expand(mixed) == tars + [join(root, "x/s-002.txt")]
    assert storage.expand(tars[1]) == [tars[1]]


def test_expand_nothing_is_an_error(root):
    put_tree(root, ["x/s-000.tar"])
    with pytest.raises(StorageError) as excinfo:
        storage.expand(join(root, "x/*.json"))
    one_line_error(excinfo, join(root, "x/*.json"), "matches")
    with pytest.raises(StorageError) as excinfo:
        storage.expand([join(root, "x/s-000.tar"), join(root, "x/s-999.tar")])
    one_line_error(excinfo, join(root, "x/s-999.tar"), "no such")


def test_a_local_folder_named_as_a_file_says_so(tmp_path):
    (tmp_path / "corpus").mkdir()
    with pytest.raises(
        StorageError, match=r"corpus: a folder, not a file; name its files or a glob \(.*corpus/\*.txt\)"
    ):
        storage.expand(str(tmp_path / "corpus"))


def test_a_symbolic_link_loop_or_a_dangling_link_is_named_as_such_not_missing(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere.txt")
    with pytest.raises(StorageError) as excinfo:
        storage.expand([str(tmp_path / "a")])
    one_line_error(excinfo, "a: a symbolic link loop (it leads back to itself)")
    with pytest.raises(StorageError) as excinfo:
        storage.expand(str(tmp_path / "gone"))
    one_line_error(excinfo, "gone: a symbolic link to", "nowhere.txt', which does not exist")


def test_a_fifo_or_device_is_named_as_one_not_missing_and_never_opened(tmp_path):
    """A FIFO opened for reading waits for a writer for ever; a device (a link to /dev/zero) reads
    for ever: both are refused, as what they are, before anything opens them."""
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "zero").symlink_to("/dev/zero")
    for name in ("pipe", "zero"):
        with pytest.raises(StorageError, match=rf"{name}: not a regular file \(a device, FIFO or socket\)"):
            storage.expand(str(tmp_path / name))
        with pytest.raises(StorageError, match=rf"{name}: not a regular file"):
            storage.read_bytes(str(tmp_path / name))
        with pytest.raises(StorageError, match=rf"{name}: not a regular file"):
            storage.size(str(tmp_path / name))


def test_listed_sizes_are_the_files_sizes(root):
    put_tree(root, ["s/a.bin", "s/sub/b.bin"])
    sizes = storage.list_sizes(join(root, "s") + "/")
    assert sorted(sizes) == storage.list_prefix(join(root, "s") + "/")
    assert sizes == {path: len(storage.read_bytes(path)) for path in sizes}


def test_sha256_streams_the_file(root):
    data = payload(3 * storage.HASH_CHUNK // 2 + 7)  # more than one read
    path = storage.join(root, "hashed.bin")
    storage.write_bytes(path, data)
    assert storage.sha256(path) == hashlib.sha256(data).hexdigest()
    digest = hashlib.sha256(b"prefix")
    storage.hash_into(digest, path)
    assert digest.hexdigest() == hashlib.sha256(b"prefix" + data).hexdigest()


def test_probe_writable_leaves_nothing(root):
    storage.probe_writable(storage.join(root, "out"))
    assert storage.list_prefix(storage.join(root, "out")) == []


def test_upload_and_download(root, tmp_path):
    source = tmp_path / "source.bin"
    source.write_bytes(payload(50_000, seed=2))
    remote = join(root, "up/loaded.bin")
    storage.upload_file(str(source), remote)
    assert storage.read_bytes(remote) == source.read_bytes()
    target = tmp_path / "new" / "dir" / "downloaded.bin"
    storage.download_file(remote, target)
    assert target.read_bytes() == source.read_bytes()


def test_multipart_sized_round_trip(root):
    """Over 20 MB: several parts on S3 (8 MiB each), streamed in uneven pieces."""
    path = join(root, "big.bin")
    data = payload(21 * MB, seed=3)
    with storage.open_write(path) as out:
        for start in range(0, len(data), 3 * MB + 7):
            out.write(data[start : start + 3 * MB + 7])
    assert storage.read_bytes(path) == data
    with storage.open_read(path) as stream:
        stream.seek(17 * MB)
        assert stream.read(MB) == data[17 * MB : 18 * MB]


@pytest.mark.parametrize("size", [1000, storage.PART_SIZE + MB], ids=["small", "multipart"])
def test_interrupted_write_leaves_nothing(root, size):
    fresh, existing = join(root, "fresh.bin"), join(root, "existing.bin")
    storage.write_bytes(existing, b"old content")
    for path in (fresh, existing):
        with pytest.raises(RuntimeError, match="interrupted"):
            with storage.open_write(path) as out:
                out.write(payload(size))
                raise RuntimeError("interrupted mid-way")
    assert not storage.exists(fresh)
    assert storage.read_bytes(existing) == b"old content"
    assert storage.list_prefix(root) == [existing]  # no temp files or partial objects visible


def test_torch_checkpoint_through_a_stream(root):
    """torch.save needs only write/tell, so checkpoints stream to S3 without a local copy."""
    path = join(root, "ckpt/model.pt")
    state = {"weight": torch.arange(12.0).reshape(3, 4), "step": 7}
    with storage.open_write(path) as stream:
        torch.save(state, stream)
    with storage.open_read(path) as stream:
        loaded = torch.load(stream, weights_only=True)
    assert loaded["step"] == 7 and torch.equal(loaded["weight"], state["weight"])


# ---------------------------------------------------------------- s3 only


def test_multipart_upload_is_used_and_aborted(s3_server, s3_prefix):
    client = s3_server.server.client()
    bucket, key = storage.split_s3(join(s3_prefix, "abandoned.bin"))

    def pending():
        uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads", [])
        return [u for u in uploads if u["Key"] == key]

    with pytest.raises(RuntimeError):
        with storage.open_write(f"s3://{bucket}/{key}") as out:
            out.write(payload(storage.PART_SIZE + 1))
            assert len(pending()) == 1  # a part is already uploaded, yet nothing under the key
            assert not storage.exists(f"s3://{bucket}/{key}")
            raise RuntimeError("stop")
    assert pending() == []
    storage.write_bytes(join(s3_prefix, "whole.bin"), payload(2 * storage.PART_SIZE + 1))
    etag = client.head_object(Bucket=bucket, Key=storage.split_s3(join(s3_prefix, "whole.bin"))[1])["ETag"]
    assert etag.strip('"').endswith("-3")


def test_failed_part_upload_aborts_and_leaves_nothing(s3_server, s3_prefix, fresh_clients):
    """A part that fails on an upload thread surfaces as the write's error; the upload is aborted."""
    path = join(s3_prefix, "failing.bin")
    bucket, key = storage.split_s3(path)

    def fail_second_part(params, **kwargs):
        if params.get("PartNumber") == 2:
            raise ClientError({"Error": {"Code": "InternalError", "Message": "injected"}}, "UploadPart")

    storage.s3_client().meta.events.register("before-parameter-build.s3.UploadPart", fail_second_part)
    with pytest.raises(StorageError) as excinfo:
        with storage.open_write(path) as out:
            for _ in range(4):
                out.write(payload(storage.PART_SIZE))
    one_line_error(excinfo, path, "InternalError: injected")
    assert not storage.exists(path)
    client = s3_server.server.client()
    uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads", [])
    assert [u for u in uploads if u["Key"] == key] == []


class _BrokenBody:
    """Stands in for a response body whose connection was reset."""

    def read(self, amount=None):
        raise ResponseStreamingError(error="connection reset by peer")

    def close(self):
        pass


def test_broken_read_stream_resumes_at_its_offset(s3_prefix):
    path = join(s3_prefix, "resume.bin")
    data = payload(3 * MB, seed=4)
    storage.write_bytes(path, data)
    with storage.open_read(path) as stream:
        head = stream.read(MB + 5)
        stream.raw.body = _BrokenBody()
        assert head + stream.read() == data


def test_resumed_stream_refuses_a_replaced_object(s3_prefix):
    path = join(s3_prefix, "replaced.bin")
    storage.write_bytes(path, payload(3 * MB, seed=5))
    with storage.open_read(path) as stream:
        stream.read(MB)
        storage.write_bytes(path, payload(3 * MB, seed=6))
        stream.raw.body = _BrokenBody()
        with pytest.raises(StorageError) as excinfo:
            stream.read()
    one_line_error(excinfo, path, "PreconditionFailed")


def test_wrong_secret_is_a_clear_error(s3_prefix, monkeypatch, fresh_clients):
    path = join(s3_prefix, "x.bin")
    storage.write_bytes(path, b"x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    storage.configure()
    for operation in (storage.read_bytes, storage.exists, lambda p: storage.write_bytes(p, b"y")):
        with pytest.raises(StorageError) as excinfo:
            operation(path)
        one_line_error(excinfo, path, "SignatureDoesNotMatch")
    message = str(excinfo.value)
    assert "not-the-secret" not in message


def test_unknown_access_key_is_a_clear_error(s3_prefix, monkeypatch, fresh_clients):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "NOSUCHKEY")
    storage.configure()
    with pytest.raises(StorageError) as excinfo:
        storage.list_prefix(s3_prefix)
    one_line_error(excinfo, s3_prefix, "InvalidAccessKeyId")


def test_missing_credentials_are_a_clear_error(s3_prefix, monkeypatch, fresh_clients, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    storage.configure()
    with pytest.raises(StorageError) as excinfo:
        storage.read_bytes(join(s3_prefix, "x.bin"))
    one_line_error(excinfo, "no AWS credentials")


def test_missing_bucket_is_a_clear_error(s3_server):
    path = "s3://no-such-bucket-elmo/k.bin"
    operations = (
        storage.read_bytes,
        storage.exists,
        storage.list_prefix,
        lambda p: storage.write_bytes(p, b"x"),
        lambda p: storage.write_bytes(p, payload(storage.PART_SIZE + 1)),
        storage.expand,
    )
    for operation in operations:
        with pytest.raises(StorageError) as excinfo:
            operation(path)
        one_line_error(excinfo, path, "bucket 'no-such-bucket-elmo' does not exist")


def test_missing_key_is_a_clear_error(s3_prefix):
    path = join(s3_prefix, "never-written.bin")
    with pytest.raises(StorageError) as excinfo:
        storage.read_bytes(path)
    one_line_error(excinfo, path, "no such object")


@pytest.mark.timeout(60)
def test_unreachable_endpoint_fails_fast(s3_prefix, fresh_clients):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{closed_port}"
    storage.configure(endpoint_url=endpoint)
    with pytest.raises(StorageError) as excinfo:
        storage.read_bytes(join(s3_prefix, "x.bin"))
    one_line_error(excinfo, join(s3_prefix, "x.bin"), "cannot reach S3 endpoint", endpoint)


class _FlakyS3(http.server.BaseHTTPRequestHandler):
    """Answers every GET with 503 SlowDown ``failures`` times, then with the object ``b"ok"``."""

    failures = 0
    requests: list[str] = []

    def do_GET(self):
        type(self).requests.append(self.path)
        if len(self.requests) <= self.failures:
            body = b"<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>"
            self.send_response(503)
        else:
            body = b"ok"
            self.send_response(200)
            self.send_header("ETag", '"etag"')
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky_endpoint(fresh_clients, monkeypatch):
    """A loopback HTTP endpoint that throttles; yields its handler class to set ``failures``."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKFLAKY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "flaky-secret")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    _FlakyS3.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FlakyS3)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    storage.configure(endpoint_url=f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield _FlakyS3
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(60)
def test_throttling_is_retried_with_backoff(flaky_endpoint):
    flaky_endpoint.failures = 2
    assert storage.read_bytes("s3://bkt/key.bin") == b"ok"
    assert flaky_endpoint.requests == ["/bkt/key.bin"] * 3


@pytest.mark.timeout(60)
def test_retries_are_bounded(flaky_endpoint):
    flaky_endpoint.failures = 100
    with pytest.raises(StorageError) as excinfo:
        storage.read_bytes("s3://bkt/key.bin")
    one_line_error(excinfo, "s3://bkt/key.bin", "SlowDown")
    assert len(flaky_endpoint.requests) == 3  # AWS_MAX_ATTEMPTS


def test_anonymous_requests_are_refused(s3_server, s3_prefix):
    path = join(s3_prefix, "private.bin")
    storage.write_bytes(path, b"secret data")
    bucket, key = storage.split_s3(path)
    client = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        region_name="us-east-1",
        config=Config(signature_version=UNSIGNED),
    )
    for call in (
        lambda: client.get_object(Bucket=bucket, Key=key),
        lambda: client.list_objects_v2(Bucket=bucket),
    ):
        with pytest.raises(ClientError) as excinfo:
            call()
        assert excinfo.value.response["Error"]["Code"] == "AccessDenied"


def test_not_an_object_url(s3_server):
    with pytest.raises(StorageError, match="not an object url"):
        storage.read_bytes(s3_server.url(""))


# ---------------------------------------------------------------- local only


def test_local_errors_name_the_path_and_cause(tmp_path):
    missing = str(tmp_path / "missing.bin")
    with pytest.raises(StorageError) as excinfo:
        storage.read_bytes(missing)
    one_line_error(excinfo, missing, "no such file")
    (tmp_path / "afile").write_bytes(b"x")
    under_file = str(tmp_path / "afile" / "child.bin")
    with pytest.raises(StorageError) as excinfo:
        storage.write_bytes(under_file, b"y")
    one_line_error(excinfo, under_file, "parent")
    with pytest.raises(StorageError) as excinfo:
        storage.read_bytes(str(tmp_path))
    one_line_error(excinfo, str(tmp_path), "is a directory")
    with pytest.raises(StorageError, match="must be a local path"):
        storage.download_file(str(tmp_path / "afile"), "s3://b/k")


@pytest.mark.skipif(os.geteuid() == 0, reason="root bypasses file permissions")
def test_local_permission_denied(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(StorageError) as excinfo:
        storage.write_bytes(str(locked / "x.bin"), b"x")
    one_line_error(excinfo, "permission denied")


def test_local_permission_denied_is_reported(tmp_path, monkeypatch):
    """The same mapping as above, for root (which file modes do not stop): os.open refuses."""

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", refuse)
    target = str(tmp_path / "x.bin")
    with pytest.raises(StorageError) as excinfo:
        storage.write_bytes(target, b"x")
    one_line_error(excinfo, target, "permission denied")


def test_local_write_keeps_umask_mode(tmp_path):
    path = tmp_path / "mode.bin"
    storage.write_bytes(str(path), b"x")
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


# ---------------------------------------------------------------- ray workers


def test_ray_workers_reach_s3_through_storage(ray_local, s3_prefix):
    """Workers see the session's AWS_* variables and get their own client (no inherited sockets)."""
    storage.write_bytes(join(s3_prefix, "in.bin"), b"from the driver")

    @ray_local.remote
    def copy_in_worker(prefix: str) -> int:
        data = storage.read_bytes(join(prefix, "in.bin"))
        storage.write_bytes(join(prefix, "out.bin"), data.upper())
        return os.getpid()

    worker_pid = ray_local.get(copy_in_worker.remote(s3_prefix))
    assert worker_pid != os.getpid()
    assert storage.read_bytes(join(s3_prefix, "out.bin")) == b"FROM THE DRIVER"


def test_a_full_disk_is_named_and_leaves_nothing(small_filesystem):
    import torch

    path = str(small_filesystem / "run" / "model.pt")
    for write in (
        lambda out: out.write(b"x" * (3 << 20)),
        lambda out: torch.save({"w": torch.zeros(1 << 20)}, out),  # torch wraps the OSError in its own
    ):
        with pytest.raises(storage.OutOfSpace) as excinfo:
            with storage.open_write(path) as out:
                write(out)
        one_line_error(excinfo, path, f"no space left on the filesystem mounted at {small_filesystem} (")
        assert os.listdir(small_filesystem / "run") == []
    # Issue 65, item 6: bytes still buffered when the block fails on a full disk: the discard's flush
    # failed too, and left a 0-byte partial file behind (embed's HDF5 writer, 1 run in 4)
    with open(small_filesystem / "filler", "wb", buffering=0) as filler:
        with contextlib.suppress(OSError):
            while True:
                filler.write(b"f" * 4096)
    with pytest.raises(RuntimeError, match="the caller failed"):
        with storage.open_write(path) as out:
            out.write(b"x" * 1000)  # in the stream's buffer, not yet on the disk
            raise RuntimeError("the caller failed")
    assert os.listdir(small_filesystem / "run") == []


@contextmanager
def silent_endpoint(monkeypatch, read_timeout_s: float, attempts: int) -> Iterator[tuple[str, list]]:
    """An S3 endpoint that accepts connections and never sends a byte, configured for this test's
    clients: (its URL, the connections it has held so far)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKSILENT")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "silent-secret")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", str(attempts))
    monkeypatch.setattr(s3_files, "READ_TIMEOUT_S", read_timeout_s)
    monkeypatch.setattr(s3_files, "_said_waiting", set())
    monkeypatch.setattr(s3_files, "_unanswered", {})
    monkeypatch.setattr(s3_files, "_answered", set())
    held: list = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        stop = threading.Event()

        def accept() -> None:
            server.settimeout(0.1)
            while not stop.is_set():
                try:
                    held.append(server.accept()[0])  # held open, never answered
                except TimeoutError:
                    continue

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
        storage.configure(endpoint_url=endpoint)
        try:
            yield endpoint, held
        finally:
            stop.set()
            thread.join()
            for conn in held:
                conn.close()


@pytest.mark.timeout(60)
def test_an_endpoint_that_never_answers_fails_in_one_line_and_says_so_while_waiting(
    fresh_clients, monkeypatch, capsys
):
    """It accepts connections and sends nothing: each try ends after READ_TIMEOUT_S without a
    byte (here 0.5 s), the first wait is said once on stderr, the last one fails in one line."""
    with silent_endpoint(monkeypatch, 0.5, 3) as (endpoint, held):
        with pytest.raises(StorageError) as excinfo:
            storage.read_bytes("s3://bkt/key.bin")
        assert len(held) == 3  # every attempt reached it
    one_line_error(excinfo, "s3://bkt/key.bin", f"S3 endpoint {endpoint} did not answer", "3 attempts")
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("storage:")]
    assert said == [
        f"storage: S3 endpoint {endpoint} did not answer within 0.5 s; trying again (attempt 2 of 3)"
    ]


@pytest.mark.timeout(60)
def test_an_endpoint_that_never_answered_is_not_waited_for_again_and_one_that_did_is(
    fresh_clients, monkeypatch
):
    """A stage makes several requests before it can fail (an input, its error path's cleanup):
    waiting out every one of them took 81 s for ``elmo shard``. Once a request to an endpoint
    that never answered runs out of attempts, the next ones fail at once; an endpoint that has
    answered this process (a pause in a long run) is waited for in full every time."""
    with silent_endpoint(monkeypatch, 0.3, 2) as (endpoint, held):
        with pytest.raises(StorageError, match="did not answer"):
            storage.read_bytes("s3://bkt/a.bin")
        reached = len(held)
        with pytest.raises(StorageError) as excinfo:
            storage.exists("s3://bkt/b.bin")
        assert len(held) == reached  # not sent at all
        one_line_error(
            excinfo, "s3://bkt/b.bin", f"S3 endpoint {endpoint} did not answer", "not waited for again"
        )
        s3_files._note_answered()  # as an answer does: the endpoint has answered this process
        with pytest.raises(StorageError, match="did not answer"):
            storage.read_bytes("s3://bkt/c.bin")
        assert len(held) == reached + 2  # waited out in full


@pytest.mark.timeout(60)
def test_an_endpoint_that_answered_gets_the_tries_of_an_outage(fresh_clients, monkeypatch):
    """A first contact gets DEFAULT_MAX_ATTEMPTS tries (a wrong endpoint fails in seconds); once
    the endpoint has answered, OUTAGE_ATTEMPTS (4 tries gave out 30 s into a paused object store,
    failing an embed mid-run). botocore's backoff is taken out: the tries are counted, not timed."""
    import botocore.retries.standard

    monkeypatch.setattr(botocore.retries.standard.ExponentialBackoff, "delay_amount", lambda *_: 0)
    with silent_endpoint(monkeypatch, 0.1, 1) as (endpoint, held):
        monkeypatch.delenv("AWS_MAX_ATTEMPTS")
        with pytest.raises(StorageError, match=f"{s3_files.DEFAULT_MAX_ATTEMPTS} attempts"):
            storage.read_bytes("s3://bkt/a.bin")
        assert len(held) == s3_files.DEFAULT_MAX_ATTEMPTS
        s3_files._note_answered()
        with pytest.raises(StorageError, match=f"{s3_files.OUTAGE_ATTEMPTS} attempts"):
            storage.read_bytes("s3://bkt/b.bin")
        assert len(held) == s3_files.DEFAULT_MAX_ATTEMPTS + s3_files.OUTAGE_ATTEMPTS


def test_one_hashing_writer_and_reader_for_every_stage(tmp_path):
    """What a stage writes is hashed as it goes (``HashingWriter``), what it reads back likewise
    (``HashingReader``, keeping the last bytes: a tar's end marker): sha256 and size of the bytes."""
    data = payload(3 * 1024 * 1024 + 17)
    path = str(tmp_path / "f.bin")
    with storage.open_write(path) as out:
        sink = storage.HashingWriter(out)
        for start in range(0, len(data), 1 << 20):
            sink.write(memoryview(data)[start : start + (1 << 20)])
        assert sink.tell() == len(data)
    assert sink.hexdigest() == hashlib.sha256(data).hexdigest() == storage.sha256(path)
    with storage.open_read(path) as raw:
        reader = storage.HashingReader(raw, tail=1024)
        head = reader.read(100)
        reader.drain()
    assert head == data[:100] and reader.size == len(data) and reader.tail == data[-1024:]
    assert reader.hexdigest() == sink.hexdigest()
