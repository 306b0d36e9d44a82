"""More than one rank: 4 gloo ranks, each with a quarter of the rows, take the same steps as one
process with the whole global batch (full softmax: a sampled one draws each rank's negatives apart,
as bilm-tf's GPUs do, so only the full softmax is the same computation)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from train_shards import synthetic_cache, zipf_batches

from pipeline.config import load_config
from pipeline.model_config import to_options
from pipeline.train.config import TrainConfig
from pipeline.train.data import LMBatch
from pipeline.train.step import StepRunner

WORLD, GLOBAL_ROWS, U, STEPS, VOCAB = 4, 8, 5, 3, 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _global_batches() -> list[LMBatch]:
    return zipf_batches(synthetic_cache(VOCAB), STEPS, GLOBAL_ROWS, U)


def _rows(batch: LMBatch, rank: int, world: int) -> LMBatch:
    """Rank ``rank``'s share of a global batch: its consecutive block of rows, both directions."""
    per = GLOBAL_ROWS // world
    rows = slice(rank * per, (rank + 1) * per)
    return LMBatch(batch.char_ids[:, rows], batch.token_ids[:, rows], batch.targets[:, rows])


def _train(rank: int, world: int) -> dict[str, torch.Tensor]:
    cfg = load_config(
        TrainConfig,
        preset="tiny",
        overrides=[
            "shards=unused",
            "output=unused",
            f"batch_size={GLOBAL_ROWS // world}",
            f"unroll_steps={U}",
            "softmax.sampled=false",
            "dropout=0.0",
            # Adagrad (bilm-tf's): an update linear in the gradient; Adam's first steps are about
            # sign(gradient), which turns rounding in the gradients of near-zero entries into steps of lr
            "optimizer.name=adagrad",
            "optimizer.lr=0.2",
        ],
    )
    runner = StepRunner(cfg, to_options(cfg.model), VOCAB, torch.device("cpu"))
    runner.distribute()
    for batch in _global_batches():
        runner.train_step(_rows(batch, rank, world), STEPS)
    return {**runner.bilm.state_dict(), "softmax.weight": runner.softmax.weight.detach().clone()}


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        state = _train(rank, world)
        if rank == 0:
            torch.save(state, os.path.join(out_dir, "ranks.pt"))
        # every rank done before any tears its group down: a rank that destroyed its gloo group while
        # another still spoke to it aborted ("terminate called without an active exception", 1 in a
        # full suite on the 2-core machine)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_four_gloo_ranks_take_the_steps_of_one_process_with_the_global_batch(tmp_path, single_thread):
    mp.start_processes(
        _worker, args=(WORLD, _free_port(), str(tmp_path)), nprocs=WORLD, join=True, start_method="spawn"
    )
    ranks = torch.load(tmp_path / "ranks.pt", weights_only=True)
    alone, start = _train(0, 1), _train_untrained()
    off = moved = 0.0
    for name, tensor in alone.items():
        step = (tensor - start[name]).abs().max()
        assert step > 0, f"{name} did not move: the comparison would be of two initialisations"
        # summation orders differ (each rank spells and sums its own rows), and a max-pool window
        # can tip the other way: a little, never a step of its own
        assert (ranks[name] - tensor).abs().max() <= 0.05 * step, name
        off += float((ranks[name] - tensor).pow(2).sum())
        moved += float((tensor - start[name]).pow(2).sum())
    assert off <= 1e-4 * moved


def _train_untrained() -> dict[str, torch.Tensor]:
    cfg = load_config(
        TrainConfig,
        preset="tiny",
        overrides=["shards=unused", "output=unused", "softmax.sampled=false", "optimizer.name=adagrad"],
    )
    runner = StepRunner(cfg, to_options(cfg.model), VOCAB, torch.device("cpu"))
    return {**runner.bilm.state_dict(), "softmax.weight": runner.softmax.weight.detach().clone()}
