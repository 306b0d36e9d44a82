"""The per-chunk computations of the shard stage, as pure functions (Ray tasks wrap them).

1. :func:`count_chunk` (counting pass): tokenize a chunk once, into the compact
   :class:`~pipeline.shard.sentences.Sentences` (local vocabulary, local ids, UTF-8 lines); count
   the training split's tokens and summarise the chunk for the layout (tokens and last sentence
   length per split, line accounting); with ``dedup``, the sentences' keys (hashes).
2. :func:`deduplicate_chunk` (deduplicating pass): remove the chunk's later copies found across
   the corpus, and say which training counts go with them.
3. :func:`encode_chunk` (writing pass): map the chunk's local ids to vocabulary ids (one lookup
   per distinct token, one gather) and cut the sentences into per-shard pieces.

The writing pass gets the counting pass's :class:`Sentences` back rather than tokenizing again;
where it was not kept (a rerun from the plan, a chunk too small to keep) :func:`retokenize` makes
it again from the input and checks that the input still has what the counting pass saw.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from pipeline.formats.shard_format import SPLITS
from pipeline.formats.tokenizer import make_tokenizer
from pipeline.shard.duplicates import ChunkKeys, chunk_keys, remove_sentences
from pipeline.shard.errors import ReservedWordError, ShardError
from pipeline.shard.layout import ChunkTokens
from pipeline.shard.reader import Chunk, Reading, chunk_text
from pipeline.shard.sentences import LineStats, Sentences, tokenize_lines
from pipeline.shard.split import heldout_threshold
from pipeline.shard.vocabulary import global_ids
from pipeline.shard.writer import Piece, cut_pieces


@dataclass(frozen=True)
class LineSettings:
    """How lines become sentences (the config fields that matter per line)."""

    tokenizer: str
    moses_lang: str
    lowercase: bool
    heldout_fraction: float
    main_sources: int
    """Inputs ``0 .. main_sources-1`` are split by hash; later ones are explicit held-out inputs."""
    dedup: bool = False
    """Remove later copies of a sentence (:mod:`pipeline.shard.duplicates`)."""
    reading: Reading = Reading()
    """How a chunk's records become lines (its fields, whether documents are split into sentences)
    and the longest line kept (``max_line_bytes``: the reader's limit is the tokenizer's)."""


@dataclass(frozen=True)
class ChunkSummary:
    """What the counting pass keeps of a chunk (it goes into the plan file, for reruns)."""

    index: int
    source: int
    stats: LineStats

    last_lengths: dict[str, int]
    """Per split, tokens of the chunk's last sentence (0 when it has none)."""

    def tokens(self, split: str) -> ChunkTokens:
        return ChunkTokens(getattr(self.stats, f"{split}_tokens"), self.last_lengths[split])

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "source": self.source,
            "stats": self.stats.to_dict(),
            "last_lengths": self.last_lengths,
        }

    @classmethod
    def from_dict(cls, data: dict) -> ChunkSummary:
        return cls(
            data["index"], data["source"], LineStats.from_dict(data["stats"]), dict(data["last_lengths"])
        )


def chunk_sentences(chunk: Chunk, settings: LineSettings, keep_hashes: bool = False) -> Sentences:
    """The tokenized, split sentences of a chunk (with their hashes when ``keep_hashes``)."""
    tokenize = make_tokenizer(settings.tokenizer, settings.moses_lang, settings.lowercase)
    text = chunk_text(chunk, settings.reading)
    try:
        sentences = tokenize_lines(
            text.data,
            tokenize,
            settings.reading.max_line_bytes,
            heldout_threshold(settings.heldout_fraction),
            all_heldout=chunk.source >= settings.main_sources,
            dropped_overlong=chunk.overlong + text.overlong,
            keep_hashes=keep_hashes,
        )
    except ReservedWordError as err:
        raise ReservedWordError(err.word, err.line, chunk.source) from None
    stats = sentences.stats
    stats.documents, stats.records_skipped, stats.first_skipped_record = (
        text.documents,
        text.records_skipped,
        text.first_skipped,
    )
    return sentences


def summarize(index: int, source: int, sentences: Sentences) -> ChunkSummary:
    last = {split: int(sentences.split(split).lengths[-1:].sum()) for split in SPLITS}
    return ChunkSummary(index, source, sentences.stats, last)


def count_chunk(
    chunk: Chunk, settings: LineSettings
) -> tuple[ChunkSummary, tuple[list[str], np.ndarray], Sentences, ChunkKeys | None]:
    """Counting pass over one chunk: its summary, its training tokens' counts (for
    :meth:`~pipeline.shard.vocabulary.TokenCounts.add`), its sentences, and in a deduplicating run
    its keys (:func:`pipeline.shard.duplicates.chunk_keys`; else None)."""
    sentences = chunk_sentences(chunk, settings, keep_hashes=settings.dedup)
    keys = chunk_keys(sentences) if settings.dedup else None
    return summarize(chunk.index, chunk.source, sentences), sentences.train_counts(), sentences, keys


def deduplicate_chunk(
    sentences: Sentences, index: int, source: int, drops: np.ndarray
) -> tuple[ChunkSummary, tuple[list[str], np.ndarray] | None, Sentences]:
    """A deduplicating run's second look at a chunk: its summary without the sentences at
    ``drops`` (from :func:`pipeline.shard.duplicates.chunk_drops`), the counts to take off its
    training counts (negative; None when no training sentence went: the driver's work follows
    the duplicates, not the corpus), and those sentences."""
    kept = remove_sentences(sentences, drops)
    # the hashes have served: the writing pass needs none
    kept = dataclasses.replace(
        kept,
        train=dataclasses.replace(kept.train, hashes=None),
        heldout=dataclasses.replace(kept.heldout, hashes=None),
    )
    removed = None
    if kept.stats.train_duplicates:
        size = len(sentences.vocab)
        gone = np.bincount(sentences.train.ids, minlength=size) - np.bincount(kept.train.ids, minlength=size)
        present = np.flatnonzero(gone)
        removed = ([sentences.vocab[i] for i in present.tolist()], -gone[present])
    return summarize(index, source, kept), removed, kept


def retokenize(
    chunk: Chunk,
    settings: LineSettings,
    expected: LineStats,
    drops: np.ndarray | None = None,
    drops_file: str = "",
) -> Sentences:
    """The sentences of a chunk whose counting-pass result is gone, made again from the input,
    without those at ``drops`` (a deduplicating run's, read from ``drops_file``, given after the
    duplicates are found); ``expected``: the summary it had then, to catch an input that changed
    since, told apart from a duplicates file that names other sentences than the run removed."""
    sentences = chunk_sentences(chunk, settings)
    if _before_removal(sentences.stats) != _before_removal(expected):
        raise ShardError(
            f"input {chunk.source} changed between the counting and writing passes (chunk {chunk.index})"
        )
    if drops is not None:
        sentences = remove_sentences(sentences, drops)
    if sentences.stats != expected:
        raise ShardError(
            f"{drops_file} does not hold the sentences the run removed from chunk {chunk.index} of "
            f"{chunk.source} (it keeps {sentences.stats.train_tokens + sentences.stats.heldout_tokens} "
            f"tokens, the run kept {expected.train_tokens + expected.heldout_tokens}); delete the output and rerun"
        )
    return sentences


def _before_removal(stats: LineStats) -> tuple[int, ...]:
    """What a chunk's stats say of its input before any duplicate went: its lines and, per split,
    its sentences and tokens."""
    return (
        stats.lines,
        stats.train_sentences + stats.train_duplicates,
        stats.train_tokens + stats.train_duplicate_tokens,
        stats.heldout_sentences + stats.heldout_duplicates,
        stats.heldout_tokens + stats.heldout_duplicate_tokens,
    )


def encode_chunk(
    sentences: Sentences,
    index: Mapping[str, int],
    offsets: Mapping[str, int],
    shards: Mapping[str, range],
    shard_tokens: int,
) -> dict[tuple[str, int], Piece]:
    """Writing pass over one chunk: ``(split, shard) -> piece`` for every shard it feeds.

    ``index``: token -> vocabulary id; ``offsets`` / ``shards``: per split, from the layout.
    """
    lut = global_ids(sentences.vocab, index)
    pieces = {}
    for split in SPLITS:
        cut = cut_pieces(sentences.split(split), lut, offsets[split], shard_tokens, shards[split])
        pieces.update({(split, shard): piece for shard, piece in zip(shards[split], cut, strict=True)})
    return pieces
