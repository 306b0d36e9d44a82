"""GPU correctness checks of the training path (issue 12): run on a CUDA machine before trusting GPU numbers.

1. The training layer op (elmo_model/recurrence.py) with the Triton cell kernels against the same
   op with the torch cell, float32 with TF32 off: outputs and every gradient.
2. The training step replayed as a CUDA graph against the same step run eagerly: 8 steps of
   ``small`` without dropout, float32 (TF32 off) and bf16: losses per step and the final weights.
3. With ``--export DIR`` (a run's export/): the exported weights on the CPU and on the GPU, float32
   (TF32 off), give the same layers for 64 sample sentences (max abs difference).

    python benchmarks/gpu_train_check.py [--export RUN/export] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from bilm_forward import DEFAULT_CORPUS, read_batches  # noqa: E402
from train_step import make_runner, synthetic_batches  # noqa: E402

from elmo_model import BiLM, LSTMState, StackedBiLSTM, batch_to_ids  # noqa: E402


def check_window(device: torch.device) -> bool:
    torch.manual_seed(0)
    lstm = StackedBiLSTM(2, 256, 1024, 256, cell_clip=3.0, proj_clip=3.0, use_skip_connections=True).to(
        device
    )
    inputs = torch.randn(2, 64, 20, 256, device=device, requires_grad=True)
    state = LSTMState(torch.randn(2, 2, 64, 1024, device=device), torch.randn(2, 2, 64, 256, device=device))
    weights = torch.randn(2, 64, 20, 256, device=device)
    results = []
    for fused in (True, False):
        lstm.use_fused_cell = fused
        top, final = lstm.forward_window(inputs, state)
        loss = (top * weights).sum() + final.c.sum()
        results.append((top, final.c, *torch.autograd.grad(loss, [inputs, *lstm.parameters()])))
    names = ["top", "c", "d inputs", *(f"d {n}" for n, _ in lstm.named_parameters())]
    worst = max(
        (float((a - b).detach().norm() / b.detach().norm()), name)
        for name, a, b in zip(names, *results, strict=True)
    )
    ok = worst[0] < 1e-5
    print(
        f"training layer op, Triton cell vs torch cell (float32): worst relative error {worst[0]:.1e} ({worst[1]}) {'ok' if ok else 'FAIL'}"
    )
    return ok


def check_graph(device: torch.device, dtype: str) -> bool:
    args = argparse.Namespace(unroll_steps=20, negatives=1024, vocab=20_000, device=str(device))
    losses, finals = [], []
    for graph in (True, False):
        overrides = [
            "dropout=0.0",
            f"bf16={str(dtype == 'bf16').lower()}",
            f"cuda_graph={str(graph).lower()}",
        ]
        runner, cache = make_runner(args, "small", 32, overrides)
        batches = synthetic_batches(cache, 8, 32, 20, seed=1)
        losses.append(torch.stack([runner.train_step(b, 10**6).losses.clone() for b in batches]).cpu())
        finals.append(torch.cat([p.detach().flatten() for p in runner.lm.parameters()]).cpu())
        if runner.graph is not None:
            captured = runner.graph.captures
            failure = runner.graph.failure
    loss_err = float(((losses[0] - losses[1]).abs() / losses[1].abs()).max())
    weight_err = float((finals[0] - finals[1]).norm() / finals[1].norm())
    tol = 1e-5 if dtype == "float32" else 1e-2
    ok = captured > 0 and loss_err < tol and weight_err < tol and failure is None
    print(
        f"CUDA graph vs eager step, small, 8 steps, {dtype}: {captured} capture(s), worst loss rel. error "
        f"{loss_err:.1e}, final weights rel. error {weight_err:.1e} {'ok' if ok else 'FAIL'}"
        + (f" (capture failed: {failure})" if failure else "")
    )
    return ok


def check_export(directory: Path, device: torch.device) -> bool:
    cpu = BiLM.from_files(directory / "options.json", directory / "weights.hdf5")
    gpu = BiLM.from_files(directory / "options.json", directory / "weights.hdf5").to(device)
    ids = batch_to_ids(read_batches(DEFAULT_CORPUS, 1, 64)[0])
    with torch.inference_mode():
        want = cpu(ids).layers
        got = gpu(ids.to(device)).layers.cpu()
    err = float((got - want).abs().max())
    scale = float(want.abs().max())
    ok = err <= 1e-5
    print(
        f"exported weights, GPU vs CPU layers (float32, 64 sentences): max abs difference {err:.2e} "
        f"(values up to {scale:.2f}, relative {err / scale:.1e}) {'ok' if ok else 'FAIL'}"
    )
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself")
    parser.add_argument("--export", default="", help="a training run's export/ directory (check 3)")
    parser.add_argument("--skip-step-checks", action="store_true", help="run check 3 only")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("gpu_train_check: no CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    ok = True
    if not args.skip_step_checks:
        ok &= check_window(device)
        if device.type == "cuda":
            ok &= check_graph(device, "float32")
            ok &= check_graph(device, "bf16")
    if args.export:
        ok &= check_export(Path(args.export), device)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
