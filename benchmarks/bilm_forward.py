"""biLM forward throughput: this project's exact biLM against naive and fused baselines (issue 3, "Speed").

Prints one table per model size (random weights, float32 unless --bf16, batches of 64 real
sentences from the sample corpus):
  (a) elmo_model.BiLM, the exact model (char ids -> all layers);
  (b) a straightforward reference written here: the char CNN over every padded position, then a
      per-time-step projected LSTM cell that multiplies input and state separately at every step,
      one direction at a time (the design of the older PyTorch ELMo code);
  (c) torch.nn.LSTM(proj_size=P) stacks (fused but unable to clip), LSTM part alone, beside (a)'s
      LSTM part alone (`BiLM.lstm` on the same token vectors);
  (d) the machine's float32 torch.mm peak and (a)'s achieved GFLOP/s.
tokens/s counts real tokens (sentence boundaries excluded). GFLOP/s counts 2*MACs of the matrix
products actually needed for the real positions (boundaries included): CNN/highway/projection and
the first LSTM layer's input products for the distinct tokens of each batch, the rest of the LSTM
for every real position.

    python benchmarks/bilm_forward.py [--quick] [--sizes small,original] [--corpus PATH] [--device cuda]
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from elmo_model import BiLM, batch_to_ids, token_mask
from elmo_model.bilm import reverse_index, reverse_within_lengths
from elmo_model.flops import encoder_flops, first_input_flops, lstm_flops
from elmo_model.options import BiLMOptions
from pipeline.model_config import preset_options

DEFAULT_CORPUS = Path(__file__).resolve().parents[1] / "pipeline" / "data" / "kjv-sample.txt.gz"
SIZES = {
    "small": "2x1024_128_2048cnn_1xhighway",
    "original": "2x4096_512_2048cnn_2xhighway",
}
"""Benchmarked presets (pipeline/presets/<name>.yaml) and the released model each one matches."""
TOKEN = re.compile(r"\w+|[^\w\s]")


def options_for(size: str) -> dict:
    """options.json of a benchmarked size, from its preset: one source of truth for model sizes."""
    return preset_options(size)


def read_batches(
    corpus: Path, n_batches: int, batch_size: int, lengths: tuple[int, int] | None = None
) -> list[list[list[str]]]:
    """The first n_batches * batch_size non-empty lines, tokenized (words and punctuation); with
    ``lengths = (lo, hi)`` only sentences of lo..hi tokens."""
    if not corpus.exists():
        sys.exit(
            f"bilm_forward: corpus file {corpus} not found; pass --corpus PATH (a .txt or .txt.gz, one sentence per line)"
        )
    opener = gzip.open if corpus.suffix == ".gz" else open
    sentences = []
    with opener(corpus, "rt", encoding="utf-8") as f:
        for line in f:
            tokens = TOKEN.findall(line)
            if tokens and (lengths is None or lengths[0] <= len(tokens) <= lengths[1]):
                sentences.append(tokens)
            if len(sentences) == n_batches * batch_size:
                break
    if len(sentences) < n_batches * batch_size:
        sys.exit(f"bilm_forward: {corpus} has only {len(sentences)} sentences, need {n_batches * batch_size}")
    return [sentences[i : i + batch_size] for i in range(0, len(sentences), batch_size)]


# ---- (b) the naive reference ------------------------------------------------------------------
class NaiveBiLM(nn.Module):
    """Same weights as a BiLM, computed the old way: CNN on every (padded) position, per-step cell."""

    def __init__(self, bilm: BiLM):
        super().__init__()
        self.bilm = bilm

    def encode_tokens(self, char_ids: torch.Tensor) -> torch.Tensor:
        enc = self.bilm.token_encoder
        b, t, _ = char_ids.shape
        chars = enc.char_embedding(char_ids.view(b * t, -1)).transpose(1, 2)
        x = torch.cat([enc.activation(conv(chars).amax(-1)) for conv in enc.convs], -1)
        for highway in enc.highways:
            x = highway(x)
        x = enc.projection(x)
        return x.view(b, t, -1) * token_mask(char_ids).unsqueeze(-1)

    def run_direction(self, x: torch.Tensor, lengths: torch.Tensor, d: int) -> list[torch.Tensor]:
        """x (B, T, P) sorted by decreasing length; AllenNLP-style shrinking batch, per-step matmuls."""
        lstm = self.bilm.lstm
        batch, steps, _ = x.shape
        outs, layer_in = [], x
        for li, layer in enumerate(lstm.layers):
            w_ih, w_hh, w_p = layer.w_ih[d].t(), layer.w_hh[d].t(), layer.w_p[d].t()
            bias = layer.bias[d] + layer.forget_offset
            c = x.new_zeros(batch, lstm.dim)
            h = x.new_zeros(batch, lstm.projection_dim)
            out = x.new_zeros(batch, steps, lstm.projection_dim)
            for t in range(steps):
                k = int((lengths > t).sum())
                if k == 0:
                    break
                gates = F.linear(layer_in[:k, t], w_ih, bias) + F.linear(h[:k], w_hh)
                i, f, o, j = gates.split(lstm.dim, -1)
                cell = torch.sigmoid(f) * c[:k] + torch.sigmoid(i) * torch.tanh(j)
                cell = cell.clamp(-lstm.cell_clip, lstm.cell_clip)
                hidden = F.linear(torch.sigmoid(o) * torch.tanh(cell), w_p).clamp(
                    -lstm.proj_clip, lstm.proj_clip
                )
                c = torch.cat([cell, c[k:]])
                h = torch.cat([hidden, h[k:]])
                out[:k, t] = hidden
            if lstm.use_skip_connections and li > 0:
                out = out + layer_in
            outs.append(out)
            layer_in = out
        return outs

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        mask = token_mask(char_ids)
        lengths = mask.sum(1)
        order = torch.argsort(lengths, descending=True)
        tok = self.encode_tokens(char_ids)[order]
        lengths = lengths[order]
        index = reverse_index(lengths, tok.shape[1])
        fwd = self.run_direction(tok, lengths, 0)
        bwd = [
            reverse_within_lengths(o, index, 1)
            for o in self.run_direction(reverse_within_lengths(tok, index, 1), lengths, 1)
        ]
        layers = [torch.cat([tok, tok], -1)] + [torch.cat([a, b], -1) for a, b in zip(fwd, bwd, strict=True)]
        return torch.stack(layers, 1)[torch.argsort(order)]


# ---- (c) torch.nn.LSTM stacks -----------------------------------------------------------------
class TorchLSTMStacks(nn.Module):
    """Two unidirectional nn.LSTM(num_layers=N, proj_size=P) stacks (no clipping, no residual)."""

    def __init__(self, options: BiLMOptions):
        super().__init__()
        self.stacks = nn.ModuleList(
            nn.LSTM(
                options.projection_dim,
                options.dim,
                num_layers=options.n_layers,
                proj_size=options.projection_dim,
                batch_first=True,
            )
            for _ in range(2)
        )

    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor, packed: bool) -> list[torch.Tensor]:
        outs = []
        for stack, x in zip(self.stacks, inputs, strict=True):
            if packed:
                seq = nn.utils.rnn.pack_padded_sequence(
                    x, lengths.cpu(), batch_first=True, enforce_sorted=False
                )
                outs.append(nn.utils.rnn.pad_packed_sequence(stack(seq)[0], batch_first=True)[0])
            else:
                outs.append(stack(x)[0])
        return outs


# ---- FLOPs and timing -------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def pass_seconds(fn, inputs: list, device: torch.device) -> float:
    """Wall seconds of one pass of `fn` over `inputs`."""
    sync(device)
    start = time.perf_counter()
    for x in inputs:
        fn(x)
    sync(device)
    return time.perf_counter() - start


def interleaved_best(variants: dict, device: torch.device, rounds: int, label: str) -> dict[str, float]:
    """name -> (fn, inputs): best pass time of each over `rounds` rounds that take turns.

    Taking turns spreads bursts of load from other processes over all variants instead of one.
    """
    best = {name: float("inf") for name in variants}
    with torch.inference_mode():
        for fn, inputs in variants.values():
            fn(inputs[0])  # warm-up (workspaces, kernels)
        for r in range(rounds):
            began = time.perf_counter()
            for name, (fn, inputs) in variants.items():
                best[name] = min(best[name], pass_seconds(fn, inputs, device))
            print(
                f"  [{label} round {r + 1}/{rounds}: {time.perf_counter() - began:.1f}s]",
                file=sys.stderr,
                flush=True,
            )
    return best


def mm_peak(device: torch.device, n: int, dtype: torch.dtype) -> float:
    """GFLOP/s of an n x n x n torch.mm (best of 3 after a warm-up)."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    with torch.inference_mode():
        torch.mm(a, b)
        seconds = min(pass_seconds(lambda _: torch.mm(a, b), [None], device) for _ in range(3))
    return 2 * n**3 / seconds / 1e9


def bench_size(size: str, batches, args, device: torch.device) -> list[tuple[str, str, str]]:
    torch.manual_seed(0)
    bilm = BiLM.from_options(options_for(size)).eval().to(device)
    bilm.lstm.use_fused_cell = not args.no_fused
    o = bilm.bilm_options
    ids = [batch_to_ids(b).to(device) for b in batches]
    n_tokens = sum(len(s) for b in batches for s in b)
    n_positions = n_tokens + 2 * sum(len(b) for b in batches)
    n_unique = sum(int(torch.unique(x[token_mask(x)], dim=0).shape[0]) for x in ids)
    # both directions; layer 0's input products once per distinct token
    lstm_work = 2 * (n_positions * (lstm_flops(o) - first_input_flops(o)) + n_unique * first_input_flops(o))
    flops = n_unique * encoder_flops(o) + lstm_work
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)

    def exact(x):
        with autocast:
            return bilm(x)

    # LSTM part alone, on the token vectors of each batch.
    with torch.inference_mode():
        prepared = []
        for x in ids:
            mask = token_mask(x)
            tok = bilm.token_encoder(x)
            rev = reverse_within_lengths(tok, reverse_index(mask.sum(1), tok.shape[1]), 1)
            prepared.append((torch.stack([tok, rev]), mask))

    def ours_lstm(p):
        with autocast:
            return bilm.lstm(p[0], p[1])

    torch_lstm = TorchLSTMStacks(o).eval().to(device)

    def theirs(packed: bool):
        def run(p):
            with autocast:
                return torch_lstm(p[0], p[1].sum(1), packed)

        return run

    variants = {"a": (exact, ids), "a_lstm": (ours_lstm, prepared)}
    variants["c_packed"] = (theirs(True), prepared)
    variants["c_padded"] = (theirs(False), prepared)
    if not args.skip_naive:
        naive = NaiveBiLM(bilm)
        with torch.inference_mode():
            diff = (naive(ids[0]) - bilm(ids[0]).layers).abs().max().item()
        variants["b"] = (naive, ids)
    t = interleaved_best(variants, device, args.rounds, size)

    rows = [
        ("(a) elmo_model.BiLM (exact)", f"{n_tokens / t['a']:,.0f}", f"{flops / t['a'] / 1e9:.1f} GFLOP/s")
    ]
    if "b" in t:
        note = f"(a) = {t['b'] / t['a']:.2f}x (b); max|(b) - (a)| {diff:.1e}"
        rows.append(("(b) naive reference", f"{n_tokens / t['b']:,.0f}", note))
    lstm_gflops = lstm_work / t["a_lstm"] / 1e9
    rows.append(("(a) LSTM part alone", f"{n_tokens / t['a_lstm']:,.0f}", f"{lstm_gflops:.1f} GFLOP/s"))
    for label in ("packed", "padded"):
        t_c = t[f"c_{label}"]
        note = f"(a) LSTM = {t_c / t['a_lstm']:.2f}x (c)"
        rows.append((f"(c) nn.LSTM(proj_size) {label}", f"{n_tokens / t_c:,.0f}", note))
    # Seconds (b) takes per GFLOP of (a)'s work: times a peak in GFLOP/s, the most (a) could gain over (b).
    b_per_gflop = t["b"] / (flops / 1e9) if "b" in t else None
    return rows, flops / t["a"] / 1e9, b_per_gflop


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--corpus", type=Path, default=DEFAULT_CORPUS, help="one sentence per line (.txt/.txt.gz)"
    )
    parser.add_argument("--sizes", default="small,original", help="comma list of: " + ", ".join(SIZES))
    parser.add_argument("--batches", type=int, default=2, help="batches of 64 sentences timed per pass")
    parser.add_argument(
        "--rounds", type=int, default=2, help="timed rounds, variants taking turns (best is reported)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast for (a) and (c) (GPU)")
    parser.add_argument("--skip-naive", action="store_true", help="skip (b), the slowest column")
    parser.add_argument(
        "--no-fused",
        action="store_true",
        help="CUDA: the unfused elementwise cell instead of the Triton kernel",
    )
    parser.add_argument(
        "--lengths",
        default="",
        help="LO-HI: only sentences of LO..HI tokens (e.g. 20-30), instead of the corpus's first lines",
    )
    parser.add_argument("--quick", action="store_true", help="small size only, 1 batch, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.batches, args.rounds = "small", 1, 1
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    band = tuple(int(v) for v in args.lengths.split("-")) if args.lengths else None
    batches = read_batches(args.corpus, args.batches, 64, band)
    n_tok = sum(len(s) for b in batches for s in b)
    peak_dtype = torch.bfloat16 if args.bf16 else torch.float32
    peak_n = 2048 if device.type == "cpu" else 8192
    print(
        f"device {torch.cuda.get_device_name() if device.type == 'cuda' else device}, threads {args.threads}, "
        f"{'bf16 autocast' if args.bf16 else 'float32'}, {'unfused' if args.no_fused else 'fused'} cell (CUDA), "
        f"{len(batches)} batches x 64 sentences, {n_tok / (64 * len(batches)):.1f} tokens/sentence"
    )
    for size in args.sizes.split(","):
        # The peak is measured beside each size: on a shared machine it drifts.
        peak = mm_peak(device, peak_n, peak_dtype)
        rows, achieved, b_per_gflop = bench_size(size, batches, args, device)
        peak = max(peak, mm_peak(device, peak_n, peak_dtype))
        print(f"\n{size}: {SIZES[size]}")
        print(f"{'variant':36s} {'tokens/s':>12s}  notes")
        for name, rate, note in rows:
            print(f"{name:36s} {rate:>12s}  {note}")
        print(f"{'(d) torch.mm peak':36s} {'':>12s}  {peak:.1f} GFLOP/s")
        print(f"{'(d) (a) achieved / mm peak':36s} {achieved / peak:>12.0%}")
        if b_per_gflop is not None:
            # (a) cannot beat the mm peak, so this is the largest (a)/(b) ratio this machine allows.
            print(f"{'    ceiling: (a) at 100% of peak':36s} {'':>12s}  = {b_per_gflop * peak:.2f}x (b)")


if __name__ == "__main__":
    main()
