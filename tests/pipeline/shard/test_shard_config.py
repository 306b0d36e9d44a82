"""The shard stage's config rules (pipeline/shard/config.py): each refused in one line naming its key."""

from __future__ import annotations

import re

import pytest

from pipeline.config import ConfigError, load_config
from pipeline.shard.config import ShardConfig, TokenizerName

BASE = ["input=[c.txt]", "output=o"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("heldout_fraction=1.0", "config key 'heldout_fraction' must be in [0, 1), got 1.0"),
        ("min_count=0", "config key 'min_count' must be >= 1"),
        ("max_size=2", "config key 'max_size' must be 0 (no limit) or >= 3 (the specials)"),
        ("shard_tokens=0", "config key 'shard_tokens' must be >= 1"),
        ("max_line_bytes=-1", "config key 'max_line_bytes' must be >= 0"),
        ("workers=-1", "config key 'workers' must be >= 0"),
        ("seed=-2", "config key 'seed' must be in [0, 2**63 - 1]"),
        ("input=[]", "config key 'input' must be at least one path"),
        ("output=''", "config key 'output' must be a directory or s3:// prefix"),
    ],
)
def test_each_range_rule_names_its_key(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(ShardConfig, overrides=[*BASE, override])


def test_the_tokenizer_is_a_choice_and_the_defaults_pass():
    cfg = load_config(ShardConfig, overrides=[*BASE, "tokenizer=moses", "max_size=3"])
    assert cfg.tokenizer is TokenizerName.moses and cfg.max_size == 3
    with pytest.raises(ConfigError, match="tokenizer"):
        load_config(ShardConfig, overrides=[*BASE, "tokenizer=spacy"])


def test_a_language_the_moses_rules_do_not_know_is_refused_not_silently_ignored():
    assert load_config(ShardConfig, overrides=[*BASE, "tokenizer=moses", "moses_lang=de"]).moses_lang == "de"
    with pytest.raises(
        ConfigError,
        match=r"config key 'moses_lang' must be a language the Moses rules know \(.*en.*\), got 'zz'",
    ):
        load_config(ShardConfig, overrides=[*BASE, "tokenizer=moses", "moses_lang=zz"])
    load_config(ShardConfig, overrides=[*BASE, "moses_lang=zz"])  # whitespace tokenizer: not used


def test_an_arpa_file_without_a_model_to_write_is_refused():
    from pipeline.config import ConfigError, resolve_config
    from pipeline.shard.config import ShardConfig

    with pytest.raises(
        ConfigError, match=r"config key 'kneser_ney_arpa' must be false when kneser_ney_orders=\[\]"
    ):
        resolve_config(
            ShardConfig, overrides=["kneser_ney_orders=[]", "kneser_ney_arpa=true"], allow_missing=True
        )


@pytest.mark.parametrize("orders", ["[1]", "[3,6]", "[3,3]"])
def test_kneser_ney_orders_are_distinct_and_in_range(orders):
    with pytest.raises(
        ConfigError, match=r"config key 'kneser_ney_orders' must be distinct orders in 2..5 \(\[\] turns"
    ):
        load_config(ShardConfig, overrides=[*BASE, f"kneser_ney_orders={orders}"])
    assert load_config(ShardConfig, overrides=[*BASE, "kneser_ney_orders=[5,3]"]).kneser_ney_orders == [5, 3]


def test_the_old_single_order_key_is_named_with_its_successor():
    with pytest.raises(
        ConfigError, match="unknown config key 'kneser_ney_order'.*did you mean 'kneser_ney_orders'"
    ):
        load_config(ShardConfig, overrides=[*BASE, "kneser_ney_order=5"])


def test_the_default_vocabulary_leaves_rare_words_to_unk():
    """docs/training.md#the-vocabulary: the 1B Word Benchmark's count >= 3 is the default."""
    assert load_config(ShardConfig, overrides=BASE).min_count == 3
