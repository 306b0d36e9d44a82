"""The elementwise half of one LSTM step as single Triton kernels, forward and backward (no autograd).

On a GPU the exact LSTM is launch-bound: a step of the unfused cell is seven small elementwise
kernels (two activations, the cell update, the clip, tanh(c), the output gate) between the two
matrix products, and at ELMo's batch sizes each of them runs for less time than it takes to
launch; its autograd backward is about twice as many. Here the forward is one pass over the gates
and the backward one more, so a training step of one layer is three launches forward (recurrent
product, cell, projection) plus the projection clip, and about as many backward.

The arithmetic is the TF LSTMCell of docs/model.md#lstm-cell in float32 whatever the gate dtype (bf16 under
autocast): c = sigmoid(f) * c_prev + sigmoid(i) * tanh(j), clipped; m = sigmoid(o) * tanh(c).
The backward kernel recomputes the activations from the saved pre-activation gates instead of
storing five more tensors per step. `TRITON_INTERPRET=1` runs both kernels on CPU tensors, which is
how the tests check them without a GPU. This module needs Triton; `elmo_model.lstm.fused_cell_for`
decides when to import and use it.
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


@triton.jit
def _program_cells(rows, dim, BLOCK: tl.constexpr):
    """This program's (direction, row) and its block of BLOCK cells: one program per (direction,
    row) and block. Offsets are 64-bit: a window's gates pass 2**31 elements at large batches."""
    pid = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    return (pid // rows).to(tl.int64), (pid % rows).to(tl.int64), cols, cols < dim


@triton.jit
def _activations(g, dim, cols, inside):
    """sigmoid(i), sigmoid(f), sigmoid(o), tanh(j) in float32 from one row's gates at ``g``."""
    i = tl.sigmoid(tl.load(g + cols, mask=inside, other=0.0).to(tl.float32))
    f = tl.sigmoid(tl.load(g + dim + cols, mask=inside, other=0.0).to(tl.float32))
    o = tl.sigmoid(tl.load(g + 2 * dim + cols, mask=inside, other=0.0).to(tl.float32))
    j = _tanh(tl.load(g + 3 * dim + cols, mask=inside, other=0.0).to(tl.float32))
    return i, f, o, j


# Triton compiles a variant per divisibility class of each integer argument (multiple of 16,
# equal to 1, other). The running row count changes class from step to step, so it is not
# specialised; dim and the strides keep theirs (fixed per model), which lets loads vectorise.
@triton.jit(do_not_specialize=["rows"])
def _cell_forward_kernel(
    gates_ptr,
    c_in_ptr,
    c_out_ptr,
    m_ptr,
    rows,
    dim,
    g_dir,
    g_row,
    ci_dir,
    ci_row,
    co_dir,
    co_row,
    m_dir,
    m_row,
    cell_clip,
    HAS_CLIP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    direction, row, cols, inside = _program_cells(rows, dim, BLOCK)
    i, f, o, j = _activations(gates_ptr + direction * g_dir + row * g_row, dim, cols, inside)
    c_prev = tl.load(c_in_ptr + direction * ci_dir + row * ci_row + cols, mask=inside, other=0.0)
    c = c_prev * f + i * j
    if HAS_CLIP:
        c = tl.minimum(tl.maximum(c, -cell_clip), cell_clip)
    tl.store(c_out_ptr + direction * co_dir + row * co_row + cols, c, mask=inside)
    tl.store(
        m_ptr + direction * m_dir + row * m_row + cols, (o * _tanh(c)).to(m_ptr.dtype.element_ty), mask=inside
    )


@triton.jit(do_not_specialize=["rows"])
def _cell_backward_kernel(
    gates_ptr,
    c_prev_ptr,
    dc_ptr,
    dm_ptr,
    dgates_ptr,
    dc_prev_ptr,
    rows,
    dim,
    g_dir,
    g_row,
    cp_dir,
    cp_row,
    dc_dir,
    dc_row,
    dm_dir,
    dm_row,
    dg_dir,
    dg_row,
    dcp_dir,
    dcp_row,
    cell_clip,
    HAS_CLIP: tl.constexpr,
    HAS_DC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    direction, row, cols, inside = _program_cells(rows, dim, BLOCK)
    i, f, o, j = _activations(gates_ptr + direction * g_dir + row * g_row, dim, cols, inside)
    c_prev = tl.load(c_prev_ptr + direction * cp_dir + row * cp_row + cols, mask=inside, other=0.0)
    c_raw = c_prev * f + i * j  # the same expression as the forward kernel: the same bits
    c = c_raw
    if HAS_CLIP:
        c = tl.minimum(tl.maximum(c_raw, -cell_clip), cell_clip)
    tc = _tanh(c)
    dm = tl.load(dm_ptr + direction * dm_dir + row * dm_row + cols, mask=inside, other=0.0).to(tl.float32)
    dc = dm * o * (1.0 - tc * tc)
    if HAS_DC:
        dc += tl.load(dc_ptr + direction * dc_dir + row * dc_row + cols, mask=inside, other=0.0)
    if HAS_CLIP:
        # clamp passes the gradient where -clip <= c_raw <= clip (torch.clamp's rule)
        dc = tl.where((c_raw >= -cell_clip) & (c_raw <= cell_clip), dc, 0.0)
    tl.store(dc_prev_ptr + direction * dcp_dir + row * dcp_row + cols, dc * f, mask=inside)
    out = dgates_ptr + direction * dg_dir + row * dg_row
    kind = dgates_ptr.dtype.element_ty
    tl.store(out + cols, (dc * j * i * (1.0 - i)).to(kind), mask=inside)
    tl.store(out + dim + cols, (dc * c_prev * f * (1.0 - f)).to(kind), mask=inside)
    tl.store(out + 2 * dim + cols, (dm * tc * o * (1.0 - o)).to(kind), mask=inside)
    tl.store(out + 3 * dim + cols, (dc * i * (1.0 - j * j)).to(kind), mask=inside)


def _check_rows(name: str, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(x.shape) != shape or x.stride(-1) != 1:
        raise ValueError(
            f"fused cell: {name} has shape {tuple(x.shape)}, expected {shape} with contiguous rows"
        )


def _row_strides(*tensors: torch.Tensor) -> list[int]:
    """Each tensor's direction and row strides, in order (the kernels' stride arguments)."""
    return [stride for t in tensors for stride in (t.stride(0), t.stride(1))]


def _grid(directions: int, rows: int, dim: int) -> tuple[tuple[int, int], int]:
    block = min(1024, triton.next_power_of_2(dim))
    return (directions * rows, triton.cdiv(dim, block)), block


def cell_forward(
    gates: torch.Tensor,
    c_in: torch.Tensor,
    c_out: torch.Tensor,
    m_out: torch.Tensor,
    cell_clip: float | None,
) -> None:
    """gates (D, k, 4C) pre-activations (i, f, o, j), c_in (D, k, C) float32 -> writes c_out (D, k, C)
    float32 (clipped) and m_out = sigmoid(o) * tanh(c) (D, k, C) in its own dtype.

    Rows may be strided (slices of larger buffers) but each row's cells must be contiguous. c_out may
    be c_in and m_out the gates' j block (the in-place form of the inference path).
    """
    directions, rows, four_dim = gates.shape
    dim = four_dim // 4
    for name, x in (("gates", gates), ("c_in", c_in), ("c_out", c_out), ("m_out", m_out)):
        _check_rows(name, x, (directions, rows, four_dim if name == "gates" else dim))
    if c_in.dtype != torch.float32 or c_out.dtype != torch.float32:
        raise ValueError(f"fused cell: the cell state must be float32, got {c_in.dtype} / {c_out.dtype}")
    if not rows:
        return
    grid, block = _grid(directions, rows, dim)
    _cell_forward_kernel[grid](
        gates,
        c_in,
        c_out,
        m_out,
        rows,
        dim,
        *_row_strides(gates, c_in, c_out, m_out),
        float(cell_clip) if cell_clip is not None else 0.0,
        HAS_CLIP=cell_clip is not None,
        BLOCK=block,
    )


def cell_backward(
    gates: torch.Tensor,
    c_prev: torch.Tensor,
    dc: torch.Tensor | None,
    dm: torch.Tensor,
    dgates: torch.Tensor,
    dc_prev: torch.Tensor,
    cell_clip: float | None,
) -> None:
    """Gradients of one `cell_forward` step: gates (D, k, 4C) and c_prev (D, k, C) as the forward read
    them, dc (D, k, C) float32 the gradient of its c_out (None = zeros), dm (D, k, C) that of m_out ->
    writes dgates (D, k, 4C) (its own dtype) and dc_prev (D, k, C) float32, which may be dc itself.
    """
    directions, rows, four_dim = gates.shape
    dim = four_dim // 4
    shapes = {"gates": four_dim, "c_prev": dim, "dm": dim, "dgates": four_dim, "dc_prev": dim}
    tensors = {"gates": gates, "c_prev": c_prev, "dm": dm, "dgates": dgates, "dc_prev": dc_prev}
    if dc is not None:
        shapes["dc"], tensors["dc"] = dim, dc
    for name, x in tensors.items():
        _check_rows(name, x, (directions, rows, shapes[name]))
    if c_prev.dtype != torch.float32 or dc_prev.dtype != torch.float32:
        raise ValueError("fused cell: the cell state and its gradient must be float32")
    if not rows:
        return
    dc_arg = dc if dc is not None else dc_prev  # never read without HAS_DC
    grid, block = _grid(directions, rows, dim)
    _cell_backward_kernel[grid](
        gates,
        c_prev,
        dc_arg,
        dm,
        dgates,
        dc_prev,
        rows,
        dim,
        *_row_strides(gates, c_prev, dc_arg, dm, dgates, dc_prev),
        float(cell_clip) if cell_clip is not None else 0.0,
        HAS_CLIP=cell_clip is not None,
        HAS_DC=dc is not None,
        BLOCK=block,
    )


def fused_cell_step(gates: torch.Tensor, c: torch.Tensor, cell_clip: float | None) -> torch.Tensor:
    """The inference path's in-place step: gates (2, k, 4C) pre-activations (i, f, o, j), c (2, k, C)
    float32, both updated in place.

    Returns m = sigmoid(o) * tanh(c), a (2, k, C) view of the gates' last block (their dtype), which
    the caller projects. Rows within a direction may be strided (slices of larger buffers) but each
    row's cells must be contiguous.
    """
    directions, rows, four_dim = gates.shape
    dim = four_dim // 4
    if c.shape != (directions, rows, dim) or gates.stride(-1) != 1 or c.stride(-1) != 1:
        raise ValueError(f"fused cell: gates {tuple(gates.shape)} and c {tuple(c.shape)} do not match")
    m = gates[..., 3 * dim :]
    cell_forward(gates, c, c, m, cell_clip)
    return m
