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
  more); where a count of counts is 0 or a D_k falls outside [0, k] (a small or odd corpus), the
  order takes KenLM's fallback discounts, 0.5, 1 and 1.5.
- ``p_n(w | h) = (a(hw) - D(a(hw))) / a(h.) + gamma(h) p_{n-1}(w | h')`` with ``h'`` the history
  without its first word and ``gamma(h) = (D_1 N_1(h.) + D_2 N_2(h.) + D_3 N_3+(h.)) / a(h.)``; a
  history never seen as a context gives its mass to the lower order whole. The unigram is
  interpolated with the uniform distribution over the V - 1 targets (every vocabulary entry but
  ``<S>``), so every target, ``<UNK>`` and words that never occur in training included, has a
  finite cost, and each distribution sums to 1.

**Partitions.** Everything above order 1 about a target depends on n-grams whose second-to-last
word is the target's previous word: its histories all end with that word, and so do the
(n+1)-grams whose left words make its continuation counts. So the n-grams of order 2 and up split
into ``parts`` partitions by that word (id mod ``parts``), each estimated and scored on its own,
and only the unigram (summed continuation counts) and the discounts (summed counts of counts) are
global. A partition's memory is about 1 / ``parts`` of the whole (``parts_for`` picks enough of
them for a task to stay under ``PART_BYTES``); the model is the same for any number of them.

**Steps**, each a function a Ray task can run (pipeline/shard/baseline.py):
:func:`count_ngrams` (a part of the training split) -> :func:`split_counts` -> :func:`merge_counts`
(the parts of one partition, in one k-way merge) -> :func:`adjust` (a partition's adjusted counts and its share of the
global statistics) -> :func:`global_statistics` (all partitions' shares) -> :func:`estimate` (a
partition's model) -> :meth:`PartModel.probabilities`. :func:`build` runs them in one process.

Histories are kept as a trie read from the right: a history's key is ``index of the history
without its first word * V + that first word``, and an n-gram's key is ``index of its history * V
+ its word``, all in sorted int64 arrays, so every lookup is a binary search (``np.searchsorted``)
over all targets at once, with no loop over sentences. The counts are kept in the trie's own order
from the start (:data:`Table`), so estimating a partition sorts nothing: its histories are the runs
of its sorted rows.

**Memory.** Rows sort as one packed uint64 key wherever the order's words fit 64 bits (order 3 of a
vocabulary up to 2^21 words), else by columns; every step holds its partition's tables and a few
arrays as long, so a task's memory follows the partition's size (the shard stage keeps the rest on
storage as sorted runs: pipeline/shard/baseline.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.errors import PipelineError
from pipeline.formats.shard_format import BOS_ID, EOS_ID, KNESER_NEY_MAX_ORDER

MAX_ORDER = KNESER_NEY_MAX_ORDER
PART_BYTES = 768 << 20
"""Largest memory a partition's task aims at: two run at once per two cores beside the shard
stage's object store, within the stage's 12 GiB at 800M tokens (docs/training.md#baselines)."""
BYTES_PER_TOKEN = {2: 60, 3: 120, 4: 220, 5: 320}
"""Peak memory of a partition's merge, adjust or estimate per training token it holds, on the
synthetic corpus (docs/benchmarks.md#scale), whose words are drawn independently: about twice the
distinct n-grams per token of real text, so an upper bound for it. Order 3 measured at 100M tokens
(118 bytes), the others scaled from the ratios measured on real text."""
MIN_PART_TOKENS = 1_000_000
"""Below this many training tokens per partition, fewer partitions (a small corpus: one)."""
MAX_SPREAD_PARTS = 16
"""Partitions for parallelism alone (a node's cores), before memory asks for more."""


class BaselineError(PipelineError, ValueError):
    """Counts or a manifest's baseline record that cannot serve as the Kneser-Ney baseline."""


Table = tuple[np.ndarray, np.ndarray]
"""n-grams of one order: uint32 word ids in columns ``(n, m)``, in the trie's order (for the n-gram
``w1 .. wn``: ``w(n-1), w(n-2), .., w1, wn``, the previous word first and the predicted word last),
unique and sorted lexicographically in that order, with their int64 counts ``(m,)``. Sorted so, an
order's rows come grouped by history in the order of the history's trie key, and the first column
is the partition's word."""


@dataclass(frozen=True)
class NgramCounts:
    """Raw n-gram counts of a part of the training split (or of one partition of it).

    ``order``: N. ``top``: every order-N window of the padded sentences. ``starts[k]`` (k = 0 ..
    N - 3): the order k + 2 n-grams that begin at a sentence's ``<S>`` (the windows a short
    history leaves below order N). ``tokens``: the targets counted (words and sentence ends),
    which weighs parts for merging.
    """

    order: int
    top: Table
    starts: tuple[Table, ...]
    tokens: int

    @property
    def nbytes(self) -> int:
        return sum(cols.nbytes + counts.nbytes for cols, counts in (self.top, *self.starts))


def parts_for(train_tokens: int, order: int) -> int:
    """Partitions for a training split: enough for parallelism, and for each to fit ``PART_BYTES``.
    It depends on the corpus alone, so the manifest is the same for any number of workers."""
    spread = min(MAX_SPREAD_PARTS, train_tokens // MIN_PART_TOKENS)
    return max(1, spread, -(-train_tokens * BYTES_PER_TOKEN[order] // PART_BYTES))


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
    seq[(pos > 0) & (pos <= np.repeat(lengths, spans))] = ids
    return seq, pos


def pack_rows(cols: np.ndarray, bits: int) -> np.ndarray:
    """Rows as one uint64 key each, the first column most significant: ``(m,)``."""
    key = cols[0].astype(np.uint64)
    for c in range(1, cols.shape[0]):
        key <<= np.uint64(bits)
        key |= cols[c]
    return key


def unpack_rows(key: np.ndarray, n: int, bits: int) -> np.ndarray:
    """The rows of :func:`pack_rows`'s keys: uint32 ``(n, m)``."""
    cols = np.empty((n, key.shape[0]), dtype=np.uint32)
    mask = np.uint64((1 << bits) - 1)
    for c in range(n - 1, -1, -1):
        cols[c] = key & mask
        if c:
            key = key >> np.uint64(bits)
    return cols


def word_bits(cols: np.ndarray) -> int:
    """Bits a word id of ``cols`` needs (at least 1)."""
    return max(int(cols.max()).bit_length(), 1) if cols.size else 1


def _unique_rows(cols: np.ndarray, counts: np.ndarray | None) -> Table:
    """Rows ``cols[:, i]`` made unique and sorted lexicographically, their counts summed
    (``counts`` None: one each). Rows that fit 64 bits sort as one packed key each: a plain sort
    where every row counts one, else a stable one (sorted runs, as a merge gives, cost about one
    pass); others by columns."""
    n, m = cols.shape
    if m == 0:
        return cols, np.zeros(0, dtype=np.int64) if counts is None else counts
    bits = word_bits(cols)
    if n * bits <= 64:
        key = pack_rows(cols, bits)
        if counts is None:
            key.sort()
        else:
            order = np.argsort(key, kind="stable")
            key, counts = key[order], counts[order]
        change = np.concatenate(([True], key[1:] != key[:-1]))
        first = np.flatnonzero(change)
        unique = unpack_rows(key[first], n, bits)
    else:
        order = np.lexsort(cols[::-1])  # the first column is the primary key
        ordered = cols[:, order]
        change = np.concatenate(([True], np.any(ordered[:, 1:] != ordered[:, :-1], axis=0)))
        first = np.flatnonzero(change)
        unique = np.ascontiguousarray(ordered[:, first])
        counts = None if counts is None else counts[order]
    if counts is None:
        return unique, np.diff(np.append(first, m)).astype(np.int64)
    return unique, np.add.reduceat(counts, first).astype(np.int64)


def _trie_rows(seq: np.ndarray, ends: np.ndarray, n: int) -> np.ndarray:
    """The order-n windows ending at ``ends``, as :data:`Table` rows: ``(n, len(ends))`` uint32."""
    offsets = [*range(1, n), 0]  # the word before the last, then further back, then the last
    return np.stack([seq[ends - k] for k in offsets]).astype(np.uint32)


def count_ngrams(ids: np.ndarray, lengths: np.ndarray, order: int) -> NgramCounts:
    """Count the n-grams of sentences: ``ids`` int ``(sum(lengths),)``, ``lengths`` int ``(S,)``."""
    if not 2 <= order <= MAX_ORDER:
        raise BaselineError(f"kneser-ney: order {order} is not in 2..{MAX_ORDER}")
    seq, pos = _padded(ids, lengths)
    tables = []
    for n, ends in [(order, np.flatnonzero(pos >= order - 1))] + [
        (n, np.flatnonzero(pos == n - 1)) for n in range(2, order)
    ]:
        tables.append(_unique_rows(_trie_rows(seq, ends, n), None))
    return NgramCounts(order, tables[0], tuple(tables[1:]), int(np.asarray(lengths).sum()) + len(lengths))


def _split_table(table: Table, parts: int) -> list[Table]:
    cols, counts = table
    part = cols[0] % parts  # the word before the last: a target's previous word
    order = np.argsort(part, kind="stable")  # stable: each partition stays sorted
    bounds = np.concatenate(([0], np.cumsum(np.bincount(part, minlength=parts))))
    return [(cols[:, order[a:b]], counts[order[a:b]]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def split_counts(counts: NgramCounts, parts: int) -> list[NgramCounts]:
    """The counts of each partition (``tokens``: the part's, shared out by n-grams kept)."""
    tops = _split_table(counts.top, parts)
    starts = [_split_table(t, parts) for t in counts.starts]
    total = max(counts.top[1].shape[0], 1)
    return [
        NgramCounts(
            counts.order,
            tops[p],
            tuple(s[p] for s in starts),
            counts.tokens * tops[p][1].shape[0] // total,
        )
        for p in range(parts)
    ]


def merge_runs(runs: list[Table]) -> Table:
    """Sorted tables of one order as one (rows in several of them: their counts summed): one stable
    sort of their concatenation, which finds the sorted runs and merges them. The list is emptied
    once they are concatenated, so that a caller holding no other reference to them frees them
    before the sort (a partition's peak)."""
    cols = np.concatenate([t[0] for t in runs], axis=1)
    counts = np.concatenate([t[1] for t in runs])
    runs.clear()
    return _unique_rows(cols, counts)


def merge_counts(*parts: NgramCounts) -> NgramCounts:
    """The counts of several parts together (a k-way merge of their sorted tables)."""
    orders = sorted({p.order for p in parts})
    if len(orders) != 1:
        raise BaselineError(f"kneser-ney: cannot merge counts of order {' and '.join(map(str, orders))}")
    starts = tuple(merge_runs([p.starts[k] for p in parts]) for k in range(orders[0] - 2))
    return NgramCounts(orders[0], merge_runs([p.top for p in parts]), starts, sum(p.tokens for p in parts))


@dataclass(frozen=True)
class Adjusted:
    """A partition's adjusted counts. ``tables[k]``: order k + 2. ``counts_of_counts``: int64
    ``(N - 1, 4)``, per order 2..N the n-grams with adjusted count 1, 2, 3 and 4. ``continuation``:
    int64 ``(V,)``, its share of the unigram's adjusted counts (the distinct words seen before each
    word, among its bigrams)."""

    tables: tuple[Table, ...]
    counts_of_counts: np.ndarray
    continuation: np.ndarray


def adjust(counts: NgramCounts, vocab_size: int) -> Adjusted:
    """A partition's adjusted counts (the whole, with one partition), per the module docstring."""
    if counts.top[0].size and int(counts.top[0].max()) >= vocab_size:
        raise BaselineError(f"kneser-ney: word ids outside the vocabulary of {vocab_size}")
    tables = [counts.top]
    for n in range(counts.order - 1, 1, -1):
        higher = tables[0][0]  # order n + 1: its column n - 1 is its first word
        continuations = _unique_rows(np.delete(higher, n - 1, axis=0), None)
        del higher
        tables.insert(0, merge_runs([continuations, counts.starts[n - 2]]))
    bigrams = tables[0][0]
    continuation = np.bincount(bigrams[1], minlength=vocab_size).astype(np.int64)
    counts_of_counts = np.stack([np.bincount(np.minimum(a, 5), minlength=6)[1:5] for _, a in tables])
    return Adjusted(tuple(tables), counts_of_counts.astype(np.int64), continuation)


FALLBACK_DISCOUNTS = (0.0, 0.5, 1.0, 1.5)
"""An order's discounts when its counts of counts cannot give them: KenLM's ``--discount_fallback``."""


def _discounts(n: np.ndarray) -> np.ndarray:
    """``[0, D_1, D_2, D_3+]`` float64 (indexed by min(count, 3)) from counts of counts n1..n4.

    As KenLM's ``lmplz`` estimates them: where any of n1..n3 is 0 or a discount falls outside
    [0, k] (a small or odd corpus), the whole order takes :data:`FALLBACK_DISCOUNTS`."""
    n = np.asarray(n, dtype=np.float64)
    if (n[:3] <= 0).any():  # n4 may be 0 (then D3+ = 3)
        return np.array(FALLBACK_DISCOUNTS)
    y = n[0] / (n[0] + 2 * n[1])
    d = np.zeros(4)
    for k in (1, 2, 3):
        d[k] = k - (k + 1) * y * n[k] / n[k - 1]
        if not 0.0 <= d[k] <= k:
            return np.array(FALLBACK_DISCOUNTS)
    return d


@dataclass(frozen=True)
class GlobalStatistics:
    """What every partition shares. ``unigram``: float64 ``(V,)``, p_1 of every target (``<S>``: 0);
    ``unigram_counts``: int64 ``(V,)``, its adjusted counts; ``discounts``: float64 ``(N, 4)``, per
    order 1..N ``[0, D_1, D_2, D_3+]``."""

    unigram: np.ndarray
    unigram_counts: np.ndarray
    discounts: np.ndarray


def global_statistics(shares: Sequence[Adjusted]) -> GlobalStatistics:
    """The unigram and the discounts from every partition's :class:`Adjusted` (any number)."""
    adjusted = np.sum([s.continuation for s in shares], axis=0)
    adjusted[BOS_ID] = 0
    vocab_size = adjusted.shape[0]
    counts_of_counts = np.sum([s.counts_of_counts for s in shares], axis=0)
    unigram_counts_of_counts = np.bincount(np.minimum(adjusted, 5), minlength=6)[1:5]
    d1 = _discounts(unigram_counts_of_counts)
    total = adjusted.sum()
    if total == 0:
        raise BaselineError("kneser-ney: no n-grams counted")
    mass = d1[np.minimum(adjusted, 3)] * (adjusted > 0)
    unigram = (adjusted - mass) / total + mass.sum() / total / (vocab_size - 1)
    unigram[BOS_ID] = 0.0
    discounts = np.stack([d1, *(_discounts(n) for n in counts_of_counts)])
    return GlobalStatistics(unigram, adjusted, discounts)


def sorted_lookup(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Index of each of ``keys`` in ``sorted_keys``, or -1 where absent: int64 like ``keys``."""
    if sorted_keys.shape[0] == 0:
        return np.full(keys.shape, -1, dtype=np.int64)
    at = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.shape[0] - 1)
    return np.where(sorted_keys[at] == keys, at, -1)


@dataclass(frozen=True)
class _Order:
    """Order n >= 2 of a partition. ``keys``: int64 ``(m,)`` sorted n-gram keys (history index *
    V + word); ``own``: float64 ``(m,)``, each n-gram's discounted share ``(a - D) / a(h.)``;
    ``gamma``: float64 ``(h,)``, the mass each history of n - 1 words leaves to order n - 1."""

    keys: np.ndarray
    own: np.ndarray
    gamma: np.ndarray


@dataclass(frozen=True)
class PartModel:
    """A partition's orders 2..N. ``histories[k]``: int64 sorted keys of its histories of k + 1
    words (k = 0: the words themselves); ``orders[k]``: order k + 2."""

    vocab_size: int
    histories: tuple[np.ndarray, ...]
    orders: tuple[_Order, ...]

    @property
    def ngrams(self) -> list[int]:
        return [int(o.keys.shape[0]) for o in self.orders]

    def probabilities(self, words: np.ndarray, previous: list[np.ndarray], lower: np.ndarray) -> np.ndarray:
        """p(words | histories): float64 like ``words`` (int64). ``previous[k]``: the word k + 1
        places before each (-1 where the sentence has none; ``previous[0]`` in this partition);
        ``lower``: their unigram probabilities."""
        p = lower.copy()
        history = sorted_lookup(self.histories[0], previous[0])
        for n, level in enumerate(self.orders, start=2):
            seen = history >= 0
            if not seen.any():
                break
            own = sorted_lookup(level.keys, history[seen] * self.vocab_size + words[seen])
            share = np.where(own >= 0, level.own[np.maximum(own, 0)], 0.0)
            p[seen] = share + level.gamma[history[seen]] * p[seen]
            if n <= len(self.orders):
                longer = history * self.vocab_size + previous[n - 1]
                found = sorted_lookup(self.histories[n - 1], longer)
                history = np.where(seen & (previous[n - 1] >= 0), found, -1)
        return p


def _history_keys(histories: list[np.ndarray], heads: np.ndarray, vocab_size: int) -> np.ndarray:
    """The trie keys of histories given as :data:`Table` columns ``heads`` (``(k, h)``: the previous
    word first, the oldest last), from the shorter ``histories`` already built: int64 ``(h,)``,
    ascending where ``heads`` are sorted."""
    keys = heads[0].astype(np.int64)
    for j in range(1, heads.shape[0]):
        index = sorted_lookup(histories[j - 1], keys)
        if (index < 0).any():
            raise BaselineError(f"kneser-ney: histories of {j} words that were not counted")
        keys = index * vocab_size + heads[j]
    return keys


def estimate(tables: Sequence[Table], statistics: GlobalStatistics) -> PartModel:
    """A partition's model from its adjusted counts (:attr:`Adjusted.tables`) and the global
    statistics. The tables are in the trie's order, so each order's histories are the runs of its
    first n - 1 columns, already in the order of their keys, and its n-gram keys come out sorted:
    nothing is sorted here. (Arrays as long as the table are updated in place: they set a
    partition task's peak memory.)"""
    vocab_size = statistics.unigram.shape[0]
    if max((a.shape[0] for _, a in tables), default=0) * vocab_size >= 2**62:
        raise BaselineError(f"kneser-ney: too many n-grams of {vocab_size:,} words for int64 keys")
    histories: list[np.ndarray] = []
    orders = []
    for n, (cols, a) in enumerate(tables, start=2):
        same = np.ones(max(cols.shape[1] - 1, 0), dtype=bool)
        for c in range(n - 1):  # a row starts a history where any of its history's words changes
            same &= cols[c, 1:] == cols[c, :-1]
        first = np.flatnonzero(np.concatenate(([True], ~same))[: cols.shape[1]])
        del same
        histories.append(_history_keys(histories, cols[: n - 1, first], vocab_size))
        history = np.repeat(
            np.arange(first.shape[0], dtype=np.int64), np.diff(np.append(first, cols.shape[1]))
        )
        taken = statistics.discounts[n - 1][np.minimum(a, 3)]
        totals = np.add.reduceat(a, first).astype(np.float64) if first.size else np.zeros(0)
        gamma = np.add.reduceat(taken, first) / totals if first.size else np.zeros(0)
        own = a.astype(np.float64)
        own -= taken
        del taken
        own /= totals[history]
        history *= vocab_size
        history += cols[n - 1]
        orders.append(_Order(history, own, gamma))  # the n-gram keys: history index * V + word
        del history, own
    return PartModel(vocab_size, tuple(histories), tuple(orders))


@dataclass(frozen=True)
class Targets:
    """The forward targets of sentences. ``words``: int64 ``(T,)``; ``previous[k]``: int64 ``(T,)``,
    the word k + 1 places before each (-1 where its sentence has none), k = 0 .. N - 2."""

    words: np.ndarray
    previous: list[np.ndarray]

    @classmethod
    def of(cls, ids: np.ndarray, lengths: np.ndarray, order: int, vocab_size: int) -> Targets:
        seq, pos = _padded(ids, lengths)
        if seq.size and (seq.min() < 0 or seq.max() >= vocab_size):
            raise BaselineError(f"kneser-ney: word ids outside the vocabulary of {vocab_size}")
        at = np.flatnonzero(pos >= 1)
        previous = [np.where(pos[at] >= k, seq[at - k], -1) for k in range(1, order)]
        return cls(seq[at], previous)

    def part(self, parts: int, p: int) -> Targets:
        """The targets whose previous word falls in partition ``p``."""
        mine = self.previous[0] % parts == p
        return Targets(self.words[mine], [w[mine] for w in self.previous])


def part_cost(model: PartModel, targets: Targets, statistics: GlobalStatistics) -> float:
    """``-sum ln p`` of a partition's targets."""
    p = model.probabilities(targets.words, targets.previous, statistics.unigram[targets.words])
    return float(-np.log(p).sum())


@dataclass(frozen=True)
class KneserNey:
    """The model in one process (tests, benchmarks, small corpora): the global statistics and
    every partition's model."""

    statistics: GlobalStatistics
    parts: tuple[PartModel, ...]

    @property
    def order(self) -> int:
        return self.statistics.discounts.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.statistics.unigram.shape[0]

    @property
    def ngrams(self) -> list[int]:
        """n-grams kept per order 1 .. N (order 1: the targets seen in training)."""
        per_order = np.sum([p.ngrams for p in self.parts], axis=0).tolist() if self.parts else []
        return [int((self.statistics.unigram_counts > 0).sum()), *per_order]

    def score(self, ids: np.ndarray, lengths: np.ndarray) -> tuple[float, int]:
        """``(-sum ln p, targets)`` over the forward targets of sentences given as for
        :func:`count_ngrams` (partition by partition, in their order)."""
        targets = Targets.of(ids, lengths, self.order, self.vocab_size)
        cost = sum(
            part_cost(model, targets.part(len(self.parts), p), self.statistics)
            for p, model in enumerate(self.parts)
        )
        return cost, int(targets.words.shape[0])

    def target_probabilities(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """p of each forward target of sentences given as for :func:`count_ngrams`, in their order
        (per sentence its words, then ``</S>``): float64 ``(T,)``. What KenLM's query module
        gives per word (as log10), for comparing the two models target by target."""
        targets = Targets.of(ids, lengths, self.order, self.vocab_size)
        p = np.empty(targets.words.shape[0], dtype=np.float64)
        for k, model in enumerate(self.parts):
            mine = targets.previous[0] % len(self.parts) == k
            words = targets.words[mine]
            p[mine] = model.probabilities(
                words, [w[mine] for w in targets.previous], self.statistics.unigram[words]
            )
        return p

    def distribution(self, history: list[int]) -> np.ndarray:
        """p(w | history) for every vocabulary entry w: float64 ``(V,)`` (``<S>``: 0). ``history``:
        word ids, oldest first, ``<S>`` first when the history starts a sentence."""
        words = np.arange(self.vocab_size, dtype=np.int64)
        if not history:
            return self.statistics.unigram.copy()
        recent = [int(w) for w in history][::-1]  # the previous word first
        previous = [
            np.full(self.vocab_size, recent[k] if k < len(recent) else -1) for k in range(self.order - 1)
        ]
        model = self.parts[recent[0] % len(self.parts)]
        return model.probabilities(words, previous, self.statistics.unigram)


def build(counts: NgramCounts, vocab_size: int, parts: int = 1) -> KneserNey:
    """Estimate the model from the training split's counts, in ``parts`` partitions."""
    adjusted = [adjust(c, vocab_size) for c in split_counts(counts, parts)]
    statistics = global_statistics(adjusted)
    return KneserNey(statistics, tuple(estimate(a.tables, statistics) for a in adjusted))


def perplexity(nll: float, targets: int) -> float:
    return math.exp(nll / targets)
