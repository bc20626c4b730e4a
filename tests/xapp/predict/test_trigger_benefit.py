"""The expected-benefit trigger rule (xapp/scheduler/benefit.py, docs/model.md §4.2)."""

from __future__ import annotations

import numpy as np
import pytest

from pallas_common import timing
from xapp.scheduler.benefit import expected_benefit, fallback_sit, worth_preparing


def test_expected_benefit_is_the_written_rule():
    # p 0.6, SIT 0.5 s by ctHO against 0.1 s prepared, 900 tokens prefilled at 1,800 tokens/s
    got = expected_benefit(0.6, 0.5, 0.1, 900.0, 1800.0, 2.0)
    assert got == pytest.approx(0.6 * 0.4 - 0.4 * 2.0 * 0.5)
    # arrays broadcast, one value per UE
    p = np.array([0.0, 0.25, 1.0])
    assert expected_benefit(p, 0.5, 0.1, 900.0, 1800.0, 1.0) == pytest.approx([-0.5, 0.25 * 0.4 - 0.75 * 0.5, 0.4])


def test_probability_is_clipped_and_nan_counts_as_zero():
    assert expected_benefit(np.array([1.7, -0.2, np.nan]), 1.0, 0.0, 100.0, 100.0, 1.0) == pytest.approx(
        [1.0, -1.0, -1.0])


def test_worth_preparing_weighs_probability_against_the_wasted_warmup():
    # break-even p* = lam w / (saved + lam w) = 1 * 0.5 / (0.4 + 0.5) = 5/9
    p = np.array([0.5, 5 / 9 + 1e-9, 0.9])
    assert worth_preparing(p, 0.5, 0.1, 900.0, 1800.0, 1.0).tolist() == [False, True, True]
    # a larger warm-up cost weight asks for more certainty
    assert worth_preparing(p, 0.5, 0.1, 900.0, 1800.0, 10.0).tolist() == [False, False, False]
    # a certain target is always worth it when preparing saves anything
    assert worth_preparing(1.0, 0.5, 0.1, 900.0, 1800.0, 100.0)
    # preparing that saves nothing is never worth a possible waste
    assert not worth_preparing(0.99, 0.1, 0.2, 900.0, 1800.0, 0.1)


def test_weight_zero_keeps_eq9_rule_alone():
    out = worth_preparing(np.array([0.0, 0.3]), np.array([0.1, 0.1]), np.array([0.5, 0.5]), 900.0, 1800.0, 0.0)
    assert out.dtype == bool and out.tolist() == [True, True]


@pytest.mark.parametrize("lam", [-1.0, float("nan"), float("inf")])
def test_bad_weight_is_a_clear_error(lam):
    with pytest.raises(ValueError, match="warmup_cost_weight"):
        expected_benefit(0.5, 1.0, 0.0, 1.0, 1.0, lam)


def test_fallback_sit_is_ctho_or_recomputation():
    args = (np.array([2048.0]), 16.0, 1800.0, 131072.0, timing.mbit_per_s(300.0), 0.05)
    assert fallback_sit(*args) == pytest.approx(timing.sit_ctho(*args))
    assert fallback_sit(*args, recompute=True) == pytest.approx(0.05 + 2048.0 / 1800.0)
