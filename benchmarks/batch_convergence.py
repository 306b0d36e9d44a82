"""Tokens-to-quality against the batch: does a larger batch reach a given held-out perplexity sooner?

    python benchmarks/batch_convergence.py --shards DIR --out DIR --device cuda      # one GPU, ~6 min a batch
    python benchmarks/batch_convergence.py --shards DIR --out DIR --preset tiny --batches 8,32 --tokens 200000
                                                                                   # a CPU rehearsal

For each batch (rows per GPU) one run of ``elmo train`` (a subprocess, its own Ray cluster, one
worker) over the same token budget (``--tokens`` positions per direction), bf16 on a GPU, with the
learning rate of the documented rule: bilm-tf's Adagrad rate (the preset's) times sqrt(batch / 384),
with ``--warmup-steps`` of warm-up once the batch is 8 x 384 or more; ``--alternative`` adds a run of
the largest batch with the linear rule (rate x batch / 384) to test the rule against. Every run
evaluates the same fixed held-out sample (``eval_interval_batches``) ``--evals`` times, so its
full-softmax held-out perplexity is known against tokens seen and against wall time.

Prints one table (per run: the final perplexity, and the tokens and seconds to reach each of
``--targets``) and writes ``OUT/curves.json`` and ``OUT/curves.png`` (perplexity against tokens and
against seconds). The shards: ``benchmarks/debian_corpus.py`` then ``elmo shard``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config import load_config  # noqa: E402
from pipeline.train.config import LRRule, OptimizerConfig, TrainConfig  # noqa: E402
from pipeline.train.metrics import read_metrics  # noqa: E402
from pipeline.train.optimization import RECIPE_ROWS, peak_lr  # noqa: E402
from pipeline.train.run_dir import RunDir  # noqa: E402


def learning_rate(base: float, batch: int, rule: str) -> float:
    """The rate of ``rule`` for ``batch`` rows on one GPU: the product's ``sqrt`` rule, or linear."""
    if rule == "sqrt":
        return peak_lr(OptimizerConfig(lr=base, lr_rule=LRRule.sqrt), batch, cuda=True)
    return base * batch / RECIPE_ROWS


def device_name(device: str) -> str:
    """The GPU's name (a run's seconds are this device's), or "cpu"."""
    if device != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name()


def run(args, batch: int, rule: str, out: Path) -> dict:
    """One training run; its eval rows as (step, tokens, seconds, perplexity)."""
    base = load_config(TrainConfig, preset=args.preset, overrides=["shards=x", "output=x"])
    lr = learning_rate(base.optimizer.lr, batch, rule)
    steps = max(1, args.tokens // (batch * args.unroll))
    warmup = args.warmup_steps if batch >= 8 * RECIPE_ROWS else 0
    run_dir = out / f"batch-{batch}-{rule}"
    cmd = [
        sys.executable, "-m", "jobs.train", "--shards", args.shards, "--output", str(run_dir),
        "--preset", args.preset, "--workers", "1", "--max-steps", str(steps),
        f"batch_size={batch}", f"unroll_steps={args.unroll}", f"optimizer.lr={lr}", "optimizer.lr_rule=as_given",
        f"optimizer.warmup_steps={min(warmup, steps // 4)}", f"eval_every={max(1, steps // args.evals)}",
        f"eval_interval_batches={args.eval_batches}", f"eval_max_batches={args.eval_batches}",
        f"log_every={max(1, steps // 50)}", f"checkpoint_every={steps}", "wandb.mode=disabled",
        f"use_gpu={'true' if args.device == 'cuda' else 'false'}", f"bf16={'true' if args.device == 'cuda' else 'false'}",
    ]  # fmt: skip
    start = time.time()
    output = timed_output(cmd, args.run_timeout_s)
    if args.log_dir:  # where a run's time goes outside its steps (start, evaluations, the end)
        args.log_dir.mkdir(parents=True, exist_ok=True)
        (args.log_dir / f"batch-{batch}-{rule}.log").write_text("\n".join(output.lines) + "\n")
    if output.returncode != 0:
        raise RuntimeError(f"batch {batch} ({rule}) failed:\n" + "\n".join(output.lines[-40:]))
    rows = read_metrics(RunDir(str(run_dir)).metrics)
    logged = sorted((int(r["step"]), float(r["time"])) for r in rows if r["kind"] == "train")
    evals = [
        (
            int(r["step"]),
            int(r["step"]) * batch * args.unroll,
            seconds_at(int(r["step"]), logged),
            float(r["eval/perplexity"]),
        )
        for r in rows
        if r["kind"] == "eval"
    ]
    return {
        "batch": batch,
        "rule": rule,
        "device": device_name(args.device),
        "lr": lr,
        "steps": steps,
        "wall_s": time.time() - start,
        "evals": evals,
    }


@dataclass
class TimedOutput:
    returncode: int
    lines: list[str]
    """The command's output lines (stdout and stderr), each after the seconds since its start."""


def timed_output(cmd: list[str], timeout_s: float) -> TimedOutput:
    """Run ``cmd`` in the repository, its output lines stamped as they come."""
    start = time.time()
    lines: list[str] = []
    with subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        watchdog = threading.Timer(timeout_s, proc.kill)
        watchdog.start()
        try:
            for line in proc.stdout:
                lines.append(f"{time.time() - start:8.1f}  {line.rstrip()}")
        finally:
            watchdog.cancel()
        returncode = proc.wait()
    return TimedOutput(returncode, lines)


def seconds_at(step: int, logged: list[tuple[int, float]]) -> float | None:
    """The run's clock at ``step``, interpolated between the train rows ``logged`` (step, time)
    around it: evaluations fall between log intervals (eval_every and log_every need not divide
    each other). None outside the logged steps."""
    if not logged or not logged[0][0] <= step <= logged[-1][0]:
        return None
    return float(np.interp(step, [s for s, _ in logged], [t for _, t in logged]))


def previous_runs(path: Path, tokens: int, unroll: int) -> list[dict]:
    """The runs of an earlier curves.json; each must have had the same token budget."""
    runs = json.loads(path.read_text())
    for r in runs:
        if abs(r["steps"] * r["batch"] * unroll - tokens) >= r["batch"] * unroll:
            raise SystemExit(
                f"{path}: batch {r['batch']} ({r['rule']}) ran {r['steps'] * r['batch'] * unroll:,} "
                f"positions, not --tokens {tokens:,}"
            )
    return runs


def diverged(run: dict) -> bool:
    """Whether a run ended above its first evaluation or at a non-finite perplexity: it sets no target."""
    first, last = run["evals"][0][3], run["evals"][-1][3]
    return not math.isfinite(last) or last > first


def default_targets(runs: list[dict]) -> list[float]:
    """The worst final perplexity of the runs that did not diverge, and 1.2 times it: every such run
    reaches both, so the table compares them all on tokens and seconds."""
    finals = sorted(r["evals"][-1][3] for r in runs if not diverged(r))
    return [finals[-1] * 1.2, finals[-1]] if finals else []


def fastest(runs: list[dict], target: float) -> dict | None:
    """The run that reaches ``target`` in the fewest seconds (runs without a clock skipped)."""
    timed = [(first_reaching(r["evals"], target)[1], i) for i, r in enumerate(runs)]
    timed = [(s, i) for s, i in timed if s is not None]
    return runs[min(timed)[1]] if timed else None


def first_reaching(evals: list, target: float) -> tuple[int | None, float | None]:
    """(tokens, seconds) of the first evaluation at or under ``target``."""
    for _, tokens, seconds, ppl in evals:
        if ppl <= target:
            return tokens, seconds
    return None, None


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (by_tokens, by_time) = plt.subplots(1, 2, figsize=(12, 5))
    for r in runs:
        label = f"batch {r['batch']} ({r['rule']}, lr {r['lr']:.3g}, {r.get('device', '?')})"
        by_tokens.plot([e[1] for e in r["evals"]], [e[3] for e in r["evals"]], "o-", label=label)
        timed = [e for e in r["evals"] if e[2] is not None]
        by_time.plot([e[2] for e in timed], [e[3] for e in timed], "o-", label=label)
    for ax, xlabel in ((by_tokens, "tokens seen (per direction)"), (by_time, "training seconds")):
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out perplexity (full softmax, fixed sample)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", required=True, help="a shard directory (elmo shard)")
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for the runs, curves.json and curves.png"
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batches", default="128,512,2048", help="rows per GPU")
    parser.add_argument("--tokens", type=int, default=60_000_000, help="positions per direction, each run")
    parser.add_argument("--unroll", type=int, default=20)
    parser.add_argument("--evals", type=int, default=10, help="evaluations per run")
    parser.add_argument(
        "--eval-batches", type=int, default=20, help="held-out batches each evaluation scores"
    )
    parser.add_argument("--warmup-steps", type=int, default=200)
    parser.add_argument("--alternative", default="linear", choices=["linear", "none"])
    parser.add_argument("--targets", default="", help="perplexities to reach (default: from the runs)")
    parser.add_argument("--run-timeout-s", type=int, default=900)
    parser.add_argument(
        "--log-dir", type=Path, default=None, help="keep each run's output here, every line timed"
    )
    parser.add_argument(
        "--previous",
        type=Path,
        default=None,
        help="a curves.json of earlier runs of the same --tokens: kept in the table and plot, not rerun",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    runs = previous_runs(args.previous, args.tokens, args.unroll) if args.previous else []
    done = {(r["batch"], r["rule"]) for r in runs}
    plan = [(b, "sqrt") for b in batches] + (
        [(batches[-1], "linear")] if args.alternative == "linear" else []
    )
    plan = [p for p in plan if p not in done]
    with tempfile.TemporaryDirectory(
        prefix="elmo-convergence-", dir=os.environ.get("CONVERGENCE_TMP")
    ) as tmp:
        for batch, rule in plan:
            runs.append(run(args, batch, rule, Path(tmp)))
            print(
                f"batch {batch} ({rule}): {runs[-1]['evals'][-1][3]:.1f} after {runs[-1]['wall_s']:.0f} s",
                flush=True,
            )
            # after every run: a session stopped at its time limit keeps the runs it finished
            (args.out / "curves.json").write_text(json.dumps(runs, indent=1))
            plot(runs, args.out / "curves.png")
    targets = [float(t) for t in args.targets.split(",")] if args.targets else default_targets(runs)
    head = " | ".join(f"to {t:,.0f}: tokens / s" for t in targets)
    print(f"\n| batch/GPU | rule | device | lr | steps | final perplexity | {head} |")
    print("|---|---|---|---|---|---|" + "---|" * len(targets))
    for r in runs:
        reached = []
        for t in targets:
            tokens, seconds = first_reaching(r["evals"], t)
            clock = "?" if seconds is None else f"{seconds:,.0f}"
            reached.append("not reached" if tokens is None else f"{tokens:,} / {clock}")
        print(
            f"| {r['batch']} | {r['rule']} | {r.get('device', '?')} | {r['lr']:.3g} | {r['steps']} | "
            f"{r['evals'][-1][3]:,.1f}{' (diverged)' if diverged(r) else ''} | " + " | ".join(reached) + " |"
        )
    for t in targets:
        best = fastest(runs, t)
        if best is not None:
            print(f"fastest to {t:,.0f}: batch {best['batch']} ({best['rule']} rule, lr {best['lr']:.3g})")
    print(f"\ncurves: {args.out / 'curves.png'}, {args.out / 'curves.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
