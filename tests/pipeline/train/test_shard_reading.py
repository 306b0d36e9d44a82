"""One shard read for one rank and laid out in reading order (pipeline/train/shard_reading.py),
against a plain Python reading of the same sentences."""

from __future__ import annotations

import numpy as np
import pytest
from train_shards import write_shard_dir

from pipeline.formats import shard_format
from pipeline.formats.shard_format import BOS_ID, EOS_ID, UNK_ID
from pipeline.train.shard_reading import (
    LayoutPlan,
    ShardSentences,
    read_layout,
    read_shard_sentences,
    wrap_sentences,
)

VOCAB = ["<S>", "</S>", "<UNK>", "the", "cat", "sat", "on", "mat"]
BLOCKS = [
    [["the", "cat", "sat"], ["on", "the", "zebra"]],  # zebra is out of the vocabulary
    [["mat"], ["the", "yak", "sat", "gnu"], ["cat"]],
]
SENTENCES = [s for block in BLOCKS for s in block]


def ids_of(sentence):
    return [VOCAB.index(t) if t in VOCAB else UNK_ID for t in sentence]


@pytest.fixture
def shard(tmp_path):
    manifest = write_shard_dir(str(tmp_path), {"train": [BLOCKS]}, VOCAB)
    entry = manifest.shards["train"][0]
    return str(tmp_path / entry.name), (entry.sentences, entry.tokens, entry.sha256)


@pytest.mark.parametrize("stride", [None, (0, 2), (1, 2)])
def test_a_rank_reads_every_world_th_sentence_with_its_oov_spellings(shard, stride):
    url, expected = shard
    got = read_shard_sentences(url, len(VOCAB), stride, expected)
    kept = SENTENCES if stride is None else SENTENCES[stride[0] :: stride[1]]
    assert got.lengths.tolist() == [len(s) for s in kept]
    assert got.ids.tolist() == [i for s in kept for i in ids_of(s)]
    flat = [t for s in kept for t in s]
    assert got.oov_pos.tolist() == [k for k, t in enumerate(flat) if t not in VOCAB]
    assert got.oov_words == [t for t in flat if t not in VOCAB]


def test_a_shard_that_disagrees_with_its_manifest_or_vocabulary_is_named(shard):
    url, (sentences, tokens, sha) = shard
    with pytest.raises(
        shard_format.FormatError, match=r"manifest lists 6 sentences / 12 tokens, the shard holds 5 / 12"
    ):
        read_shard_sentences(url, len(VOCAB), None, (6, tokens, sha))
    with pytest.raises(
        shard_format.FormatError,
        match=r"block train-000000-000000 has word ids outside the vocabulary of 4 \(2..6\)",
    ):
        read_shard_sentences(url, 4, None, (sentences, tokens, sha))


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "backward"])
def test_sentences_are_wrapped_in_reading_order_and_their_oovs_follow_them(reverse):
    lengths = [3, 1, 4, 2]
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 50, sum(lengths)).astype(np.int32)
    oov = np.array([1, 5, 8])
    ids[oov] = UNK_ID
    words = ["w1", "w5", "w8"]
    shard = ShardSentences(ids, np.array(lengths), oov, words)
    order = np.array([2, 0, 3, 1])
    got = wrap_sentences(shard, order, reverse)

    starts = np.cumsum([0, *lengths[:-1]])
    expected_ids, expected_oov = [], []
    for j in order:
        positions = list(range(starts[j], starts[j] + lengths[j]))
        if reverse:
            positions.reverse()
        expected_ids.append(EOS_ID if reverse else BOS_ID)
        for p in positions:
            if p in oov:
                expected_oov.append((len(expected_ids), words[list(oov).index(p)]))
            expected_ids.append(int(ids[p]))
        expected_ids.append(BOS_ID if reverse else EOS_ID)
    assert got.ids.tolist() == expected_ids
    assert got.ends.tolist() == np.cumsum([lengths[j] + 2 for j in order]).tolist()
    assert list(zip(got.oov_pos.tolist(), got.oov_words, strict=True)) == expected_oov
    assert got.n_sentences == 4 and got.begin(1) == lengths[2] + 2
    inside, spelled = got.oov_between(0, int(got.ends[1]))
    assert list(zip(inside.tolist(), spelled, strict=True)) == [p for p in expected_oov if p[0] < got.ends[1]]


def test_a_layout_plan_gives_the_same_arrays_wherever_it_is_read(shard):
    url, expected = shard
    plan = LayoutPlan(url, len(VOCAB), None, expected, order_seed=(7, 0, 1), reverse=False)
    first, again = read_layout(plan), read_layout(plan)
    np.testing.assert_array_equal(first.ids, again.ids)
    stored = read_layout(LayoutPlan(url, len(VOCAB), None, expected, order_seed=None, reverse=False))
    assert sorted(first.ids.tolist()) == sorted(stored.ids.tolist())
    assert first.ids.tolist() != stored.ids.tolist()  # shuffled by the seed
    assert stored.ids[: len(SENTENCES[0]) + 2].tolist() == [BOS_ID, *ids_of(SENTENCES[0]), EOS_ID]
