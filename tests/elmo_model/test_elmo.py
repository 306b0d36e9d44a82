"""The Elmo module (elmo_model/elmo.py, docs/model.md#layer-mixing): AllenNLP's mixed representations."""

from __future__ import annotations

import torch

from elmo_model import Elmo, batch_to_ids, remove_sentence_boundaries

SENTENCES = [["The", "cat", "sat", "."], ["Hi"]]


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
