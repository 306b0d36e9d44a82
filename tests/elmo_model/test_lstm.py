"""The fused clipped LSTM stack (docs/model.md#lstm-cell, docs/training.md#network-in-training) against a plain per-row, per-direction reference."""

from __future__ import annotations

import pytest
import torch

from elmo_model import LSTMState, StackedBiLSTM
from elmo_model.lstm import INTERNAL_TO_TF, permute_gate_blocks

N, C, P = 2, 10, 4


def make_lstm(skip=True, dropout=0.0, clip=0.5) -> StackedBiLSTM:
    torch.manual_seed(1)
    lstm = StackedBiLSTM(
        N, P, C, P, cell_clip=clip, proj_clip=clip, use_skip_connections=skip, dropout=dropout
    )
    with torch.no_grad():
        for layer in lstm.layers:
            layer.bias.normal_(0, 0.5)
    return lstm


def reference_cell(lstm, layer, d, x, c, h):
    """docs/model.md#lstm-cell verbatim in TF gate order for one row: x (in,), c (C,), h (P,)."""
    lay = lstm.layers[layer]
    kernel = permute_gate_blocks(torch.cat([lay.w_ih[d], lay.w_hh[d]]), INTERNAL_TO_TF)
    bias = permute_gate_blocks(lay.bias[d], INTERNAL_TO_TF)
    i, j, f, o = (torch.cat([x, h]) @ kernel + bias).split(C)
    c = torch.sigmoid(f + 1.0) * c + torch.sigmoid(i) * torch.tanh(j)
    c = c.clamp(-lstm.cell_clip, lstm.cell_clip)
    h = (torch.sigmoid(o) * torch.tanh(c)) @ lay.w_p[d]
    return c, h.clamp(-lstm.proj_clip, lstm.proj_clip)


def reference_stack(lstm, inputs, lengths, state):
    outs = torch.zeros(N, 2, inputs.shape[1], inputs.shape[2], P)
    final = LSTMState(state.c.clone(), state.h.clone())
    for d in range(2):
        for b, n in enumerate(lengths):
            x = inputs[d, b, :n]
            for layer in range(N):
                c, h = state.c[layer, d, b], state.h[layer, d, b]
                ys = []
                for t in range(n):
                    c, h = reference_cell(lstm, layer, d, x[t], c, h)
                    ys.append(h)
                y = torch.stack(ys) if ys else x[:0]
                if lstm.use_skip_connections and layer > 0:
                    y = y + x
                outs[layer, d, b, :n] = y
                final.c[layer, d, b], final.h[layer, d, b] = c, h
                x = y
    return outs, final


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("skip", [False, True])
def test_matches_per_row_reference_with_padding_and_state(grad, skip):
    lstm = make_lstm(skip=skip).eval()
    lengths = [5, 0, 3, 5, 1]
    inputs = torch.randn(2, len(lengths), 6, P)
    mask = torch.arange(6) < torch.tensor(lengths).unsqueeze(1)
    inputs = inputs * mask.unsqueeze(-1)
    state = LSTMState(torch.randn(N, 2, 5, C), torch.randn(N, 2, 5, P))
    with torch.set_grad_enabled(grad):
        outs, final = lstm(inputs, mask, state)
    assert outs.requires_grad is grad
    with torch.no_grad():
        ref_outs, ref_final = reference_stack(lstm, inputs, lengths, state)
    assert outs.shape == (N, 2, 5, 6, P)
    assert torch.allclose(outs, ref_outs, atol=1e-6)
    assert torch.allclose(final.c, ref_final.c, atol=1e-6) and torch.allclose(final.h, ref_final.h, atol=1e-6)
    # The row of length 0 keeps its state exactly and outputs zeros.
    assert torch.equal(final.c[:, :, 1], state.c[:, :, 1]) and outs[:, :, 1].abs().sum() == 0


@pytest.mark.parametrize("split_rows", [0, 3, 100])
@pytest.mark.parametrize("stateless", [False, True])
def test_repeated_tokens_and_any_direction_split_match_the_reference(split_rows, stateless):
    """The no-grad path's shortcuts: layer 0's input products once per distinct token vector,
    directions finishing alone once fewer than SPLIT_ROWS rows run (0: never, 100: always), and no
    recurrent product at step 0 of a stateless call."""
    lstm = make_lstm().eval()
    lstm.SPLIT_ROWS = split_rows
    lengths = [6, 0, 3, 6, 1, 4, 5, 6]
    mask = torch.arange(7) < torch.tensor(lengths).unsqueeze(1)
    vocabulary = torch.randn(3, P)
    inputs = vocabulary[torch.randint(0, 3, (2, len(lengths), 7))] * mask.unsqueeze(-1)
    assert lstm._distinct_input_products(lstm.layers[0], inputs[:, mask]) is not None
    state = LSTMState(torch.randn(N, 2, len(lengths), C), torch.randn(N, 2, len(lengths), P))
    if stateless:
        state = LSTMState(torch.zeros_like(state.c), torch.zeros_like(state.h))
    with torch.no_grad():
        outs, final = lstm(inputs, mask, None if stateless else state)
        ref_outs, ref_final = reference_stack(lstm, inputs, lengths, state)
    assert torch.allclose(outs, ref_outs, atol=1e-6)
    assert torch.allclose(final.c, ref_final.c, atol=1e-6) and torch.allclose(final.h, ref_final.h, atol=1e-6)


def test_distinct_products_only_when_rows_repeat():
    lstm = make_lstm()
    assert lstm._distinct_input_products(lstm.layers[0], torch.randn(2, 10, P)) is None


def test_carrying_state_equals_one_long_run():
    """Truncated BPTT usage: two windows with carried state give the same outputs as one window."""
    lstm = make_lstm()
    inputs = torch.randn(2, 3, 8, P)
    mask = torch.ones(3, 8, dtype=torch.bool)
    whole, whole_state = lstm(inputs, mask)
    first, state = lstm(inputs[:, :, :5], mask[:, :5])
    second, state = lstm(inputs[:, :, 5:], mask[:, 5:], state.detach())
    assert torch.allclose(torch.cat([first, second], dim=3), whole, atol=1e-6)
    assert torch.allclose(state.h, whole_state.h, atol=1e-6)
    whole.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lstm.parameters())


def test_dropout_on_layer_inputs_only_in_training():
    lstm = make_lstm(dropout=0.5)
    inputs, mask = torch.randn(2, 2, 4, P), torch.ones(2, 4, dtype=torch.bool)
    lstm.eval()
    with torch.no_grad():
        a, _ = lstm(inputs, mask)
        b, _ = lstm(inputs, mask)
    assert torch.equal(a, b)
    lstm.train()
    torch.manual_seed(3)
    c, _ = lstm(inputs, mask)
    assert not torch.allclose(a, c)


def test_bad_shapes_and_masks():
    lstm = make_lstm()
    with pytest.raises(ValueError, match=r"inputs must have shape \(2, B, T, in\)"):
        lstm(torch.zeros(3, 2, 4, P), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask must have shape"):
        lstm(torch.zeros(2, 2, 4, P), torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="prefix of each row"):
        lstm(torch.zeros(2, 1, 3, P), torch.tensor([[True, False, True]]))
    with pytest.raises(ValueError, match="state shapes"):
        lstm(
            torch.zeros(2, 2, 4, P),
            torch.ones(2, 4, dtype=torch.bool),
            LSTMState(torch.zeros(N, 2, 3, C), torch.zeros(N, 2, 3, P)),
        )


def test_bf16_autocast_runs_and_stays_close():
    lstm = make_lstm().eval()
    inputs, mask = torch.randn(2, 3, 5, P), torch.ones(3, 5, dtype=torch.bool)
    with torch.no_grad():
        exact, _ = lstm(inputs, mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fast, _ = lstm(inputs, mask)
    assert fast.shape == exact.shape and torch.isfinite(fast).all()
    assert (fast.float() - exact).abs().max() < 0.05
