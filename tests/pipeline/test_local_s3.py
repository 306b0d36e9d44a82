"""pipeline.local_s3: command line, ports, lifecycle of a real ``weed mini`` process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from pipeline import local_s3
from pipeline.local_s3 import ADMIN_GRPC_OFFSET, LocalS3Error, LocalS3Server


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_choose_ports_are_distinct_and_free():
    ports = local_s3.choose_ports()
    assert set(ports) == set(local_s3.PORT_FLAGS) | {"admin.port", "admin.port.grpc"}
    assert len(set(ports.values())) == len(ports)
    assert ports["admin.port.grpc"] == ports["admin.port"] + ADMIN_GRPC_OFFSET
    assert all(not _port_open(p) for p in ports.values())
    assert local_s3.choose_ports(s3_port=45678)["s3.port"] == 45678


def test_mini_command_binds_loopback_without_telemetry():
    ports = {"s3.port": 1111, "master.port": 2222}
    command = local_s3.mini_command("/bin/weed", "/d", "/d/s3.json", ports)
    assert command[:2] == ["/bin/weed", "mini"]
    for flag in (
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        "-s3.config=/d/s3.json",
        "-s3.port=1111",
        "-master.port=2222",
        "-webdav=false",
        "-dir=/d",
    ):
        assert flag in command


def test_identity_has_no_anonymous_access():
    config = local_s3.identity_config("AK", "SK")
    (identity,) = config["identities"]
    assert identity["credentials"] == [{"accessKey": "AK", "secretKey": "SK"}]
    assert "anonymous" not in json.dumps(config)


def test_server_lifecycle(tmp_path):
    with LocalS3Server(tmp_path / "srv") as server:
        port, pid = server.ports["s3.port"], server.pid
        server.create_bucket("lifecycle")
        server.create_bucket("lifecycle")  # idempotent for its owner
        names = [b["Name"] for b in server.client().list_buckets()["Buckets"]]
        assert "lifecycle" in names
        assert oct(os.stat(tmp_path / "srv" / "s3.json").st_mode & 0o777) == "0o600"
    assert not _port_open(port) and server.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(LocalS3Error, match="not started"):
        _ = server.endpoint_url


def test_start_failure_reports_the_log(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        server = LocalS3Server(tmp_path / "srv", port=busy.getsockname()[1], startup_timeout=30)
        with pytest.raises(LocalS3Error) as excinfo:
            server.start()
    message = str(excinfo.value)
    assert "weed-mini.log" in message and "ends:" in message


def test_main_prints_exports_and_stops_on_sigint(tmp_path):
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline.local_s3",
            "--data-dir",
            str(tmp_path / "srv"),
            "--bucket",
            "cli-bkt",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [process.stdout.readline() for _ in range(6)]
        exports = dict(
            line.removeprefix("export ").strip().split("=", 1) for line in lines if "export " in line
        )
        assert set(exports) == {
            "AWS_ENDPOINT_URL",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION",
        }
        assert "local test server only" in "".join(lines)
        port = int(exports["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
        assert _port_open(port)
    finally:
        process.send_signal(2)  # SIGINT, as Ctrl-C
        assert process.wait(timeout=30) == 0
    assert not _port_open(port)
