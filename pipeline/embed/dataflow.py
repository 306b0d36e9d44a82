"""The Ray Data graph of the embed stage.

    shard specs (one row and one block per shard; only the shards still to do)
      -> map_batches(ShardEmbedder), actor pool of ``workers`` (model loaded once per actor;
         one GPU each when asked): read the shard's lines, batch by length, run the biLM,
         encode the HDF5 shard and commit it (shard + entry, atomically) -> entry
      -> the driver, streaming (``iter_rows``): progress and the manifest.

The actor commits its own shard rather than handing the bytes to a separate write operator: a shard's
vectors then never travel through the object store, and no extra worker processes (each importing
torch through webdataset) compete with the actors for the cores; measured on 2 cores, the separate
writer cost as much CPU as a third of the embedding. While one actor uploads, the others compute.
Ray Data's streaming executor hands each actor at most two shards at a time, so only a few shards'
vectors exist at once, whatever the corpus size. Stateful mode needs the shards in input order
through one actor: one actor, one task in flight, and ``preserve_order``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict

import ray
from ray.data import ActorPoolStrategy, DataContext

from pipeline.embed.embedder import EmbedSettings, ShardEmbedder
from pipeline.embed.errors import EmbedError
from pipeline.embed.inputs import ShardSpec
from pipeline.embed.model_files import ModelSource


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
    # Ray Data warns that its bars are off ("To enable, set ..."): they are off on purpose
    progress_logger = logging.getLogger("ray.data._internal.progress")
    progress_level = progress_logger.level
    progress_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        progress_logger.setLevel(progress_level)
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
            fn_constructor_kwargs={
                "source": source.to_dict(),
                "settings": asdict(settings),
                "output": output,
            },
            batch_size=1,
            batch_format="numpy",
            # More actors than shards would each load the model and then idle.
            compute=ActorPoolStrategy(
                size=1 if stateful else min(workers, len(rows)),
                max_tasks_in_flight_per_actor=1 if stateful else 2,
            ),
            num_cpus=cpus_per_worker,
            num_gpus=gpus_per_worker,
        )
        for row in ds.iter_rows():
            entry = json.loads(row["entry"])
            if "error" in entry:
                raise EmbedError(entry["error"])
            yield {"entry": entry, "written": bool(row["written"])}
