"""The elementwise half of one LSTM step as a single Triton kernel (CUDA only, no autograd).

On a GPU the exact LSTM is launch-bound: a step of the unfused cell is seven small elementwise
kernels (two activations, the cell update, the clip, tanh(c), the output gate) between the two
matrix products, and at ELMo's batch sizes each of them runs for less time than it takes to
launch. This kernel does all seven in one pass over the gates, so a step is three launches
(recurrent product, this, projection) plus the projection clip.

The arithmetic is the TF LSTMCell of spec 4.5 in float32 whatever the gate dtype (bf16 under
autocast): c = sigmoid(f) * c + sigmoid(i) * tanh(j), clipped; m = sigmoid(o) * tanh(c).
`TRITON_INTERPRET=1` runs it on CPU tensors, which is how the tests check it without a GPU.
This module needs Triton; `elmo_model.lstm.fused_cell_for` decides when to import and use it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    # From exp(-2|x|) <= 1, so it never overflows; absolute error a few float32 ulps. (libdevice's
    # tanh would be one instruction less but does not run under the CPU interpreter the tests use.)
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


# Triton compiles a variant per divisibility class of each integer argument (multiple of 16,
# equal to 1, other). The running row count changes class from step to step, so it is not
# specialised; dim and the strides keep theirs (fixed per model), which lets loads vectorise.
@triton.jit(do_not_specialize=["rows"])
def _cell_kernel(
    gates_ptr,
    c_ptr,
    rows,
    dim,
    gates_dir_stride,
    gates_row_stride,
    c_dir_stride,
    c_row_stride,
    cell_clip,
    HAS_CLIP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per (direction, row) and block of BLOCK cells.
    pid = tl.program_id(0)
    direction = pid // rows
    row = pid % rows
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < dim
    g = gates_ptr + direction * gates_dir_stride + row * gates_row_stride
    i = tl.sigmoid(tl.load(g + cols, mask=inside, other=0.0).to(tl.float32))
    f = tl.sigmoid(tl.load(g + dim + cols, mask=inside, other=0.0).to(tl.float32))
    o = tl.sigmoid(tl.load(g + 2 * dim + cols, mask=inside, other=0.0).to(tl.float32))
    j = _tanh(tl.load(g + 3 * dim + cols, mask=inside, other=0.0).to(tl.float32))
    c_at = c_ptr + direction * c_dir_stride + row * c_row_stride + cols
    c = tl.load(c_at, mask=inside, other=0.0) * f + i * j
    if HAS_CLIP:
        c = tl.minimum(tl.maximum(c, -cell_clip), cell_clip)
    tl.store(c_at, c, mask=inside)
    # m = o * tanh(c) overwrites the j block, which the projection then reads.
    tl.store(g + 3 * dim + cols, (o * _tanh(c)).to(gates_ptr.dtype.element_ty), mask=inside)


def fused_cell_step(gates: torch.Tensor, c: torch.Tensor, cell_clip: float | None) -> torch.Tensor:
    """gates (2, k, 4C) pre-activations (i, f, o, j), c (2, k, C) float32, both updated in place.

    Returns m = sigmoid(o) * tanh(c), a (2, k, C) view of the gates' last block (their dtype), which
    the caller projects. Rows within a direction may be strided (slices of larger buffers) but each
    row's cells must be contiguous.
    """
    directions, rows, four_dim = gates.shape
    dim = four_dim // 4
    if c.shape != (directions, rows, dim) or gates.stride(-1) != 1 or c.stride(-1) != 1:
        raise ValueError(f"fused cell: gates {tuple(gates.shape)} and c {tuple(c.shape)} do not match")
    if c.dtype != torch.float32:
        raise ValueError(f"fused cell: the cell state must be float32, got {c.dtype}")
    if rows:
        block = min(1024, triton.next_power_of_2(dim))
        grid = (directions * rows, triton.cdiv(dim, block))
        _cell_kernel[grid](
            gates,
            c,
            rows,
            dim,
            gates.stride(0),
            gates.stride(1),
            c.stride(0),
            c.stride(1),
            float(cell_clip) if cell_clip is not None else 0.0,
            HAS_CLIP=cell_clip is not None,
            BLOCK=block,
        )
    return gates[..., 3 * dim :]
