"""Every stage at the 1B Word Benchmark's size: what grows with the corpus on the driver and the job.

    python benchmarks/scale.py                          # 10M, 100M and 800M tokens (about an hour here)
    python benchmarks/scale.py --sizes 10M 100M         # a quicker table
    python benchmarks/scale.py --corpora /var/tmp/elmo-corpora   # keep the corpora for the next run

For each size a synthetic corpus (benchmarks/synthetic_corpus.py: Zipf over 800k types, sentence
lengths like the benchmark's) is written, then each stage runs as its own command in a subprocess,
as a user runs it, with an embedded Ray cluster:

- **shard**: ``python -m jobs.shard`` to completion: wall time, tokens/s, the peak memory of the
  whole job (summed PSS of the driver, raylet, workers and the object store's pages they map),
  the peak of Ray's spilled objects on disk, the shards' size, the driver's own peak (its PSS without
  its share of the object store's shared memory, which the job's peak counts once).
- **train**: ``python -m jobs.train``, preset ``tiny`` with the corpus's full vocabulary, 1 worker,
  a log line, an evaluation and a checkpoint at every step: the time from the command to the first
  logged step and to the first evaluation's line (the evaluation's own seconds are on that line);
  then SIGTERM (the run keeps its checkpoint). A rerun of the same command resumes: the time from
  the command to its first logged step. The driver's peak memory (the command's own process).
- **embed**: ``python -m jobs.embed`` with the shard directory as input and a ``tiny``-size model
  of random weights: the time and whole-job peak memory from the command to the first embedded
  shard file; then SIGTERM.

Times are wall-clock seconds on whatever else the machine runs; run it on an idle machine.
Everything it writes lives in one temporary folder, removed at the end (the corpora too unless
``--corpora`` names a folder to keep them in).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.embed import small_model  # noqa: E402
from benchmarks.process_tree import TreeMonitor  # noqa: E402
from benchmarks.synthetic_corpus import write_corpus  # noqa: E402
from pipeline.formats.shard_manifest import read_manifest  # noqa: E402

SIZES = {"1M": 1_000_000, "10M": 10_000_000, "100M": 100_000_000, "800M": 800_000_000}
TYPES = 800_000
EVAL_LINE = re.compile(r"^eval .*\[(\d+) batches, ([\d.]+) s\]")
GIB, MIB = 1 << 30, 1 << 20
SAMPLE_S = 1.0
"""Between two samples of the job's memory and spilled bytes (each reads /proc for every process: at
0.5 s the sampling took about 0.4 of a core of this 2-core machine)."""


@dataclass
class JobRun:
    """One command's run: its console lines with the seconds since it started, when it was stopped
    (or ended), and its memory: peak summed PSS of the tree (the object store's pages included), the
    command's own process's peak without its share of the object store (``driver_peak``), and the
    peak size of Ray's spilled objects."""

    lines: list[tuple[float, str]] = field(default_factory=list)
    seconds: float = 0.0
    returncode: int | None = None
    peak: int = 0
    driver_peak: int = 0
    spilled_peak: int = 0

    def first(self, pattern: str) -> tuple[float, str] | None:
        regex = re.compile(pattern)
        return next(((t, line) for t, line in self.lines if regex.search(line)), None)


def _spilled_bytes(since: float) -> int:
    """Bytes of spilled objects in the embedded Ray clusters' temp dirs started since ``since``
    (Ray spills into ``ray_spilled_objects*`` folders of its temp dir or session dir)."""
    total = 0
    for root in Path(tempfile.gettempdir()).glob("elmo-ray-*"):
        try:
            if root.stat().st_mtime < since - 1:
                continue
        except OSError:
            continue
        for spill in [*root.glob("ray_spilled_objects*"), *root.glob("session_*/ray_spilled_objects*")]:
            for dirpath, _, files in os.walk(spill):
                for name in files:
                    try:
                        total += os.path.getsize(os.path.join(dirpath, name))
                    except OSError:
                        pass
    return total


def run_command(
    cmd: list[str], stop: Callable[[JobRun], bool] | None = None, timeout_s: float = 3600
) -> JobRun:
    """Run ``cmd`` to its end, or until ``stop(run)`` is true (checked every ``SAMPLE_S``),
    then SIGTERM it and wait; fails when it ended with an error before that."""
    run = JobRun()
    started = time.time()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    monitor = TreeMonitor(proc.pid, interval=SAMPLE_S)
    monitor.start()
    stopped = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            run.lines.append((time.time() - started, line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while proc.poll() is None:
        run.spilled_peak = max(run.spilled_peak, _spilled_bytes(started))
        if not stopped.is_set() and stop is not None and stop(run):
            run.seconds = time.time() - started
            stopped.set()
            proc.send_signal(signal.SIGTERM)
        if time.time() - started > timeout_s:
            proc.kill()
            raise RuntimeError(f"{' '.join(cmd[:4])} ... ran past {timeout_s:.0f} s")
        time.sleep(SAMPLE_S)
    reader.join()
    monitor.done.set()
    monitor.join()
    run.returncode = proc.returncode
    if not stopped.is_set():
        run.seconds = time.time() - started
        if proc.returncode != 0:
            tail = "\n".join(line for _, line in run.lines[-15:])
            raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{tail}")
    run.peak = monitor.peak
    run.driver_peak = monitor.own_peak_by_pid.get(proc.pid, 0)
    return run


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def shard(corpus: Path, out: Path, workers: int) -> dict:
    cmd = [sys.executable, "-m", "jobs.shard", "--input", str(corpus), "--output", str(out)]
    run = run_command([*cmd, "--workers", str(workers), "progress=false"])
    manifest = read_manifest(str(out))
    tokens = sum(manifest.totals[s].tokens for s in ("train", "heldout"))
    return {
        "shard s": run.seconds,
        "shard tok/s": tokens / run.seconds,
        "shard peak GiB": run.peak / GIB,
        "shard driver MiB": run.driver_peak / MIB,
        "spilled GiB": run.spilled_peak / GIB,
        "shards GiB": _du(out) / GIB,
        "vocab": manifest.vocab.size,
    }


def train(shards: Path, run_dir: Path, eval_batches: int) -> dict:
    cmd = [
        sys.executable, "-m", "jobs.train", "--shards", str(shards), "--output", str(run_dir),
        "--preset", "tiny", "--workers", "1", "--max-steps", "1000000", "log_every=1", "eval_every=1",
        "checkpoint_every=1", f"eval_interval_batches={eval_batches}", "wandb.mode=disabled",
    ]  # fmt: skip
    first = run_command(cmd, stop=lambda r: r.first(EVAL_LINE.pattern) is not None)
    step, evaluated = first.first(r"^train step "), first.first(EVAL_LINE.pattern)
    if step is None or evaluated is None:
        raise RuntimeError(
            "train: no step or evaluation line:\n" + "\n".join(x for _, x in first.lines[-15:])
        )
    batches, eval_s = EVAL_LINE.search(evaluated[1]).groups()
    rerun = run_command(cmd, stop=lambda r: r.first(r"^train step ") is not None)
    resumed = rerun.first(r"^train step ")
    return {
        "train cmd->step s": step[0],
        "eval s": float(eval_s),
        "eval batches": int(batches),
        "rerun->step s": resumed[0],
        "train driver MiB": max(first.driver_peak, rerun.driver_peak) / MIB,
        "train peak GiB": max(first.peak, rerun.peak) / GIB,
    }


def embed(shards: Path, model: Path, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "jobs.embed", "--model", str(model), "--input", str(shards),
        "--output", str(out), "--workers", "1", "--layers", "top", "progress=false",
        "use_gpu=false", "lines_per_shard=2000",
    ]  # fmt: skip
    run = run_command(cmd, stop=lambda r: out.is_dir() and any(out.glob("embeddings-*.hdf5")))
    return {
        "embed cmd->shard s": run.seconds,
        "embed peak GiB": run.peak / GIB,
        "embed driver MiB": run.driver_peak / MIB,
    }


COLUMNS = [
    ("corpus", "{}"),
    ("vocab", "{:,}"),
    ("shard s", "{:.0f}"),
    ("shard tok/s", "{:,.0f}"),
    ("shard peak GiB", "{:.2f}"),
    ("spilled GiB", "{:.2f}"),
    ("shards GiB", "{:.2f}"),
    ("shard driver MiB", "{:.0f}"),
    ("train cmd->step s", "{:.1f}"),
    ("rerun->step s", "{:.1f}"),
    ("eval s", "{:.1f}"),
    ("eval batches", "{}"),
    ("train driver MiB", "{:.0f}"),
    ("train peak GiB", "{:.2f}"),
    ("embed cmd->shard s", "{:.1f}"),
    ("embed peak GiB", "{:.2f}"),
    ("embed driver MiB", "{:.0f}"),
]


def table(rows: list[dict]) -> str:
    head = "| " + " | ".join(name for name, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    body = [
        "| " + " | ".join(fmt.format(row[name]) if name in row else "-" for name, fmt in COLUMNS) + " |"
        for row in rows
    ]
    return "\n".join([head, rule, *body])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["10M", "100M", "800M"], choices=list(SIZES))
    parser.add_argument("--workers", type=int, default=2, help="the shard stage's Ray workers")
    parser.add_argument("--eval-batches", type=int, default=10, help="eval_interval_batches of the run")
    parser.add_argument("--corpora", type=Path, help="folder to keep (and reuse) the corpora in")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="elmo-scale-", dir=os.environ.get("SCALE_TMP")) as tmp:
        work = Path(tmp)
        corpora = args.corpora or work / "corpora"
        corpora.mkdir(parents=True, exist_ok=True)
        model = small_model("tiny", work / "model")
        for size in args.sizes:
            corpus = corpora / f"synthetic-{size}.txt"
            if not corpus.exists():
                start = time.time()
                write_corpus(corpus, SIZES[size], TYPES, seed=0)
                print(f"{size}: corpus written in {time.time() - start:.0f} s", flush=True)
            row = {"corpus": size}
            shards = work / f"shards-{size}"
            row.update(shard(corpus, shards, args.workers))
            print(f"{size}: {row}", flush=True)
            row.update(train(shards, work / f"run-{size}", args.eval_batches))
            print(f"{size}: {row}", flush=True)
            row.update(embed(shards, model, work / f"embed-{size}"))
            rows.append(row)
            print(table(rows), flush=True)
            for path in (shards, work / f"run-{size}", work / f"embed-{size}"):
                shutil.rmtree(path, ignore_errors=True)
    print(
        f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, `python benchmarks/scale.py --sizes {' '.join(args.sizes)}`"
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
