"""pipeline.embed.batching: token-budget buckets and in-order batches."""

from __future__ import annotations

import random

import pytest

from pipeline.embed.batching import in_order, length_bucketed


def test_length_bucketed_covers_every_index_once_within_budget():
    rng = random.Random(0)
    lengths = [rng.randint(1, 60) for _ in range(500)] + [300]
    batches = length_bucketed(lengths, token_budget=512, max_sentences=32)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    for batch in batches:
        width = max(lengths[i] for i in batch) + 2
        assert len(batch) <= 32
        assert len(batch) * width <= 512 or len(batch) == 1
    # the 302-position sentence is over budget only with company, so it is alone or fits
    assert [len(lengths) - 1] in batches or all(len(b) * 302 <= 512 for b in batches if len(lengths) - 1 in b)


def test_length_bucketed_sorts_by_length_then_input_order():
    assert length_bucketed([3, 1, 3, 1], token_budget=100, max_sentences=2) == [[1, 3], [0, 2]]


def test_length_bucketed_oversized_sentence_alone():
    assert length_bucketed([1, 50, 1], token_budget=20, max_sentences=8) == [[0, 2], [1]]


def test_in_order():
    assert in_order(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert in_order(0, 3) == []
    with pytest.raises(ValueError):
        in_order(3, 0)
