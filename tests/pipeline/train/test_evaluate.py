"""Held-out perplexity (pipeline/train/evaluate.py): bilm-tf's run_test arithmetic, the state
carried from batch to batch, the batch limits and the split check."""

from __future__ import annotations

import math

import pytest
import torch

from elmo_model import BiLM, TrainingLM
from pipeline.config import load_config
from pipeline.model_config import preset_options
from pipeline.train.config import TrainConfig
from pipeline.train.data import LMBatch
from pipeline.train.errors import TrainError
from pipeline.train.evaluate import (
    Evaluator,
    HeldoutSums,
    check_heldout_split,
    eval_batches,
    heldout_sums,
    perplexity,
)
from pipeline.train.objective import SharedSoftmax, direction_losses_full

VOCAB = 30


@pytest.fixture
def lm_and_softmax():
    torch.manual_seed(0)
    options = preset_options("tiny")
    softmax = SharedSoftmax(VOCAB, options["lstm"]["projection_dim"])
    return TrainingLM(BiLM.from_options(options), dropout=0.1), softmax


def batches(count: int, rows: int = 3) -> list[LMBatch]:
    gen = torch.Generator().manual_seed(1)
    return [
        LMBatch(
            char_ids=torch.randint(1, 262, (2, rows, 1, 50), generator=gen),
            token_ids=torch.randint(0, VOCAB, (2, rows, 1), generator=gen),
            targets=torch.randint(0, VOCAB, (2, rows, 1), generator=gen),
        )
        for _ in range(count)
    ]


def by_hand(lm, softmax, scored, carry: bool) -> torch.Tensor:
    """[fwd, bwd, avg] summed over ``scored``, each batch's direction losses from ``score_window``."""
    total, c, h = torch.zeros(3, dtype=torch.float64), None, None
    with torch.no_grad():
        for batch in scored:
            top, c, h = lm.score_window(batch.char_ids, c if carry else None, h if carry else None)
            losses = direction_losses_full(top, batch.targets, softmax).double()
            total += torch.stack([losses[0], losses[1], losses.mean()])
    return total


def test_the_state_carries_from_batch_to_batch_and_the_mode_is_restored(lm_and_softmax):
    lm, softmax = lm_and_softmax
    lm.train()
    scored = batches(4)
    sums = heldout_sums(lm, softmax, scored, torch.device("cpu"))
    assert lm.training  # put back as it was
    assert sums.batches == 4
    lm.eval()  # by hand without dropout, as heldout_sums scores
    torch.testing.assert_close(sums.losses, by_hand(lm, softmax, scored, carry=True))
    # the rows are continuous streams: starting each batch from zeros gives other losses
    assert not torch.allclose(sums.losses, by_hand(lm, softmax, scored, carry=False))
    limited = heldout_sums(lm, softmax, scored, torch.device("cpu"), max_batches=2)
    assert limited.batches == 2
    torch.testing.assert_close(limited.losses, by_hand(lm, softmax, scored[:2], carry=True))


def test_perplexity_is_exp_of_the_mean_of_the_per_batch_losses():
    sums = HeldoutSums(torch.tensor([2 * math.log(10), 2 * math.log(40), math.log(10) + math.log(40)],
                                    dtype=torch.float64), batches=2)  # fmt: skip
    got = sums.perplexities()
    assert got["eval/perplexity_fwd"] == pytest.approx(10)
    assert got["eval/perplexity_bwd"] == pytest.approx(40)
    assert got["eval/perplexity"] == pytest.approx(20)  # exp of the mean loss: the geometric mean
    assert perplexity(1000.0) == math.inf  # a runaway's loss still has a perplexity to judge
    with pytest.raises(TrainError, match="no held-out batch was scored"):
        HeldoutSums(torch.zeros(3, dtype=torch.float64), 0).perplexities()


def test_every_worker_needs_a_batch_of_sentences_of_its_own():
    check_heldout_split([40, 40], batch_size=32, world_size=2)  # a shard each
    # one shard: the ranks take every other sentence, 3 and 2
    check_heldout_split([5], batch_size=2, world_size=2)
    with pytest.raises(TrainError, match=r"gives worker 1 of 2 only 2 sentences.*lower eval_batch_size to 2"):
        check_heldout_split([5], batch_size=3, world_size=2)


def test_shards_without_a_held_out_split_say_what_gives_one():
    """Not "lower eval_batch_size to 1": no batch size helps, and rerunning the shard command into
    the same output finds its run complete."""
    with pytest.raises(
        TrainError, match=r"no held-out split .*into a new output with heldout_fraction above 0"
    ):
        check_heldout_split([], batch_size=32, world_size=1)


def cfg(**keys) -> TrainConfig:
    return load_config(
        TrainConfig, overrides=["shards=s", "output=o", *(f"{k}={v}" for k, v in keys.items())]
    )


def test_batch_limits_and_when_an_evaluation_is_due():
    assert eval_batches(cfg(eval_max_batches=0, eval_interval_batches=5), final=True) == 0  # all of it
    assert eval_batches(cfg(eval_max_batches=0, eval_interval_batches=5), final=False) == 5
    assert eval_batches(cfg(eval_max_batches=3, eval_interval_batches=5), final=False) == 3
    assert eval_batches(cfg(eval_max_batches=8, eval_interval_batches=0), final=False) == 8
    during = Evaluator(cfg(eval_every=10), lambda: [], baselines={"eval/unigram_perplexity": 300.0}, world=1)
    assert [s for s in range(1, 31) if during.due(s, last_step=s == 30)] == [10, 20]
    assert not Evaluator(cfg(eval_every=0), lambda: [], {}, 1).due(10, last_step=False)


def test_an_evaluation_splits_its_batch_limit_over_the_ranks(lm_and_softmax):
    lm, softmax = lm_and_softmax
    scored = batches(6)
    baselines = {
        "eval/unigram_perplexity": 300.0,
        "eval/kneser_ney_3gram_perplexity": 150.0,
        "eval/heldout_unk_rate": 0.02,
    }
    evaluator = Evaluator(cfg(eval_max_batches=5), lambda: iter(scored), baselines, world=1)
    result = evaluator.run(lm, softmax, torch.device("cpu"), None)
    assert result["eval/batches"] == 5 and baselines.items() <= result.items()
    expected = heldout_sums(lm, softmax, scored, torch.device("cpu"), max_batches=5).perplexities()
    assert result["eval/perplexity"] == pytest.approx(expected["eval/perplexity"])
    # two ranks: each scores ceil(5 / 2) = 3 of its own (the sum over ranks is this one's alone here)
    two = Evaluator(
        cfg(eval_max_batches=5), lambda: iter(scored), baselines={"eval/unigram_perplexity": 300.0}, world=2
    )
    assert two.run(lm, softmax, torch.device("cpu"), None)["eval/batches"] == 3
