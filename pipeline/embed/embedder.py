"""Running the biLM over a shard's sentences, and the Ray actor that does it.

Values per input line (boundaries removed, float32 before the storage cast):
``all`` -> (N+1, n, 2P) [token layer, lstm 1 .. lstm N]; ``top`` -> (n, 2P) = layer N;
``average`` -> (n, 2P) = mean over the N+1 layers (AllenNLP's ``numpy.average(axis=0)``).
An empty line gives the same shapes with n = 0 and does not go through the model.
"""

from __future__ import annotations

import ctypes
import json
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from elmo_model import BiLM, batch_to_ids
from elmo_model.static_batches import BucketPlan, StaticBatch, build_passes
from elmo_model.static_inference import OutputSpec, StaticInference
from pipeline.embed import batching
from pipeline.embed.config import (
    FileFormat,
    InvalidUTF8,
    LayerMode,
    Layout,
    LongSentences,
    Pool,
    Precision,
    StoredDType,
)
from pipeline.embed.errors import WORKER_ERRORS, EmbedError
from pipeline.embed.file_format import shard_format
from pipeline.embed.inputs import ShardSpec
from pipeline.embed.resume import commit_shard
from pipeline.embed.sentences import PreparedLines
from pipeline.embed.shard_vectors import BufferPool, ShardAssembler, ShardVectors
from pipeline.embed.shard_work import ShardWork, WorkSettings, work_from_lines
from pipeline.model_loader import ModelSource, load_bilm, pick_device


@dataclass(frozen=True)
class EmbedSettings:
    """What the actors and the preparing tasks need from EmbedConfig: its choices as its own enums
    (a name such as ``"top"`` is taken too, and checked), plus the ``threads`` and ``device`` the
    driver resolved. The plain values go only where a pure function or a file needs them."""

    layers: LayerMode
    dtype: StoredDType
    stateful: bool
    batch_tokens: int
    max_batch_sentences: int
    stateful_batch_size: int
    max_sentence_tokens: int
    long_sentences: LongSentences
    invalid_utf8: InvalidUTF8
    threads: int
    device: str
    precision: Precision = Precision.float32
    pool: Pool = Pool.none
    layout: Layout = Layout.allennlp
    file_format: FileFormat = FileFormat.hdf5

    def __post_init__(self) -> None:
        for name, kind in _CHOICES.items():
            object.__setattr__(self, name, kind(getattr(self, name)))

    @property
    def pooled(self) -> bool:
        return self.pool is Pool.mean


_CHOICES = {
    "layers": LayerMode,
    "dtype": StoredDType,
    "long_sentences": LongSentences,
    "invalid_utf8": InvalidUTF8,
    "precision": Precision,
    "pool": Pool,
    "layout": Layout,
    "file_format": FileFormat,
}


def select_layers(layers: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, N+1, T, 2P) -> (B, N+1, T, 2P) for ``all``; (B, T, 2P) for ``top`` / ``average``."""
    if mode == "all":
        return layers
    if mode == "top":
        return layers[:, -1]
    if mode == "average":
        return layers.mean(dim=1)
    raise EmbedError(f"layers: unknown mode {mode!r}; choose all, top or average")


class SentenceEncoder:
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
        self.dtype = np.float16 if settings.dtype is StoredDType.float16 else np.float32
        self.row_shape = row_shape(settings.layers.value, bilm.num_layers, bilm.output_dim)
        self.static = None
        if not settings.stateful:
            dtype = torch.float16 if settings.dtype is StoredDType.float16 else torch.float32
            output = OutputSpec(settings.layers.value, pool=self.pool, dtype=dtype)
            self.static = StaticInference(bilm, output, settings.precision.value)
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
        batches = batching.in_order(len(pieces), self.settings.stateful_batch_size)
        values = embed_pieces(self.bilm, pieces, batches, self.settings.layers.value, self.device, self.pool)
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


def bucket_plan(settings: EmbedSettings, device_type: str) -> BucketPlan:
    """The pass shapes for actors on ``device_type``: fixed buckets for CUDA graphs, shrinking
    passes elsewhere."""
    return BucketPlan(settings.batch_tokens, settings.max_batch_sentences, fixed=device_type == "cuda")


def work_settings(settings: EmbedSettings) -> WorkSettings:
    """What the CPU operator needs to prepare shards for actors on ``settings.device``."""
    return WorkSettings(
        stateful=settings.stateful,
        max_sentence_tokens=settings.max_sentence_tokens,
        long_sentences=settings.long_sentences,
        invalid_utf8=settings.invalid_utf8,
        plan=bucket_plan(settings, pick_device(settings.device).type),
    )


def embed_lines(encoder: SentenceEncoder, prepared: PreparedLines) -> ShardVectors:
    """The vectors of every line of ``prepared`` (see ``SentenceEncoder``), split lines joined,
    as the stage stores them. The stage's own order of the same steps, in one process (tests,
    benchmarks)."""
    spec = ShardSpec(0, prepared.first_line, prepared.num_lines, segments=(), input_sha256="")
    work = work_from_lines(spec, True, prepared, work_settings(encoder.settings))
    assembler = encoder.assembler(prepared.first_line, work.num_lines, work.owner, work.sizes)
    encoder.run(work, assembler)
    return assembler.finish()


def _libc_malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _libc_malloc_trim()


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS after a shard (glibc only; elsewhere nothing to do).

    Every shard allocates arrays of new sizes (length-bucketed batches, ragged outputs, the HDF5
    buffer) and glibc keeps freed pages in its arenas; trimming keeps an actor's footprint near what
    one shard needs rather than the high-water mark of every shard so far. (Measured: the whole
    job's peak grew 1.05-1.09x for 4x the input with it; the effect alone was within noise.)
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class LoadedModel:
    """The model part of an embedding actor, one implementation for the stage's ``ShardEmbedder``
    and users' ``ElmoEmbedder`` (``data_embedder.py``): the biLM loaded once on the actor's device
    (float32 exact: no TF32 shortcuts on CUDA), its ``SentenceEncoder``, a lock that keeps one
    shard's CUDA work together (a graph capture allows no other thread's), and the pooled host
    buffers shards are assembled in. ``embed(work)`` -> the shard's vectors; ``buffers.release``
    them once used."""

    def __init__(self, source: ModelSource, settings: EmbedSettings):
        self.source, self.settings = source, settings
        torch.set_num_threads(max(1, settings.threads))
        self.device = pick_device(settings.device)
        if self.device.type == "cuda":
            # fp32 vectors must equal a CPU float32 run (docs/model.md#reference-outputs): no TF32 shortcuts
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self.bilm = load_bilm(source, EmbedError).to(self.device)
        self.bilm.stateful = settings.stateful
        self.encoder = SentenceEncoder(self.bilm, settings, self.device)
        self.lock = threading.Lock()
        self.buffers = BufferPool()

    def embed(self, work: ShardWork) -> ShardVectors:
        """The vectors of ``work``'s lines (on a pooled buffer: ``buffers.release`` them once used)."""
        with self.lock:
            assembler = self.encoder.assembler(
                work.spec.first_line, work.num_lines, work.owner, work.sizes, self.buffers
            )
            self.encoder.run(work, assembler)
        return assembler.finish()


class ShardEmbedder:
    """Ray Data actor: loads the model once, then embeds and commits one prepared shard per input row.

    Input batch: ``work`` (``ShardWork.to_bytes``; ``write`` false only in a stateful rerun for a
    shard that is already complete: it still runs, to carry the state forward, but is not written).
    Output batch: ``entry`` (JSON manifest entry, see resume.commit_shard) and ``written`` (bool).
    A WORKER_ERRORS failure becomes the entry ``{"index", "error": message}``; the driver raises it.

    Stateless, Ray runs ``concurrent_calls(settings)`` calls at once, each on a thread of its own:
    the model lock lets one shard's passes run while the other threads write the shards before it
    (HDF5 or Parquet, sha256, upload: bulk work on whole arrays that releases the GIL), so the host
    side scales with the CPUs given to the actor and the device does not wait for it. Each shard's
    vectors are assembled in a pooled buffer (``shard_vectors.BufferPool``).
    """

    def __init__(self, source: ModelSource, settings: EmbedSettings, output: str):
        self.source, self.settings, self.output = source, settings, output
        self.model = LoadedModel(source, settings)

    def process(self, work: ShardWork) -> dict:
        """Embed one prepared shard and, when ``work.write``, commit it; the manifest entry (or the stats)."""
        if work.error:
            raise EmbedError(work.error)
        shard = self.model.embed(work)
        try:
            stats = dict(work.stats)
            if not work.write:
                return stats
            s = self.settings
            # each entry names what made it, so a shard copied out of its folder still says so
            stats.update(
                layers=s.layers.value,
                dtype=s.dtype.value,
                model_sha256=self.source.sha256,
                layout=s.layout.value,
                file_format=s.file_format.value,
                pool=s.pool.value,
            )
            return commit_shard(self.output, stats, shard, s.layout.value, shard_format(s.file_format.value))
        finally:
            self.model.buffers.release(shard)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        entries, written = [], []
        for data in batch["work"]:
            work = ShardWork.from_bytes(data)
            try:
                entries.append(json.dumps(self.process(work)))
            except WORKER_ERRORS as err:
                entries.append(json.dumps({"index": work.spec.index, "error": str(err)}))
            written.append(work.write)
            del work
            release_free_memory()
        return {"entry": entries, "written": written}


def concurrent_calls(settings: EmbedSettings) -> int:
    """Shards an actor works on at once: one in the model, the others written beside it, one per
    CPU the actor holds (at least one); stateful, one (its shards go through in order)."""
    return 1 if settings.stateful else max(2, settings.threads)
