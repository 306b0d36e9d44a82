"""The model part of an embedding actor, loaded once: one implementation for the stage's actor
(``actor.EmbedActor``) and users' ``ElmoEmbedder`` (``data_embedder``)."""

from __future__ import annotations

import ctypes
import threading

import torch

from pipeline.embed.errors import EmbedError
from pipeline.embed.pass_runner import PassRunner
from pipeline.embed.settings import EmbedSettings
from pipeline.embed.shard_vectors import BufferPool, ShardVectors
from pipeline.embed.shard_work import ShardWork
from pipeline.model_loader import ModelSource, load_bilm, pick_device


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
    """The model part of an embedding actor, one implementation for the stage's ``EmbedActor``
    and users' ``ElmoEmbedder`` (``data_embedder.py``): the biLM loaded once on the actor's device
    (float32 exact: no TF32 shortcuts on CUDA), its ``PassRunner``, a lock that keeps one
    shard's CUDA work together (a graph capture allows no other thread's), and the pooled host
    buffers shards are assembled in (``buffers``: private memory unless a pool is given, the
    stage's actor's shared with its writer processes). ``embed(work)`` -> the shard's vectors;
    ``buffers.release`` them once used."""

    def __init__(self, source: ModelSource, settings: EmbedSettings, buffers: BufferPool | None = None):
        self.source, self.settings = source, settings
        torch.set_num_threads(max(1, settings.threads))
        self.device = pick_device(settings.device)
        if self.device.type == "cuda":
            # fp32 vectors must equal a CPU float32 run (docs/model.md#reference-outputs): no TF32 shortcuts
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self.bilm = load_bilm(source, EmbedError).to(self.device)
        self.bilm.stateful = settings.config.stateful
        self.encoder = PassRunner(self.bilm, settings, self.device)
        self.lock = threading.Lock()
        self.buffers = buffers if buffers is not None else BufferPool()

    def embed(self, work: ShardWork) -> ShardVectors:
        """The vectors of ``work``'s lines (on a pooled buffer: ``buffers.release`` them once used)."""
        with self.lock:
            assembler = self.encoder.assembler(
                work.spec.first_line, work.num_lines, work.owner, work.sizes, self.buffers
            )
            self.encoder.run(work, assembler)
        return assembler.finish()
