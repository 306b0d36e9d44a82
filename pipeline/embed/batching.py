"""Stateful mode's forward passes: input order and a fixed batch size, as AllenNLP did, because
there a row's state depends on the sentences that ran before it in the same row. (Stateless passes
are planned by ``elmo_model.static_batches``: length buckets of static shapes.)
"""

from __future__ import annotations


def in_order(count: int, batch_size: int) -> list[list[int]]:
    """``[[0 .. batch_size), [batch_size .. 2*batch_size), ...]`` covering ``range(count)``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return [list(range(i, min(i + batch_size, count))) for i in range(0, count, batch_size)]
