"""The training objective: one softmax shared by both directions, sampled or full (spec 7.4).

Shapes: V vocabulary, P projection size, N scored positions of one direction (B * U), S negatives,
R softmax rows a step touches (the union of its targets and negatives over both directions).

The sampled softmax does not differentiate through the (V, P) softmax matrix: it copies the R rows
a step touches into leaf tensors (``SoftmaxRows``), so the gradient is (R, P + 1) rows and the
exchange between workers (``softmax_exchange``) scales with R, not V.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

NEG_INF_LOGIT = torch.finfo(torch.float32).min
"""The logit an accidental hit gets (TF adds -FLT_MAX to it)."""


class SharedSoftmax(nn.Module):
    """weight (V, P), bias (V,): logits = h W^T + b, shared by the forward and backward LMs."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim))
        self.bias = nn.Parameter(torch.empty(vocab_size))
        self.reset_parameters()

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]

    def reset_parameters(self) -> None:
        """bilm-tf: W ~ N(0, 1/sqrt(P)), b = 0 (spec 7.4)."""
        with torch.no_grad():
            nn.init.normal_(self.weight, 0.0, 1.0 / math.sqrt(self.weight.shape[1]))
            nn.init.zeros_(self.bias)


# ---- log-uniform sampler ---------------------------------------------------------------------


def log_uniform_log_prob(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """log P(k) = log((ln(k+2) - ln(k+1)) / ln(V+1)) of the log-uniform (Zipfian) sampler; (...) -> (...) float64."""
    k = ids.to(torch.float64)
    return torch.log(torch.log1p(1.0 / (k + 1.0))) - math.log(math.log(vocab_size + 1.0))


@dataclass(frozen=True)
class NegativeSample:
    """S unique negatives drawn with the log-uniform sampler: ``ids`` (S,) long, and ``tries``, the
    number of draws it took to collect them (sets the expected counts of spec 7.4)."""

    ids: torch.Tensor
    tries: int

    def log_expected_count(self, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """log of the expected number of times each of ``ids`` (...) was drawn; (...) float32.

        TF: p * tries when no draw was a duplicate, else -expm1(tries * log1p(-p))."""
        log_p = log_uniform_log_prob(ids, vocab_size)
        if self.tries == self.ids.shape[0]:
            return (log_p + math.log(self.tries)).float()
        return torch.log(-torch.expm1(self.tries * torch.log1p(-torch.exp(log_p)))).float()


def sample_log_uniform(num: int, vocab_size: int, generator: torch.Generator) -> NegativeSample:
    """Draw log-uniform ids until ``num`` distinct ones appeared (TF's unique sampler).

    ``generator`` is a CPU generator; the ids come back on the CPU in draw order of first appearance.
    """
    if not 0 < num < vocab_size:
        raise ValueError(f"negatives must be in [1, vocab_size), got {num} for a vocabulary of {vocab_size}")
    log_range = math.log(vocab_size + 1.0)
    draws = torch.empty(0, dtype=torch.long)
    chunk = max(2 * num, 1024)
    while True:
        u = torch.rand(chunk, generator=generator, dtype=torch.float64)
        new = (torch.exp(u * log_range).long() - 1).clamp_(0, vocab_size - 1)
        draws = torch.cat([draws, new])
        unique, inverse = torch.unique(draws, return_inverse=True)
        if unique.shape[0] >= num:
            break
        chunk *= 2
    positions = torch.arange(draws.shape[0])
    first = torch.full((unique.shape[0],), draws.shape[0], dtype=torch.long)
    first.scatter_reduce_(0, inverse, positions, reduce="amin")
    first_sorted = first.sort().values[:num]
    return NegativeSample(ids=draws[first_sorted], tries=int(first_sorted[-1]) + 1)


# ---- losses ----------------------------------------------------------------------------------


def sampled_softmax_loss(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    true_weight: torch.Tensor,
    true_bias: torch.Tensor,
    sampled_weight: torch.Tensor,
    sampled_bias: torch.Tensor,
    negatives: NegativeSample,
    vocab_size: int,
) -> torch.Tensor:
    """Mean sampled-softmax cross-entropy of one direction (``tf.nn.sampled_softmax_loss``, spec 7.4).

    hidden (N, P); targets (N,) vocabulary ids; true_weight (N, P) / true_bias (N,) the softmax rows
    of the targets; sampled_weight (S, P) / sampled_bias (S,) the rows of ``negatives.ids`` (S,).
    Logits get log(expected count) subtracted; a negative equal to a position's target gets
    -FLT_MAX. Returns a float32 scalar.
    """
    hidden = hidden.float()
    log_q_true = negatives.log_expected_count(targets, vocab_size).to(hidden.device)
    log_q_sampled = negatives.log_expected_count(negatives.ids, vocab_size).to(hidden.device)
    true_logits = (hidden * true_weight.float()).sum(-1) + true_bias.float() - log_q_true
    sampled_logits = hidden @ sampled_weight.float().t() + sampled_bias.float() - log_q_sampled
    hits = targets.unsqueeze(1) == negatives.ids.to(targets.device).unsqueeze(0)
    sampled_logits = sampled_logits.masked_fill(hits, NEG_INF_LOGIT)
    logits = torch.cat([true_logits.unsqueeze(1), sampled_logits], dim=1)
    return (torch.logsumexp(logits, dim=1) - true_logits).mean()


def full_softmax_loss(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Mean full-softmax cross-entropy: hidden (N, P), weight (V, P), bias (V,), targets (N,) -> float32 scalar."""
    logits = hidden.float() @ weight.float().t() + bias.float()
    return F.cross_entropy(logits, targets)


# ---- one training step's softmax rows --------------------------------------------------------


@dataclass
class SoftmaxRows:
    """The R softmax rows one step touches, as leaf tensors whose ``.grad`` are the row gradients.

    ids (R,) sorted unique vocabulary ids; weight (R, P) and bias (R,) copies of those rows.
    """

    ids: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor

    @classmethod
    def gather(cls, softmax: SharedSoftmax, ids: torch.Tensor) -> SoftmaxRows:
        ids = torch.unique(ids.to(softmax.weight.device))
        return cls(
            ids=ids,
            weight=softmax.weight.detach().index_select(0, ids).requires_grad_(True),
            bias=softmax.bias.detach().index_select(0, ids).requires_grad_(True),
        )

    def local(self, ids: torch.Tensor) -> torch.Tensor:
        """Positions in this row set of vocabulary ``ids`` (...) (all must be present)."""
        return torch.searchsorted(self.ids, ids.to(self.ids.device))

    def grad(self) -> torch.Tensor:
        """(R, P + 1): [weight grad | bias grad] after backward (zeros for rows with no gradient)."""
        w = self.weight.grad if self.weight.grad is not None else torch.zeros_like(self.weight)
        b = self.bias.grad if self.bias.grad is not None else torch.zeros_like(self.bias)
        return torch.cat([w, b.unsqueeze(1)], dim=1)


@dataclass
class StepLoss:
    """loss: 0.5 * (fwd + bwd) (scalar, differentiable); per_direction (2,) detached [fwd, bwd];
    rows: the touched softmax rows (sampled softmax) or None (full softmax: grads land in the module)."""

    loss: torch.Tensor
    per_direction: torch.Tensor
    rows: SoftmaxRows | None


def bidirectional_loss(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    softmax: SharedSoftmax,
    negatives: int | None,
    generator: torch.Generator | None = None,
) -> StepLoss:
    """The biLM training loss (spec 7.4).

    hidden (2, B, U, P) top-layer outputs of the forward [0] and backward [1] LM; targets (2, B, U)
    vocabulary ids. ``negatives`` = S for the sampled softmax (each direction draws its own S unique
    negatives from ``generator``), None for the full softmax.
    """
    if negatives is None:
        per_direction = direction_losses_full(hidden, targets, softmax)
        return StepLoss(per_direction.mean(), per_direction.detach(), None)
    flat_h = hidden.reshape(2, -1, hidden.shape[-1])
    flat_t = targets.reshape(2, -1)
    vocab_size = softmax.vocab_size
    samples = [sample_log_uniform(negatives, vocab_size, generator) for _ in range(2)]
    rows = SoftmaxRows.gather(softmax, torch.cat([flat_t.reshape(-1).cpu(), samples[0].ids, samples[1].ids]))
    losses = []
    for d in range(2):
        true_at, sampled_at = rows.local(flat_t[d]), rows.local(samples[d].ids)
        losses.append(
            sampled_softmax_loss(
                flat_h[d],
                flat_t[d],
                rows.weight[true_at],
                rows.bias[true_at],
                rows.weight[sampled_at],
                rows.bias[sampled_at],
                samples[d],
                vocab_size,
            )
        )
    per_direction = torch.stack(losses)
    return StepLoss(per_direction.mean(), per_direction.detach(), rows)


def direction_losses_full(
    hidden: torch.Tensor, targets: torch.Tensor, softmax: SharedSoftmax
) -> torch.Tensor:
    """Full-softmax mean cross-entropy per direction: hidden (2, B, U, P), targets (2, B, U) -> (2,)."""
    flat_h = hidden.reshape(2, -1, hidden.shape[-1])
    flat_t = targets.reshape(2, -1)
    return torch.stack(
        [full_softmax_loss(flat_h[d], softmax.weight, softmax.bias, flat_t[d]) for d in range(2)]
    )
