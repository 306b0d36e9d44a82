"""`ray job submit` against a real local head: the shard stage as a cluster job.

The head is started with `ray start --head` on free loopback ports and its own temp dir; at the
end exactly the processes of that head (found by the temp dir in their command line) are
stopped, never `ray stop`, which would kill every Ray on the machine.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SAMPLE = REPO / "pipeline" / "data" / "kjv-sample.txt.gz"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _pids_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry.name))
    return pids


def _stop_head(temp_dir: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _pids_with(temp_dir):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 15
        while _pids_with(temp_dir) and time.time() < deadline:
            time.sleep(0.3)
        if not _pids_with(temp_dir):
            return


@pytest.fixture
def ray_head():
    temp_dir = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's unix socket paths are length-limited
    gcs, dashboard, client, node_manager, object_manager, agent, metrics = _free_ports(7)
    # Token authentication on, with a token of our own in the environment: the head and the
    # submitting client agree without either reading or writing ~/.ray/auth_token.
    env = dict(
        os.environ,
        PATH=f"{BIN}:{os.environ['PATH']}",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
    )
    env.pop("RAY_ADDRESS", None)
    cmd = [
        str(BIN / "ray"),
        "start",
        "--head",
        f"--port={gcs}",
        "--node-ip-address=127.0.0.1",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        f"--ray-client-server-port={client}",
        f"--node-manager-port={node_manager}",
        f"--object-manager-port={object_manager}",
        f"--dashboard-agent-listen-port={agent}",
        f"--metrics-export-port={metrics}",
        "--num-cpus=2",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    try:
        subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=120)
        yield f"http://127.0.0.1:{dashboard}", env
    finally:
        _stop_head(temp_dir)
        subprocess.run(["rm", "-rf", temp_dir], check=False)


def test_shard_job_submitted_to_a_running_head(ray_head, tmp_path):
    address, env = ray_head
    out = tmp_path / "shards"
    submit = [
        str(BIN / "ray"),
        "job",
        "submit",
        "--address",
        address,
        "--working-dir",
        str(REPO),
        "--runtime-env-json",
        # the job's own env_vars must apply unchanged: the stage adds no runtime_env of its own that
        # Ray would have to merge with it (and would refuse to, on a duplicate key)
        json.dumps(
            {
                "excludes": [".git", ".venv", "runs", "tests/data"],
                "env_vars": {"AWS_DEFAULT_REGION": "eu-west-1"},
            }
        ),
        "--",
        "python",
        "-m",
        "jobs.shard",
        "--input",
        str(SAMPLE),
        "--output",
        str(out),
        "--workers",
        "2",
        "heldout_fraction=0.05",
    ]
    result = subprocess.run(submit, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "succeeded" in (result.stdout + result.stderr).lower()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["totals"]["train"]["tokens"] > 0
    for shard in manifest["shards"]["train"] + manifest["shards"]["heldout"]:
        assert (out / shard["name"]).is_file()
    assert (out / "vocab.txt").read_text().split("\n")[:3] == ["<S>", "</S>", "<UNK>"]
