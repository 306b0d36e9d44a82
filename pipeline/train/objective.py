"""The training objective: one softmax shared by both directions, sampled or full (docs/training.md#loss).

Shapes: V vocabulary, P projection size, N scored positions of one direction (B * U), S negatives,
K = 2 (N + S) softmax rows a step reads (repeats included).

The sampled softmax does not differentiate through the (V, P) softmax matrix: it copies the K rows
a step reads into leaf tensors (``SoftmaxRows``), so the gradient is (K, P + 1) rows, summed per
distinct row and exchanged between workers in proportion to K, not V (``distributed``).
Every shape is fixed by the batch shape and the number of negatives, so a CUDA graph can capture
the whole step.
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
        """bilm-tf: W ~ N(0, 1/sqrt(P)), b = 0 (docs/training.md#loss)."""
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
    """Unique negatives drawn with the log-uniform sampler, for one direction or D at once.

    ``ids`` (S,) or (D, S) long: the negatives; ``tries`` an int or a (D,) long tensor: the number
    of draws it took to collect each row's S distinct ids (it sets the expected counts of docs/training.md#loss).
    """

    ids: torch.Tensor
    tries: int | torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> NegativeSample:
        tries = self.tries
        if isinstance(tries, torch.Tensor):
            tries = tries.to(device, non_blocking=non_blocking)
        return NegativeSample(self.ids.to(device, non_blocking=non_blocking), tries)

    def log_expected_count(self, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """log of the expected number of times each of ``ids`` was drawn: (...) or, with D rows of
        negatives, (D, ...) -> the same shape, float32. No host synchronisation.

        TF: p * tries when no draw was a duplicate, else -expm1(tries * log1p(-p))."""
        log_p = log_uniform_log_prob(ids, vocab_size)
        tries = torch.as_tensor(self.tries, dtype=torch.float64, device=ids.device)
        tries = tries.reshape(tries.shape + (1,) * (ids.dim() - tries.dim()))
        without_duplicates = log_p + torch.log(tries)
        with_duplicates = torch.log(-torch.expm1(tries * torch.log1p(-torch.exp(log_p))))
        return torch.where(tries == self.ids.shape[-1], without_duplicates, with_duplicates).float()


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


def sample_negatives(num: int, vocab_size: int, generator: torch.Generator) -> NegativeSample:
    """One `sample_log_uniform` draw per direction: ids (2, S), tries (2,), on the CPU."""
    draws = [sample_log_uniform(num, vocab_size, generator) for _ in range(2)]
    return NegativeSample(
        ids=torch.stack([d.ids for d in draws]), tries=torch.tensor([d.tries for d in draws])
    )


# ---- losses ----------------------------------------------------------------------------------


class _MixedLogits(torch.autograd.Function):
    """h (D, N, P) @ w (D, S, P)^T with low-precision operands, float32 logits out (D, N, S).

    cuBLAS accumulates in float32 and rounds the logits once to the operands' dtype; everything
    after the product is float32 (as large-model trainers compute their vocabulary logits).
    ``torch.bmm(out_dtype=float32)`` would skip that rounding, but it is new in torch 2.8 and a
    bf16 benchmark at batch 2048 (2.7 GB of logits) that used it diverged where float32 did not,
    so the plain product is used. Gradients: bf16 products, returned in the operands' dtypes.
    """

    @staticmethod
    def forward(ctx, h, w, dtype):
        h16, w16 = h.to(dtype), w.to(dtype)
        ctx.save_for_backward(h16, w16)
        ctx.dtypes = (h.dtype, w.dtype)
        return torch.bmm(h16, w16.transpose(1, 2)).float()

    @staticmethod
    def backward(ctx, d_logits):
        h16, w16 = ctx.saved_tensors
        d16 = d_logits.to(h16.dtype)
        d_h = torch.bmm(d16, w16).to(ctx.dtypes[0])
        d_w = torch.bmm(d16.transpose(1, 2), h16).to(ctx.dtypes[1])
        return d_h, d_w, None


def sampled_softmax_losses(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    negatives: NegativeSample,
    vocab_size: int,
    logits_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Mean sampled-softmax cross-entropy of each direction (``tf.nn.sampled_softmax_loss``, docs/training.md#loss).

    hidden (D, N, P); targets (D, N) vocabulary ids; weight (D, N + S, P) / bias (D, N + S) the
    softmax rows of each direction's targets followed by those of its negatives ``negatives.ids``
    (D, S). Logits get log(expected count) subtracted; a negative equal to a position's target gets
    -FLT_MAX. ``logits_dtype``: run the (N, S) logit product with operands in that dtype (bf16
    training); everything after the product is float32. Returns (D,) float32. Static shapes and
    no host synchronisation, so a CUDA graph can capture it.
    """
    n = targets.shape[1]
    h = hidden.float()
    w, b = weight.float(), bias.float()
    log_q_true = negatives.log_expected_count(targets, vocab_size)
    log_q_sampled = negatives.log_expected_count(negatives.ids, vocab_size)
    true_logits = (h * w[:, :n]).sum(-1) + b[:, :n] - log_q_true
    if logits_dtype is None:
        sampled_logits = torch.bmm(h, w[:, n:].transpose(1, 2))
    else:
        sampled_logits = _MixedLogits.apply(hidden, weight[:, n:], logits_dtype)
    sampled_logits = sampled_logits + (b[:, n:] - log_q_sampled).unsqueeze(1)
    hits = targets.unsqueeze(2) == negatives.ids.unsqueeze(1)
    sampled_logits = sampled_logits.masked_fill(hits, NEG_INF_LOGIT)
    log_normaliser = torch.logaddexp(true_logits, torch.logsumexp(sampled_logits, dim=2))
    return (log_normaliser - true_logits).mean(dim=1)


def full_softmax_loss(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Mean full-softmax cross-entropy: hidden (N, P), weight (V, P), bias (V,), targets (N,) -> float32 scalar."""
    logits = hidden.float() @ weight.float().t() + bias.float()
    return F.cross_entropy(logits, targets)


# ---- one training step's softmax rows --------------------------------------------------------


@dataclass
class SoftmaxRows:
    """The softmax rows one step reads, as leaf tensors whose ``.grad`` are the row gradients.

    ids (K,) vocabulary ids, one per (direction, target or negative) with repeats, in the order
    [targets of direction 0, its negatives, targets of direction 1, its negatives]; weight (K, P)
    and bias (K,) copies of those rows. K is fixed by the batch shape and the negatives, so the
    step keeps static shapes; repeats are summed after backward (``distributed.merge_rows``).
    """

    ids: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor

    @classmethod
    def gather(cls, softmax: SharedSoftmax, ids: torch.Tensor) -> SoftmaxRows:
        ids = ids.to(softmax.weight.device)
        return cls(
            ids=ids,
            weight=softmax.weight.detach().index_select(0, ids).requires_grad_(True),
            bias=softmax.bias.detach().index_select(0, ids).requires_grad_(True),
        )

    def grad(self) -> torch.Tensor:
        """(K, P + 1): [weight grad | bias grad] after backward (zeros for rows with no gradient)."""
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


def offset_penalty(hidden: torch.Tensor) -> torch.Tensor:
    """Mean over directions of |mean over positions of h|^2: hidden (2, B, U, P) -> float32 scalar.

    The common offset of the softmax input is a direction the sampled softmax barely sees
    (docs/training.md#divergence): it shifts the logit of every row by w . offset, and only the
    rows a step draws feel it. The softmax bias can absorb any offset, so penalising it costs the
    model nothing it could express.
    """
    return hidden.reshape(2, -1, hidden.shape[-1]).float().mean(dim=1).pow(2).sum(dim=-1).mean()


def bidirectional_loss(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    softmax: SharedSoftmax,
    negatives: NegativeSample | None,
    logits_dtype: torch.dtype | None = None,
    offset_weight: float = 0.0,
) -> StepLoss:
    """The biLM training loss (docs/training.md#loss).

    hidden (2, B, U, P) top-layer outputs of the forward [0] and backward [1] LM; targets (2, B, U)
    vocabulary ids. ``negatives``: each direction's S unique negatives (ids (2, S) and tries (2,),
    from `sample_negatives`, on the hidden states' device) for the sampled softmax, None for the
    full softmax. ``logits_dtype``: see `sampled_softmax_losses`. ``offset_weight``: the weight of
    `offset_penalty` added to the loss (``per_direction`` stays the cross-entropies).
    """
    penalty = offset_weight * offset_penalty(hidden) if offset_weight else 0.0
    if negatives is None:
        per_direction = direction_losses_full(hidden, targets, softmax)
        return StepLoss(per_direction.mean() + penalty, per_direction.detach(), None)
    flat_h = hidden.reshape(2, -1, hidden.shape[-1])
    flat_t = targets.reshape(2, -1)
    n, s = flat_t.shape[1], negatives.ids.shape[1]
    rows = SoftmaxRows.gather(softmax, torch.cat([flat_t, negatives.ids], dim=1).reshape(-1))
    per_direction = sampled_softmax_losses(
        flat_h,
        flat_t,
        rows.weight.view(2, n + s, -1),
        rows.bias.view(2, n + s),
        negatives,
        softmax.vocab_size,
        logits_dtype,
    )
    return StepLoss(per_direction.mean() + penalty, per_direction.detach(), rows)


def direction_losses_full(
    hidden: torch.Tensor, targets: torch.Tensor, softmax: SharedSoftmax
) -> torch.Tensor:
    """Full-softmax mean cross-entropy per direction: hidden (2, B, U, P), targets (2, B, U) -> (2,)."""
    flat_h = hidden.reshape(2, -1, hidden.shape[-1])
    flat_t = targets.reshape(2, -1)
    return torch.stack(
        [full_softmax_loss(flat_h[d], softmax.weight, softmax.bias, flat_t[d]) for d in range(2)]
    )
