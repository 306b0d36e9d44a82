"""Both reference sets reproduce through the stateful procedure of docs/model.md#reference-outputs, and the token vectors."""

from __future__ import annotations

import h5py
import numpy as np
import torch
from elmo_reference import assert_matches_reference, run_stateful

from elmo_model import batch_to_ids, tokens_to_ids


def test_stateful_outputs_match_reference(reference):
    actual = run_stateful(reference.load(), reference.sentences())
    assert_matches_reference(actual, reference)


def test_stateless_matches_only_first_batch(reference):
    """docs/model.md#statefulness: without state carry batch 0 matches and later batches do not."""
    sentences, expected = reference.sentences(), reference.expected()
    model = reference.load()
    assert not model.stateful
    errors = []
    for i in (0, 1):
        batch = [sentences[k][i] for k in range(3)]
        with torch.no_grad():
            out = model(batch_to_ids(batch))
        errors.append(
            max(
                np.abs(out.layers[k, 2, 1 : len(batch[k]) + 1].numpy() - expected[k][i]).max()
                for k in range(3)
            )
        )
    assert errors[0] < 2e-6
    assert errors[1] > 0.1


def test_state_bookkeeping_like_bilm_tf(reference):
    """docs/model.md#statefulness: with 4 state rows, row 3 stays zero; a batch of 2 leaves row 2 unchanged."""
    model = reference.load()
    model.max_batch_size = 4
    run_stateful(model, reference.sentences())
    state = model.state
    assert state.c.shape[2] == 4
    assert state.c[:, :, 3].abs().max() < 1e-7 and state.h[:, :, 3].abs().max() < 1e-7
    assert state.c[:, :, :3].abs().max() > 0.1
    before = state.c.clone(), state.h.clone()
    with torch.no_grad():
        model(batch_to_ids([["The", "first", "sentence", "."], ["Second", "one"]]))
    assert torch.allclose(model.state.c[:, :, 2], before[0][:, :, 2], atol=1e-6)
    assert torch.allclose(model.state.h[:, :, 2], before[1][:, :, 2], atol=1e-6)
    assert not torch.allclose(model.state.c[:, :, :2], before[0][:, :, :2])


def test_token_embeddings_match_allennlp_file(allennlp_reference):
    """docs/model.md#token-encoder: the token encoder reproduces elmo_token_embeddings.hdf5, in padded sentence batches."""
    d = allennlp_reference.directory
    words = (d / "vocab_test.txt").read_text(encoding="utf-8").strip().split("\n")
    assert len(words) == 458
    with h5py.File(d / "elmo_token_embeddings.hdf5", "r") as f:
        expected = f["embedding"][()]
    model = allennlp_reference.load()
    chunks = [words[i : i + 50] for i in range(0, len(words), 50)]
    with torch.no_grad():
        out = model(batch_to_ids(chunks))
        flat = model.token_encoder(tokens_to_ids(words)).numpy()
    actual = torch.cat([out.layers[b, 0, 1 : len(c) + 1, :16] for b, c in enumerate(chunks)]).numpy()
    assert actual.shape == expected.shape
    assert np.allclose(actual, expected, atol=1e-6)
    assert np.allclose(flat, expected, atol=1e-6)


def test_boundary_tokens_equal_automatic_boundaries(allennlp_reference):
    model = allennlp_reference.load()
    with torch.no_grad():
        auto = model(batch_to_ids([["x"]])).layers[0, 0, :, :16]
        literal = model.token_encoder(tokens_to_ids(["<S>", "</S>"]))
    assert torch.equal(literal[0], auto[0])
    assert torch.equal(literal[1], auto[2])
