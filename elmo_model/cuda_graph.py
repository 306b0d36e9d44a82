"""Replaying a static-shape step as one CUDA graph: its hundreds of kernel launches cost one.

Used by the training step (pipeline/train) and by static-shape inference (one graph per bucket
shape, ``elmo_model.static_inference``). A training step has static shapes (B x U positions, K softmax rows, a spelling buffer that only
grows), so after a few eager runs its whole forward, backward, exchange and update can be
captured once and replayed: at ELMo's batch sizes the eager step spends most of its time launching
kernels, not running them. The function must read only tensors that stay in place between calls
(inputs copied into fixed buffers, parameters, optimizer state) and return the same tensors each
call; PyTorch's "whole network capture" recipe, with DDP's: warm-up on a side stream, and (with
several ranks) 11 warm-up iterations and the model wrapped on that stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

WARMUP_SINGLE = 3
"""Eager runs before capture with one rank: kernels compiled, cuBLAS and allocator warmed."""
WARMUP_DDP = 11
"""Eager runs before capture under DDP, which PyTorch requires before a full-backward capture."""


class GraphedStep:
    """Calls ``fn`` (returning a dict of tensors) eagerly on a side stream for the first ``warmup``
    calls, then captures it and replays the graph on every later call.

    Every call is a real step: warm-up calls do the work eagerly; the capturing call records
    without running, then replays once. `reset` drops the graph (the static buffers changed); the
    next calls warm up and capture again. If capture fails, the step keeps running eagerly and one
    warning says why.
    """

    def __init__(
        self,
        fn: Callable[[], dict[str, torch.Tensor]],
        warmup: int,
        what: str = "the training step",
        pool: tuple | None = None,
        stream: torch.cuda.Stream | None = None,
    ):
        """``pool``: a memory pool (``torch.cuda.graph_pool_handle()``) shared with other graphs that
        are never replayed concurrently with this one; their transient allocations then share
        memory. Outputs that must outlive another graph's replay belong in buffers made outside.

        ``stream``: the side stream of the eager warm-up runs, shared by steps that never run at
        once. PyTorch's allocator reuses a freed block only on the stream that allocated it, so
        every step on a stream of its own keeps its warm-up's memory reserved for good: at one
        stream per bucket shape, ``original``'s float32 inference reserved 50 GiB it never used
        again and ran out of memory on an 80 GB H100 (docs/benchmarks.md)."""
        self.fn, self.warmup, self.what, self.pool = fn, warmup, what, pool
        self.stream = torch.cuda.Stream() if stream is None else stream
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: dict[str, torch.Tensor] | None = None
        self.calls = 0
        self.captures = 0
        self.failure: str | None = None

    @property
    def replaying(self) -> bool:
        return self.graph is not None

    def reset(self) -> None:
        self.graph, self.outputs, self.calls = None, None, 0

    def __call__(self) -> dict[str, torch.Tensor]:
        if self.graph is not None:
            self.graph.replay()
            return self.outputs
        if self.failure is not None or self.calls < self.warmup:
            self.calls += 1
            return self._eager()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = self.fn()
        except Exception as err:  # noqa: BLE001 - any capture failure falls back to the eager step
            self.failure = (
                f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
            )
            log.warning("CUDA graph capture of %s failed (%s); it runs eagerly", self.what, self.failure)
            torch.cuda.synchronize()
            return self._eager()
        self.graph, self.outputs = graph, outputs
        self.captures += 1
        graph.replay()
        return outputs

    def _eager(self) -> dict[str, torch.Tensor]:
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            outputs = self.fn()
        torch.cuda.current_stream().wait_stream(self.stream)
        return outputs
