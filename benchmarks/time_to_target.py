"""Time-to-target: the tokens and training seconds a recipe needs to reach the split's own baselines.

    python benchmarks/time_to_target.py --shards DIR --out DIR --preset tiny --tokens 512000 \\
        --recipe 'today:' --recipe 'cosine: optimizer.schedule=cosine optimizer.warmup_steps=20' --seeds 0,1,2
    python benchmarks/time_to_target.py --shards DIR --out DIR --device cuda --preset small \\
        --time-budget 4m --eval-every 600 --recipe 'candidate: ...'          # one GPU, a time budget

Each recipe (``NAME: key=value ...``, the train overrides on top of ``--preset``) runs once per seed
through ``elmo train`` (a subprocess, its own Ray cluster) on the same shards for the same budget:
``--tokens`` (``max_tokens``) or ``--time-budget`` (``time_budget``: the run plans its own length).
Every run evaluates the same fixed held-out sample (``--eval-batches`` batches) about ``--evals``
times (every ~2% of the run), so its full-softmax held-out perplexity is known against tokens seen
and against training seconds (``train_s``: steps only; evaluations, checkpoints and the start-up
are reported apart). The end-of-run figure is the whole held-out split's.

The targets are the split's baselines: the Kneser-Ney models of ``--orders`` (the manifest's order
as the shard stage counted it; any other order counted here from the shards, kept in
``OUT/baselines.json``) and the unigram. Prints one table (per recipe: each seed's final perplexity,
tokens and seconds to each target) and the verdicts against the first recipe (a difference is
claimed only when it holds for every seed: every seed of one recipe ahead of every seed of the
other), and writes ``OUT/time_to_target.json`` (``--results`` also copies it, e.g. under
``benchmarks/results/``) and ``OUT/time_to_target.png`` (the curves against tokens and against
seconds, the baselines drawn across).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
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
from pipeline.formats import kneser_ney, shard_format  # noqa: E402
from pipeline.formats.shard_manifest import ShardManifest, read_manifest  # noqa: E402
from pipeline.formats.unigram import heldout_unigram_perplexity  # noqa: E402
from pipeline.train.config import TrainConfig  # noqa: E402
from pipeline.train.metrics import read_metrics  # noqa: E402
from pipeline.train.run_dir import RunDir  # noqa: E402


@dataclass(frozen=True)
class Recipe:
    """A named set of train overrides (``key=value``) on top of the study's preset, or of a preset of
    its own (``preset``: e.g. ``small,bilm-tf``)."""

    name: str
    overrides: tuple[str, ...]
    preset: str = ""

    @classmethod
    def parse(cls, text: str) -> Recipe:
        """``NAME: key=value key=value`` (``NAME:`` alone: the preset as it is); ``NAME@PRESET: ...``
        names the recipe's own preset."""
        head, sep, rest = text.partition(":")
        name, _, preset = head.partition("@")
        if not sep or not name.strip():
            raise SystemExit(f"--recipe {text!r}: expected 'NAME[@PRESET]: key=value ...'")
        return cls(name.strip(), tuple(shlex.split(rest)), preset.strip())


# ---- the targets --------------------------------------------------------------------------------


def baselines(shards: str, orders: list[int], cache: Path) -> dict[str, float]:
    """``{"unigram": p, "kn3": p, "kn5": p, ...}``: the manifest's models where it has them, the
    others counted here from the training shards (one process: for a benchmark's corpus) and kept
    in ``cache``."""
    known = json.loads(cache.read_text()) if cache.exists() else {}
    manifest = read_manifest(shards)
    known.setdefault("unigram", heldout_unigram_perplexity(manifest))
    for recorded in manifest.kneser_ney:
        known[f"kn{recorded.order}"] = recorded.perplexity
    missing = [n for n in orders if f"kn{n}" not in known]
    if missing:
        train, heldout = split_ids(manifest, "train"), split_ids(manifest, "heldout")
        vocab_size = manifest.vocab.size
        for order in missing:
            started = time.perf_counter()
            model = kneser_ney.build(kneser_ney.count_ngrams(*train, order), vocab_size)
            known[f"kn{order}"] = kneser_ney.perplexity(*model.score(*heldout))
            print(
                f"Kneser-Ney {order}-gram counted here: {known[f'kn{order}']:.2f} ({time.perf_counter() - started:.0f} s)"
            )
    cache.write_text(json.dumps(known, indent=1))
    return known


def split_ids(manifest: ShardManifest, split: str) -> tuple[np.ndarray, np.ndarray]:
    """A split's word ids ``(T,)`` and sentence lengths ``(S,)``, every shard checked."""
    ids, lengths = [np.zeros(0, np.int32)], [np.zeros(0, np.int32)]
    for entry, url in zip(manifest.shards[split], manifest.urls(split), strict=True):
        with shard_format.open_shard(url, entry.sha256) as blocks:
            for block in blocks:
                ids.append(block.ids)
                lengths.append(block.lengths)
    return np.concatenate(ids), np.concatenate(lengths)


def target_names(known: dict[str, float], orders: list[int]) -> list[str]:
    """The targets in the order of difficulty: the unigram, then each Kneser-Ney order."""
    return ["unigram", *(f"kn{n}" for n in sorted(orders) if f"kn{n}" in known)]


# ---- one run --------------------------------------------------------------------------------------


@dataclass
class TimedOutput:
    returncode: int
    lines: list[tuple[float, str]]
    """The command's output lines (stdout and stderr), each with the seconds since its start."""


def timed_output(cmd: list[str], timeout_s: float) -> TimedOutput:
    """Run ``cmd`` in the repository, its output lines stamped as they come."""
    start = time.time()
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        watchdog = threading.Timer(timeout_s, proc.kill)
        watchdog.start()
        try:
            for line in proc.stdout:
                lines.append((time.time() - start, line.rstrip()))
        finally:
            watchdog.cancel()
        returncode = proc.wait()
    return TimedOutput(returncode, lines)


def run_length_keys(args, cfg: TrainConfig) -> list[str]:
    """The budget's keys: ``max_tokens`` and an evaluation every ~1/evals of it, or ``time_budget``
    with ``--eval-every``."""
    if args.time_budget:
        return [f"time_budget={args.time_budget}", f"eval_every={args.eval_every}"]
    steps = -(-args.tokens // cfg.tokens_per_step(cfg.workers))
    return [f"max_tokens={args.tokens}", f"eval_every={max(1, steps // args.evals)}"]


def recipe_config(args, recipe: Recipe) -> tuple[str, list[str], TrainConfig]:
    """``recipe``'s preset, the overrides every run of it gets, and the TrainConfig they make."""
    preset = recipe.preset or args.preset
    common = [f"workers={args.workers}", *recipe.overrides]
    return (
        preset,
        common,
        load_config(TrainConfig, preset=preset, overrides=["shards=x", "output=x", *common]),
    )


def run(args, recipe: Recipe, seed: int, out: Path) -> dict:
    """One training run of ``recipe``; its evaluations as (step, tokens, train seconds, perplexity)."""
    preset, common, cfg = recipe_config(args, recipe)
    device = ["use_gpu=true", "bf16=true"] if args.device == "cuda" else ["use_gpu=false"]
    run_dir = out / f"{recipe.name}-seed{seed}"
    cmd = [
        sys.executable, "-m", "jobs.train", "--shards", args.shards, "--output", str(run_dir),
        "--preset", preset, *common, *device, *run_length_keys(args, cfg), f"seed={seed}",
        f"eval_interval_batches={args.eval_batches}", f"log_every={args.log_every}", "wandb.mode=disabled",
        *([f"checkpoint_every={args.checkpoint_every}"] if args.checkpoint_every else []),
    ]  # fmt: skip
    started = time.time()
    output = timed_output(cmd, args.run_timeout_s)
    wall = time.time() - started
    if args.log_dir:  # where a run's time goes outside its steps (start, evaluations, the end)
        args.log_dir.mkdir(parents=True, exist_ok=True)
        text = "\n".join(f"{t:8.1f}  {line}" for t, line in output.lines)
        (args.log_dir / f"{run_dir.name}.log").write_text(text + "\n")
    if output.returncode != 0:
        tail = "\n".join(line for _, line in output.lines[-40:])
        raise RuntimeError(f"{recipe.name} seed {seed} failed:\n{tail}")
    return run_record(args, recipe, seed, cfg, run_dir, output.lines, wall)


def run_record(
    args,
    recipe: Recipe,
    seed: int,
    cfg: TrainConfig,
    run_dir: Path,
    lines: list[tuple[float, str]],
    wall: float,
) -> dict:
    """A finished run of ``recipe`` (``cfg``: its config, `recipe_config`'s) read back from
    ``run_dir`` (``lines``: its timed output)."""
    rows = trained_tokens(read_metrics(RunDir(str(run_dir)).metrics))
    evals = [r for r in rows if r["kind"] == "eval"]
    trains = [r for r in rows if r["kind"] == "train"]
    guard = [
        {"step": int(r["step"]), "action": r["action"], "message": r["message"]}
        for r in rows
        if r["kind"] == "guard"
    ]
    return {
        "recipe": recipe.name,
        "overrides": list(recipe.overrides),
        "seed": seed,
        "device": device_name(args.device),
        "batch": cfg.batch_size * cfg.workers,
        "rule": cfg.optimizer.lr_rule.value,
        "lr": trains[0]["train/lr"] if trains else None,
        "steps": int(evals[-1]["step"]),
        # the last evaluation is the end-of-run one, of the whole held-out split
        "evals": [[int(r["step"]), int(r["tokens"]), float(r["train_s"]), float(r["eval/perplexity"])] for r in evals],
        # the divergence guard's verdicts (the tokens a rollback discarded are in the later rows')
        "guard": guard,
        "final": float(evals[-1]["eval/perplexity"]),
        "train_s": float(evals[-1]["train_s"]),
        "startup_s": startup_seconds(lines, trains),
        "wall_s": wall,
        "tokens_per_s": float(np.median([r["train/tokens_per_s"] for r in trains])) if trains else None,
    }  # fmt: skip


def trained_tokens(rows: list[dict]) -> list[dict]:
    """``rows`` (metrics.jsonl's, in order) with ``tokens`` counting every token trained on: after a
    rollback the steps since its checkpoint are trained again, so the tokens of the discarded ones
    are added to every later row (the seconds, ``train_s``, count them already)."""
    discarded, out = 0, []
    for row in rows:
        if row["kind"] == "guard" and "to_step" in row:
            discarded += (
                (int(row["step"]) - int(row["to_step"])) * int(row["tokens"]) // max(1, int(row["step"]))
            )
        out.append({**row, "tokens": int(row.get("tokens", 0)) + discarded} if "tokens" in row else row)
    return out


def startup_seconds(lines: list[tuple[float, str]], trains: list[dict]) -> float | None:
    """Seconds from the command to the training loop's start: when the first train line was printed,
    less the loop's own clock (``time``) in that row."""
    printed = next((t for t, line in lines if line.startswith("train step ")), None)
    if printed is None or not trains:
        return None
    return max(0.0, printed - float(trains[0]["time"]))


def device_name(device: str) -> str:
    """The GPU's name (a run's seconds are this device's), or the CPU's cores."""
    if device != "cuda":
        return f"cpu ({os.cpu_count()} cores)"
    import torch

    return torch.cuda.get_device_name()


# ---- reading the curves -------------------------------------------------------------------------


def crossing(evals: list, target: float, column: int) -> float | None:
    """``column`` (1: tokens, 2: seconds) at which the curve ``evals`` ([step, tokens, seconds,
    perplexity] rows in step order) first reaches ``target``: linear in log perplexity between the
    evaluations around the crossing; None when it never does."""
    previous = None
    for row in evals:
        x, perplexity = row[column], row[3]
        if perplexity <= target:
            if previous is None or previous[1] <= target:
                return float(x)
            (x0, p0), (x1, p1) = previous, (x, perplexity)
            return x0 + (x1 - x0) * (math.log(p0) - math.log(target)) / (math.log(p0) - math.log(p1))
        previous = (x, perplexity)
    return None


def ahead(a: list[float | None], b: list[float | None]) -> bool:
    """Whether every seed's figure of ``a`` is below every seed's of ``b`` (None: never reached)."""
    worst_a = max((math.inf if x is None else x) for x in a)
    best_b = min((math.inf if x is None else x) for x in b)
    return worst_a < best_b


def verdicts(runs: list[dict], recipes: list[str], targets: dict[str, float]) -> list[str]:
    """Each recipe against the first: better or worse only where every seed says so."""
    lines = []
    base = [r for r in runs if r["recipe"] == recipes[0]]
    for name in recipes[1:]:
        mine = [r for r in runs if r["recipe"] == name]
        figures = {"final perplexity": ([r["final"] for r in mine], [r["final"] for r in base])}
        for target, value in targets.items():
            for column, what in ((1, "tokens"), (2, "seconds")):
                figures[f"{what} to {target} ({value:,.1f})"] = (
                    [crossing(r["evals"], value, column) for r in mine],
                    [crossing(r["evals"], value, column) for r in base],
                )
        for what, (a, b) in figures.items():
            if all(x is None for x in a + b):
                continue
            word = "better" if ahead(a, b) else "worse" if ahead(b, a) else "not separated"
            lines.append(f"{name} vs {recipes[0]}, {what}: {word} over {len(mine)} and {len(base)} seeds")
    return lines


def median(values: list[float | None]) -> float | None:
    reached = [v for v in values if v is not None]
    return float(np.median(reached)) if len(reached) == len(values) and reached else None


def table(runs: list[dict], recipes: list[str], targets: dict[str, float]) -> list[str]:
    head = " | ".join(f"to {name} ({value:,.1f}): tokens / s" for name, value in targets.items())
    lines = [
        f"| recipe | seed | device | final perplexity | tokens/s | start-up s | train s | {head} |",
        "|---|---|---|---|---|---|---|" + "---|" * len(targets),
    ]
    for name in recipes:
        for r in (r for r in runs if r["recipe"] == name):
            reached = []
            for value in targets.values():
                tokens, seconds = crossing(r["evals"], value, 1), crossing(r["evals"], value, 2)
                reached.append("not reached" if tokens is None else f"{tokens:,.0f} / {seconds:,.1f}")
            startup = "?" if r["startup_s"] is None else f"{r['startup_s']:.1f}"
            speed = "?" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
            lines.append(
                f"| {name} | {r['seed']} | {r['device']} | {r['final']:,.2f} | {speed} | {startup} | "
                f"{r['train_s']:,.1f} | " + " | ".join(reached) + " |"
            )
    return lines


def plot(runs: list[dict], recipes: list[str], targets: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (by_tokens, by_time) = plt.subplots(1, 2, figsize=(13, 5.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, name in enumerate(recipes):
        for j, r in enumerate(r for r in runs if r["recipe"] == name):
            points = r["evals"]
            label = f"{name} ({r['device']})" if j == 0 else None
            style = {"color": colors[i % len(colors)], "alpha": 0.8, "linewidth": 1.2}
            by_tokens.plot([p[1] for p in points], [p[3] for p in points], "-", label=label, **style)
            by_time.plot([p[2] for p in points], [p[3] for p in points], "-", label=label, **style)
    for ax, xlabel in ((by_tokens, "training tokens (per direction)"), (by_time, "training seconds")):
        for name, value in targets.items():
            ax.axhline(value, color="black", linestyle=":", linewidth=1)
            ax.annotate(
                name, (1.0, value), xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=8
            )
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out perplexity (full softmax)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("time to target: each recipe's seeds, the split's baselines dotted")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- the study ------------------------------------------------------------------------------------


def previous_study(path: Path) -> dict:
    """An earlier study's JSON; the batch study's curves.json (a list of runs, one a batch, from
    before this benchmark) read as one recipe a batch, seed 0."""
    data = json.loads(path.read_text())
    if isinstance(data, dict):
        return data
    runs = []
    for r in data:
        timed = [e for e in r["evals"] if e[2] is not None]
        runs.append(
            {
                **r,
                "recipe": f"batch-{r['batch']}-{r['rule']}",
                "seed": 0,
                "final": r["evals"][-1][3],
                "evals": timed or r["evals"],
                "train_s": timed[-1][2] if timed else float("nan"),
                "startup_s": None,
                "tokens_per_s": None,
            }
        )
    return {"runs": runs}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shards", default="", help="a shard directory (elmo shard); its baselines are the targets"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for the runs, the JSON and the picture"
    )
    parser.add_argument("--recipe", action="append", default=[], help="'NAME: key=value ...' (repeat)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--tokens", type=int, help="training tokens per direction, each run (max_tokens)")
    budget.add_argument("--time-budget", default="", help="each run's time_budget (e.g. 4m)")
    parser.add_argument(
        "--eval-every", type=int, default=0, help="steps between evaluations (with --time-budget)"
    )
    parser.add_argument("--evals", type=int, default=50, help="evaluations a run (with --tokens)")
    parser.add_argument(
        "--eval-batches", type=int, default=100, help="held-out batches each evaluation during a run scores"
    )
    parser.add_argument("--orders", default="3,5", help="the Kneser-Ney orders that are targets")
    parser.add_argument(
        "--targets",
        default="",
        help="NAME=PERPLEXITY,... instead of the shards' baselines (e.g. for --previous runs)",
    )
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="steps between checkpoints (0: the preset's; the divergence guard rolls back to one)",
    )
    parser.add_argument("--run-timeout-s", type=int, default=1800)
    parser.add_argument(
        "--log-dir", type=Path, default=None, help="keep each run's output here, every line timed"
    )
    parser.add_argument("--results", type=Path, default=None, help="also copy the JSON here")
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep the run directories here (default: deleted)"
    )
    parser.add_argument(
        "--previous", type=Path, default=None, help="a time_to_target.json whose runs are kept, not rerun"
    )
    args = parser.parse_args(argv)
    if not args.shards and not (args.previous and args.targets):
        parser.error("--shards is needed (or --previous and --targets to read earlier runs alone)")
    if args.time_budget and args.eval_every < 1:
        parser.error("--time-budget needs --eval-every N (the run's length is planned by the run)")
    recipes = [Recipe.parse(text) for text in args.recipe] or (
        [] if args.previous else [Recipe("preset", ())]
    )
    seeds = [int(s) for s in args.seeds.split(",")]
    orders = [int(n) for n in args.orders.split(",") if n]
    args.out.mkdir(parents=True, exist_ok=True)
    study = previous_study(args.previous) if args.previous else {"runs": []}
    runs = study["runs"]
    done = {(r["recipe"], r["seed"]) for r in runs}
    names = list(dict.fromkeys([*(r["recipe"] for r in runs), *(r.name for r in recipes)]))
    result_path = args.out / "time_to_target.json"
    with tempfile.TemporaryDirectory(prefix="elmo-ttt-", dir=os.environ.get("TIME_TO_TARGET_TMP")) as tmp:
        keep = args.keep or Path(tmp)
        for recipe in recipes:
            for seed in seeds:
                if (recipe.name, seed) in done:
                    continue
                runs.append(run(args, recipe, seed, keep))
                r = runs[-1]
                print(
                    f"{recipe.name} seed {seed}: {r['final']:.2f} after {r['train_s']:.0f} s of training ({r['wall_s']:.0f} s wall)",
                    flush=True,
                )
                # after every run: a session stopped at its time limit keeps the runs it finished
                study = {"preset": args.preset, "shards": args.shards, "runs": runs}
                result_path.write_text(json.dumps(study, indent=1))
    # the targets after the runs: a baseline counted here costs no training time on a leased GPU
    if args.targets:
        targets = {name: float(value) for name, value in (t.split("=") for t in args.targets.split(","))}
    else:
        known = baselines(args.shards, orders, args.out / "baselines.json")
        targets = {name: known[name] for name in target_names(known, orders)}
    study = {"preset": args.preset, "shards": args.shards, "targets": targets, "runs": runs}
    result_path.write_text(json.dumps(study, indent=1))
    plot(runs, names, targets, args.out / "time_to_target.png")
    print("\n" + "\n".join(table(runs, names, targets)))
    print("\n" + "\n".join(verdicts(runs, names, targets)))
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(result_path, args.results)
    print(f"\nresults: {result_path}, curves: {args.out / 'time_to_target.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
