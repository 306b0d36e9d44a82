"""Running the biLM over a shard's sentences, and the Ray actor that does it.

Values per input line (boundaries removed, float32 before the storage cast):
``all`` -> (N+1, n, 2P) [token layer, lstm 1 .. lstm N]; ``top`` -> (n, 2P) = layer N;
``average`` -> (n, 2P) = mean over the N+1 layers (AllenNLP's ``numpy.average(axis=0)``).
An empty line gives the same shapes with n = 0 and does not go through the model.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from elmo_model import BiLM, batch_to_ids
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


def select_layers(layers: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, N+1, T, 2P) -> (B, N+1, T, 2P) for ``all``; (B, T, 2P) for ``top`` / ``average``."""
    if mode == "all":
        return layers
    if mode == "top":
        return layers[:, -1]
    if mode == "average":
        return layers.mean(dim=1)
    raise EmbedError(f"layers: unknown mode {mode!r}; choose all, top or average")


def empty_value(mode: str, num_layers: int, output_dim: int) -> np.ndarray:
    """The value of an empty sentence: (N+1, 0, 2P) for ``all``, (0, 2P) otherwise."""
    shape = (num_layers, 0, output_dim) if mode == "all" else (0, output_dim)
    return np.zeros(shape, dtype=np.float32)


def embed_pieces(
    bilm: BiLM,
    pieces: Sequence[Sequence[str]],
    batches: Sequence[Sequence[int]],
    mode: str,
    device: torch.device,
) -> list[np.ndarray]:
    """Run ``batches`` (lists of indices into ``pieces``, in the order given) through ``bilm``.

    ``pieces``: non-empty token lists. Returns one float32 array per piece with boundaries removed:
    (N+1, n_i, 2P) for ``all``, (n_i, 2P) otherwise.
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
            values[i] = np.ascontiguousarray(selected[row, ..., 1 : n + 1, :])
    return values  # type: ignore[return-value]


def plan_forward_passes(pieces: Sequence[Sequence[str]], settings: EmbedSettings) -> list[list[int]]:
    """Length-bucketed batches (stateless) or input-order batches of a fixed size (stateful)."""
    if settings.stateful:
        return batching.in_order(len(pieces), settings.stateful_batch_size)
    return batching.length_bucketed(
        [len(p) for p in pieces], settings.batch_tokens, settings.max_batch_sentences
    )


def embed_lines(
    bilm: BiLM,
    prepared: PreparedLines,
    settings: EmbedSettings,
    num_layers: int,
    output_dim: int,
    device: torch.device,
) -> list[np.ndarray]:
    """One value per line of ``prepared`` (see module docstring); split lines are concatenated on the token axis."""
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
    piece_values = embed_pieces(bilm, flat, plan_forward_passes(flat, settings), settings.layers, device)
    per_line: list[list[np.ndarray]] = [[] for _ in prepared.pieces]
    for line, value in zip(owner, piece_values, strict=True):
        per_line[line].append(value)
    empty = empty_value(settings.layers, num_layers, output_dim)
    return [
        np.concatenate(parts, axis=-2) if len(parts) > 1 else (parts[0] if parts else empty)
        for parts in per_line
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
        values = embed_lines(
            self.bilm, prepared, s, self.source.num_layers, self.source.output_dim, self.device
        )
        return shard_stats(spec, prepared), values

    def process(self, spec: ShardSpec, write: bool) -> dict:
        """Embed one shard and, when ``write``, commit it; the manifest entry (or the stats)."""
        stats, values = self.embed_spec(spec)
        if not write:
            return stats
        # each entry names what made it, so a shard copied out of its folder still says so
        stats.update(layers=self.settings.layers, dtype=self.settings.dtype, model_sha256=self.source.sha256)
        return commit_shard(self.output, stats, encode_shard(spec.first_line, values, self.settings.dtype))

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
