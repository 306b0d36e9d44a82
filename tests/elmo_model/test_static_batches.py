"""elmo_model.static_batches: passes planned by token budget (CPU) or fixed bucket shapes (CUDA)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from elmo_model.static_batches import (
    MIN_PASS_ROWS,
    BucketPlan,
    build_batch,
    build_passes,
    plan_batches,
    reverse_positions,
    split_rows,
)


def test_shrunk_passes_covers_every_index_once_within_budget():
    rng = random.Random(0)
    lengths = [rng.randint(1, 60) for _ in range(500)] + [300]
    batches = plan_batches(lengths, BucketPlan(token_budget=512, max_rows=32))
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    for batch in batches:
        width = max(lengths[i] for i in batch) + 2
        assert len(batch) <= 32
        assert len(batch) * width <= 512 or len(batch) == 1
    # the 302-position sentence is over budget only with company, so it is alone or fits
    assert [len(lengths) - 1] in batches or all(len(b) * 302 <= 512 for b in batches if len(lengths) - 1 in b)


def test_shrunk_passes_sorts_by_length_then_input_order():
    assert plan_batches([3, 1, 3, 1], BucketPlan(token_budget=100, max_rows=2)) == [[1, 3], [0, 2]]


def test_shrunk_passes_oversized_sentence_alone():
    assert plan_batches([1, 50, 1], BucketPlan(token_budget=20, max_rows=8)) == [[0, 2], [1]]


def test_fixed_passes_hold_one_bucket_each_and_never_more_than_its_rows():
    rng = random.Random(1)
    lengths = [rng.randint(1, 300) for _ in range(400)]
    plan = BucketPlan(token_budget=1024, max_rows=16, fixed=True)
    batches = plan_batches(lengths, plan)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    windows = set()
    for batch in batches:
        window = {plan.window(lengths[i]) for i in batch}
        assert len(window) == 1 and len(batch) <= plan.rows(window.pop())
        windows.add(build_batch([["w"] * lengths[i] for i in batch], plan).shape[:2])
    # a handful of shapes, whatever the lengths: the buckets, and multiples of 256 beyond them
    assert len(windows) <= len(plan.steps) + 1
    assert plan.window(254) == 256 and plan.window(255) == 512 and plan.window(1) == 16


def test_a_buckets_last_pass_takes_the_power_of_two_of_rows_that_holds_it():
    plan = BucketPlan(token_budget=2048, max_rows=128, steps=(16, 32), fixed=True)
    for sentences, rows in (
        (128, 128),
        (200, 128),
        (65, 128),
        (64, 64),
        (33, 64),
        (17, 32),
        (3, MIN_PASS_ROWS),
    ):
        assert plan.pass_rows(16, sentences) == rows, sentences
    small = BucketPlan(token_budget=80, max_rows=5, fixed=True)  # never above the full rows
    assert small.pass_rows(16, 3) == 5 and small.pass_rows(16, 5) == 5
    assert BucketPlan(token_budget=2048, max_rows=128).pass_rows(16, 3) == 3  # shrunk passes


def test_fixed_passes_are_full_or_at_least_half_full():
    """A GPU-sized pass (131,072 positions) over one 5,000-line shard: every bucket's sentences are
    far fewer than its full rows, and whole empty rows of a fixed shape cost as much as full ones."""
    rng = random.Random(2)
    sentences = [["w"] * min(250, int(rng.expovariate(1 / 25)) + 1) for _ in range(5000)]
    plan = BucketPlan(token_budget=131072, max_rows=8192, fixed=True)
    passes = build_passes(sentences, plan)
    for indices, batch in passes:
        rows, steps = batch.positions.shape
        assert batch.rows_used == len(indices)
        assert rows == plan.rows(steps) or rows == MIN_PASS_ROWS or 2 * len(indices) > rows
    positions = sum(batch.positions.size for _, batch in passes)
    tokens = sum(map(len, sentences))
    full_rows = sum(plan.rows(batch.positions.shape[1]) * batch.positions.shape[1] for _, batch in passes)
    print(f"real tokens per position: {tokens / positions:.3f}, with full passes {tokens / full_rows:.3f}")
    assert tokens / positions > 2.5 * tokens / full_rows


def test_reverse_positions_reverse_within_each_length():
    assert reverse_positions(np.array([3, 0, 5]), 5).tolist() == [
        [2, 1, 0, 3, 4],
        [0, 1, 2, 3, 4],
        [4, 3, 2, 1, 0],
    ]


def test_bad_plans_are_refused():
    with pytest.raises(ValueError, match="ascending"):
        BucketPlan(steps=(32, 16))
    with pytest.raises(ValueError, match=">= 1"):
        BucketPlan(token_budget=0)


@pytest.mark.parametrize("layers", [(), (3,)], ids=["top", "all"])
@pytest.mark.parametrize("pooled", [False, True])
def test_split_rows_copies_each_sentence_out_of_its_pass(layers, pooled):
    """A result never holds on to the pass's (on CUDA pinned) buffer, whatever its layout; the
    compact rows (OutputSpec.shape) come back in AllenNLP's per-sentence shapes."""
    batch = build_batch([["a", "b", "c"], ["d"]], BucketPlan(fixed=True))
    rows, steps = batch.positions.shape
    assert batch.output_rows(pooled) == (2 if pooled else 4)
    lead = rows if pooled else rows * (steps - 2)
    shape = (lead, *layers, 6)
    values = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    parts = split_rows(values, batch, pooled)
    assert len(parts) == 2
    starts = [0, 3]
    for r, part in enumerate(parts):
        assert not np.shares_memory(part, values) and part.flags.c_contiguous
        n = int(batch.lengths[r]) - 2
        tokens = values[starts[r] : starts[r] + n]
        expected = values[r] if pooled else (tokens.swapaxes(0, 1) if layers else tokens)
        np.testing.assert_array_equal(part, expected)
    if not pooled:
        assert parts[0].shape == (*layers, 3, 6) and parts[1].shape == (*layers, 1, 6)
