"""The batch study's bookkeeping: the clock at an evaluation between two logged train rows."""

from __future__ import annotations

import pytest

from benchmarks.batch_convergence import learning_rate, seconds_at

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
