"""The step's host-side inputs (pipeline/train/step_inputs.py): a batch's distinct spellings, found
by vocabulary id (and by spelling for ``<UNK>``), and the spelling buffer's capacity buckets."""

from __future__ import annotations

import math

import numpy as np
import torch
from test_step import B, U, _batches, _cache

from pipeline.formats.shard_format import UNK_ID
from pipeline.train.step_inputs import CAPACITY_BUCKETS, distinct_tokens, padded_capacity, step_inputs


def test_distinct_tokens_key_vocabulary_ids_and_compare_unknown_spellings():
    cache = _cache()
    ids = np.array([[5, 7, 5, UNK_ID], [UNK_ID, 7, UNK_ID, 9]])
    oov_index = (np.array([0, 1, 1]), np.array([3, 0, 2]))
    char_ids = cache.spell(ids, oov_index, ["zebra", "yak", "zebra"])
    chars, positions = distinct_tokens(char_ids, ids)
    assert chars.shape == (5, 50)  # 5, 7, 9, "zebra", "yak"
    assert np.array_equal(chars[positions], char_ids)
    assert positions[0, 3] == positions[1, 2] != positions[1, 0]
    assert positions[0, 0] == positions[0, 2]


def test_step_inputs_and_capacity_buckets():
    cache = _cache()
    batch = _batches(cache, 1)[0]
    inputs = step_inputs(batch, None)
    assert torch.equal(inputs.chars[inputs.positions], batch.char_ids)
    positions = 2 * B * U
    assert padded_capacity(1, positions) == math.ceil(positions / CAPACITY_BUCKETS)
    assert padded_capacity(positions, positions) == positions
    cap = padded_capacity(int(inputs.chars.shape[0]), positions)
    assert inputs.chars.shape[0] <= cap <= inputs.chars.shape[0] + positions / CAPACITY_BUCKETS
    target = step_inputs(batch, None)
    target.chars = torch.full((cap, 50), 5)
    target.copy_(inputs)
    assert torch.equal(target.chars[: inputs.chars.shape[0]], inputs.chars)
    assert not target.chars[inputs.chars.shape[0] :].any()
