"""Console progress: each train/eval row rank 0 hands to the driver becomes one line, once."""

from __future__ import annotations

import time

import ray

from pipeline.train.progress import ProgressLines, RelayFollower, relay_actor


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


def test_rows_handed_to_the_relay_are_printed_once_in_order(ray_local):
    relay = relay_actor()
    printed: list[str] = []
    with RelayFollower(relay, 40, from_step=5, out=printed.append, poll_s=0.05):
        relay.put.remote({"kind": "config", "step": 0})
        relay.put.remote(train_row(5, 1.0))  # before from_step: an earlier run's, not printed again
        relay.put.remote(train_row(10, 2.0))
        relay.put.remote(train_row(10, 2.0))  # a worker restarted from step 5 logs step 10 again
        time.sleep(0.3)
        ray.get(relay.put.remote(EVAL))  # as rank 0 awaits its last row: there when the run ends
    ray.kill(relay)
    assert [line.split(" (")[0] for line in printed] == [
        "train step 10/40",
        "eval  step 20/40: held-out perplexity 120.5",
    ]


def test_a_take_answers_at_once_with_what_is_there(ray_local):
    relay = relay_actor()
    ray.get(relay.put.remote({"kind": "status", "step": 3}))
    assert ray.get(relay.take.remote(0, 0.0), timeout=60) == [{"kind": "status", "step": 3}]
    assert ray.get(relay.take.remote(1, 0.0), timeout=60) == []
    ray.kill(relay)


def test_the_follower_ends_quietly_when_nothing_came_or_the_relay_is_gone(ray_local):
    relay = relay_actor()
    printed: list[str] = []
    with RelayFollower(relay, 10, out=printed.append, poll_s=0.05):
        time.sleep(0.2)
    with RelayFollower(relay, 10, out=printed.append, poll_s=0.05):
        ray.kill(relay)
        time.sleep(0.2)
    assert printed == []


def test_an_evaluation_says_how_much_it_scored_and_how_long_it_took():
    row = {**EVAL, "eval/batches": 7, "eval/seconds": 12.34}
    assert ProgressLines(total_steps=400).lines(row) == [
        "eval  step 20/400: held-out perplexity 120.5 (fwd 119.0, bwd 122.0; unigram 346.1) [7 batches, 12.3 s]"
    ]
