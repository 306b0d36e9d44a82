"""The training path's layer op (elmo_model/recurrence.py) against autograd through the step-by-step
LSTM, and against the per-row reference of test_lstm.py."""

from __future__ import annotations

import pytest
import torch
from test_lstm import C, N, P, make_lstm, reference_stack

from elmo_model import LSTMState

B, U = 3, 5


def _inputs(dtype=torch.float64):
    torch.manual_seed(7)
    inputs = torch.randn(2, B, U, P, dtype=dtype, requires_grad=True)
    state = LSTMState(torch.randn(N, 2, B, C, dtype=dtype), torch.randn(N, 2, B, P, dtype=dtype))
    return inputs, state


def _loss(top, final, weights):
    return (top * weights[0]).sum() + (final.c * weights[1]).sum() + (final.h * weights[2]).sum()


@pytest.mark.parametrize("clip", [None, 0.5])
@pytest.mark.parametrize("skip", [False, True])
def test_window_equals_autograd_through_every_step(clip, skip):
    """float64: values and every gradient (inputs, each weight) equal those of autograd through the
    step-by-step path, including gradients that reach the final state."""
    lstm = make_lstm(skip=skip, clip=clip).double()
    inputs, state = _inputs()
    mask = torch.ones(B, U, dtype=torch.bool)
    outs, final = lstm._forward_autograd(inputs, mask, mask.sum(1), state)
    weights = [torch.randn_like(t) for t in (outs[-1], final.c, final.h)]
    want = torch.autograd.grad(_loss(outs[-1], final, weights), [inputs, *lstm.parameters()])
    top, final2 = lstm.forward_window(inputs, state)
    got = torch.autograd.grad(_loss(top, final2, weights), [inputs, *lstm.parameters()])
    torch.testing.assert_close(top, outs[-1], rtol=0, atol=1e-12)
    torch.testing.assert_close(final2.c, final.c, rtol=0, atol=1e-12)
    torch.testing.assert_close(final2.h, final.h, rtol=0, atol=1e-12)
    for name, a, b in zip(["inputs", *(n for n, _ in lstm.named_parameters())], got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


def test_window_matches_the_per_row_reference():
    lstm = make_lstm()
    inputs, state = _inputs(torch.float32)
    with torch.no_grad():
        top, final = lstm.forward_window(inputs, state)
        ref_outs, ref_final = reference_stack(lstm, inputs, [U] * B, state)
    assert torch.allclose(top, ref_outs[-1], atol=1e-6)
    assert torch.allclose(final.c, ref_final.c, atol=1e-6) and torch.allclose(final.h, ref_final.h, atol=1e-6)


def test_bf16_autocast_keeps_float32_weight_gradients_close():
    lstm = make_lstm()
    inputs, state = _inputs(torch.float32)
    top, _ = lstm.forward_window(inputs, state)
    exact = torch.autograd.grad(top.sum(), list(lstm.parameters()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast_top, final = lstm.forward_window(inputs, state)
    assert fast_top.dtype == torch.bfloat16 and final.c.dtype == torch.float32
    fast = torch.autograd.grad(fast_top.float().sum(), list(lstm.parameters()))
    for a, b in zip(fast, exact, strict=True):
        assert a.dtype == torch.float32
        assert float((a - b).norm() / b.norm()) < 3e-2


def test_window_dropout_masks_each_layer_input():
    lstm = make_lstm()
    inputs, state = _inputs(torch.float32)
    with torch.no_grad():
        plain, _ = lstm.forward_window(inputs, state, dropout=0.0)
        again, _ = lstm.forward_window(inputs, state, dropout=0.0)
        torch.manual_seed(1)
        dropped, _ = lstm.forward_window(inputs, state, dropout=0.5)
    assert torch.equal(plain, again)
    assert not torch.allclose(plain, dropped)
    # a dropped input position changes the outputs of the layer reading it from that step on
    inputs_zeroed = inputs.detach().clone()
    inputs_zeroed[:, :, -1] = 0
    with torch.no_grad():
        partial, _ = lstm.forward_window(inputs_zeroed, state)
    assert torch.equal(partial[:, :, :-1], plain[:, :, :-1])
