"""SIT split by prediction and the warm-ups never used (pallas_eval/preparation.py)."""

import math

import pytest

from pallas_eval.preparation import (prediction_lines, sit_by_prediction, ue_hours, wasted_preparation)
from pallas_eval.report import HandoverRow


def _row(sit, lead, outcome, scheme="pallas"):
    return HandoverRow(scheme=scheme, ue_id="u", time_s=0.0, from_cell=1, to_cell=2, sit_s=sit, lead_s=lead,
                       outcome=outcome)


def test_sit_split_by_whether_the_target_was_named_ahead():
    rows = [_row(0.1, 2.0, "commit"), _row(0.2, 0.5, "fallback:ctho"), _row(0.5, float("nan"), "fallback:ctho"),
            _row(0.7, 0.0, "fallback:ctho"), _row(float("nan"), 3.0, "no-session"), _row(9.0, 1.0, "commit", "ctho")]
    sp = sit_by_prediction(rows, "pallas")
    assert sp["predicted"]["n"] == 2 and sp["predicted"]["prepared"] == 1
    assert math.isclose(sp["predicted"]["mean_s"], 0.15)
    assert sp["unpredicted"]["n"] == 2 and sp["unpredicted"]["prepared"] == 0
    assert math.isclose(sp["unpredicted"]["mean_s"], 0.6)
    assert sp["predicted"]["ci_lo_s"] <= 0.15 <= sp["predicted"]["ci_hi_s"]
    # summary.json's dicts work as the rows do.
    assert sit_by_prediction([vars(r) for r in rows], "pallas") == sp


def _trig(s, ep, t, target, l_hist=320, r_p=1850.0, r_d=25.0, s_kv=262144.0):
    return {"kind": "trigger", "session": s, "epoch": ep, "trace_t": t, "target_agent": target, "l_hist": l_hist,
            "r_p": r_p, "r_d": r_d, "s_kv": s_kv}


def test_unused_warm_ups_and_what_they_held():
    ev = [_trig("a", 1, 10.0, "edge-1"),                        # used: prepared commit to edge-1
          {"kind": "commit", "session": "a", "epoch": 1, "trace_t": 12.0, "prepared": True, "target_agent": "edge-1"},
          _trig("b", 1, 20.0, "edge-2"),                        # cancelled after 4 s
          {"kind": "cancel", "session": "b", "epoch": 1, "trace_t": 24.0},
          _trig("c", 2, 30.0, "edge-1"),                        # the UE went elsewhere: commit to edge-2 at 33 s
          {"kind": "commit", "session": "c", "epoch": 2, "trace_t": 33.0, "prepared": False, "target_agent": "edge-2"},
          _trig("d", 1, 40.0, "edge-0", r_p=0.0)]               # held to the run's end (50 s); no r_p
    w = wasted_preparation(ev, ue_hours=0.5, end_t=50.0)
    assert (w.count, w.triggers) == (3, 4)
    assert math.isclose(w.held_s, 4.0 + 3.0 + 10.0)
    assert math.isnan(w.prefill_gpu_s)                     # one trigger carried no prefill rate
    assert math.isclose(w.bytes_streamed, 262144.0 * 25.0 * 17.0)
    vram = sum(262144.0 * (320 * dt + 25.0 * dt * dt / 2) for dt in (4.0, 3.0, 10.0)) / 2 ** 30
    assert math.isclose(w.vram_gib_s, vram)
    assert math.isclose(w.per_hour()["count"], 6.0)
    w2 = wasted_preparation(ev[:4], ue_hours=1.0, end_t=50.0)
    assert math.isclose(w2.prefill_gpu_s, 320 / 1850.0)
    lines = prediction_lines(sit_by_prediction([_row(0.1, 2.0, "commit")], "pallas"), w2, "pallas")
    assert "predicted 1 (prepared 1)" in lines[0] and "never used 1 of 2" in lines[1]


def test_a_targeted_cancel_of_another_target_does_not_end_the_kept_warm_up():
    """A Cancel naming another target of the epoch (issue 45: an extra withdrawn) leaves the
    epoch's warm-up held; one naming its target ends it."""
    ev = [_trig("b", 1, 20.0, "edge-2"),
          {"kind": "cancel", "session": "b", "epoch": 1, "trace_t": 22.0, "only_target": True,
           "target_agent": "edge-3"},
          {"kind": "cancel", "session": "b", "epoch": 1, "trace_t": 25.0, "only_target": True,
           "target_agent": "edge-2"}]
    assert math.isclose(wasted_preparation(ev, ue_hours=1.0, end_t=50.0).held_s, 5.0)


def test_ue_hours_sums_each_ues_span():
    assert math.isclose(ue_hours({"ues": [{"start": 0.0, "end": 1800.0}, {"start": 100.0, "end": 1900.0}]}), 1.0)
    assert ue_hours({}) == 0.0
    assert math.isnan(wasted_preparation([], 0.0).per_hour()["count"])
