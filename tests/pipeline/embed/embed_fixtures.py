"""Shared helpers for the embed tests: the tiny reference model, sample lines, a direct BiLM call.

A uniquely named module (not conftest) so the test files can import it.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import h5py
import numpy as np
import torch

from elmo_model import BiLM, batch_to_ids

REPO = Path(__file__).resolve().parents[3]
MODEL_DIR = REPO / "tests" / "data" / "reference" / "allennlp"
OPTIONS = MODEL_DIR / "options.json"
WEIGHTS = MODEL_DIR / "lm_weights.hdf5"
SAMPLE = REPO / "pipeline" / "data" / "kjv-sample.txt.gz"


def load_model() -> BiLM:
    """The AllenNLP fixture model (tiny: P = 16, so 2P = 32), stateless, eval mode."""
    return BiLM.from_files(OPTIONS, WEIGHTS)


def sample_lines(count: int, start: int = 0) -> list[bytes]:
    """``count`` lines of the shipped sample corpus (whitespace-separated words, punctuation attached)."""
    with gzip.open(SAMPLE, "rb") as f:
        lines = f.read().split(b"\n")
    return lines[start : start + count]


def direct(model: BiLM, tokens: list[str], mode: str = "all") -> np.ndarray:
    """One sentence alone through the biLM: (3, n, 2P) / (n, 2P), boundaries removed."""
    with torch.no_grad():
        layers = model(batch_to_ids([tokens])).layers[0, :, 1 : len(tokens) + 1].numpy()  # (3, n, 2P)
    return {"all": layers, "top": layers[-1], "average": layers.mean(axis=0)}[mode]


CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
"""Control characters other than tab, LF and CR: whitespace to both stages (docs/encoding.md)."""


def line_tokens(line: bytes) -> list[str]:
    """The tokens of one raw input line: invalid UTF-8 replaced, control characters as spaces."""
    return CONTROL.sub(" ", line.decode("utf-8", errors="replace")).split()


def expected_value(model: BiLM, line: bytes, mode: str = "all", max_tokens: int = 10**9) -> np.ndarray:
    """What the stage must store for one raw line: pieces of ``max_tokens`` embedded alone, concatenated."""
    tokens = line_tokens(line)
    if not tokens:
        return np.zeros((3, 0, 32) if mode == "all" else (0, 32), dtype=np.float32)
    pieces = [tokens[i : i + max_tokens] for i in range(0, len(tokens), max_tokens)]
    return np.concatenate([direct(model, p, mode) for p in pieces], axis=-2)


def read_hdf5(path) -> dict[str, np.ndarray]:
    """Every dataset of a local HDF5 file by name (``sentence_to_index`` as its decoded JSON)."""
    out = {}
    with h5py.File(path, "r") as f:
        for key in f.keys():
            if key == "sentence_to_index":
                out[key] = json.loads(f[key][0])
            else:
                out[key] = f[key][()]
    return out


def shard_of(first_line: int, values: list[np.ndarray], dtype: str = "float32", pooled: bool = False):
    """A ``ShardVectors`` holding ``values`` (AllenNLP-shaped, one per line from ``first_line``:
    (3, n, 2P) or (n, 2P); pooled ([3,] 2P)) in ``dtype``, assembled as the actor assembles one."""
    from pipeline.embed.shard_vectors import ShardAssembler

    first = values[0]
    row_shape = (
        first.shape if pooled else (first.shape[0], first.shape[-1]) if first.ndim == 3 else first.shape[-1:]
    )
    sizes = [1 if pooled else v.shape[-2] for v in values]
    assembler = ShardAssembler(
        first_line, len(values), range(len(values)), sizes, row_shape, np.dtype(dtype), pooled
    )
    for i, value in enumerate(values):
        assembler.place_piece(i, value.astype(dtype))
    return assembler.finish()


def write_shard_file(
    path,
    first_line: int,
    values: list[np.ndarray],
    dtype: str = "float32",
    layout: str = "allennlp",
    pooled: bool = False,
) -> str:
    """Write ``values`` as an embedding shard at the local ``path`` (``hdf5_shard.write_shard``); its sha256."""
    from pipeline.embed.hdf5_shard import write_shard

    with open(path, "wb") as out:
        return write_shard(shard_of(first_line, values, dtype, pooled), layout, out)
