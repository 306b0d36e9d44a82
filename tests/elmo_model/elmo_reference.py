"""Helpers for the elmo_model tests: the reference sets copied under tests/data/reference (docs/model.md#reference-outputs).

A uniquely named module (not conftest) so test files can import it whatever other conftest files exist.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from elmo_model import BiLM, batch_to_ids

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "reference"
SENTENCE_FILES = {"bilm_tf": "lm_embeddings_sentences.json", "allennlp": "sentences.json"}
TINY_OPTIONS = {
    "lstm": {
        "dim": 12,
        "projection_dim": 6,
        "n_layers": 2,
        "cell_clip": 3,
        "proj_clip": 3,
        "use_skip_connections": True,
    },
    "char_cnn": {
        "activation": "relu",
        "embedding": {"dim": 3},
        "filters": [[1, 4], [2, 5], [3, 6]],
        "max_characters_per_token": 50,
        "n_characters": 262,
        "n_highway": 1,
    },
}


@dataclass(frozen=True)
class ReferenceSet:
    """One fixture set (docs/model.md#reference-outputs): options, weights, 30 sentences S[row][batch], expected top layers."""

    name: str

    @property
    def directory(self) -> Path:
        return REFERENCE / self.name

    @property
    def options_file(self) -> Path:
        return self.directory / "options.json"

    @property
    def weight_file(self) -> Path:
        return self.directory / "lm_weights.hdf5"

    def load(self) -> BiLM:
        return BiLM.from_files(self.options_file, self.weight_file)

    def sentences(self) -> list[list[list[str]]]:
        raw = json.loads((self.directory / SENTENCE_FILES[self.name]).read_text())
        return [[s.split() for s in row] for row in raw]

    def expected(self) -> list[list[np.ndarray]]:
        """E[row][batch] = (n_tokens, 2P) expected top layer (forward | backward)."""
        out = []
        for k in range(3):
            with h5py.File(self.directory / f"lm_embeddings_{k}.hdf5", "r") as f:
                out.append([np.concatenate([f[str(i)][0], f[str(i)][1]], axis=-1) for i in range(10)])
        return out


def run_stateful(model: BiLM, sentences, embed=None, batches: int = 10) -> list[list[np.ndarray]]:
    """docs/model.md#reference-outputs: the first ``batches`` of the 10 batches of 3 rows in order,
    never resetting; returns the top layer A[row][batch].

    `embed(batch) -> BiLMOutput` replaces `model(batch_to_ids(batch))` (e.g. the token-cache path).
    """
    model.stateful = True
    actual = [[], [], []]
    for i in range(batches):
        batch = [sentences[k][i] for k in range(3)]
        with torch.no_grad():
            out = embed(batch) if embed is not None else model(batch_to_ids(batch))
        assert out.lengths.tolist() == [len(s) + 2 for s in batch]
        for k in range(3):
            actual[k].append(out.layers[k, -1, 1 : len(batch[k]) + 1].numpy())
    return actual


def assert_matches_reference(actual, reference: ReferenceSet, batches: int = 10) -> None:
    """``actual`` (from `run_stateful`) holds the reference's first ``batches`` batches, each within 1e-6."""
    expected, sentences = reference.expected(), reference.sentences()
    for k in range(3):
        assert len(actual[k]) == batches, (reference.name, k, len(actual[k]))
        for i in range(batches):
            assert actual[k][i].shape == expected[k][i].shape == (len(sentences[k][i]), 32)
            assert np.allclose(actual[k][i], expected[k][i], atol=1e-6), (reference.name, k, i)
