"""How soon the embed graph's first shard reaches the end of the graph, against the number of shards:
the Ray Data graph of pipeline/embed/dataflow.py (specs -> preparing tasks -> one actor) with
stand-ins for the work (a prepared shard of 200 kB after 50 ms; the actor returns its size), so the
figure is Ray Data's own start and the driver's cost per input block.

    python benchmarks/embed_first_row.py --shards 200 15000           # as the stage builds it
    python benchmarks/embed_first_row.py --shards 15000 --block-per-shard   # one input block per shard
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import ray
from ray.data import ActorPoolStrategy, TaskPoolStrategy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipeline.embed.dataflow import _data_context, spec_blocks  # noqa: E402
from pipeline.runtime.ray_runtime import RaySession  # noqa: E402

READERS = 2


def prepare(batch):
    time.sleep(0.05)
    return {"work": [b"x" * 200_000 for _ in batch["spec"]]}


class Actor:
    def __call__(self, batch):
        return {"entry": [str(len(w)) for w in batch["work"]]}


def first_rows(shards: int, block_per_shard: bool) -> tuple[int, float, float]:
    """The input blocks, and seconds to the first row and to the 40th from building the dataset."""
    rows = [{"spec": json.dumps({"index": i, "first_line": 2000 * i}), "write": True} for i in range(shards)]
    started = time.perf_counter()
    with _data_context(preserve_order=False):
        if block_per_shard:  # the graph before: one block per shard, Ray's default block size
            from ray.data import DataContext

            DataContext.get_current().target_max_block_size = 128 * 2**20
        blocks = shards if block_per_shard else spec_blocks(shards, READERS)
        ds = ray.data.from_items(rows, override_num_blocks=blocks)
        ds = ds.map_batches(prepare, batch_size=1, compute=TaskPoolStrategy(size=READERS), num_cpus=0)
        with warnings.catch_warnings():  # max_restarts goes through **ray_remote_args, as in the stage
            warnings.filterwarnings(
                "ignore", message="`ray_remote_args` is deprecated", category=DeprecationWarning
            )
            # an embedded cluster's actor is not restarted (nor is the stage's)
            ds = ds.map_batches(
                Actor, batch_size=1, compute=ActorPoolStrategy(size=1), num_cpus=1, max_restarts=0
            )
        times = []
        for _ in ds.iter_rows():
            times.append(time.perf_counter() - started)
            if len(times) == 40:
                break
    return blocks, times[0], times[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[200, 15_000])
    parser.add_argument("--block-per-shard", action="store_true", help="the graph before: a block per shard")
    args = parser.parse_args()
    # the stages' embedded cluster: its processes and temporary files go when it stops
    with RaySession(num_cpus=2) as session:
        session.start()
        print("shards  input blocks  first row s  40th row s")
        for shards in args.shards:
            blocks, first, fortieth = first_rows(shards, args.block_per_shard)
            print(f"{shards:>6}  {blocks:>12}  {first:>11.1f}  {fortieth:>10.1f}")


if __name__ == "__main__":
    main()
