"""The token encoder's char CNN as one chunked matrix product, against one Conv1d per filter width."""

from __future__ import annotations

import pytest
import torch
from elmo_reference import TINY_OPTIONS

from elmo_model.options import BiLMOptions
from elmo_model.token_encoder import TokenEncoder


def make_encoder(activation: str) -> TokenEncoder:
    options = {**TINY_OPTIONS, "char_cnn": {**TINY_OPTIONS["char_cnn"], "activation": activation}}
    torch.manual_seed(0)
    encoder = TokenEncoder(BiLMOptions.from_dict(options)).double()
    encoder.reset_parameters()
    with torch.no_grad():
        for conv in encoder.convs:
            conv.bias.normal_()
    return encoder


def conv1d_reference(encoder: TokenEncoder, chars: torch.Tensor) -> torch.Tensor:
    """bilm-tf's order: convolution (bias inside), max over the valid windows, then the activation."""
    channels_first = chars.transpose(1, 2)
    return torch.cat([encoder.activation(conv(channels_first).amax(-1)) for conv in encoder.convs], -1)


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("n_tokens", [1, 31, 32, 70])  # below, at and across chunk boundaries
def test_matches_one_conv1d_per_width_values_and_gradients(activation, n_tokens):
    encoder = make_encoder(activation)
    chars = torch.randn(n_tokens, 50, encoder.options.char_embed_dim, dtype=torch.float64, requires_grad=True)
    ours = encoder.activation(encoder.max_pooled_convolutions(chars))
    theirs = conv1d_reference(encoder, chars)
    assert ours.shape == (n_tokens, encoder.options.n_filters)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    probe = torch.randn_like(ours)
    ours_grads = torch.autograd.grad((ours * probe).sum(), [chars, *encoder.parameters()], allow_unused=True)
    theirs_grads = torch.autograd.grad(
        (theirs * probe).sum(), [chars, *encoder.parameters()], allow_unused=True
    )
    for a, b in zip(ours_grads, theirs_grads, strict=True):
        if a is None or b is None:
            assert a is None and b is None
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_narrow_filters_never_see_the_zero_padding_past_the_token():
    """A width-w filter pools only its 51 - w windows: a large value in the padded tail would leak."""
    encoder = make_encoder("relu")
    chars = torch.full((2, 50, encoder.options.char_embed_dim), -1.0, dtype=torch.float64)
    with torch.no_grad():
        for conv in encoder.convs:
            conv.weight.fill_(1.0)
            conv.bias.zero_()
        # All-negative chars: any window that reached the zeros past char 50 would pool a larger value.
        pooled = encoder.max_pooled_convolutions(chars)
    expected = torch.cat(
        [torch.full((2, count), -1.0 * width * chars.shape[-1]) for width, count in encoder.options.filters],
        -1,
    ).double()
    torch.testing.assert_close(pooled, expected, rtol=0, atol=0)


def test_no_tokens():
    encoder = make_encoder("relu")
    pooled = encoder.max_pooled_convolutions(
        torch.empty(0, 50, encoder.options.char_embed_dim, dtype=torch.float64)
    )
    assert pooled.shape == (0, encoder.options.n_filters)
