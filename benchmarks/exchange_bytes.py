"""Pretraining on more than one GPU, on paper: the bytes a rank exchanges per step and what they cost.

    python benchmarks/exchange_bytes.py                       # original, batches 128, 512, 2048 per GPU
    python benchmarks/exchange_bytes.py --preset small --batches 128,1024

Per step every rank (one GPU) exchanges two things (pipeline/train/distributed.py):
- the dense gradient of the token encoder and the LSTM (every parameter but the softmax), a ring
  all-reduce by DDP: 2 (W-1)/W x 4 bytes per parameter (float32 gradients: bf16 autocast keeps the
  parameters and their gradients in float32);
- the softmax rows the step touched, K = 2 (B U + S) of them with their id and P+1 floats, all-gathered
  (W x K rows), or a dense all-reduce of the whole softmax where that is fewer bytes.

The time of each comes from the ring model, bytes / bus bandwidth, at two bandwidths of NCCL's
all-reduce (``--nvlink-gbs``: one node of 8 GPUs over NVLink; ``--internode-gbs``: 2 nodes x 8 GPUs
with one 400 Gb/s NIC per GPU, the ring's slowest hop; ``--node-nic-gbs``: one 400 Gb/s NIC per node),
against the step time measured on one H100 (``--step-tokens-per-s``, docs/benchmarks.md). Scaling
efficiency = step / (step + exchange) when nothing overlaps (DDP overlaps its buckets with the
backward, so this is the floor), and step / (step + softmax exchange + what of DDP's all-reduce
outlasts the step) when DDP's all-reduce overlaps the backward entirely (the ceiling: the softmax
rows are exchanged after the backward, in the step's critical path).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from elmo_model import BiLMOptions  # noqa: E402
from pipeline.model_config import preset_options  # noqa: E402
from pipeline.train.distributed import dense_exchange_bytes, rows_exchange_bytes  # noqa: E402

H100_ORIGINAL_BF16 = {128: 310_675, 512: 486_867, 2048: 606_735}
"""Tokens/s of one H100 at each batch (``original``, bf16, CUDA graph; docs/benchmarks.md, 2026-11-26)."""


def exchange_row(options: dict, batch: int, unroll: int, negatives: int, vocab: int, world: int) -> dict:
    projection = int(options["lstm"]["projection_dim"])
    dense_params = BiLMOptions.from_dict(options).num_parameters
    rows = 2 * (batch * unroll + negatives)
    sparse = rows_exchange_bytes(world, rows, projection + 1)
    dense_softmax = dense_exchange_bytes(world, vocab * (projection + 1))
    return {
        "ddp": dense_exchange_bytes(world, dense_params),
        "softmax": min(sparse, dense_softmax),
        "softmax_mode": "rows" if sparse < dense_softmax else "dense",
    }


def scaling_efficiency(row: dict, step_s: float, gbs: float) -> tuple[float, float]:
    """(no overlap, DDP overlapped) scaling efficiency of a step of ``step_s`` seconds on one GPU
    whose exchange (``row``: :func:`exchange_row`) runs at ``gbs`` GB/s of bus bandwidth."""
    ddp_s, softmax_s = row["ddp"] / (gbs * 1e9), row["softmax"] / (gbs * 1e9)
    return step_s / (step_s + ddp_s + softmax_s), step_s / (step_s + softmax_s + max(0.0, ddp_s - step_s))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="original")
    parser.add_argument("--batches", default="128,512,2048", help="rows per GPU")
    parser.add_argument("--unroll", type=int, default=20)
    parser.add_argument("--negatives", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=793_471, help="softmax rows (1B Word Benchmark's)")
    parser.add_argument(
        "--nvlink-gbs", type=float, default=450.0, help="NCCL all-reduce bus GB/s, 8 GPUs, NVLink"
    )
    parser.add_argument(
        "--internode-gbs", type=float, default=45.0, help="bus GB/s, 2x8 GPUs, 400 Gb/s per GPU"
    )
    parser.add_argument(
        "--node-nic-gbs", type=float, default=6.0, help="bus GB/s, 2x8 GPUs, 400 Gb/s per node"
    )
    args = parser.parse_args(argv)
    options = preset_options(args.preset)
    print(
        f"{args.preset}: {BiLMOptions.from_dict(options).num_parameters:,} parameters under DDP, softmax "
        f"{args.vocab:,} x {int(options['lstm']['projection_dim']) + 1}, unroll {args.unroll}, {args.negatives} negatives"
    )
    print(
        "| batch/GPU | world | DDP MB/step | softmax MB/step (how) | step ms (1 GPU) | exchange ms | "
        "efficiency, no overlap | efficiency, DDP overlapped |"
    )
    print("|---|---|---|---|---|---|---|---|")
    links = [(8, args.nvlink_gbs, "8 GPUs, NVLink"), (16, args.internode_gbs, "2x8, 400 Gb/s per GPU"),
             (16, args.node_nic_gbs, "2x8, 400 Gb/s per node")]  # fmt: skip
    for batch in [int(b) for b in args.batches.split(",")]:
        tokens_per_s = H100_ORIGINAL_BF16.get(batch) if args.preset == "original" else None
        step_s = 2 * batch * args.unroll / tokens_per_s if tokens_per_s else None
        for world, gbs, label in links:
            row = exchange_row(options, batch, args.unroll, args.negatives, args.vocab, world)
            exchange_s = (row["ddp"] + row["softmax"]) / (gbs * 1e9)
            step, floor, ceiling = "-", "-", "-"
            if step_s:
                step = f"{step_s * 1e3:.1f}"
                floor, ceiling = (f"{e:.0%}" for e in scaling_efficiency(row, step_s, gbs))
            print(
                f"| {batch} | {label} | {row['ddp'] / 1e6:,.0f} | {row['softmax'] / 1e6:,.1f} ({row['softmax_mode']}) | "
                f"{step} | {exchange_s * 1e3:.1f} | {floor} | {ceiling} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
