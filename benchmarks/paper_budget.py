"""The paper's pretraining budget, on paper: 10 epochs of the 1B Word Benchmark on 8 GPUs, per batch.

    python benchmarks/paper_budget.py --curves OUT/convergence/curves.json
    python benchmarks/paper_budget.py --curves curves.json --step-json logs/train_step.json --per-gpu 128,256,512

Three measurements meet here:
- the batch study's curves (``benchmarks/time_to_target.py`` with one recipe a batch: one GPU, ``small``, each run one
  global batch): the tokens each batch needs to reach the quality the smallest batch (the recipe's
  arm) reached in the study's budget, as a ratio to the recipe arm's tokens. On 8 GPUs with ``b`` rows
  each the global batch is 8 b; its ratio is interpolated (in log batch) between the study's runs of
  one learning-rate rule, and is not guessed beyond the largest batch the study ran;
- the step table (tokens/s of ``original`` in bf16 on one GPU at ``b`` rows: ``--step-json`` from
  ``benchmarks/train_step.py --json``, or the H100 figures in ``benchmarks/exchange_bytes.py``),
  interpolated in log batch within the rows it measured;
- the scaling efficiency on 8 GPUs over NVLink (``exchange_bytes.py``'s model, DDP overlapped).

Wall time = epochs x tokens x 2 directions x ratio / (GPUs x tokens/s x efficiency). The ratio carries
``small``'s convergence over to ``original``: an assumption the table states, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.exchange_bytes import H100_ORIGINAL_BF16, exchange_row, scaling_efficiency  # noqa: E402
from benchmarks.time_to_target import crossing  # noqa: E402
from pipeline.model_config import preset_options  # noqa: E402

BILLION_WORD_TOKENS = 800_000_000
"""Training positions per direction in one epoch of the 1B Word Benchmark (the paper's budget: 10)."""


def tokens_to_reach(evals: list, target: float) -> float | None:
    """Tokens (per direction) at which a run's held-out perplexity first reaches ``target``
    (``time_to_target.crossing``); None if it never does."""
    return crossing(evals, target, 1)


def recipe_run(runs: list[dict]) -> dict:
    """The study's smallest batch (its first rule): the quality every other run is measured against."""
    return min(runs, key=lambda r: (r["batch"], r["rule"] != "sqrt"))


def token_ratios(runs: list[dict], target: float, rule: str) -> dict[int, float | None]:
    """Per global batch of ``rule``'s runs (the recipe run counts for every rule): its tokens to
    ``target`` over the recipe run's; None where a run never reached it."""
    recipe = recipe_run(runs)
    base = tokens_to_reach(recipe["evals"], target)
    if base is None:
        raise SystemExit(
            f"paper_budget: the recipe run (batch {recipe['batch']}) never reaches {target:,.1f}"
        )
    ratios = {recipe["batch"]: 1.0}
    for run in runs:
        if run["rule"] == rule and run is not recipe:
            reached = tokens_to_reach(run["evals"], target)
            ratios[run["batch"]] = None if reached is None else reached / base
    return ratios


def log_interpolate(points: dict[int, float | None], x: float, log_y: bool) -> float | None:
    """``points`` (x -> y) at ``x``, linear in log x (and in log y when ``log_y``), within their range
    only; None outside it or next to a None."""
    xs = sorted(points)
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    if x in points:
        return points[x]
    hi = next(i for i, v in enumerate(xs) if v > x)
    (x0, y0), (x1, y1) = (xs[hi - 1], points[xs[hi - 1]]), (xs[hi], points[xs[hi]])
    if y0 is None or y1 is None:
        return None
    f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    if log_y:
        return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))
    return y0 + f * (y1 - y0)


def step_table(path: str) -> tuple[dict[int, float], str]:
    """Tokens/s of ``original`` in bf16 (CUDA graph) per batch, and where they come from."""
    if not path:
        return dict(H100_ORIGINAL_BF16), "one H100 (docs/benchmarks.md, 2026-11-26)"
    data = json.loads(Path(path).read_text())
    table = {
        int(r["batch"]): float(r["tokens_s"])
        for r in data["rows"]
        if r["preset"] == "original" and r["dtype"] == "bf16" and r["mode"] == "graph"
    }
    if not table:
        raise SystemExit(f"paper_budget: {path} has no original bf16 graph rows")
    return table, f"{data.get('device', 'a GPU')} ({path})"


def budget_row(plan: argparse.Namespace, per_gpu: int, ratios: dict, tokens_s: dict) -> dict:
    """One row of the table: ``per_gpu`` rows on each of ``plan.gpus`` GPUs."""
    options = preset_options("original")
    global_batch = per_gpu * plan.gpus
    ratio = log_interpolate(ratios, global_batch, log_y=True)
    speed = log_interpolate(tokens_s, per_gpu, log_y=True)
    row = {"per_gpu": per_gpu, "global": global_batch, "ratio": ratio, "tokens_s": speed}
    if speed is not None:
        exchange = exchange_row(options, per_gpu, plan.unroll, plan.negatives, plan.vocab, plan.gpus)
        row["efficiency"] = scaling_efficiency(exchange, 2 * per_gpu * plan.unroll / speed, plan.gbs)[1]
        stream = plan.epochs * plan.tokens * 2
        row["throughput_h"] = stream / (plan.gpus * speed * row["efficiency"]) / 3600
        if ratio is not None:
            row["wall_h"] = row["throughput_h"] * ratio
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--curves", required=True, help="time_to_target.json (or an older curves.json)")
    parser.add_argument(
        "--step-json", default="", help="benchmarks/train_step.py --json (default: the H100 table)"
    )
    parser.add_argument("--per-gpu", default="128,256", help="rows per GPU")
    parser.add_argument("--rule", default="sqrt", help="the learning-rate rule whose runs give the ratios")
    parser.add_argument(
        "--target", type=float, default=0.0, help="perplexity (default: the recipe run's last)"
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--epochs", type=float, default=10)
    parser.add_argument(
        "--tokens", type=int, default=BILLION_WORD_TOKENS, help="positions per direction, an epoch"
    )
    parser.add_argument("--gbs", type=float, default=450.0, help="NCCL bus GB/s between the GPUs (NVLink)")
    parser.add_argument("--unroll", type=int, default=20)
    parser.add_argument("--negatives", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=793_471)
    plan = parser.parse_args(argv)
    study = json.loads(Path(plan.curves).read_text())
    runs = study["runs"] if isinstance(study, dict) else study  # an older curves.json is the list
    recipe = recipe_run(runs)
    target = plan.target or recipe["evals"][-1][3]
    ratios = token_ratios(runs, target, plan.rule)
    tokens_s, source = step_table(plan.step_json)
    print(
        f"{plan.epochs:g} epochs of {plan.tokens:,} positions per direction on {plan.gpus} GPUs "
        f"({plan.gbs:g} GB/s), original in bf16; tokens/s per GPU: {source}; tokens to a held-out "
        f"perplexity of {target:,.1f} against the study's batch {recipe['batch']} ({plan.curves}, "
        f"{plan.rule} rule; small's curves carried over to original)"
    )
    print(
        "| rows/GPU | global batch | tokens/s per GPU | scaling | tokens vs the recipe's | hours at 1x tokens | hours |"
    )
    print("|---|---|---|---|---|---|---|")
    study = f"the study ran {min(ratios):,}-{max(ratios):,}"
    for per_gpu in [int(b) for b in plan.per_gpu.split(",")]:
        row = budget_row(plan, per_gpu, ratios, tokens_s)
        speed = "not measured" if row["tokens_s"] is None else f"{row['tokens_s']:,.0f}"
        if row["ratio"] is not None:
            ratio = f"{row['ratio']:.2f}x"
        elif min(ratios) <= row["global"] <= max(ratios):
            ratio = "not reached"
        else:
            ratio = f"not studied ({study})"
        scaling = f"{row['efficiency']:.0%}" if "efficiency" in row else "-"
        throughput = f"{row['throughput_h']:.1f}" if "throughput_h" in row else "-"
        wall = f"**{row['wall_h']:.1f}**" if "wall_h" in row else "-"
        print(f"| {per_gpu:,} | {row['global']:,} | {speed} | {scaling} | {ratio} | {throughput} | {wall} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
