"""Exact deduplication: a sentence that repeats an earlier sentence of its split is removed, as the
1B Word Benchmark removed its duplicates (``sort -u``) before anything else. Pure functions; the
shard stage's Ray shell (:mod:`pipeline.shard.job`) runs them as tasks.

Which copy stays: the first in corpus order (inputs in the order given, lines in file order), so
the result is the same whatever the worker count or ``chunk_bytes``. Two sentences are the same
when their normalised text (tokens joined by one space: what the split hashes) is: the key is the
split's 64-bit hash with the sentence's UTF-8 length and split beside it. Two different sentences
of one length share a hash with probability 2^-64 per pair (at the 1B Word Benchmark's 30M
sentences, spread over some 200 lengths: about 1e-7 expected wrong removals in all). Each split is
deduplicated on its own: with the hash split a sentence and its copies always share a split, and a
held-out input (``heldout_input``) stays whole beside the training text.

Memory is bounded by design, not by the corpus: the counting pass leaves, per chunk, its keys
sorted by hash (:class:`ChunkKeys`, 16 bytes a sentence, in Ray's object store); the hash space is
cut into ranges (:func:`hash_ranges`), and one task per range reads its slice of every chunk's keys
and finds the later copies in it (:func:`find_duplicates`), so no task and not the driver holds
every sentence's key. Each chunk then takes its own positions out of every range's result
(:func:`chunk_drops`) and removes those sentences (:func:`remove_sentences`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.shard.errors import ShardError
from pipeline.shard.sentences import Sentences, SplitSentences
from pipeline.shard.split import HASH_BITS

PARTITION_SENTENCES = 4_000_000
"""Sentences a :func:`find_duplicates` task holds at most on average (about 28 bytes each while it
sorts: some 110 MB), which sets how many hash ranges a corpus is cut into."""

DROPS_FOLDER = "duplicates"
"""Where in the shard output each chunk's removed positions are kept (:func:`drops_name`): a rerun
that reads a chunk again (an interrupted run's, a small chunk's) removes the same sentences
without finding the duplicates again."""

_POSITION_BITS = 32


@dataclass(frozen=True)
class ChunkKeys:
    """A chunk's sentence keys, sorted by hash: what the duplicate-finding tasks read of it.

    ``hashes``: uint64 ``(N,)``, ascending, each sentence's split hash.
    ``tags``: uint32 ``(N,)``: the sentence's UTF-8 length times two, plus one when it is held out:
    copies have equal tags, and the splits stay apart.
    ``positions``: uint32 ``(N,)``: the sentence's place in its chunk, training sentences first
    (``0 .. S_train-1``), then held-out ones (``S_train ..``).
    """

    hashes: np.ndarray
    tags: np.ndarray
    positions: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.hashes.nbytes + self.tags.nbytes + self.positions.nbytes


def line_bytes(part: SplitSentences) -> np.ndarray:
    """The UTF-8 length of each of the split's S lines, int64 ``(S,)`` (newlines excluded)."""
    if not len(part.lengths):
        return np.zeros(0, dtype=np.int64)
    text = np.frombuffer(part.text, dtype=np.uint8)
    ends = np.append(np.flatnonzero(text == ord("\n")), len(text))
    starts = np.concatenate([[0], ends[:-1] + 1])
    return ends - starts


def chunk_keys(sentences: Sentences) -> ChunkKeys:
    """The keys of a chunk tokenized with ``keep_hashes``, sorted by hash."""
    parts = (sentences.train, sentences.heldout)
    if any(p.hashes is None for p in parts):
        raise ValueError("chunk_keys needs sentences tokenized with keep_hashes=True")
    hashes = np.concatenate([p.hashes for p in parts])
    tags = np.concatenate([line_bytes(p) * 2 + held for held, p in enumerate(parts)]).astype(np.uint32)
    order = np.argsort(hashes, kind="stable")
    return ChunkKeys(hashes[order], tags[order], order.astype(np.uint32))


def hash_ranges(total_sentences: int, workers: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` ranges of the 64-bit hash space, equal in width, at least ``workers`` of them and
    enough that each holds about :data:`PARTITION_SENTENCES` or fewer (hashes are uniform)."""
    parts = max(1, workers, math.ceil(total_sentences / PARTITION_SENTENCES))
    space = 1 << HASH_BITS
    bounds = [space * i // parts for i in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _slice(keys: ChunkKeys, lo: int, hi: int) -> slice:
    start = np.searchsorted(keys.hashes, np.uint64(lo), side="left")
    stop = (
        len(keys.hashes) if hi >= 1 << HASH_BITS else np.searchsorted(keys.hashes, np.uint64(hi), side="left")
    )
    return slice(int(start), int(stop))


def find_duplicates(keys: Sequence[ChunkKeys], lo: int, hi: int) -> np.ndarray:
    """The later copies among the sentences whose hash is in ``[lo, hi)``, ``keys`` being every
    chunk's in corpus order: uint64 ``(D,)`` of ``chunk << 32 | position``, ascending."""
    hashes, tags, chunks, positions = [], [], [], []
    for index, chunk in enumerate(keys):
        part = _slice(chunk, lo, hi)
        hashes.append(chunk.hashes[part])
        tags.append(chunk.tags[part])
        positions.append(chunk.positions[part])
        chunks.append(np.full(part.stop - part.start, index, dtype=np.uint32))
    if not hashes:
        return np.zeros(0, dtype=np.uint64)
    hashes, tags = np.concatenate(hashes), np.concatenate(tags)
    chunks, positions = np.concatenate(chunks), np.concatenate(positions)
    # equal keys next to each other, each group in corpus order: its first is the copy kept
    order = np.lexsort((positions, chunks, tags, hashes))
    same = (hashes[order][1:] == hashes[order][:-1]) & (tags[order][1:] == tags[order][:-1])
    later = order[1:][same]
    return np.sort((chunks[later].astype(np.uint64) << _POSITION_BITS) | positions[later])


def chunk_drops(found: Sequence[np.ndarray], chunk: int) -> np.ndarray:
    """Chunk ``chunk``'s positions to remove, gathered from every range's :func:`find_duplicates`:
    int64 ``(D,)``, ascending."""
    lo, hi = np.uint64(chunk << _POSITION_BITS), np.uint64((chunk + 1) << _POSITION_BITS)
    mask = np.uint64((1 << _POSITION_BITS) - 1)
    mine = [part[np.searchsorted(part, lo) : np.searchsorted(part, hi)] & mask for part in found]
    return np.sort(np.concatenate([np.zeros(0, dtype=np.uint64), *mine])).astype(np.int64)


def _without(part: SplitSentences, positions: np.ndarray) -> SplitSentences:
    if not len(positions):
        return part
    keep = np.ones(len(part.lengths), dtype=bool)
    keep[positions] = False
    text = np.frombuffer(part.text + b"\n", dtype=np.uint8)[np.repeat(keep, line_bytes(part) + 1)]
    return SplitSentences(
        text.tobytes()[:-1],
        part.ids[np.repeat(keep, part.lengths)],
        part.lengths[keep],
        None if part.hashes is None else part.hashes[keep],
    )


def remove_sentences(sentences: Sentences, drops: np.ndarray) -> Sentences:
    """``sentences`` without those at ``drops`` (positions as in :class:`ChunkKeys`, ascending, no
    repeats), their removal counted in the stats (``*_duplicates``)."""
    cut = len(sentences.train.lengths)
    total = cut + len(sentences.heldout.lengths)
    if len(drops) and (drops[0] < 0 or drops[-1] >= total or np.any(np.diff(drops) <= 0)):
        raise ShardError(f"duplicate positions out of order or beyond the chunk's {total} sentences")
    split_at = int(np.searchsorted(drops, cut))
    train = _without(sentences.train, drops[:split_at])
    heldout = _without(sentences.heldout, drops[split_at:] - cut)
    old = sentences.stats
    stats = dataclasses.replace(
        old,
        train_sentences=len(train.lengths),
        train_tokens=len(train.ids),
        heldout_sentences=len(heldout.lengths),
        heldout_tokens=len(heldout.ids),
        max_sentence_tokens=int(max(train.lengths.max(initial=0), heldout.lengths.max(initial=0))),
        train_duplicates=old.train_duplicates + old.train_sentences - len(train.lengths),
        train_duplicate_tokens=old.train_duplicate_tokens + old.train_tokens - len(train.ids),
        heldout_duplicates=old.heldout_duplicates + old.heldout_sentences - len(heldout.lengths),
        heldout_duplicate_tokens=old.heldout_duplicate_tokens + old.heldout_tokens - len(heldout.ids),
    )
    return Sentences(sentences.vocab_text, train, heldout, stats)


def drops_name(chunk: int) -> str:
    """The file of chunk ``chunk``'s removed positions, relative to the shard output."""
    return f"{DROPS_FOLDER}/chunk-{chunk:06d}.u32"


def encode_drops(drops: np.ndarray) -> bytes:
    """Positions as little-endian uint32, ascending: the bytes of :func:`drops_name`'s file."""
    return drops.astype("<u4").tobytes()


def decode_drops(data: bytes, expected: int, name: str) -> np.ndarray:
    """The positions of a :func:`drops_name` file that should hold ``expected`` of them, int64."""
    if len(data) != 4 * expected:
        raise ShardError(
            f"{name} holds {len(data)} bytes, not the {expected} positions the plan counts; "
            "delete the output and rerun"
        )
    return np.frombuffer(data, dtype="<u4").astype(np.int64)
