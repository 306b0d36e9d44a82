"""pipeline/output_folder.py: an output folder's life, one rule for every stage: what is refused
before a run writes anything (ownership, markers, links), one run at a time (the lease and its
fence), and what a failed run takes back; the stages' own tests cover each marker's content."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
from polling import wait_until

from pipeline.errors import PipelineError
from pipeline.output_folder import (
    LEASE_FILE,
    Lease,
    OwnFiles,
    check_owned,
    fence,
    missing_dirs,
    read_marker,
    remove_empty_dirs,
    taken_back_on_failure,
)
from pipeline.runtime import storage
from pipeline.train.errors import TrainError

OWN = OwnFiles("demo", "demo_run.json", re.compile(r"demo_run\.json|data/.+"))


# ---------------------------------------------------------------- ownership


def test_a_new_empty_or_own_folder_is_fine_and_anything_else_one_line(tmp_path):
    assert check_owned(str(tmp_path / "new"), OWN, PipelineError) is False
    (tmp_path / "own" / "data").mkdir(parents=True)
    (tmp_path / "own" / "demo_run.json").write_text('{"stage": "demo"}')
    (tmp_path / "own" / "data" / "x").write_text("1")
    assert check_owned(str(tmp_path / "own"), OWN, PipelineError) is True
    (tmp_path / "file").write_text("x")
    with pytest.raises(PipelineError, match=r"output .*file is a file, not a folder; choose an empty"):
        check_owned(str(tmp_path / "file"), OWN, PipelineError)


def test_a_link_to_a_folder_outside_is_refused_and_nothing_written_through_it(tmp_path):
    """``os.walk`` does not descend into a linked folder, so its files were invisible to the check
    and a run wrote through the link into the user's folder."""
    users = tmp_path / "users"
    users.mkdir()
    (users / "thesis.txt").write_text("mine")
    own = tmp_path / "own"
    (own / "data").mkdir(parents=True)
    (own / "demo_run.json").write_text('{"stage": "demo"}')
    (own / "data" / "more").symlink_to(users, target_is_directory=True)
    with pytest.raises(PipelineError, match=r"holds data/more, a link to a folder outside it"):
        check_owned(str(own), OWN, PipelineError)
    (own / "data" / "more").unlink()
    (own / "data" / "inner").mkdir()
    (own / "data" / "latest").symlink_to("inner", target_is_directory=True)  # inside: a tool's own link
    assert check_owned(str(own), OWN, PipelineError) is True


def test_appends_never_go_through_a_link(tmp_path):
    users = tmp_path / "users.txt"
    users.write_text("mine\n")
    (tmp_path / "metrics.jsonl").symlink_to(users)
    with pytest.raises(storage.StorageError, match="a link, not a file this run wrote"):
        storage.append_local(str(tmp_path / "metrics.jsonl"), b"row\n")
    assert users.read_text() == "mine\n"


@pytest.mark.parametrize("text", ["{}", '{"stage": "demo", "run": "r"}'])
def test_a_marker_is_a_json_object_of_its_stage(tmp_path, text):
    (tmp_path / "demo_run.json").write_text(text)
    assert read_marker(str(tmp_path), OWN, PipelineError) == json.loads(text)


@pytest.mark.parametrize("text", ["[]", "text", '"s"', '{"stage": "other"}'])
def test_a_marker_that_is_not_its_stages_is_one_line(tmp_path, text):
    (tmp_path / "demo_run.json").write_text(text)
    with pytest.raises(PipelineError) as err:
        read_marker(str(tmp_path), OWN, PipelineError)
    assert "is not an elmo demo marker" in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------- one run at a time


def RunLease(folder: str, **timing) -> Lease:  # noqa: N802 (as train names its lease)
    return Lease(folder, TrainError, "run directory", **timing)


def test_a_live_lease_refuses_another_run_and_is_given_back(tmp_path):
    run_dir = str(tmp_path / "run")
    first = RunLease(run_dir, beat_s=0.2)
    with first:
        lease_file = tmp_path / "run" / LEASE_FILE
        started = json.loads(lease_file.read_text())["heartbeat"]
        wait_until(lambda: json.loads(lease_file.read_text())["heartbeat"] > started, "a heartbeat")
        with pytest.raises(TrainError) as err:
            RunLease(run_dir).acquire()
        assert str(err.value).startswith(f"run directory {run_dir} is in use by another run (host ")
        assert f"pid {os.getpid()}, its heartbeat 0 s ago" in str(err.value)
        assert json.loads((tmp_path / "run" / LEASE_FILE).read_text())["owner"] == first.owner
    assert not (tmp_path / "run" / LEASE_FILE).exists()
    with RunLease(run_dir):  # free again
        pass


def test_a_crashed_runs_lease_is_taken_over_once_stale(tmp_path):
    run_dir = str(tmp_path / "run")
    stale = {"owner": "elsewhere:1:ab", "host": "elsewhere", "pid": 1, "heartbeat": time.time() - 5}
    storage.write_bytes(storage.join(run_dir, LEASE_FILE), json.dumps(stale).encode())
    with pytest.raises(TrainError, match="its heartbeat 5 s ago"):
        RunLease(run_dir, ttl_s=60).check()
    lease = RunLease(run_dir, ttl_s=3)
    with lease:
        assert json.loads(storage.read_bytes(storage.join(run_dir, LEASE_FILE)))["owner"] == lease.owner


def test_on_s3_too(s3_prefix):
    run_dir = storage.join(s3_prefix, "run")
    with RunLease(run_dir):
        with pytest.raises(TrainError, match="is in use by another run"):
            RunLease(run_dir).check()
    assert not storage.exists(storage.join(run_dir, LEASE_FILE))


def test_a_holder_that_wakes_after_a_takeover_never_writes_the_lease_back(tmp_path):
    """The heartbeat reads before it beats: once another run holds the lease (this one was stopped
    past the ttl) it stops for good, and every write of the run is refused by the fence."""
    run_dir = str(tmp_path / "run")
    first = RunLease(run_dir, beat_s=0.1)
    with first:
        first.verify()  # its own: writes go on
        fence(run_dir, first.owner, TrainError, "run directory")
        taken = {"owner": "later:7:cd", "host": "elsewhere", "pid": 7, "heartbeat": time.time()}
        storage.write_bytes(storage.join(run_dir, LEASE_FILE), json.dumps(taken).encode())
        wait_until(lambda: first.lost is not None, "the heartbeat's reading of the takeover")
        assert json.loads(storage.read_bytes(storage.join(run_dir, LEASE_FILE)))["owner"] == "later:7:cd"
        assert first.lost is not None and first.lost["owner"] == "later:7:cd"
        with pytest.raises(TrainError) as err:
            first.verify()
        assert str(err.value).startswith(
            f"run directory {run_dir} was taken over by another run (host elsewhere, pid 7)"
        )
    assert storage.exists(storage.join(run_dir, LEASE_FILE))  # the other run's lease stays


def test_a_lease_that_vanished_under_its_holder_stops_its_writes(tmp_path):
    run_dir = str(tmp_path / "run")
    with pytest.raises(TrainError, match="lost its lease"):
        fence(run_dir, "nobody:1:aa", TrainError, "run directory")


def test_a_lease_whose_process_is_gone_on_this_host_is_taken_over_at_once(tmp_path):
    run_dir = str(tmp_path / "run")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = {"owner": "here:1:aa", "host": socket.gethostname(), "pid": gone.pid, "heartbeat": time.time()}
    storage.write_bytes(storage.join(run_dir, LEASE_FILE), json.dumps(dead).encode())
    with RunLease(run_dir) as lease:  # no 90 s wait: its heartbeat is fresh but its process is gone
        assert json.loads(storage.read_bytes(storage.join(run_dir, LEASE_FILE)))["owner"] == lease.owner
    alive = {**dead, "pid": os.getppid()}  # a live process on this host keeps its lease
    storage.write_bytes(storage.join(run_dir, LEASE_FILE), json.dumps(alive).encode())
    with pytest.raises(TrainError, match="is in use by another run"):
        RunLease(run_dir).check()


# ---------------------------------------------------------------- what a failed run takes back


def test_the_missing_folders_are_named_deepest_first_and_none_on_s3(tmp_path):
    out = tmp_path / "a" / "b" / "c"
    assert missing_dirs(str(out)) == [str(out), str(tmp_path / "a" / "b"), str(tmp_path / "a")]
    assert missing_dirs(str(tmp_path)) == []
    assert missing_dirs("s3://bucket/a/b") == []


def test_a_failed_run_leaves_no_folder_of_its_own_and_touches_nothing_else(tmp_path):
    out = tmp_path / "new" / "deep" / "out"
    with pytest.raises(RuntimeError), taken_back_on_failure(str(out), OWN):
        os.makedirs(out)
        raise RuntimeError("empty corpus")
    assert sorted(os.listdir(tmp_path)) == []

    (tmp_path / "kept").mkdir()
    with pytest.raises(RuntimeError), taken_back_on_failure(str(tmp_path / "kept" / "out"), OWN):
        os.makedirs(tmp_path / "kept" / "out")
        raise RuntimeError("refused setting")
    assert os.listdir(tmp_path) == ["kept"]  # it existed before the run


def test_a_folder_the_run_wrote_into_stays_with_its_parents(tmp_path):
    out = tmp_path / "new" / "out"
    with pytest.raises(RuntimeError), taken_back_on_failure(str(out), OWN):
        os.makedirs(out)
        (out / "shard-000000.tar").write_bytes(b"resumable")
        raise RuntimeError("killed later")
    assert (out / "shard-000000.tar").read_bytes() == b"resumable"
    remove_empty_dirs([str(tmp_path / "gone"), str(out)])  # a missing one is skipped, a full one stops it
    assert out.is_dir()


def test_a_run_that_succeeds_keeps_its_folders(tmp_path):
    out = tmp_path / "new" / "out"
    with taken_back_on_failure(str(out), OWN):
        os.makedirs(out)
    assert out.is_dir()


def _stage_files():
    """Every stage's own files (each stage's OWN_FILES), with a file of its own besides the marker."""
    from pipeline.embed.resume import OWN_FILES as EMBED
    from pipeline.probe.runner import OWN_FILES as PROBE
    from pipeline.shard.manifest import OWN_FILES as SHARD
    from pipeline.train.export import OWN_FILES as EXPORT
    from pipeline.train.run_dir import OWN_FILES as TRAIN

    return [
        (SHARD, "vocab.txt"),
        (TRAIN, "metrics.jsonl"),
        (EMBED, "embeddings-000000.hdf5"),
        (EXPORT, "options.json"),
        (PROBE, "probe.json"),
    ]


@pytest.mark.parametrize(("own", "other"), _stage_files(), ids=lambda v: getattr(v, "stage", v))
def test_every_stage_takes_its_claim_back_when_it_fails_before_writing(tmp_path, own, other):
    """The one lifecycle: a run that wrote only its marker and fails leaves nothing (no marker, no
    folder it made); one that wrote a file of its own keeps both for the rerun; one that resumes an
    earlier run's claim (claimed=False) never takes that back."""
    out = tmp_path / "new" / own.stage
    with pytest.raises(RuntimeError), taken_back_on_failure(str(out), own):
        storage.write_bytes(str(out / own.marker), b'{"stage": "%s"}' % own.stage.encode())
        raise RuntimeError("failed before writing")
    assert os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError), taken_back_on_failure(str(out), own):
        storage.write_bytes(str(out / own.marker), b"{}")
        storage.write_bytes(str(out / other), b"written")
        raise RuntimeError("failed later")
    assert sorted(storage.list_names(str(out))) == sorted([own.marker, other])
    (out / other).unlink()
    with pytest.raises(RuntimeError), taken_back_on_failure(str(out), own, claimed=False):
        raise RuntimeError("a resumed run failed")
    assert storage.list_names(str(out)) == [own.marker]
