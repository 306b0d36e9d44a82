"""pipeline.embed.batching: in-order batches (stateful mode)."""

from __future__ import annotations

import pytest

from pipeline.embed.batching import in_order


def test_in_order():
    assert in_order(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert in_order(0, 3) == []
    with pytest.raises(ValueError):
        in_order(3, 0)
