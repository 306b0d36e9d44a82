"""The Ray Data graph of the embed stage.

    shard specs (one row and one block per shard; only the shards still to do)
      -> map_batches(ShardEmbedder), actor pool of ``workers`` (model loaded once per actor;
         one GPU each when asked): read the shard's lines, batch by length, run the biLM,
         encode the HDF5 shard -> (entry, payload)
      -> map_batches(write_shards), IO tasks: commit shard + entry atomically -> entry
      -> the driver, streaming (``iter_rows``): progress and the manifest.

Ray Data's streaming executor runs the stages concurrently and applies backpressure, so at any time
only a few shards' vectors are in flight, whatever the corpus size. Stateful mode needs the shards in
input order through one actor: one actor, one task in flight, and ``preserve_order``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict

import numpy as np
import ray
from ray.data import ActorPoolStrategy, DataContext

from pipeline.embed.embedder import EmbedSettings, ShardEmbedder
from pipeline.embed.errors import WORKER_ERRORS, EmbedError
from pipeline.embed.inputs import ShardSpec
from pipeline.embed.model_files import ModelSource
from pipeline.embed.resume import commit_shard

WRITER_CPUS = 0
"""The writer only moves bytes; reserving no CPU keeps the cores for the embedding actors."""


def write_shards(batch: dict[str, np.ndarray], output: str) -> dict[str, list]:
    """Ray Data task: commit every shard of ``batch`` that carries a payload; pass the rest through.
    A failed write becomes an ``error`` entry (see ShardEmbedder)."""
    entries, written = [], []
    for entry_json, payload in zip(batch["entry"], batch["payload"], strict=True):
        stats = json.loads(entry_json)
        if len(payload) and "error" not in stats:
            try:
                stats = commit_shard(output, stats, bytes(payload))
            except WORKER_ERRORS as err:
                stats = {"index": stats["index"], "error": str(err)}
        entries.append(json.dumps(stats))
        written.append(bool(len(payload)))
    return {"entry": entries, "written": written}


@contextmanager
def _data_context(preserve_order: bool) -> Iterator[None]:
    ctx = DataContext.get_current()
    logger = logging.getLogger("ray.data")
    saved = (
        ctx.execution_options.preserve_order,
        ctx.enable_progress_bars,
        ctx.print_on_execution_start,
        logger.level,
    )
    ctx.execution_options.preserve_order = preserve_order
    ctx.enable_progress_bars = False  # the stage draws its own bar
    ctx.print_on_execution_start = False
    logger.setLevel(logging.WARNING)  # per-dataset INFO lines would interleave with the bar
    try:
        yield
    finally:
        (
            ctx.execution_options.preserve_order,
            ctx.enable_progress_bars,
            ctx.print_on_execution_start,
            level,
        ) = saved
        logger.setLevel(level)


def embed_stream(
    todo: Sequence[tuple[ShardSpec, bool]],
    source: ModelSource,
    settings: EmbedSettings,
    output: str,
    workers: int,
    cpus_per_worker: float,
    gpus_per_worker: float,
) -> Iterator[dict]:
    """Embed and commit ``todo`` = (spec, write) pairs; yields ``{"entry": dict, "written": bool}`` per
    shard as shards finish (in input order when ``settings.stateful``). A worker's one-line error
    (bad input line, unwritable output) is raised here as EmbedError with the worker's message."""
    if not todo:
        return
    rows = [{"spec": json.dumps(spec.to_dict()), "write": write} for spec, write in todo]
    stateful = settings.stateful
    with _data_context(preserve_order=stateful):
        ds = ray.data.from_items(rows, override_num_blocks=len(rows))
        ds = ds.map_batches(
            ShardEmbedder,
            fn_constructor_kwargs={"source": source.to_dict(), "settings": asdict(settings)},
            batch_size=1,
            batch_format="numpy",
            compute=ActorPoolStrategy(
                size=1 if stateful else workers, max_tasks_in_flight_per_actor=1 if stateful else 2
            ),
            num_cpus=cpus_per_worker,
            num_gpus=gpus_per_worker,
        )
        ds = ds.map_batches(
            write_shards,
            fn_kwargs={"output": output},
            batch_size=1,
            batch_format="numpy",
            num_cpus=WRITER_CPUS,
        )
        for row in ds.iter_rows():
            entry = json.loads(row["entry"])
            if "error" in entry:
                raise EmbedError(entry["error"])
            yield {"entry": entry, "written": bool(row["written"])}
