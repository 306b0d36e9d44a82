import os
import threading
import time

import pytest
import torch

from pipeline.runtime import storage
from pipeline.runtime.background import WriteQueue
from pipeline.train.errors import TrainError
from pipeline.train.metrics import (
    MetricsLog,
    measure_matmul_peak,
    perplexity_series,
    plot_perplexity,
    read_metrics,
    repair_metrics,
)
from pipeline.train.run_dir import METRICS_FILE


def test_measured_peak_is_positive():
    assert measure_matmul_peak(torch.device("cpu"), size=128, seconds=0.05) > 1e6


def _log(run_dir: str, resume_step: int | None) -> tuple[MetricsLog, WriteQueue]:
    writes = WriteQueue("test-records")
    return MetricsLog(f"{run_dir}/{METRICS_FILE}", resume_step, writes), writes


def test_metrics_log_appends_and_truncates_on_resume(tmp_path):
    run = str(tmp_path / "run")
    os.makedirs(run)
    log, writes = _log(run, None)
    for step in (10, 20, 30):
        log.append({"kind": "train", "step": step})
    writes.close()
    assert [r["step"] for r in read_metrics(log.path)] == [10, 20, 30]
    resumed, writes = _log(run, 20)
    writes.wait()
    assert [r["step"] for r in resumed.rows] == [10, 20]
    assert [r["step"] for r in read_metrics(log.path)] == [10, 20]  # cut to the checkpoint's rows
    fresh, writes = _log(run, None)
    fresh.append({"kind": "config", "step": 0})
    writes.close()
    assert read_metrics(fresh.path) == [{"kind": "config", "step": 0}]


def test_a_local_file_is_appended_to_not_rewritten(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    os.makedirs(run)
    rewrites, write_bytes = [], storage.write_bytes
    monkeypatch.setattr(
        storage, "write_bytes", lambda path, data: (rewrites.append(path), write_bytes(path, data))
    )
    log, writes = _log(run, None)
    for step in range(1, 201):
        log.append({"kind": "train", "step": step})
    writes.close()
    assert rewrites == [log.path]  # once, at the start
    assert [r["step"] for r in read_metrics(log.path)] == list(range(1, 201))


def test_a_step_logged_again_replaces_its_row(tmp_path):
    """A run resumed from its final checkpoint evaluates and closes that step again: one row each."""
    run = str(tmp_path / "run")
    os.makedirs(run)
    log, writes = _log(run, None)
    for row in (
        {"kind": "train", "step": 20},
        {"kind": "eval", "step": 20, "v": 1},
        {"kind": "status", "step": 20},
    ):
        log.append(row)
    writes.close()
    resumed, writes = _log(run, 20)
    resumed.append({"kind": "event", "step": 20, "event": "resume"})
    resumed.append({"kind": "eval", "step": 20, "v": 2})
    resumed.append({"kind": "status", "step": 20})
    writes.wait()
    expected = [("train", None), ("event", None), ("eval", 2), ("status", None)]
    assert [(r["kind"], r.get("v")) for r in resumed.rows] == expected
    assert [(r["kind"], r.get("v")) for r in read_metrics(resumed.path)] == expected


def test_rows_are_written_beside_the_loop_and_a_failed_write_is_raised_at_the_next_row(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    os.makedirs(run)
    log, writes = _log(run, None)
    gate, append_local = threading.Event(), storage.append_local

    def slow_storage(path, data):
        assert gate.wait(timeout=30)
        append_local(path, data)

    writes.wait()
    monkeypatch.setattr(storage, "append_local", slow_storage)
    for step in range(1, 51):  # the loop never waits for the storage
        log.append({"kind": "train", "step": step})
    assert not writes.idle
    gate.set()
    writes.wait()
    assert [r["step"] for r in read_metrics(log.path)] == list(range(1, 51))

    def broken(path, data):
        raise storage.StorageError(f"{path}: connection reset")

    monkeypatch.setattr(storage, "append_local", broken)
    log.append({"kind": "train", "step": 51})
    with pytest.raises(storage.StorageError, match="connection reset"):
        for step in range(52, 100):  # raised where the loop adds a row next
            log.append({"kind": "train", "step": step})
            time.sleep(0.01)
    monkeypatch.setattr(storage, "append_local", append_local)
    log.append({"kind": "train", "step": 100})
    writes.close()  # the rows whose append failed reach the file with the next write, whole
    assert [r["step"] for r in read_metrics(log.path)] == [r["step"] for r in log.rows]


def test_an_s3_file_is_written_whole_at_most_once_per_queued_write(s3_prefix, monkeypatch):
    run = storage.join(s3_prefix, "run")
    log, writes = _log(run, None)
    writes.wait()
    gate, write_bytes, sizes = threading.Event(), storage.write_bytes, []

    def slow_storage(path, data):
        assert gate.wait(timeout=30)
        sizes.append(data.count(b"\n"))
        write_bytes(path, data)

    monkeypatch.setattr(storage, "write_bytes", slow_storage)
    for step in range(1, 51):
        log.append({"kind": "train", "step": step})
    gate.set()
    writes.close()
    assert [r["step"] for r in read_metrics(log.path)] == list(range(1, 51))
    assert sizes[-1] == 50 and len(sizes) <= 3  # the rows that came during a write share the next one


def test_the_plot_shows_the_models_perplexities_and_marks_the_sampled_loss(tmp_path):
    rows = [
        {
            "kind": "train",
            "step": s,
            "train/sampled_perplexity": 100 / s,
            "train/sampled_perplexity_fwd": 101 / s,
            "train/sampled_perplexity_bwd": 99 / s,
            **({"guard/perplexity_fwd": 300 / s, "guard/perplexity_bwd": 310 / s} if s > 1 else {}),
        }
        for s in (1, 2, 3)
    ]
    rows.append(
        {
            "kind": "eval",
            "step": 3,
            "eval/perplexity": 40.0,
            "eval/perplexity_fwd": 41.0,
            "eval/perplexity_bwd": 39.0,
            "eval/unigram_perplexity": 200.0,
        }
    )
    series = {label: (steps, values) for label, steps, values, _, _ in perplexity_series(rows)}
    assert series["held-out perplexity"] == ([3], [40.0])
    assert series["held-out sample, full softmax, forward LM"] == ([2, 3], [150.0, 100.0])
    assert series["exp(sampled-softmax training loss): not comparable"][0] == [1, 2, 3]
    assert not any("perplexity" in label and "sampled" in label for label in series)  # never called one
    path = str(tmp_path / "plot.png")
    plot_perplexity(rows, path)
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # probe rows (probe_every) add a panel beside the perplexities: a wider picture
    probed = str(tmp_path / "probed.png")
    layers = {f"probe/{n}_layer{k}": 0.1 * k for n in ("pos", "wsd") for k in range(3)}
    plot_perplexity([*rows, {"kind": "probe", "step": 3, **layers}], probed)
    import matplotlib.image

    assert matplotlib.image.imread(probed).shape[1] > matplotlib.image.imread(path).shape[1]


def test_a_torn_last_record_is_dropped_once_and_a_damaged_one_is_named(tmp_path):
    path = tmp_path / METRICS_FILE
    whole = '{"kind": "train", "step": 10}\n{"kind": "train", "step": 20}\n'
    path.write_text(whole + '{"kind": "train", "st')  # a kill during the third append
    assert [r["step"] for r in read_metrics(str(path))] == [10, 20]
    warning = repair_metrics(str(path))
    assert warning.startswith(f"warning: {path}: its last record was cut short") and "\n" not in warning
    assert path.read_text() == whole  # rewritten without it: the workers read a whole file
    assert repair_metrics(str(path)) is None and repair_metrics(str(tmp_path / "none.jsonl")) is None
    path.write_text('{"kind": "train", "step": 10}\nnot json\n{"kind": "train", "step": 30}\n')
    with pytest.raises(TrainError, match=r"metrics.jsonl: line 2 is not a metrics record \(a JSON object\)"):
        read_metrics(str(path))
    path.write_text("[1, 2]\n")  # JSON, but no record: a user's file, say
    with pytest.raises(TrainError, match="line 1 is not a metrics record"):
        repair_metrics(str(path))
