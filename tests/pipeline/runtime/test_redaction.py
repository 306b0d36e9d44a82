"""pipeline.runtime.redaction: credentials written into a URL are shown and stored nowhere: not in errors,
not in the config a run records (metrics.jsonl, checkpoints, wandb files, manifests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.runtime import storage
from pipeline.runtime.redaction import redact, redact_values

SECRET = "topsecret-9c1b"
ENDPOINT_WITH_SECRET = f"http://AKIAUSER:{SECRET}@127.0.0.1:{{port}}"


@pytest.mark.parametrize(
    "text, shown",
    [
        ("http://user:pw@host:8333/x", "http://***@host:8333/x"),
        (
            "cannot reach S3 endpoint https://k:s%40t@s3.example.com (X)",
            "cannot reach S3 endpoint https://***@s3.example.com (X)",
        ),
        ("s3://bucket/key and http://host/a@b", "s3://bucket/key and http://host/a@b"),
        ("http://token@host", "http://***@host"),
    ],
)
def test_redact_replaces_the_userinfo_of_every_url(text, shown):
    assert redact(text) == shown
    assert redact_values({"a": [text, 3], "b": (text,)}) == {"a": [shown, 3], "b": (shown,)}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def secret_endpoint():
    endpoint = ENDPOINT_WITH_SECRET.format(port=_closed_port())
    yield endpoint
    storage.configure()


@pytest.mark.timeout(60)
def test_a_storage_error_names_the_endpoint_without_its_credentials(secret_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "made-up")
    storage.configure(endpoint_url=secret_endpoint)
    with pytest.raises(storage.StorageError) as err:
        storage.read_bytes("s3://bucket/x.bin")
    assert "cannot reach S3 endpoint http://***@127.0.0.1:" in str(err.value) and SECRET not in str(err.value)


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_the_console_of_a_failing_command_shows_no_credentials(secret_endpoint, tmp_path):
    elmo = str(Path(sys.executable).parent / "elmo")
    env = {
        **os.environ,
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_ACCESS_KEY_ID": "made-up",
        "AWS_SECRET_ACCESS_KEY": "made-up",
    }
    result = subprocess.run(
        [elmo, "export", "s3://bucket/run", str(tmp_path / "out"), "--endpoint", secret_endpoint],
        capture_output=True, text=True, timeout=100, env=env,
    )  # fmt: skip
    assert result.returncode == 2 and "http://***@127.0.0.1" in result.stderr, result.stderr
    assert SECRET not in result.stdout + result.stderr
