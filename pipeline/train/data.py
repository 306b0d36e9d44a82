"""Training and held-out batches of the original recipe (docs/training.md#batching, docs/training.md#held-out-perplexity), read from a shard directory.

Pieces, from the shard up:

- ``pipeline.train.shard_reading`` reads one shard for one rank and lays out its sentences in
  reading order, each wrapped in its boundary tokens.
- ``pipeline.train.sentence_source.SentenceSource`` is one direction's endless (training) or
  one-pass (test) sentence generator for one rank, with a small resumable position; it reads the
  next shard ahead and applies the rank split.
- :class:`RowStreams` is bilm-tf's ``_get_batch``: B rows, each owning a current-sentence buffer,
  cut into windows of U tokens.
- :class:`LMBatchStream` pairs a forward and an independently shuffled reversed stream and yields
  :class:`LMBatch` es; ``state_dict``/``load_state_dict`` capture its exact position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipeline.formats.shard_manifest import ShardManifest, read_manifest
from pipeline.runtime.background import HelperProcess
from pipeline.train.char_cache import CharCache
from pipeline.train.sentence_source import ReadAhead, SentenceSource
from pipeline.train.shard_reading import (
    UNK_ID,
    ShardSentences,
    WrappedSentences,
    read_shard_sentences,
)

STATE_FORMAT = 1
"""Version of :meth:`LMBatchStream.state_dict`'s layout."""


class RowStreams:
    """bilm-tf's ``_get_batch`` for one direction: B rows, each a continuous stream of sentences.

    Each row owns a current-sentence buffer. Filling row i: while the row has room, if the buffer
    holds at most one token, take the next sentence from the source; then take
    ``k = min(len(buffer) - 1, room)`` tokens as inputs and the next k (shifted by one) as
    targets, and drop k tokens from the buffer. Rows fill in order 0..B-1.
    """

    def __init__(self, source: SentenceSource, batch_size: int):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.source = source
        # row i: [layout, position of the buffer's first token, end of its sentence]
        self.rows: list[list[Any] | None] = [None] * batch_size

    def fill(self, inputs: np.ndarray, targets: np.ndarray) -> list[tuple[int, WrappedSentences, int]] | None:
        """Fill ``inputs``/``targets`` (int64 ``(B, U)``) in place. Returns the copied pieces as
        ``(row * U + column, layout, position in layout)`` in row-major order, or None when the
        source ran out (the batch is partial)."""
        unroll = inputs.shape[1]
        pieces: list[tuple[int, WrappedSentences, int]] = []
        for i, row in enumerate(self.rows):
            col = 0
            while col < unroll:
                if row is None or row[2] - row[1] <= 1:
                    nxt = self.source.next_sentence()
                    if nxt is None:
                        return None
                    row = self.rows[i] = list(nxt)
                layout, pos, end = row
                k = min(end - pos - 1, unroll - col)
                inputs[i, col : col + k] = layout.ids[pos : pos + k]
                targets[i, col : col + k] = layout.ids[pos + 1 : pos + k + 1]
                pieces.append((i * unroll + col, layout, pos))
                row[1] = pos + k
                col += k
        return pieces

    @staticmethod
    def oov_inputs(
        inputs: np.ndarray, pieces: list[tuple[int, WrappedSentences, int]]
    ) -> tuple[tuple[np.ndarray, np.ndarray], list[str]]:
        """The ``<UNK>`` inputs of a filled ``(B, U)`` batch: their (rows, columns) (two int64
        ``(K,)``) and real spellings, found through the pieces :meth:`fill` returned. Per-OOV work
        only, so a batch without OOV tokens costs one comparison."""
        rows, cols = np.nonzero(inputs == UNK_ID)
        if not rows.size:
            return (rows, cols), []
        starts = np.fromiter((piece[0] for piece in pieces), dtype=np.int64, count=len(pieces))
        slots = rows * inputs.shape[1] + cols
        words = []
        for slot, j in zip(
            slots.tolist(), (np.searchsorted(starts, slots, side="right") - 1).tolist(), strict=True
        ):
            start, layout, pos = pieces[j]
            position = pos + slot - start
            k = int(np.searchsorted(layout.oov_pos, position))
            if k == layout.oov_pos.shape[0] or layout.oov_pos[k] != position:
                raise RuntimeError(
                    f"data: <UNK> input at layout position {position} has no recorded spelling"
                )
            words.append(layout.oov_words[k])
        return (rows, cols), words

    def rows_state(self) -> list[dict[str, list] | None]:
        """Each row's remaining buffer: ``{"ids": [...], "oov": [[pos, word], ...]}`` (None = empty)."""
        state: list[dict[str, list] | None] = []
        for row in self.rows:
            if row is None:
                state.append(None)
                continue
            layout, pos, end = row
            positions, words = layout.oov_between(pos, end)
            state.append(
                {
                    "ids": layout.ids[pos:end].tolist(),
                    "oov": [[int(p) - pos, w] for p, w in zip(positions, words, strict=True)],
                }
            )
        return state

    def load_rows_state(self, state: Sequence[dict[str, list] | None]) -> None:
        if len(state) != len(self.rows):
            raise ValueError(f"data state: {len(state)} rows saved but batch_size is {len(self.rows)}")
        rows: list[list[Any] | None] = []
        for saved in state:
            if saved is None:
                rows.append(None)
                continue
            ids = np.asarray(saved["ids"], dtype=np.int32)
            if ids.size and (ids.min() < 0 or ids.max() >= self.source.vocab_size):
                raise ValueError(f"data state: row ids outside the vocabulary of {self.source.vocab_size}")
            layout = WrappedSentences(
                ids=ids,
                ends=np.array([ids.shape[0]], dtype=np.int64),
                oov_pos=np.array([p for p, _ in saved["oov"]], dtype=np.int64),
                oov_words=[w for _, w in saved["oov"]],
            )
            rows.append([layout, 0, ids.shape[0]])
        self.rows = rows


@dataclass(frozen=True)
class LMBatch:
    """One training or evaluation batch; index 0 of the leading axis is the forward stream, 1 the
    reversed stream (the layout ``BiLM.lstm`` takes).

    ``char_ids``: int64 ``(2, B, U, 50)``, +1-shifted character ids of the inputs (never 0: the
    batch is full). ``token_ids``: int64 ``(2, B, U)``, the inputs' vocabulary ids.
    ``targets``: int64 ``(2, B, U)``, the next token's vocabulary id (OOV = ``<UNK>``).
    """

    char_ids: torch.Tensor
    token_ids: torch.Tensor
    targets: torch.Tensor

    @property
    def n_tokens(self) -> int:
        """Predictions per direction: B * U (every position is real)."""
        return int(self.targets.shape[1] * self.targets.shape[2])


class LMBatchStream:
    """Iterator of :class:`LMBatch` for one rank: bilm-tf's ``BidirectionalLMDataset``.

    Training (``test=False``): endless; the forward and reversed streams choose shards and shuffle
    independently (seed streams 0 and 1), so the two directions see different sentences.
    Test (``test=True``, held-out evaluation as ``run_test``): every sentence of the rank's shards
    once in a fixed order, both directions aligned, each row a continuous stream; it stops at the
    first batch that cannot be filled (that partial batch is dropped).
    ``prefetch``: where each direction reads its next shard ahead (:class:`SentenceSource`);
    :meth:`close` ends the read-ahead processes.
    """

    def __init__(
        self,
        urls: Sequence[str],
        cache: CharCache,
        batch_size: int,
        unroll_steps: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        test: bool = False,
        sizes: Sequence[tuple[int, int, str]] | None = None,
        reader: Callable[..., ShardSentences] = read_shard_sentences,
        prefetch: ReadAhead = ReadAhead.process,
    ):
        if unroll_steps < 1:
            raise ValueError(f"unroll_steps must be >= 1, got {unroll_steps}")
        self.cache = cache
        self.batch_size, self.unroll_steps = batch_size, unroll_steps
        self.test = test
        process = HelperProcess()
        self.streams = [
            RowStreams(
                SentenceSource(
                    urls,
                    cache.vocab_size,
                    rank=rank,
                    world_size=world_size,
                    seed=seed,
                    stream=direction,
                    reverse=bool(direction),
                    test=test,
                    sizes=sizes,
                    reader=reader,
                    prefetch=prefetch,
                    process=process,
                ),
                batch_size,
            )
            for direction in (0, 1)
        ]
        self._finished = False

    def __iter__(self) -> Iterator[LMBatch]:
        return self

    def close(self) -> None:
        """End both directions' read-ahead processes (the stream can go on: it starts new ones)."""
        for rows in self.streams:
            rows.source.close()

    def __next__(self) -> LMBatch:
        if self._finished:
            raise StopIteration
        shape = (2, self.batch_size, self.unroll_steps)
        token_ids = np.empty(shape, dtype=np.int64)
        targets = np.empty(shape, dtype=np.int64)
        index: list[np.ndarray] = [np.zeros(0, np.int64)] * 3
        words: list[str] = []
        for direction, rows in enumerate(self.streams):
            pieces = rows.fill(token_ids[direction], targets[direction])
            if pieces is None:
                self._finished = True
                raise StopIteration
            (oov_rows, oov_cols), oov_words = rows.oov_inputs(token_ids[direction], pieces)
            index = [
                np.concatenate([index[0], np.full(len(oov_words), direction, np.int64)]),
                np.concatenate([index[1], oov_rows]),
                np.concatenate([index[2], oov_cols]),
            ]
            words += oov_words
        char_ids = self.cache.spell(token_ids, tuple(index), words)
        return LMBatch(
            char_ids=torch.from_numpy(char_ids),
            token_ids=torch.from_numpy(token_ids),
            targets=torch.from_numpy(targets),
        )

    def _identity(self) -> dict[str, Any]:
        source = self.streams[0].source
        return {
            "rank": source.rank,
            "world_size": source.world_size,
            "seed": source.seed,
            "test": self.test,
            "batch_size": self.batch_size,
            "n_shards": len(source.urls),
        }

    def state_dict(self) -> dict[str, Any]:
        """Where both streams are, as small JSON-able lists: per direction the source position
        (pass, shard, offset) and every row's remaining buffer. Taken between batches, it makes a
        restored stream yield exactly the batches this one would have yielded next."""
        return {
            "format": STATE_FORMAT,
            **self._identity(),
            "streams": [{**rows.source.position(), "rows": rows.rows_state()} for rows in self.streams],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; ValueError naming the key when it was taken by another
        rank, world size, seed, mode, batch size or shard list (``unroll_steps`` may differ)."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"data state: format {state.get('format')!r}, expected {STATE_FORMAT}")
        for key, value in self._identity().items():
            if state.get(key) != value:
                raise ValueError(
                    f"data state: {key} is {state.get(key)!r} in the checkpoint but {value!r} now"
                )
        for rows, saved in zip(self.streams, state["streams"], strict=True):
            rows.source.set_position(saved)
            rows.load_rows_state(saved["rows"])
        self._finished = False


def load_char_cache(shard_dir: str, manifest: ShardManifest | None = None) -> CharCache:
    """The :class:`CharCache` of a shard directory's ``vocab.txt`` (checked by the shard format)."""
    manifest = read_manifest(shard_dir) if manifest is None else manifest
    return CharCache(manifest.read_vocab()[1])


def open_lm_batches(
    shard_dir: str,
    split: str,
    cache: CharCache,
    batch_size: int,
    unroll_steps: int,
    *,
    manifest: ShardManifest | None = None,
    **stream: Any,
) -> LMBatchStream:
    """An :class:`LMBatchStream` over ``split`` (``train`` / ``heldout``) of a shard directory,
    checking each shard against the manifest's sentence and token counts as it is read.
    ``stream``: the stream's own keywords (``rank``, ``world_size``, ``seed``, ``test``,
    ``prefetch``), as :class:`LMBatchStream` takes them."""
    manifest = read_manifest(shard_dir) if manifest is None else manifest
    urls = manifest.urls(split)
    if not urls:
        raise ValueError(f"shard directory {shard_dir}: the manifest lists no {split} shards")
    if manifest.vocab.size != cache.vocab_size:
        raise ValueError(
            f"shard directory {shard_dir}: manifest vocab.size {manifest.vocab.size} but the "
            f"vocabulary has {cache.vocab_size} tokens"
        )
    sizes = [(entry.sentences, entry.tokens, entry.sha256) for entry in manifest.shards[split]]
    return LMBatchStream(urls, cache, batch_size, unroll_steps, sizes=sizes, **stream)
