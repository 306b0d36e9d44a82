"""The vocabulary: token counts of the training split -> ordered token list and id lookup.

Order (bilm-tf's format): ``<S>``, ``</S>``, ``<UNK>``, then descending count, ties broken by the
token's UTF-8 bytes ascending. Python compares strings by code point, and UTF-8 preserves code
point order, so sorting by ``(-count, token)`` is exactly that order, on any machine.

Counts come from the training split only, so held-out perplexity measures real generalisation
(a held-out-only word is ``<UNK>``). The specials' counts in ``vocab_counts.tsv`` are:
``<S>`` and ``</S>``: training sentences (each has one of each); ``<UNK>``: training tokens that
map to ``<UNK>`` (below ``min_count``, beyond ``max_size``). A corpus token spelled like a special
is counted into that special and maps to its id.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, repeat

import numpy as np

from pipeline.shard.format import BOS, EOS, SPECIALS, UNK, encode_counts, encode_vocab


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


def count_tokens(sentences: Iterable[Sequence[str]]) -> Counter:
    """Token -> occurrences over ``sentences``."""
    counts: Counter = Counter()
    for tokens in sentences:
        counts.update(tokens)
    return counts


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


def encode_ids(sentences: Sequence[Sequence[str]], index: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Vocabulary ids of ``sentences``: ``ids`` int32 ``(total_tokens,)`` (concatenated, unknown
    tokens -> ``<UNK>``) and ``lengths`` int32 ``(len(sentences),)``."""
    lengths = np.fromiter(map(len, sentences), dtype=np.int32, count=len(sentences))
    # map() over C-level iterators: no Python frame per token
    tokens = chain.from_iterable(sentences)
    ids = np.fromiter(map(index.get, tokens, repeat(index[UNK])), dtype=np.int32, count=int(lengths.sum()))
    return ids, lengths
