"""The train stage's config rules (pipeline/train/config.py): each refused in one line naming its
key, whichever way the value came; the presets themselves pass them."""

from __future__ import annotations

import re

import pytest

from pipeline.config import ConfigError, load_config, preset_names
from pipeline.train.config import TrainConfig

BASE = ["shards=s", "output=o"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("batch_size=0", "config key 'batch_size' must be >= 1, got 0"),
        ("unroll_steps=0", "config key 'unroll_steps' must be >= 1"),
        ("keep_checkpoints=0", "config key 'keep_checkpoints' must be >= 1"),
        ("max_steps=-1", "config key 'max_steps' must be in [0, 2**63 - 1] (0: max_tokens or n_epochs)"),
        ("max_tokens=-1", "config key 'max_tokens' must be in [0, 2**63 - 1] (0: n_epochs epochs)"),
        # issue 65, item 11: past int64 a time-budgeted worker failed with an overflow traceback
        ("max_steps=9223372036854775808", "config key 'max_steps' must be in [0, 2**63 - 1]"),
        ("max_tokens=99999999999999999999", "config key 'max_tokens' must be in [0, 2**63 - 1]"),
        ("time_budget=2 hours", "config key 'time_budget' must be a duration such as 90s, 45m, 2h"),
        ("time_budget=0", "config key 'time_budget' must be a duration"),
        (
            "optimizer.weight_decay=0.1",
            "config key 'optimizer.weight_decay' must be a number >= 0, and 0 unless",
        ),
        ("eval_max_batches=-1", "config key 'eval_max_batches' must be >= 0 (0: all)"),
        ("seed=-1", "config key 'seed' must be in [0, 2**63 - 1]"),
        ("dropout=1.0", "config key 'dropout' must be in [0, 1)"),
        ("softmax.negatives=0", "config key 'softmax.negatives' must be >= 1"),
        ("optimizer.lr=0", "config key 'optimizer.lr' must be a number > 0"),
        ("optimizer.lr=inf", "config key 'optimizer.lr' must be a number > 0, got inf"),
        (
            "optimizer.initial_accumulator=-1",
            "config key 'optimizer.initial_accumulator' must be a number > 0",
        ),
        ("optimizer.adam_eps=0", "config key 'optimizer.adam_eps' must be a number > 0"),
        ("optimizer.final_lr_fraction=-3", "config key 'optimizer.final_lr_fraction' must be in [0, 1]"),
        ("optimizer.adam_betas=[2,-1]", "config key 'optimizer.adam_betas' must be two numbers in [0, 1)"),
        ("clip_norm=nan", "config key 'clip_norm' must be a number > 0, got nan"),
        ("softmax.offset_penalty=nan", "config key 'softmax.offset_penalty' must be a number >= 0"),
        ("resources_timeout_s=-1", "config key 'resources_timeout_s' must be a number of seconds > 0"),
        ("guard.factor=1", "config key 'guard.factor' must be a number > 1"),
        ("guard.factor=inf", "config key 'guard.factor' must be a number > 1, got inf"),
        ("name=" + "x" * 300, "config key 'name' must be at most 100 letters, digits, spaces and . _ -"),
        ("name=a/b", "config key 'name' must be at most 100 letters"),
        ("guard.lr_factor=1", "config key 'guard.lr_factor' must be in (0, 1)"),
        ("optimizer.warmup_steps=-3", "config key 'optimizer.warmup_steps' must be >= 0"),
        ("optimizer.adam_betas=[0.9]", "config key 'optimizer.adam_betas' must be two numbers"),
    ],
)
def test_each_range_rule_names_its_key(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(TrainConfig, overrides=[*BASE, override])


def test_config_prints_only_what_the_stage_accepts(capsys):
    """``elmo config train`` runs the same rules as the stage: one validation for both."""
    from jobs.config import main as config_main

    assert config_main(["train", "--preset", "tiny", "optimizer.lr=inf"]) == 2
    assert "config key 'optimizer.lr' must be a number > 0, got inf" in capsys.readouterr().err


@pytest.mark.parametrize("preset", [n if n != "bilm-tf" else "tiny,bilm-tf" for n in preset_names()])
def test_every_preset_passes_the_rules(preset):
    cfg = load_config(TrainConfig, overrides=BASE, preset=preset)  # a recipe after a size
    assert cfg.batch_size >= 1 and cfg.optimizer.lr > 0


def test_a_recipe_preset_after_a_size_is_bilm_tfs_recipe_on_that_model():
    size = load_config(TrainConfig, overrides=BASE, preset="original")
    cfg = load_config(TrainConfig, overrides=BASE, preset="original,bilm-tf")
    assert cfg.model == size.model and cfg.optimizer.name.value == "adagrad" and cfg.optimizer.lr == 0.2
    assert cfg.optimizer.lr_rule.value == "as_given" and cfg.softmax.offset_penalty == 0.0
    assert cfg.softmax.negatives == 8192 and cfg.optimizer.schedule.value == "constant"
    # a key=value still wins over both files
    assert (
        load_config(TrainConfig, overrides=[*BASE, "optimizer.lr=0.1"], preset="small,bilm-tf").optimizer.lr
        == 0.1
    )
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        load_config(TrainConfig, overrides=BASE, preset="small,nope")


def test_an_empty_value_is_the_empty_string_where_the_key_documents_it():
    """Issue 65, item 13: ``time_budget=`` and ``wandb.entity=`` were refused with a type message."""
    cfg = load_config(TrainConfig, overrides=[*BASE, "time_budget=", "wandb.entity="])
    assert (cfg.time_budget, cfg.wandb.entity) == ("", "")
    with pytest.raises(ConfigError, match="bad value for config key 'workers'"):
        load_config(TrainConfig, overrides=[*BASE, "workers="])


@pytest.mark.parametrize("preset", ["tiny,original", "bilm-tf,small", "bilm-tf", "small,small"])
def test_a_preset_is_one_size_then_recipes(preset):
    """Issue 65, item 7: ``tiny,original`` gave the 93.6M model tiny's schedule; ``bilm-tf,small``
    dropped bilm-tf's recipe without a word."""
    with pytest.raises(
        ConfigError, match=rf"--preset '{preset}' must name one model size first, then recipes only"
    ):
        load_config(TrainConfig, overrides=BASE, preset=preset)
    assert (
        load_config(TrainConfig, overrides=BASE, preset="original,bilm-tf").optimizer.name.value == "adagrad"
    )


def test_a_preset_is_a_name_never_a_path():
    with pytest.raises(ConfigError, match=r"unknown preset '../../x'; known presets: bilm-tf, medium"):
        load_config(TrainConfig, overrides=BASE, preset="../../x")
