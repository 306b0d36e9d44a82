"""Shard layout: which sentences go to which shard, known before any shard is written.

Within a split, sentences are numbered in input order and get a token offset (tokens before
them). A sentence belongs to shard ``offset // shard_tokens``, except that a short tail (under
half the budget) joins the shard before it: every shard holds between about half and one and a
half ``shard_tokens`` (a split smaller than half the budget is one shard). Since the counting
pass records each chunk's token total and last sentence length, every chunk knows exactly which
shards its sentences fall in before the writing pass starts. That is what lets the writing pass
run chunk by chunk on many workers and still produce the same shards as one worker.

The layout needs every sentence to be at most ``shard_tokens`` long; otherwise a shard could be
skipped over (empty), so :func:`layout_split` refuses such a layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ChunkTokens:
    """What the layout needs of one chunk's sentences in one split."""

    tokens: int
    """Tokens of the chunk's sentences in this split."""
    last_length: int
    """Tokens of its last sentence in this split (0 when it has none)."""


@dataclass(frozen=True)
class SplitLayout:
    """The shards of one split and the chunks that feed each of them.

    ``offsets[c]``: tokens of this split before chunk ``c``; ``chunk_shards[c]``: the shard
    indices chunk ``c``'s sentences fall in (empty when it has none).
    """

    shard_tokens: int
    offsets: list[int]
    chunk_shards: list[range]
    num_shards: int
    total_tokens: int

    def shard_chunks(self) -> list[list[int]]:
        """For each shard, the chunks (ascending) holding its sentences."""
        chunks: list[list[int]] = [[] for _ in range(self.num_shards)]
        for c, shards in enumerate(self.chunk_shards):
            for s in shards:
                chunks[s].append(c)
        return chunks


def layout_split(chunks: list[ChunkTokens], shard_tokens: int, longest: int) -> SplitLayout:
    """The layout of a split from its per-chunk token counts (chunks in input order).

    ``longest``: the longest sentence of the split, in tokens; must not exceed ``shard_tokens``.
    """
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be >= 1, got {shard_tokens}")
    if longest > shard_tokens:
        raise ValueError(f"a sentence has {longest} tokens, more than shard_tokens={shard_tokens}")
    offsets, spans = [], []
    offset = 0
    for chunk in chunks:
        offsets.append(offset)
        last_start = offset + chunk.tokens - chunk.last_length
        spans.append((offset // shard_tokens, last_start // shard_tokens) if chunk.tokens else None)
        offset += chunk.tokens
    num_shards = max((span[1] + 1 for span in spans if span), default=0)
    if num_shards > 1 and offset - (num_shards - 1) * shard_tokens < shard_tokens // 2:
        num_shards -= 1  # the short tail joins the shard before it
    last = num_shards - 1
    ranges = [range(min(span[0], last), min(span[1], last) + 1) if span else range(0) for span in spans]
    return SplitLayout(shard_tokens, offsets, ranges, num_shards, offset)


def sentence_shards(lengths: np.ndarray, offset: int, shard_tokens: int, num_shards: int) -> np.ndarray:
    """Shard index of each sentence of a chunk: ``lengths`` int ``(S,)`` in input order, ``offset``
    the split's tokens before the chunk, ``num_shards`` the split's shard count -> int64 ``(S,)``,
    non-decreasing."""
    ends = np.cumsum(lengths, dtype=np.int64)
    starts = offset + ends - np.asarray(lengths, dtype=np.int64)
    return np.minimum(starts // shard_tokens, num_shards - 1)
