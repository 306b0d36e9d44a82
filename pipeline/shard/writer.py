"""Shard contents: per-chunk pieces -> one shuffled shard of blocks -> a tar written atomically.

A shard's sentences arrive as *pieces*, one per chunk that holds some of them, in input order.
The writer concatenates them, shuffles the sentence order with a generator seeded by
``(seed, split, shard)`` (so the shuffle depends on neither worker count nor chunking), cuts the
shuffled sentences into blocks of at most ``block_tokens`` tokens, and streams the tar to storage
while hashing it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.formats.shard_format import (
    SPLITS,
    block_key,
    decode_block,
    encode_text_block,
    iter_tar_samples,
    tar_writer,
)
from pipeline.formats.unigram import heldout_target_counts, targets_nll
from pipeline.runtime import storage
from pipeline.shard.layout import sentence_shards
from pipeline.shard.sentences import SplitSentences


@dataclass(frozen=True)
class Piece:
    """Sentences of one shard from one chunk: ``lines`` S UTF-8 lines (tokens joined by a space),
    ``ids`` int32 ``(sum(lengths),)`` vocabulary ids, ``lengths`` int32 ``(S,)``."""

    lines: list[bytes]
    ids: np.ndarray
    lengths: np.ndarray


@dataclass(frozen=True)
class ShardRecord:
    """What the manifest lists for a written shard. ``unigram_nll``: held-out shards only, the
    summed ``-log p`` of their forward targets under the training unigram (pipeline.formats.unigram)."""

    name: str
    sentences: int
    tokens: int
    blocks: int
    bytes: int
    sha256: str
    unk_tokens: int
    unigram_nll: float | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def cut_pieces(
    sentences: SplitSentences,
    lut: np.ndarray,
    offset: int,
    shard_tokens: int,
    shards: range,
) -> list[Piece]:
    """The pieces of one chunk's sentences (one split, input order) for each shard in ``shards``.

    ``lut``: int32 ``(L,)``, the vocabulary id of each token of the chunk's local vocabulary
    (:func:`pipeline.shard.vocabulary.global_ids`); ``offset``: the split's tokens before this
    chunk (from the layout).
    """
    lengths = sentences.lengths
    # the chunk's range ends at the split's last shard whenever any of its sentences would go past it
    owner = sentence_shards(lengths, offset, shard_tokens, shards.stop)
    bounds = np.searchsorted(owner, [shards.start, *[s + 1 for s in shards]])
    token_bounds = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))
    lines = sentences.lines()
    pieces = []
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        ids = lut[sentences.ids[token_bounds[lo] : token_bounds[hi]]]
        pieces.append(Piece(lines[lo:hi], ids, lengths[lo:hi]))
    return pieces


def shuffled_order(count: int, seed: int, split: str, shard: int) -> np.ndarray:
    """A permutation of ``count`` sentence positions, fixed by ``(seed, split, shard)``."""
    rng = np.random.default_rng([seed, SPLITS.index(split), shard])
    return rng.permutation(count)


def permute_ids(ids: np.ndarray, lengths: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The flat ``ids`` ``(T,)`` of sentences with ``lengths`` ``(S,)`` rearranged into sentence
    ``order`` ``(S,)``; returns ``(T,)``."""
    starts = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)[:-1]))
    new_lengths = lengths[order]
    new_starts = np.concatenate(([0], np.cumsum(new_lengths, dtype=np.int64)[:-1]))
    gather = np.repeat(starts[order] - new_starts, new_lengths) + np.arange(int(new_lengths.sum()))
    return ids[gather]


def block_bounds(lengths: np.ndarray, block_tokens: int) -> list[tuple[int, int]]:
    """Greedy ``[start, end)`` sentence ranges of at most ``block_tokens`` tokens each (a longer
    sentence is a block by itself)."""
    bounds = []
    start, used = 0, 0
    for i, length in enumerate(lengths.tolist()):
        if used and used + length > block_tokens:
            bounds.append((start, i))
            start, used = i, 0
        used += length
    if used:
        bounds.append((start, len(lengths)))
    return bounds


def shard_samples(
    pieces: Sequence[Piece], split: str, shard: int, seed: int, block_tokens: int
) -> Iterator[dict]:
    """The WebDataset samples (blocks) of one shard, shuffled; see the module docstring."""
    lines = [line for piece in pieces for line in piece.lines]
    lengths = np.concatenate([p.lengths for p in pieces]) if pieces else np.zeros(0, np.int32)
    ids = np.concatenate([p.ids for p in pieces]) if pieces else np.zeros(0, np.int32)
    order = shuffled_order(len(lines), seed, split, shard)
    ids = permute_ids(ids, lengths, order)
    lengths = lengths[order]
    token_bounds = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))
    for b, (lo, hi) in enumerate(block_bounds(lengths, block_tokens)):
        text = b"\n".join([lines[i] for i in order[lo:hi].tolist()]) + b"\n"
        block_ids = ids[token_bounds[lo] : token_bounds[hi]]
        yield encode_text_block(text, block_ids, lengths[lo:hi], block_key(split, shard, b))


def write_shard(path: str, samples: Iterator[dict]) -> tuple[int, str, int]:
    """Write ``samples`` as a tar at ``path`` atomically; ``(blocks, sha256, bytes)``."""
    blocks = 0
    with storage.open_write(path) as stream:
        hashing = storage.HashingWriter(stream)
        with tar_writer(hashing) as tar:
            for sample in samples:
                tar.write(sample)
                blocks += 1
    return blocks, hashing.hexdigest(), hashing.size


def build_shard(
    path: str,
    name: str,
    pieces: Sequence[Piece],
    split: str,
    shard: int,
    seed: int,
    block_tokens: int,
    unk_id: int,
    log_probs: np.ndarray | None = None,
) -> ShardRecord:
    """Write one shard from its pieces and describe it for the manifest; with ``log_probs`` (the
    training unigram, float64 ``(V,)``) its record carries the shard's ``unigram_nll``."""
    blocks, sha, size = write_shard(path, shard_samples(pieces, split, shard, seed, block_tokens))
    nll = None
    if log_probs is not None:
        counts = heldout_target_counts(((p.ids, len(p.lines)) for p in pieces), len(log_probs))
        nll = targets_nll(log_probs, counts)
    return ShardRecord(
        name=name,
        sentences=sum(len(p.lines) for p in pieces),
        tokens=int(sum(int(p.lengths.sum()) for p in pieces)),
        blocks=blocks,
        bytes=size,
        sha256=sha,
        unk_tokens=int(sum(int((p.ids == unk_id).sum()) for p in pieces)),
        unigram_nll=nll,
    )


def describe_shard(path: str, name: str, unk_id: int, log_probs: np.ndarray | None = None) -> ShardRecord:
    """The record of a shard that already exists (a rerun reusing it), read back and checked
    (``log_probs`` as for :func:`build_shard`)."""
    sentences = tokens = blocks = unk = 0
    scored: list[tuple[np.ndarray, int]] = []  # the blocks' targets, for the unigram
    with storage.open_read(path) as stream:
        reader = storage.HashingReader(stream)
        for sample in iter_tar_samples(reader, url=path):
            block = decode_block(sample)
            blocks += 1
            sentences += len(block.lengths)
            tokens += block.num_tokens
            unk += int((block.ids == unk_id).sum())
            if log_probs is not None:
                scored.append((block.ids, len(block.lengths)))
        reader.drain()
    nll = None
    if log_probs is not None:
        nll = targets_nll(log_probs, heldout_target_counts(scored, len(log_probs)))
    return ShardRecord(name, sentences, tokens, blocks, reader.size, reader.hexdigest(), unk, nll)
