"""Sentences grouped into a few fixed (rows, steps) shapes, as ready arrays (docs/model.md#static-shape-inference).

Host side of static-shape inference, numpy only: a length-sorted shard is cut into batches whose
window (steps, boundaries included) is one of a few bucket lengths and whose row count is what the
bucket's token budget allows. With ``fixed`` shapes (CUDA graphs) every batch of a bucket has
its bucket's steps and either its full rows or, the bucket's last batch, the power of two of rows
that holds its sentences (padding rows have length 0), and the distinct spellings are padded to a
power of two, so a few shapes per bucket cover any corpus; without (CPU) a batch is as small as its
sentences allow, since padding there only costs time.

A batch carries each distinct spelling once (``chars``) and, per position, the row of ``chars``
it reads (``positions``), so the char CNN runs once per distinct token, and the index that
reverses each row within its length (``reverse``), which turns the forward stream into the
backward one and the backward outputs back into sentence order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from elmo_model.characters import BOS_TOKEN, EOS_TOKEN, MAX_CHARACTERS_PER_TOKEN, token_to_ids

BOUNDARIES = 2
"""``<S>`` and ``</S>`` around every sentence."""

DEFAULT_STEPS = (16, 24, 32, 48, 64, 96, 128, 192, 256)
"""Bucket windows, boundaries included: sentences of up to 254 tokens, at most ~1/3 padding."""

MIN_CHARS_CAPACITY = 64

MIN_PASS_ROWS = 16
"""The fewest rows of a fixed-shape pass: below this a pass is bound by its kernel launches, not
its rows, so smaller shapes would only add CUDA graphs."""


@dataclass(frozen=True)
class BucketPlan:
    """How sentences are grouped into forward passes.

    ``steps``: the bucket windows (boundaries included), ascending; a longer sentence gets a window
    rounded up to a multiple of the last one. ``token_budget``: rows x steps of one pass (padding
    included). ``max_rows``: rows of one pass at most. ``fixed``: every pass of a bucket has one of
    a few shapes (full rows, or a power of two of rows for the bucket's last pass: ``pass_rows``)
    and ``chars`` a power-of-two row count (CUDA graphs); else passes shrink to fit.
    """

    token_budget: int = 8192
    max_rows: int = 512
    steps: tuple[int, ...] = DEFAULT_STEPS
    fixed: bool = False

    def __post_init__(self):
        if self.token_budget < 1 or self.max_rows < 1:
            raise ValueError(
                f"token_budget and max_rows must be >= 1, got {self.token_budget}, {self.max_rows}"
            )
        if not self.steps or list(self.steps) != sorted(set(self.steps)) or self.steps[0] < BOUNDARIES + 1:
            raise ValueError(f"steps must be distinct ascending windows of at least 3, got {self.steps}")

    def window(self, tokens: int) -> int:
        """The bucket window of a sentence of ``tokens`` tokens."""
        needed = tokens + BOUNDARIES
        for steps in self.steps:
            if steps >= needed:
                return steps
        last = self.steps[-1]
        return -(-needed // last) * last

    def rows(self, window: int) -> int:
        """Rows of one full pass of window ``window``."""
        return max(1, min(self.max_rows, self.token_budget // window))

    def pass_rows(self, window: int, sentences: int) -> int:
        """Rows of a pass of window ``window`` that holds ``sentences`` sentences. ``fixed``: a full
        pass's rows, or for a bucket's last, partial pass the power of two that holds them (at
        least ``MIN_PASS_ROWS``): a bucket's sentences of one shard are often far fewer than a
        GPU-sized pass holds, and every row of a fixed shape is computed (at 131,072 positions a
        pass, a 5,000-line shard filled 17% of its passes' positions with whole rows; the ladder
        keeps each pass at least half full, at a few more shapes per window). Otherwise exactly
        ``sentences``."""
        if not self.fixed:
            return sentences
        full = self.rows(window)
        if sentences >= full:
            return full
        return min(full, max(MIN_PASS_ROWS, 1 << (sentences - 1).bit_length()))


def plan_batches(lengths: Sequence[int], plan: BucketPlan) -> list[list[int]]:
    """Indices into ``lengths`` (tokens per sentence, boundaries excluded) grouped into passes,
    shortest first (ties in input order); every index appears exactly once.

    ``fixed``: each pass holds one bucket's sentences, at most its rows. Otherwise a pass grows while
    ``sentences x (longest + 2) <= token_budget`` and ``sentences <= max_rows`` (a sentence that
    alone exceeds the budget gets a pass of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    current_window = 0
    for i in order:
        if plan.fixed:
            window = plan.window(lengths[i])
            full = window != current_window or len(current) >= plan.rows(window)
        else:  # ascending order: the newcomer is the longest
            window = lengths[i] + BOUNDARIES
            full = (len(current) + 1) * window > plan.token_budget or len(current) >= plan.max_rows
        if current and full:
            batches.append(current)
            current = []
        current_window = window
        current.append(i)
    if current:
        batches.append(current)
    return batches


@dataclass(frozen=True)
class StaticBatch:
    """One forward pass's inputs, R rows x T steps, K distinct spellings.

    ``chars`` (K, 50) int16: the +1-shifted char ids of each distinct token (row 0 ``<S>``, row 1
    ``</S>``; all-zero rows past the real ones). ``positions`` (R, T) int32: the row of ``chars`` at
    each position of the forward stream (``<S>`` at padding). ``reverse`` (R, T) int64: position
    ``t`` of the backward stream is position ``reverse[r, t]`` of the sentence (``n - 1 - t`` inside
    the row's n real positions, ``t`` at padding). ``lengths`` (R,) int64: real positions per row,
    boundaries included (0 for a padding row). ``rows_used``: the first rows that hold sentences.
    """

    chars: np.ndarray
    positions: np.ndarray
    reverse: np.ndarray
    lengths: np.ndarray
    rows_used: int

    @property
    def shape(self) -> tuple[int, int, int]:
        """(R, T, K): what a CUDA graph is captured for."""
        return (*self.positions.shape, self.chars.shape[0])

    @property
    def tokens(self) -> int:
        """Real tokens, boundaries excluded."""
        return int(self.sizes.sum())

    @property
    def sizes(self) -> np.ndarray:
        """(rows_used,) int64: each sentence's tokens, boundaries excluded."""
        return self.lengths[: self.rows_used] - BOUNDARIES

    def output_rows(self, pooled: bool) -> int:
        """The real leading rows of this pass's output (``OutputSpec.shape``): one per sentence
        pooled, else one per token."""
        return self.rows_used if pooled else self.tokens


def _capacity(distinct: int, limit: int) -> int:
    return min(max(MIN_CHARS_CAPACITY, 1 << (distinct - 1).bit_length()), max(limit, distinct))


def build_batch(sentences: Sequence[Sequence[str]], plan: BucketPlan) -> StaticBatch:
    """The arrays of one pass over ``sentences`` (non-empty token lists, one bucket's worth)."""
    if not sentences:
        raise ValueError("build_batch needs at least one sentence")
    longest = max(len(s) for s in sentences)
    steps = plan.window(longest) if plan.fixed else longest + BOUNDARIES
    if plan.fixed and len(sentences) > plan.rows(steps):
        raise ValueError(f"{len(sentences)} sentences do not fit a pass of {plan.rows(steps)} rows")
    rows = plan.pass_rows(steps, len(sentences))
    index = {BOS_TOKEN: 0, EOS_TOKEN: 1}
    positions = np.zeros((rows, steps), dtype=np.int32)
    lengths = np.zeros(rows, dtype=np.int64)
    for r, sentence in enumerate(sentences):
        row = positions[r]
        for t, token in enumerate(sentence, start=1):
            row[t] = index.setdefault(token, len(index))
        row[len(sentence) + 1] = 1
        lengths[r] = len(sentence) + BOUNDARIES
    capacity = _capacity(len(index), rows * steps) if plan.fixed else len(index)
    chars = np.zeros((capacity, MAX_CHARACTERS_PER_TOKEN), dtype=np.int16)
    for token, k in index.items():
        chars[k] = token_to_ids(token)
    return StaticBatch(chars, positions, reverse_positions(lengths, steps), lengths, len(sentences))


def build_passes(sentences: Sequence[Sequence[str]], plan: BucketPlan) -> list[tuple[list[int], StaticBatch]]:
    """``sentences`` (non-empty token lists) as ``plan``'s passes: (indices into ``sentences``, the
    pass's arrays) per pass, shortest first."""
    return [
        (indices, build_batch([sentences[i] for i in indices], plan))
        for indices in plan_batches([len(s) for s in sentences], plan)
    ]


def reverse_positions(lengths: np.ndarray, steps: int) -> np.ndarray:
    """(R,) lengths -> (R, T) index reversing each row within its length (padding stays put)."""
    t = np.arange(steps, dtype=np.int64)[None, :]
    n = lengths[:, None]
    return np.where(t < n, n - 1 - t, t)


def token_destinations(
    starts: np.ndarray, sizes: np.ndarray, pieces: Sequence[int] | np.ndarray
) -> np.ndarray:
    """Where a pass's compact output rows go in an array of every piece's tokens, piece after piece:
    token j of the pass belongs to piece ``pieces[k]`` (the pass's rows in order, ``sizes`` tokens
    each) and goes to ``starts[piece] + (j - the pass's first token of that piece)``. One vector of
    indices for one fancy-indexed copy, whatever the pass's number of sentences."""
    pieces = np.asarray(pieces, dtype=np.int64)
    rows = sizes[pieces]
    shift = starts[pieces] - (np.cumsum(rows) - rows)
    return np.repeat(shift, rows) + np.arange(int(rows.sum()))


def split_rows(values: np.ndarray, batch: StaticBatch, pooled: bool) -> list[np.ndarray]:
    """A pass's host output (``OutputSpec.shape``: the real tokens row after row, or a row per
    sentence when ``pooled``) -> one array per sentence in AllenNLP's shapes: (n, 2P) or, with a
    layer axis, (L, n, 2P); pooled ([L,] 2P). Each is a contiguous copy (a view would keep the whole
    pass alive). For tests and benchmarks: the embed stage places a pass's rows with bulk copies."""
    if pooled:
        return [values[r].copy() for r in range(batch.rows_used)]
    ends = np.cumsum(batch.sizes)
    parts = np.split(values[: batch.tokens], ends[:-1])
    return [(part.swapaxes(0, 1) if part.ndim == 3 else part).copy() for part in parts]
