"""A checkpoint's snapshot: the state of one step in host memory that training no longer changes,
taken without making the training step wait.

On a GPU the snapshot is the device-to-host copy a checkpoint file needs anyway. It is queued on
the device's current stream, after the step that produced the state and before the next one (which
the stream runs only once the copy is done, so no tensor changes while it is read), into **pinned**
host buffers that `HostSnapshot` keeps from one save to the next: the host thread neither waits for
the copy (the thread that writes the file waits on an event recorded after it) nor allocates and
faults in fresh memory at every save. The device runs the copy at pinned-memory bandwidth; the
price is one state size of pinned host memory from the first save to the end of the run.

CPU tensors are copied at once into fresh memory that is freed after the save, so a CPU run holds
no second copy of its state between saves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

Place = tuple
"""Where a tensor sits in a payload: the keys and indices leading to it."""


@dataclass
class Snapshot:
    """A payload whose tensors are host copies; `wait` returns once every copy has landed.

    ``payload``: the containers of the original rebuilt, tensors replaced by their copies, anything
    else (numbers, strings, bytes) kept. ``events``: one per device whose copies are still queued."""

    payload: Any
    events: list[torch.cuda.Event] = field(default_factory=list)

    def wait(self) -> None:
        """Block until the device-to-host copies are done (at once for a CPU-only payload)."""
        for event in self.events:
            event.synchronize()


class HostSnapshot:
    """Takes snapshots of checkpoint payloads, reusing pinned host buffers for device tensors.

    A buffer is reused for the tensor at the same place in the next payload when shape and dtype
    match, and replaced otherwise; buffers no longer used are dropped. The caller must not take a
    snapshot while an earlier one is still being read (the checkpointer waits for its previous save
    first), since the buffers are overwritten.
    """

    def __init__(self) -> None:
        self._pinned: dict[Place, torch.Tensor] = {}

    @property
    def pinned_bytes(self) -> int:
        """Host memory held for device tensors between saves."""
        return sum(b.numel() * b.element_size() for b in self._pinned.values())

    def take(self, payload: Any) -> Snapshot:
        """A snapshot of ``payload`` (dicts, lists and tuples of tensors and plain values). A tensor
        met twice (tied weights) is copied once and appears twice in the copy."""
        memo: dict[int, torch.Tensor] = {}
        used: dict[Place, torch.Tensor] = {}
        devices: set[torch.device] = set()

        def copy(value: Any, path: Place) -> Any:
            if isinstance(value, torch.Tensor):
                if id(value) not in memo:
                    memo[id(value)] = self._copy_tensor(value.detach(), path, used, devices)
                return memo[id(value)]
            if isinstance(value, dict):
                return {key: copy(item, (*path, key)) for key, item in value.items()}
            if type(value) in (list, tuple):
                return type(value)(copy(item, (*path, i)) for i, item in enumerate(value))
            return value

        copied = copy(payload, ())
        self._pinned = used
        events = []
        for device in devices:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        return Snapshot(copied, events)

    def _copy_tensor(
        self, value: torch.Tensor, path: Place, used: dict[Place, torch.Tensor], devices: set[torch.device]
    ) -> torch.Tensor:
        if value.device.type == "cpu":
            return value.clone()
        if value.device.type != "cuda":
            return value.to("cpu", copy=True)  # no pinned memory to queue into: a blocking copy
        buffer = self._pinned.get(path)
        if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
            buffer = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
        buffer.copy_(value, non_blocking=True)
        used[path] = buffer
        devices.add(value.device)
        return buffer
