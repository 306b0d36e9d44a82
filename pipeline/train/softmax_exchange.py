"""Exchanging the softmax gradient between workers in proportion to the rows a step touches.

The softmax is most of the parameters (406M of 500M in the original model), but a sampled-softmax
step only touches R rows (its targets and negatives), R << V. The softmax is kept out of DDP; each
rank all-gathers its (row ids, row gradients) and sums them per row (spec 7.5: sparse gradients
are concatenated, divided by the number of towers and summed per unique row). The result equals a
dense all-reduce mean of the (V, P + 1) gradient, at a cost of world * R_max rows instead of V.

Byte counts are what one rank receives from the collectives of one step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class RowGradient:
    """A sparse softmax gradient: ids (U,) sorted unique vocabulary ids, values (U, P + 1) = [dW | db]."""

    ids: torch.Tensor
    values: torch.Tensor

    def to_sparse(self, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sparse COO gradients for weight (V, P) and bias (V,)."""
        index = self.ids.unsqueeze(0)
        dim = self.values.shape[1] - 1
        weight = torch.sparse_coo_tensor(index, self.values[:, :dim], (vocab_size, dim), is_coalesced=True)
        bias = torch.sparse_coo_tensor(index, self.values[:, dim], (vocab_size,), is_coalesced=True)
        return weight, bias

    def to_dense(self, vocab_size: int) -> torch.Tensor:
        """(V, P + 1) dense gradient."""
        out = self.values.new_zeros(vocab_size, self.values.shape[1])
        out.index_copy_(0, self.ids, self.values)
        return out


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def exchange_rows(ids: torch.Tensor, values: torch.Tensor) -> tuple[RowGradient, int]:
    """Mean over ranks of every rank's sparse row gradient.

    ids (R,) unique ids of this rank's rows, values (R, D) their gradients (R may differ per rank).
    Returns the union of all ranks' rows with the summed gradients divided by the world size, and
    the bytes this rank received (the lengths, then world * R_max padded ids and rows).
    """
    world = _world()
    if world == 1:
        order = torch.argsort(ids)
        return RowGradient(ids[order], values[order]), 0
    device = values.device
    count = torch.tensor([ids.shape[0]], dtype=torch.long, device=device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    counts_list = [int(c) for c in counts]
    r_max = max(counts_list)
    padded_ids = torch.zeros(r_max, dtype=torch.long, device=device)
    padded_ids[: ids.shape[0]] = ids.to(device)
    padded_values = values.new_zeros(r_max, values.shape[1])
    padded_values[: values.shape[0]] = values
    all_ids = [torch.empty_like(padded_ids) for _ in range(world)]
    all_values = [torch.empty_like(padded_values) for _ in range(world)]
    dist.all_gather(all_ids, padded_ids)
    dist.all_gather(all_values, padded_values)
    cat_ids = torch.cat([rank_ids[:n] for rank_ids, n in zip(all_ids, counts_list, strict=True)])
    cat_values = torch.cat([rank_values[:n] for rank_values, n in zip(all_values, counts_list, strict=True)])
    union, inverse = torch.unique(cat_ids, return_inverse=True)
    summed = values.new_zeros(union.shape[0], values.shape[1]).index_add_(0, inverse, cat_values)
    received = world * (
        count.element_size() + r_max * (padded_ids.element_size() + values.shape[1] * values.element_size())
    )
    return RowGradient(union, summed / world), received


def dense_allreduce_mean(grad: torch.Tensor) -> int:
    """All-reduce mean of a dense gradient in place; returns the bytes a rank receives in a ring all-reduce."""
    world = _world()
    if world == 1:
        return 0
    dist.all_reduce(grad)
    grad.div_(world)
    return int(2 * (world - 1) * grad.numel() * grad.element_size() // world)
