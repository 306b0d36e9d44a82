"""The embed stage's config rules (pipeline/embed/config.py): each refused in one line naming its
key, whichever way the value came (the CLI tests check the command line's side)."""

from __future__ import annotations

import re

import pytest

from pipeline.config import ConfigError, load_config
from pipeline.embed.config import EmbedConfig, Layout, is_single_file

BASE = ["model=m", "input=[c.txt]", "output=out"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("workers=0", "config key 'workers' must be >= 1, got 0"),
        ("lines_per_shard=0", "config key 'lines_per_shard' must be >= 1"),
        ("batch_tokens=-5", "config key 'batch_tokens' must be >= 0 (0: chosen for the device)"),
        ("gpu_share=1.5", "config key 'gpu_share' must be in (0, 1] or a whole number, got 1.5"),
        ("gpu_share=0", "config key 'gpu_share' must be in (0, 1]"),
        ("cpus_per_worker=0", "config key 'cpus_per_worker' must be > 0"),
        ("readers=-1", "config key 'readers' must be >= 0 (0: the CPUs the actors leave)"),
        ("output=' '", "config key 'output' must be a folder, an s3:// prefix or a .hdf5 file"),
        ("overwrite=true", "config key 'overwrite' must be false for a folder output"),
    ],
)
def test_each_range_rule_names_its_key(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(EmbedConfig, overrides=[*BASE, override])


def test_settings_that_cannot_go_together_are_refused_with_the_way_out():
    with pytest.raises(ConfigError, match="layout=packed writes shards into a folder; .*use layout=allennlp"):
        load_config(EmbedConfig, overrides=[*BASE, "output=v.hdf5", "layout=packed"])
    with pytest.raises(ConfigError, match="stateful mode computes in float32 only"):
        load_config(EmbedConfig, overrides=[*BASE, "stateful=true", "precision=bf16"])
    with pytest.raises(
        ConfigError, match=r"lines_per_shard \(100\) must be a multiple of stateful_batch_size \(64\)"
    ):
        load_config(
            EmbedConfig, overrides=[*BASE, "stateful=true", "lines_per_shard=100", "stateful_batch_size=64"]
        )


def test_what_is_allowed_loads():
    cfg = load_config(EmbedConfig, overrides=[*BASE, "gpu_share=2", "layout=packed", "stateful=true",
                                              "lines_per_shard=128", "stateful_batch_size=64"])  # fmt: skip
    assert cfg.layout is Layout.packed and cfg.gpu_share == 2
    single = load_config(EmbedConfig, overrides=["model=m", "input=[c.txt]", "output=V.H5", "overwrite=true"])
    assert single.overwrite
    assert is_single_file("s3://b/v.hdf5") and not is_single_file("s3://b/v.hdf5.parts")
