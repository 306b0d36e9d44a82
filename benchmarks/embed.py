"""Embed-stage benchmark: end-to-end tokens/s (read, embed, write to the S3 test server) next to the raw
forward throughput of the same model on the same batches in one process, and the job's peak memory at
1x and kx the input (it should not grow with the corpus).

    python benchmarks/embed.py                       # the issue's size: 200,000 sentences, small model
    python benchmarks/embed.py --sentences 2000 --raw-sentences 1000   # a quick run

The model is the ``--preset`` size (pipeline/presets/<preset>.yaml) with random bilm-tf initialisation; the corpus
is the shipped sample (pipeline/data/kjv-sample.txt.gz) cycled to ``--sentences`` lines. The job runs as
``python -m jobs.embed`` in a subprocess with its own embedded Ray cluster of ``workers x
cpus_per_worker`` CPUs; its memory is the summed PSS of its whole process tree (driver, raylet, actors),
sampled every 0.2 s, and so are its CPU seconds: tokens per CPU-second compare the job with the raw
forward even when other work shares the machine. Raw forward: one process, ``workers x cpus_per_worker`` torch threads (and 1 thread
x cores as the linear-scaling bound), timing only ``bilm(char_ids)`` over the same length-bucketed batches.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.process_tree import TreeMonitor  # noqa: E402
from elmo_model import BiLM  # noqa: E402
from elmo_model.static_inference import OutputSpec  # noqa: E402
from pipeline.config import choices  # noqa: E402
from pipeline.embed.config import EmbedConfig, LayerMode, Layout, Pool, Precision, StoredDType  # noqa: E402
from pipeline.embed.inputs import ShardSpec  # noqa: E402
from pipeline.embed.pass_runner import PassRunner  # noqa: E402
from pipeline.embed.pass_size import PassSize, pass_size, per_position  # noqa: E402
from pipeline.embed.sentences import prepare_lines  # noqa: E402
from pipeline.embed.settings import EmbedSettings, work_settings  # noqa: E402
from pipeline.embed.shard_vectors import BufferPool  # noqa: E402
from pipeline.embed.shard_work import work_from_lines  # noqa: E402
from pipeline.model_config import preset_options  # noqa: E402
from pipeline.model_loader import resolve_model  # noqa: E402
from pipeline.runtime import storage  # noqa: E402
from pipeline.tools.local_s3 import REGION, LocalS3Server  # noqa: E402

SAMPLE = REPO / "pipeline" / "data" / "kjv-sample.txt.gz"
BUCKET = "bench"
SUMMARY_RE = re.compile(r"^  ([\d,]+) tokens in ([\d.]+) s = ([\d,]+) tokens/s", re.M)
AFTER_FIRST_RE = re.compile(r"after the first shard: ([\d,]+) tokens in ([\d.]+) s = ([\d,]+) tokens/s")
STARTUP_RE = re.compile(r"  start-up: (.*)")


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
    options = preset_options(preset)
    torch.manual_seed(0)
    model_dir.mkdir(parents=True, exist_ok=True)
    BiLM.from_options(options).eval().save_files(model_dir / "options.json", model_dir / "weights.hdf5")
    return model_dir


# ---------------------------------------------------------------- the two measurements


class FirstShard(threading.Thread):
    """When the job's first shard was committed (its entry under ``_progress/``), in seconds from
    ``start``: the output is listed every 0.1 s (local) or 0.5 s (S3)."""

    def __init__(self, output: str, start: float):
        super().__init__(daemon=True)
        self.output, self.start_time, self.seconds = output, start, float("nan")
        self.done = threading.Event()

    def run(self) -> None:
        pause = 0.5 if storage.is_s3(self.output) else 0.1
        while not self.done.wait(pause):
            try:
                names = storage.list_names(self.output + "/_progress")
            except storage.StorageError:
                continue
            if any(name.startswith("embeddings-") for name in names):
                self.seconds = time.monotonic() - self.start_time
                return


def run_job(args, model: str, corpus: str, output: str) -> dict:
    """``python -m jobs.embed`` in a subprocess; its summary numbers, wall time and peak memory."""
    cmd = [
        sys.executable, "-m", "jobs.embed", "--model", model, "--input", corpus, "--output", output,
        "--layers", args.layers, "--dtype", args.dtype, "--workers", str(args.workers),
        f"lines_per_shard={args.lines_per_shard}", f"batch_tokens={args.batch_tokens}",
        f"precision={args.precision}", f"layout={args.layout}", f"pool={args.pool}",
        f"cpus_per_worker={args.cpus_per_worker}", f"readers={args.readers}",
        f"num_cpus={args.num_cpus or int(args.workers * args.cpus_per_worker)}",
        "progress=false", f"use_gpu={'true' if args.device == 'cuda' else 'false'}", f"gpu_share={args.gpu_share}",
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = TreeMonitor(proc.pid)
    sampler.start()
    first = FirstShard(output, start)
    first.start()
    out, err = proc.communicate()
    sampler.done.set()
    first.done.set()
    sampler.join()
    first.join()
    wall = time.monotonic() - start
    if proc.returncode != 0:
        # Ray's last line is usually advice; the cause is further up, so keep the whole log.
        log = Path(tempfile.gettempdir()) / f"elmo-bench-embed-failed-{os.getpid()}.log"
        log.write_text(out + "\n" + err)
        tail = "\n".join(err.strip().splitlines()[-15:])
        raise SystemExit(f"embed job failed ({proc.returncode}); full log in {log}; last lines:\n{tail}")
    match = SUMMARY_RE.search(out)
    tokens, seconds = int(match.group(1).replace(",", "")), float(match.group(2))
    after = AFTER_FIRST_RE.search(out)
    startup = STARTUP_RE.search(out)
    return {
        "tokens": tokens,
        "stage_s": seconds,
        # the job's own figures: tokens after its first commit over the seconds after it, start-up apart
        "after_first": (int(after.group(1).replace(",", "")), float(after.group(2))) if after else None,
        "startup": startup.group(1) if startup else "",
        "wall_s": wall,
        "first_shard_s": first.seconds,
        "peak_bytes": sampler.peak,
        "cpu_s": sampler.cpu_seconds,
        "cpu_by_name": sampler.cpu_by_name(),
        "quarter_peaks": sampler.quarter_peaks(),
        "peak_by_name": sampler.peak_by_name(),
    }


def raw_pass_size(args, model_dir: Path, bilm: BiLM) -> PassSize:
    """The pass size the stage would choose (``--batch-tokens 0``: for the device), as ``runner``
    chooses it: on CUDA from this GPU's free memory with the model loaded."""
    if args.device != "cuda" or args.batch_tokens:
        return pass_size(args.batch_tokens, 0, args.device)
    dtype = torch.float16 if args.dtype == "float16" else torch.float32
    output = OutputSpec(args.layers, pool=args.pool == "mean", dtype=dtype)
    position = per_position(resolve_model(str(model_dir), "", ""), args.precision, output)
    return pass_size(0, 0, "cuda", torch.cuda.mem_get_info()[0], position)


def embed_shard(encoder: PassRunner, work, buffers: BufferPool) -> None:
    """One prepared shard through the encoder into its (pooled) vectors, as the actor does it."""
    assembler = encoder.assembler(work.spec.first_line, work.num_lines, work.owner, work.sizes, buffers)
    encoder.run(work, assembler)
    buffers.release(assembler.finish())


def raw_forward(args, model_dir: Path, threads: int) -> dict:
    """Forward passes only, one process: the stage's own compute (``PassRunner.run``: static
    shapes, on CUDA graphs and copies to and from pinned host memory, each pass's output placed
    into its shard's vectors) over the stage's shards and passes, prepared beforehand (the stage's
    CPU operator does that beside the actors); no shard is written."""
    torch.set_num_threads(threads)
    device = torch.device(args.device)
    bilm = BiLM.from_files(model_dir / "options.json", model_dir / "weights.hdf5").to(device)
    size = raw_pass_size(args, model_dir, bilm)
    choices = EmbedConfig(
        layers=LayerMode(args.layers), dtype=StoredDType(args.dtype), precision=Precision(args.precision),
        pool=Pool(args.pool), layout=Layout(args.layout),
    )  # fmt: skip
    settings = EmbedSettings(choices, size.tokens, size.rows, threads=threads, device=args.device)
    encoder = PassRunner(bilm, settings, device)
    lines = corpus_lines(args.raw_sentences)
    prepare = work_settings(settings)
    shards = []  # prepared as the stage's CPU operator does, outside the timing
    for first in range(0, len(lines), args.lines_per_shard):
        spec = ShardSpec(len(shards), first, args.lines_per_shard, segments=(), input_sha256="")
        prepared = prepare_lines(
            lines[first : first + args.lines_per_shard], first, max_tokens=1000, long_sentences="split",
            invalid_utf8="replace", where="bench",
        )  # fmt: skip
        shards.append(work_from_lines(spec, True, prepared, prepare))
    # Warm-up: on CUDA a whole pass (graph captures per shape are one-off costs the job pays once
    # per actor too); on CPU one shard.
    buffers = BufferPool()
    for work in shards if device.type == "cuda" else shards[:1]:
        embed_shard(encoder, work, buffers)
    start, cpu_start = time.monotonic(), time.process_time()
    for work in shards:
        embed_shard(encoder, work, buffers)
    seconds, cpu = time.monotonic() - start, time.process_time() - cpu_start
    tokens = sum(sum(work.sizes) for work in shards)
    del encoder, bilm
    if device.type == "cuda":  # the job's actor, started next, gets the whole GPU
        torch.cuda.empty_cache()
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "cpu_s": cpu,
        "batch_tokens": size.tokens,
    }


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
    for flag, default, text in (
        (
            "--num-cpus",
            0,
            "CPUs of the job's embedded cluster (0: workers x cpus-per-worker); the preparing tasks use the rest",
        ),
        ("--readers", 0, "shards prepared at once (0: the CPUs the actors leave)"),
        ("--batch-tokens", 4096, "0: the stage's choice for the device (on a GPU, its memory)"),
    ):
        parser.add_argument(flag, type=int, default=default, help=text)
    for flag, default, kind in (
        ("--layers", "all", LayerMode),
        ("--dtype", "float16", StoredDType),
        ("--precision", "float32", Precision),
        ("--layout", "allennlp", Layout),
        ("--pool", "none", Pool),
    ):  # the stage's own choices
        parser.add_argument(flag, default=default, choices=choices(kind))
    parser.add_argument("--lines-per-shard", type=int, default=1000)
    parser.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="cuda: raw forward and the job's actors on GPU",
    )
    parser.add_argument("--gpu-share", type=float, default=1.0, help="GPU fraction per actor (cuda)")
    parser.add_argument(
        "--storage",
        default="s3",
        choices=["s3", "local"],
        help="s3: the SeaweedFS test server (needs the weed binary); local: a temporary folder",
    )
    args = parser.parse_args(argv)

    cores = int(args.workers * args.cpus_per_worker)
    with tempfile.TemporaryDirectory(prefix="elmo-bench-embed-") as tmp, contextlib.ExitStack() as stack:
        model_dir = small_model(args.preset, Path(tmp) / "model")
        if args.storage == "s3":
            server = stack.enter_context(LocalS3Server(Path(tmp) / "s3"))
            server.create_bucket(BUCKET)
            os.environ.update(
                AWS_ENDPOINT_URL=server.endpoint_url, AWS_ACCESS_KEY_ID=server.access_key,
                AWS_SECRET_ACCESS_KEY=server.secret_key, AWS_DEFAULT_REGION=REGION,
            )  # fmt: skip
            storage.configure()
            root = f"s3://{BUCKET}"
            for name in ("options.json", "weights.hdf5"):
                storage.upload_file(model_dir / name, f"{root}/model/{name}")
        else:
            root = f"{tmp}/data"
            shutil.copytree(model_dir, f"{root}/model")

        raw = raw_forward(args, model_dir, threads=cores)
        # a GPU's rate does not depend on the host's threads: one raw run there
        raw_1 = raw if args.device == "cuda" else raw_forward(args, model_dir, threads=1)
        # Partial results go to stderr as they come, so a run cut short still reports something.
        print(f"raw forward: {raw} / 1 thread: {raw_1}", file=sys.stderr, flush=True)
        jobs = {}
        for scale in args.scales:
            corpus = f"{root}/corpus-{scale}x.txt"
            write_corpus(corpus, args.sentences * scale)
            jobs[scale] = run_job(args, f"{root}/model", corpus, f"{root}/out-{scale}x")
            print(f"job {scale}x: {jobs[scale]}", file=sys.stderr, flush=True)

    print(f"\nembed benchmark: preset {args.preset}, {args.workers} workers x {args.cpus_per_worker:g} CPU, "
          f"gpu_share {args.gpu_share:g}, layers {args.layers}, {args.dtype}, precision {args.precision}, layout {args.layout}, pool {args.pool}, lines_per_shard {args.lines_per_shard}, batch_tokens {args.batch_tokens}, "
          f"torch {torch.__version__}, {os.cpu_count()} cores on this machine, device {args.device}, storage {args.storage}\n")  # fmt: skip
    rows = [
        (
            f"raw forward, 1 process, {cores} threads",
            args.raw_sentences,
            raw["tokens"],
            raw["seconds"],
            raw["cpu_s"],
            None,
        ),
        (
            "raw forward, 1 thread",
            args.raw_sentences,
            raw_1["tokens"],
            raw_1["seconds"],
            raw_1["cpu_s"],
            None,
        ),
    ]
    for scale, job in jobs.items():
        n = args.sentences * scale
        rows.append(
            (
                f"end-to-end {scale}x, stage time",
                n,
                job["tokens"],
                job["stage_s"],
                job["cpu_s"],
                job["peak_bytes"],
            )
        )
        rows.append(
            (
                f"end-to-end {scale}x, job wall time",
                n,
                job["tokens"],
                job["wall_s"],
                job["cpu_s"],
                job["peak_bytes"],
            )
        )
    header = ("measurement", "sentences", "tokens", "seconds", "tokens/s", "CPU s", "tok/CPU-s", "peak MiB")
    print("{:<40} {:>10} {:>10} {:>8} {:>9} {:>8} {:>10} {:>9}".format(*header))
    for label, n, tokens, seconds, cpu, peak in rows:
        mem = f"{peak / 2**20:,.0f}" if peak else ""
        print(
            f"{label:<40} {n:>10,} {tokens:>10,} {seconds:>8.1f} {tokens / seconds:>9,.0f} {cpu:>8.1f} {tokens / cpu:>10,.0f} {mem:>9}"
        )
    best_raw = max(raw["tokens_per_s"], raw_1["tokens_per_s"] * cores)
    last = jobs[args.scales[-1]]
    e2e = last["tokens"] / last["stage_s"]
    print(
        f"\nend-to-end ({args.scales[-1]}x, stage time) / raw forward ({cores} threads): {e2e / raw['tokens_per_s']:.2f}x; "
        f"/ linear bound (1-thread rate x {cores}): {e2e / best_raw:.2f}x; target >= 0.8x"
    )
    if last["after_first"]:
        # the long-job figure: the job's tokens after its first commit over the seconds after it
        # (the difference of two jobs' totals was noise: 852,802 one day, 319,801 the time before)
        tokens_after, seconds_after = last["after_first"]
        steady = tokens_after / seconds_after
        print(
            f"after the first commit ({args.scales[-1]}x job): {tokens_after:,} tokens in {seconds_after:.1f} s = "
            f"{steady:,.0f} tokens/s, {steady / raw['tokens_per_s']:.2f}x the raw forward; target >= 0.8x"
        )
    print(
        f"per CPU-second (robust to other load on the machine): end-to-end {last['tokens'] / last['cpu_s']:,.0f} "
        f"vs raw 1 thread {raw_1['tokens'] / raw_1['cpu_s']:,.0f} tokens = "
        f"{(last['tokens'] / last['cpu_s']) / (raw_1['tokens'] / raw_1['cpu_s']):.2f}x"
    )
    print(
        "CPU seconds of the largest job by process: "
        + ", ".join(f"{k} {v:.1f}" for k, v in list(last["cpu_by_name"].items())[:8])
    )
    for scale, job in jobs.items():
        quarters = ", ".join(f"{b / 2**20:,.0f}" for b in job["quarter_peaks"])
        print(f"peak MiB per quarter of the {scale}x job: {quarters}")
        print(
            f"peak MiB by process of the {scale}x job: "
            + ", ".join(f"{k} {v / 2**20:,.0f}" for k, v in list(job["peak_by_name"].items())[:8])
        )
    print(f"raw forward's pass: {raw['batch_tokens']:,} tokens")
    for scale, job in jobs.items():
        print(
            f"command to first committed shard, {scale}x job: {job['first_shard_s']:.1f} s ({job['startup']})"
        )
    if len(jobs) > 1:
        peaks = [job["peak_bytes"] for job in jobs.values()]
        print(f"peak memory {args.scales[-1]}x / {args.scales[0]}x input: {peaks[-1] / peaks[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
