"""A one-shot stage's wandb run, offline, read back from its files (the real library)."""

from __future__ import annotations

import glob
import io
import json
import os

import pytest
from offline_runs import log_stage_run

from pipeline.runtime import storage
from pipeline.tracking import offline_reader
from pipeline.tracking.config import WandbConfig, WandbMode
from pipeline.tracking.stage_run import StageLog


def _png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


LOG = StageLog(
    "probe",
    {"seed": 3, "model": "runs/demo/train/export"},
    {"pos/best_layer": 1, "pos/best_accuracy": 0.755},
    tables={"probe/table": (["probe", "layer 0"], [["part of speech", 0.739]])},
    images={"probe/plot": _png()},
)


def test_an_offline_stage_run_joins_its_group_with_its_summary_table_and_picture(tmp_path):
    output = str(tmp_path / "probe")
    sync = log_stage_run(WandbConfig(group="demo"), output, LOG)
    files = offline_reader.run_files(os.path.join(output, "wandb"))
    assert len(files) == 1 and files[0].is_relative_to(tmp_path / "probe" / "wandb" / "attempt-001")
    recs = offline_reader.records(files[0])
    run = offline_reader.run_record(recs)
    assert (run["run_group"], run["job_type"], run["display_name"]) == ("demo", "probe", "demo-probe")
    assert offline_reader.config(recs) == LOG.config
    got = offline_reader.summary(recs)
    assert {k: got.get(k) for k in LOG.summary} == LOG.summary
    (row,) = [r for r in offline_reader.history(recs) if "probe/table" in r]
    media = files[0].parent / "files"
    table = json.loads((media / row["probe/table"]["path"]).read_text())
    assert table["columns"] == ["probe", "layer 0"] and table["data"] == [["part of speech", 0.739]]
    assert (media / row["probe/plot"]["path"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the printed command names exactly this run's files, as the shell expands it
    assert sync.startswith(f"wandb sync --id {run['run_id']} -p elmo-pipeline ")
    assert [os.path.dirname(f) for f in glob.glob(sync.rsplit(" ", 1)[1] + "/run-*.wandb")] == [
        str(files[0].parent)
    ]


def test_a_second_run_into_the_output_is_an_attempt_of_its_own(tmp_path):
    output = str(tmp_path / "shards")
    first = log_stage_run(WandbConfig(), output, LOG)
    second = log_stage_run(WandbConfig(), output, LOG)
    assert first != second
    assert sorted(os.listdir(tmp_path / "shards" / "wandb")) == ["attempt-001", "attempt-002"]


def test_a_run_after_wandbs_media_folder_went_logs_its_table(tmp_path):
    """wandb makes its media folder once, at import: inside an embedded Ray session that folder goes
    with the session, and the pipeline's probe runs after it."""
    import shutil

    from wandb.sdk.data_types import _private

    log_stage_run(WandbConfig(), str(tmp_path / "first"), LOG)  # wandb imported, its folder made
    shutil.rmtree(_private.MEDIA_TMP.name)
    assert log_stage_run(WandbConfig(), str(tmp_path / "probe"), LOG)
    (path,) = offline_reader.run_files(tmp_path / "probe" / "wandb")
    (row,) = [r for r in offline_reader.history(offline_reader.records(path)) if "probe/table" in r]
    assert (path.parent / "files" / row["probe/table"]["path"]).is_file()


def test_disabled_logs_nothing(tmp_path):
    assert log_stage_run(WandbConfig(mode=WandbMode.disabled), str(tmp_path / "out"), LOG) is None
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("s3_server")
def test_an_s3_output_gets_the_run_files(s3_prefix):
    output = storage.join(s3_prefix, "embeddings")
    sync = log_stage_run(WandbConfig(), output, LOG)
    uploaded = storage.list_prefix(storage.join(output, "wandb") + "/")
    assert any(p.endswith(".wandb") for p in uploaded), uploaded
    assert all("/wandb/attempt-001/wandb/offline-run-" in p for p in uploaded), uploaded
    assert sync.startswith(f"aws s3 cp --recursive {output}/wandb ")


def test_wandbs_service_log_stays_with_the_run(tmp_path, monkeypatch):
    """wandb-core's debug log goes into the attempt's folder, not into the user's cache, where
    nothing would ever remove it; a cache folder the user chose is kept."""
    monkeypatch.delenv("WANDB_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    log_stage_run(WandbConfig(), str(tmp_path / "out"), LOG)
    attempt = tmp_path / "out" / "wandb" / "attempt-001"
    assert list(attempt.glob("service/**/core-debug-*.log"))
    assert not list(tmp_path.glob("home*/**/core-debug-*.log")) and "WANDB_CACHE_DIR" not in os.environ
    (link,) = attempt.glob("wandb/offline-run-*/logs/debug-core.log")
    assert link.resolve().is_relative_to(attempt)
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "chosen"))
    log_stage_run(WandbConfig(), str(tmp_path / "out"), LOG)
    assert list((tmp_path / "chosen").glob("**/core-debug-*.log"))
