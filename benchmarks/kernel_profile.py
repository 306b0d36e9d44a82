"""Where a GPU's time goes: the PyTorch profiler's CUDA kernels of a few repetitions of some work,
summed by kind (matrix products, the Triton cell, copies, ...) and by name, per repetition.

    summary = profile_kernels(lambda: run_one_step(), repeats=5, trace="DIR/trace.json")
    print_kernel_summary("original bf16 batch 128", "step", summary)

Used by benchmarks/train_step.py (a training step) and benchmarks/static_forward.py (an embed pass).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import torch

KERNEL_KINDS = (
    ("LSTM cell (Triton)", r"_cell_(forward|backward)_kernel"),
    ("matrix products", r"gemm|xmma|cutlass|sm90|sm80|ampere|hopper|cublas|nvjet|splitK"),
    ("fused optimizer", r"[Ff]used|multi_tensor|adagrad|adam"),
    ("softmax/logsumexp", r"softmax|logsumexp|LogSumExp"),
    ("reductions", r"reduce|Reduce|norm"),
    ("index/gather/scatter", r"index|gather|scatter|embedding"),
    ("sort/scan", r"sort|Sort|radix|scan|Scan|cumsum"),
    ("copies/memset", r"copy|Memcpy|Memset|memcpy|memset|fill|cat|CatArray"),
    ("elementwise", r"elementwise|vectorized|unrolled|Elementwise"),
)
"""A kernel's kind: the first pattern its name matches ("other" if none)."""


def profile_kernels(work: Callable[[], object], repeats: int, trace: str = "") -> dict:
    """Run ``work`` ``repeats`` times under the profiler (the GPU synchronised around them).

    Returns per repetition: ``wall_ms``, ``kernel_ms`` (the kernels' summed device time),
    ``kinds`` {kind: (ms, launches)} largest first, ``top`` [(ms, name)] the 15 largest. ``trace``:
    also write the Chrome trace there."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()  # without CUDA (a dry run) the table is empty
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(repeats):
            work()
        sync()
        wall = time.perf_counter() - start
    if trace:
        os.makedirs(os.path.dirname(trace) or ".", exist_ok=True)
        prof.export_chrome_trace(trace)
    kinds: dict[str, float] = {}
    counts: dict[str, int] = {}
    top: dict[str, float] = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
        kind = next((k for k, pattern in KERNEL_KINDS if re.search(pattern, event.name)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + us
        counts[kind] = counts.get(kind, 0) + 1
        top[event.name[:90]] = top.get(event.name[:90], 0.0) + us
    return {
        "wall_ms": wall * 1e3 / repeats,
        "kernel_ms": sum(kinds.values()) / 1e3 / repeats,
        "kinds": {
            k: (v / 1e3 / repeats, counts[k] / repeats) for k, v in sorted(kinds.items(), key=lambda x: -x[1])
        },
        "top": sorted(((v / 1e3 / repeats, k) for k, v in top.items()), reverse=True)[:15],
    }


def print_kernel_summary(what: str, unit: str, summary: dict) -> None:
    """``summary`` (``profile_kernels``) as a table per ``unit`` (a step, a pass, ...)."""
    print(
        f"\nkernel time of {what}: {summary['kernel_ms']:.2f} ms of kernels in "
        f"{summary['wall_ms']:.2f} ms per {unit} (profiled)"
    )
    print(f"| kernels | ms/{unit} | launches/{unit} |")
    print("|---|---|---|")
    for kind, (ms, count) in summary["kinds"].items():
        print(f"| {kind} | {ms:.2f} | {count:.0f} |")
    print(f"top kernels (ms/{unit}):")
    for ms, name in summary["top"]:
        print(f"  {ms:7.3f}  {name}")
