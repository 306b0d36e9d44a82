"""Running the biLM over a shard's sentences, and the Ray actor that does it.

Values per input line (boundaries removed, float32 before the storage cast):
``all`` -> (N+1, n, 2P) [token layer, lstm 1 .. lstm N]; ``top`` -> (n, 2P) = layer N;
``average`` -> (n, 2P) = mean over the N+1 layers (AllenNLP's ``numpy.average(axis=0)``).
An empty line gives the same shapes with n = 0 and does not go through the model.
"""

from __future__ import annotations

import ctypes
import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from elmo_model import BiLM, batch_to_ids
from elmo_model.static_batches import BucketPlan, build_batch, plan_batches, split_rows
from elmo_model.static_inference import OutputSpec, StaticInference
from pipeline.embed import batching
from pipeline.embed.errors import WORKER_ERRORS, EmbedError
from pipeline.embed.hdf5_shard import encode_shard
from pipeline.embed.inputs import ShardSpec, read_lines
from pipeline.embed.model_files import ModelSource, load_bilm
from pipeline.embed.resume import commit_shard
from pipeline.embed.sentences import PreparedLines, prepare_lines


@dataclass(frozen=True)
class EmbedSettings:
    """What the actor needs from EmbedConfig (a plain, picklable subset)."""

    layers: str
    dtype: str
    stateful: bool
    batch_tokens: int
    max_batch_sentences: int
    stateful_batch_size: int
    max_sentence_tokens: int
    long_sentences: str
    invalid_utf8: str
    threads: int
    device: str
    precision: str = "float32"
    pool: str = "none"
    layout: str = "allennlp"


def select_layers(layers: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, N+1, T, 2P) -> (B, N+1, T, 2P) for ``all``; (B, T, 2P) for ``top`` / ``average``."""
    if mode == "all":
        return layers
    if mode == "top":
        return layers[:, -1]
    if mode == "average":
        return layers.mean(dim=1)
    raise EmbedError(f"layers: unknown mode {mode!r}; choose all, top or average")


def empty_value(mode: str, num_layers: int, output_dim: int, pool: bool = False) -> np.ndarray:
    """The value of an empty sentence: (N+1, 0, 2P) for ``all``, (0, 2P) otherwise; pooled, zeros of
    (N+1, 2P) or (2P,) (the mean of no tokens; the manifest and the packed offsets say n = 0)."""
    layer = (num_layers,) if mode == "all" else ()
    shape = (*layer, output_dim) if pool else (*layer, 0, output_dim)
    return np.zeros(shape, dtype=np.float32)


class SentenceEncoder:
    """One actor's model and the way it runs: stateless passes as static shapes
    (``elmo_model.static_inference``; on CUDA fixed bucket shapes replayed as CUDA graphs, their
    outputs copied to pinned host memory on a second stream, no synchronising call per pass), or,
    stateful, today's ``BiLM.forward`` in input-order batches.

    ``embed(pieces)`` -> one float32 or float16 array per piece (non-empty token lists), boundaries
    removed: (N+1, n, 2P) for ``all``, (n, 2P) otherwise; pooled: (N+1, 2P) or (2P,).
    """

    IN_FLIGHT = 2
    """CUDA: passes queued ahead of the host before it waits for the oldest one's copy."""

    def __init__(self, bilm: BiLM, settings: EmbedSettings, device: torch.device):
        self.bilm, self.settings, self.device = bilm, settings, device
        self.pool = settings.pool == "mean"
        self.static = None
        if not settings.stateful:
            dtype = torch.float16 if settings.dtype == "float16" else torch.float32
            output = OutputSpec(settings.layers, pool=self.pool, dtype=dtype)
            self.static = StaticInference(bilm, output, settings.precision)
            if device.type == "cuda":
                self.plan = BucketPlan(settings.batch_tokens, settings.max_batch_sentences, fixed=True)
                self.copy_stream = torch.cuda.Stream(device)
            else:
                self.plan = BucketPlan(settings.batch_tokens, settings.max_batch_sentences)

    def embed(self, pieces: Sequence[Sequence[str]]) -> list[np.ndarray]:
        if self.static is None:
            batches = batching.in_order(len(pieces), self.settings.stateful_batch_size)
            return embed_pieces(self.bilm, pieces, batches, self.settings.layers, self.device, self.pool)
        values: list[np.ndarray | None] = [None] * len(pieces)
        pending: deque = deque()
        for indices in plan_batches([len(p) for p in pieces], self.plan):
            batch = build_batch([pieces[i] for i in indices], self.plan)
            pending.append((indices, batch, self._to_host(self.static(batch))))
            while len(pending) > (self.IN_FLIGHT if self.device.type == "cuda" else 0):
                self._collect(pending.popleft(), values)
        while pending:
            self._collect(pending.popleft(), values)
        return values  # type: ignore[return-value]

    def _to_host(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """The pass's output on its way to the host: on CUDA a copy queued on the copy stream into
        pinned memory (from a device copy of the graph's buffer, which the next pass of the same
        shape overwrites) and the event that marks it done."""
        if out.device.type != "cuda":
            return out, None
        detached = out.clone()
        host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        self.copy_stream.wait_stream(torch.cuda.current_stream(out.device))
        with torch.cuda.stream(self.copy_stream):
            host.copy_(detached, non_blocking=True)
            detached.record_stream(self.copy_stream)
            done = torch.cuda.Event()
            done.record(self.copy_stream)
        return host, done

    def _collect(self, item, values: list) -> None:
        indices, batch, (host, done) = item
        if done is not None:
            done.synchronize()
        for i, value in zip(indices, split_rows(host.numpy(), batch, self.pool), strict=True):
            values[i] = value


def embed_pieces(
    bilm: BiLM,
    pieces: Sequence[Sequence[str]],
    batches: Sequence[Sequence[int]],
    mode: str,
    device: torch.device,
    pool: bool = False,
) -> list[np.ndarray]:
    """Run ``batches`` (lists of indices into ``pieces``, in the order given) through ``bilm.forward``
    (the stateful path: state carries from batch to batch in row order).

    ``pieces``: non-empty token lists. Returns one float32 array per piece with boundaries removed:
    (N+1, n_i, 2P) for ``all``, (n_i, 2P) otherwise; with ``pool`` the mean over the n_i tokens.
    """
    values: list[np.ndarray | None] = [None] * len(pieces)
    for batch in batches:
        ids = batch_to_ids([pieces[i] for i in batch]).to(device)  # (B, T+2, 50)
        # no_grad, not inference_mode: the biLM caches work buffers across calls, and inference
        # tensors cached here would break a later ordinary call on the same model
        with torch.no_grad():
            selected = select_layers(bilm(ids).layers, mode).float().cpu().numpy()
        for row, i in enumerate(batch):
            n = len(pieces[i])
            # copy: a view would keep the whole padded batch array alive
            value = selected[row, ..., 1 : n + 1, :]
            values[i] = value.mean(axis=-2) if pool else np.ascontiguousarray(value)
    return values  # type: ignore[return-value]


def _join_pieces(parts: list[np.ndarray], sizes: list[int], pool: bool) -> np.ndarray:
    """A split line's pieces as one value: concatenated on the token axis, or (pooled) their
    means weighted by their token counts."""
    if len(parts) == 1:
        return parts[0]
    if not pool:
        return np.concatenate(parts, axis=-2)
    total = sum(sizes)
    joined = sum(part.astype(np.float32) * (n / total) for part, n in zip(parts, sizes, strict=True))
    return joined.astype(parts[0].dtype)


def embed_lines(
    encoder: SentenceEncoder,
    prepared: PreparedLines,
    num_layers: int,
    output_dim: int,
) -> list[np.ndarray]:
    """One value per line of ``prepared`` (see ``SentenceEncoder``); split lines are joined."""
    settings = encoder.settings
    flat: list[list[str]] = []
    owner: list[int] = []
    for line, pieces in enumerate(prepared.pieces):
        if settings.stateful and len(pieces) > 1:
            raise EmbedError(
                f"line {prepared.first_line + line} has more than max_sentence_tokens={settings.max_sentence_tokens} "
                "tokens: stateful mode cannot split it (splitting would change the batch rows); raise max_sentence_tokens"
            )
        flat.extend(pieces)
        owner.extend([line] * len(pieces))
    piece_values = encoder.embed(flat)
    per_line: list[list[np.ndarray]] = [[] for _ in prepared.pieces]
    sizes: list[list[int]] = [[] for _ in prepared.pieces]
    for line, piece, value in zip(owner, flat, piece_values, strict=True):
        per_line[line].append(value)
        sizes[line].append(len(piece))
    empty = empty_value(settings.layers, num_layers, output_dim, encoder.pool)
    return [
        _join_pieces(parts, n, encoder.pool) if parts else empty
        for parts, n in zip(per_line, sizes, strict=True)
    ]


def shard_stats(spec: ShardSpec, prepared: PreparedLines) -> dict:
    """The manifest fields an embedder knows about one shard."""
    return {
        "index": spec.index,
        "first_line": spec.first_line,
        "end_line": spec.first_line + spec.num_lines,
        "sentences": prepared.num_lines,
        "tokens": prepared.num_tokens,
        "empty_sentences": prepared.empty_sentences,
        "invalid_utf8_lines": prepared.invalid_utf8_lines,
        "control_char_lines": prepared.control_char_lines,
        "split_sentences": prepared.split_sentences,
        "input_sha256": spec.input_sha256,
    }


def _libc_malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _libc_malloc_trim()


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS after a shard (glibc only; elsewhere nothing to do).

    Every shard allocates arrays of new sizes (length-bucketed batches, ragged outputs, the HDF5
    buffer) and glibc keeps freed pages in its arenas; trimming keeps an actor's footprint near what
    one shard needs rather than the high-water mark of every shard so far. (Measured: the whole
    job's peak grew 1.05-1.09x for 4x the input with it; the effect alone was within noise.)
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def pick_device(name: str) -> torch.device:
    """``auto``: cuda when this process sees a GPU, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class ShardEmbedder:
    """Ray Data actor: loads the model once, then embeds and commits one shard per input row.

    Input batch: ``spec`` (JSON ShardSpec) and ``write`` (bool; false only in a stateful rerun for a
    shard that is already complete: it still runs, to carry the state forward, but is not written).
    Output batch: ``entry`` (JSON manifest entry, see resume.commit_shard) and ``written`` (bool).
    A WORKER_ERRORS failure becomes the entry ``{"index", "error": message}``; the driver raises it.
    """

    def __init__(self, source: dict, settings: dict, output: str):
        self.source = ModelSource(**source)
        self.settings = EmbedSettings(**settings)
        self.output = output
        torch.set_num_threads(max(1, self.settings.threads))
        self.device = pick_device(self.settings.device)
        if self.device.type == "cuda":
            # fp32 vectors must equal a CPU float32 run (docs/model.md#reference-outputs): no TF32 shortcuts
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self.bilm = load_bilm(self.source).to(self.device)
        self.bilm.stateful = self.settings.stateful
        self.encoder = SentenceEncoder(self.bilm, self.settings, self.device)

    def embed_spec(self, spec: ShardSpec) -> tuple[dict, list[np.ndarray]]:
        """Shard stats and one value per line, in line order."""
        s = self.settings
        where = spec.segments[0].path if spec.segments else "input"
        prepared = prepare_lines(
            read_lines(spec),
            spec.first_line,
            max_tokens=s.max_sentence_tokens,
            long_sentences=s.long_sentences,
            invalid_utf8=s.invalid_utf8,
            where=where,
        )
        values = embed_lines(self.encoder, prepared, self.source.num_layers, self.source.output_dim)
        return shard_stats(spec, prepared), values

    def process(self, spec: ShardSpec, write: bool) -> dict:
        """Embed one shard and, when ``write``, commit it; the manifest entry (or the stats)."""
        stats, values = self.embed_spec(spec)
        if not write:
            return stats
        # each entry names what made it, so a shard copied out of its folder still says so
        stats.update(layers=self.settings.layers, dtype=self.settings.dtype, model_sha256=self.source.sha256)
        s = self.settings
        stats.update(layout=s.layout, pool=s.pool)
        return commit_shard(
            self.output, stats, encode_shard(spec.first_line, values, s.dtype, s.layout, s.pool == "mean")
        )

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        entries, written = [], []
        for spec_json, write in zip(batch["spec"], batch["write"], strict=True):
            spec = ShardSpec.from_dict(json.loads(spec_json))
            try:
                entries.append(json.dumps(self.process(spec, bool(write))))
            except WORKER_ERRORS as err:
                entries.append(json.dumps({"index": spec.index, "error": str(err)}))
            written.append(bool(write))
            release_free_memory()
        return {"entry": entries, "written": written}
