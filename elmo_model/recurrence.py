"""One fused LSTM layer over a whole training window as a single autograd op (docs/model.md#lstm-cell, docs/training.md#network-in-training).

Training windows have no padding (every row holds U real tokens), so a layer is: the input
products of all steps at once, then U recurrent steps, each a recurrent product, the elementwise
cell and the clipped projection, for both directions in one batched product. Differentiating that
loop step by step with autograd costs three things this op avoids:

- each step's weight gradients would be a separate small product (a reduction over the B rows of
  one step) whose results autograd sums one by one (in bf16 under autocast); here the backward loop
  only carries the recurrent gradient, and the weight gradients are one product each over all
  U x B rows at the end;
- the elementwise cell's autograd graph (sigmoid, tanh, products, clamp, and their gradients) is
  about twenty launches per step; on CUDA it is one Triton kernel forward and one backward
  (``elmo_model.fused_cell``), on CPU the torch operations below;
- slicing each step out of the input products would give every step's gradient a zero tensor of
  the whole window's size; here each step writes its rows of one gradient buffer.

Shapes: D = 2 directions, B rows, U steps, I input size, C cell size, P projection size. Tensors
are laid out (D, B, U, .) like the model's inputs and outputs; step t is the strided slice
[:, :, t], which batched products and the kernels read in place.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def _cell_forward_torch(
    gates: torch.Tensor, c_prev: torch.Tensor, cell_clip: float | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """gates (D, B, 4C) pre-activations (i, f, o, j), overwritten with their activations; c_prev
    (D, B, C) float32 -> (c (D, B, C) clipped, m (D, B, C), tanh(c), clip mask or None)."""
    dim = c_prev.shape[-1]
    gates[..., : 3 * dim].sigmoid_()
    gates[..., 3 * dim :].tanh_()
    i, f, o, j = gates.split(dim, dim=-1)
    c = torch.addcmul(f * c_prev, i, j)
    mask = None
    if cell_clip is not None:
        mask = (c >= -cell_clip) & (c <= cell_clip)
        c = c.clamp_(-cell_clip, cell_clip)
    tc = torch.tanh(c)
    return c, o * tc, tc, mask


def _cell_backward_torch(
    act: torch.Tensor,
    c_prev: torch.Tensor,
    tc: torch.Tensor,
    mask: torch.Tensor | None,
    dc: torch.Tensor | None,
    dm: torch.Tensor,
    dgates: torch.Tensor,
) -> torch.Tensor:
    """Gradients of `_cell_forward_torch` from its saved activations ``act`` (D, B, 4C): writes dgates
    (D, B, 4C) and returns dc_prev (D, B, C)."""
    i, f, o, j = act.split(c_prev.shape[-1], dim=-1)
    dgi, dgf, dgo, dgj = dgates.split(c_prev.shape[-1], dim=-1)
    dm = dm.to(tc.dtype)
    d_c = dm * o * (1.0 - tc * tc)
    if dc is not None:
        d_c += dc
    if mask is not None:
        d_c *= mask
    torch.mul(d_c * j, i * (1.0 - i), out=dgi)
    torch.mul(d_c * c_prev, f * (1.0 - f), out=dgf)
    torch.mul(dm * tc, o * (1.0 - o), out=dgo)
    torch.mul(d_c * i, 1.0 - j * j, out=dgj)
    return d_c * f


class _LayerWindow(torch.autograd.Function):
    """See `layer_window`. Inputs and weights are cast to the compute ``dtype`` here (their
    gradients leave in their own dtypes); c0 is float32."""

    @staticmethod
    def forward(ctx, x, h0, c0, w_ih, w_hh, bias, w_p, cell_clip, proj_clip, kernels, dtype):
        ctx.weight_dtype = w_hh.dtype
        x, h0, w_ih, w_hh, bias, w_p = (t.to(dtype) for t in (x, h0, w_ih, w_hh, bias, w_p))
        directions, batch, steps, _ = x.shape
        dim, proj = w_p.shape[1], w_p.shape[2]
        # all steps' input products at once; each step then adds its recurrent product in place
        gates = torch.baddbmm(bias.unsqueeze(1), x.reshape(directions, batch * steps, -1), w_ih)
        gates = gates.view(directions, batch, steps, 4 * dim)
        cs = c0.new_empty(directions, batch, steps + 1, dim)  # c before step t at [:, :, t]
        cs[:, :, 0] = c0
        m = x.new_empty(directions, batch, steps, dim)
        out = x.new_empty(directions, batch, steps, proj)
        h_raw = x.new_empty(directions, batch, steps, proj) if proj_clip is not None else out
        tcs = masks = None
        if not kernels:
            tcs = torch.empty_like(cs[:, :, 1:])
            masks = torch.empty_like(cs[:, :, 1:], dtype=torch.bool) if cell_clip is not None else None
        h = h0
        for t in range(steps):
            g = gates[:, :, t]
            g.baddbmm_(h, w_hh)
            if kernels:
                from elmo_model.fused_cell import cell_forward

                cell_forward(g, cs[:, :, t], cs[:, :, t + 1], m[:, :, t], cell_clip)
            else:
                c, m_t, tc, mask = _cell_forward_torch(g, cs[:, :, t], cell_clip)
                cs[:, :, t + 1], m[:, :, t], tcs[:, :, t] = c, m_t, tc
                if mask is not None:
                    masks[:, :, t] = mask
            torch.bmm(m[:, :, t], w_p, out=h_raw[:, :, t])
            if proj_clip is not None:
                torch.clamp(h_raw[:, :, t], -proj_clip, proj_clip, out=out[:, :, t])
            h = out[:, :, t]
        ctx.save_for_backward(x, h0, w_ih, w_hh, w_p, gates, cs, m, out, h_raw, tcs, masks)
        ctx.clips, ctx.kernels = (cell_clip, proj_clip), kernels
        return out, cs[:, :, steps].clone(), out[:, :, steps - 1].clone()

    @staticmethod
    def backward(ctx, d_out, d_c_last, d_h_last):
        x, h0, w_ih, w_hh, w_p, gates, cs, m, out, h_raw, tcs, masks = ctx.saved_tensors
        cell_clip, proj_clip = ctx.clips
        directions, batch, steps, _ = x.shape
        dim = w_p.shape[1]
        dtype = out.dtype
        d_out = torch.zeros_like(out) if d_out is None else d_out.to(dtype)
        d_gates = torch.empty_like(gates)
        d_h_raw = torch.empty_like(out)  # the projection's output gradient at every step
        d_m = torch.empty(directions, batch, dim, dtype=dtype, device=x.device)
        d_c = None if d_c_last is None else d_c_last.to(cs.dtype, copy=True)
        d_h = None if d_h_last is None else d_h_last.to(dtype)
        w_hh_t, w_p_t = w_hh.transpose(1, 2), w_p.transpose(1, 2)
        for t in reversed(range(steps)):
            dh_t = d_h_raw[:, :, t]
            if d_h is None:
                dh_t.copy_(d_out[:, :, t])
            else:
                torch.add(d_out[:, :, t], d_h, out=dh_t)
            if proj_clip is not None:
                raw = h_raw[:, :, t]
                dh_t.mul_((raw >= -proj_clip) & (raw <= proj_clip))
            torch.bmm(dh_t, w_p_t, out=d_m)
            if ctx.kernels:
                from elmo_model.fused_cell import cell_backward

                d_c_prev = d_c if d_c is not None else cs.new_empty(directions, batch, dim)
                cell_backward(gates[:, :, t], cs[:, :, t], d_c, d_m, d_gates[:, :, t], d_c_prev, cell_clip)
                d_c = d_c_prev
            else:
                mask = masks[:, :, t] if masks is not None else None
                d_c = _cell_backward_torch(
                    gates[:, :, t], cs[:, :, t], tcs[:, :, t], mask, d_c, d_m, d_gates[:, :, t]
                )
            d_h = torch.bmm(d_gates[:, :, t], w_hh_t)
        rows = batch * steps
        flat_gates = d_gates.view(directions, rows, -1)
        h_prev = torch.cat([h0.unsqueeze(2), out[:, :, :-1]], dim=2).view(directions, rows, -1)
        d_x = torch.bmm(flat_gates, w_ih.transpose(1, 2)).view_as(x)
        d_w_ih = torch.bmm(x.reshape(directions, rows, -1).transpose(1, 2), flat_gates)
        d_w_hh = torch.bmm(h_prev.transpose(1, 2), flat_gates)
        d_w_p = torch.bmm(m.view(directions, rows, -1).transpose(1, 2), d_h_raw.view(directions, rows, -1))
        d_bias = flat_gates.sum(dim=1, dtype=torch.promote_types(flat_gates.dtype, torch.float32))
        # weight gradients go back in the master weights' dtype (float32), each rounded once
        weights = (d.to(ctx.weight_dtype) for d in (d_w_ih, d_w_hh, d_bias, d_w_p))
        return (d_x, d_h, d_c, *weights, None, None, None, None)


def layer_window(
    x: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    bias: torch.Tensor,
    w_p: torch.Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
    kernels: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer of both directions over a padding-free window, differentiable.

    x (D, B, U, I), h0 (D, B, P), c0 (D, B, C) float32, w_ih (D, I, 4C), w_hh (D, P, 4C), bias
    (D, 4C) (forget offset included), w_p (D, C, P) -> (out (D, B, U, P) the clipped projections,
    c (D, B, C) float32 and h (D, B, P) after the last step). Under autocast the products and
    outputs are in the autocast dtype, the cell state stays float32, and the weights (float32
    masters) get float32 gradients. ``kernels``: run the cell
    as the Triton kernels (CUDA, or Triton's interpreter).
    """
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else w_hh.dtype
    kernels = kernels and w_hh.dtype == torch.float32  # the kernels keep a float32 cell state
    with torch.autocast(device, enabled=False):
        return _LayerWindow.apply(
            x, h0, c0.to(w_hh.dtype), w_ih, w_hh, bias, w_p, cell_clip, proj_clip, kernels, dtype
        )


def dropout_input(x: torch.Tensor, dropout: float) -> torch.Tensor:
    """Every layer's input gets a fresh dropout mask (DropoutWrapper(input_keep_prob); docs/training.md#network-in-training)."""
    return F.dropout(x, dropout, training=True) if dropout > 0 else x
