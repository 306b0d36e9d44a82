"""The AllenNLP fixture's sentences and expected top layers, in the order the embed tests use."""

from __future__ import annotations

import json

import h5py
import numpy as np
from embed_fixtures import MODEL_DIR


def fixture_sentences_batch_major() -> list[list[str]]:
    """The 30 fixture sentences in the order they were run: batch 0 rows 0..2, batch 1 rows 0..2, ..."""
    rows = json.loads((MODEL_DIR / "sentences.json").read_text())  # S[row][batch]
    return [rows[row][batch].split() for batch in range(10) for row in range(3)]


def fixture_expected() -> list[list[np.ndarray]]:
    """E[row][batch]: expected top layer (n, 2P) = forward | backward halves."""
    out = []
    for row in range(3):
        with h5py.File(MODEL_DIR / f"lm_embeddings_{row}.hdf5", "r") as f:
            out.append([np.concatenate([f[str(b)][0], f[str(b)][1]], axis=-1) for b in range(10)])
    return out
