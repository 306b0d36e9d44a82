"""ScalarMix (elmo_model/scalar_mix.py, docs/model.md#layer-mixing)."""

from __future__ import annotations

import pytest
import torch

from elmo_model import ScalarMix


def test_scalar_mix_weights_and_gamma():
    layers = [torch.full((2, 3, 4), float(v)) for v in (1.0, 2.0, 4.0)]
    mix = ScalarMix(3, initial_scalar_parameters=[0.0, 0.0, 0.0])
    assert torch.allclose(mix(layers), torch.full((2, 3, 4), 7.0 / 3))
    with torch.no_grad():
        mix.scalar_parameters[2].fill_(1.0)
        mix.gamma.fill_(2.0)
    w = torch.softmax(torch.tensor([0.0, 0.0, 1.0]), 0)
    assert torch.allclose(
        mix(torch.stack(layers, 1)), 2.0 * (w[0] + 2 * w[1] + 4 * w[2]) * torch.ones(2, 3, 4)
    )
    fixed = ScalarMix(3, initial_scalar_parameters=[-9e10, 1, -9e10], trainable=False)
    assert torch.equal(fixed(layers), layers[1]) and not any(p.requires_grad for p in fixed.parameters())


def test_scalar_mix_masked_layer_norm():
    torch.manual_seed(0)
    layers = [torch.randn(2, 5, 3) * (k + 1) + k for k in range(2)]
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    out = ScalarMix(2, do_layer_norm=True)(layers, mask)
    expected = 0
    for t in layers:
        real = t[mask]  # statistics over all unmasked entries of the batch, one scalar each
        mean, var = real.mean(), real.var(unbiased=False)
        expected = expected + 0.5 * (t - mean) / torch.sqrt(var + 1e-13)
    assert torch.allclose(out, expected, atol=1e-6)
    with pytest.raises(ValueError, match="needs a mask"):
        ScalarMix(2, do_layer_norm=True)(layers)
    with pytest.raises(ValueError, match="got 2 layers, expected 3"):
        ScalarMix(3)(layers)
    with pytest.raises(ValueError, match="has 2 values, expected 3"):
        ScalarMix(3, initial_scalar_parameters=[1, 2])
