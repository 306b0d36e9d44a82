"""Checks of pipeline/train/adagrad_kernel.py run under TRITON_INTERPRET=1 (a subprocess of
test_optimization.py): Triton reads the interpreter flag when the kernel is defined."""

from __future__ import annotations

import torch

from pipeline.train.config import OptimizerConfig
from pipeline.train.optimization import Adagrad, apply_update, build_optimizer


def check_against_torch() -> None:
    """The kernel's step (Adagrad.step's CUDA branch) against torch's fused CPU Adagrad: clipping
    divisor, odd sizes past one block, a skipped step."""
    cfg = OptimizerConfig()
    torch.manual_seed(0)
    shapes = [(3, 5), (2500,), (7, 300)]
    mine = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in mine]
    opt = build_optimizer(cfg, mine, torch.device("cpu"))
    assert isinstance(opt, Adagrad)
    reference = torch.optim.Adagrad(theirs, lr=0.2, initial_accumulator_value=1.0, eps=1e-10, fused=True)
    for step in range(4):
        grads = [torch.randn(s) * 3 for s in shapes]
        scale = torch.tensor(1.0 + step)
        skip = torch.tensor(1.0 if step == 2 else 0.0)
        if step == 2:
            grads[0][0, 0] = float("nan")
        for p, q, g in zip(mine, theirs, grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        apply_update(opt, scale, skip)
        reference.grad_scale, reference.found_inf = scale, skip
        reference.step()
    for p, q in zip(mine, theirs, strict=True):
        err = (p - q).abs().max().item()
        assert err < 1e-6, err
        assert torch.allclose(opt.state[p]["sum"], reference.state[q]["sum"], rtol=1e-6)
        assert float(opt.state[p]["step"]) == 3.0 == float(reference.state[q]["step"])
    print("adagrad kernel: equals torch's fused Adagrad (4 steps, one skipped)")


if __name__ == "__main__":
    check_against_torch()
    print("adagrad kernel checks passed")
