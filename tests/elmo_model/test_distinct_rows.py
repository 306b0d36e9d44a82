"""distinct_rows: grouping equal rows bit for bit, whatever the dtype, signs of zero or NaNs."""

from __future__ import annotations

import pytest
import torch

from elmo_model.distinct_rows import distinct_rows

BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def assert_regroups(x: torch.Tensor, rows: torch.Tensor, inverse: torch.Tensor) -> None:
    bits = BITS[x.element_size()]
    assert torch.equal(rows.view(bits)[inverse], x.view(bits))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64])
def test_repeated_rows_are_grouped(dtype):
    torch.manual_seed(0)
    vocabulary = (torch.randn(7, 33) * 100).to(dtype)
    picks = torch.randint(0, 7, (200,))
    x = vocabulary[picks]
    rows, inverse = distinct_rows(x)
    assert rows.shape == (len(picks.unique()), 33)
    assert inverse.shape == (200,)
    assert_regroups(x, rows, inverse)
    # Same row -> same group, different rows -> different groups.
    assert torch.equal(inverse[:, None] == inverse[None, :], picks[:, None] == picks[None, :])


def test_rows_that_differ_only_in_the_sign_of_zero_stay_apart():
    """Their keys collide (-0.0 * w == 0.0 * w); the bitwise check must keep them apart."""
    x = torch.tensor([[0.0, 1.0], [-0.0, 1.0], [0.0, 1.0]])
    rows, inverse = distinct_rows(x)
    assert_regroups(x, rows, inverse)
    assert inverse[0] != inverse[1]


def test_nan_rows_are_regrouped_exactly():
    x = torch.tensor([[float("nan"), 1.0], [float("nan"), 1.0], [2.0, 3.0]])
    rows, inverse = distinct_rows(x)
    assert_regroups(x, rows, inverse)


def test_empty_and_single_row():
    rows, inverse = distinct_rows(torch.empty(0, 5))
    assert rows.shape == (0, 5) and inverse.shape == (0,)
    x = torch.randn(1, 5)
    rows, inverse = distinct_rows(x)
    assert torch.equal(rows, x) and inverse.tolist() == [0]
