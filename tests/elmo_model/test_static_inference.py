"""Static-shape inference (elmo_model/static_inference.py) against the reference fixtures and BiLM.forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from elmo_reference import TINY_OPTIONS

from elmo_model import BiLM, batch_to_ids
from elmo_model.static_batches import BucketPlan, build_batch, plan_batches, split_rows
from elmo_model.static_inference import GRAPH_WARMUP, OutputSpec, StaticInference

SMALL_BUCKETS = BucketPlan(token_budget=64, max_rows=5, steps=(8, 12, 16, 32), fixed=True)


def embed(model, sentences, output: OutputSpec, plan: BucketPlan, precision: str = "float32"):
    """One array per sentence through StaticInference, passes planned by ``plan``."""
    run = StaticInference(model, output, precision)
    values = [None] * len(sentences)
    for indices in plan_batches([len(s) for s in sentences], plan):
        batch = build_batch([sentences[i] for i in indices], plan)
        out = run(batch).float().numpy()
        for i, value in zip(indices, split_rows(out, batch, output.pool), strict=True):
            values[i] = value
    return values


def forward_alone(model, sentence) -> np.ndarray:
    """(N+1, n, 2P): today's BiLM.forward on the sentence alone, boundaries removed."""
    with torch.no_grad():
        return model(batch_to_ids([sentence])).layers[0, :, 1 : len(sentence) + 1].numpy()


@pytest.mark.parametrize("fixed", [True, False])
def test_first_fixture_batch_reproduces_the_reference(reference, fixed):
    """The fixtures' first batch starts from zero state: static passes give the reference's top layer."""
    model, sentences, expected = reference.load(), reference.sentences(), reference.expected()
    batch = [sentences[k][0] for k in range(3)]
    top = embed(model, batch, OutputSpec("top"), BucketPlan(fixed=fixed))
    for k in range(3):
        assert top[k].shape == expected[k][0].shape
        assert np.allclose(top[k], expected[k][0], atol=1e-6), (reference.name, k)


@pytest.mark.parametrize(
    "plan", [SMALL_BUCKETS, BucketPlan(token_budget=40, max_rows=3)], ids=["fixed", "shrunk"]
)
def test_every_sentence_equals_its_forward_alone_whatever_its_batch_and_padding(reference, plan):
    model = reference.load()
    sentences = [s for row in reference.sentences() for s in row]
    got = embed(model, sentences, OutputSpec("all"), plan)
    for sentence, value in zip(sentences, got, strict=True):
        alone = forward_alone(model, sentence)
        assert value.shape == alone.shape == (3, len(sentence), 32)
        assert np.abs(value - alone).max() < 1e-6


def test_fixed_shapes_pad_rows_steps_and_spellings():
    plan = SMALL_BUCKETS
    sentences = [["a"] * 3, ["b", "a"], ["c"] * 9, ["d"] * 20]
    batches = plan_batches([len(s) for s in sentences], plan)
    assert batches == [[1, 0], [2], [3]]
    shapes = [build_batch([sentences[i] for i in b], plan).shape for b in batches]
    # windows 8, 12, 32 (22 positions); rows 64 // window capped at 5; spellings padded to 64,
    # or to every position of the pass when fewer
    assert shapes == [(5, 8, 40), (5, 12, 60), (2, 32, 64)]
    batch = build_batch([sentences[1], sentences[0]], plan)
    assert batch.lengths.tolist() == [4, 5, 0, 0, 0] and batch.rows_used == 2 and batch.tokens == 5
    assert batch.reverse[0].tolist() == [3, 2, 1, 0, 4, 5, 6, 7]
    assert batch.positions[0].tolist() == [0, 2, 3, 1, 0, 0, 0, 0]  # <S> b a </S>, padding reads <S>


def test_layer_modes_and_mean_pooling_follow_the_per_token_values(tiny_model):
    sentences = [["The", "cat", "sat"], ["Hi"], ["a", "b", "c", "d", "e"]]
    full = embed(tiny_model, sentences, OutputSpec("all"), SMALL_BUCKETS)
    top = embed(tiny_model, sentences, OutputSpec("top"), SMALL_BUCKETS)
    average = embed(tiny_model, sentences, OutputSpec("average"), SMALL_BUCKETS)
    pooled_all = embed(tiny_model, sentences, OutputSpec("all", pool=True), SMALL_BUCKETS)
    pooled_top = embed(tiny_model, sentences, OutputSpec("top", pool=True), SMALL_BUCKETS)
    for k in range(3):
        assert np.allclose(top[k], full[k][-1], atol=1e-6)
        assert np.allclose(average[k], full[k].mean(axis=0), atol=1e-6)
        assert pooled_all[k].shape == (3, 12) and pooled_top[k].shape == (12,)
        assert np.allclose(pooled_all[k], full[k].mean(axis=1), atol=1e-6)
        assert np.allclose(pooled_top[k], full[k][-1].mean(axis=0), atol=1e-6)


def test_float16_output_and_bf16_compute_stay_close_to_float32(reference):
    """The stored dtype and the compute precision are separate; their errors are small, not zero."""
    model = reference.load()
    sentences = [s for row in reference.sentences() for s in row]
    exact = embed(model, sentences, OutputSpec("top"), SMALL_BUCKETS)
    half = embed(model, sentences, OutputSpec("top", dtype=torch.float16), SMALL_BUCKETS)
    bf16 = embed(model, sentences, OutputSpec("top"), SMALL_BUCKETS, precision="bf16")
    half_error = max(np.abs(a - b).max() for a, b in zip(exact, half, strict=True))
    bf16_error = max(np.abs(a - b).max() for a, b in zip(exact, bf16, strict=True))
    assert 0 < half_error < 5e-3
    assert 1e-4 < bf16_error < 0.25


def test_stateful_models_and_unknown_settings_are_refused(tiny_model):
    with pytest.raises(ValueError, match="precision must be one of"):
        StaticInference(tiny_model, OutputSpec(), precision="fp8")
    with pytest.raises(ValueError, match="layers must be one of"):
        OutputSpec("middle")
    tiny_model.stateful = True
    with pytest.raises(ValueError, match="stateless"):
        StaticInference(tiny_model, OutputSpec())


WIDE_OPTIONS = {**TINY_OPTIONS, "lstm": {**TINY_OPTIONS["lstm"], "dim": 4096, "projection_dim": 512}}
"""``original``'s LSTM (4096 cells, 512 projections) behind the tiny char CNN: a pass of 8,192
positions holds 1 GiB of float32 gates per layer, as the released model's does."""


@pytest.mark.cuda
def test_every_bucket_shape_warms_up_in_the_memory_of_the_one_before():
    """Four bucket shapes of one token budget reserve about what the first one did: their eager
    warm-ups share one stream, so each reuses the blocks the previous one freed (on a stream per
    shape, each kept its own ~2 GiB, and ``original`` in float32 ran out of an 80 GB H100)."""
    torch.manual_seed(0)
    model = BiLM.from_options(WIDE_OPTIONS).eval().cuda()
    plan = BucketPlan(token_budget=8192, max_rows=512, steps=(16, 32, 64, 128), fixed=True)
    run = StaticInference(model, OutputSpec("top", dtype=torch.float16))
    reserved = []
    for length in (10, 25, 50, 100):  # one full pass per bucket window
        sentence = [f"w{i % 7}" for i in range(length)]
        batch = build_batch([sentence] * plan.rows(plan.window(length)), plan)
        for _ in range(GRAPH_WARMUP + 2):  # the eager warm-ups, the capture and a replay
            run(batch)
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
    assert len(run.captured_shapes) == 4
    grown = reserved[-1] - reserved[0]
    assert grown < 0.25 * reserved[0], [f"{r / 2**30:.2f} GiB" for r in reserved]
