"""The Ray Data graph of the embed stage.

    shard specs (one row per shard, only the shards still to do; SPEC_BLOCKS blocks of them; a
    compressed record file's shards in one row, read from one stream)
      -> map_batches(prepare_rows), CPU tasks: read the shard's lines, clean and tokenize them, plan
         the forward passes and build their arrays (``shard_work``) -> one prepared shard per row
      -> map_batches(EmbedActor), actor pool of ``workers`` (model loaded once per actor; one GPU
         each when asked): run the passes, assemble the shard in shared memory and have one of the
         actor's writer processes commit it (shard + entry, atomically; ``shard_writers``), several
         shards at a time on threads of their own (one per CPU of the actor), so that the others
         are written and uploaded while one's passes run -> entry
      -> the driver, streaming (``iter_rows``): progress and the manifest.

Preparing is the CPU side of embedding; as its own operator it runs on the cores the actors do not
hold, ahead of them, so an actor only waits for its device. Its tasks reserve no CPU: an actor pool
that reserves every core (a CPU-only laptop) must not starve them, so their number is capped
instead (``readers``). A prepared shard is a few bytes per token and travels through the object
store; a shard's vectors do not: the actor's own writer processes commit its shards from shared
memory rather than the bytes going through the object store to a separate write operator (measured
on 2 cores, a separate writer cost as much CPU as a third of the embedding). Ray Data's streaming
executor keeps a bounded number of prepared shards and tasks in flight, so memory does not grow
with the corpus. Stateful mode needs the shards in input order
through one actor: one actor, one call at a time, and ``preserve_order``.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass

import numpy as np
import ray
from ray.data import ActorPoolStrategy, DataContext, TaskPoolStrategy

from pipeline.embed.actor import EmbedActor
from pipeline.embed.errors import EmbedError
from pipeline.embed.inputs import ShardSpec
from pipeline.embed.record_inputs import RecordStreams
from pipeline.embed.settings import EmbedSettings, concurrent_calls, work_settings
from pipeline.embed.shard_work import WorkSettings, prepare_shard
from pipeline.model_loader import ModelSource
from pipeline.runtime.ray_runtime import logger_level


@dataclass(frozen=True)
class ActorPool:
    """Where the stage runs: ``workers`` model actors of ``cpus_per_worker`` CPUs and
    ``gpus_per_worker`` GPUs, fed by at most ``readers`` preparing tasks at once. ``restartable``:
    Ray restarts a dead actor (a cluster that loses nodes); on an embedded cluster a dead actor
    fails the run instead (its node is the whole cluster; a rerun resumes), which also keeps Ray's
    error-level line about restartable actors with arguments in the object store (ray#53727) away."""

    workers: int
    cpus_per_worker: float
    gpus_per_worker: float
    readers: int
    restartable: bool = True


@contextmanager
def _data_context(preserve_order: bool) -> Iterator[None]:
    ctx = DataContext.get_current()
    saved = (
        ctx.execution_options.preserve_order,
        ctx.enable_progress_bars,
        ctx.print_on_execution_start,
        ctx.target_max_block_size,
    )
    ctx.execution_options.preserve_order = preserve_order
    ctx.enable_progress_bars = False  # the stage draws its own bar
    ctx.print_on_execution_start = False
    # every row its own block: a preparing task hands each shard on as soon as it is prepared
    # instead of filling a block of many (see SPEC_BLOCKS)
    ctx.target_max_block_size = 1
    try:
        # per-dataset INFO lines would interleave with the bar; and Ray Data warns that its bars
        # are off ("To enable, set ..."): they are off on purpose
        with (
            logger_level("ray.data", logging.WARNING),
            logger_level("ray.data._internal.progress", logging.ERROR),
        ):
            yield
    finally:
        (
            ctx.execution_options.preserve_order,
            ctx.enable_progress_bars,
            ctx.print_on_execution_start,
            ctx.target_max_block_size,
        ) = saved


SPEC_BLOCKS = 64
"""Blocks of shard specs at least (as many as there are shards, if fewer; 4 per reader, if more):
the graph's input. Ray Data makes each input block on the driver before anything runs, about 1 ms
a block, so one block per shard delayed the first shard of a 15,000-shard corpus by 15 s; a
preparing task works through its block one shard at a time and, with one row per output block,
hands each on at once (docs/benchmarks.md#scale-the-1b-word-benchmarks-size)."""


def spec_blocks(shards: int, readers: int) -> int:
    """Input blocks for ``shards`` shard specs prepared by ``readers`` tasks at once."""
    return max(1, min(shards, max(SPEC_BLOCKS, 4 * readers)))


def prepare_rows(batch: dict[str, np.ndarray], settings: WorkSettings) -> Iterator[dict[str, list]]:
    """CPU operator: rows of shard specs -> prepared shards (``ShardWork.to_bytes``), each handed
    on as soon as it is prepared (a row of a compressed record file's shards reads that file once,
    through one ``RecordStreams``)."""
    streams = RecordStreams()
    for specs_json in batch["specs"]:
        for spec, write in json.loads(specs_json):
            work = prepare_shard(ShardSpec.from_dict(spec), bool(write), settings, streams)
            yield {"work": [work.to_bytes()]}


def spec_rows(todo: Sequence[tuple[ShardSpec, bool]]) -> list[dict]:
    """The graph's input rows: a shard a row, but the shards of one compressed record file (read by
    streaming it) in one row, in order."""
    rows: list[list] = []
    previous = None
    for spec, write in todo:
        segment = spec.segments[0] if spec.segments else None
        streamed = segment is not None and segment.kind == "jsonl-stream"
        if streamed and previous == segment.path:
            rows[-1].append((spec.to_dict(), write))
        else:
            rows.append([(spec.to_dict(), write)])
        previous = segment.path if streamed else None
    return [{"specs": json.dumps(row)} for row in rows]


def embed_stream(
    todo: Sequence[tuple[ShardSpec, bool]],
    source: ModelSource,
    settings: EmbedSettings,
    output: str,
    pool: ActorPool,
) -> Iterator[dict]:
    """Embed and commit ``todo`` = (spec, write) pairs; yields ``{"entry": dict, "written": bool}`` per
    shard as shards finish (in input order when ``settings.config.stateful``). A one-line error (bad input
    line, unwritable output) is raised here as EmbedError with the worker's message."""
    if not todo:
        return
    with _data_context(preserve_order=settings.config.stateful):
        # closed with this generator: its end shuts Ray Data's executor down (a generator left
        # open by an exception would keep its threads, which call ray.init() again after Ray stops)
        with closing(iter(build_dataset(todo, source, settings, output, pool).iter_rows())) as rows:
            for row in rows:
                entry = json.loads(row["entry"])
                if "error" in entry:
                    raise EmbedError(entry["error"])
                yield {"entry": entry, "written": bool(row["written"])}


def build_dataset(
    todo: Sequence[tuple[ShardSpec, bool]],
    source: ModelSource,
    settings: EmbedSettings,
    output: str,
    pool: ActorPool,
) -> ray.data.Dataset:
    """The graph of the module docstring over ``todo`` (lazy: nothing runs until it is read)."""
    rows = spec_rows(todo)
    stateful = settings.config.stateful
    calls = concurrent_calls(settings)
    ds = ray.data.from_items(rows, override_num_blocks=spec_blocks(len(rows), pool.readers))
    ds = ds.map_batches(
        prepare_rows,
        fn_kwargs={"settings": work_settings(settings)},
        batch_size=1,
        batch_format="numpy",
        compute=TaskPoolStrategy(size=max(1, min(pool.readers, len(rows)))),
        num_cpus=0,
    )
    with warnings.catch_warnings():
        # max_restarts has no named parameter yet; Ray 2.60 warns that **ray_remote_args will go in 2.64
        warnings.filterwarnings(
            "ignore", message="`ray_remote_args` is deprecated", category=DeprecationWarning
        )
        return ds.map_batches(
            EmbedActor,
            fn_constructor_kwargs={
                "source": source,  # frozen dataclasses, as the driver made them
                "settings": settings,
                "output": output,
            },
            batch_size=1,
            batch_format="numpy",
            # More actors than shards would each load the model and then idle.
            compute=ActorPoolStrategy(
                size=1 if stateful else min(pool.workers, len(todo)),
                max_tasks_in_flight_per_actor=calls,
                max_concurrent_calls_per_actor=calls,
                enable_true_multi_threading=calls > 1,
            ),
            num_cpus=pool.cpus_per_worker,
            num_gpus=pool.gpus_per_worker,
            **({} if pool.restartable else {"max_restarts": 0}),
        )
