"""Collectives between the training ranks: world size and rank, all-reduce, barrier, and the
exchange of the softmax gradient in proportion to the rows a step reads.

Without a process group (one rank in-process, the tests) every function is the single-rank identity.

The softmax is most of the parameters (406M of 500M in the original model), but a sampled-softmax
step only reads K rows (its targets and negatives, repeats included), K << V. The softmax is kept
out of DDP; each rank all-gathers its K (row id, row gradient) pairs and the result is summed per
row (docs/training.md#optimisation: sparse gradients are concatenated, divided by the number of towers and summed per
unique row). That equals a dense all-reduce mean of the (V, P + 1) gradient, at a cost of
world x K rows instead of V.

Every shape here is fixed by K and the world size: the number of distinct rows is never read on
the host, so a CUDA graph can capture the step. Byte counts are what one rank receives from the
collectives of one step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class RowGradient:
    """A sparse softmax gradient in K fixed slots.

    ids (K,) long, values (K, P + 1) = [dW | db], valid (K,) bool: the slots that hold a touched
    row. Ids are distinct among valid slots; the others carry zero values (id 0 after
    `merge_rows`, whose valid slots come first, in increasing id order), so indexing with every
    slot (an index_add of zeros) is harmless.
    """

    ids: torch.Tensor
    values: torch.Tensor
    valid: torch.Tensor

    def count(self) -> torch.Tensor:
        """Distinct rows, a 0-dim long tensor on the gradient's device."""
        return self.valid.sum()

    def to_dense(self, vocab_size: int) -> torch.Tensor:
        """(V, P + 1) dense gradient."""
        return self.values.new_zeros(vocab_size, self.values.shape[1]).index_add_(0, self.ids, self.values)


def merge_rows(ids: torch.Tensor, values: torch.Tensor, vocab_size: int) -> RowGradient:
    """Sum the gradients of equal ids: ids (K,) in [0, V] (V marks an empty slot), values (K, D)."""
    sorted_ids, order = torch.sort(ids)
    first = torch.ones_like(sorted_ids, dtype=torch.bool)
    first[1:] = sorted_ids[1:] != sorted_ids[:-1]
    slot = torch.cumsum(first, 0) - 1  # each sorted entry's slot: the number of distinct ids before it
    merged = values.new_zeros(values.shape).index_add_(0, slot, values.index_select(0, order))
    # every entry of a group writes the same id into its slot, so the order of the writes is moot
    slot_ids = torch.full_like(ids, vocab_size).scatter_(0, slot, sorted_ids)
    valid = slot_ids < vocab_size
    return RowGradient(torch.where(valid, slot_ids, 0), torch.where(valid.unsqueeze(1), merged, 0.0), valid)


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) without one."""
    if _initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _world() -> int:
    return world()[1]


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over ranks in place (NCCL reduces only CUDA tensors); returns it."""
    if _initialized():
        dist.all_reduce(tensor)
    return tensor


def broadcast_from_rank0(tensor: torch.Tensor) -> torch.Tensor:
    """Rank 0's ``tensor`` on every rank, in place (NCCL sends only CUDA tensors); returns it."""
    if _initialized():
        dist.broadcast(tensor, src=0)
    return tensor


def barrier() -> None:
    if _initialized():
        dist.barrier()


def _all_gather(output: torch.Tensor, tensor: torch.Tensor) -> None:
    """Every rank's ``tensor`` concatenated into ``output`` (``all_gather_single`` where this torch
    has it; older releases call it ``all_gather_into_tensor``)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, tensor)


def exchange_rows(ids: torch.Tensor, values: torch.Tensor, vocab_size: int) -> tuple[RowGradient, int]:
    """Mean over ranks of every rank's row gradients, summed per row.

    ids (K,) this rank's row ids (repeats allowed), values (K, D) their gradients; K is the same on
    every rank. Returns the merged rows in world x K slots (K on one rank) and the bytes this rank
    received.
    """
    world = _world()
    if world == 1:
        return merge_rows(ids, values, vocab_size), 0
    all_ids = ids.new_empty(world * ids.shape[0])
    all_values = values.new_empty(world * values.shape[0], values.shape[1])
    _all_gather(all_ids, ids.contiguous())
    _all_gather(all_values, values.contiguous())
    merged = merge_rows(all_ids, all_values, vocab_size)
    merged.values.div_(world)
    return merged, rows_exchange_bytes(world, ids.shape[0], values.shape[1])


def rows_exchange_bytes(world: int, rows: int, width: int) -> int:
    """Bytes a rank receives when every rank all-gathers ``rows`` (int64 id, ``width`` float32) pairs."""
    return world * rows * (8 + 4 * width) if world > 1 else 0


def dense_exchange_bytes(world: int, numel: int) -> int:
    """Bytes a rank receives in a ring all-reduce of ``numel`` float32 values."""
    return 2 * (world - 1) * numel * 4 // world


def dense_allreduce_mean(grad: torch.Tensor) -> int:
    """All-reduce mean of a float32 gradient in place; returns the bytes a rank receives (ring)."""
    world = _world()
    if world == 1:
        return 0
    dist.all_reduce(grad)
    grad.div_(world)
    return dense_exchange_bytes(world, grad.numel())
