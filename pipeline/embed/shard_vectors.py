"""A shard's vectors in the form they are stored: one contiguous array, lines in order, filled by
bulk copies of whole pass outputs (docs/outputs.md#embeddings).

A pass's output arrives compacted (``elmo_model.static_inference.OutputSpec.shape``): its
sentences' real tokens row after row, or one row per sentence when pooled. Its rows belong to
sentences from anywhere in the shard (passes group sentences by length), so
:class:`ShardAssembler` places a pass with one fancy-indexed copy: the destination of every
token is computed from the pieces' sizes with numpy, never by a loop over sentences.

Token order in a shard: every line's tokens in line order, a split line's pieces one after the
other, so a piece's tokens start where the pieces before it (in line order) end. Pooled, a line is
one row (an empty line a row of zeros; a split line the token-weighted mean of its pieces' means,
in float32, as the pieces were embedded independently).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from elmo_model.static_batches import token_destinations


@dataclass(frozen=True)
class RecordKeys:
    """Each sentence's record: ``ids[i]`` the id of sentence i's record (``id_field``'s value, or
    ``FILE:NUMBER`` without one), ``sentence[i]`` int32 its index in that record (0-based)."""

    ids: list[str]
    sentence: np.ndarray


@dataclass(frozen=True)
class ShardVectors:
    """One shard's vectors: ``vectors`` (tokens, [L,] 2P) with ``offsets`` (S+1,) int64 (line i's
    tokens are ``vectors[offsets[i]:offsets[i+1]]``), or, ``pooled``, (S, [L,] 2P) a row per line
    (``offsets`` then 0..S, as the packed layout stores it); lines ``first_line`` ..
    ``first_line + S - 1``."""

    first_line: int
    vectors: np.ndarray
    offsets: np.ndarray
    pooled: bool
    tokens: np.ndarray
    """(S,) int64: each line's tokens (boundaries excluded; a split line's pieces summed)."""
    records: RecordKeys | None = None
    """A record corpus's shard: each line's record id and its index in the record (pooled per
    record: each row's record id and its number of sentences)."""
    lines: np.ndarray | None = None
    """(S,) int64 each row's line, where rows are not the lines ``first_line``.. in order (pooled per
    record: each record's first line); None: they are."""

    @property
    def line_numbers(self) -> np.ndarray:
        """(S,) int64: each row's line."""
        if self.lines is not None:
            return self.lines
        return np.arange(self.first_line, self.first_line + self.num_lines, dtype=np.int64)

    @property
    def num_lines(self) -> int:
        return len(self.offsets) - 1

    def value(self, i: int) -> np.ndarray:
        """Line ``i`` (counted from ``first_line``) in AllenNLP's shape: (n, 2P) or (L, n, 2P);
        pooled ([L,] 2P). A view, not a copy."""
        return line_value(self.vectors, self.offsets, i, self.pooled)


def pooled_by_record(shard: ShardVectors) -> ShardVectors:
    """A shard of a record corpus pooled per sentence -> a row per record: the mean of all its
    sentences' token vectors (the token-weighted mean of their means, in float32; zeros for a record
    whose sentences have no token), keyed by its id and its number of sentences, its line its first
    sentence's. A shard holds whole records (``record_inputs``), so no record is cut."""
    keys = shard.records
    firsts = np.flatnonzero(keys.sentence == 0)  # each record's first sentence
    tokens = np.asarray(shard.tokens, dtype=np.float64)
    weighted = shard.vectors.astype(np.float32) * tokens.reshape(-1, *([1] * (shard.vectors.ndim - 1)))
    sums = np.add.reduceat(weighted, firsts, axis=0)
    record_tokens = np.add.reduceat(tokens, firsts)
    scale = np.divide(1.0, record_tokens, out=np.zeros_like(record_tokens), where=record_tokens > 0)
    means = (sums * scale.reshape(-1, *([1] * (sums.ndim - 1)))).astype(shard.vectors.dtype)
    sentences = np.diff(np.append(firsts, len(tokens))).astype(np.int32)
    ids = [keys.ids[i] for i in firsts.tolist()]  # once per record
    return ShardVectors(
        shard.first_line,
        means,
        np.arange(len(firsts) + 1),
        True,
        record_tokens.astype(np.int64),
        RecordKeys(ids, sentences),
        shard.first_line + firsts.astype(np.int64),
    )


def line_value(vectors, offsets, i: int, pooled: bool) -> np.ndarray:
    """Line ``i`` of a shard's stored vectors (tokens first: ``vectors`` (tokens, [L,] 2P) and
    ``offsets`` (S+1,); pooled, a row per line) in AllenNLP's shape: (n, 2P) or (L, n, 2P);
    pooled ([L,] 2P). ``vectors`` may be an array or an h5py dataset (then only this line is read).
    The one "offsets -> a line's vectors" of every reader and writer."""
    if pooled:
        return vectors[int(offsets[i])]
    rows = vectors[int(offsets[i]) : int(offsets[i + 1])]
    return rows.swapaxes(0, 1) if rows.ndim == 3 else rows


class BufferPool:
    """Reused host buffers for shards' vectors: a fresh array of a few hundred MB costs its page
    faults on every shard (measured on the 2-core machine: 0.23 s for 268 MB the first time it is
    written, 0.06 s when the pages are already mapped), about as much as writing the shard. A pool
    holds at most as many buffers as shards are assembled at once. Thread-safe.

    ``allocate(nbytes)`` makes a new uint8 buffer: private memory by default; an embed actor's pool
    allocates shared memory that its writer processes map (``shard_writers.SharedBuffers``)."""

    def __init__(self, allocate: Callable[[int], np.ndarray] | None = None) -> None:
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()
        self._allocate = allocate or _private_buffer

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised array of ``shape`` and ``dtype`` on a pooled buffer (``give`` it back)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        with self._lock:
            sizes = [b.nbytes for b in self._free]
            fits = [i for i, size in enumerate(sizes) if size >= nbytes]
            buffer = None
            if fits:
                buffer = self._free.pop(min(fits, key=sizes.__getitem__))
            elif self._free:  # all too small: the largest is dropped for a new one
                self._free.pop(max(range(len(sizes)), key=sizes.__getitem__))
        if buffer is None:
            buffer = self._allocate(max(nbytes, 1))
        return buffer[:nbytes].view(dtype).reshape(shape)

    def release(self, shard: ShardVectors) -> None:
        """Take back the buffer of a shard assembled on this pool, once the shard is written (a
        pooled shard's own small array was never the pool's)."""
        if not shard.pooled:
            self.give(shard.vectors)

    def give(self, array: np.ndarray) -> None:
        base = array
        while isinstance(base.base, np.ndarray):  # a shared buffer's own base is its mapping
            base = base.base
        with self._lock:
            self._free.append(base)


def _private_buffer(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, dtype=np.uint8)


class ShardAssembler:
    """Fills one shard's :class:`ShardVectors` from its pieces' values.

    ``owner[p]`` / ``sizes[p]``: the line (counted from the shard's first) and token count of piece
    ``p`` in line order (``ShardWork``); ``row_shape``: ([L,] 2P); ``dtype``: the stored dtype.
    :meth:`place` takes a pass's compact output, :meth:`place_piece` one piece's value (the
    stateful path); :meth:`finish` returns the shard's vectors once every piece is placed.
    """

    def __init__(
        self,
        first_line: int,
        num_lines: int,
        owner: Sequence[int],
        sizes: Sequence[int],
        row_shape: tuple[int, ...],
        dtype: np.dtype,
        pooled: bool,
        pool: BufferPool | None = None,
    ):
        self.first_line, self.pooled, self.dtype = first_line, pooled, np.dtype(dtype)
        self.owner = np.asarray(owner, dtype=np.int64)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.starts = np.cumsum(self.sizes) - self.sizes  # a piece's first token in the shard
        self.line_tokens = np.bincount(self.owner, weights=self.sizes, minlength=num_lines).astype(np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.line_tokens)]).astype(np.int64)
        self.num_lines, self.row_shape = num_lines, tuple(row_shape)
        self.pool = pool
        rows = len(self.sizes) if pooled else int(self.sizes.sum())
        shape = (rows, *self.row_shape)
        self.rows = pool.take(shape, self.dtype) if pool is not None else np.empty(shape, self.dtype)

    def place(self, pieces: Sequence[int] | np.ndarray, values: np.ndarray) -> None:
        """A pass's output (``OutputSpec.shape``, host memory): its leading rows are the real ones of
        ``pieces`` (the pass's piece indices, row order)."""
        pieces = np.asarray(pieces, dtype=np.int64)
        if self.pooled:
            self.rows[pieces] = values[: len(pieces)]
            return
        destinations = token_destinations(self.starts, self.sizes, pieces)
        self.rows[destinations] = values[: len(destinations)]

    def place_piece(self, piece: int, value: np.ndarray) -> None:
        """One piece's value in AllenNLP's shape ((L, n, 2P), (n, 2P); pooled ([L,] 2P))."""
        if self.pooled:
            self.rows[piece] = value
            return
        start = self.starts[piece]
        self.rows[start : start + self.sizes[piece]] = value.swapaxes(0, 1) if value.ndim == 3 else value

    def finish(self) -> ShardVectors:
        """The shard's vectors (on the pooled buffer when there is a pool: ``BufferPool.release`` it
        after)."""
        if not self.pooled:
            return ShardVectors(self.first_line, self.rows, self.offsets, False, self.line_tokens)
        lines = self._pooled_lines()
        return ShardVectors(self.first_line, lines, np.arange(self.num_lines + 1), True, self.line_tokens)

    def _pooled_lines(self) -> np.ndarray:
        lines = np.zeros((self.num_lines, *self.row_shape), dtype=self.dtype)
        count = np.bincount(self.owner, minlength=self.num_lines)
        single = count[self.owner] == 1
        lines[self.owner[single]] = self.rows[single]
        if not single.all():  # split lines: the token-weighted mean of their pieces, in float32
            split = ~single
            owner = self.owner[split]
            weights = (self.sizes[split] / self.line_tokens[owner]).astype(np.float32)
            joined = np.zeros((self.num_lines, *self.row_shape), dtype=np.float32)
            weighted = self.rows[split].astype(np.float32) * weights.reshape(-1, *([1] * len(self.row_shape)))
            np.add.at(joined, owner, weighted)
            lines[owner] = joined[owner].astype(self.dtype)
        if self.pool is not None:
            self.pool.give(self.rows)
        return lines
