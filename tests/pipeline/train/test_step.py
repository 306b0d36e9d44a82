"""The training step (pipeline/train/step.py's StepRunner) against a plain reference: autograd through the
step-by-step LSTM over every position's own spelling, dense softmax gradients, explicit clipping and
torch's unfused Adagrad."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from train_shards import synthetic_cache, zipf_batches

from elmo_model import BiLM, LSTMState
from elmo_model.flops import encoder_flops, lstm_flops
from pipeline.config import load_config
from pipeline.model_config import to_options
from pipeline.train.char_cache import CharCache
from pipeline.train.checkpoint import Checkpointer, latest_checkpoint, load_model
from pipeline.train.config import OptimizerName, TrainConfig
from pipeline.train.data import LMBatch
from pipeline.train.objective import NegativeSample, SharedSoftmax, sample_negatives, sampled_softmax_losses
from pipeline.train.step import PHASES, PhaseTimer, StepRunner

VOCAB = 300
B, U, S = 4, 6, 20


pytestmark = pytest.mark.usefixtures("single_thread")


def _cache() -> CharCache:
    return synthetic_cache(VOCAB)


def _batches(cache: CharCache, count: int, seed: int = 0) -> list[LMBatch]:
    return zipf_batches(cache, count, B, U, seed)


def _config(*overrides: str):
    return load_config(
        TrainConfig,
        preset="tiny",
        overrides=[
            "shards=unused",
            "output=unused",
            f"batch_size={B}",
            f"unroll_steps={U}",
            f"softmax.negatives={S}",
            "dropout=0.0",
            # the step's arithmetic against a plain reference at a constant rate (tiny's own recipe
            # warms up and decays: tests/pipeline/train/test_run_length.py)
            "optimizer.schedule=constant",
            "optimizer.warmup_steps=0",
            *overrides,
        ],
    )


def reference_run(cfg, batches: list[LMBatch]) -> tuple[list[list[float]], BiLM, SharedSoftmax]:
    """The recipe written out plainly; returns each step's [fwd, bwd] losses and the final model."""
    options = to_options(cfg.model)
    seed = int(cfg.seed)
    torch.manual_seed(seed)
    bilm = BiLM.from_options({**options, "dropout": 0.0})
    softmax = SharedSoftmax(VOCAB, int(options["lstm"]["projection_dim"]))
    params = [*bilm.parameters(), *softmax.parameters()]
    if cfg.optimizer.name is OptimizerName.adagrad:
        opt = torch.optim.Adagrad(
            params, lr=float(cfg.optimizer.lr), initial_accumulator_value=1.0, eps=1e-10
        )
    else:
        opt = torch.optim.Adam(params, lr=float(cfg.optimizer.lr), eps=float(cfg.optimizer.adam_eps))
    generator = torch.Generator().manual_seed(seed * 1000)
    lstm = bilm.lstm
    state = LSTMState(
        torch.zeros(lstm.n_layers, 2, B, lstm.dim), torch.zeros(lstm.n_layers, 2, B, lstm.projection_dim)
    )
    losses = []
    for batch in batches:
        negatives = sample_negatives(S, VOCAB, generator)
        tokens = bilm.token_encoder(batch.char_ids.reshape(2 * B, U, -1)).view(2, B, U, -1)
        mask = torch.ones(B, U, dtype=torch.bool)
        outs, final = lstm._forward_autograd(tokens, mask, mask.sum(1), state)
        per_direction = []
        for d in range(2):
            rows = torch.cat([batch.targets[d].reshape(-1), negatives.ids[d]])
            one = NegativeSample(negatives.ids[d : d + 1], negatives.tries[d : d + 1])
            per_direction.append(
                sampled_softmax_losses(
                    outs[-1][d].reshape(1, -1, outs.shape[-1]),
                    batch.targets[d].reshape(1, -1),
                    softmax.weight[rows].unsqueeze(0),
                    softmax.bias[rows].unsqueeze(0),
                    one,
                    VOCAB,
                )[0]
            )
        # the offset penalty: |mean over the step's positions of the softmax input|^2, mean of the directions
        offsets = [outs[-1][d].reshape(-1, outs.shape[-1]).mean(dim=0) for d in range(2)]
        penalty = (
            float(cfg.softmax.offset_penalty) * (offsets[0].dot(offsets[0]) + offsets[1].dot(offsets[1])) / 2
        )
        opt.zero_grad()
        ((torch.stack(per_direction).mean() + penalty) * U).backward()
        norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params))
        if norm > float(cfg.clip_norm):
            for p in params:
                p.grad.mul_(float(cfg.clip_norm) / norm)
        opt.step()  # dense Adagrad leaves zero-gradient rows alone: the sparse update's result
        state = LSTMState(final.c.detach(), final.h.detach())
        losses.append([float(x.detach()) for x in per_direction])
    return losses, bilm, softmax


@pytest.mark.parametrize(
    "overrides",
    [
        ["optimizer.name=adagrad", "optimizer.lr=0.2", "clip_norm=10.0"],
        ["optimizer.name=adagrad", "optimizer.lr=0.2", "clip_norm=0.5"],  # every step clipped
        ["optimizer.name=adam", "optimizer.lr=0.004", "clip_norm=0.5"],
        [
            "optimizer.name=adam",
            "optimizer.lr=0.004",
            "clip_norm=0.5",
            "softmax.offset_penalty=0",
        ],  # bilm-tf's loss
    ],
)
def test_steps_equal_the_plain_reference(overrides):
    cache = _cache()
    batches = _batches(cache, 3)
    cfg = _config(*overrides)
    runner = StepRunner(cfg, to_options(cfg.model), VOCAB, torch.device("cpu"))
    got = [runner.train_step(batch, 100).losses.tolist() for batch in batches]
    want, bilm, softmax = reference_run(cfg, batches)
    np.testing.assert_allclose(got, want, rtol=2e-5)
    # Adam moves a weight whose gradient is ~0 by up to lr, so rounding in such a gradient shows as
    # ~1e-6 in a few of the 10^5 weights (1 element in the runs checked); Adagrad moves it by ~0
    atol = 1e-5 if cfg.optimizer.name is OptimizerName.adam else 1e-6
    for (name, mine), theirs in zip(runner.bilm.named_parameters(), bilm.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=atol, msg=name)
    torch.testing.assert_close(runner.softmax.weight, softmax.weight, rtol=1e-4, atol=1e-6)
    assert runner.nonfinite_steps() == 0 and runner.step == 3


def test_a_non_finite_step_changes_nothing():
    cache = _cache()
    batches = _batches(cache, 2)
    cfg = _config("optimizer.name=adagrad", "optimizer.lr=0.2")
    runner = StepRunner(cfg, to_options(cfg.model), VOCAB, torch.device("cpu"))
    runner.train_step(batches[0], 100)
    with torch.no_grad():
        runner.softmax.weight[batches[1].targets[0, 0, 0]] = float("nan")
    params = [p.detach().clone() for p in runner.lm.parameters()]
    sums = [runner.optimizer.state[p]["sum"].clone() for p in runner.lm.parameters()]
    c, h = runner.state.c.clone(), runner.state.h.clone()
    result = runner.train_step(batches[1], 100)
    assert float(result.skipped) == 1.0 and runner.nonfinite_steps() == 1
    assert all(torch.equal(a, b) for a, b in zip(params, runner.lm.parameters(), strict=True))
    assert all(
        torch.equal(a, runner.optimizer.state[p]["sum"])
        for a, p in zip(sums, runner.lm.parameters(), strict=True)
    )
    assert torch.equal(c, runner.state.c) and torch.equal(h, runner.state.h)


@pytest.mark.cuda
def test_a_background_checkpoint_holds_its_step_while_graph_replays_go_on(tmp_path):
    cache = _cache()
    batches = _batches(cache, 10)
    cfg = _config("cuda_graph=true")
    runner = StepRunner(cfg, to_options(cfg.model), VOCAB, torch.device("cuda"))
    for batch in batches[:5]:  # warm-up, capture, replays
        runner.train_step(batch, 100)
    assert runner.graph.replaying
    saver = Checkpointer(
        str(tmp_path),
        0,
        1,
        every=5,
        keep=2,
        shared={"bilm": runner.bilm, "softmax": runner.softmax, "optimizer": runner.optimizer},
        own={"lstm": runner.state},
        meta={"options": runner.options},
    )
    want = {name: tensor.cpu() for name, tensor in runner.bilm.state_dict().items()}
    assert saver.save(5)
    for batch in batches[5:]:  # replays queued behind the checkpoint's device-to-host copy
        runner.train_step(batch, 100)
    saver.wait()
    saved = load_model(latest_checkpoint(str(tmp_path)))["bilm"]
    assert all(torch.equal(saved[name], want[name]) for name in want)
    assert not all(torch.equal(tensor.cpu(), want[name]) for name, tensor in runner.bilm.state_dict().items())


def test_full_softmax_and_adam_run_and_learn():
    cache = _cache()
    batch = _batches(cache, 1)[0]
    for overrides in (
        ["softmax.sampled=false", "optimizer.lr=0.004"],
        ["optimizer.name=adam", "optimizer.lr=0.01"],
    ):
        cfg = _config(*overrides)
        runner = StepRunner(cfg, to_options(cfg.model), VOCAB, torch.device("cpu"))
        first = runner.train_step(batch, 100).losses.mean().item()
        for _ in range(5):
            last = runner.train_step(batch, 100).losses.mean().item()
        assert last < first, overrides


def test_the_step_trains_at_the_rate_its_batch_rule_gives():
    batch = _batches(_cache(), 1)[0]
    for rule, want in (("as_given", 0.02), ("sqrt", 0.02 * math.sqrt(B / 384)), ("auto", 0.02)):  # auto: CPU
        cfg = _config("optimizer.lr=0.02", f"optimizer.lr_rule={rule}")
        runner = StepRunner(cfg, to_options(cfg.model), VOCAB, torch.device("cpu"))
        assert runner.train_step(batch, 100).lr == pytest.approx(want), rule


def test_phase_timer_splits_a_cpu_step():
    cache = _cache()
    cfg = _config()
    runner = StepRunner(cfg, to_options(cfg.model), VOCAB, torch.device("cpu"))
    runner.timer = PhaseTimer(runner.device)
    runner.train_step(_batches(cache, 1)[0], 100)
    durations = runner.timer.durations()
    assert list(durations) == list(PHASES) and all(v >= 0 for v in durations.values())


def test_a_steps_flops_count_the_encoder_once_per_distinct_spelling():
    cache = _cache()
    batch = _batches(cache, 1)[0]
    cfg = _config()
    options = to_options(cfg.model)
    runner = StepRunner(cfg, options, VOCAB, torch.device("cpu"))
    spellings = batch.char_ids.reshape(-1, batch.char_ids.shape[-1]).numpy()
    distinct = np.unique(spellings, axis=0).shape[0]
    positions = 2 * B * U
    assert distinct < positions  # Zipf text repeats tokens: the two counts differ
    per_position = lstm_flops(options) + 2 * int(options["lstm"]["projection_dim"]) * (S + 1)
    want = 3 * (distinct * encoder_flops(options) + positions * per_position)
    assert runner.train_step(batch, 100).flops == want
