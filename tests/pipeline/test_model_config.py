"""The model's config section and its options.json form (pipeline/model_config.py)."""

from __future__ import annotations

import pytest

from elmo_model.options import BiLMOptions
from pipeline.config import preset_names
from pipeline.model_config import ModelConfig, preset_options, to_options


def test_the_default_model_is_the_released_original_one():
    options = to_options(ModelConfig())
    assert options["lstm"] == {"dim": 4096, "projection_dim": 512, "n_layers": 2, "cell_clip": 3,
                               "proj_clip": 3, "use_skip_connections": True}  # fmt: skip
    assert options["char_cnn"]["filters"] == [
        [1, 32],
        [2, 32],
        [3, 64],
        [4, 128],
        [5, 256],
        [6, 512],
        [7, 1024],
    ]
    assert (options["char_cnn"]["n_highway"], options["char_cnn"]["activation"]) == (2, "relu")
    assert BiLMOptions.from_dict(options).num_parameters == 93_600_864  # ELMo's 93.6M
    assert preset_options("original") == options


@pytest.mark.parametrize("name", [n if n != "bilm-tf" else "original,bilm-tf" for n in preset_names()])
def test_every_preset_is_a_model_the_biLM_accepts(name):  # a recipe preset after a size (issue 65, item 7)
    options = BiLMOptions.from_dict(preset_options(name))
    assert options.n_layers >= 1 and options.projection_dim >= 1


def test_the_sizes_grow_from_tiny_to_original():
    sizes = [
        BiLMOptions.from_dict(preset_options(n)).num_parameters
        for n in ("tiny", "small", "medium", "original")
    ]
    assert sizes == sorted(sizes) and len(set(sizes)) == 4
