"""The paper's budget on paper: the crossing of a curve, the ratios to the recipe run, the interpolations
and the wall time they give."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.paper_budget import (
    budget_row,
    log_interpolate,
    main,
    step_table,
    token_ratios,
    tokens_to_reach,
)


def run(batch: int, rule: str, curve: list[tuple[int, float]]) -> dict:
    """A curves.json run: ``curve`` as (tokens, perplexity) evaluations."""
    evals = [[i + 1, tokens, float(i), ppl] for i, (tokens, ppl) in enumerate(curve)]
    return {"batch": batch, "rule": rule, "lr": 0.1, "steps": len(curve), "wall_s": 1.0, "evals": evals}


RUNS = [
    run(128, "sqrt", [(500, 400.0), (1000, 100.0)]),
    run(512, "sqrt", [(1000, 200.0), (2000, 50.0)]),
    run(2048, "sqrt", [(2000, 400.0), (4000, 100.0), (6000, 90.0)]),
    run(2048, "linear", [(2000, 900.0), (6000, 300.0)]),
]


def test_tokens_to_reach_interpolates_in_log_perplexity():
    evals = RUNS[0]["evals"]
    assert tokens_to_reach(evals, 200.0) == pytest.approx(750.0)  # 200 is halfway from 400 to 100 in log
    assert tokens_to_reach(evals, 500.0) == 500.0  # the first evaluation is already there
    assert tokens_to_reach(evals, 100.0) == 1000.0
    assert tokens_to_reach(evals, 99.0) is None


def test_ratios_against_the_recipe_run_per_rule():
    # target 100: the recipe run reaches it at 1,000 tokens, 512 at 1,500 (halfway from 200 to 50 in
    # log), 2048 at 4,000; the linear run never does
    assert token_ratios(RUNS, 100.0, "sqrt") == pytest.approx({128: 1.0, 512: 1.5, 2048: 4.0})
    assert token_ratios(RUNS, 100.0, "linear") == {128: 1.0, 2048: None}
    with pytest.raises(SystemExit, match="never reaches 50.0"):
        token_ratios(RUNS, 50.0, "sqrt")


def test_log_interpolation_stays_within_the_measured_range():
    points = {512: 1.5, 2048: 4.0, 8192: None}
    assert log_interpolate(points, 1024, log_y=True) == pytest.approx(math.sqrt(1.5 * 4.0))
    assert log_interpolate(points, 1024, log_y=False) == pytest.approx(2.75)
    assert log_interpolate(points, 2048, log_y=True) == 4.0
    assert log_interpolate(points, 256, log_y=True) is None
    assert log_interpolate(points, 4096, log_y=True) is None  # next to a run that never got there
    assert log_interpolate(points, 16384, log_y=True) is None


def plan(**changes):
    import argparse

    values = dict(gpus=8, epochs=10, tokens=800_000_000, gbs=450.0, unroll=20, negatives=8192, vocab=793_471)
    return argparse.Namespace(**{**values, **changes})


def test_wall_time_of_ten_epochs_on_eight_gpus():
    ratios = token_ratios(RUNS, 100.0, "sqrt")
    tokens_s, _ = step_table("")
    row = budget_row(plan(), 128, ratios, tokens_s)
    # 8 x 128 rows = a global batch of 1,024: between the study's 512 (1.5x) and 2048 (4x)
    assert row["global"] == 1024 and row["ratio"] == pytest.approx(math.sqrt(6.0))
    assert row["tokens_s"] == 310_675
    assert 0.94 < row["efficiency"] < 0.96  # docs/benchmarks.md: 95% at 128 rows over NVLink
    hours = 10 * 800e6 * 2 / (8 * 310_675 * row["efficiency"]) / 3600
    assert row["throughput_h"] == pytest.approx(hours) and 1.8 < hours < 2.0
    assert row["wall_h"] == pytest.approx(hours * math.sqrt(6.0))
    beyond = budget_row(plan(), 512, ratios, tokens_s)  # a global 4,096: beyond the study
    assert beyond["ratio"] is None and "wall_h" not in beyond and beyond["throughput_h"] > 0
    between = budget_row(plan(), 256, ratios, tokens_s)
    assert 310_675 < between["tokens_s"] < 486_867
    assert between["ratio"] == pytest.approx(4.0) and between["wall_h"] == pytest.approx(
        4.0 * between["throughput_h"]
    )


def test_the_step_table_from_train_step_json(tmp_path):
    path = tmp_path / "train_step.json"
    rows = [
        {"preset": "original", "dtype": "bf16", "mode": "graph", "batch": 128, "tokens_s": 400_000.0},
        {"preset": "original", "dtype": "float32", "mode": "graph", "batch": 128, "tokens_s": 100_000.0},
        {"preset": "small", "dtype": "bf16", "mode": "graph", "batch": 128, "tokens_s": 900_000.0},
    ]
    path.write_text(json.dumps({"device": "NVIDIA H200", "rows": rows}))
    assert step_table(str(path)) == ({128: 400_000.0}, f"NVIDIA H200 ({path})")
    path.write_text(json.dumps({"device": "x", "rows": rows[1:]}))
    with pytest.raises(SystemExit, match="no original bf16 graph rows"):
        step_table(str(path))


def test_the_table(tmp_path, capsys):
    curves = tmp_path / "curves.json"
    curves.write_text(json.dumps(RUNS))
    assert main(["--curves", str(curves), "--per-gpu", "128,256,512", "--target", "100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "perplexity of 100.0 against the study's batch 128" in lines[0]
    assert lines[3].startswith("| 128 | 1,024 | 310,675 | 95% | 2.45x |")
    assert lines[4].startswith("| 256 | 2,048 |") and "| 4.00x |" in lines[4]
    assert "| not studied (the study ran 128-2,048) |" in lines[5] and lines[5].endswith("| - |")
