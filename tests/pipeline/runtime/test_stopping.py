"""The stop contract (docs/reliability.md#stopping): a signal to a stage's driver or to its whole
process group (what Slurm, systemd, a container's init, coreutils ``timeout`` and a terminal's
Ctrl-C send), at start-up or mid-run, ends the run within 30 s with ``terminated`` and 143 (SIGTERM)
or ``interrupted`` and 130 (SIGINT); nothing of the embedded cluster is left running, and no Ray
fatal line or traceback is printed. Training stops after a step, that step's checkpoint written,
and says so; embedding stops with its committed shards whole."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.embed import manifest as embed_manifest
from pipeline.runtime.cluster_watchdog import MARKER_VAR
from pipeline.train import checkpoint as ckpt
from pipeline.train.metrics import read_metrics
from pipeline.train.run_dir import METRICS_FILE

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))  # the train tests' shard builder
from shard_builder import sample_sentences, sample_shard_dir  # noqa: E402

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(300)]
REFERENCE = Path(__file__).parents[3] / "tests" / "data" / "reference" / "allennlp"

GRACE_S = 30.0
"""Kubernetes' default grace period: every stop must be over by then."""


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return sample_shard_dir(str(tmp_path_factory.mktemp("shards")), 3000)


def _start(shards: str, run_dir: str, checkpoint_every: int = 1000) -> subprocess.Popen:
    """``elmo train``, a run far longer than the test (`_run`)."""
    command = ["-m", "jobs.train", "--shards", shards, "--output", run_dir, "--preset", "tiny"]
    settings = [
        "workers=2",
        "max_steps=100000",
        "log_every=5",
        f"checkpoint_every={checkpoint_every}",
        "wandb.mode=disabled",
    ]
    return _run([*command, *settings])


def _run(args: list[str]) -> subprocess.Popen:
    """``python ARGS`` (``-m MODULE ...``, ``-c CODE``) on an embedded cluster (no RAY_ADDRESS), leading a process group of its
    own as a job under a scheduler does."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.Popen(
        [sys.executable, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _cluster_pids(driver: int) -> list[int]:
    """The processes of the embedded cluster a driver started (their environment carries its
    marker, which begins with the driver's pid)."""
    needle = f"{MARKER_VAR}={driver}-".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if any(item.startswith(needle) for item in f.read().split(b"\0")):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def _wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 180.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not condition():
        time.sleep(0.1)
    assert proc.poll() is None and condition(), f"no {what} before the deadline"


def _stop(proc: subprocess.Popen, sig: int, group: bool) -> tuple[float, str]:
    """Send ``sig`` to the driver or its group; seconds until it exited, and its stderr."""
    sent = time.time()
    (os.killpg if group else os.kill)(proc.pid, sig)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return time.time() - sent, err


def _nothing_left(driver: int) -> list[int]:
    """The cluster's processes still there a little after the driver exited (the watchdog and
    ``ray.shutdown`` take a moment)."""
    deadline = time.time() + 15
    while (left := _cluster_pids(driver)) and time.time() < deadline:
        time.sleep(0.5)
    return left


def _trained_steps(run_dir: str) -> bool:
    path = os.path.join(run_dir, METRICS_FILE)
    return os.path.exists(path) and any(r["kind"] == "train" for r in read_metrics(path))


def _stopped_cleanly(
    proc: subprocess.Popen, run_dir: str, took: float, err: str, status: int, word: str
) -> int:
    """The stop's one last line names the step it stopped at and that step's checkpoint, the
    latest; it came within the grace period, quietly, and left no process. Returns the step."""
    assert proc.returncode == status, err[-3000:]
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(
        rf"{word}: stopped at step (\d+); checkpoint (\S+); rerun the same command to continue", last
    )
    assert match, err[-3000:]
    step, path = int(match.group(1)), match.group(2)
    assert path == ckpt.latest_checkpoint(run_dir) and ckpt.load_model(path)["step"] == step
    assert took < GRACE_S, f"{took:.1f} s"
    assert "Traceback" not in err and "Failed to connect to GCS" not in err and "core_worker" not in err
    assert _nothing_left(proc.pid) == []
    return step


def test_a_sigint_to_the_driver_mid_run_stops_after_a_step_with_its_checkpoint(shards, tmp_path):
    """No checkpoint is due (one every 1,000 steps): the stop writes its own. (SIGTERM to the
    driver: test_launch.py; to the group: the next test.)"""
    run_dir = str(tmp_path / "run")
    proc = _start(shards, run_dir)
    _wait_for(lambda: _trained_steps(run_dir), proc, "train row")
    took, err = _stop(proc, signal.SIGINT, group=False)
    _stopped_cleanly(proc, run_dir, took, err, 130, "interrupted")


def test_a_sigterm_to_the_group_among_saves_leaves_every_checkpoint_whole(shards, tmp_path):
    """A checkpoint every step, and SIGTERM to the whole process group (as a scheduler stops a
    job): the signal lands during a save or between two, and the stop's checkpoint, like every
    other kept, loads whole."""
    run_dir = str(tmp_path / "run")
    proc = _start(shards, run_dir, checkpoint_every=1)
    _wait_for(lambda: len(ckpt.list_checkpoints(run_dir)) >= 2, proc, "second checkpoint")
    took, err = _stop(proc, signal.SIGTERM, group=True)
    step = _stopped_cleanly(proc, run_dir, took, err, 143, "terminated")
    kept = ckpt.list_checkpoints(run_dir)
    assert [ckpt.load_model(path)["step"] for _, path in kept] == [s for s, _ in kept]
    assert kept[-1][0] == step


WAITING_DRIVER = """
import sys, time, ray
from jobs.stage_args import run_main
from pipeline.runtime.ray_runtime import ray_session

@ray.remote
def slow():
    time.sleep(600)

def body():
    with ray_session(num_cpus=1):
        ref = slow.remote()
        print("waiting", file=sys.stderr, flush=True)
        ray.get(ref)

sys.exit(run_main(body))
"""


def test_a_sigterm_while_the_driver_waits_on_ray_is_a_termination(tmp_path):
    """Ray's ``ray.get`` turns what the SIGTERM handler raises into a KeyboardInterrupt of its own:
    the shard stage stopped while writing its ARPA file said ``interrupted`` and exited 130."""
    proc = _run(["-c", WAITING_DRIVER])
    lines: list[str] = []
    waiting = lambda: "waiting" in lines or bool(lines.append(proc.stderr.readline().strip()))  # noqa: E731
    _wait_for(waiting, proc, "waiting line")
    time.sleep(0.5)  # into ray.get (nothing says when the driver enters it; either way it must hold)
    took, err = _stop(proc, signal.SIGTERM, group=True)
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "terminated", err[-3000:]
    assert took < GRACE_S and "Traceback" not in err
    assert _nothing_left(proc.pid) == []


@pytest.mark.parametrize(
    ("sig", "status", "word"), [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")]
)
def test_a_signal_to_the_group_while_ray_starts_stops_everything_it_started(
    shards, tmp_path, sig, status, word
):
    """Nothing left running, and (issue 65, item 15) nothing of the run's left in its folder: its
    ``run.json`` and ``lease.json`` are taken back, as the run wrote nothing else."""
    run_dir = str(tmp_path / "run")
    proc = _start(shards, run_dir)
    _wait_for(lambda: _cluster_pids(proc.pid), proc, "Ray process")  # Ray is starting its processes
    took, err = _stop(proc, sig, group=True)
    assert proc.returncode == status and err.strip().splitlines()[-1] == word, err[-3000:]
    assert took < GRACE_S and "Traceback" not in err
    assert _nothing_left(proc.pid) == []
    assert not os.path.exists(run_dir) or os.listdir(run_dir) == []


@pytest.mark.parametrize(("sig", "status", "word"), [(signal.SIGTERM, 143, "terminated")])
def test_a_signal_to_an_embeds_group_after_a_commit_stops_it_cleanly(tmp_path, sig, status, word):
    """Before, Ray Data's executor threads outlived ``ray.shutdown()`` and called ray.init() again:
    `RuntimeError: Ray is not initialized` tracebacks, a 60-line core_worker crash report, or a
    process still running 150 s after `terminated`."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(" ".join(s) + "\n" for s in sample_sentences(20000)))
    out = tmp_path / "out"
    model = [f"options_file={REFERENCE / 'options.json'}", f"weights_file={REFERENCE / 'lm_weights.hdf5'}"]
    settings = ["lines_per_shard=200", "workers=1", "progress=false", "wandb.mode=disabled"]
    proc = _run(["-m", "jobs.embed", "--input", str(corpus), "--output", str(out), *model, *settings])
    progress = out / "_progress"
    committed = lambda: progress.is_dir() and len(list(progress.glob("*.json"))) >= 2  # noqa: E731 (run.json and a shard)
    _wait_for(committed, proc, "committed shard")
    took, err = _stop(proc, sig, group=True)
    assert proc.returncode == status and err.strip().splitlines()[-1] == word, err[-3000:]
    assert took < GRACE_S, f"{took:.1f} s"
    assert "Traceback" not in err and "core_worker" not in err and "not initialized" not in err, err[-3000:]
    assert _nothing_left(proc.pid) == []
    assert not (out / embed_manifest.MANIFEST_FILE).exists()  # unfinished: a rerun completes it


def test_an_embed_failing_in_a_worker_after_commits_ends_in_its_one_line_error(tmp_path):
    """Issue 65, item 5: an embed that failed mid-run (a writer killed, a full disk) died about one
    run in four in Ray's core worker, its one-line error lost. Here a line that is not UTF-8 fails its
    shard's preparing task while the actor commits others: the driver says the error in one line,
    exits 2, and stops everything it started (28 such runs by hand, a writer killed and a full disk
    among them, ended this way at this commit)."""
    lines = [(" ".join(s) + "\n").encode() for s in sample_sentences(3000)]
    lines[2500] = b"In the \xff beginning\n"
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"".join(lines))
    model = [f"options_file={REFERENCE / 'options.json'}", f"weights_file={REFERENCE / 'lm_weights.hdf5'}"]
    settings = [
        "lines_per_shard=200",
        "workers=1",
        "progress=false",
        "wandb.mode=disabled",
        "invalid_utf8=error",
    ]
    proc = _run(
        ["-m", "jobs.embed", "--input", str(corpus), "--output", str(tmp_path / "out"), *model, *settings]
    )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"error: {corpus}: line 2500 is not valid UTF-8 (byte 7); fix the input or set invalid_utf8=replace"
    ), err[-3000:]
    assert "Traceback" not in err and "core_worker" not in err and "core worker" not in err, err[-3000:]
    assert _nothing_left(proc.pid) == []
    assert list(
        (tmp_path / "out").glob("embeddings-*.hdf5")
    )  # shards before it were committed (a rerun keeps them)


def test_a_sigkilled_embed_driver_mid_commit_leaves_nothing_and_its_rerun_writes_each_shard_once(tmp_path):
    """SIGKILL to the driver while its actor's writer processes commit shards: the watchdog stops
    the cluster and the writers with it (each discarding the file it was writing: no partial file
    is left), and a rerun of the same command finishes the output with the very shards an
    uninterrupted run writes."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(" ".join(s) + "\n" for s in sample_sentences(4000)))
    model = [f"options_file={REFERENCE / 'options.json'}", f"weights_file={REFERENCE / 'lm_weights.hdf5'}"]
    settings = ["lines_per_shard=100", "workers=1", "progress=false", "wandb.mode=disabled"]

    def command(out):
        return ["-m", "jobs.embed", "--input", str(corpus), "--output", str(out), *model, *settings]

    out = tmp_path / "out"
    proc = _run(command(out))
    entries = lambda: len(list((out / "_progress").glob("embeddings-*.json")))  # noqa: E731
    _wait_for(lambda: (out / "_progress").is_dir() and entries() >= 1, proc, "committed shard")
    deadline = time.time() + 10  # best effort: the kill lands while a writer is writing a shard
    while not list(out.glob(".embeddings-*")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert _nothing_left(proc.pid) == []  # the writers too: they carry the cluster's marker
    assert not list(out.rglob("*.elmo-partial")) and not (out / embed_manifest.MANIFEST_FILE).exists()
    assert entries() < 40

    # the rerun and an uninterrupted run side by side: two embedded clusters on one machine
    runs = [_run(command(out)), _run(command(tmp_path / "clean"))]
    try:
        for run in runs:
            _, err = run.communicate(timeout=240)
            assert run.returncode == 0, err[-3000:]
    finally:
        for run in runs:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.communicate()

    def shards(folder):
        doc = json.loads((folder / embed_manifest.MANIFEST_FILE).read_text())
        return doc["totals"], [
            (s["index"], s["first_line"], s["end_line"], s["sha256"]) for s in doc["shards"]
        ]

    assert shards(out) == shards(tmp_path / "clean")
    assert shards(out)[0]["sentences"] == 4000 and len(shards(out)[1]) == 40


def _loaded(pid: int, library: str) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return library in f.read()
    except OSError:
        return False


SIGHUP_AT_DEFAULT = (
    "import runpy, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
    "sys.argv[0] = sys.argv.pop(1); runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)
"""``python -c SIGHUP_AT_DEFAULT MODULE ARGS``: ``python -m MODULE ARGS`` with SIGHUP at its default."""


@pytest.mark.parametrize(
    "signum, group",
    [(signal.SIGTERM, True), (signal.SIGTERM, False), (signal.SIGHUP, True)],
    ids=["sigterm-to-the-group", "sigterm-to-the-driver", "sighup-to-the-group"],
)
def test_a_sigterm_or_hang_up_stops_the_probe_with_its_word_and_status(tmp_path, signum, group):
    """Issue 65, items 10 and 14: ``elmo probe`` runs no Ray, and a SIGTERM killed it silently; a
    closed terminal's SIGHUP killed any stage at once. Both stop it as SIGTERM does."""
    model = ["--options", str(REFERENCE / "options.json"), "--weights", str(REFERENCE / "lm_weights.hdf5")]
    # SIGHUP at its default action, as a terminal's job has it, whatever this runner's (under nohup
    # the probe inherits it ignored, and keeps it so: a hang-up is not for a nohup'd job)
    start = ["-c", SIGHUP_AT_DEFAULT] if signum == signal.SIGHUP else ["-m"]
    proc = _run([*start, "jobs.probe", *model, "--output", str(tmp_path / "probe")])  # a model it can read
    _wait_for(lambda: _loaded(proc.pid, "libtorch"), proc, "torch loaded (the probe at work)", timeout=120)
    took, err = _stop(proc, signum, group=group)
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "terminated", err[-3000:]
    assert took < GRACE_S and "Traceback" not in err
