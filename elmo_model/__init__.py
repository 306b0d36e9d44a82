"""ELMo biLM in pure PyTorch, compatible with bilm-tf / AllenNLP weights (see docs/architecture.md).

The names below are imported on first use, so a torch-free module of this package
(``characters``, ``static_batches``, ``hdf5_storage``) can be imported without loading torch: an
embed actor's writer processes (``pipeline.embed.shard_writers``) commit shards without it.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_HOMES = {
    "BiLM": "bilm",
    "BiLMOutput": "bilm",
    "batch_to_ids": "characters",
    "token_mask": "characters",
    "token_to_ids": "characters",
    "tokens_to_ids": "characters",
    "Elmo": "elmo",
    "remove_sentence_boundaries": "elmo",
    "LSTMState": "lstm",
    "StackedBiLSTM": "lstm",
    "BiLMOptions": "options",
    "OptionsError": "options",
    "ScalarMix": "scalar_mix",
    "TokenCache": "token_cache",
    "TokenEncoder": "token_encoder",
    "TrainingLM": "training_lm",
    "WeightsError": "weights",
    "load_weights": "weights",
    "save_weights": "weights",
}
"""Each public name and the module that defines it."""

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'elmo_model' has no attribute {name!r}")
    value = getattr(import_module(f"elmo_model.{_HOMES[name]}"), name)
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
