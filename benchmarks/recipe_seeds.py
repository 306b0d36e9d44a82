"""The demo recipe across seeds (issue 13): does training converge whatever the seed?

Shards a corpus once (as ``elmo pipeline`` does: Moses tokens, 2% held out), then trains the demo
recipe (``tiny``, 2 workers, 400 steps) once per seed through ``elmo train`` and prints a table of
the final held-out perplexity (forward, backward, average) against the unigram baseline, the
divergence guard's warnings and the wall time of each run. The targets: every seed's forward and
backward perplexity <= 0.35 x the unigram perplexity, and within 10% of the median of the runs.

    python benchmarks/recipe_seeds.py                       # seeds 0-4 on the sample corpus (~13 min on 2 cores)
    python benchmarks/recipe_seeds.py --seeds 0,1 --corpus other.txt.gz --ratio 0.5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.end_to_end.job import SAMPLE_CORPUS  # noqa: E402

RECIPE = ["--preset", "tiny", "--workers", "2", "--max-steps", "400", "eval_every=200"]
RECIPE += ["checkpoint_every=200", "log_every=20", "wandb.mode=disabled"]


def _elmo(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=REPO, capture_output=True, text=True)


def train(shards: str, out: str, seed: int, extra: list[str]) -> dict:
    """One run of the recipe; its final eval row, guard rows and wall time."""
    start = time.perf_counter()
    ran = _elmo(["train", "--shards", shards, "--output", out, *RECIPE, f"seed={seed}", *extra])
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if r["kind"] == "eval"]
    guards = [r for r in rows if r["kind"] == "guard"]
    if ran.returncode != 0 or not evals:
        raise SystemExit(f"seed {seed}: elmo train failed:\n{ran.stderr[-3000:]}")
    return {"seed": seed, "eval": evals[-1], "guard": guards, "wall": wall}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--corpus", default=str(SAMPLE_CORPUS), help="a text file (.gz or plain)")
    parser.add_argument("--ratio", type=float, default=0.35, help="target: perplexity <= ratio x unigram")
    parser.add_argument("--keep", default="", help="keep the runs in this directory")
    parser.add_argument("extra", nargs="*", help="more train overrides (key=value), e.g. optimizer.lr=0.002")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="elmo-seeds-") as tmp:
        root = Path(args.keep or tmp)
        shards = str(root / "shards")
        if not Path(shards, "manifest.json").exists():
            sharded = _elmo(
                ["shard", "--input", args.corpus, "--output", shards, "tokenizer=moses"]
                + ["heldout_fraction=0.02", "progress=false"]
            )
            if sharded.returncode != 0:
                raise SystemExit(f"elmo shard failed:\n{sharded.stderr[-3000:]}")
        runs = [train(shards, str(root / f"seed-{s}"), s, args.extra) for s in seeds]
    print(
        f"\nthe demo recipe ({' '.join(RECIPE + args.extra)}) on {Path(args.corpus).name}, seeds {args.seeds}"
    )
    print(
        "| seed | held-out fwd | bwd | average | unigram | fwd / unigram | bwd / unigram | guard warnings | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        e = run["eval"]
        uni = e["eval/unigram_perplexity"]
        warned = (
            ", ".join(f"{g['step']} ({g['message'].split(': ', 1)[1].split(' LM')[0]})" for g in run["guard"])
            or "none"
        )
        print(
            f"| {run['seed']} | {e['eval/perplexity_fwd']:,.1f} | {e['eval/perplexity_bwd']:,.1f} | "
            f"{e['eval/perplexity']:,.1f} | {uni:,.1f} | {e['eval/perplexity_fwd'] / uni:.2f} | "
            f"{e['eval/perplexity_bwd'] / uni:.2f} | {warned} | {run['wall']:.0f} |"
        )
    for key in ("eval/perplexity_fwd", "eval/perplexity_bwd"):
        values = [r["eval"][key] for r in runs]
        median = statistics.median(values)
        within = all(abs(v / median - 1) <= 0.10 for v in values)
        under = all(
            v <= args.ratio * r["eval"]["eval/unigram_perplexity"] for v, r in zip(values, runs, strict=True)
        )
        print(
            f"{key}: median {median:,.1f}; every seed within 10% of it: {within}; "
            f"every seed <= {args.ratio} x unigram: {under}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
