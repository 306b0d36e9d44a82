"""GPU correctness check of the exact biLM (issue 3): run on a CUDA machine before trusting GPU numbers.

1. Both reference fixture sets through the stateful procedure of docs/model.md#reference-outputs on the GPU in float32
   (TF32 off), with the fused Triton cell and without: max abs error against the fixtures.
2. bf16 autocast on the same procedure: max abs error (expected ~1e-2, reported, not a pass/fail).
3. A random `original`-size model: fused vs unfused cell, GPU vs CPU, on 64 sample sentences.

    python benchmarks/gpu_check.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "elmo_model")]

from bilm_forward import DEFAULT_CORPUS, options_for, read_batches  # noqa: E402
from elmo_reference import ReferenceSet  # noqa: E402

from elmo_model import BiLM, batch_to_ids  # noqa: E402
from elmo_model.lstm import fused_cell_for  # noqa: E402


def stateful_error(
    model: BiLM, reference: ReferenceSet, device: torch.device, bf16: bool
) -> tuple[float, bool]:
    """Max |output - fixture| over the 30 sentences of docs/model.md#reference-outputs (10 batches of 3, state carried), and
    whether every sentence passes the issue's ``allclose(atol=1e-6)`` (default rtol)."""
    model.stateful = True
    model.reset_states()
    sentences, expected = reference.sentences(), reference.expected()
    worst, close = 0.0, True
    for i in range(10):
        batch = [sentences[k][i] for k in range(3)]
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            layers = model(batch_to_ids(batch).to(device)).layers.float().cpu().numpy()
        for k in range(3):
            actual = layers[k, -1, 1 : len(batch[k]) + 1]
            worst = max(worst, float(np.abs(actual - expected[k][i]).max()))
            close &= bool(np.allclose(actual, expected[k][i], atol=1e-6))
    return worst, close


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself")
    parser.add_argument("--size", default="original", help="model size of check 3")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"{name}, torch {torch.__version__}")
    print(f"fused cell available: {fused_cell_for(torch.zeros(1, device=device)) is not None}")
    failed = False
    for name in ("bilm_tf", "allennlp"):
        reference = ReferenceSet(name)
        model = reference.load().to(device)
        for fused in (True, False):
            model.lstm.use_fused_cell = fused
            err, ok = stateful_error(model, reference, device, bf16=False)
            failed |= not ok
            print(
                f"{name:8s} float32 {'fused' if fused else 'unfused':8s} max error {err:.2e} {'ok' if ok else 'FAIL'}"
            )
        model.lstm.use_fused_cell = True
        print(
            f"{name:8s} bf16    fused    max error {stateful_error(model, reference, device, bf16=True)[0]:.2e}"
        )

    torch.manual_seed(0)
    cpu_model = BiLM.from_options(options_for(args.size)).eval()
    gpu_model = BiLM.from_options(options_for(args.size)).eval().to(device)
    gpu_model.load_state_dict(cpu_model.state_dict())
    ids = batch_to_ids(read_batches(DEFAULT_CORPUS, 1, 64)[0])
    with torch.inference_mode():
        want = cpu_model(ids).layers
        fused = gpu_model(ids.to(device)).layers.cpu()
        gpu_model.lstm.use_fused_cell = False
        plain = gpu_model(ids.to(device)).layers.cpu()
    scale = want.abs().max().item()
    print(
        f"{args.size}, 64 sentences: |fused - unfused| {((fused - plain).abs().max().item()):.2e}, "
        f"|GPU - CPU| {((fused - want).abs().max().item()):.2e} (values up to {scale:.1f})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
