"""The Kneser-Ney baseline against a plain reference written from the formulas, on small corpora."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from pipeline.formats import kneser_ney
from pipeline.formats.kneser_ney import BaselineError, build, count_ngrams, merge_counts
from pipeline.formats.shard_format import BOS_ID, EOS_ID

V = 90  # the 3 specials, <UNK> (2) among the words, and 87 words


def _corpus(seed: int, sentences: int) -> list[list[int]]:
    """Zipf-like words 2..V-1 (2 is <UNK>), lengths 0..7: enough repeats for every count of counts."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, V - 1)
    weights /= weights.sum()
    return [list(rng.choice(np.arange(2, V), size=rng.integers(0, 12), p=weights)) for _ in range(sentences)]


def _flat(sentences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([w for s in sentences for w in s], dtype=np.int32)
    return ids, np.array([len(s) for s in sentences], dtype=np.int32)


class Reference:
    """Interpolated modified Kneser-Ney from the definitions, with dictionaries."""

    def __init__(self, sentences: list[list[int]], order: int):
        self.order = order
        self.raw: Counter = Counter()
        for s in sentences:
            padded = [BOS_ID, *s, EOS_ID]
            for j in range(1, len(padded)):
                for n in range(1, min(order, j + 1) + 1):
                    self.raw[tuple(padded[j - n + 1 : j + 1])] += 1
        self.before: dict[tuple, set] = {}  # n-gram -> the words seen right before it
        for h in self.raw:
            if len(h) > 1:
                self.before.setdefault(h[1:], set()).add(h[0])
        self.adjusted = {g: self._adjusted(g) for g in self.raw}
        self.following: dict[tuple, dict[tuple, int]] = {}  # history -> its n-grams
        for g, a in self.adjusted.items():
            self.following.setdefault(g[:-1], {})[g] = a
        self.discounts = {n: self._discounts(n) for n in range(1, order + 1)}

    def _adjusted(self, g: tuple) -> int:
        if len(g) == self.order or g[0] == BOS_ID:
            return self.raw[g]
        return len(self.before.get(g, ()))

    def _discounts(self, n: int) -> list[float]:
        """Chen & Goodman's, or KenLM's fallback where they cannot be computed or leave [0, k]."""
        counts = Counter(a for g, a in self.adjusted.items() if len(g) == n)
        fallback = [0.0, 0.5, 1.0, 1.5]
        if not (counts[1] and counts[2] and counts[3]):
            return fallback
        y = counts[1] / (counts[1] + 2 * counts[2])
        d = [0.0] + [k - (k + 1) * y * counts[k + 1] / counts[k] for k in (1, 2, 3)]
        return d if all(0 <= d[k] <= k for k in (1, 2, 3)) else fallback

    def _d(self, n: int, a: int) -> float:
        return self.discounts[n][min(a, 3)]

    def prob(self, w: int, history: tuple) -> float:
        n = len(history) + 1
        continuations = self.following.get(history, {})
        if n == 1:
            total = sum(continuations.values())
            mass = sum(self._d(1, a) for a in continuations.values())
            own = max(continuations.get((w,), 0) - self._d(1, continuations.get((w,), 0)), 0)
            return 0.0 if w == BOS_ID else own / total + mass / total / (V - 1)
        lower = self.prob(w, history[1:])
        if not continuations:
            return lower
        total = sum(continuations.values())
        gamma = sum(self._d(n, a) for a in continuations.values()) / total
        a = continuations.get((*history, w), 0)
        return (a - self._d(n, a)) / total + gamma * lower

    def nll(self, sentences: list[list[int]]) -> tuple[float, int]:
        cost, targets = 0.0, 0
        for s in sentences:
            padded = [BOS_ID, *s, EOS_ID]
            for j in range(1, len(padded)):
                cost -= np.log(self.prob(padded[j], tuple(padded[max(0, j - self.order + 1) : j])))
                targets += 1
        return cost, targets


@pytest.mark.parametrize(("order", "parts"), [(2, 1), (3, 1), (3, 4), (4, 1), (5, 3)])
def test_distributions_match_the_reference_and_sum_to_one(order, parts):
    train = _corpus(0, 300)
    model = build(count_ngrams(*_flat(train), order), V, parts)
    ref = Reference(train, order)
    histories = {tuple([BOS_ID, *s][max(0, j - order + 1) : j]) for s in train for j in range(1, len(s) + 2)}
    histories |= {(BOS_ID,), (7,), (13, 13), (EOS_ID,), (5, 9, 2, 4)}  # unseen ones too
    for history in sorted(histories):
        p = model.distribution(list(history))
        expected = np.array([ref.prob(w, history[-(order - 1) :]) for w in range(V)])
        np.testing.assert_allclose(p, expected, rtol=1e-12, atol=1e-15, err_msg=f"history {history}")
        assert p.sum() == pytest.approx(1.0, abs=1e-12)
        assert p[BOS_ID] == 0.0 and (p[1:] > 0).all()


@pytest.mark.parametrize(("order", "parts"), [(2, 1), (3, 1), (3, 5), (5, 2)])
def test_heldout_cost_matches_the_reference(order, parts):
    train, heldout = _corpus(1, 300), _corpus(2, 40)
    model = build(count_ngrams(*_flat(train), order), V, parts)
    nll, targets = model.score(*_flat(heldout))
    expected_nll, expected_targets = Reference(train, order).nll(heldout)
    assert targets == expected_targets == sum(len(s) + 1 for s in heldout)
    assert nll == pytest.approx(expected_nll, rel=1e-12)


def test_counts_of_parts_merge_to_the_counts_of_the_whole():
    train = _corpus(3, 90)
    whole = count_ngrams(*_flat(train), 4)
    merged = merge_counts(
        merge_counts(count_ngrams(*_flat(train[:10]), 4), count_ngrams(*_flat(train[10:50]), 4)),
        count_ngrams(*_flat(train[50:]), 4),
    )
    assert merged.tokens == whole.tokens == sum(len(s) + 1 for s in train)
    for got, want in zip([merged.top, *merged.starts], [whole.top, *whole.starts], strict=True):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("order", [3, 4])  # 3 x 20 bits sort as one packed key; 4 x 20 by columns
def test_counts_are_in_the_tries_order_whatever_the_key_width(order):
    rng = np.random.default_rng(order)
    words = rng.choice(np.arange(3, 2**20), size=40)  # ids of a benchmark-sized vocabulary
    sentences = [list(rng.choice(words, size=rng.integers(0, 9))) for _ in range(300)]
    want: Counter = Counter()
    for s in sentences:
        padded = [BOS_ID, *s, EOS_ID]
        for end in range(order - 1, len(padded)):
            gram = padded[end - order + 1 : end + 1]
            want[(*gram[-2::-1], gram[-1])] += 1  # the previous word first, back to the first, then the last
    cols, counts = count_ngrams(*_flat(sentences), order).top
    assert [tuple(r) for r in cols.T.tolist()] == sorted(want)
    assert counts.tolist() == [want[k] for k in sorted(want)]
    halves = [count_ngrams(*_flat(sentences[a:b]), order) for a, b in ((0, 100), (100, 180), (180, 300))]
    merged = merge_counts(*halves)  # three sorted runs, one merge
    np.testing.assert_array_equal(merged.top[0], cols)
    np.testing.assert_array_equal(merged.top[1], counts)


def test_partitions_follow_the_corpus_size_alone():
    assert kneser_ney.parts_for(400_000, 3) == 1  # a small corpus: one
    assert kneser_ney.parts_for(14_388_204, 3) == 14  # one per million tokens, for the node's cores
    assert kneser_ney.parts_for(10**9, 3) == 150  # then as many as 768 MiB each needs
    assert kneser_ney.parts_for(10**9, 5) == 398


def test_a_higher_order_predicts_a_repetitive_corpus_better():
    # the same 40 sentences twice: held out, the order-3 model knows each continuation
    train = _corpus(4, 40) * 2
    heldout = train[:40]
    costs = [build(count_ngrams(*_flat(train), n), V).score(*_flat(heldout)) for n in (2, 3)]
    ppl2, ppl3 = (kneser_ney.perplexity(*c) for c in costs)
    assert ppl3 < ppl2 < V - 1


def test_bad_input_is_one_clear_error():
    with pytest.raises(BaselineError, match="order 6 is not in 2..5"):
        count_ngrams(np.zeros(3, np.int32), np.array([3]), 6)
    with pytest.raises(BaselineError, match="3 ids for sentences of 4 tokens"):
        count_ngrams(np.zeros(3, np.int32), np.array([4]), 3)
    counts = count_ngrams(np.array([5, 9], np.int32), np.array([2]), 3)
    with pytest.raises(BaselineError, match="outside the vocabulary of 8"):
        build(counts, 8)
    with pytest.raises(BaselineError, match="order 2 and 3"):
        merge_counts(count_ngrams(np.array([5], np.int32), np.array([1]), 2), counts)
    model = build(counts, 10)
    with pytest.raises(BaselineError, match="outside the vocabulary of 10"):
        model.score(np.array([12], np.int32), np.array([1]))
