"""The time-to-target study's bookkeeping: recipes, crossings in tokens and seconds, the start-up
apart, the baselines it reads or counts, and verdicts that need every seed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.time_to_target import (
    Recipe,
    baselines,
    crossing,
    split_ids,
    startup_seconds,
    target_names,
    trained_tokens,
    verdicts,
)
from pipeline.formats import kneser_ney
from pipeline.formats.shard_manifest import read_manifest

sys.path.insert(0, str(Path(__file__).parents[1] / "pipeline" / "train"))  # the train tests' shard builder
from shard_builder import sample_shard_dir  # noqa: E402


def test_a_recipe_is_a_name_and_its_overrides():
    assert Recipe.parse("cos: optimizer.schedule=cosine dropout=0") == Recipe(
        "cos", ("optimizer.schedule=cosine", "dropout=0")
    )
    assert Recipe.parse("preset:") == Recipe("preset", ())
    assert Recipe.parse("exact@small,bilm-tf: seed=1") == Recipe("exact", ("seed=1",), "small,bilm-tf")
    with pytest.raises(SystemExit, match=r"NAME\[@PRESET\]: key=value"):
        Recipe.parse("dropout=0")


# [step, tokens, train seconds, perplexity]
CURVE = [[10, 1000, 2.0, 400.0], [20, 2000, 4.0, 100.0], [30, 3000, 6.0, 80.0]]


def test_a_target_is_reached_between_evaluations_in_log_perplexity():
    assert crossing(CURVE, 200.0, 1) == pytest.approx(1500.0)  # halfway from 400 to 100 in log
    assert crossing(CURVE, 200.0, 2) == pytest.approx(3.0)
    assert crossing(CURVE, 500.0, 2) == 2.0
    assert crossing(CURVE, 79.0, 1) is None


def test_the_start_up_is_the_first_train_line_less_the_loops_clock():
    lines = [(3.0, "ray dashboard: ..."), (21.5, "train step 20/400 (epoch 0.03) | ..."), (30.0, "eval")]
    assert startup_seconds(lines, [{"time": 1.5}]) == pytest.approx(20.0)
    assert startup_seconds(lines[:1], [{"time": 1.5}]) is None


def test_the_tokens_a_rollback_discarded_count_toward_the_target():
    """Rolled back from step 980 to 900 (80 steps of 1,280 tokens): every later row has trained
    102,400 tokens more than its step says; the rows before it are as logged."""
    rows = [
        {"kind": "eval", "step": 832, "tokens": 1_064_960},
        {"kind": "guard", "step": 980, "tokens": 1_254_400, "to_step": 900, "action": "rollback"},
        {"kind": "eval", "step": 936, "tokens": 1_198_080},
        {"kind": "status", "step": 2094},
    ]
    assert [r.get("tokens") for r in trained_tokens(rows)] == [1_064_960, 1_356_800, 1_300_480, None]
    warned = [{**rows[1], "action": "warn"}]
    del warned[0]["to_step"]  # a warning discards nothing
    assert trained_tokens(warned) == warned


def _runs(name: str, finals: list[float]) -> list[dict]:
    return [
        {
            "recipe": name,
            "seed": seed,
            "final": final,
            "evals": [[10, 1000, 2.0, 500.0], [20, 2000, 4.0, final]],
        }
        for seed, final in enumerate(finals)
    ]


def test_a_difference_is_claimed_only_when_every_seed_holds_it():
    runs = _runs("today", [120.0, 125.0, 130.0]) + _runs("new", [100.0, 105.0, 110.0])
    runs += _runs("mixed", [110.0, 122.0, 140.0])
    said = verdicts(runs, ["today", "new", "mixed"], {"kn3": 115.0})
    assert "new vs today, final perplexity: better over 3 and 3 seeds" in said
    assert "new vs today, tokens to kn3 (115.0): better over 3 and 3 seeds" in said  # today never gets there
    assert "mixed vs today, final perplexity: not separated over 3 and 3 seeds" in said
    worse = verdicts(_runs("today", [100.0, 101.0]) + _runs("new", [102.0, 103.0]), ["today", "new"], {})
    assert worse == ["new vs today, final perplexity: worse over 2 and 2 seeds"]


def test_the_targets_are_the_manifests_model_and_the_orders_counted_here(tmp_path):
    shards = sample_shard_dir(str(tmp_path / "shards"), 700, heldout=100)
    manifest = read_manifest(shards)
    train, heldout = split_ids(manifest, "train"), split_ids(manifest, "heldout")
    assert train[0].shape[0] == int(train[1].sum()) == manifest.totals["train"].tokens
    cache = tmp_path / "baselines.json"
    known = baselines(shards, [2, 3], cache)
    model = kneser_ney.build(kneser_ney.count_ngrams(*train, 3), manifest.vocab.size)
    assert known["kn3"] == pytest.approx(kneser_ney.perplexity(*model.score(*heldout)))
    assert known["unigram"] > known["kn2"] > known["kn3"] > 1
    assert json.loads(cache.read_text()) == pytest.approx(known)  # counted once, kept
    assert target_names(known, [3, 2, 5]) == ["unigram", "kn2", "kn3"]
    assert np.isfinite(list(known.values())).all()
