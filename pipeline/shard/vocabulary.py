"""The vocabulary: token counts of the training split -> ordered token list and id lookup.

Order (bilm-tf's format): ``<S>``, ``</S>``, ``<UNK>``, then descending count, ties broken by the
token's UTF-8 bytes ascending. Python compares strings by code point, and UTF-8 preserves code
point order, so sorting by ``(-count, token)`` is exactly that order, on any machine.

Counts come from the training split only, so held-out perplexity measures real generalisation
(a held-out-only word is ``<UNK>``). The specials' counts in ``vocab_counts.tsv`` are:
``<S>`` and ``</S>``: training sentences (each has one of each); ``<UNK>``: training tokens that
map to ``<UNK>`` (below ``min_count``, beyond ``max_size``). No corpus token is spelled like a
special: the counting pass refuses such a line (``errors.ReservedWordError``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import count as running
from itertools import repeat

import numpy as np

from pipeline.formats.shard_format import BOS, EOS, SPECIALS, UNK, encode_counts, encode_vocab


@dataclass(frozen=True)
class Vocabulary:
    """``tokens[i]`` has id ``i`` and training count ``counts[i]``."""

    tokens: list[str]
    counts: list[int]

    @property
    def size(self) -> int:
        return len(self.tokens)

    @cached_property
    def index(self) -> dict[str, int]:
        return {token: i for i, token in enumerate(self.tokens)}

    @cached_property
    def vocab_bytes(self) -> bytes:
        """Content of ``vocab.txt``."""
        return encode_vocab(self.tokens)

    @cached_property
    def counts_bytes(self) -> bytes:
        """Content of ``vocab_counts.tsv``."""
        return encode_counts(self.tokens, self.counts)

    @cached_property
    def sha256(self) -> str:
        """sha256 of ``vocab.txt``: identifies the id mapping."""
        return hashlib.sha256(self.vocab_bytes).hexdigest()


def build_vocabulary(
    counts: Mapping[str, int], num_sentences: int, min_count: int = 1, max_size: int = 0
) -> Vocabulary:
    """The vocabulary of a training split with token ``counts`` and ``num_sentences`` sentences.

    ``min_count``: drop tokens seen fewer times; ``max_size``: keep at most this many entries,
    specials included (0: no limit). Dropped tokens' occurrences are counted as ``<UNK>``.
    """
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    if max_size and max_size < len(SPECIALS):
        raise ValueError(f"max_size must be 0 or >= {len(SPECIALS)}, got {max_size}")
    special_counts = {BOS: num_sentences, EOS: num_sentences, UNK: 0}
    ordinary = []
    for token, count in counts.items():
        if token in special_counts:
            special_counts[token] += count
        else:
            ordinary.append((-count, token))
    ordinary.sort()
    limit = max_size - len(SPECIALS) if max_size else len(ordinary)
    kept = [(token, -neg) for neg, token in ordinary if -neg >= min_count][:limit]
    dropped = sum(-neg for neg, _ in ordinary) - sum(c for _, c in kept)
    special_counts[UNK] += dropped
    tokens = list(SPECIALS) + [t for t, _ in kept]
    return Vocabulary(tokens=tokens, counts=[special_counts[s] for s in SPECIALS] + [c for _, c in kept])


def local_vocabulary(tokens: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """A chunk's tokens ``(T,)`` -> its local vocabulary (distinct tokens in order of first
    occurrence, ``(L,)``) and each token's index in it: int32 ``(T,)``."""
    first: dict[str, int] = {}
    # One dictionary operation per token, in C (map over setdefault): each token maps to the
    # position of its first occurrence. Numpy then renumbers those positions 0..L-1.
    positions = np.fromiter(map(first.setdefault, tokens, running()), dtype=np.int64, count=len(tokens))
    renumber = np.zeros(len(tokens), dtype=np.int32)
    renumber[np.fromiter(first.values(), dtype=np.int64, count=len(first))] = np.arange(
        len(first), dtype=np.int32
    )
    return list(first), renumber[positions]


def local_counts(vocab: Sequence[str], ids: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Occurrences of local-vocabulary tokens among ``ids`` int ``(T,)``: the K distinct tokens
    that occur (in local order) and their counts, int64 ``(K,)`` (for :meth:`TokenCounts.add`)."""
    counts = np.bincount(ids, minlength=len(vocab))
    present = np.flatnonzero(counts)
    return [vocab[i] for i in present.tolist()], counts[present]


class TokenCounts(Mapping[str, int]):
    """Token -> count, summed over chunks: the driver's side of the counting pass.

    Stored as token -> slot (a dict) and the counts per slot (an int64 array), so that adding a
    chunk's counts is a few C-level passes (one lookup per token, one numpy scatter-add) rather
    than a Python loop per distinct token: on a 2-core machine the driver's merge competes with
    the workers for CPU.
    """

    def __init__(self) -> None:
        self._slots: dict[str, int] = {}
        self._counts = np.zeros(0, dtype=np.int64)

    def add(self, tokens: Sequence[str], counts: np.ndarray) -> None:
        """Add ``counts`` int ``(K,)`` of ``tokens`` ``(K,)``."""
        slots = np.fromiter(map(self._slots.get, tokens, repeat(-1)), dtype=np.int64, count=len(tokens))
        new = np.flatnonzero(slots < 0)
        if new.size:
            start = len(self._slots)
            fresh = list(dict.fromkeys(tokens[i] for i in new.tolist()))  # a token twice: one slot
            self._slots.update(zip(fresh, range(start, start + len(fresh)), strict=True))
            slots[new] = np.fromiter(
                map(self._slots.__getitem__, (tokens[i] for i in new.tolist())),
                dtype=np.int64,
                count=new.size,
            )
            if len(self._slots) > len(self._counts):
                grown = np.zeros(max(2 * len(self._counts), len(self._slots)), dtype=np.int64)
                grown[: len(self._counts)] = self._counts
                self._counts = grown
        np.add.at(self._counts, slots, np.asarray(counts, dtype=np.int64))

    def present(self) -> int:
        """Tokens counted more than 0 times (a deduplicating run takes counts off again)."""
        return int((self._counts[: len(self._slots)] > 0).sum())

    def __getitem__(self, token: str) -> int:
        return int(self._counts[self._slots[token]])

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)

    def items(self) -> Iterator[tuple[str, int]]:  # type: ignore[override]
        """``(token, count)`` pairs without a lookup per token."""
        return zip(self._slots, self._counts[: len(self._slots)].tolist(), strict=True)


def global_ids(vocab: Sequence[str], index: Mapping[str, int]) -> np.ndarray:
    """Vocabulary ids of local-vocabulary tokens: int32 ``(L,)``, unknown tokens -> ``<UNK>``.
    Gathering it with a chunk's local ids gives the chunk's vocabulary ids."""
    return np.fromiter(map(index.get, vocab, repeat(index[UNK])), dtype=np.int32, count=len(vocab))
