"""wandb's names checked by the config, before any stage runs: what wandb would refuse only when
its run starts (a project), or never (a group), is one line naming the key."""

from __future__ import annotations

import pytest

from pipeline.config import ConfigError, resolve_config
from pipeline.embed.config import EmbedConfig
from pipeline.shard.config import ShardConfig
from pipeline.tracking.config import WandbConfig
from pipeline.train.config import TrainConfig


@pytest.mark.parametrize(
    "key, value",
    [
        ("project", "team/elmo"),
        ("project", "../x y"),
        ("project", "a#b"),
        ("project", ""),
        ("project", "p" * 129),
        ("group", "g" * 300),
        ("group", "a/b"),
        ("group", "a\tb"),
        ("group", "a\nb"),
        ("group", " padded"),
        ("entity", "my team"),
        ("entity", "team/x"),
    ],
)
def test_a_name_wandb_would_refuse_is_refused_in_one_line(key, value):
    with pytest.raises(ConfigError) as err:
        WandbConfig(**{key: value})
    assert str(err.value).startswith(f"config key 'wandb.{key}' must be ") and "\n" not in str(err.value)


def test_every_stage_checks_them_before_it_runs():
    for schema in (TrainConfig, ShardConfig, EmbedConfig):
        with pytest.raises(ConfigError, match="wandb.project"):
            resolve_config(schema, overrides=["wandb.project=team/elmo"], allow_missing=True)


def test_names_wandb_takes_pass():
    WandbConfig(project="elmo-pipeline", group="demo run 2026.11", entity="my-team_1")
    WandbConfig(project="ELMo (small)", group="", entity="")
