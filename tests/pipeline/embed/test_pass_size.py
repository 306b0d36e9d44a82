"""pipeline.embed.pass_size: the pass size chosen for the device when batch_tokens is 0."""

from __future__ import annotations

import pytest
import torch

from elmo_model.static_inference import OutputSpec, device_bytes_per_position
from pipeline.config import ConfigError, load_config
from pipeline.embed.config import EmbedConfig
from pipeline.embed.pass_size import PassSize, gpu_tokens, pass_size, per_position
from pipeline.model_loader import ModelSource

ORIGINAL = ModelSource("o", "w", "", num_layers=3, output_dim=1024, cell_dim=4096)
TOP_F16 = OutputSpec("top", dtype=torch.float16)


def test_a_cpu_keeps_its_small_passes_and_what_is_set_is_kept():
    assert pass_size(0, 0, "cpu") == PassSize(4096, 256)
    assert pass_size(2048, 64, "cpu") == PassSize(2048, 64)
    assert pass_size(2048, 64, "cuda", free_bytes=80 * 2**30, per_position=1) == PassSize(2048, 64)


def test_a_gpu_pass_is_what_half_its_free_memory_holds_in_rows_of_the_shortest_bucket():
    f32 = per_position(ORIGINAL, "float32", TOP_F16)
    bf16 = per_position(ORIGINAL, "bf16", TOP_F16)
    # original's gates dominate: 2 layers' worth of 2 x 4 x 4096 products per position
    assert 262_144 < f32 < 400_000 and 131_072 < bf16 < f32
    assert pass_size(0, 0, "cuda", 80 * 2**30, f32) == PassSize(131072, 8192)  # an H100: the cap
    assert pass_size(0, 0, "cuda", 20 * 2**30, f32) == PassSize(32768, 2048)
    assert pass_size(0, 0, "cuda", 20 * 2**30, bf16) == PassSize(65536, 4096)
    assert gpu_tokens(2**30, f32) == 8192  # a small GPU: never below the floor
    assert pass_size(0, 512, "cuda", 80 * 2**30, f32) == PassSize(131072, 512)


def test_all_layers_in_float32_need_more_than_the_top_layer_in_float16():
    top = device_bytes_per_position(4096, 512, 2, "float32", TOP_F16)
    every = device_bytes_per_position(4096, 512, 2, "float32", OutputSpec("all"))
    assert every - top == 3 * 1024 * 4 - 1024 * 2


def test_a_negative_pass_size_is_refused():
    base = ["model=m", "input=[x]", "output=o"]
    assert load_config(EmbedConfig, overrides=base).batch_tokens == 0
    with pytest.raises(ConfigError, match=r"'batch_tokens' must be >= 0 \(0: chosen for the device\)"):
        load_config(EmbedConfig, overrides=[*base, "batch_tokens=-5"])
    with pytest.raises(ConfigError, match="'max_batch_sentences' must be >= 0"):
        load_config(EmbedConfig, overrides=[*base, "max_batch_sentences=-1"])
