"""The vocabulary's spellings (pipeline/train/char_cache.py): one table, gathered per batch, OOV
positions spelled from their own words."""

from __future__ import annotations

import numpy as np
import pytest

from elmo_model.characters import token_to_ids
from pipeline.train import char_cache
from pipeline.train.char_cache import CharCache

WORDS = ["<S>", "</S>", "<UNK>", "the", "cat", "naïve"]


def test_a_batch_of_ids_is_spelled_as_its_words_would_be():
    cache = CharCache(WORDS)
    assert cache.table.dtype == np.int16 and cache.table.shape == (6, 50)
    ids = np.array([[3, 4], [5, 1]])
    out = cache.spell(ids)
    assert out.shape == (2, 2, 50) and out.dtype == np.int64
    for (r, c), word in np.ndenumerate(np.array(WORDS, dtype=object)[ids]):
        np.testing.assert_array_equal(out[r, c], token_to_ids(word))
    assert out.min() >= 1  # +1-shifted: 0 never occurs


def test_out_of_vocabulary_positions_keep_their_own_spelling():
    cache = CharCache(WORDS)
    ids = np.array([[3, 2, 4]])  # the middle token is <UNK> in the shard
    out = cache.spell(ids, (np.array([0]), np.array([1])), ["tiger"])
    np.testing.assert_array_equal(out[0, 1], token_to_ids("tiger"))
    np.testing.assert_array_equal(out[0, 0], cache.spell(np.array([3]))[0])
    with pytest.raises(ValueError, match="2 OOV words but an index of another length"):
        cache.spell(ids, (np.array([0]), np.array([1])), ["tiger", "lion"])


def test_ids_outside_the_vocabulary_and_an_empty_vocabulary_are_refused():
    cache = CharCache(WORDS)
    with pytest.raises(ValueError, match=r"word ids must lie in \[0, 6\), got 0..6"):
        cache.spell(np.array([0, 6]))
    with pytest.raises(ValueError, match="the vocabulary is empty"):
        CharCache([])


def test_the_table_is_built_in_chunks_without_changing_it(monkeypatch):
    whole = CharCache(WORDS).table
    monkeypatch.setattr(char_cache, "ENCODE_CHUNK", 4)
    np.testing.assert_array_equal(CharCache(WORDS).table, whole)
