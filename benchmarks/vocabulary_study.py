"""The vocabulary study (issue 61): which output vocabulary, at which budget, on corpora of other shapes.

    python benchmarks/vocabulary_study.py --out /tmp/vocab-study \\
        --corpus kjv=pipeline/data/kjv-sample.txt.gz:moses \\
        --corpus jargon=/tmp/jargon.txt.gz:moses \\
        --corpus gcide=/tmp/gcide/corpus.txt.gz:whitespace \\
        --min-counts 1,3 --budgets demo,3epochs --seeds 0,1,2 \\
        --results benchmarks/results/vocabulary-cpu-2026-11-29.json

Each corpus (``NAME=PATH:TOKENIZER``; ``benchmarks/jargon_corpus.py`` and ``benchmarks/debian_corpus.py
--only dict-gcide --sample 0.1`` make the second and third) is sharded once per ``min_count`` as the
demo shards (2% held out, the Kneser-Ney 3- and 5-gram counted), then ``tiny`` with its recipe trains
on it through ``benchmarks/time_to_target.py`` for each budget: ``demo`` (512,000 tokens per direction,
the demo's 400 steps at 2 workers) and ``3epochs`` (three times the training split). A cell's folder
under OUT (``BUDGET-CORPUS-mcN*``) that already holds a ``time_to_target.json`` is read, not rerun, so
a study stopped halfway goes on where it was.

A vocabulary is judged against its own split's baselines: a smaller vocabulary makes every model's
perplexity lower (more words are the one ``<UNK>``), so the figures that compare rules are the ratio to
the split's Kneser-Ney 3-gram and the tokens to reach it. Prints one table (per corpus, rule and budget:
the vocabulary, each split's ``<UNK>`` rate, each seed's final perplexity, KN-3 and KN-5, the ratio to
KN-3 and the tokens and training seconds to reach KN-3 and KN-5, interpolated as time_to_target.py
does) and writes the whole study as JSON (``--results``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import time_to_target  # noqa: E402
from benchmarks.time_to_target import crossing  # noqa: E402
from pipeline.formats import shard_format  # noqa: E402
from pipeline.formats.shard_manifest import ShardManifest, read_manifest  # noqa: E402

DEMO_TOKENS = 512_000
"""The demo's budget: 400 steps of 2 workers x 32 rows x 20 tokens."""


@dataclass(frozen=True)
class Corpus:
    name: str
    path: str
    tokenizer: str

    @classmethod
    def parse(cls, text: str) -> Corpus:
        name, sep, rest = text.partition("=")
        path, _, tokenizer = rest.rpartition(":") if ":" in rest else (rest, "", "whitespace")
        if not sep or not name or not path or tokenizer not in ("whitespace", "moses"):
            raise SystemExit(f"--corpus {text!r}: expected NAME=PATH:whitespace|moses")
        return cls(name, path, tokenizer)


def _elmo(args: list[str], log: Path) -> None:
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=REPO, stdout=out, stderr=out)
    if done.returncode != 0:
        raise SystemExit(f"elmo {args[0]} failed; see {log}")


def shard(corpus: Corpus, min_count: int, out: Path) -> Path:
    """The corpus's shards at ``min_count`` (sharded once: an existing manifest is kept)."""
    shards = out / f"{corpus.name}-mc{min_count}"
    if not (shards / shard_format.MANIFEST_FILE).exists():
        _elmo(
            ["shard", "--input", corpus.path, "--output", str(shards), f"tokenizer={corpus.tokenizer}"]
            + ["heldout_fraction=0.02", f"min_count={min_count}", "kneser_ney_orders=[3,5]"]
            + ["progress=false", "wandb.mode=disabled"],
            out / f"{shards.name}.log",
        )
    return shards


def budget_tokens(budget: str, manifest: ShardManifest) -> int:
    if budget == "demo":
        return DEMO_TOKENS
    epochs = int(budget.removesuffix("epochs"))
    return epochs * manifest.totals["train"].tokens


def cell_runs(out: Path, cell: str) -> tuple[dict, list[dict]]:
    """The targets and the runs of a cell's ``time_to_target.json`` files (a cell may be split over
    folders, e.g. ``ep3-kjv-mc1-s0`` and ``ep3-kjv-mc1-s12``)."""
    targets, runs = {}, []
    for path in sorted(out.glob(f"{cell}*/time_to_target.json")):
        found = json.loads(path.read_text())
        targets = found.get("targets") or targets  # written when its last seed ends
        runs += found["runs"]
    return targets, sorted(runs, key=lambda r: int(r["seed"]))


def manifest_targets(shards: Path) -> dict[str, float]:
    """``{"unigram": p, "kn3": p, "kn5": p}`` as ``time_to_target.py`` finds them (the manifest's,
    or counted once and kept beside the shards' folder)."""
    return time_to_target.baselines(str(shards), [3, 5], shards.parent / f"{shards.name}-baselines.json")


def train(shards: Path, tokens: int, seeds: str, out: Path, cell: str) -> None:
    """``tiny`` with its recipe on ``shards`` for ``tokens`` per direction, once per seed."""
    if cell_runs(out, cell)[1]:
        return
    with (out / f"{cell}.log").open("w") as log:
        done = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "time_to_target.py"), "--shards", str(shards)]
            + ["--out", str(out / cell), "--preset", "tiny", "--tokens", str(tokens), "--evals", "20"]
            + ["--seeds", seeds, "--recipe", "choice:"],
            cwd=REPO,
            stdout=log,
            stderr=log,
        )
    if done.returncode != 0:
        raise SystemExit(f"time_to_target.py failed for {cell}; see {out / cell}.log")


def to_target(run: dict, target: float) -> tuple[float, float] | None:
    """(tokens, training seconds) at which the run's curve reaches ``target``, as
    ``time_to_target.py`` interpolates them; None when it never does."""
    evals = [[float(x) for x in row] for row in run["evals"]]
    tokens = crossing(evals, target, 1)
    return None if tokens is None else (tokens, crossing(evals, target, 2))


def cell_row(
    corpus: str, min_count: int, budget: str, manifest: ShardManifest, targets: dict, runs: list[dict]
) -> dict:
    totals = manifest.totals
    finals = [float(r["final"]) for r in runs]
    kn3, kn5 = targets.get("kn3"), targets.get("kn5")
    return {
        "corpus": corpus,
        "min_count": min_count,
        "budget": budget,
        "vocab": manifest.vocab.size,
        "train_tokens": totals["train"].tokens,
        "train_unk_rate": totals["train"].unk_rate,
        "heldout_unk_rate": totals["heldout"].unk_rate,
        "seeds": [int(r["seed"]) for r in runs],
        "final": finals,
        "kn3": kn3,
        "kn5": kn5,
        "to_kn3": [to_target(r, kn3) for r in runs] if kn3 else [],
        "to_kn5": [to_target(r, kn5) for r in runs] if kn5 else [],
        "tokens": max((int(r["evals"][-1][1]) for r in runs), default=0),
        # the divergence guard's verdicts per seed; None: a run from before they were recorded
        "guard": [[(g["step"], g["action"]) for g in r["guard"]] if "guard" in r else None for r in runs],
    }


def _reached(values: list) -> str:
    return " / ".join("never" if v is None else f"{v[0] / 1000:,.0f}k, {v[1]:,.0f} s" for v in values)


def _guarded(values: list) -> str:
    """Per seed: ``none``, each divergence as ``STEP ACTION``, or ``-`` (not recorded)."""
    return " / ".join(
        "-" if v is None else ", ".join(f"{step} {action}" for step, action in v) or "none" for v in values
    )


def table(rows: list[dict]) -> str:
    lines = [
        "| corpus | min_count | vocabulary | <UNK> train / held-out | budget (tokens) | held-out ppl, seeds "
        "| KN-3 / KN-5 | ppl / KN-3 | to KN-3: tokens, training s | to KN-5 | divergences |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratios = " / ".join(f"{f / r['kn3']:.2f}x" for f in r["final"])
        lines.append(
            f"| {r['corpus']} | {r['min_count']} | {r['vocab']:,} | {r['train_unk_rate']:.2%} / "
            f"{r['heldout_unk_rate']:.2%} | {r['budget']} ({r['tokens'] / 1e6:.2f}M) | "
            + " / ".join(f"{f:,.1f}" for f in r["final"])
            + f" | {r['kn3']:,.1f} / {r['kn5']:,.1f} | {ratios} | {_reached(r['to_kn3'])} | {_reached(r['to_kn5'])} "
            f"| {_guarded(r.get('guard', [None] * len(r['final'])))} |"
        )
    return "\n".join(lines)


PER_SEED = ("seeds", "final", "to_kn3", "to_kn5", "guard")


def merged(earlier: list[dict], rows: list[dict]) -> list[dict]:
    """``rows`` with the seeds of ``earlier`` rows (a results file of the same study) they lack: a
    seed run again replaces its earlier run; cells and seeds not run again are kept. Ordered by
    corpus (as first seen), ``min_count``, the demo's budget first."""
    key = lambda r: (r["corpus"], r["min_count"], r["budget"])  # noqa: E731
    new = {key(r): r for r in rows}
    out = []
    for old in earlier:
        row = new.pop(key(old), None)
        if row is None:
            out.append(old)
            continue
        by_seed = {seed: [old[k][i] for k in PER_SEED] for i, seed in enumerate(old["seeds"])}
        by_seed.update({seed: [row[k][i] for k in PER_SEED] for i, seed in enumerate(row["seeds"])})
        seeds = sorted(by_seed)
        combined = {**row, **{k: [by_seed[s][j] for s in seeds] for j, k in enumerate(PER_SEED)}}
        combined["tokens"] = max(old["tokens"], row["tokens"])
        out.append(combined)
    out += new.values()
    corpora = list(dict.fromkeys(r["corpus"] for r in out))
    return sorted(out, key=lambda r: (corpora.index(r["corpus"]), r["min_count"], r["budget"] != "demo"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the shards, runs and logs")
    parser.add_argument(
        "--corpus", action="append", required=True, type=Corpus.parse, help="NAME=PATH:TOKENIZER"
    )
    parser.add_argument("--min-counts", default="1,3")
    parser.add_argument("--budgets", default="demo,3epochs", help="demo and/or Nepochs")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--results", type=Path, default=None, help="write the study's rows here (JSON)")
    parser.add_argument(
        "--report", action="store_true", help="run nothing: the table of the cells OUT already holds"
    )
    parser.add_argument(
        "--merge",
        type=Path,
        default=None,
        help="an earlier results file of this study: its cells and seeds that OUT lacks are kept",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for corpus in args.corpus:
        for min_count in map(int, args.min_counts.split(",")):
            shards = (
                args.out / f"{corpus.name}-mc{min_count}"
                if args.report
                else shard(corpus, min_count, args.out)
            )
            if args.report and not (shards / shard_format.MANIFEST_FILE).exists():
                continue  # a study folder holding some of the cells (the rest may come from --merge)
            manifest = read_manifest(str(shards))
            for budget in args.budgets.split(","):
                cell = f"{'demo' if budget == 'demo' else 'ep' + budget.removesuffix('epochs')}-{corpus.name}-mc{min_count}"
                if not args.report:
                    train(shards, budget_tokens(budget, manifest), args.seeds, args.out, cell)
                targets, runs = cell_runs(args.out, cell)
                if runs:
                    targets = targets or manifest_targets(shards)  # a cell whose runs were cut short
                    rows.append(cell_row(corpus.name, min_count, budget, manifest, targets, runs))
    if args.merge:
        rows = merged(json.loads(args.merge.read_text()), rows)
    print(table(rows))
    if args.results:
        args.results.write_text(json.dumps(rows, indent=1) + "\n")
        print(f"\nresults: {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
