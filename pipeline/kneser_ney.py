"""An interpolated modified Kneser-Ney n-gram model: the held-out baseline that says what a biLM
perplexity is worth (docs/training.md#baselines).

The model is Chen & Goodman's (1998) interpolated modified Kneser-Ney, as KenLM and SRILM's
``-interpolate -kndiscount`` estimate it:

- The sentences are ``<S> w1 .. wL </S>`` with the vocabulary's ids (OOV words already ``<UNK>``),
  and the targets are exactly the forward LM's: every word and one ``</S>`` per sentence, each
  with the longest history the sentence gives it, up to N - 1 words (``<S>`` included).
- Adjusted counts: the highest order counts its n-grams; a lower order n counts, for each
  n-gram, the distinct words seen before it (its continuation count), except for n-grams that
  begin with ``<S>``, which nothing precedes: they keep their own count.
- Discounts per order from the counts of counts of its adjusted counts n1..n4:
  ``Y = n1 / (n1 + 2 n2)``, ``D_k = k - (k + 1) Y n_{k+1} / n_k`` for k = 1, 2, 3 (3 meaning 3 or
  more), each kept in [0, k] (a small corpus can push them out).
- ``p_n(w | h) = (a(hw) - D(a(hw))) / a(h.) + gamma(h) p_{n-1}(w | h')`` with ``h'`` the history
  without its first word and ``gamma(h) = (D_1 N_1(h.) + D_2 N_2(h.) + D_3 N_3+(h.)) / a(h.)``; a
  history never seen as a context gives its mass to the lower order whole. The unigram is
  interpolated with the uniform distribution over the V - 1 targets (every vocabulary entry but
  ``<S>``), so every target, ``<UNK>`` and words that never occur in training included, has a
  finite cost, and each distribution sums to 1.

Every order's n-grams are kept as a trie in sorted int64 keys: an n-gram's key is ``index of its
first n - 1 words among the order n - 1 n-grams * V + its last word``, so a lookup is a binary
search (``np.searchsorted``) over all targets at once, with no loop over sentences.

Counting splits across processes: :func:`count_ngrams` counts one part of the training split
(in columns of word ids), :func:`merge_counts` adds two parts, :func:`build` estimates the model
from the whole, :meth:`KneserNey.score` gives the summed cost of held-out sentences. Memory, per
n-gram kept: 4 bytes a word plus 8 of count while counting (the order-N table and the short
sentence-start tables); about 24 while estimating and scoring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.errors import PipelineError
from pipeline.shard_format import BOS_ID, EOS_ID

MAX_ORDER = 5


class BaselineError(PipelineError, ValueError):
    """Counts or a manifest's baseline record that cannot serve as the Kneser-Ney baseline."""


@dataclass(frozen=True)
class NgramCounts:
    """Raw n-gram counts of a part of the training split.

    ``order``: N. ``top``: every order-N window of the padded sentences, ``(N, m)`` uint32 word
    ids in columns, unique and sorted lexicographically, with int64 counts ``(m,)``. ``starts[k]``
    (k = 0 .. N - 3): the order k + 2 n-grams that begin at a sentence's ``<S>`` (the windows a
    short history leaves below order N), ``(k + 2, m_k)`` and ``(m_k,)`` likewise. ``tokens``:
    the words and sentence ends counted (the targets), which weighs parts for merging.
    """

    order: int
    top: tuple[np.ndarray, np.ndarray]
    starts: tuple[tuple[np.ndarray, np.ndarray], ...]
    tokens: int

    @property
    def nbytes(self) -> int:
        tables = [self.top, *self.starts]
        return sum(cols.nbytes + counts.nbytes for cols, counts in tables)


def _padded(ids: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``<S> w1 .. wL </S>`` for every sentence, concatenated: ``(seq, pos)``, both int64
    ``(sum(lengths) + 2 S,)``; ``pos``: each element's position in its sentence (``<S>`` is 0)."""
    ids = np.asarray(ids, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.sum() != ids.shape[0]:
        raise BaselineError(f"kneser-ney: {ids.shape[0]} ids for sentences of {int(lengths.sum())} tokens")
    spans = lengths + 2
    starts = np.concatenate(([0], np.cumsum(spans)[:-1])).astype(np.int64)
    pos = np.arange(int(spans.sum()), dtype=np.int64) - np.repeat(starts, spans)
    seq = np.full(pos.shape[0], EOS_ID, dtype=np.int64)
    seq[starts] = BOS_ID
    is_word = (pos > 0) & (pos <= np.repeat(lengths, spans))
    seq[is_word] = ids
    return seq, pos


def _unique_rows(cols: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``cols[:, i]`` made unique and sorted lexicographically, their counts summed."""
    if cols.shape[1] == 0:
        return cols, counts
    order = np.lexsort(cols[::-1])  # the first word is the primary key
    cols, counts = cols[:, order], counts[order]
    change = np.empty(cols.shape[1], dtype=bool)
    change[0] = True
    np.any(cols[:, 1:] != cols[:, :-1], axis=0, out=change[1:])
    first = np.flatnonzero(change)
    return np.ascontiguousarray(cols[:, first]), np.add.reduceat(counts, first)


def _windows(seq: np.ndarray, ends: np.ndarray, n: int) -> np.ndarray:
    """The order-n windows ending at ``ends``: ``(n, len(ends))`` uint32."""
    return np.stack([seq[ends - (n - 1) + c] for c in range(n)]).astype(np.uint32)


def count_ngrams(ids: np.ndarray, lengths: np.ndarray, order: int) -> NgramCounts:
    """Count the n-grams of sentences: ``ids`` int ``(sum(lengths),)``, ``lengths`` int ``(S,)``."""
    if not 2 <= order <= MAX_ORDER:
        raise BaselineError(f"kneser-ney: order {order} is not in 2..{MAX_ORDER}")
    seq, pos = _padded(ids, lengths)
    ends = np.flatnonzero(pos >= order - 1)
    top = _unique_rows(_windows(seq, ends, order), np.ones(ends.shape[0], dtype=np.int64))
    starts = []
    for n in range(2, order):
        ends = np.flatnonzero(pos == n - 1)
        starts.append(_unique_rows(_windows(seq, ends, n), np.ones(ends.shape[0], dtype=np.int64)))
    targets = int(np.asarray(lengths).sum()) + len(lengths)
    return NgramCounts(order, top, tuple(starts), targets)


def _merge_tables(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]):
    return _unique_rows(np.concatenate((a[0], b[0]), axis=1), np.concatenate((a[1], b[1])))


def merge_counts(a: NgramCounts, b: NgramCounts) -> NgramCounts:
    """The counts of two parts together."""
    if a.order != b.order:
        raise BaselineError(f"kneser-ney: cannot merge counts of order {a.order} and {b.order}")
    starts = tuple(_merge_tables(x, y) for x, y in zip(a.starts, b.starts, strict=True))
    return NgramCounts(a.order, _merge_tables(a.top, b.top), starts, a.tokens + b.tokens)


def _discounts(adjusted: np.ndarray) -> np.ndarray:
    """``[0, D_1, D_2, D_3+]`` float64 (indexed by min(count, 3)) from one order's adjusted counts."""
    n = np.bincount(np.minimum(adjusted, 5), minlength=5)[1:5].astype(np.float64)  # n1..n4
    y = n[0] / (n[0] + 2 * n[1]) if n[0] + 2 * n[1] > 0 else 0.0
    d = np.zeros(4)
    for k in (1, 2, 3):
        raw = k - (k + 1) * y * n[k] / n[k - 1] if n[k - 1] > 0 else 0.5 * k
        d[k] = min(max(raw, 0.0), float(k))
    return d


@dataclass(frozen=True)
class _Order:
    """One order n >= 2 of the trie. ``keys``: int64 ``(m,)`` sorted n-gram keys (context index *
    V + word); ``own``: float64 ``(m,)``, each n-gram's discounted share ``(a - D) / a(h.)``;
    ``contexts``: int64 ``(c,)`` sorted indices (among order n - 1) of the histories seen;
    ``gamma``: float64 ``(c,)``, the mass each of them leaves to order n - 1."""

    keys: np.ndarray
    own: np.ndarray
    contexts: np.ndarray
    gamma: np.ndarray
    discounts: np.ndarray


def _lookup(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Index of each of ``keys`` in ``sorted_keys``, or -1 where absent: int64 like ``keys``."""
    if sorted_keys.shape[0] == 0:
        return np.full(keys.shape, -1, dtype=np.int64)
    at = np.searchsorted(sorted_keys, keys)
    at_clipped = np.minimum(at, sorted_keys.shape[0] - 1)
    return np.where(sorted_keys[at_clipped] == keys, at_clipped, -1)


@dataclass(frozen=True)
class KneserNey:
    """The estimated model. ``unigram``: float64 ``(V,)``, p_1 of every target (``<S>``: 0);
    ``unigram_counts``: int64 ``(V,)``, their adjusted counts; ``orders[k]``: order k + 2."""

    vocab_size: int
    unigram: np.ndarray
    unigram_counts: np.ndarray
    unigram_discounts: np.ndarray
    orders: tuple[_Order, ...]

    @property
    def order(self) -> int:
        return len(self.orders) + 1

    @property
    def ngrams(self) -> list[int]:
        """The n-grams kept per order, 1 .. N (order 1: the targets seen in training)."""
        return [int((self.unigram_counts > 0).sum()), *(int(o.keys.shape[0]) for o in self.orders)]

    def _index(self, n: int, previous: np.ndarray, words: np.ndarray) -> np.ndarray:
        """Trie index among order n of the n-grams (order n - 1 index ``previous``, then ``words``),
        -1 where absent or where ``previous`` is -1."""
        if n == 1:
            return words.copy()
        keys = previous * self.vocab_size + words
        found = _lookup(self.orders[n - 2].keys, keys)
        return np.where(previous >= 0, found, -1)

    def _probabilities(self, words: np.ndarray, histories: list[np.ndarray]) -> np.ndarray:
        """p(words | histories): float64 like ``words``; ``histories[k]``: the order k + 1 index of
        each word's history of k + 1 words (-1 where it has fewer or that history was never seen)."""
        p = self.unigram[words]
        for n in range(2, self.order + 1):
            level, history = self.orders[n - 2], histories[n - 2]
            at = _lookup(level.contexts, history)
            seen = (history >= 0) & (at >= 0)
            if not seen.any():
                continue
            own = _lookup(level.keys, history[seen] * self.vocab_size + words[seen])
            share = np.where(own >= 0, level.own[np.maximum(own, 0)], 0.0)
            p[seen] = share + level.gamma[at[seen]] * p[seen]
        return p

    def distribution(self, history: list[int]) -> np.ndarray:
        """p(w | history) for every vocabulary entry w: float64 ``(V,)`` (``<S>``: 0). ``history``:
        word ids, oldest first, ``<S>`` first when the history starts a sentence."""
        words = np.arange(self.vocab_size, dtype=np.int64)
        recent = [int(w) for w in history][-(self.order - 1) :] if self.order > 1 else []
        histories = []
        index = np.full(1, -1, dtype=np.int64)
        for k in range(1, self.order):
            if k <= len(recent):
                chain = np.full(1, -1, dtype=np.int64)
                for n, word in enumerate(recent[-k:], start=1):
                    chain = self._index(n, chain, np.full(1, word, dtype=np.int64))
                index = chain
            else:
                index = np.full(1, -1, dtype=np.int64)
            histories.append(np.repeat(index, self.vocab_size))
        return self._probabilities(words, histories)

    def score(self, ids: np.ndarray, lengths: np.ndarray) -> tuple[float, int]:
        """``(-sum ln p, targets)`` over the forward targets of sentences given as for
        :func:`count_ngrams`."""
        seq, pos = _padded(ids, lengths)
        if seq.size and (seq.min() < 0 or seq.max() >= self.vocab_size):
            raise BaselineError(f"kneser-ney: word ids outside the vocabulary of {self.vocab_size}")
        # ending[k]: order k + 1 trie index of the n-gram ending at each position (-1: none)
        ending = [seq.copy()]
        for n in range(2, self.order):
            previous = np.concatenate(([-1], ending[-1][:-1]))
            previous = np.where(pos >= n - 1, previous, -1)
            ending.append(self._index(n, previous, seq))
        targets = np.flatnonzero(pos >= 1)
        histories = [
            np.where(pos[targets] >= k, ending[k - 1][targets - 1], -1) for k in range(1, self.order)
        ]
        p = self._probabilities(seq[targets], histories)
        return float(-np.log(p).sum()), int(targets.shape[0])


def _adjusted_orders(counts: NgramCounts) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per order 1 .. N, the n-grams (columns, sorted) with their adjusted counts."""
    tables = [counts.top]
    for n in range(counts.order - 1, 0, -1):
        higher_cols = tables[0][0]
        suffix = (higher_cols[1:], np.ones(higher_cols.shape[1], dtype=np.int64))
        merged = _unique_rows(*suffix)
        if n >= 2:
            merged = _merge_tables(merged, counts.starts[n - 2])
        tables.insert(0, merged)
    return tables


def build(counts: NgramCounts, vocab_size: int) -> KneserNey:
    """Estimate the model from the training split's merged counts (word ids < ``vocab_size``)."""
    if counts.top[0].shape[1] == 0:
        raise BaselineError("kneser-ney: no n-grams counted")
    if int(counts.top[0].max()) >= vocab_size:
        raise BaselineError(f"kneser-ney: word ids outside the vocabulary of {vocab_size}")
    tables = _adjusted_orders(counts)
    if max(t[1].shape[0] for t in tables) * vocab_size >= 2**62:
        raise BaselineError(
            f"kneser-ney: {counts.top[0].shape[1]:,} n-grams of {vocab_size:,} words overflow its keys"
        )
    uni_cols, uni_counts = tables[0]
    adjusted = np.zeros(vocab_size, dtype=np.int64)
    adjusted[uni_cols[0].astype(np.int64)] = uni_counts
    adjusted[BOS_ID] = 0
    d1 = _discounts(adjusted[adjusted > 0])
    total = adjusted.sum()
    mass = d1[np.minimum(adjusted, 3)] * (adjusted > 0)
    unigram = (adjusted - mass) / total + mass.sum() / total / (vocab_size - 1)
    unigram[BOS_ID] = 0.0
    orders: list[_Order] = []
    for n in range(2, counts.order + 1):
        cols, a = tables[n - 1]
        context = cols[0].astype(np.int64)
        for k in range(2, n):  # the history's index among order k, word by word
            context = _lookup(orders[k - 2].keys, context * vocab_size + cols[k - 1])
        if (context < 0).any():
            raise BaselineError(f"kneser-ney: order-{n} n-grams whose history was not counted")
        keys = context * vocab_size + cols[n - 1]
        d = _discounts(a)
        first = np.flatnonzero(np.concatenate(([True], context[1:] != context[:-1])))
        totals = np.add.reduceat(a, first).astype(np.float64)
        taken = d[np.minimum(a, 3)]
        gamma = np.add.reduceat(taken, first) / totals
        group = np.repeat(np.arange(first.shape[0]), np.diff(np.append(first, a.shape[0])))
        own = (a - taken) / totals[group]
        orders.append(_Order(keys, own, context[first], gamma, d))
    return KneserNey(vocab_size, unigram, adjusted, d1, tuple(orders))


def perplexity(nll: float, targets: int) -> float:
    return math.exp(nll / targets)


def manifest_kneser_ney(manifest: dict, where: str) -> dict | None:
    """The Kneser-Ney record of a shard manifest's ``baselines`` (``order``, ``perplexity``,
    ``targets``, ...), checked; None when its shard stage counted none (turned off, nothing held
    out, or a manifest from before the baseline). ``where``: the manifest, for the error."""
    baselines = manifest.get("baselines", {})
    record = baselines.get("kneser_ney") if isinstance(baselines, dict) else "?"
    if record is None:
        return None
    ok = isinstance(record, dict)
    order, ppl, targets = (record.get(k) for k in ("order", "perplexity", "targets")) if ok else (0, 0, 0)
    if not (
        type(order) is int
        and 2 <= order <= MAX_ORDER
        and isinstance(ppl, int | float)
        and math.isfinite(ppl)
        and ppl >= 1.0
        and type(targets) is int
        and targets > 0
    ):
        raise BaselineError(
            f"manifest {where}: baselines.kneser_ney needs an order in 2..{MAX_ORDER}, a finite "
            "perplexity >= 1 and a positive count of targets"
        )
    return record
