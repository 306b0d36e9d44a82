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
    offset_penalty,
    sample_log_uniform,
    sample_negatives,
    sampled_softmax_losses,
)


def value(tensor: torch.Tensor) -> float:
    """A one-element tensor's number, outside autograd (a float of a tensor that needs its gradient warns)."""
    return float(tensor.detach())


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
    # one row per direction: each row uses its own number of tries
    both = NegativeSample(ids=torch.tensor([[1, 2, 3], [4, 5, 6]]), tries=torch.tensor([3, 7]))
    got = both.log_expected_count(torch.stack([ids, ids]), 100)
    torch.testing.assert_close(got[0], no_duplicates.log_expected_count(ids, 100))
    torch.testing.assert_close(got[1], with_duplicates.log_expected_count(ids, 100))


def test_sample_negatives_draws_each_direction_like_two_single_draws():
    both = sample_negatives(40, 1000, torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3)
    single = [sample_log_uniform(40, 1000, gen) for _ in range(2)]
    assert both.ids.shape == (2, 40) and both.tries.shape == (2,)
    for d in range(2):
        assert torch.equal(both.ids[d], single[d].ids) and int(both.tries[d]) == single[d].tries


def test_sampled_softmax_matches_explicit_logits_and_masks_accidental_hits():
    torch.manual_seed(0)
    vocab, dim = 20, 4
    w, b = torch.randn(vocab, dim), torch.randn(vocab)
    h = torch.randn(1, 3, dim)
    targets = torch.tensor([[2, 7, 11]])
    # 7 is an accidental hit for row 1
    negatives = NegativeSample(ids=torch.tensor([[0, 7, 3]]), tries=torch.tensor([5]))
    rows = torch.cat([targets, negatives.ids], dim=1)
    loss = sampled_softmax_losses(h, targets, w[rows], b[rows], negatives, vocab)
    single = NegativeSample(ids=negatives.ids[0], tries=5)
    log_q = lambda ids: single.log_expected_count(ids, vocab)  # noqa: E731
    expected = []
    for i in range(3):
        true = h[0, i] @ w[targets[0, i]] + b[targets[0, i]] - log_q(targets[0, i : i + 1])[0]
        sampled = [
            h[0, i] @ w[k] + b[k] - log_q(torch.tensor([k]))[0]
            for k in single.ids.tolist()
            if k != int(targets[0, i])
        ]
        expected.append(torch.logsumexp(torch.stack([true, *sampled]), 0) - true)
    assert loss.shape == (1,)
    assert value(loss[0]) == pytest.approx(value(torch.stack(expected).mean()), rel=1e-5)


def test_low_precision_logits_stay_close_to_float32():
    torch.manual_seed(4)
    vocab, dim = 300, 16
    w, b = torch.randn(vocab, dim) * 0.3, torch.randn(vocab) * 0.1
    h = torch.randn(2, 10, dim, requires_grad=True)
    targets = torch.randint(0, vocab, (2, 10))
    negatives = sample_negatives(50, vocab, torch.Generator().manual_seed(0))
    rows = torch.cat([targets, negatives.ids], dim=1)
    exact = sampled_softmax_losses(h, targets, w[rows], b[rows], negatives, vocab)
    bf16 = sampled_softmax_losses(h, targets, w[rows], b[rows], negatives, vocab, torch.bfloat16)
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, exact, rtol=1e-2, atol=1e-2)
    (grad_exact,) = torch.autograd.grad(exact.sum(), h)
    (grad_bf16,) = torch.autograd.grad(bf16.sum(), h)
    assert float((grad_bf16 - grad_exact).norm() / grad_exact.norm()) < 2e-2


def test_sampled_gradient_touches_only_target_and_negative_rows():
    torch.manual_seed(1)
    softmax = SharedSoftmax(500, 8)
    hidden = torch.randn(2, 3, 4, 8, requires_grad=True)
    targets = torch.randint(3, 60, (2, 3, 4))
    negatives = sample_negatives(16, 500, torch.Generator().manual_seed(0))
    out = bidirectional_loss(hidden, targets, softmax, negatives)
    out.loss.backward()
    assert softmax.weight.grad is None  # the rows are separate leaves
    grad = out.rows.grad()
    # one row per (direction, target or negative), repeats included: a static shape
    assert grad.shape == (2 * (12 + 16), 9)
    expected_ids = torch.cat([targets.reshape(2, -1), negatives.ids], dim=1).reshape(-1)
    assert torch.equal(out.rows.ids, expected_ids)
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
        assert value(losses[d]) == pytest.approx(
            value(F.cross_entropy(logits, targets[d].reshape(-1))), rel=1e-6
        )
    out = bidirectional_loss(hidden, targets, softmax, None)
    assert out.rows is None
    assert value(out.loss) == pytest.approx(value(losses.mean()), rel=1e-6)


def test_sampled_loss_with_all_other_classes_as_negatives_approaches_full_softmax():
    # with every class a negative and tries equal to V-ish, the correction is a constant shift per class;
    # the sampled loss stays within a few percent of the full loss on a peaked distribution
    torch.manual_seed(3)
    softmax = SharedSoftmax(50, 6)
    hidden = torch.randn(2, 4, 5, 6) * 3
    targets = torch.randint(0, 50, (2, 4, 5))
    full = bidirectional_loss(hidden, targets, softmax, None).loss
    sampled = bidirectional_loss(
        hidden, targets, softmax, sample_negatives(49, 50, torch.Generator().manual_seed(0))
    ).loss
    assert abs(value(sampled) - value(full)) < 0.35 * value(full)


def test_sampler_rejects_too_many_negatives():
    with pytest.raises(ValueError, match="negatives"):
        sample_log_uniform(10, 10, torch.Generator())


def _offset_blind_to_the_sample(softmax, targets, negatives, rare_row):
    """A common offset of the softmax input that no row read by the step can see: the part of a
    rare row's direction orthogonal to every target and negative row (docs/training.md#divergence)."""
    read = torch.cat([targets.reshape(-1), negatives.ids.reshape(-1)]).unique()
    basis = torch.linalg.qr(softmax.weight.detach()[read].t()).Q  # (P, rows read)
    w = softmax.weight.detach()[rare_row]
    return 40.0 * (w - basis @ (basis.t() @ w))


@pytest.mark.parametrize("weight, sees_it", [(0.0, False), (0.05, True)])
def test_training_loss_sees_a_common_offset_only_with_the_offset_penalty(weight, sees_it):
    # the failure of docs/training.md#divergence at unit scale: an offset of every position's softmax
    # input leaves the sampled loss unchanged while the full softmax collapses onto a rare row that
    # the step did not draw; only the offset penalty (softmax.offset_penalty) makes the loss see it
    torch.manual_seed(4)
    vocab, dim = 400, 64
    softmax = SharedSoftmax(vocab, dim)
    hidden = torch.randn(2, 2, 4, dim)
    hidden -= hidden.reshape(2, -1, dim).mean(dim=1)[:, None, None]  # no offset to begin with
    targets = torch.randint(3, 30, (2, 2, 4))
    negatives = sample_negatives(8, vocab, torch.Generator().manual_seed(0))
    rare = next(r for r in range(vocab - 1, 0, -1) if r not in set(negatives.ids.reshape(-1).tolist()))
    shifted = hidden + _offset_blind_to_the_sample(softmax, targets, negatives, rare)

    full_before = value(bidirectional_loss(hidden, targets, softmax, None).loss)
    full_after = value(bidirectional_loss(shifted, targets, softmax, None).loss)
    assert full_after > full_before + 10  # the rare row takes the mass in the full softmax
    before = bidirectional_loss(hidden, targets, softmax, negatives, offset_weight=weight)
    after = bidirectional_loss(shifted, targets, softmax, negatives, offset_weight=weight)
    torch.testing.assert_close(after.per_direction, before.per_direction)  # the sampled CE is blind
    assert (value(after.loss) > value(before.loss) + 1.0) is sees_it


def test_offset_penalty_is_the_squared_norm_of_each_directions_mean_input():
    hidden = torch.randn(2, 3, 5, 4)
    offset = torch.tensor([[1.0, 2.0, 0.0, 2.0], [0.0, 0.0, 3.0, 4.0]])  # |.|^2 = 9 and 25
    hidden = hidden - hidden.reshape(2, -1, 4).mean(dim=1)[:, None, None] + offset[:, None, None]
    assert value(offset_penalty(hidden)) == pytest.approx(17.0, rel=1e-5)
    targets = torch.randint(0, 30, (2, 3, 5))
    softmax = SharedSoftmax(30, 4)
    plain = bidirectional_loss(hidden, targets, softmax, None)
    penalised = bidirectional_loss(hidden, targets, softmax, None, offset_weight=0.1)
    assert value(penalised.loss - plain.loss) == pytest.approx(1.7, rel=1e-5)
    torch.testing.assert_close(penalised.per_direction, plain.per_direction)
