"""The divergence guard (pipeline/train/divergence.py): its verdicts, and each action on a run made
to diverge the way sampled-softmax runs do (a rarely sampled softmax row drifting up)."""

from __future__ import annotations

import math

import pytest
import torch
from shard_builder import sample_shard_dir

from pipeline.config import load_config
from pipeline.train import checkpoint as ckpt
from pipeline.train.config import GuardConfig, TrainConfig
from pipeline.train.divergence import DivergenceGuard
from pipeline.train.launch import TrainError, final_status, prepare_run
from pipeline.train.metrics import read_metrics
from pipeline.train.run_dir import METRICS_FILE
from pipeline.train.step import StepRunner
from pipeline.train.trainer import Trainer

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("single_thread")]


def test_a_direction_diverges_once_per_episode_and_recovers():
    guard = DivergenceGuard(GuardConfig(factor=3.0), [])
    assert guard.judge(10, (100.0, 90.0)).diverged == ()
    assert guard.judge(20, (80.0, 95.0)).best == (80.0, 90.0)
    reading = guard.judge(30, (230.0, 300.0))  # bwd 300 > 3 x 90; fwd 230 < 3 x 80
    assert reading.diverged == ("bwd",) and "backward LM" in reading.message(3.0)
    assert guard.judge(40, (70.0, 5000.0)).diverged == ()  # still diverging: said once
    assert guard.judge(50, (70.0, 100.0)).best == (70.0, 90.0)  # back under the bound
    assert guard.judge(60, (70.0, math.nan)).diverged == ("bwd",)  # a new episode; nan counts
    state = guard.state_dict()
    other = DivergenceGuard(GuardConfig(), [])
    other.load_state_dict(state)
    assert other.best == [70.0, 90.0] and other.lr_scale == 1.0 and other.rollbacks == 0


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return sample_shard_dir(str(tmp_path_factory.mktemp("shards")), 2000)


def _config(shards: str, run_dir: str, *overrides: str):
    return load_config(
        TrainConfig,
        preset="tiny",
        overrides=[
            f"shards={shards}",
            f"output={run_dir}",
            "workers=1",
            "max_steps=16",
            "log_every=2",
            "checkpoint_every=4",
            "keep_checkpoints=4",
            "eval_max_batches=2",
            "wandb.mode=disabled",
            # the recipe these runs were measured with: a constant rate, so a rollback's lower rate is
            # the only change of rate (tiny's own recipe warms up and decays)
            "optimizer.lr=0.004",
            "optimizer.schedule=constant",
            "optimizer.warmup_steps=0",
            "dropout=0.1",
            *overrides,
        ],
    )


@pytest.fixture
def drift_once(monkeypatch):
    """After step 9 (once per test), the last (rarest) softmax row's bias jumps by 60: the sampled
    loss almost never reads that row, the full softmax puts nearly all its mass there."""
    return _drift(monkeypatch, 60.0)


@pytest.fixture
def runaway_once(monkeypatch):
    """As ``drift_once``, by 1000: a held-out loss over 700 nats, whose exp overflows a float."""
    return _drift(monkeypatch, 1000.0)


def _drift(monkeypatch, jump: float) -> list[int]:
    done = []
    original = StepRunner.train_step

    def train_step(self, batch, schedule_steps):
        out = original(self, batch, schedule_steps)
        if self.step == 9 and not done:
            with torch.no_grad():
                self.softmax.bias[-1] += jump
            done.append(self.step)
        return out

    monkeypatch.setattr(StepRunner, "train_step", train_step)
    return done


def _run(cfg):
    return Trainer(cfg, prepare_run(cfg), torch.device("cpu")).run()


def test_rollback_reloads_the_last_good_checkpoint_and_lowers_the_rate(shards, tmp_path, drift_once):
    run_dir = str(tmp_path / "run")
    status = _run(_config(shards, run_dir))  # rollback is the default
    assert drift_once == [9]
    assert status["status"] == "done" and status["step"] == 16
    rows = read_metrics(f"{run_dir}/{METRICS_FILE}")
    [guard] = [r for r in rows if r["kind"] == "guard"]
    assert guard["step"] == 10 and guard["action"] == "rollback" and guard["to_step"] == 8
    assert (
        guard["guard/perplexity_fwd"] > 1000 and "rolled back to the checkpoint of step 8" in guard["message"]
    )
    train = {r["step"]: r for r in rows if r["kind"] == "train"}
    assert sorted(train) == [2, 4, 6, 8, 10, 12, 14, 16]  # steps 10.. logged again after the rollback
    healthy = min(train[s]["guard/perplexity_fwd"] for s in (2, 4, 6, 8))
    assert guard["guard/perplexity_fwd"] > 3 * healthy  # what the guard saw at step 10 before rolling back
    assert train[10]["guard/rollbacks"] == 1 and train[10]["guard/perplexity_fwd"] < 1.5 * healthy
    assert train[12]["train/lr"] == pytest.approx(0.5 * train[6]["train/lr"])
    # the lowered rate is part of the checkpoints saved after the rollback, so a resume keeps it
    assert ckpt.load_model(ckpt.latest_checkpoint(run_dir))["guard"]["lr_scale"] == 0.5


def test_stop_ends_the_run_with_a_clear_error(shards, tmp_path, drift_once):
    run_dir = str(tmp_path / "run")
    status = _run(_config(shards, run_dir, "guard.on_divergence=stop"))
    assert status["status"] == "diverged" and status["step"] == 10
    with pytest.raises(TrainError, match="divergence at step 10: forward LM full-softmax perplexity") as err:
        final_status(status)
    assert "\n" not in str(err.value) and "step-000000008" in str(err.value)


def test_warn_says_so_once_and_trains_on(shards, tmp_path, drift_once):
    run_dir = str(tmp_path / "run")
    status = _run(_config(shards, run_dir, "guard.on_divergence=warn"))
    assert status["status"] == "done"
    rows = read_metrics(f"{run_dir}/{METRICS_FILE}")
    guard = [r for r in rows if r["kind"] == "guard"]
    assert [(r["step"], r["action"]) for r in guard] == [(10, "warn")]
    later = [r["guard/perplexity_fwd"] for r in rows if r["kind"] == "train" and r["step"] > 10]
    assert later and min(later) > 3 * min(r["guard/perplexity_fwd"] for r in rows if r["kind"] == "train")


def test_rollback_without_a_checkpoint_says_so_and_trains_on(shards, tmp_path, drift_once):
    run_dir = str(tmp_path / "run")
    status = _run(_config(shards, run_dir, "checkpoint_every=100"))  # rollback is the default
    assert status["status"] == "done" and status["step"] == 16
    [guard] = [r for r in read_metrics(f"{run_dir}/{METRICS_FILE}") if r["kind"] == "guard"]
    assert guard["step"] == 10 and guard["action"] == "warn"
    assert guard["message"].endswith("no checkpoint to roll back to: trained on")


@pytest.mark.parametrize("action", ["stop", "rollback"])
def test_an_overflowing_perplexity_is_infinite_and_the_guard_acts(shards, tmp_path, runaway_once, action):
    run_dir = str(tmp_path / "run")
    status = _run(_config(shards, run_dir, f"guard.on_divergence={action}"))
    rows = read_metrics(f"{run_dir}/{METRICS_FILE}")
    [guard] = [r for r in rows if r["kind"] == "guard"]
    assert guard["step"] == 10 and guard["action"] == action and guard["guard/perplexity_fwd"] == math.inf
    if action == "stop":
        assert status["status"] == "diverged" and "perplexity inf >" in status["message"]
    else:
        assert status["status"] == "done" and guard["to_step"] == 8
