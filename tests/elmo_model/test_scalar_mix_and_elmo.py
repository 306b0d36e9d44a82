"""ScalarMix (docs/model.md#layer-mixing) and the Elmo module (docs/model.md#layer-mixing)."""

from __future__ import annotations

import pytest
import torch

from elmo_model import Elmo, ScalarMix, batch_to_ids, remove_sentence_boundaries

SENTENCES = [["The", "cat", "sat", "."], ["Hi"]]


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


def test_elmo_mixes_without_and_with_boundaries(allennlp_reference):
    elmo = Elmo.from_files(allennlp_reference.options_file, allennlp_reference.weight_file, 2, dropout=0.0)
    ids = batch_to_ids(SENTENCES)
    with torch.no_grad():
        out = elmo(ids)
        layers = elmo.bilm(ids)
    assert len(out["elmo_representations"]) == 2 and len(elmo.scalar_mixes) == 2
    mean = layers.layers.mean(1)
    assert out["mask"].tolist() == [[True] * 4, [True, False, False, False]]
    rep = out["elmo_representations"][0]
    assert rep.shape == (2, 4, 32)
    assert torch.allclose(rep[0], mean[0, 1:5], atol=1e-6) and torch.allclose(
        rep[1, 0], mean[1, 1], atol=1e-6
    )
    assert rep[1, 1:].abs().sum() == 0
    assert not any(p.requires_grad for p in elmo.bilm.parameters())
    assert all(p.requires_grad for p in elmo.scalar_mixes.parameters())

    keep = Elmo(
        elmo.bilm, 1, dropout=0.0, keep_sentence_boundaries=True, scalar_mix_parameters=[-9e10, 1, -9e10]
    )
    with torch.no_grad():
        kept = keep(ids)
    assert torch.equal(kept["mask"], layers.mask)
    assert torch.allclose(kept["elmo_representations"][0], layers.layers[:, 1], atol=1e-6)
    # Extra leading dimensions are folded into the batch and restored.
    with torch.no_grad():
        nested = keep(ids.unsqueeze(0))
    assert nested["elmo_representations"][0].shape == (1, 2, 6, 32) and nested["mask"].shape == (1, 2, 6)


def test_elmo_dropout_and_boundary_removal(allennlp_reference):
    elmo = Elmo.from_files(allennlp_reference.options_file, allennlp_reference.weight_file, 1, dropout=0.5)
    ids = batch_to_ids(SENTENCES)
    elmo.train()
    torch.manual_seed(0)
    dropped = elmo(ids)["elmo_representations"][0]
    assert (dropped[0] == 0).float().mean() > 0.3
    x = torch.arange(2 * 6, dtype=torch.float32).view(2, 6, 1)
    trimmed, mask = remove_sentence_boundaries(x, torch.tensor([[True] * 6, [True] * 3 + [False] * 3]))
    assert trimmed[:, :, 0].tolist() == [[1, 2, 3, 4], [7, 0, 0, 0]] and mask.sum().item() == 5
