"""Held-out unigram perplexity: a tiny example computed by hand, and the shard-directory shell."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.formats import shard_format
from pipeline.formats.shard_manifest import read_manifest
from pipeline.formats.unigram import (
    heldout_target_counts,
    heldout_unigram_perplexity,
    targets_nll,
    training_target_counts,
    unigram_log_probs,
    unigram_perplexity,
)
from tests.pipeline.train.train_shards import write_shard_dir

VOCAB = ["<S>", "</S>", "<UNK>", "a", "b"]


def hand_value() -> float:
    """Training: "a a b" and "a x" (x out of vocabulary): 2 sentences, 5 tokens.
    Forward targets: a 3, b 1, <UNK> 1, </S> 2 -> N = 7 over V - 1 = 4 types; add-one:
    p(a) = 4/11, p(b) = 2/11, p(<UNK>) = 2/11, p(</S>) = 3/11.
    Held-out "a y" (y OOV): targets a, <UNK>, </S> -> ppl = (11^3 / (4 * 2 * 3)) ** (1/3)."""
    return (11**3 / (4 * 2 * 3)) ** (1 / 3)


def test_tiny_example_by_hand():
    train = training_target_counts(np.array([0, 0, 0, 3, 1]), n_sentences=2, n_tokens=5)
    assert train.tolist() == [0, 2, 1, 3, 1]
    heldout = heldout_target_counts([(np.array([3, 2]), 1)], vocab_size=5)
    assert heldout.tolist() == [0, 1, 1, 1, 0]
    assert unigram_perplexity(train, heldout) == pytest.approx(hand_value(), rel=1e-12)


def test_unseen_word_keeps_a_finite_cost():
    # b never occurs in training: add-one gives it 1 / (N + V - 1) = 1/10 (N = 6: a 3, <UNK> 1, </S> 2)
    train = training_target_counts(np.array([0, 0, 0, 3, 0]), n_sentences=2, n_tokens=4)
    heldout = heldout_target_counts([(np.array([4]), 0)], vocab_size=5)
    assert unigram_perplexity(train, heldout) == pytest.approx(10.0)


def test_bad_counts_are_clear_errors():
    with pytest.raises(ValueError, match="sum to 4, more than the 3 training tokens"):
        training_target_counts(np.array([0, 0, 0, 3, 1]), n_sentences=1, n_tokens=3)
    with pytest.raises(ValueError, match="outside the vocabulary of 5"):
        heldout_target_counts([(np.array([5]), 1)], vocab_size=5)
    with pytest.raises(ValueError, match="held-out set is empty"):
        unigram_perplexity(np.ones(5, np.int64), np.zeros(5, np.int64))


def test_targets_nll_sums_the_words_and_one_end_per_sentence():
    log_probs = unigram_log_probs(training_target_counts(np.array([0, 0, 0, 3, 1]), 2, 5))
    # held-out "a y": a (4/11), <UNK> (2/11), </S> (3/11)
    expected = -np.log(4 / 11) - np.log(2 / 11) - np.log(3 / 11)
    heldout = heldout_target_counts([(np.array([3, 2]), 1)], vocab_size=5)
    assert targets_nll(log_probs, heldout) == pytest.approx(expected, rel=1e-12)
    reordered = heldout_target_counts([(np.array([2]), 0), (np.array([3]), 1)], vocab_size=5)
    assert targets_nll(log_probs, reordered) == targets_nll(log_probs, heldout)  # bit for bit


@pytest.mark.parametrize("scored", [True, False], ids=["from-the-manifest", "from-the-shards"])
def test_shard_directory_baseline(tmp_path, scored):
    train = [[[["a", "a", "b"]], [["a", "x"]]]]  # one shard of two blocks
    heldout = [[[["a", "y"]]], [[["b"], ["a"]]]]  # two shards
    manifest = write_shard_dir(
        str(tmp_path), {"train": train, "heldout": heldout}, VOCAB, score_heldout=scored
    )
    # targets a, <UNK>, </S> | b, </S>, a, </S>
    by_hand = (11**7 / (4 * 2 * 3 * 2 * 3 * 4 * 3)) ** (1 / 7)
    assert (manifest.unigram_perplexity is not None) == scored
    assert heldout_unigram_perplexity(manifest) == pytest.approx(by_hand, rel=1e-12)


def test_counts_file_out_of_order_is_an_error(tmp_path):
    write_shard_dir(
        str(tmp_path), {"train": [[[["a", "b"]]]], "heldout": [[[["a"]]]]}, VOCAB, score_heldout=False
    )
    manifest = read_manifest(str(tmp_path))
    (tmp_path / "vocab_counts.tsv").write_text("<S>\t0\n</S>\t0\n<UNK>\t0\nb\t1\na\t1\n")
    with pytest.raises(shard_format.FormatError, match="tokens differ from vocab.txt"):
        heldout_unigram_perplexity(manifest)
