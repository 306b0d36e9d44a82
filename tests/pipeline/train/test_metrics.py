import threading
import time

import pytest
import torch

from pipeline import storage
from pipeline.train.metrics import (
    MetricsLog,
    measure_matmul_peak,
    perplexity_series,
    plot_perplexity,
    read_metrics,
)


def test_measured_peak_is_positive():
    assert measure_matmul_peak(torch.device("cpu"), size=128, seconds=0.05) > 1e6


def test_metrics_log_rewrites_and_truncates_on_resume(tmp_path):
    run = str(tmp_path / "run")
    log = MetricsLog(run, None)
    for step in (10, 20, 30):
        log.append({"kind": "train", "step": step})
    log.close()
    assert [r["step"] for r in read_metrics(log.path)] == [10, 20, 30]
    resumed = MetricsLog(run, 20)
    assert [r["step"] for r in resumed.rows] == [10, 20]
    fresh = MetricsLog(run, None)
    fresh.append({"kind": "config", "step": 0})
    fresh.close()
    assert read_metrics(fresh.path) == [{"kind": "config", "step": 0}]


def test_a_step_logged_again_replaces_its_row(tmp_path):
    """A run resumed from its final checkpoint evaluates and closes that step again: one row each."""
    run = str(tmp_path / "run")
    log = MetricsLog(run, None)
    for row in (
        {"kind": "train", "step": 20},
        {"kind": "eval", "step": 20, "v": 1},
        {"kind": "status", "step": 20},
    ):
        log.append(row)
    log.close()
    resumed = MetricsLog(run, 20)
    resumed.append({"kind": "event", "step": 20, "event": "resume"})
    resumed.append({"kind": "eval", "step": 20, "v": 2})
    resumed.append({"kind": "status", "step": 20})
    resumed.flush()
    assert [(r["kind"], r.get("v")) for r in resumed.rows] == [
        ("train", None),
        ("event", None),
        ("eval", 2),
        ("status", None),
    ]
    assert [(r["kind"], r.get("v")) for r in read_metrics(resumed.path)] == [
        ("train", None),
        ("event", None),
        ("eval", 2),
        ("status", None),
    ]


def test_rows_are_written_beside_the_loop_and_a_failed_write_is_raised_at_the_next_row(tmp_path, monkeypatch):
    import pipeline.train.metrics as metrics

    log = MetricsLog(str(tmp_path / "run"), None)
    gate, write_bytes, writes = threading.Event(), storage.write_bytes, []

    def slow_storage(path, data):
        assert gate.wait(timeout=30)
        writes.append(data.count(b"\n"))
        write_bytes(path, data)

    monkeypatch.setattr(metrics.storage, "write_bytes", slow_storage)
    for step in range(1, 51):  # the loop never waits for the storage
        log.append({"kind": "train", "step": step})
    gate.set()
    log.flush()
    assert [r["step"] for r in read_metrics(log.path)] == list(range(1, 51))
    assert writes[-1] == 50 and len(writes) <= 3  # the rows that came during a write share the next one

    def broken(path, data):
        raise storage.StorageError(f"{path}: connection reset")

    monkeypatch.setattr(metrics.storage, "write_bytes", broken)
    log.append({"kind": "train", "step": 51})
    with pytest.raises(storage.StorageError, match="connection reset"):
        for step in range(52, 100):  # raised where the loop adds a row next
            log.append({"kind": "train", "step": step})
            time.sleep(0.01)
    monkeypatch.setattr(metrics.storage, "write_bytes", write_bytes)
    log.close()  # the rows after the failed write reach the file with the next one
    assert [r["step"] for r in read_metrics(log.path)][-1] == log.rows[-1]["step"]


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
