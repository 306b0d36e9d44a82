"""The stage's Ray Data actor: one prepared shard per input row, embedded and committed."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np

from pipeline.embed.config import PoolOver
from pipeline.embed.errors import WORKER_ERRORS, EmbedError
from pipeline.embed.loaded_model import LoadedModel, release_free_memory
from pipeline.embed.settings import EmbedSettings, concurrent_calls
from pipeline.embed.shard_vectors import BufferPool, pooled_by_record
from pipeline.embed.shard_work import ShardWork
from pipeline.embed.shard_writers import ShardWriters
from pipeline.embed.startup import ACTOR_KEY
from pipeline.model_loader import ModelSource


class EmbedActor:
    """Ray Data actor: loads the model once, then embeds and commits one prepared shard per input row.

    Input batch: ``work`` (``ShardWork.to_bytes``; ``write`` false only in a stateful rerun for a
    shard that is already complete: it still runs, to carry the state forward, but is not written).
    Output batch: ``entry`` (JSON manifest entry, see resume.commit_shard) and ``written`` (bool).
    A WORKER_ERRORS failure becomes the entry ``{"index", "error": message}``; the driver raises it.

    Stateless, Ray runs ``concurrent_calls(settings)`` calls at once, each on a thread of its own:
    the model lock lets one shard's passes run while the other threads' shards are committed, each
    by a writer process of its own (``shard_writers``: the file written and hashed, its entry; h5py
    runs one call at a time in a process, so writers on threads stop scaling near 2.3 cores), so
    the host side scales with the CPUs given to the actor and the device does not wait for it. Each
    shard's vectors are assembled in a pooled buffer of shared memory the writers read
    (``shard_vectors.BufferPool`` on ``shard_writers.SharedBuffers``).
    """

    def __init__(self, source: ModelSource, settings: EmbedSettings, output: str):
        began_at, started = time.time(), time.perf_counter()
        self.source, self.settings, self.output = source, settings, output
        self.by_record = settings.config.pool_over is PoolOver.record
        # started first: the writers' imports overlap the model's load
        self.writers = ShardWriters(concurrent_calls(settings))
        self.model = LoadedModel(source, settings, BufferPool(self.writers.buffers))
        # its start-up, reported with the first shard it commits (startup.StartupClock reads it)
        self._startup: dict[str, float] | None = {
            "began_at": began_at,
            "model_load": time.perf_counter() - started,
        }

    def process(self, work: ShardWork) -> dict:
        """Embed one prepared shard and, when ``work.write``, commit it; the manifest entry (or the stats)."""
        if work.error:
            raise EmbedError(work.error)
        startup, self._startup = self._startup, None  # the first call takes it
        started = time.perf_counter()
        embedded = dataclasses.replace(self.model.embed(work), records=work.records)
        shard = pooled_by_record(embedded) if self.by_record else embedded
        if startup is not None:
            startup["first_passes"] = time.perf_counter() - started
        try:
            stats = dict(work.stats)
            if not work.write:
                return stats
            c, fmt = self.settings.config, self.settings.file_format
            # each entry names what made it, so a shard copied out of its folder still says so
            stats.update(
                layers=c.layers.value,
                dtype=c.dtype.value,
                model_sha256=self.source.sha256,
                layout=fmt.layout,
                file_format=fmt.name,
                pool=c.pool.value,
            )
            if self.by_record:
                stats.update(pool_over="record", rows=shard.num_lines)
            started = time.perf_counter()
            entry = self.writers.commit(self.output, stats, shard, fmt)
            if startup is None:
                return entry
            startup["first_write"] = time.perf_counter() - started
            return {**entry, ACTOR_KEY: startup}
        finally:
            self.model.buffers.release(embedded)

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
