"""One wandb run per training run: a stable id, every offline attempt synced into it, s3 uploads."""

from __future__ import annotations

import glob
import os
import threading
import time

import pytest
from omegaconf import OmegaConf

from pipeline.runtime import storage
from pipeline.runtime.background import WriteQueue
from pipeline.tracking.config import WandbConfig
from pipeline.tracking.offline_files import new_wandb_id, sync_command
from pipeline.train.run_dir import RunDir
from pipeline.train.wandb_run import WandbRun, best_summary


@pytest.fixture(autouse=True)
def own_wandb_service(monkeypatch):
    """wandb.init leaves its service's address in os.environ; a Ray cluster started later in this
    process would hand it to its workers, so it goes after each test."""
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    yield
    os.environ.pop("WANDB_SERVICE", None)


def settings(mode: str):
    return OmegaConf.to_object(OmegaConf.structured(WandbConfig(mode=mode)))


def test_online_needs_credentials(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ValueError, match="set WANDB_API_KEY or run `wandb login`"):
        WandbRun(settings("online"), str(tmp_path / "run"), "run", {}, new_wandb_id(), WriteQueue("t"))


def _attempt(run_dir: str, wandb_id: str, steps: range) -> None:
    writes = WriteQueue("test-records")
    run = WandbRun(settings("offline"), run_dir, "run", {"lr": 0.1}, wandb_id, writes)
    for step in steps:
        run.log({"kind": "train", "step": step, "train/loss": 1.0 / step}, step)
    run.finish()
    writes.close()


def test_every_attempt_logs_under_the_run_id(tmp_path):
    """A restarted run writes a second offline directory with the same id, even within the same
    second (wandb names its directory to the second); the sync command's glob names both, in
    order, so `wandb sync --id` uploads them into one run."""
    run_dir, wandb_id = str(tmp_path / "run"), new_wandb_id()
    _attempt(run_dir, wandb_id, range(1, 4))
    _attempt(run_dir, wandb_id, range(4, 7))
    pattern = sync_command(RunDir(run_dir).wandb, wandb_id, "elmo").rsplit(" ", 1)[1]
    found = sorted(glob.glob(pattern))  # as the shell expands it
    assert len(found) == 2 and all(d.endswith(f"-{wandb_id}") for d in found)
    assert [d.split("/wandb/")[1].split("/")[0] for d in found] == ["attempt-001", "attempt-002"]
    assert all(glob.glob(os.path.join(d, f"run-{wandb_id}.wandb")) for d in found)


def test_s3_run_directory_gets_the_files_on_each_upload(s3_prefix):
    run_dir, wandb_id = storage.join(s3_prefix, "run"), new_wandb_id()
    writes = WriteQueue("test-records")
    run = WandbRun(settings("offline"), run_dir, "run", {}, wandb_id, writes)
    run.log({"train/loss": 1.0}, 1)
    # what each checkpoint does, in the background: the history so far is on s3 before the run ends
    run.upload()
    writes.wait()
    uploaded = storage.list_prefix(storage.join(run_dir, "wandb") + "/")
    assert any(path.endswith(f"run-{wandb_id}.wandb") for path in uploaded), uploaded
    assert all("/wandb/attempt-001/wandb/offline-run-" in path for path in uploaded), uploaded
    run.log({"train/loss": 0.5}, 2)
    run.finish()
    writes.close()
    final = storage.list_prefix(storage.join(run_dir, "wandb") + "/")
    assert set(uploaded) <= set(final)


def test_an_upload_runs_beside_the_loop_and_its_error_comes_at_the_next(s3_prefix, monkeypatch):
    import pipeline.tracking.offline_files as offline_files

    run_dir = storage.join(s3_prefix, "run")
    writes = WriteQueue("test-records")
    run = WandbRun(settings("offline"), run_dir, "run", {}, new_wandb_id(), writes)
    run.log({"train/loss": 1.0}, 1)
    gate, upload_file = threading.Event(), storage.upload_file

    def slow_storage(local, remote):
        assert gate.wait(timeout=30)
        upload_file(local, remote)

    monkeypatch.setattr(offline_files.storage, "upload_file", slow_storage)
    run.upload()
    assert not writes.idle  # the loop goes on while the storage takes its time
    gate.set()
    writes.wait()
    assert storage.list_prefix(storage.join(run_dir, "wandb") + "/")

    def broken(local, remote):
        raise storage.StorageError(f"{remote}: connection reset")

    monkeypatch.setattr(offline_files.storage, "upload_file", broken)
    with open(os.path.join(run.run.dir, "notes.txt"), "w") as f:  # a file the next copy must take
        f.write("step 2")
    run.upload()
    with pytest.raises(storage.StorageError, match="connection reset"):
        for _ in range(500):  # the failed copy's error, where the loop asks for the next
            run.upload()
            time.sleep(0.01)
    monkeypatch.setattr(offline_files.storage, "upload_file", upload_file)
    run.finish()  # the files that failed to copy get there at the end
    writes.close()
    uploaded = storage.list_prefix(storage.join(run_dir, "wandb") + "/")
    assert any(path.endswith("/files/notes.txt") for path in uploaded), uploaded


def test_the_summary_keeps_the_best_evaluation_and_its_ratios_to_the_baselines():
    row = {
        "step": 300,
        "tokens": 300 * 4096,
        "eval/perplexity": 60.0,
        "eval/unigram_perplexity": 400.0,
        "eval/kneser_ney_3gram_perplexity": 120.0,
        "eval/kneser_ney_5gram_perplexity": 100.0,
    }
    assert best_summary(row) == {
        "best/perplexity": 60.0,
        "best/step": 300,
        "best/tokens": 300 * 4096,
        "best/perplexity_to_unigram": 0.15,
        "best/perplexity_to_kneser_ney_3gram": 0.5,
        "best/perplexity_to_kneser_ney_5gram": 0.6,  # the paper's biLM: 0.59 of a 5-gram's
    }
