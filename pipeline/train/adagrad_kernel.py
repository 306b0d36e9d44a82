"""Adagrad's dense update as one Triton kernel per tensor, for CUDA (no host synchronisation).

torch's own fused Adagrad runs on CUDA only from torch 2.8 on (2.11, seen on a GPU machine here,
still refuses it), and its unfused forms read the step count on the host, which a CUDA graph
cannot capture. This kernel reads the learning rate, the clipping divisor and the skip flag from
device tensors and does the whole update in one pass: s += g^2; p -= lr * g / (sqrt(s) + eps),
with g = grad / scale, and nothing written when the skip flag is set. Rounding is IEEE
(``div_rn``, ``sqrt_rn``), as torch's kernels. ``TRITON_INTERPRET=1`` runs it on CPU tensors,
which is how the tests check it without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _adagrad_kernel(p_ptr, g_ptr, s_ptr, n, lr_ptr, scale_ptr, skip_ptr, eps, BLOCK: tl.constexpr):
    if tl.load(skip_ptr) == 0.0:
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        g = tl.div_rn(tl.load(g_ptr + offsets, mask=inside, other=0.0), tl.load(scale_ptr))
        s = tl.load(s_ptr + offsets, mask=inside, other=1.0) + g * g
        tl.store(s_ptr + offsets, s, mask=inside)
        p = tl.load(p_ptr + offsets, mask=inside, other=0.0)
        step = tl.div_rn(g, tl.sqrt_rn(s) + eps)
        tl.store(p_ptr + offsets, p - tl.load(lr_ptr) * step, mask=inside)


def adagrad_dense_(
    param: torch.Tensor,
    grad: torch.Tensor,
    state_sum: torch.Tensor,
    lr: torch.Tensor,
    eps: float,
    grad_scale: torch.Tensor,
    found_inf: torch.Tensor,
) -> None:
    """One Adagrad update of ``param`` in place (float32 tensors of one shape, contiguous); ``lr``,
    ``grad_scale`` and ``found_inf`` are 0-dim float32 tensors on the same device."""
    for name, t in (("grad", grad), ("state_sum", state_sum)):
        if t.shape != param.shape or not t.is_contiguous() or t.dtype != torch.float32:
            raise ValueError(
                f"adagrad kernel: {name} {tuple(t.shape)} {t.dtype} does not match the parameter"
            )
    if not param.is_contiguous() or param.dtype != torch.float32:
        raise ValueError("adagrad kernel: the parameter must be a contiguous float32 tensor")
    n = param.numel()
    if n:
        _adagrad_kernel[(triton.cdiv(n, BLOCK),)](
            param, grad, state_sum, n, lr, grad_scale, found_inf, float(eps), BLOCK=BLOCK
        )
