"""Running the biLM over a shard's sentences: the pass runner (``PassRunner``) and the stateful path.

Values per input line (boundaries removed, float32 before the storage cast):
``all`` -> (N+1, n, 2P) [token layer, lstm 1 .. lstm N]; ``top`` -> (n, 2P) = layer N;
``average`` -> (n, 2P) = mean over the N+1 layers (AllenNLP's ``numpy.average(axis=0)``).
An empty line gives the same shapes with n = 0 and does not go through the model.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np
import torch

from elmo_model import BiLM, batch_to_ids
from elmo_model.static_batches import StaticBatch, build_passes
from elmo_model.static_inference import OutputSpec, StaticInference
from pipeline.embed import batching
from pipeline.embed.config import StoredDType
from pipeline.embed.errors import EmbedError
from pipeline.embed.inputs import ShardSpec
from pipeline.embed.sentences import PreparedLines
from pipeline.embed.settings import EmbedSettings, bucket_plan, work_settings
from pipeline.embed.shard_vectors import BufferPool, ShardAssembler, ShardVectors
from pipeline.embed.shard_work import ShardWork, work_from_lines


def select_layers(layers: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, N+1, T, 2P) -> (B, N+1, T, 2P) for ``all``; (B, T, 2P) for ``top`` / ``average``."""
    if mode == "all":
        return layers
    if mode == "top":
        return layers[:, -1]
    if mode == "average":
        return layers.mean(dim=1)
    raise EmbedError(f"layers: unknown mode {mode!r}; choose all, top or average")


class PassRunner:
    """One actor's model and the way it runs: stateless passes as static shapes
    (``elmo_model.static_inference``; on CUDA fixed bucket shapes replayed as CUDA graphs, their
    inputs copied from pinned memory on a load stream, their outputs compacted on the device and
    copied once per pass into reused pinned host buffers on a copy stream, no synchronising call
    per pass), or, stateful, ``BiLM.forward`` in input-order batches.

    ``run(work, assembler)`` places every piece's vectors into the shard's assembler
    (``shard_vectors``); ``embed(pieces)`` -> their ``ShardVectors`` (benchmarks).
    """

    IN_FLIGHT = 2
    """CUDA: passes queued ahead of the host before it waits for the oldest one's copy."""

    def __init__(self, bilm: BiLM, settings: EmbedSettings, device: torch.device):
        self.bilm, self.settings, self.device = bilm, settings, device
        self.pool = settings.pooled
        self.dtype = np.float16 if settings.config.dtype is StoredDType.float16 else np.float32
        self.row_shape = row_shape(settings.config.layers.value, bilm.num_layers, bilm.output_dim)
        self.static = None
        if not settings.config.stateful:
            dtype = torch.float16 if settings.config.dtype is StoredDType.float16 else torch.float32
            output = OutputSpec(settings.config.layers.value, pool=self.pool, dtype=dtype)
            self.static = StaticInference(bilm, output, settings.config.precision.value)
            if device.type == "cuda":
                self.copy_stream = torch.cuda.Stream(device)
                self._pinned: list[torch.Tensor | None] = [None] * (self.IN_FLIGHT + 1)
                self._passes = 0

    def assembler(self, first_line: int, num_lines: int, owner, sizes, buffers: BufferPool | None = None):
        """A ``ShardAssembler`` for this encoder's output rows and dtype."""
        return ShardAssembler(
            first_line, num_lines, owner, sizes, self.row_shape, self.dtype, self.pool, buffers
        )

    def run(self, work: ShardWork, assembler: ShardAssembler) -> None:
        """Embed ``work``'s pieces (prepared for this encoder's device) into ``assembler``."""
        if self.static is None:
            self._stateful(work.pieces, assembler)
        else:
            self.run_passes(work.passes, assembler)

    def embed(self, pieces: Sequence[Sequence[str]], buffers: BufferPool | None = None) -> ShardVectors:
        """Plan, build and run ``pieces`` (non-empty token lists) in one go, each its own line
        (benchmarks; the stage prepares its passes in a CPU operator instead)."""
        assembler = self.assembler(0, len(pieces), range(len(pieces)), [len(p) for p in pieces], buffers)
        if self.static is None:
            self._stateful(pieces, assembler)
        else:
            self.run_passes(build_passes(pieces, bucket_plan(self.settings, self.device.type)), assembler)
        return assembler.finish()

    def run_passes(self, passes: Sequence[tuple[list[int], StaticBatch]], assembler: ShardAssembler) -> None:
        """Run ``passes`` = (piece indices, batch) and place each one's output."""
        pending: deque = deque()
        for indices, batch in passes:
            rows = batch.output_rows(self.pool)
            pending.append((indices, self._to_host(self.static(batch), rows)))
            while len(pending) > (self.IN_FLIGHT if self.device.type == "cuda" else 0):
                self._collect(pending.popleft(), assembler)
        while pending:
            self._collect(pending.popleft(), assembler)

    def _stateful(self, pieces: Sequence[Sequence[str]], assembler: ShardAssembler) -> None:
        """``BiLM.forward`` in input-order batches (a piece at a time into the assembler: this path
        exists to reproduce the original order-dependent vectors, not for speed)."""
        batches = batching.in_order(len(pieces), self.settings.config.stateful_batch_size)
        values = embed_pieces(
            self.bilm, pieces, batches, self.settings.config.layers.value, self.device, self.pool
        )
        for piece, value in enumerate(values):
            assembler.place_piece(piece, value)

    def _to_host(self, out: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """The pass's ``rows`` real output rows on their way to the host. On CUDA: a device copy of
        them (the graph's buffer is overwritten by the next pass of its shape), then one copy on the
        copy stream into the next of ``IN_FLIGHT + 1`` reused pinned buffers (a buffer is used
        again only after its pass was collected), and the event that marks it done."""
        real = out[:rows]
        if out.device.type != "cuda":
            return real, None
        detached = real.clone()
        slot = self._passes % len(self._pinned)
        self._passes += 1
        pinned = self._pinned[slot]
        if pinned is None or pinned.numel() < real.numel():
            pinned = self._pinned[slot] = torch.empty(real.numel(), dtype=real.dtype, pin_memory=True)
        host = pinned[: real.numel()].view(real.shape)
        self.copy_stream.wait_stream(torch.cuda.current_stream(out.device))
        with torch.cuda.stream(self.copy_stream):
            host.copy_(detached, non_blocking=True)
            detached.record_stream(self.copy_stream)
            done = torch.cuda.Event()
            done.record(self.copy_stream)
        return host, done

    def _collect(self, item, assembler: ShardAssembler) -> None:
        indices, (host, done) = item
        if done is not None:
            done.synchronize()
        assembler.place(indices, host.numpy())


def row_shape(mode: str, num_layers: int, output_dim: int) -> tuple[int, ...]:
    """One token's (or pooled sentence's) stored row: (N+1, 2P) for ``all``, (2P,) otherwise."""
    return (num_layers, output_dim) if mode == "all" else (output_dim,)


def embed_pieces(
    bilm: BiLM,
    pieces: Sequence[Sequence[str]],
    batches: Sequence[Sequence[int]],
    mode: str,
    device: torch.device,
    pool: bool = False,
) -> list[np.ndarray]:
    """Run ``batches`` (lists of indices into ``pieces``, in the order given) through ``bilm.forward``
    (the stateful path: state carries from batch to batch in row order).

    ``pieces``: non-empty token lists. Returns one float32 array per piece with boundaries removed:
    (N+1, n_i, 2P) for ``all``, (n_i, 2P) otherwise; with ``pool`` the mean over the n_i tokens.
    """
    values: list[np.ndarray | None] = [None] * len(pieces)
    for batch in batches:
        ids = batch_to_ids([pieces[i] for i in batch]).to(device)  # (B, T+2, 50)
        # no_grad, not inference_mode: the biLM caches work buffers across calls, and inference
        # tensors cached here would break a later ordinary call on the same model
        with torch.no_grad():
            selected = select_layers(bilm(ids).layers, mode).float().cpu().numpy()
        for row, i in enumerate(batch):
            n = len(pieces[i])
            # copy: a view would keep the whole padded batch array alive
            value = selected[row, ..., 1 : n + 1, :]
            values[i] = value.mean(axis=-2) if pool else np.ascontiguousarray(value)
    return values  # type: ignore[return-value]


def embed_lines(encoder: PassRunner, prepared: PreparedLines) -> ShardVectors:
    """The vectors of every line of ``prepared`` (see ``PassRunner``), split lines joined,
    as the stage stores them. The stage's own order of the same steps, in one process (tests,
    benchmarks)."""
    spec = ShardSpec(0, prepared.first_line, prepared.num_lines, segments=(), input_sha256="")
    work = work_from_lines(spec, True, prepared, work_settings(encoder.settings))
    assembler = encoder.assembler(prepared.first_line, work.num_lines, work.owner, work.sizes)
    encoder.run(work, assembler)
    return assembler.finish()
