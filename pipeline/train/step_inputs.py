"""What one training step reads: prepared on the host, then copied into the device's buffers.

A step reads the distinct token spellings of its batch (the token encoder runs once per spelling),
the row of each position among them, the targets, and both directions' negatives. Finding the
distinct spellings and drawing the negatives happen here, on the host and ahead of the device's
work, so the step itself has static shapes and never waits for the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from elmo_model.characters import MAX_CHARACTERS_PER_TOKEN
from pipeline.formats.shard_format import UNK_ID
from pipeline.train.data import LMBatch
from pipeline.train.objective import NegativeSample

_OOV_KEY = 1 << 40
"""Keys of out-of-vocabulary spellings start here, above every vocabulary id."""

CAPACITY_BUCKETS = 16
"""A CUDA graph's spelling buffer grows in steps of 1/16 of the batch's positions."""


@dataclass
class StepInputs:
    """chars (K, 50) long: distinct token spellings (+1-shifted), then any all-zero padding rows;
    positions (2, B, U) long: the row of ``chars`` at each input position (forward stream [0],
    reversed stream [1]); targets (2, B, U) long vocabulary ids; negatives: ids (2, S) and tries
    (2,) (None for the full softmax)."""

    chars: torch.Tensor
    positions: torch.Tensor
    targets: torch.Tensor
    negatives: NegativeSample | None

    def tensors(self) -> list[torch.Tensor]:
        tensors = [self.chars, self.positions, self.targets]
        if self.negatives is not None:
            tensors += [self.negatives.ids, self.negatives.tries]
        return tensors

    def pin_memory(self) -> StepInputs:
        return _rebuild(self, [t.pin_memory() for t in self.tensors()])

    def to(self, device: torch.device) -> StepInputs:
        return _rebuild(self, [t.to(device, non_blocking=True) for t in self.tensors()])

    def copy_(self, source: StepInputs) -> None:
        """Copy ``source`` into these tensors (asynchronously from pinned memory). Shapes must match,
        except that ``source`` may have fewer spelling rows: the rows past them are zeroed."""
        distinct = source.chars.shape[0]
        self.chars[:distinct].copy_(source.chars, non_blocking=True)
        self.chars[distinct:].zero_()
        for mine, theirs in zip(self.tensors()[1:], source.tensors()[1:], strict=True):
            mine.copy_(theirs, non_blocking=True)


def _rebuild(inputs: StepInputs, tensors: list[torch.Tensor]) -> StepInputs:
    negatives = NegativeSample(tensors[3], tensors[4]) if inputs.negatives is not None else None
    return StepInputs(tensors[0], tensors[1], tensors[2], negatives)


def distinct_tokens(char_ids: np.ndarray, token_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct spellings of a batch: char_ids (..., 50), token_ids (...) -> (chars (K, 50),
    positions (...) with chars[positions] == char_ids).

    In-vocabulary tokens are spelled by their vocabulary id, so ids key them; only the ``<UNK>``
    positions, each spelled as the word it stands for, are compared by spelling.
    """
    keys = np.asarray(token_ids, dtype=np.int64).reshape(-1).copy()
    flat = np.asarray(char_ids).reshape(-1, MAX_CHARACTERS_PER_TOKEN)
    unknown = np.flatnonzero(keys == UNK_ID)
    if unknown.size:
        spellings = np.ascontiguousarray(flat[unknown], dtype=np.int16)
        rows = spellings.view(np.dtype((np.void, spellings.shape[1] * 2))).ravel()
        _, oov = np.unique(rows, return_inverse=True)
        keys[unknown] = _OOV_KEY + oov.reshape(-1)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return flat[first], inverse.reshape(np.shape(token_ids))


def padded_capacity(rows: int, positions: int) -> int:
    """Rows of a graph's spelling buffer that holds ``rows`` distinct spellings of a batch of
    ``positions`` positions: rounded up to a bucket, so the buffer (and the graph) rarely changes."""
    bucket = max(1, math.ceil(positions / CAPACITY_BUCKETS))
    return min(positions, math.ceil(rows / bucket) * bucket)


def step_inputs(batch: LMBatch, negatives: NegativeSample | None) -> StepInputs:
    """The host-side inputs of one step (``chars`` holds exactly the distinct spellings)."""
    chars, positions = distinct_tokens(batch.char_ids.numpy(), batch.token_ids.numpy())
    return StepInputs(
        chars=torch.from_numpy(np.ascontiguousarray(chars, dtype=np.int64)),
        positions=torch.from_numpy(positions),
        targets=batch.targets,
        negatives=negatives,
    )
