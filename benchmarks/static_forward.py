"""Raw static-shape forward (model only): tokens/s per precision, its error against float32, and the
fixture check, for the embed stage's compute (``elmo_model.static_inference``).

    python benchmarks/static_forward.py --device cuda --sizes small,original   # the GPU rows
    python benchmarks/static_forward.py --sentences 400 --sizes small          # a CPU dry run

Random bilm-tf-initialised weights of each preset size, the shipped sample corpus's sentences,
planned as the stage plans them (fixed bucket shapes replayed as CUDA graphs on CUDA; passes shrunk
to their sentences on a CPU). "tokens/s" times the passes, their outputs compacted on the device,
copied to the host and placed into one array (``PassRunner.run_passes``), after one warm-up pass
over the same data (the graph captures); the passes' host batches are built before the clock, as
the stage builds them in its CPU operator on other cores. "build s" is that host building, one
thread: the H200 run of 2026-11-28 timed it inside the clock, 0.4 s of a 1.15 s run. "max |err|" compares each precision's vectors
with float32's, element by element; "real/pos" is the share of the passes' positions that hold real
tokens (every position of a fixed shape is computed). ``--profile`` adds the kernels of one
timed run of the first size in bf16, top float16 (benchmarks/kernel_profile.py): where a pass's time
goes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "elmo_model"))
sys.path.insert(0, str(REPO / "benchmarks"))

from bilm_forward import DEFAULT_CORPUS, read_batches  # noqa: E402
from kernel_profile import print_kernel_summary, profile_kernels  # noqa: E402

from elmo_model import BiLM  # noqa: E402
from elmo_model.static_batches import build_passes  # noqa: E402
from pipeline.embed.config import EmbedConfig, LayerMode, Precision, StoredDType  # noqa: E402
from pipeline.embed.pass_runner import PassRunner  # noqa: E402
from pipeline.embed.settings import EmbedSettings, bucket_plan  # noqa: E402
from pipeline.embed.shard_vectors import BufferPool  # noqa: E402
from pipeline.model_config import preset_options  # noqa: E402


def encoder(
    bilm, device, precision: str, layers: str, dtype: str, batch_tokens: int, max_rows: int = 1024
) -> PassRunner:
    choices = EmbedConfig(layers=LayerMode(layers), dtype=StoredDType(dtype), precision=Precision(precision))
    settings = EmbedSettings(
        choices, batch_tokens, max_rows, threads=torch.get_num_threads(), device=device.type
    )
    return PassRunner(bilm, settings, device)


def timed(enc: PassRunner, data: list[list[str]], device) -> tuple[float, float, np.ndarray]:
    """(seconds of the passes, seconds building their host batches, the vectors) of ``data``."""
    buffers = BufferPool()
    buffers.release(enc.embed(data, buffers))  # warm-up: graph captures, the host buffer
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    passes = build_passes(data, bucket_plan(enc.settings, device.type))
    built = time.perf_counter() - start
    start = time.perf_counter()
    vectors = run_built(enc, data, passes, buffers).vectors
    return time.perf_counter() - start, built, vectors


def run_built(enc: PassRunner, data: list[list[str]], passes, buffers: BufferPool):
    """``data``'s vectors from its ``passes``, built beforehand (``PassRunner.embed`` less the building)."""
    assembler = enc.assembler(0, len(data), range(len(data)), [len(p) for p in data], buffers)
    enc.run_passes(passes, assembler)
    return assembler.finish()


def real_share(enc: PassRunner, data: list[list[str]], device) -> tuple[float, int]:
    """(real tokens / positions computed, passes) of ``data`` as ``enc`` plans it."""
    passes = build_passes(data, bucket_plan(enc.settings, device.type))
    return sum(map(len, data)) / sum(batch.positions.size for _, batch in passes), len(passes)


def profiled(enc: PassRunner, data: list[list[str]], what: str) -> None:
    """The kernels of one more run of ``enc`` over ``data`` (warmed up: graphs replay)."""
    buffers = BufferPool()
    share, passes = real_share(enc, data, enc.device)
    built = build_passes(data, bucket_plan(enc.settings, enc.device.type))
    summary = profile_kernels(lambda: buffers.release(run_built(enc, data, built, buffers)), repeats=1)
    print_kernel_summary(f"{what}, {passes} passes, {share:.0%} of positions real", "run", summary)


def fixture_check(device) -> str:
    from elmo_reference import ReferenceSet

    from elmo_model.static_batches import BucketPlan, build_batch, split_rows
    from elmo_model.static_inference import OutputSpec, StaticInference

    lines = []
    for name in ("bilm_tf", "allennlp"):
        ref = ReferenceSet(name)
        model = ref.load().to(device)
        batch = build_batch(
            [ref.sentences()[k][0] for k in range(3)], BucketPlan(fixed=device.type == "cuda")
        )
        top = split_rows(StaticInference(model, OutputSpec("top"))(batch).cpu().numpy(), batch, False)
        err = max(float(np.abs(top[k] - ref.expected()[k][0]).max()) for k in range(3))
        lines.append(
            f"fixture {name} (first batch, float32, {device.type}): max |err| {err:.1e} ({'ok' if err < 1e-6 else 'OVER 1e-6'})"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--sizes", default="small,original")
    parser.add_argument("--sentences", type=int, default=20_000)
    parser.add_argument("--batch-tokens", type=int, default=8192)
    parser.add_argument(
        "--max-rows", type=int, default=1024, help="rows of a pass at most (the stage's max_batch_sentences)"
    )
    parser.add_argument("--precisions", default="float32,tf32,bf16")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="the kernels of the first size's bf16 top float16 run (none listed on a CPU)",
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    data = read_batches(DEFAULT_CORPUS, 1, args.sentences)[0]
    tokens = sum(map(len, data))
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU, {torch.get_num_threads()} threads"
    )
    print(f"static-shape forward on {name}, torch {torch.__version__}, {len(data):,} sentences, {tokens:,} tokens, "
          f"batch_tokens {args.batch_tokens}, max_rows {args.max_rows}\n")  # fmt: skip
    print(fixture_check(device) + "\n")
    print(
        f"{'size':<9} {'precision':<9} {'output':<14} {'tokens/s':>11} {'build s':>8} {'max |err|':>10} {'GPU peak GiB':>12} {'graphs':>6} {'real/pos':>8}"
    )
    for size in args.sizes.split(","):
        bilm = BiLM.from_options(preset_options(size)).eval().to(device)
        for layers, dtype in (("top", "float16"), ("all", "float32")):
            exact = None
            for precision in args.precisions.split(","):
                enc = encoder(bilm, device, precision, layers, dtype, args.batch_tokens, args.max_rows)
                seconds, built, values = timed(enc, data, device)
                if precision == "float32":
                    exact = values
                err = (  # against float32 when it ran first (--precisions lists it); else not known
                    float(np.abs(values.astype(np.float32) - exact.astype(np.float32)).max())
                    if exact is not None
                    else float("nan")
                )
                peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
                shapes = len(enc.static.captured_shapes)
                share = real_share(enc, data, device)[0]
                print(
                    f"{size:<9} {precision:<9} {layers + ' ' + dtype:<14} {tokens / seconds:>11,.0f} {built:>8.2f} {err:>10.1e} {peak:>12.2f} {shapes:>6} {share:>8.0%}",
                    flush=True,
                )
                if args.profile and (precision, layers) == ("bf16", "top"):
                    profiled(enc, data, f"{size} bf16 top float16 over {len(data):,} sentences")
                    args.profile = False
        del bilm
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
