import math

import pytest
import torch
from torch.nn import functional as F

from pipeline.train.objective import (
    NegativeSample,
    SharedSoftmax,
    bidirectional_loss,
    direction_losses_full,
    log_uniform_log_prob,
    sample_log_uniform,
    sampled_softmax_loss,
)


def test_log_uniform_probabilities_sum_to_one_and_decrease():
    p = log_uniform_log_prob(torch.arange(1000), 1000).exp()
    assert float(p.sum()) == pytest.approx(1.0, abs=1e-9)
    assert bool((p[1:] < p[:-1]).all())
    assert float(p[0]) == pytest.approx(math.log(2) / math.log(1001))


def test_sampler_draws_unique_ids_with_log_uniform_frequencies():
    gen = torch.Generator().manual_seed(0)
    sample = sample_log_uniform(50, 10_000, gen)
    assert sample.ids.shape == (50,)
    assert torch.unique(sample.ids).shape == (50,)
    assert int(sample.ids.min()) >= 0 and int(sample.ids.max()) < 10_000
    assert sample.tries >= 50
    # the first 10 ids hold ~25% of the log-uniform mass over 10k classes: they show up in nearly every sample
    hits = torch.zeros(10_000)
    for _ in range(200):
        hits[sample_log_uniform(50, 10_000, gen).ids] += 1
    assert float(hits[0]) >= 190
    assert float(hits[:10].mean()) > 90 and float(hits[5000:].mean()) < 5


def test_expected_counts_follow_tf():
    ids = torch.tensor([0, 5, 99])
    p = log_uniform_log_prob(ids, 100).exp()
    no_duplicates = NegativeSample(ids=torch.tensor([1, 2, 3]), tries=3)
    torch.testing.assert_close(no_duplicates.log_expected_count(ids, 100), torch.log(p * 3).float())
    with_duplicates = NegativeSample(ids=torch.tensor([1, 2, 3]), tries=7)
    torch.testing.assert_close(
        with_duplicates.log_expected_count(ids, 100), torch.log(-torch.expm1(7 * torch.log1p(-p))).float()
    )


def test_sampled_softmax_matches_explicit_logits_and_masks_accidental_hits():
    torch.manual_seed(0)
    vocab, dim = 20, 4
    w, b = torch.randn(vocab, dim), torch.randn(vocab)
    h = torch.randn(3, dim)
    targets = torch.tensor([2, 7, 11])
    negatives = NegativeSample(ids=torch.tensor([0, 7, 3]), tries=5)  # 7 is an accidental hit for row 1
    loss = sampled_softmax_loss(
        h, targets, w[targets], b[targets], w[negatives.ids], b[negatives.ids], negatives, vocab
    )
    log_q = lambda ids: negatives.log_expected_count(ids, vocab)  # noqa: E731
    expected = []
    for i in range(3):
        true = h[i] @ w[targets[i]] + b[targets[i]] - log_q(targets[i : i + 1])[0]
        sampled = [
            h[i] @ w[k] + b[k] - log_q(torch.tensor([k]))[0]
            for k in negatives.ids.tolist()
            if k != int(targets[i])
        ]
        expected.append(torch.logsumexp(torch.stack([true, *sampled]), 0) - true)
    assert float(loss) == pytest.approx(float(torch.stack(expected).mean()), rel=1e-5)


def test_sampled_gradient_touches_only_target_and_negative_rows():
    torch.manual_seed(1)
    softmax = SharedSoftmax(500, 8)
    hidden = torch.randn(2, 3, 4, 8, requires_grad=True)
    targets = torch.randint(3, 60, (2, 3, 4))
    out = bidirectional_loss(hidden, targets, softmax, 16, torch.Generator().manual_seed(0))
    out.loss.backward()
    assert softmax.weight.grad is None  # the rows are separate leaves
    grad = out.rows.grad()
    assert grad.shape == (out.rows.ids.shape[0], 9)
    assert out.rows.ids.shape[0] <= 24 + 32
    assert bool(torch.isin(targets.unique(), out.rows.ids).all())
    assert hidden.grad is not None and float(hidden.grad.abs().sum()) > 0
    torch.testing.assert_close(out.loss.detach(), out.per_direction.mean())


def test_full_softmax_loss_is_cross_entropy_per_direction():
    torch.manual_seed(2)
    softmax = SharedSoftmax(30, 5)
    hidden = torch.randn(2, 2, 3, 5)
    targets = torch.randint(0, 30, (2, 2, 3))
    losses = direction_losses_full(hidden, targets, softmax)
    for d in range(2):
        logits = hidden[d].reshape(-1, 5) @ softmax.weight.t() + softmax.bias
        assert float(losses[d]) == pytest.approx(
            float(F.cross_entropy(logits, targets[d].reshape(-1))), rel=1e-6
        )
    out = bidirectional_loss(hidden, targets, softmax, None)
    assert out.rows is None
    assert float(out.loss) == pytest.approx(float(losses.mean()), rel=1e-6)


def test_sampled_loss_with_all_other_classes_as_negatives_approaches_full_softmax():
    # with every class a negative and tries equal to V-ish, the correction is a constant shift per class;
    # the sampled loss stays within a few percent of the full loss on a peaked distribution
    torch.manual_seed(3)
    softmax = SharedSoftmax(50, 6)
    hidden = torch.randn(2, 4, 5, 6) * 3
    targets = torch.randint(0, 50, (2, 4, 5))
    full = bidirectional_loss(hidden, targets, softmax, None).loss
    sampled = bidirectional_loss(hidden, targets, softmax, 49, torch.Generator().manual_seed(0)).loss
    assert abs(float(sampled) - float(full)) < 0.35 * float(full)


def test_sampler_rejects_too_many_negatives():
    with pytest.raises(ValueError, match="negatives"):
        sample_log_uniform(10, 10, torch.Generator())
