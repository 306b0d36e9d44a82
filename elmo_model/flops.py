"""Model FLOPs of the biLM, counted once for the benchmarks and the trainer's MFU.

Every count is 2 x the multiply-adds of the matrix products (the char CNN counted as one product per
filter width over its valid windows); elementwise work is not counted. ``options``: a `BiLMOptions`
or an options.json dict.
"""

from __future__ import annotations

from elmo_model.characters import MAX_CHARACTERS_PER_TOKEN
from elmo_model.options import BiLMOptions


def _opts(options: BiLMOptions | dict) -> BiLMOptions:
    return options if isinstance(options, BiLMOptions) else BiLMOptions.from_dict(options)


def encoder_flops(options: BiLMOptions | dict) -> int:
    """Forward FLOPs of one token through the char CNN, the highway layers and the projection."""
    o = _opts(options)
    chars = MAX_CHARACTERS_PER_TOKEN
    conv = sum(2 * (chars - width + 1) * width * o.char_embed_dim * count for width, count in o.filters)
    highway = o.n_highway * 2 * o.n_filters * 2 * o.n_filters
    projection = 2 * o.n_filters * o.projection_dim if o.n_filters != o.projection_dim else 0
    return conv + highway + projection


def lstm_flops(options: BiLMOptions | dict) -> int:
    """Forward FLOPs of one position of one direction through every LSTM layer (gates + projection)."""
    o = _opts(options)
    return o.n_layers * (2 * (o.projection_dim + o.projection_dim) * 4 * o.dim + 2 * o.dim * o.projection_dim)


def first_input_flops(options: BiLMOptions | dict) -> int:
    """Of `lstm_flops`, layer 0's input products (its inputs are token vectors, so they can be
    computed once per distinct token)."""
    o = _opts(options)
    return 2 * o.projection_dim * 4 * o.dim


def train_step_flops(options: BiLMOptions | dict, softmax_columns: int, positions: int, distinct: int) -> int:
    """Training FLOPs (forward + backward = 3 x forward) of one step.

    ``positions``: the step's token positions over both streams (2 x B x U); ``distinct``: the
    distinct spellings the token encoder ran on (training encodes each spelling of a batch once,
    docs/training.md#network-in-training). Every position runs one direction's LSTM and scores
    ``softmax_columns`` classes (S + 1 sampled, or V for the full softmax).
    """
    o = _opts(options)
    per_position = lstm_flops(o) + 2 * o.projection_dim * softmax_columns
    return 3 * (distinct * encoder_flops(o) + positions * per_position)
