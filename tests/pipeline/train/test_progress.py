"""Console progress: each train/eval row of metrics.jsonl becomes one line, once."""

from __future__ import annotations

from pipeline import storage
from pipeline.train.metrics import MetricsLog
from pipeline.train.progress import MetricsFollower, ProgressLines


def train_row(step: int, time: float) -> dict:
    return {
        "kind": "train",
        "step": step,
        "epoch": step / 100,
        "train/sampled_perplexity_fwd": 812.25,
        "train/sampled_perplexity_bwd": float("inf"),
        "train/tokens_per_s": 12345.6,
        "train/mfu": 0.1234,
        "time": time,
    }


EVAL = {
    "kind": "eval",
    "step": 20,
    "eval/perplexity": 120.5,
    "eval/perplexity_fwd": 119.0,
    "eval/perplexity_bwd": 122.04,
    "eval/unigram_perplexity": 346.09,
}


def test_lines_say_step_rates_and_eta():
    lines = ProgressLines(total_steps=400)
    assert lines.lines(train_row(10, 5.0)) == [
        "train step 10/400 (epoch 0.10) | sampled perplexity fwd 812.2 bwd inf | 12,346 tok/s | MFU 12.34%"
    ]
    # 10 steps took 20 s: 380 more take 760 s
    (line,) = lines.lines(train_row(20, 25.0))
    assert line.endswith("| MFU 12.34% | ETA 12m40s")
    assert lines.lines(EVAL) == [
        "eval  step 20/400: held-out perplexity 120.5 (fwd 119.0, bwd 122.0; unigram 346.1)"
    ]
    assert lines.lines({"kind": "status", "step": 20}) == []


def test_waiting_for_checkpoint_saves_is_said_once_past_five_percent():
    lines = ProgressLines(total_steps=400)
    assert len(lines.lines({**train_row(10, 10.0), "checkpoint/wait_s": 0.49})) == 1  # 4.9% of 10 s
    # 20 s between the rows, 1.2 s of them waiting: 6%
    train, warning = lines.lines({**train_row(20, 30.0), "checkpoint/wait_s": 1.2})
    assert train.startswith("train step 20/400")
    assert warning.startswith(
        "warning: training waited 1.2 s of the last 20.0 s (6%, up to step 20) for checkpoint saves"
    )
    assert "raise checkpoint_every" in warning
    assert len(lines.lines({**train_row(30, 40.0), "checkpoint/wait_s": 5.0})) == 1  # said once


def test_follower_prints_each_new_row_once(tmp_path):
    run = str(tmp_path / "run")
    log = MetricsLog(run, None)
    log.append({"kind": "config", "step": 0})
    log.append(train_row(5, 1.0))  # before from_step: an earlier run's, not printed again
    printed: list[str] = []
    follower = MetricsFollower(run, 40, from_step=5, out=printed.append, poll_seconds=0.05)
    with follower:
        log.append(train_row(10, 2.0))
        log.flush()
        follower.print_new()
        follower.print_new()
        log.append(EVAL)
        log.close()
    assert [line.split(" (")[0] for line in printed] == [
        "train step 10/40",
        "eval  step 20/40: held-out perplexity 120.5",
    ]


def test_follower_waits_for_a_file_not_written_yet(tmp_path):
    printed: list[str] = []
    with MetricsFollower(str(tmp_path / "not-yet"), 10, out=printed.append, poll_seconds=0.05):
        pass
    assert printed == []


def test_follower_fetches_only_what_was_added_and_rereads_a_changed_file(tmp_path, monkeypatch):
    import pipeline.train.progress as progress

    run = str(tmp_path / "run")
    log = MetricsLog(run, None)
    fetched: list[int] = []
    read_from = progress.storage.read_from

    def counted(path, offset):
        data = read_from(path, offset)
        fetched.append(len(data or b""))
        return data

    monkeypatch.setattr(progress.storage, "read_from", counted)
    printed: list[str] = []
    follower = MetricsFollower(run, 400, out=printed.append)
    for step in range(10, 210, 10):
        log.append(train_row(step, step / 10))
        log.flush()
        follower.print_new()
    data = storage.read_bytes(log.path)
    size, longest = len(data), max(len(line) for line in data.splitlines(keepends=True))
    # each poll fetched the new row and the one before it (to see the file still starts the same)
    assert max(fetched) <= 2 * longest and sum(fetched) < 2 * size
    assert [line.split(" (")[0] for line in printed] == [f"train step {s}/400" for s in range(10, 210, 10)]
    # a rerun replaces a row: the file changes before the last row read, and is read whole once
    log.append({**train_row(100, 10.0), "train/mfu": 0.5})
    log.append(EVAL)
    log.close()
    fetched.clear()
    follower.print_new()
    assert sum(fetched) > size  # read again from the start
    assert printed[-1].startswith("eval  step 20/400") and len(printed) == 21  # nothing twice


def test_an_evaluation_says_how_much_it_scored_and_how_long_it_took():
    row = {**EVAL, "eval/batches": 7, "eval/seconds": 12.34}
    assert ProgressLines(total_steps=400).lines(row) == [
        "eval  step 20/400: held-out perplexity 120.5 (fwd 119.0, bwd 122.0; unigram 346.1) [7 batches, 12.3 s]"
    ]
