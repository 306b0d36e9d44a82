"""The batch study's bookkeeping: the clock at an evaluation between two logged train rows."""

from __future__ import annotations

import pytest

from benchmarks.batch_convergence import default_targets, diverged, fastest, learning_rate, seconds_at

# the H200 run of batch 512 (2026-11-27): train rows every 19 steps, evaluations every 97
LOGGED = [(0, 0.0), (19, 1.9), (95, 5.7), (114, 6.1), (969, 42.7), (976, 43.2)]


def test_an_evaluation_between_log_rows_gets_the_interpolated_clock():
    assert seconds_at(95, LOGGED) == 5.7
    assert seconds_at(97, LOGGED) == pytest.approx(5.7 + 2 / 19 * 0.4)
    assert seconds_at(970, LOGGED) == pytest.approx(42.7 + 0.5 / 7)
    assert seconds_at(976, LOGGED) == 43.2


def test_steps_outside_the_logged_ones_have_no_clock():
    assert seconds_at(977, LOGGED) is None
    assert seconds_at(5, []) is None


def test_the_learning_rate_rules_scale_from_bilm_tfs_384_rows():
    assert learning_rate(0.2, 384, "sqrt") == pytest.approx(0.2)
    assert learning_rate(0.2, 1536, "sqrt") == pytest.approx(0.4)
    assert learning_rate(0.2, 1536, "linear") == pytest.approx(0.8)


def _run(batch, rule, evals):
    return {"batch": batch, "rule": rule, "lr": 0.1, "evals": evals}


# the H200 study of 2026-11-28 at 10M positions, shortened: (step, tokens, seconds, perplexity)
R128 = _run(
    128,
    "sqrt",
    [(390, 998_400, 10.6, 3282.7), (1560, 3_993_600, 33.0, 1129.5), (3906, 9_999_360, 76.6, 609.5)],
)
R2048 = _run(
    2048,
    "sqrt",
    [(24, 983_040, 5.4, 96831.9), (216, 8_847_360, 31.2, 3854.2), (244, 9_994_240, 35.7, 3203.4)],
)
LINEAR = _run(2048, "linear", [(24, 983_040, 4.8, 457662.1), (244, 9_994_240, 33.5, 1729396.5)])


def test_a_diverged_run_sets_no_target():
    assert diverged(LINEAR) and not diverged(R128) and not diverged(R2048)
    assert default_targets([R128, R2048, LINEAR]) == pytest.approx([3203.4 * 1.2, 3203.4])
    assert diverged(_run(128, "sqrt", [(1, 1, 1.0, 900.0), (2, 2, 2.0, float("nan"))]))


def test_the_fastest_run_to_a_target_is_named_by_its_seconds():
    assert fastest([R128, R2048, LINEAR], 3203.4 * 1.2)["batch"] == 128  # 10.6 s against 31.2 s
    assert fastest([R2048, LINEAR], 500.0) is None
