"""BiLM behaviour: outputs layout, statelessness, state handling, bad inputs, training construction."""

from __future__ import annotations

import pytest
import torch
from elmo_reference import TINY_OPTIONS

from elmo_model import BiLM, batch_to_ids

SENTENCES = [
    ["The", "cat", "sat", "on", "the", "mat", "."],
    ["Hi"],
    ["In", "the", "beginning", "God", "created", "the", "heaven", "and", "the", "earth", "."],
]


def run(model, sentences):
    with torch.no_grad():
        return model(batch_to_ids(sentences))


def test_output_layout(allennlp_reference):
    model = allennlp_reference.load()
    out = run(model, SENTENCES)
    assert out.layers.shape == (3, 3, 13, 32) and out.layers.dtype == torch.float32
    assert out.mask.dtype == torch.bool and out.lengths.tolist() == [9, 3, 13]
    tok = model.token_encoder(batch_to_ids(SENTENCES))
    assert torch.equal(out.layers[:, 0, :, :16], tok) and torch.equal(out.layers[:, 0, :, 16:], tok)
    assert out.layers[1, :, 3:].abs().sum() == 0  # every layer is zero at padding
    assert model.num_layers == 3 and model.output_dim == 32
    assert not model.training and not model.stateful


def test_stateless_outputs_do_not_depend_on_batch_mates_order_or_padding(allennlp_reference):
    model = allennlp_reference.load()
    alone = [run(model, [s]).layers[0] for s in SENTENCES]
    together = run(model, SENTENCES).layers
    reordered = run(model, SENTENCES[::-1]).layers.flip(0)
    for k, single in enumerate(alone):
        n = single.shape[1]
        for batch in (together, reordered):
            assert torch.allclose(batch[k, :, :n], single, atol=1e-6, rtol=0)
    # Extra padding positions (all-zero tokens appended) change nothing.
    ids = batch_to_ids(SENTENCES)
    padded = torch.cat([ids, torch.zeros(3, 4, 50, dtype=ids.dtype)], dim=1)
    with torch.no_grad():
        assert torch.equal(model(padded).layers[:, :, :13], together)
    # Repeated calls are identical (no hidden state).
    assert torch.equal(run(model, SENTENCES).layers, together)


def test_stateful_reset(allennlp_reference):
    model = allennlp_reference.load()
    fresh = run(model, SENTENCES).layers
    model.stateful = True
    first = run(model, SENTENCES).layers
    second = run(model, SENTENCES).layers
    assert torch.equal(first, fresh) and not torch.allclose(second, fresh, atol=1e-3)
    model.reset_states()
    assert model.state is None and torch.equal(run(model, SENTENCES).layers, fresh)
    run(model, SENTENCES)
    model.reset_states(torch.tensor([True, False, False]))
    again = run(model, SENTENCES).layers
    assert torch.equal(again[0], fresh[0]) and not torch.allclose(again[1], fresh[1], atol=1e-3)


def test_all_padding_row_is_zero_and_keeps_state(allennlp_reference):
    model = allennlp_reference.load()
    model.stateful = True
    ids = batch_to_ids(SENTENCES)
    run(model, SENTENCES)
    before = model.state.c.clone()
    ids[1] = 0
    with torch.no_grad():
        out = model(ids)
    assert out.mask[1].sum() == 0 and out.layers[1].abs().sum() == 0
    assert torch.equal(model.state.c[:, :, 1], before[:, :, 1])
    assert not torch.equal(model.state.c[:, :, 0], before[:, :, 0])


def test_awkward_sentences_have_defined_outputs(allennlp_reference):
    model = allennlp_reference.load()
    awkward = [[], ["x" * 10_000], ["bad\udcffsurrogate", "\ud800"], ["<S>", "</S>"]]
    out = run(model, awkward)
    assert out.lengths.tolist() == [2, 3, 4, 4]
    assert torch.isfinite(out.layers).all()
    # The 10,000-byte token is its first 48 bytes.
    assert torch.allclose(out.layers[1, :, :3], run(model, [["x" * 48]]).layers[0], atol=1e-6, rtol=0)
    assert torch.allclose(
        out.layers[2, :, :4], run(model, [["badsurrogate", ""]]).layers[0], atol=1e-6, rtol=0
    )
    assert run(model, []).layers.shape == (0, 3, 2, 32)


def test_bad_char_ids_raise_clear_errors(tiny_model):
    with pytest.raises(ValueError, match=r"shape \(B, T, 50\)"):
        tiny_model(torch.zeros(5, 50, dtype=torch.long))
    with pytest.raises(ValueError, match="last dimension 50"):
        tiny_model(torch.zeros(1, 5, 49, dtype=torch.long))
    with pytest.raises(ValueError, match=r"must lie in \[0, 261\]"):
        tiny_model(torch.full((1, 2, 50), 262))
    with pytest.raises(TypeError, match="integer tensor"):
        tiny_model(torch.zeros(1, 2, 50))


def test_from_options_is_trainable_with_bilm_tf_init():
    torch.manual_seed(0)
    model = BiLM.from_options({**TINY_OPTIONS, "dropout": 0.1})
    assert model.training and all(p.requires_grad for p in model.parameters())
    enc = model.token_encoder
    assert enc.char_embedding.weight[0].abs().sum() == 0 and enc.char_embedding.weight[1:].abs().max() <= 1
    transform_bias, carry_bias = enc.highways[0].linear.bias.split(15)
    assert torch.all(carry_bias == -2) and torch.all(transform_bias == 0)
    assert all(layer.bias.abs().sum() == 0 for layer in model.lstm.layers)
    assert model.lstm.dropout == 0.1
    assert model.options["char_cnn"]["n_characters"] == 262 and "dropout" not in model.options
    # The training path of docs/architecture.md: token encoder, then both streams through the stack.
    ids = batch_to_ids([["a", "b", "c"], ["d", "e", "f"]])[:, :-1]
    tok = model.token_encoder(ids)
    inputs = torch.stack([tok, tok.flip(1)])
    outs, state = model.lstm(inputs, torch.ones(2, 4, dtype=torch.bool), None)
    assert outs.shape == (2, 2, 2, 4, 6) and state.c.shape == (2, 2, 2, 12) and state.h.shape == (2, 2, 2, 6)
    outs.sum().backward()
    assert enc.convs[0].weight.grad.abs().sum() > 0 and enc.char_embedding.weight.grad[0].abs().sum() == 0


def test_state_follows_the_model_dtype(tiny_model):
    tiny_model.stateful = True
    ids = batch_to_ids(SENTENCES)
    with torch.no_grad():
        tiny_model(ids)
        tiny_model.double()
        out = tiny_model(ids)
    assert out.layers.dtype == torch.float64 and tiny_model.state.c.dtype == torch.float64


def test_bf16_autocast_forward_is_close_to_float32(allennlp_reference):
    model = allennlp_reference.load()
    model.stateful = True
    ids = batch_to_ids(SENTENCES)
    exact = run(model, SENTENCES).layers
    model.reset_states()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fast = model(ids)
    assert fast.layers.shape == exact.shape and torch.isfinite(fast.layers).all()
    assert (fast.layers.float() - exact).abs().max() < 0.25
    assert model.state.c.dtype == torch.float32


def test_inference_mode_then_no_grad_then_grad(tiny_model):
    """Buffers made under inference_mode (gate workspace, stored state) must not break later calls."""
    tiny_model.stateful = True
    ids = batch_to_ids(SENTENCES)
    with torch.inference_mode():
        first = tiny_model(ids).layers
    with torch.no_grad():
        second = tiny_model(ids).layers
    tiny_model.reset_states()
    with torch.no_grad():
        again = tiny_model(ids).layers
    assert torch.equal(again, first) and not torch.equal(second, first)
    tiny_model.stateful = False
    tiny_model(ids).layers.sum().backward()
    assert tiny_model.lstm.layers[0].w_hh.grad is not None
