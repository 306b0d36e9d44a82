"""The training forward (elmo_model/training_lm.py): the window path that training runs and the
evaluation path that scores held-out text give the same numbers, and the state carries."""

from __future__ import annotations

import pytest
import torch
from elmo_reference import TINY_OPTIONS

from elmo_model import BiLM, TrainingLM

ROWS, STEPS = 3, 5


@pytest.fixture
def lm() -> TrainingLM:
    torch.manual_seed(0)
    return TrainingLM(BiLM.from_options(TINY_OPTIONS), dropout=0.3)


def char_ids() -> torch.Tensor:
    """(2, B, U, 50) +1-shifted character ids of both streams."""
    return torch.randint(1, 262, (2, ROWS, STEPS, 50), generator=torch.Generator().manual_seed(1))


def zero_state(lm: TrainingLM) -> tuple[torch.Tensor, torch.Tensor]:
    """c (N, 2, B, C), h (N, 2, B, P)."""
    lstm = lm.bilm.lstm
    n, cells, proj = (
        len(lstm.layers),
        lstm.layers[0].w_hh.shape[-1] // 4,
        lm.bilm.lstm.layers[0].w_p.shape[-1],
    )
    return torch.zeros(n, 2, ROWS, cells), torch.zeros(n, 2, ROWS, proj)


def window_inputs(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The training step's form of ``ids``: spellings (K, 50) and each position's row (2, B, U)."""
    return ids.reshape(-1, 50), torch.arange(ids[..., 0].numel()).view(2, ROWS, STEPS)


def test_the_training_window_equals_the_evaluation_path_without_dropout(lm):
    lm.eval()
    ids = char_ids()
    with torch.no_grad():
        top, c, h = lm(*window_inputs(ids), *zero_state(lm))
        want_top, want_c, want_h = lm.score_window(ids, None, None)
    assert top.shape == (2, ROWS, STEPS, 6)
    torch.testing.assert_close(top, want_top, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close((c, h), (want_c, want_h), atol=1e-6, rtol=1e-5)


def test_scoring_one_step_at_a_time_carries_the_state_like_one_window(lm):
    """Held-out evaluation unrolls 1 step per batch: carrying c, h gives the whole window's outputs."""
    ids = char_ids()
    with torch.no_grad():
        whole, _, _ = lm.score_window(ids, None, None)
        c = h = None
        steps = []
        for t in range(STEPS):
            top, c, h = lm.score_window(ids[:, :, t : t + 1], c, h)
            steps.append(top)
    torch.testing.assert_close(torch.cat(steps, dim=2), whole, atol=1e-6, rtol=1e-5)


def test_dropout_applies_in_training_only_and_is_checked(lm):
    ids = char_ids()
    inputs = (*window_inputs(ids), *zero_state(lm))
    lm.eval()
    with torch.no_grad():
        assert torch.equal(lm(*inputs)[0], lm(*inputs)[0])
        lm.train()
        torch.manual_seed(2)
        first = lm(*inputs)[0]
        torch.manual_seed(3)
        assert not torch.equal(first, lm(*inputs)[0])
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.0"):
        TrainingLM(lm.bilm, dropout=1.0)
