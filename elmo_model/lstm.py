"""Stacked projected LSTM with cell/projection clipping, both directions fused (docs/model.md#lstm-cell, docs/training.md#network-in-training).

Shapes: D = 2 directions (0 forward, 1 backward), N layers, B rows, T steps, C cell size,
P projection size. Both directions read their own input left to right; the caller reverses the
backward stream within each row's length. Per layer the parameters of both directions are stacked
on a leading axis of size 2 so one `torch.bmm` advances both directions at once.

Gates are stored in the order (i, f, o, j) so the three sigmoid gates are one contiguous slice;
`bias` is bilm-tf's `B` (no +1 forget bias folded in: it is added at run time, as TF does, which
keeps export -> load bit exact).
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from elmo_model.distinct_rows import distinct_rows
from elmo_model.recurrence import dropout_input, layer_window

# Column blocks: internal order (i, f, o, j) <-> TF order (i, j, f, o).
TF_TO_INTERNAL = (0, 2, 3, 1)
INTERNAL_TO_TF = (0, 3, 1, 2)


def permute_gate_blocks(x: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """Reorder the 4 gate blocks of the last axis (..., 4C) -> (..., 4C); exact (no arithmetic)."""
    blocks = x.chunk(4, dim=-1)
    return torch.cat([blocks[i] for i in order], dim=-1)


@dataclass
class LSTMState:
    """Per-row recurrent state: c (N, 2, B, C) and h (N, 2, B, P), the clipped values that recur."""

    c: torch.Tensor
    h: torch.Tensor

    @classmethod
    def zeros(cls, n_layers: int, batch: int, dim: int, projection_dim: int, like: torch.Tensor) -> LSTMState:
        return cls(
            c=like.new_zeros(n_layers, 2, batch, dim),
            h=like.new_zeros(n_layers, 2, batch, projection_dim),
        )

    def detach(self) -> LSTMState:
        return LSTMState(self.c.detach(), self.h.detach())

    def index_rows(self, index: torch.Tensor) -> LSTMState:
        """Rows `index` (a LongTensor over B) of every layer and direction."""
        return LSTMState(self.c.index_select(2, index), self.h.index_select(2, index))


class FusedLSTMLayer(nn.Module):
    """One layer of both directions: w_ih (2, in, 4C), w_hh (2, P, 4C), bias (2, 4C), w_p (2, C, P)."""

    def __init__(self, input_dim: int, dim: int, projection_dim: int):
        super().__init__()
        self.input_dim, self.dim, self.projection_dim = input_dim, dim, projection_dim
        self.w_ih = nn.Parameter(torch.empty(2, input_dim, 4 * dim))
        self.w_hh = nn.Parameter(torch.empty(2, projection_dim, 4 * dim))
        self.bias = nn.Parameter(torch.empty(2, 4 * dim))
        self.w_p = nn.Parameter(torch.empty(2, dim, projection_dim))
        forget = torch.zeros(4 * dim)
        forget[dim : 2 * dim] = 1.0
        self.register_buffer("forget_offset", forget, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """TF's Glorot-uniform for the (in+P, 4C) kernel and the (C, P) projection, bias 0 (docs/training.md#initialisation)."""
        kernel_limit = math.sqrt(6.0 / (self.input_dim + self.projection_dim + 4 * self.dim))
        proj_limit = math.sqrt(6.0 / (self.dim + self.projection_dim))
        with torch.no_grad():
            nn.init.uniform_(self.w_ih, -kernel_limit, kernel_limit)
            nn.init.uniform_(self.w_hh, -kernel_limit, kernel_limit)
            nn.init.zeros_(self.bias)
            nn.init.uniform_(self.w_p, -proj_limit, proj_limit)

    def input_gates(self, x: torch.Tensor) -> torch.Tensor:
        """Input-to-gate products of every step at once: x (2, M, in) -> (2, M, 4C), biases included."""
        bias = (self.bias + self.forget_offset).unsqueeze(1)
        return torch.baddbmm(bias, x, self.w_ih)


def fused_cell_for(x: torch.Tensor) -> Callable | None:
    """`elmo_model.fused_cell.fused_cell_step` when it can run on `x`: a CUDA tensor, or any tensor
    under Triton's CPU interpreter (``TRITON_INTERPRET=1``), with Triton installed; else None.

    Imported here, on first such use: importing Triton takes a noticeable fraction of a second,
    which CPU-only processes never need to pay.
    """
    if (
        not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")
        or importlib.util.find_spec("triton") is None
    ):
        return None
    from elmo_model import fused_cell

    return fused_cell.fused_cell_step


def _clamp(x: torch.Tensor, clip: float | None, inplace: bool) -> torch.Tensor:
    if clip is None:
        return x
    return x.clamp_(-clip, clip) if inplace else x.clamp(-clip, clip)


def _cell(
    gates: torch.Tensor,
    c_prev: torch.Tensor,
    w_p: torch.Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
    h_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the TF LSTMCell (docs/model.md#lstm-cell) for both directions.

    gates (2, k, 4C) pre-activations in (i, f, o, j) order, c_prev (2, k, C) -> (c (2, k, C), h (2, k, P)).
    With `h_out` (a (2, k, P) buffer) the step runs in place: `gates` and `c_prev` are overwritten,
    h is written into `h_out`, and nothing is allocated (no autograd).
    """
    dim = c_prev.shape[-1]
    inplace = h_out is not None
    if inplace:
        sig = gates[..., : 3 * dim].sigmoid_()
        cell_input = gates[..., 3 * dim :].tanh_()
    else:
        sig = torch.sigmoid(gates[..., : 3 * dim])
        cell_input = torch.tanh(gates[..., 3 * dim :])
    i, f, o = sig.split(dim, dim=-1)
    c = c_prev.mul_(f).addcmul_(i, cell_input) if inplace else torch.addcmul(f * c_prev, i, cell_input)
    # Clip c before tanh(c); the clipped c and clipped h are what recur.
    c = _clamp(c, cell_clip, inplace)
    if inplace:
        h = torch.bmm(torch.tanh(c, out=cell_input).mul_(o), w_p, out=h_out)
    else:
        h = torch.bmm(o * torch.tanh(c), w_p)
    return c, _clamp(h, proj_clip, inplace)


class StackedBiLSTM(nn.Module):
    """N fused layers, residual for layers >= 1 when `use_skip_connections`, input dropout in training."""

    def __init__(
        self,
        n_layers: int,
        input_dim: int,
        dim: int,
        projection_dim: int,
        cell_clip: float | None,
        proj_clip: float | None,
        use_skip_connections: bool,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.n_layers, self.dim, self.projection_dim = n_layers, dim, projection_dim
        self.cell_clip, self.proj_clip = cell_clip, proj_clip
        self.use_skip_connections, self.dropout = use_skip_connections, dropout
        self.use_fused_cell = True
        """On CUDA (with Triton) the no-grad path runs each step's elementwise cell as one kernel."""
        # Reused gate buffer of the no-grad path (see _input_products); not shared across threads.
        self._workspace = torch.empty(0)
        self.layers = nn.ModuleList(
            FusedLSTMLayer(input_dim if i == 0 else projection_dim, dim, projection_dim)
            for i in range(n_layers)
        )

    def zero_state(self, batch: int) -> LSTMState:
        """Zeros in the parameters' dtype and device (float32 state even under bf16 autocast)."""
        return LSTMState.zeros(self.n_layers, batch, self.dim, self.projection_dim, self.layers[0].w_hh)

    def forward(
        self, inputs: torch.Tensor, mask: torch.Tensor, state: LSTMState | None = None
    ) -> tuple[torch.Tensor, LSTMState]:
        """inputs (2, B, T, in) [0] forward stream, [1] backward stream (already reversed per row),
        mask (B, T) bool with real positions a prefix of each row, state (N, 2, B, .) or None (zeros).

        Returns outs (N, 2, B, T, P) (residual applied, zeros at padding) and the final state: for
        each row the state after its last real step (rows of length 0 keep their initial state).
        """
        if inputs.dim() != 4 or inputs.shape[0] != 2:
            raise ValueError(f"LSTM inputs must have shape (2, B, T, in), got {tuple(inputs.shape)}")
        _, batch, steps, _ = inputs.shape
        if mask.shape != (batch, steps):
            raise ValueError(f"LSTM mask must have shape {(batch, steps)}, got {tuple(mask.shape)}")
        mask = mask.bool()
        lengths = mask.sum(dim=1)
        prefix = torch.arange(steps, device=mask.device) < lengths.unsqueeze(1)
        if not torch.equal(prefix, mask):
            raise ValueError("LSTM mask must mark a prefix of each row (padding on the right only)")
        zero_start = state is None
        if zero_start:
            state = self.zero_state(batch)
        elif state.c.shape != (self.n_layers, 2, batch, self.dim) or state.h.shape != (
            self.n_layers,
            2,
            batch,
            self.projection_dim,
        ):
            raise ValueError(
                f"LSTM state shapes c {tuple(state.c.shape)} h {tuple(state.h.shape)} do not match "
                f"(n_layers={self.n_layers}, 2, B={batch}, {self.dim} / {self.projection_dim})"
            )
        needs_grad = torch.is_grad_enabled() and (
            inputs.requires_grad or state.c.requires_grad or any(p.requires_grad for p in self.parameters())
        )
        if needs_grad:
            return self._forward_autograd(inputs, mask, lengths, state)
        return self._forward_inplace(inputs, lengths, state, zero_start)

    def forward_window(
        self, inputs: torch.Tensor, state: LSTMState, dropout: float = 0.0
    ) -> tuple[torch.Tensor, LSTMState]:
        """The training path: a padding-free window, differentiable, each layer one autograd op.

        inputs (2, B, U, in) [0] forward stream, [1] backward stream, every position real; state
        c (N, 2, B, C), h (N, 2, B, P) -> top (2, B, U, P) (the last layer, residual applied) and the
        final state. ``dropout`` hits every layer's input (docs/training.md#network-in-training); the caller passes 0 outside
        training. No host synchronisation, so a CUDA graph can capture it.
        """
        kernels = self.use_fused_cell and fused_cell_for(inputs) is not None
        x, finals_c, finals_h = inputs, [], []
        for li, layer in enumerate(self.layers):
            layer_in = dropout_input(x, dropout)
            out, c, h = layer_window(
                layer_in,
                state.h[li],
                state.c[li],
                layer.w_ih,
                layer.w_hh,
                layer.bias + layer.forget_offset,
                layer.w_p,
                self.cell_clip,
                self.proj_clip,
                kernels,
            )
            if self.use_skip_connections and li > 0:
                out = out + layer_in
            finals_c.append(c)
            finals_h.append(h)
            x = out
        return x, LSTMState(torch.stack(finals_c), torch.stack(finals_h))

    def _layer_input(self, x: torch.Tensor) -> torch.Tensor:
        return dropout_input(x, self.dropout if self.training else 0.0)

    def _workspace_view(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A (2, M, 4C)-sized view of the reused gate buffer; it only grows.

        A fresh allocation per call would cost more in page faults than the product written into it.
        """
        numel = math.prod(shape)
        ws = self._workspace
        # A buffer made under inference_mode cannot be written outside it: replace it then.
        stale = ws.is_inference() and not torch.is_inference_mode_enabled()
        if stale or ws.numel() < numel or ws.dtype != like.dtype or ws.device != like.device:
            ws = self._workspace = torch.empty(numel, dtype=like.dtype, device=like.device)
        return ws[:numel].view(shape)

    def _input_products(self, layer: FusedLSTMLayer, x: torch.Tensor) -> torch.Tensor:
        """x (2, M, in) @ w_ih -> (2, M, 4C), no bias, into the reused workspace.

        One product per direction: on CPU two torch.mm calls are much faster than one batched bmm of
        two. Under autocast `out=` would bypass the cast, so that case allocates.
        """
        if torch.is_autocast_enabled(x.device.type):
            return torch.bmm(x, layer.w_ih)
        out = self._workspace_view((2, x.shape[1], 4 * layer.dim), x)
        for d in range(2):
            torch.mm(x[d], layer.w_ih[d], out=out[d])
        return out

    def _distinct_input_products(
        self, layer: FusedLSTMLayer, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Input products of the distinct rows of x (2, M, in), when rows repeat enough to pay.

        Returns (products (2U, 4C), index (2, M)) with row index[d, m] of products = x[d, m] @ w_ih[d]
        (no bias), or None. Layer 0's inputs are token vectors, and running text repeats tokens a
        lot: 128 sentences of the sample corpus hold 17-20% distinct tokens per batch of 64, so
        this skips about four fifths of the first layer's input products. Each row's product is the
        same dot products either way, so outputs do not change.
        """
        rows, inverse = distinct_rows(x.reshape(-1, x.shape[-1]))
        if rows.shape[0] > x.shape[1] // 2:
            return None
        products = torch.cat([torch.mm(rows, layer.w_ih[d]) for d in range(2)])  # (2U, 4C)
        offsets = torch.tensor([[0], [rows.shape[0]]], device=x.device)
        return products, inverse.view(2, -1) + offsets

    SPLIT_ROWS = 32
    """CPU: once fewer rows than this are still running, each direction finishes its steps alone."""

    def _gate_inputs(
        self, layer: FusedLSTMLayer, layer_in: torch.Tensor, first: bool
    ) -> tuple[torch.Tensor | None, tuple[torch.Tensor, torch.Tensor] | None]:
        """The input side of every step's gates, ``(xg, distinct)``: xg (2, M, 4C) the input
        products, each step's block of which becomes its gates; or, on CPU for layer 0, xg None and
        ``distinct`` = (the distinct rows' products, each packed row's index into them)."""
        # Layer 0 reads token vectors, which repeat (unless dropout has just made them differ).
        dropping = self.training and self.dropout > 0
        distinct = self._distinct_input_products(layer, layer_in) if first and not dropping else None
        if distinct is None:
            return self._input_products(layer, layer_in), None
        if not layer_in.is_cuda:
            return None, distinct
        products, index = distinct
        rows = layer_in.shape[1]
        xg = self._workspace_view((2 * rows, 4 * layer.dim), products)
        return torch.index_select(products, 0, index.view(-1), out=xg).view(2, rows, -1), None

    def _steps_together(self, active: list[int], dense: bool) -> int:
        """The steps both directions run together; each runs the rest alone.

        CPU: with few rows left a step is bound by reading the weights (W_hh and W_p of both
        directions: 80 MB at original size), which do not stay in cache from step to step; one
        direction's 40 MB do. So once fewer than SPLIT_ROWS rows are running, each direction runs
        its remaining steps alone. Original size, 2 threads, ms per step of both directions:
        k = 8: 4.41 together, 3.04 apart; k = 16: 5.82, 4.34; k = 32: 6.99, 6.95; k = 64: 9.60, 11.44.
        """
        if not dense:
            return len(active)
        return next((t for t, k in enumerate(active) if k < self.SPLIT_ROWS), len(active))

    def _run_layer(
        self,
        layer: FusedLSTMLayer,
        layer_in: torch.Tensor,
        h_init: torch.Tensor,
        c: torch.Tensor,
        starts: list[int],
        active: list[int],
        first: bool,
        zero_start: bool = False,
    ) -> torch.Tensor:
        """One layer over the packed layout of `_forward_inplace`.

        layer_in (2, M, in), h_init (2, B, P) the sorted rows' initial h, c (2, B, C) their initial
        c, updated in place to each row's final c -> packed [h | 1] (2, M, P + 1). `zero_start`: h_init
        is known to be zeros (a stateless call), so step 0 needs no recurrent product.
        """
        rows, dim, p = layer_in.shape[1], layer.dim, self.projection_dim
        dense = not layer_in.is_cuda
        xg, distinct = self._gate_inputs(layer, layer_in, first)
        dtype = (xg if distinct is None else distinct[0]).dtype  # bf16 under autocast
        bias = (layer.bias + layer.forget_offset).unsqueeze(1).to(dtype)  # (2, 1, 4C)
        w_p = layer.w_p.to(dtype)
        out = layer_in.new_empty(2, rows, p + 1, dtype=dtype)  # packed [h | 1]
        out[..., p] = 1.0
        h0 = torch.cat([h_init, h_init.new_ones(2, h_init.shape[1], 1)], dim=-1).to(dtype)
        fused = fused_cell_for(layer_in) if self.use_fused_cell and c.dtype == torch.float32 else None
        if dense:
            # CPU: MKL's batched products run faster into dense blocks than into slices of the
            # packed buffers (directions M rows apart): at k = 64 rows, original size, 2 threads,
            # the recurrent product went from 245 to 295 GFLOP/s and the projection from 273 to
            # 346, copies included. So each step's gates are first xg's block plus the bias (or the
            # distinct rows' biased products, gathered) in a dense buffer, and h goes through one too.
            w_hh = layer.w_hh.to(dtype)  # (2, P, 4C)
            batch = h_init.shape[1]
            gates_buffer = layer_in.new_empty(2 * batch * 4 * dim, dtype=dtype)
            h_buffer = layer_in.new_empty(2 * batch * p, dtype=dtype)
            if distinct is not None:
                products, index = distinct
                products.view(2, -1, 4 * dim).add_(bias)
        else:
            # GPU: cuBLAS takes the strided slices as they are, and every extra op is a launch per
            # step, so the bias rides in the recurrent product as an extra row of w_hh against
            # the constant-1 column of h, and gates are computed in place in xg.
            w_hh = torch.cat([layer.w_hh.to(dtype), bias], dim=1)  # (2, P + 1, 4C)

        def advance(d: slice, t: int) -> None:
            """Step t of the directions d (slice(0, 2) both, slice(i, i + 1) one)."""
            start, k, n = starts[t], active[t], d.stop - d.start
            h_prev = h0[d, :k] if t == 0 else out[d, starts[t - 1] : starts[t - 1] + k]
            h_out = out[d, start : start + k, :p]
            if dense:
                gates = gates_buffer[: n * k * 4 * dim].view(n, k, -1)
                if distinct is not None:
                    step_index = index[d, start : start + k].reshape(-1)
                    torch.index_select(products, 0, step_index, out=gates.view(n * k, -1))
                else:
                    torch.add(xg[d, start : start + k], bias[d], out=gates)
                if t > 0 or not zero_start:
                    gates.baddbmm_(h_prev[..., :p], w_hh[d])
                h_step = h_buffer[: n * k * p].view(n, k, p)
            else:
                gates, h_step = xg[d, start : start + k].baddbmm_(h_prev, w_hh[d]), h_out
            if fused is not None:
                h = torch.bmm(fused(gates, c[d, :k], self.cell_clip), w_p[d], out=h_step)
                _clamp(h, self.proj_clip, True)
            else:
                _cell(gates, c[d, :k], w_p[d], self.cell_clip, self.proj_clip, h_out=h_step)
            if h_step is not h_out:
                h_out.copy_(h_step)

        together = self._steps_together(active, dense)
        for t in range(together):
            advance(slice(0, 2), t)
        for d in (slice(0, 1), slice(1, 2)):
            for t in range(together, len(active)):
                advance(d, t)
        return out

    def _forward_inplace(
        self, inputs: torch.Tensor, lengths: torch.Tensor, state: LSTMState, zero_start: bool = False
    ) -> tuple[torch.Tensor, LSTMState]:
        """No-autograd path over a packed layout (like PackedSequence).

        Rows are sorted by decreasing length and the real positions laid out time-major: step t owns
        the packed rows [offset_t, offset_t + k_t), where k_t rows are still running. Padding costs
        nothing, every step's gates and outputs are contiguous blocks, and the k_t rows running at t
        are the first k_t rows of step t - 1, whose outputs are their recurrent h.
        """
        _, batch, steps, _ = inputs.shape
        order = torch.argsort(lengths, descending=True, stable=True)
        sorted_lengths = lengths[order]
        run = int(sorted_lengths[0]) if batch else 0
        real = torch.arange(run, device=lengths.device).unsqueeze(1) < sorted_lengths.unsqueeze(0)  # (run, B)
        t_index, b_index = real.nonzero(as_tuple=True)  # packed row -> (step, sorted row)
        active = real.sum(1)
        offsets = torch.cumsum(active, 0) - active
        active, starts = active.tolist(), offsets.tolist()  # the call's only host syncs
        # Packed row of each (sorted) row's last real step; rows of length 0 point anywhere and are masked.
        last = offsets[(sorted_lengths - 1).clamp(min=0)] + torch.arange(batch, device=lengths.device)
        finished = (sorted_lengths > 0).view(1, batch, 1)

        rows_of = order[b_index]  # packed row -> original row
        x = inputs[:, rows_of, t_index]  # (2, M, in)
        work = state.index_rows(order)
        c_all, h_all = work.c.clone(), work.h.clone()
        p = self.projection_dim
        outs = None  # (N, 2, B, T, P), in the layers' output dtype (bf16 under autocast)
        for li, layer in enumerate(self.layers):
            layer_in = self._layer_input(x)
            out = self._run_layer(
                layer, layer_in, h_all[li], c_all[li], starts, active, first=li == 0, zero_start=zero_start
            )
            y = out[..., :p]
            h_all[li] = torch.where(finished, y[:, last], h_all[li])
            if self.use_skip_connections and li > 0:
                y.add_(layer_in)
            if outs is None:
                outs = y.new_zeros(self.n_layers, 2, batch, steps, p)
            outs[li][:, rows_of, t_index] = y
            x = y
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(batch, device=order.device)
        return outs, LSTMState(c_all, h_all).index_rows(inverse)

    def _forward_autograd(
        self, inputs: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor, state: LSTMState
    ) -> tuple[torch.Tensor, LSTMState]:
        """Differentiable path: state updates of finished rows are masked out with torch.where."""
        _, batch, steps, _ = inputs.shape
        run = int(lengths.max()) if batch else 0
        valid = mask.t().unsqueeze(-1)  # (T, B, 1)
        full = mask.all(dim=0).tolist()
        x = inputs.transpose(1, 2)  # (2, T, B, in)
        layer_outs, finals_c, finals_h = [], [], []
        for li, layer in enumerate(self.layers):
            layer_in = self._layer_input(x)
            xg = layer.input_gates(layer_in.reshape(2, steps * batch, -1)).view(2, steps, batch, -1)
            c, h = state.c[li], state.h[li]
            step_outs = []
            for t in range(run):
                gates = torch.baddbmm(xg[:, t], h, layer.w_hh)
                c_new, h_new = _cell(gates, c, layer.w_p, self.cell_clip, self.proj_clip)
                if full[t]:
                    c, h = c_new, h_new
                    step_outs.append(h_new)
                else:
                    c = torch.where(valid[t], c_new, c)
                    h = torch.where(valid[t], h_new, h)
                    step_outs.append(h_new * valid[t])
            out = (
                torch.stack(step_outs, dim=1) if step_outs else x.new_zeros(2, 0, batch, self.projection_dim)
            )
            if run < steps:
                out = F.pad(out, (0, 0, 0, 0, 0, steps - run))
            if self.use_skip_connections and li > 0:
                out = out + layer_in * valid
            layer_outs.append(out)
            finals_c.append(c)
            finals_h.append(h)
            x = out
        outs = torch.stack(layer_outs).transpose(2, 3)
        return outs, LSTMState(torch.stack(finals_c), torch.stack(finals_h))
