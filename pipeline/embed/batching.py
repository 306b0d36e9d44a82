"""Grouping sentences into forward passes (pure functions over token counts).

Stateless mode sorts a shard's sentences by length and fills each batch up to a budget of padded
token positions, so batches carry little padding and memory per pass is bounded whatever the
sentence lengths. Stateful mode keeps input order and a fixed batch size, as AllenNLP did, because
there a row's state depends on the sentences that ran before it in the same row.
"""

from __future__ import annotations

from collections.abc import Sequence

BOUNDARY_POSITIONS = 2
"""``<S>`` and ``</S>`` added to every sentence."""


def length_bucketed(lengths: Sequence[int], token_budget: int, max_sentences: int) -> list[list[int]]:
    """Indices into ``lengths`` grouped into batches.

    Sentences are taken shortest first (ties in input order); a batch grows while
    ``sentences x (longest + 2) <= token_budget`` and ``sentences <= max_sentences``. A sentence
    that alone exceeds the budget gets a batch of its own. Every index appears exactly once.
    """
    if token_budget < 1 or max_sentences < 1:
        raise ValueError(f"token_budget and max_sentences must be >= 1, got {token_budget}, {max_sentences}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[i] + BOUNDARY_POSITIONS  # ascending order: the newcomer is the longest
        if current and ((len(current) + 1) * width > token_budget or len(current) >= max_sentences):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def in_order(count: int, batch_size: int) -> list[list[int]]:
    """``[[0 .. batch_size), [batch_size .. 2*batch_size), ...]`` covering ``range(count)``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return [list(range(i, min(i + batch_size, count))) for i in range(0, count, batch_size)]
