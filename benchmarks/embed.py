"""Embed-stage benchmark: end-to-end tokens/s (read, embed, write to the S3 test server) next to the raw
forward throughput of the same model on the same batches in one process, and the job's peak memory at
1x and kx the input (it should not grow with the corpus).

    python benchmarks/embed.py                       # the issue's size: 200,000 sentences, small model
    python benchmarks/embed.py --sentences 2000 --raw-sentences 1000   # a quick run

The model is the ``--preset`` size (configs/<preset>.yaml) with random bilm-tf initialisation; the corpus
is the shipped sample (pipeline/data/kjv-sample.txt.gz) cycled to ``--sentences`` lines. The job runs as
``python -m jobs.embed`` in a subprocess with its own embedded Ray cluster of ``workers x
cpus_per_worker`` CPUs; its memory is the summed PSS of its whole process tree (driver, raylet, actors),
sampled every 0.2 s. Raw forward: one process, ``workers x cpus_per_worker`` torch threads (and 1 thread
x cores as the linear-scaling bound), timing only ``bilm(char_ids)`` over the same length-bucketed batches.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from elmo_model import BiLM, batch_to_ids  # noqa: E402
from pipeline import storage  # noqa: E402
from pipeline.embed.batching import length_bucketed  # noqa: E402
from pipeline.embed.sentences import prepare_lines  # noqa: E402
from pipeline.local_s3 import REGION, LocalS3Server  # noqa: E402
from pipeline.model_config import ModelConfig, to_options  # noqa: E402

SAMPLE = REPO / "pipeline" / "data" / "kjv-sample.txt.gz"
BUCKET = "bench"
SUMMARY_RE = re.compile(r"([\d,]+) tokens in ([\d.]+) s = ([\d,]+) tokens/s")


def sample_lines() -> list[bytes]:
    with gzip.open(SAMPLE, "rb") as f:
        return [line for line in f.read().split(b"\n") if line.strip()]


def corpus_lines(count: int) -> list[bytes]:
    """The sample cycled to ``count`` lines."""
    return list(itertools.islice(itertools.cycle(sample_lines()), count))


def write_corpus(path: str, count: int) -> None:
    lines = itertools.islice(itertools.cycle(sample_lines()), count)
    with storage.open_write(path) as out:
        while chunk := list(itertools.islice(lines, 10000)):
            out.write(b"\n".join(chunk) + b"\n")


def small_model(preset: str, model_dir: Path) -> Path:
    """A randomly initialised ``preset``-size biLM saved as options.json + weights.hdf5."""
    section = OmegaConf.load(REPO / "configs" / f"{preset}.yaml").model
    options = to_options(OmegaConf.merge(OmegaConf.structured(ModelConfig), section))
    torch.manual_seed(0)
    model_dir.mkdir(parents=True, exist_ok=True)
    BiLM.from_options(options).eval().save_files(model_dir / "options.json", model_dir / "weights.hdf5")
    return model_dir


# ---------------------------------------------------------------- memory of a process tree


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def tree_pss_bytes(root: int) -> int:
    """Summed proportional set size of ``root`` and all its descendants (shared pages counted once)."""
    tree, stack, total = _children(), [root], 0
    while stack:
        pid = stack.pop()
        stack.extend(tree.get(pid, []))
        try:
            for line in open(f"/proc/{pid}/smaps_rollup"):
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


class PeakMemory(threading.Thread):
    def __init__(self, pid: int, interval: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak = pid, interval, 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, tree_pss_bytes(self.pid))
            self.done.wait(self.interval)


# ---------------------------------------------------------------- the two measurements


def run_job(args, model: str, corpus: str, output: str) -> dict:
    """``python -m jobs.embed`` in a subprocess; its summary numbers, wall time and peak memory."""
    cmd = [
        sys.executable, "-m", "jobs.embed", "--model", model, "--input", corpus, "--output", output,
        "--layers", args.layers, "--dtype", args.dtype, "--workers", str(args.workers),
        f"lines_per_shard={args.lines_per_shard}", f"batch_tokens={args.batch_tokens}",
        f"cpus_per_worker={args.cpus_per_worker}", f"num_cpus={int(args.workers * args.cpus_per_worker)}",
        "progress=false",
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = PeakMemory(proc.pid)
    sampler.start()
    out, err = proc.communicate()
    sampler.done.set()
    sampler.join()
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"embed job failed ({proc.returncode}): {err.strip().splitlines()[-1:]}")
    match = SUMMARY_RE.search(out)
    tokens, seconds = int(match.group(1).replace(",", "")), float(match.group(2))
    return {"tokens": tokens, "stage_s": seconds, "wall_s": wall, "peak_bytes": sampler.peak}


def raw_forward(args, model_dir: Path, threads: int) -> dict:
    """Forward passes only, one process, the stage's batches (same shards, same token budget)."""
    torch.set_num_threads(threads)
    bilm = BiLM.from_files(model_dir / "options.json", model_dir / "weights.hdf5")
    lines = corpus_lines(args.raw_sentences)
    batches = []
    for first in range(0, len(lines), args.lines_per_shard):
        prepared = prepare_lines(
            lines[first : first + args.lines_per_shard], first, max_tokens=1000, long_sentences="split",
            invalid_utf8="replace", where="bench",
        )  # fmt: skip
        pieces = [p for line in prepared.pieces for p in line]
        for batch in length_bucketed([len(p) for p in pieces], args.batch_tokens, 256):
            batches.append((batch_to_ids([pieces[i] for i in batch]), sum(len(pieces[i]) for i in batch)))
    with torch.inference_mode():
        bilm(batches[0][0])  # warm-up
        start = time.monotonic()
        for ids, _ in batches:
            bilm(ids)
        seconds = time.monotonic() - start
    tokens = sum(n for _, n in batches)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sentences", type=int, default=200_000, help="sentences at scale 1 (issue: >= 200,000)"
    )
    parser.add_argument(
        "--scales", type=int, nargs="+", default=[1, 4], help="input multiples for the memory check"
    )
    parser.add_argument(
        "--raw-sentences", type=int, default=20_000, help="sentences timed for the raw forward baseline"
    )
    parser.add_argument("--preset", default="small")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cpus-per-worker", type=float, default=1.0)
    parser.add_argument("--layers", default="all", choices=["all", "top", "average"])
    parser.add_argument("--dtype", default="float16", choices=["float32", "float16"])
    parser.add_argument("--lines-per-shard", type=int, default=1000)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    args = parser.parse_args(argv)

    cores = int(args.workers * args.cpus_per_worker)
    with (
        tempfile.TemporaryDirectory(prefix="elmo-bench-embed-") as tmp,
        LocalS3Server(Path(tmp) / "s3") as server,
    ):
        server.create_bucket(BUCKET)
        os.environ.update(
            AWS_ENDPOINT_URL=server.endpoint_url, AWS_ACCESS_KEY_ID=server.access_key,
            AWS_SECRET_ACCESS_KEY=server.secret_key, AWS_DEFAULT_REGION=REGION,
        )  # fmt: skip
        storage.configure()
        model_dir = small_model(args.preset, Path(tmp) / "model")
        model = f"s3://{BUCKET}/model"
        for name in ("options.json", "weights.hdf5"):
            storage.upload_file(model_dir / name, f"{model}/{name}")

        raw = raw_forward(args, model_dir, threads=cores)
        raw_1 = raw_forward(args, model_dir, threads=1)
        jobs = {}
        for scale in args.scales:
            corpus = f"s3://{BUCKET}/corpus-{scale}x.txt"
            write_corpus(corpus, args.sentences * scale)
            jobs[scale] = run_job(args, model, corpus, f"s3://{BUCKET}/out-{scale}x")

    print(f"\nembed benchmark: preset {args.preset}, {args.workers} workers x {args.cpus_per_worker:g} CPU, "
          f"layers {args.layers}, {args.dtype}, lines_per_shard {args.lines_per_shard}, batch_tokens {args.batch_tokens}, "
          f"torch {torch.__version__}, {os.cpu_count()} cores on this machine\n")  # fmt: skip
    print(
        f"{'measurement':<44} {'sentences':>10} {'tokens':>11} {'seconds':>9} {'tokens/s':>10} {'peak MiB':>9}"
    )
    print(
        f"{'raw forward, 1 process, ' + str(cores) + ' threads':<44} {args.raw_sentences:>10,} {raw['tokens']:>11,} {raw['seconds']:>9.1f} {raw['tokens_per_s']:>10,.0f} {'':>9}"
    )
    print(
        f"{'raw forward, 1 thread (x' + str(cores) + ' = linear bound)':<44} {args.raw_sentences:>10,} {raw_1['tokens']:>11,} {raw_1['seconds']:>9.1f} {raw_1['tokens_per_s']:>10,.0f} {'':>9}"
    )
    for scale, job in jobs.items():
        for label, seconds in (
            (f"end-to-end {scale}x, stage time", job["stage_s"]),
            (f"end-to-end {scale}x, job wall time", job["wall_s"]),
        ):
            print(
                f"{label:<44} {args.sentences * scale:>10,} {job['tokens']:>11,} {seconds:>9.1f} {job['tokens'] / seconds:>10,.0f} {job['peak_bytes'] / 2**20:>9,.0f}"
            )
    best_raw = max(raw["tokens_per_s"], raw_1["tokens_per_s"] * cores)
    first = jobs[args.scales[0]]
    print(f"\nend-to-end (stage time, {args.scales[0]}x) / raw forward: {first['tokens'] / first['stage_s'] / raw['tokens_per_s']:.2f}x "
          f"({cores} threads in one process), {first['tokens'] / first['stage_s'] / best_raw:.2f}x (best of that and the linear bound); target >= 0.8x")  # fmt: skip
    if len(jobs) > 1:
        peaks = [job["peak_bytes"] for job in jobs.values()]
        print(f"peak memory {args.scales[-1]}x / {args.scales[0]}x input: {peaks[-1] / peaks[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
