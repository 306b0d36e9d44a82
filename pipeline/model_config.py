"""ModelConfig: the biLM architecture as a typed config, in the vocabulary of options.json.

The fields mirror the ``char_cnn`` and ``lstm`` sections of the original options.json (docs/weights.md#optionsjson)
so that a preset reads like the released options files, and ``to_options`` gives exactly the dict
that ``elmo_model.BiLM.from_options`` and the exported options.json use.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Activation(enum.Enum):
    relu = "relu"
    tanh = "tanh"


@dataclass
class CharCNNConfig:
    """Character CNN token encoder (options.json ``char_cnn``)."""

    activation: Activation = Activation.relu
    """Nonlinearity after each filter bank's max-pool: ``relu`` or ``tanh``."""
    embedding_dim: int = 16
    """Character embedding size d_c (options.json ``char_cnn.embedding.dim``)."""
    filters: list[list[int]] = field(
        default_factory=lambda: [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]
    )
    """Convolution banks as ``[width, num_filters]`` pairs; their filter counts sum to F."""
    max_characters_per_token: int = 50
    """Character slots per token (AllenNLP hard-codes 50; keep it)."""
    n_characters: int = 262
    """Rows of the inference character table (261 trained rows + the padding row 0)."""
    n_highway: int = 2
    """Number of highway layers of width F after the CNN."""


@dataclass
class LSTMConfig:
    """Stacked LSTM with projection (options.json ``lstm``)."""

    dim: int = 4096
    """Cell size C."""
    projection_dim: int = 512
    """Projection size P: the LSTM output and token representation size."""
    n_layers: int = 2
    """LSTM layers per direction (>= 2 keeps the HDF5 names readers expect)."""
    cell_clip: float = 3.0
    """Clip the cell state to [-cell_clip, cell_clip]; 0 disables."""
    proj_clip: float = 3.0
    """Clip the projected output to [-proj_clip, proj_clip]; 0 disables."""
    use_skip_connections: bool = True
    """Residual connection around LSTM layers >= 1 (AllenNLP requires true)."""


@dataclass
class ModelConfig:
    """The biLM architecture; defaults are the original 2x4096_512_2048cnn_2xhighway model."""

    char_cnn: CharCNNConfig = field(default_factory=CharCNNConfig)
    """Token encoder: character embedding, CNN, highway layers."""
    lstm: LSTMConfig = field(default_factory=LSTMConfig)
    """Contextual encoder: stacked projected LSTMs per direction."""


def to_options(model: ModelConfig) -> dict:
    """The options.json dict (inference form, docs/weights.md#optionsjson) of a ModelConfig."""
    cnn, lstm = model.char_cnn, model.lstm
    return {
        "char_cnn": {
            "activation": cnn.activation.name,
            "embedding": {"dim": cnn.embedding_dim},
            "filters": [list(f) for f in cnn.filters],
            "max_characters_per_token": cnn.max_characters_per_token,
            "n_characters": cnn.n_characters,
            "n_highway": cnn.n_highway,
        },
        "lstm": {
            "dim": lstm.dim,
            "projection_dim": lstm.projection_dim,
            "n_layers": lstm.n_layers,
            "cell_clip": lstm.cell_clip,
            "proj_clip": lstm.proj_clip,
            "use_skip_connections": lstm.use_skip_connections,
        },
    }


def preset_options(name: str) -> dict:
    """The options.json dict of preset ``name``'s model (``pipeline/presets/<name>.yaml``), e.g. for a
    randomly initialised model of a released size in a benchmark."""
    from omegaconf import OmegaConf

    from pipeline.config import preset_section

    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), preset_section(name, "model"))
    return to_options(OmegaConf.to_object(merged))
