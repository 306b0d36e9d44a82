"""One shard read for one rank and its sentences laid out in reading order (docs/training.md#batching).

numpy and the shard format only, no torch: ``read_layout`` is what a read-ahead process runs
(``pipeline.train.sentence_source.SentenceSource``), and such a process starts in well under a second.

- :func:`read_shard_sentences` loads the sentences of one shard that a rank reads (IO shell over
  ``pipeline.formats.shard_format.read_shard``); :func:`wrap_sentences` lays them out in reading order,
  each wrapped as ``[<S>] + w + [</S>]`` (reversed stream: ``[</S>] + reversed(w) + [<S>]``).
- :class:`LayoutPlan` names one such layout completely (shard, rank split, sentence order,
  direction, S3 endpoint), so :func:`read_layout` gives the same arrays in any process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.formats import shard_format
from pipeline.formats.shard_format import BOS_ID, EOS_ID, UNK_ID
from pipeline.runtime import storage


@dataclass(frozen=True)
class ShardSentences:
    """The sentences of one shard that one rank reads, in stored order.

    ``ids``: int32 ``(N,)``, the kept sentences' word ids concatenated (OOV = ``<UNK>``).
    ``lengths``: int64 ``(S,)``, tokens per kept sentence (sums to N).
    ``oov_pos``: int64 ``(K,)``, sorted positions in ``ids`` of out-of-vocabulary tokens.
    ``oov_words``: K strings, their spellings (character inputs always spell the real word).
    """

    ids: np.ndarray
    lengths: np.ndarray
    oov_pos: np.ndarray
    oov_words: list[str]


@dataclass(frozen=True)
class WrappedSentences:
    """Sentences in reading order, each boundary-wrapped, concatenated into one id array.

    ``ids``: int32 ``(T,)``, ``T = N + 2S``; sentence j is ``ids[ends[j] - lengths[j] - 2 : ends[j]]``.
    ``ends``: int64 ``(S,)``, one past each sentence's last position.
    ``oov_pos``: int64 ``(K,)``, sorted positions in ``ids`` of out-of-vocabulary tokens;
    ``oov_words``: their K spellings.
    """

    ids: np.ndarray
    ends: np.ndarray
    oov_pos: np.ndarray
    oov_words: list[str]

    @property
    def n_sentences(self) -> int:
        return int(self.ends.shape[0])

    def begin(self, j: int) -> int:
        return 0 if j == 0 else int(self.ends[j - 1])

    def oov_between(self, start: int, stop: int) -> tuple[np.ndarray, list[str]]:
        """OOV positions in ``[start, stop)`` (int64 ``(k,)``) and their k spellings."""
        lo, hi = np.searchsorted(self.oov_pos, (start, stop))
        return self.oov_pos[lo:hi], self.oov_words[lo:hi]


def read_shard_sentences(
    url: str,
    vocab_size: int,
    stride: tuple[int, int] | None = None,
    expected: tuple[int, int, str] | None = None,
) -> ShardSentences:
    """Load one shard (local or ``s3://``) for one rank.

    ``stride``: ``(rank, world_size)`` to keep only sentences whose index in the shard is
    ``rank mod world_size``; None keeps all. ``expected``: the manifest's ``(sentences, tokens,
    sha256)`` for this shard, checked against what the file holds (the hash over the bytes as they
    stream in: the driver never reads a shard to check it). Raises ``FormatError`` naming the shard
    when ids fall outside the vocabulary, the counts disagree with the manifest, or the file is
    damaged, truncated or replaced.
    """
    ids_parts: list[np.ndarray] = []
    length_parts: list[np.ndarray] = []
    oov_parts: list[np.ndarray] = []
    oov_words: list[str] = []
    n_sentences = n_tokens = kept_tokens = 0
    with shard_format.open_shard(url, expected[2] if expected is not None else "") as blocks:
        for block in blocks:
            lengths = block.lengths.astype(np.int64)
            if block.ids.size and (block.ids.min() < 0 or block.ids.max() >= vocab_size):
                raise shard_format.FormatError(
                    f"shard {url}: block {block.key} has word ids outside the vocabulary of {vocab_size} "
                    f"({block.ids.min()}..{block.ids.max()}); does the shard match vocab.txt?"
                )
            if stride is None:
                keep = np.ones(lengths.shape[0], dtype=bool)
            else:
                keep = (n_sentences + np.arange(lengths.shape[0])) % stride[1] == stride[0]
            n_sentences += lengths.shape[0]
            n_tokens += block.ids.shape[0]
            ids = block.ids[np.repeat(keep, lengths)]
            kept_lengths = lengths[keep]
            unknown = np.flatnonzero(ids == UNK_ID)
            if unknown.size:
                kept_sentences = np.flatnonzero(keep)
                ends = np.cumsum(kept_lengths)
                sentence = np.searchsorted(ends, unknown, side="right")
                token = unknown - (ends - kept_lengths)[sentence]
                for s, t in zip(kept_sentences[sentence].tolist(), token.tolist(), strict=True):
                    oov_words.append(block.sentences[s][t])
                oov_parts.append(unknown + kept_tokens)
            kept_tokens += ids.shape[0]
            ids_parts.append(ids)
            length_parts.append(kept_lengths)
    if expected is not None and (n_sentences, n_tokens) != tuple(expected[:2]):
        raise shard_format.FormatError(
            f"shard {url}: manifest lists {expected[0]} sentences / {expected[1]} tokens, "
            f"the shard holds {n_sentences} / {n_tokens}"
        )
    return ShardSentences(
        ids=np.concatenate(ids_parts) if ids_parts else np.zeros(0, np.int32),
        lengths=np.concatenate(length_parts) if length_parts else np.zeros(0, np.int64),
        oov_pos=np.concatenate(oov_parts) if oov_parts else np.zeros(0, np.int64),
        oov_words=oov_words,
    )


def wrap_sentences(shard: ShardSentences, order: np.ndarray, reverse: bool) -> WrappedSentences:
    """Lay out ``shard``'s sentences in ``order`` (int ``(S,)``, a permutation of ``range(S)``),
    each wrapped as ``[<S>] + w + [</S>]``, or ``[</S>] + reversed(w) + [<S>]`` when ``reverse``.
    Vectorised: no per-token Python work."""
    lengths = shard.lengths[order]
    src_starts = (np.cumsum(shard.lengths) - shard.lengths)[order]
    ends = np.cumsum(lengths + 2)
    begins = ends - lengths - 2
    ids = np.empty(int(ends[-1]) if ends.size else 0, dtype=np.int32)
    ids[begins] = EOS_ID if reverse else BOS_ID
    ids[ends - 1] = BOS_ID if reverse else EOS_ID
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    offset = np.repeat(lengths - 1, lengths) - within if reverse else within
    src = np.repeat(src_starts, lengths) + offset
    dst = np.repeat(begins + 1, lengths) + within
    ids[dst] = shard.ids[src]
    oov_pos = np.zeros(0, np.int64)
    oov_words: list[str] = []
    if shard.oov_pos.size:
        dst_of_src = np.empty(shard.ids.shape[0], dtype=np.int64)
        dst_of_src[src] = dst
        moved = dst_of_src[shard.oov_pos]
        sort = np.argsort(moved, kind="stable")
        oov_pos = moved[sort]
        oov_words = [shard.oov_words[k] for k in sort.tolist()]
    return WrappedSentences(ids=ids, ends=ends, oov_pos=oov_pos, oov_words=oov_words)


def seeded_rng(*entropy: int) -> np.random.Generator:
    """numpy generator for a tuple of seeds (run seed, stream, purpose, pass, shard, ...)."""
    return np.random.default_rng(list(entropy))


@dataclass(frozen=True)
class LayoutPlan:
    """Everything that decides one shard's layout for one rank and direction.

    ``stride``: ``(rank, world_size)`` sentence stride or None; ``expected``: the manifest's
    ``(sentences, tokens, sha256)`` or None; ``order_seed``: the entropy of the sentence shuffle, None for
    stored order; ``endpoint``: the S3 endpoint of the process that made the plan.
    """

    url: str
    vocab_size: int
    stride: tuple[int, int] | None
    expected: tuple[int, int, str] | None
    order_seed: tuple[int, ...] | None
    reverse: bool
    endpoint: str | None = None


def read_layout(
    plan: LayoutPlan, reader: Callable[..., ShardSentences] = read_shard_sentences
) -> WrappedSentences:
    """Read, decode and lay out the shard of ``plan`` (in this process or a read-ahead one)."""
    if plan.endpoint is not None and storage.endpoint_url() != plan.endpoint:
        storage.configure(plan.endpoint)
    sentences = reader(plan.url, plan.vocab_size, plan.stride, plan.expected)
    n = sentences.lengths.shape[0]
    order = np.arange(n) if plan.order_seed is None else seeded_rng(*plan.order_seed).permutation(n)
    return wrap_sentences(sentences, order, plan.reverse)
