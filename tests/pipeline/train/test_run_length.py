"""A run planned to its budget (pipeline/train/run_length.py): the steps a time budget fits, the
token budget's steps, the schedule that decays over the planned steps, and a resume that keeps the
plan."""

from __future__ import annotations

import math

import pytest
import torch
from shard_builder import sample_shard_dir

from pipeline.config import ConfigError, load_config
from pipeline.train.config import Schedule, TrainConfig, budget_seconds
from pipeline.train.launch import prepare_run
from pipeline.train.metrics import read_metrics
from pipeline.train.optimization import lr_factor
from pipeline.train.progress import ProgressLines
from pipeline.train.run_dir import RunDir
from pipeline.train.run_length import END_SLACK_S, RunLength
from pipeline.train.trainer import Trainer

CPU = torch.device("cpu")


def test_durations_in_every_spelling():
    assert budget_seconds("") == 0.0
    assert budget_seconds("90") == 90.0 and budget_seconds("90s") == 90.0
    assert budget_seconds("45m") == 2700.0 and budget_seconds("2h") == 7200.0
    assert budget_seconds("1h30m") == 5400.0 and budget_seconds("1.5m") == 90.0
    for bad in ("0", "-5", "2 hours", "h", "1m2h", "nan", "inf"):
        assert budget_seconds(bad) is None, bad


def test_a_time_budget_plans_the_steps_that_end_the_run_on_time():
    length = RunLength(ceiling=10_000, deadline=1000.0, log_every=50)
    length.note_end_cost(10.0)
    assert length.schedule_steps is None  # the rate holds its peak until the first plan
    assert length.due(16) and length.due(32) and length.due(50) and not length.due(17)
    assert not length.due(8)  # before the first check: a CUDA graph's eager steps are no pace
    assert length.replan(16, CPU, now=0.0) == 10_000 and not length.planned  # the pace's origin
    # 1 s a step from step 16 to 32: 1000 - 16 s - the end's 10 s - the slack leave this many steps
    expected = 32 + math.floor(1000 - 16 - 10 - END_SLACK_S)
    assert length.replan(32, CPU, now=16.0) == expected and length.planned
    assert length.schedule_steps == expected
    # a reading that moves the plan by less than 1% keeps it (the schedule does not jitter)
    assert length.replan(50, CPU, now=34.1) == expected
    # a slower pace takes steps away; a deadline passed ends the run at this step
    assert length.replan(64, CPU, now=90.0) < expected
    assert length.replan(100, CPU, now=1001.0) == 100


def test_the_ceiling_bounds_a_generous_budget():
    length = RunLength(ceiling=40, deadline=10_000.0, log_every=10)
    length.replan(16, CPU, now=0.0)
    assert length.replan(20, CPU, now=0.1) == 40 and length.planned


def test_a_resumed_run_keeps_its_plan_and_its_clock():
    first = RunLength(ceiling=10_000, deadline=100.0, log_every=10)
    first.replan(16, CPU, now=0.0)
    planned = first.replan(20, CPU, now=2.0)
    first.add_training(12.5)
    resumed = RunLength(ceiling=10_000, deadline=5_000.0, log_every=10)  # a new invocation, more time
    resumed.load_state_dict(first.state_dict())
    assert resumed.last_step == planned and resumed.schedule_steps == planned
    assert resumed.train_s == 12.5 and not resumed.due(20)  # no new plan: the same schedule
    unplanned = RunLength(ceiling=300)
    unplanned.load_state_dict(RunLength(ceiling=300).state_dict())
    assert unplanned.last_step == 300 and unplanned.schedule_steps == 300


def test_before_its_plan_the_schedule_holds_the_peak_after_warm_up():
    assert lr_factor(3, None, Schedule.cosine, 10, 0.1) == pytest.approx(0.4)
    assert lr_factor(50, None, Schedule.cosine, 10, 0.1) == 1.0
    assert lr_factor(99, 100, Schedule.cosine, 10, 0.1) == pytest.approx(0.1, abs=1e-3)


def _config(tmp_path, *overrides: str) -> TrainConfig:
    shards = sample_shard_dir(str(tmp_path / "shards"), 600, heldout=100)
    keys = [f"shards={shards}", f"output={tmp_path / 'run'}", "workers=1", "guard.enabled=false"]
    keys += ["wandb.mode=disabled", "eval_max_batches=2", "checkpoint_every=1000", "log_every=5"]
    return load_config(TrainConfig, preset="tiny", overrides=[*keys, *overrides])


def test_a_token_budget_is_whole_steps_of_its_tokens(tmp_path):
    cfg = _config(tmp_path, "max_tokens=6500")  # tiny: 32 rows x 20 = 640 tokens a step
    assert prepare_run(cfg).ceiling_steps == 11
    with pytest.raises(ConfigError, match="max_tokens"):
        _config(tmp_path, "max_tokens=6500", "max_steps=5")
    with pytest.raises(ConfigError, match="time_budget"):
        _config(tmp_path, "time_budget=soon")


def test_a_run_with_a_time_budget_ends_on_time_with_its_schedule_finished(tmp_path):
    """On a clock of its own (0.1 s a step, whatever the machine's load), a 10 s budget whose end
    costs 1 s: the run plans the steps that end it by the deadline, the end's cost and the slack
    kept, and ends there with its schedule finished, evaluated and exported."""
    budget, pace, end_s = 10.0, 0.1, 1.0
    cfg = _config(
        tmp_path,
        f"time_budget={budget:g}s",
        "optimizer.schedule=cosine",
        "optimizer.warmup_steps=4",
        "optimizer.final_lr_fraction=0.1",
        "log_every=2",
    )
    plan = prepare_run(cfg)
    trainer = Trainer(cfg, plan, CPU)
    start = plan.deadline - budget
    trainer.length.clock = lambda: start + pace * trainer.step
    trainer.length.note_end_cost(end_s)  # priced (an evaluation at the first plan) when not known
    status = trainer.run()
    rows = read_metrics(RunDir(plan.run_dir).metrics)
    plans = [r for r in rows if r["kind"] == "plan"]
    assert plans and plans[0]["plan/first"] == 1 and status["status"] == "done"
    assert status["step"] == plans[-1]["plan/total_steps"] < plan.ceiling_steps  # the budget, not the epochs
    assert status["step"] == 16 + math.floor((budget - 16 * pace - end_s - END_SLACK_S) / pace)
    trains = [r for r in rows if r["kind"] == "train"]
    peak = cfg.optimizer.lr
    # the last step's rate is the schedule's end: the decay ran over the planned steps
    assert trains[-1]["step"] == status["step"]
    assert trains[-1]["train/lr"] == pytest.approx(0.1 * peak, rel=0.05)
    assert (tmp_path / "run" / "export" / "weights.hdf5").exists()
    assert [r for r in rows if r["kind"] == "eval"][-1]["train_s"] > 0  # the training clock
    # Issue 65, item 9: run again with another budget, it keeps its plan, and its progress says so (it
    # printed the ceiling, 12170 steps in the issue, with an ETA to it)
    again = _config(
        tmp_path,
        "time_budget=1h",
        "optimizer.schedule=cosine",
        "optimizer.warmup_steps=4",
        "optimizer.final_lr_fraction=0.1",
        "log_every=2",
    )
    assert Trainer(again, prepare_run(again), CPU).run()["step"] == status["step"]
    (kept,) = [r for r in read_metrics(RunDir(plan.run_dir).metrics) if r.get("plan/resumed")]
    lines = ProgressLines(last_step=plan.ceiling_steps)
    assert lines.lines(kept) == [
        f"plan  step {status['step']}: resumed with the first invocation's plan, which is kept: the run ends "
        f"at step {status['step']}; this invocation's time_budget is not used"
    ]
    assert lines.last_step == status["step"]


def test_a_run_with_a_token_budget_ends_there_with_its_schedule_finished(tmp_path):
    cfg = _config(
        tmp_path,
        "max_tokens=12000",  # 640 tokens a step: 19 steps
        "optimizer.schedule=linear",
        "optimizer.warmup_steps=2",
        "optimizer.final_lr_fraction=0.2",
        "log_every=1",
    )
    plan = prepare_run(cfg)
    status = Trainer(cfg, plan, CPU).run()
    trains = [r for r in read_metrics(RunDir(plan.run_dir).metrics) if r["kind"] == "train"]
    assert status["status"] == "done" and status["step"] == plan.ceiling_steps == 19
    assert trains[-1]["tokens"] == 19 * 640 >= 12000 > 18 * 640
    # the linear decay's last step: 0.2 + 0.8 x (1 - 16/17) of the peak
    assert trains[-1]["train/lr"] == pytest.approx(cfg.optimizer.lr * (0.2 + 0.8 / 17), rel=1e-6)
