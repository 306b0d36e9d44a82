"""Cached token vectors (docs/model.md#token-cache): the char CNN's outputs (to float32 rounding), with a fallback for other words."""

from __future__ import annotations

import torch
from elmo_reference import assert_matches_reference, run_stateful

from elmo_model import TokenCache, batch_to_ids


def test_cached_path_reproduces_reference(reference):
    model = reference.load()
    sentences = reference.sentences()
    vocabulary = sorted({w for row in sentences for s in row for w in s})
    cache = TokenCache(model.token_encoder, vocabulary, chunk_size=100)
    assert "<S>" in cache and "</S>" in cache and len(cache) == len(vocabulary) + 2
    actual = run_stateful(model, sentences, embed=lambda batch: model.forward_embeddings(*cache.embed(batch)))
    assert_matches_reference(actual, reference)


def test_out_of_vocabulary_words_fall_back_to_the_cnn(allennlp_reference):
    model = allennlp_reference.load()
    sentences = [["the", "unseen", "word", "the"], ["zebra"], []]
    cache = TokenCache(model.token_encoder, ["the", "word"])
    tokens, mask = cache.embed(sentences)
    with torch.no_grad():
        direct = model(batch_to_ids(sentences))
        cached = model.forward_embeddings(tokens, mask)
    assert torch.equal(mask, direct.mask)
    # Same values up to float32 rounding: matmul kernels block differently for different row counts.
    assert torch.allclose(cached.layers, direct.layers, atol=1e-6, rtol=0)
    assert "unseen" not in cache  # the fallback does not grow the cache
