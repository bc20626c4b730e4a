"""95% bootstrap intervals of the replay's means and ratios (issue 26 item 3)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pallas_eval.metrics import bootstrap_ci, ratio_ci
from pallas_eval.report import fmt_ms, fmt_ms_ci, ratio_table


def test_bootstrap_ci_covers_the_mean_and_shrinks_with_the_sample():
    rng = np.random.default_rng(5)
    small = rng.normal(0.3, 0.1, 20)
    large = rng.normal(0.3, 0.1, 2000)
    lo_s, hi_s = bootstrap_ci(small)
    lo_l, hi_l = bootstrap_ci(large)
    assert lo_s < small.mean() < hi_s and lo_l < large.mean() < hi_l
    # the normal theory's half width is 1.96 sd / sqrt(n): about 44 ms at n = 20, 4.4 ms at 2,000
    assert (hi_s - lo_s) / 2 == pytest.approx(1.96 * 0.1 / math.sqrt(20), rel=0.35)
    assert (hi_l - lo_l) / 2 == pytest.approx(1.96 * 0.1 / math.sqrt(2000), rel=0.15)
    assert bootstrap_ci(small, seed=3) == bootstrap_ci(small, seed=3)


def test_bootstrap_ci_ignores_nan_and_needs_two_values():
    lo, hi = bootstrap_ci([0.1, float("nan"), 0.3, 0.2])
    assert 0.1 <= lo <= hi <= 0.3
    assert all(math.isnan(v) for v in bootstrap_ci([0.2, float("nan")]))


def test_ratio_ci_of_two_schemes():
    rng = np.random.default_rng(9)
    pallas = rng.normal(0.2, 0.05, 60)
    ctho = rng.normal(0.8, 0.2, 60)
    r, lo, hi = ratio_ci(ctho, pallas)
    assert r == pytest.approx(ctho.mean() / pallas.mean())
    assert lo < r < hi and 3.3 < lo and hi < 4.7
    assert all(math.isnan(v) for v in ratio_ci([1.0], pallas))
    assert all(math.isnan(v) for v in ratio_ci(ctho, [0.0, 0.0]))


def test_the_tables_print_the_intervals():
    assert fmt_ms_ci(0.278, (0.231, 0.330)) == "278 [231-330]"
    assert fmt_ms_ci(0.278, (float("nan"), float("nan"))) == "278"
    assert fmt_ms_ci(12.5, [11.25, 14.0]) == "12,500 [11,250-14,000]"   # as summary.json has it
    for no_interval in (None, [None, None], [0.2], "0.2-0.3", 7):
        assert fmt_ms_ci(0.278, no_interval) == "278", no_interval
    t = ratio_table({"pallas": [0.2, 0.25, 0.22], "ctho": [0.8, 0.9, 0.7]}, "pallas")
    assert t is not None and t.row_count == 1
    assert ratio_table({"ctho": [0.8, 0.9]}, "pallas") is None


def test_milliseconds_are_whole_and_grouped_and_a_dash_when_not_a_number():
    assert [fmt_ms(v) for v in (0.278, 0.0004, 12.486, "0.5", 0)] == ["278", "0", "12,486", "500", "0"]
    assert [fmt_ms(v) for v in (None, float("nan"), float("inf"), "n/a", [1])] == ["-"] * 5


def test_first_sessions_are_spread_over_the_start_of_the_drive():
    """Issue 26: the UEs no longer open their first sessions in one instant; the start is fixed
    per (seed, UE), so every scheme's run meets the same load."""
    from pallas_eval.ues import first_session_delay
    d = [first_session_delay(2, f"ue{k}", 5.0) for k in range(200)]
    assert all(0.0 <= x < 5.0 for x in d)
    assert np.std(d) == pytest.approx(5.0 / math.sqrt(12), rel=0.2)       # uniform over [0, 5)
    assert first_session_delay(2, "ue3", 5.0) == first_session_delay(2, "ue3", 5.0)
    assert first_session_delay(2, "ue3", 5.0) != first_session_delay(3, "ue3", 5.0)
    assert first_session_delay(2, "ue3", 0.0) == 0.0
    with pytest.raises(ValueError):
        first_session_delay(2, "ue3", -1.0)


def test_the_spread_knob_reaches_the_replay_options():
    from pallas_eval.cli import build_parser, options_from_args
    a = build_parser().parse_args(["replay", "--first-session-spread-s", "2.5"])
    assert options_from_args(a).first_session_spread_s == 2.5
    assert options_from_args(build_parser().parse_args(["replay"])).first_session_spread_s == 5.0


def test_lead_summary_counts_the_handovers_named_in_time():
    from pallas_eval.report import HandoverRow, lead_summary
    rows = [HandoverRow("pallas", "u", float(k), 1, 2, lead_s=lead, t_ho_error_s=err, outcome=out)
            for k, (lead, err, out) in enumerate([(3.0, 2.0, "commit"), (1.5, -1.0, "commit"),
                                                  (0.4, 4.0, "fallback:ctho"),
                                                  (float("nan"), float("nan"), "fallback:ctho")])]
    rows.append(HandoverRow("ctho", "u", 9.0, 1, 2, lead_s=5.0, outcome="recovered:ctho"))
    line = lead_summary(rows, "pallas")
    assert "named ahead for 3 of 4 handovers" in line
    assert ">= 1 s: 2, >= 2 s: 1" in line and "median lead 1.5 s" in line and "prepared commits 2" in line
    assert "predicted - actual median +2.0 s over 3" in line
    assert lead_summary(rows, "full-copy") == ""


def test_seeds_knob():
    from pallas_eval.cli import build_parser, options_from_args
    assert options_from_args(build_parser().parse_args(["replay", "--seeds", "1,2, 3"])).seeds == (1, 2, 3)
    assert options_from_args(build_parser().parse_args(["replay"])).seeds == ()
    for bad in ("1,x", "2,2"):
        with pytest.raises(SystemExit):
            options_from_args(build_parser().parse_args(["replay", "--seeds", bad]))
