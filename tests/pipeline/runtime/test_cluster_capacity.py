"""Asking an autoscaling Ray cluster for a stage's resources (pipeline/runtime/cluster_capacity.py), on a real
autoscaler: Ray's fake multi-node provider, which starts each new node as local processes.

The cluster is this test's own (its own port, temp dir and a marker in every process's
environment); it is stopped by that marker, so no other Ray on the machine is touched. Drivers run
in subprocesses: the test process may already be attached to the session's cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pipeline.runtime.cluster_capacity import Need, shortfall
from pipeline.runtime.cluster_watchdog import MARKER_VAR, new_marker, stop_marked

pytestmark = [pytest.mark.timeout(300), pytest.mark.subprocess]
REPO = Path(__file__).resolve().parents[3]

_EMPTY_LISTS = (
    "initialization_commands setup_commands head_setup_commands worker_setup_commands "
    "head_start_ray_commands worker_start_ray_commands cluster_synced_files rsync_exclude rsync_filter"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def autoscaling_cluster():
    """The address of a head with 1 CPU whose autoscaler adds up to two 2-CPU nodes."""
    port = _free_port()
    config = {
        "cluster_name": "elmo-capacity-test",
        "max_workers": 2,
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "gcs_address": f"127.0.0.1:{port}",
        },
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0},
            "ray.worker.cpu": {
                "resources": {"CPU": 2},
                "node_config": {},
                "min_workers": 0,
                "max_workers": 2,
            },
        },
        "head_node_type": "ray.head.default",
        "auth": {},
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 5,
        "docker": {},
        "file_mounts": {},
        "file_mounts_sync_continuously": False,
        **{name: [] for name in _EMPTY_LISTS.split()},
    }
    temp_dir = tempfile.mkdtemp(prefix="elmo-autoscale-", dir="/tmp")  # short: Ray's socket paths
    config_path = os.path.join(temp_dir, "autoscaling.json")
    Path(config_path).write_text(json.dumps(config))
    marker = new_marker()
    env = {
        **os.environ,
        MARKER_VAR: marker,
        "RAY_FAKE_CLUSTER": "1",
        "AUTOSCALER_UPDATE_INTERVAL_S": "1",
        "RAY_AUTH_MODE": "disabled",
    }
    env.pop("RAY_ADDRESS", None)
    ray = Path(sys.executable).parent / "ray"
    try:
        subprocess.run(
            [ray, "start", "--head", f"--autoscaling-config={config_path}", "--num-cpus=1", f"--port={port}"]
            + [f"--temp-dir={temp_dir}", "--node-ip-address=127.0.0.1", "--include-dashboard=false"]
            + ["--disable-usage-stats"],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        yield f"127.0.0.1:{port}"
    finally:
        stop_marked(marker)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _secure(address: str, need: Need, timeout_s: float, probe_s: float) -> subprocess.CompletedProcess:
    """`secure(need)` in a driver of its own attached to ``address``; prints the resources it got."""
    code = (
        "import json, ray\n"
        f"ray.init(address={address!r}, logging_level='ERROR')\n"
        "from pipeline.runtime.cluster_capacity import Need, secure\n"
        f"need = Need({need.bundles!r}, {need.what!r}, {need.hint!r})\n"
        f"got = secure(need, embedded=False, timeout_s={timeout_s}, probe_s={probe_s})\n"
        "print('RESOURCES', json.dumps(got), flush=True)\n"
    )
    # RAY_SCHEDULER_EVENTS=0: the autoscaler's event lines would otherwise join the driver's output
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO), "RAY_SCHEDULER_EVENTS": "0"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)


def test_a_stage_waits_for_the_autoscaler_to_add_its_workers(autoscaling_cluster):
    need = Need(({"CPU": 2.0},) * 2, "workers=2 x threads_per_worker=2", "lower workers")
    ran = _secure(autoscaling_cluster, need, timeout_s=180, probe_s=60)
    assert ran.returncode == 0, ran.stderr[-3000:]
    (line,) = [line for line in ran.stdout.splitlines() if line.startswith("RESOURCES ")]
    have = json.loads(line.removeprefix("RESOURCES "))
    assert not shortfall(need.total(), have) and have["CPU"] >= 5  # the head's 1 + two 2-CPU nodes
    assert (
        "waiting up to 180 s for the Ray autoscaler to add 3 more CPUs for workers=2 x threads_per_worker=2"
        in ran.stderr
    )
    assert "the Ray cluster has the resources after" in ran.stderr


def test_a_need_no_node_type_can_hold_is_refused_after_the_probe(autoscaling_cluster):
    need = Need(
        ({"CPU": 4.0},) * 3, "workers=3 x threads_per_worker=4", "lower workers or threads_per_worker"
    )
    ran = _secure(autoscaling_cluster, need, timeout_s=180, probe_s=8)
    assert ran.returncode != 0
    last = ran.stderr.strip().splitlines()[-1]
    assert "CapacityError: workers=3 x threads_per_worker=4 need 12 CPUs but the Ray cluster has" in last
    assert "no node was on its way 8 s after asking the Ray autoscaler" in last
