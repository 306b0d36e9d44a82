"""Stateless inference at fixed shapes: the biLM's forward as a few static passes (docs/model.md#static-shape-inference).

A pass takes a ``StaticBatch`` (R rows x T steps, padding at the end of each row) and runs the
model forward-only over the whole padded window. Padding sits after every row's real positions in
both streams (the backward stream is reversed within each row's length), so a real position only
ever reads real positions before it: its vectors are the same whatever padding, batch mates or
bucket it ran with. The final state is not (padding steps ran after it), which is why stateful
embedding stays on ``BiLM.forward``.

The layout is time-major, (2, T, R, .), so every step's gates, state and outputs are contiguous
blocks:
- the char CNN runs once per distinct spelling (K rows), and layer 0's input products once per
  distinct token vector, gathered to every position;
- the other layers' input products of all T x R positions are one product per direction;
- each step is one batched recurrent product of both directions, the elementwise cell (the Triton
  kernel on CUDA, in-place torch operations elsewhere) and the clipped projection, written in place;
- on CUDA each (R, T, K) shape is captured once as a CUDA graph and replayed (inputs copied into
  fixed buffers; the graphs share one memory pool and their warm-ups one stream, as they never
  run at once); a pass's inputs travel from pinned host memory on a load stream, so the next
  pass's copy overlaps this one.

``precision``: ``float32`` (exact: the reference fixtures within 1e-6), ``tf32`` (TF32 products on
CUDA; on a CPU the same as float32) or ``bf16`` (products in bfloat16, the cell state and the output
layers' arithmetic in float32). The stored dtype of the vectors is a separate choice (``OutputSpec``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from elmo_model.bilm import BiLM
from elmo_model.cuda_graph import GraphedStep
from elmo_model.lstm import fused_cell_for
from elmo_model.precision import PRECISIONS
from elmo_model.static_batches import BOUNDARIES, StaticBatch

LAYER_MODES = ("all", "top", "average")
GRAPH_WARMUP = 2
"""Eager passes of a shape before it is captured (kernels compiled, cuBLAS warmed)."""


@dataclass(frozen=True)
class OutputSpec:
    """What a pass returns. ``layers``: ``all`` (N+1 layers), ``top`` (layer N) or ``average``
    (mean of the N+1); ``pool``: the mean over the sentence's tokens (boundaries excluded) instead
    of every token; ``dtype``: the returned dtype (computed in float32)."""

    layers: str = "all"
    pool: bool = False
    dtype: torch.dtype = torch.float32

    def __post_init__(self):
        if self.layers not in LAYER_MODES:
            raise ValueError(f"layers must be one of {LAYER_MODES}, got {self.layers!r}")

    def shape(self, rows: int, steps: int, num_layers: int, width: int) -> tuple[int, ...]:
        """The output of an (R, T) pass, in the form it is stored (``StaticBatch.output_rows``
        of its leading rows are real): pooled (R, [L,] 2P), a row per sentence; else
        (R * (T - 2), [L,] 2P), the real tokens of row 0, then row 1, ..., each row's in order, no
        boundaries, no padding (the packed layout's form: tokens first). The layer axis only for
        ``all``."""
        layer = (num_layers,) if self.layers == "all" else ()
        lead = rows if self.pool else rows * (steps - BOUNDARIES)
        return (lead, *layer, width)


def device_bytes_per_position(
    cell_dim: int, projection_dim: int, num_layers: int, precision: str, output: OutputSpec
) -> int:
    """Device memory of one (row, step) position of a pass, roughly, counted from the buffers
    ``StaticInference.forward`` holds at its peak: two layers' input products (2 directions x 4C in
    the compute dtype: the previous layer's are freed only once the next are made), every layer's
    outputs (2 x P), the float32 layers being assembled (two copies of N+1 x 2P for ``all``, one
    2P otherwise) and the output in its dtype; plus the index arrays. For sizing passes to a
    device's memory (``pipeline/embed/pass_size.py``), not for accounting."""
    compute = 2 if precision == "bf16" else 4
    out_bytes = torch.empty(0, dtype=output.dtype).element_size()
    width, layers = 2 * projection_dim, num_layers + 1
    products = 2 * (2 * 4 * cell_dim * compute)
    hidden = num_layers * 2 * projection_dim * compute
    kept = layers if output.layers == "all" else 1
    assembled = 2 * layers * width * 4 + kept * width * out_bytes
    return products + hidden + assembled + 64


@contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class StaticInference:
    """``bilm`` (stateless, eval) run over ``StaticBatch`` passes; ``__call__`` returns the pass's
    output on the model's device (``OutputSpec.shape``: already compacted to the real tokens, or
    pooled, in the stored dtype), without synchronising.

    ``graphs``: capture each shape as a CUDA graph (default: on CUDA). The returned tensor of a
    graphed shape is that graph's output buffer: the next pass of the same shape overwrites it, so
    a caller copies it out first (``pipeline/embed`` copies it on another stream).
    """

    def __init__(
        self, bilm: BiLM, output: OutputSpec, precision: str = "float32", graphs: bool | None = None
    ):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if bilm.stateful:
            raise ValueError("static-shape inference is stateless; use BiLM.forward for stateful runs")
        self.bilm, self.output, self.precision = bilm.eval(), output, precision
        self.device = next(bilm.parameters()).device
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        if self.graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.compute_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self._weights = self._cast_weights()
        self._graphed: dict[tuple[int, int, int], _GraphedShape] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self._load_stream = torch.cuda.Stream(self.device) if self.graphs else None
        # every shape warms up on this one stream, so each reuses the memory of those before it
        self._warmup_stream = torch.cuda.Stream(self.device) if self.graphs else None

    def _cast_weights(self) -> list[tuple[torch.Tensor, ...]]:
        """Per layer (w_ih, w_hh, bias, w_p) in the compute dtype, made once."""
        dtype = self.compute_dtype
        return [
            (
                layer.w_ih.detach().to(dtype),
                layer.w_hh.detach().to(dtype),
                (layer.bias + layer.forget_offset).detach().to(dtype).unsqueeze(1),
                layer.w_p.detach().to(dtype),
            )
            for layer in self.bilm.lstm.layers
        ]

    def _stage(self, batch: StaticBatch) -> tuple[torch.Tensor, ...]:
        """The batch's arrays on the device in their own (small) dtypes, copied from pinned host
        memory on the load stream, which the current stream then waits for: the copy of the next
        pass overlaps the pass still computing, and the host never waits for either."""
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._load_stream):
            staged = tuple(
                torch.from_numpy(a).pin_memory().to(self.device, non_blocking=True)
                for a in (batch.chars, batch.positions, batch.reverse, batch.lengths)
            )
        compute.wait_stream(self._load_stream)
        for tensor in staged:  # freed by the host before the compute stream has read it
            tensor.record_stream(compute)
        return staged

    @property
    def captured_shapes(self) -> list[tuple[int, int, int]]:
        """The (R, T, K) shapes replayed as CUDA graphs so far."""
        return [key for key, g in self._graphed.items() if g.step.replaying]

    def __call__(self, batch: StaticBatch) -> torch.Tensor:
        if not self.graphs:
            inputs = _device_inputs(batch, self.device)
            with torch.no_grad(), _tf32(self.precision == "tf32"):
                return self.forward(*inputs)
        graphed = self._graphed.get(batch.shape)
        if graphed is None:
            graphed = self._graphed[batch.shape] = _GraphedShape(self, batch.shape)
        graphed.load(self._stage(batch))
        with torch.no_grad(), _tf32(self.precision == "tf32"):
            return graphed.step()["out"]

    # ---- the pass ------------------------------------------------------------------------------
    def forward(
        self,
        chars: torch.Tensor,
        positions: torch.Tensor,
        reverse: torch.Tensor,
        lengths: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """chars (K, 50), positions (R, T), reverse (R, T), lengths (R,) (``StaticBatch``, on the
        device, long) -> ``OutputSpec.shape`` (written into ``out`` when given). Static shapes, no
        host synchronisation."""
        device = self.device.type
        with torch.autocast(device, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            vectors = self.bilm.token_encoder.encode_unique(chars)  # (K, P)
        vectors = vectors.to(self.compute_dtype)
        streams = torch.stack([positions, positions.gather(1, reverse)]).transpose(1, 2)  # (2, T, R)
        layers = self._lstm(vectors, streams)  # N x (2, T, R, P), sentence order per stream
        return self._assemble(vectors, positions, reverse, lengths, layers, out)

    def _lstm(self, vectors: torch.Tensor, streams: torch.Tensor) -> list[torch.Tensor]:
        lstm = self.bilm.lstm
        _, steps, rows = streams.shape
        x_cuda = vectors.is_cuda
        outs, x = [], None
        for li, (w_ih, w_hh, bias, w_p) in enumerate(self._weights):
            dim = w_hh.shape[-1] // 4
            gates = vectors.new_empty(2, steps * rows, 4 * dim) if li or x_cuda else None
            if li == 0:
                # the distinct token vectors' products (2K, 4C), gathered to every position of
                # each stream: on CUDA all at once, on a CPU step by step into its dense buffer
                products = torch.baddbmm(bias, vectors.expand(2, -1, -1), w_ih)
                # backward rows follow the K forward ones; no host tensor, which a graph capture forbids
                index = torch.stack([streams[0], streams[1] + products.shape[1]])
                products = products.view(-1, 4 * dim)
                if gates is not None:
                    torch.index_select(products, 0, index.reshape(-1), out=gates.view(-1, 4 * dim))
                    source = gates.view(2, steps, rows, -1)
                else:
                    source = (products, index)
            elif x_cuda:
                torch.baddbmm(bias, x.view(2, steps * rows, -1), w_ih, out=gates)
                source = gates.view(2, steps, rows, -1)
            else:
                # CPU: one product per direction runs faster than one batched product of two
                for d in range(2):
                    torch.addmm(bias[d], x[d].view(steps * rows, -1), w_ih[d], out=gates[d])
                source = gates.view(2, steps, rows, -1)
            h = self._recurrence(source, steps, rows, w_hh, w_p, lstm.cell_clip, lstm.proj_clip)
            if lstm.use_skip_connections and li > 0:
                h.add_(x)
            outs.append(h)
            x = h
        return outs

    def _recurrence(
        self,
        source: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        steps: int,
        rows: int,
        w_hh: torch.Tensor,
        w_p: torch.Tensor,
        cell_clip: float | None,
        proj_clip: float | None,
    ) -> torch.Tensor:
        """One layer from zero state -> h (2, T, R, P). ``source``: the input products with bias,
        (2, T, R, 4C) (overwritten), or (products (M, 4C), index (2, T, R)) whose rows ``index``
        points at (layer 0 on a CPU, gathered step by step)."""
        gates = source if isinstance(source, torch.Tensor) else None
        products, index = (None, None) if gates is not None else source
        like = gates if gates is not None else products
        four_dim = like.shape[-1]
        dim = four_dim // 4
        c = torch.zeros(2, rows, dim, dtype=torch.float32, device=like.device)
        h = like.new_empty(2, steps, rows, w_p.shape[-1])
        fused = fused_cell_for(like) if self.bilm.lstm.use_fused_cell else None
        # CPU: MKL's batched products run faster on dense blocks than on the directions' blocks
        # T x R rows apart (docs/model.md#static-shape-inference), so each step's gates and h go
        # through dense buffers there; cuBLAS takes the strided blocks as they are.
        dense = not like.is_cuda
        if dense:
            g_dense = like.new_empty(2, rows, four_dim)
            h_dense = h.new_empty(2, rows, h.shape[-1])
        for t in range(steps):
            if gates is None:
                g = torch.index_select(products, 0, index[:, t].reshape(-1), out=g_dense.view(-1, four_dim))
                g = g.view(2, rows, four_dim)
            else:
                g = g_dense.copy_(gates[:, t]) if dense else gates[:, t]
            if t > 0:
                g.baddbmm_(h_dense if dense else h[:, t - 1], w_hh)
            if fused is not None:
                m = fused(g, c, cell_clip)
            else:
                g[..., : 3 * dim].sigmoid_()
                j = g[..., 3 * dim :].tanh_()
                i, f, o = g[..., : 3 * dim].split(dim, dim=-1)
                c.mul_(f).addcmul_(i, j)
                if cell_clip is not None:
                    c.clamp_(-cell_clip, cell_clip)
                m = torch.tanh(c, out=j).mul_(o) if j.dtype == c.dtype else j.copy_(torch.tanh(c)).mul_(o)
            h_t = torch.bmm(m, w_p, out=h_dense if dense else h[:, t])
            if proj_clip is not None:
                h_t.clamp_(-proj_clip, proj_clip)
            if dense:
                h[:, t].copy_(h_t)
        return h

    def _assemble(
        self,
        vectors: torch.Tensor,
        positions: torch.Tensor,
        reverse: torch.Tensor,
        lengths: torch.Tensor,
        layers: list[torch.Tensor],
        out: torch.Tensor | None,
    ) -> torch.Tensor:
        """Layer 0 = [tok | tok], layer l = [forward_l | backward_l in sentence order], then the
        chosen layers, in float32, cast into the output dtype: pooled per row, else gathered at the
        real tokens only (``OutputSpec.shape``), so what leaves the device is what is stored."""
        rows, steps = positions.shape
        p = vectors.shape[-1]
        if self.output.pool:
            # (R * T) positions in row-major order: every row's positions, padding included
            source = torch.arange(rows * steps, device=positions.device)
        else:
            source = _real_tokens(lengths, rows, steps)
        row, step = source // steps, source % steps
        token_ids = positions.reshape(-1).index_select(0, source)
        forward_at = step * rows + row  # the LSTM outputs are time-major: (T, R) flattened
        backward_at = reverse.reshape(-1).index_select(0, source) * rows + row

        def layer(index: int) -> torch.Tensor:  # (M, 2P) float32 at the M positions of ``source``
            if index == 0:
                tok = vectors.float().index_select(0, token_ids)
                return torch.cat([tok, tok], dim=-1)
            h = layers[index - 1].float().view(2, steps * rows, p)
            return torch.cat([h[0].index_select(0, forward_at), h[1].index_select(0, backward_at)], dim=-1)

        count = len(layers) + 1
        mode = self.output.layers
        if mode == "all":
            values = torch.stack([layer(i) for i in range(count)], dim=1)  # (M, L, 2P)
        elif mode == "top":
            values = layer(count - 1)
        else:
            values = sum(layer(i) for i in range(count)) / count
        if self.output.pool:
            t = torch.arange(steps, device=lengths.device)
            inside = (t >= 1) & (t < (lengths - 1).unsqueeze(1))  # (R, T): tokens, no boundaries
            weights = inside.float() / (lengths - BOUNDARIES).clamp(min=1).unsqueeze(1)
            values = values.view(rows, steps, *values.shape[1:])
            weights = weights.view(rows, steps, *([1] * (values.dim() - 2)))
            values = (values * weights).sum(dim=1)
        if out is None:
            return values.to(self.output.dtype)
        return out.copy_(values)


def _real_tokens(lengths: torch.Tensor, rows: int, steps: int) -> torch.Tensor:
    """(R * (T - 2),) the row-major positions ``r * T + t`` of every row's real tokens (boundaries
    and padding left out), row by row, then zeros: a static shape whatever the lengths, so a
    CUDA graph can compact its pass on the device."""
    capacity = rows * (steps - BOUNDARIES)
    t = torch.arange(steps, device=lengths.device)
    inside = ((t >= 1) & (t < (lengths - 1).unsqueeze(1))).reshape(-1)  # (R * T)
    slot = torch.where(inside, torch.cumsum(inside, 0) - 1, capacity)  # outside: one spare slot
    source = torch.zeros(capacity + 1, dtype=torch.long, device=lengths.device)
    source.scatter_(0, slot, torch.arange(rows * steps, device=lengths.device))
    return source[:capacity]


def _device_inputs(batch: StaticBatch, device: torch.device) -> tuple[torch.Tensor, ...]:
    return tuple(
        torch.from_numpy(a).to(device, torch.long)
        for a in (batch.chars, batch.positions, batch.reverse, batch.lengths)
    )


class _GraphedShape:
    """One (R, T, K) shape on CUDA: fixed input buffers, a fixed output buffer, one CUDA graph."""

    def __init__(self, runner: StaticInference, shape: tuple[int, int, int]):
        rows, steps, k = shape
        device = runner.device
        self.inputs = (
            torch.zeros(k, 50, dtype=torch.long, device=device),
            torch.zeros(rows, steps, dtype=torch.long, device=device),
            torch.zeros(rows, steps, dtype=torch.long, device=device),
            torch.zeros(rows, dtype=torch.long, device=device),
        )
        bilm = runner.bilm
        out_shape = runner.output.shape(rows, steps, bilm.num_layers, bilm.output_dim)
        self.out = torch.empty(out_shape, dtype=runner.output.dtype, device=device)
        self.step = GraphedStep(
            lambda: {"out": runner.forward(*self.inputs, out=self.out)},
            GRAPH_WARMUP,
            what=f"static-shape inference at {shape}",
            pool=runner._pool,
            stream=runner._warmup_stream,
        )

    def load(self, staged: tuple[torch.Tensor, ...]) -> None:
        """Copy a staged batch (``StaticInference._stage``: on the device, small dtypes) into the
        graph's fixed buffers, widened to long, on the current stream before the replay reads them."""
        for buffer, source in zip(self.inputs, staged, strict=True):
            buffer.copy_(source, non_blocking=True)
