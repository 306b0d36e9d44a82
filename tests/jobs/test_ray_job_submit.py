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

from pipeline.runtime import storage

pytestmark = pytest.mark.subprocess

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


def _stop_nodes(*temp_dirs: str) -> None:
    """Stop every process of the nodes under ``temp_dirs``: SIGTERM, then SIGKILL for those still
    there after 5 s (one of Ray's processes ignores SIGTERM; the tests need no graceful stop)."""

    def alive() -> list[int]:
        return [pid for temp_dir in temp_dirs for pid in _pids_with(temp_dir)]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 5
        while alive() and time.time() < deadline:
            time.sleep(0.3)
        if not alive():
            return


def _cluster_env() -> dict:
    """Token authentication on, with a token of our own in the environment: the nodes and the
    submitting client agree without any of them reading or writing ~/.ray/auth_token."""
    env = dict(
        os.environ,
        PATH=f"{BIN}:{os.environ['PATH']}",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
    )
    env.pop("RAY_ADDRESS", None)
    return env


def _start_node(env: dict, temp_dir: str, *args: str) -> None:
    """`ray start` on loopback with free ports and its own temp dir; ``args``: the rest."""
    ports = _free_ports(4)
    cmd = [str(BIN / "ray"), "start", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}"]
    cmd += [f"--node-manager-port={ports[0]}", f"--object-manager-port={ports[1]}"]
    cmd += [f"--dashboard-agent-listen-port={ports[2]}", f"--metrics-export-port={ports[3]}"]
    cmd += ["--disable-usage-stats", *args]
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=120)


def _start_head(env: dict, temp_dir: str, num_cpus: int) -> tuple[str, str]:
    """A head with the dashboard (the job API); returns (dashboard URL, GCS address)."""
    gcs, dashboard, client = _free_ports(3)
    _start_node(
        env,
        temp_dir,
        "--head",
        f"--port={gcs}",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        f"--ray-client-server-port={client}",
        f"--num-cpus={num_cpus}",
    )
    return f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{gcs}"


@pytest.fixture
def ray_head():
    temp_dir = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's unix socket paths are length-limited
    env = _cluster_env()
    try:
        address, _ = _start_head(env, temp_dir, num_cpus=2)
        yield address, env
    finally:
        _stop_nodes(temp_dir)
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


@pytest.fixture
def two_nodes(s3_server):
    """A head that runs no work (0 CPUs) and a second node with 2 CPUs, each with its own temp
    dir, both seeing the S3 server's credentials in their environment (as cluster nodes would,
    from their instance profile or secrets), none in the job's runtime_env."""
    head_dir = tempfile.mkdtemp(prefix="rh", dir="/tmp")
    node_dir = tempfile.mkdtemp(prefix="rn", dir="/tmp")
    env = _cluster_env()
    try:
        address, gcs = _start_head(env, head_dir, num_cpus=0)
        _start_node(env, node_dir, f"--address={gcs}", "--num-cpus=2")
        yield address, env
    finally:
        _stop_nodes(node_dir, head_dir)
        subprocess.run(["rm", "-rf", head_dir, node_dir], check=False)


def _ray_json(env: dict, address: str, *args: str) -> list[dict]:
    listed = subprocess.run(
        [str(BIN / "ray"), *args, "--address", address, "--format", "json", "--detail", "--limit", "10000"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    return json.loads(listed.stdout)


def test_whole_pipeline_on_a_second_node_over_s3(two_nodes, s3_prefix, short_pipeline):
    """Every stage submitted with `ray job submit --working-dir .`, every path s3://: the workers
    all run on the second node, which has nothing of the driver's but the working dir Ray ships."""
    address, env = two_nodes
    root = s3_prefix.rstrip("/")
    corpus = f"{root}/corpus/slice.txt"
    storage.write_bytes(corpus, short_pipeline.corpus_slice(SAMPLE).encode())
    submit = [str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", str(REPO)]
    submit += [
        "--runtime-env-json",
        json.dumps({"excludes": [".git", ".venv", ".whl", "runs", "tests/data"]}),
    ]
    submit += ["--", "python", "-m", "jobs.pipeline", "--preset", "tiny", f"storage={root}", "name=two-node"]
    submit += [f"corpus=[{corpus}]", *short_pipeline.overrides, "train.wandb.mode=disabled"]
    result = subprocess.run(submit, env=env, capture_output=True, text=True, timeout=900)
    log = result.stdout + result.stderr
    assert result.returncode == 0 and "succeeded" in log.lower(), log[-4000:]
    assert "held-out perplexity" in log
    run = f"{root}/two-node"
    assert json.loads(storage.read_bytes(f"{run}/shards/manifest.json"))["totals"]["train"]["tokens"] > 0
    assert storage.exists(f"{run}/train/export/weights.hdf5")
    assert json.loads(storage.read_bytes(f"{run}/embeddings/manifest.json"))["shards"]
    # where the work ran: whatever needed a CPU (every shard task, training worker and embedding
    # actor) on the second node; the head has none to give
    nodes = {n["node_id"]: n for n in _ray_json(env, address, "list", "nodes")}
    (head,) = [i for i, n in nodes.items() if n["is_head_node"]]
    actors = _ray_json(env, address, "list", "actors")
    assert "RayTrainWorker" in {a.get("class_name") for a in actors}
    work = [*actors, *_ray_json(env, address, "list", "tasks")]
    cpu = [w for w in work if (w.get("required_resources") or {}).get("CPU", 0) > 0]
    assert cpu and all(w.get("node_id") != head for w in cpu), [
        w.get("name") for w in cpu if w.get("node_id") == head
    ]
