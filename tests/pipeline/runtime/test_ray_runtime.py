"""pipeline.runtime.ray_runtime: an embedded cluster keeps the temporary files of its processes in its own
temp dir, which goes with the cluster, even when the driver is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from pipeline.runtime.cluster_watchdog import stop_marked

pytestmark = pytest.mark.subprocess

DRIVER = """
import json, multiprocessing.util, os, sys, tempfile, time
import ray
from pipeline.runtime.cluster_watchdog import MARKER_VAR
from pipeline.runtime.ray_runtime import ray_session

before = tempfile.gettempdir()
with ray_session(num_cpus=1):
    @ray.remote
    def make_temporaries():
        return [tempfile.mkdtemp(prefix="worker-"), multiprocessing.util.get_temp_dir()]

    made = ray.get(make_temporaries.remote()) + [tempfile.mkdtemp(prefix="driver-")]
    marker = ray.get(ray.remote(lambda: os.environ[MARKER_VAR]).remote())
    temp_dir = ray._private.worker._global_node.get_temp_dir_path()
    print(json.dumps({"made": made, "temp_dir": temp_dir, "marker": marker}), flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)
print(json.dumps({"restored": tempfile.gettempdir() == before and "TMPDIR" not in os.environ}), flush=True)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ending", ["clean exit", "SIGKILL"])
def test_an_embedded_cluster_keeps_its_temporary_files_in_its_own_folder(ending):
    mine = tempfile.gettempdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TMPDIR")}
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "exit" if ending == "clean exit" else "wait"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    first = proc.stdout.readline()
    if not first.strip():
        proc.kill()
        raise AssertionError(f"driver did not start: {proc.communicate()[1][-2000:]}")
    started = json.loads(first)
    try:
        temp_dir = started["temp_dir"]
        assert all(path.startswith(temp_dir + os.sep) for path in started["made"]), started
        if ending == "SIGKILL":
            proc.send_signal(signal.SIGKILL)
        else:
            assert json.loads(proc.stdout.readline()) == {"restored": True}
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while os.path.exists(temp_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(os.path.exists(path) for path in [temp_dir, *started["made"]])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop_marked(started["marker"], grace=1.0)
    assert tempfile.gettempdir() == mine  # this process untouched


SESSION = """
import ray
from pipeline.errors import PipelineError
from pipeline.runtime.ray_runtime import RaySession

try:
    RaySession.joined().start()
except PipelineError as err:
    print("refused:", err)
with RaySession(num_cpus=1) as session:
    print("before start:", ray.is_initialized())
    session.start()
    session.start()  # a second stage of the same command joins the one session
    print("started:", ray.is_initialized(), ray.cluster_resources().get("CPU"))
print("after:", ray.is_initialized())
"""


@pytest.mark.timeout(180)
def test_one_session_per_command_started_when_a_stage_needs_it_and_closed_with_the_command():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TMPDIR")}
    done = subprocess.run(
        [sys.executable, "-c", SESSION], capture_output=True, text=True, env=env, timeout=170
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("refused: no Ray session: call ray.init() first")
    assert lines[1:] == ["before start: False", "started: True 1.0", "after: False"]


FAILED_START = """
import resource, sys
from pipeline.runtime.ray_runtime import RaySession, RayStartError

if sys.argv[1] != "unlimited":
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    with RaySession("localhost:notaport") as session:
        session.start()
except RayStartError as err:
    print(err)
"""


@pytest.mark.parametrize("limit", ["unlimited", str(1 << 30)])
def test_a_ray_start_that_fails_is_one_line_naming_a_file_size_limit(limit):
    """Issue 65, item 17: under ``ulimit -f`` Ray's start failed with its 50-line traceback. (An
    embedded cluster's start under a limit takes half a minute to fail, so the line is made from an
    address Ray refuses at once: the same ``ray.init`` call; in a process of its own, as this
    session's Ray runs.)"""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TMPDIR")}
    done = subprocess.run(
        [sys.executable, "-c", FAILED_START, limit], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    (line,) = done.stdout.splitlines()
    assert line.startswith(
        "could not join the Ray cluster at localhost:notaport: Unable to parse port number from notaport"
    )
    hint = "; the file size limit (ulimit -f) is 1,073,741,824 bytes, which Ray's logs and spilled objects"
    assert (hint in line) == (limit != "unlimited"), line
