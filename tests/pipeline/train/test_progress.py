"""Console progress: each train/eval row rank 0 hands to the driver becomes one line, once."""

from __future__ import annotations

import asyncio

import ray
from polling import wait_until

from pipeline.train.progress import ProgressLines, ProgressRelay, RelayFollower, RelaySender, relay_actor


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
    lines = ProgressLines(last_step=400)
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
    with_kn = {**EVAL, "eval/kneser_ney_5gram_perplexity": 170.04, "eval/kneser_ney_3gram_perplexity": 180.26}
    assert lines.lines(with_kn) == [
        "eval  step 20/400: held-out perplexity 120.5 (fwd 119.0, bwd 122.0; unigram 346.1, "
        "Kneser-Ney 3-gram 180.3, Kneser-Ney 5-gram 170.0)"
    ]


def _plan(deadline_in_s: float, first: int = 1) -> dict:
    return {
        "kind": "plan",
        "step": 16,
        "plan/total_steps": 187,
        "plan/first": first,
        "plan/end_s": 4.0,
        "plan/deadline_in_s": deadline_in_s,
    }


def test_a_time_budgets_first_plan_is_one_line_and_a_spent_budget_says_by_how_much():
    """Issue 65, item 8: ``time_budget=1s`` said a 24 s run of 18 steps "fits the time budget"."""
    lines = ProgressLines(last_step=12170)
    (line,) = lines.lines(_plan(38.0))
    assert line.startswith("plan  step 16: the time budget fits 187 steps (ends in 0m38s, 4 s of it kept")
    assert lines.last_step == 187 and lines.lines(_plan(30.0, first=0)) == []
    (spent,) = ProgressLines(last_step=12170).lines({**_plan(-20.0), "plan/total_steps": 16})
    assert spent == (
        "plan  step 16: the time budget is spent: its deadline is 20 s past and the final evaluation and "
        "export need 4 s, so the run overruns it by about 24 s; it ends at step 16 (a larger time_budget "
        "trains for longer)"
    )
    (tight,) = ProgressLines(last_step=100).lines({**_plan(2.5), "plan/total_steps": 16})
    assert "its deadline is in 2 s" in tight and "overruns it by about 2 s" in tight


def test_waiting_for_checkpoint_saves_is_said_once_past_five_percent():
    lines = ProgressLines(last_step=400)
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
        first = RelaySender(relay)
        first.put({"kind": "config", "step": 0})
        first.put(train_row(5, 1.0))  # before from_step: an earlier run's, not printed again
        first.put(train_row(10, 2.0))
        again = RelaySender(relay)  # a worker restarted from step 5 logs step 10 again
        again.put(train_row(10, 2.0))
        wait_until(lambda: printed, "the first row printed while the run goes on")
        again.finish(EVAL)  # as rank 0 ends its run: every row there before this returns
    ray.kill(relay)
    assert [line.split(" (")[0] for line in printed] == [
        "train step 10/40",
        "eval  step 20/40: held-out perplexity 120.5",
    ]


def test_a_burst_of_unawaited_rows_is_printed_whole_and_in_order(ray_local):
    # Ray does not keep the order of calls into an async actor: unnumbered, 200 rows like these came
    # out of order in most trials, and the last ones could still be missing when the final call returned
    relay = relay_actor()
    printed: list[str] = []
    with RelayFollower(relay, 400, out=printed.append, poll_s=0.01):
        sender = RelaySender(relay)
        for step in range(1, 201):
            sender.put(train_row(step, float(step)))
        sender.finish({**EVAL, "step": 201})
    ray.kill(relay)
    steps = [int(line.split()[2].split("/")[0]) for line in printed]
    assert steps == list(range(1, 202))


def _run(coroutine):
    return asyncio.new_event_loop().run_until_complete(coroutine)


def test_the_relay_hands_rows_on_in_their_senders_order():
    async def scenario() -> list[list[int]]:
        relay = ProgressRelay()
        seen = []
        stream = await relay.open()
        for seq in (2, 0, 3):
            await relay.put(stream, seq, {"step": seq})
            seen.append([row["step"] for row in relay.rows])
        await relay.put(stream, 1, {"step": 1})
        seen.append([row["step"] for row in relay.rows])
        await relay.put(stream, 5, {"step": 5})  # its sender dies before row 4 arrives
        newer = await relay.open()  # what the old stream left is handed on, in order
        await relay.put(stream, 4, {"step": 4})  # the dead sender's late call: dropped
        await relay.put(newer, 0, {"step": 10})
        seen.append([row["step"] for row in relay.rows])
        return seen

    assert _run(scenario()) == [[], [0], [0], [0, 1, 2, 3], [0, 1, 2, 3, 5, 10]]


def test_a_take_answers_at_once_with_what_is_there(ray_local):
    relay = relay_actor()
    RelaySender(relay).finish({"kind": "status", "step": 3})
    assert ray.get(relay.take.remote(0, 0.0), timeout=60) == [{"kind": "status", "step": 3}]
    assert ray.get(relay.take.remote(1, 0.0), timeout=60) == []
    ray.kill(relay)


def test_the_follower_ends_quietly_when_nothing_came_or_the_relay_is_gone(ray_local):
    relay = relay_actor()
    printed: list[str] = []
    with RelayFollower(relay, 10, out=printed.append, poll_s=0.05):
        pass  # its exit takes what came: nothing
    with RelayFollower(relay, 10, out=printed.append, poll_s=0.05) as follower:
        ray.kill(relay)
        wait_until(lambda: not follower._thread.is_alive(), "the follower stopping by itself")
    assert printed == []


def test_an_evaluation_says_how_much_it_scored_and_how_long_it_took():
    row = {**EVAL, "eval/batches": 7, "eval/seconds": 12.34}
    assert ProgressLines(last_step=400).lines(row) == [
        "eval  step 20/400: held-out perplexity 120.5 (fwd 119.0, bwd 122.0; unigram 346.1) [7 batches, 12.3 s]"
    ]


def test_a_probe_row_is_one_line_with_its_sample_and_seconds():
    row = {
        "kind": "probe", "step": 75, "probe/pos_layer0": 0.812, "probe/pos_layer1": 0.9034, "probe/pos_layer2": 0.88,
        "probe/pos_mix": 0.91, "probe/wsd_layer0": 0.41, "probe/wsd_layer1": 0.45, "probe/wsd_layer2": 0.47,
        "probe/pos_baseline": 0.85, "probe/wsd_baseline": 0.5, "probe/pos_test_tokens": 6123, "probe/wsd_examples": 1980,
        "probe/seconds": 7.25,
    }  # fmt: skip
    assert ProgressLines(last_step=150).lines(row) == [
        "probe step 75/150: part of speech by layer 81.2 / 90.3 / 88.0% (baseline 85.0%), word sense "
        "41.0 / 45.0 / 47.0% (baseline 50.0%) [6,123 test tokens, 1,980 examples, 7.2 s]"
    ]
