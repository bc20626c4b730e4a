"""The ITL a UE sees after its session's first handover (pallas_eval/metrics.py post_handover_itls)."""

import math

import numpy as np

from pallas_eval.metrics import (Handover, HandoverSIT, SessionRecord, itl_line, itl_stats, post_handover_itls,
                                 sit_for_handover)


def _session(sid: str, times: list[float], ue: str = "ue1") -> SessionRecord:
    return SessionRecord(ue_id=ue, session_id=sid, prompt_tokens=8, max_tokens=len(times), start=0.0,
                         times=list(times), token_ids=list(range(len(times))))


def test_gaps_after_the_first_handover_without_the_handovers_own_gap():
    s = _session("a", [0.0, 0.05, 0.10, 0.40, 0.45, 0.52, 0.90, 0.94])
    hos = [Handover("ue1", 0.2, 1, 2), Handover("ue1", 0.6, 2, 3)]
    sits = [sit_for_handover(h, [s]) for h in hos]
    assert [round(h.sit, 2) for h in sits] == [0.30, 0.38]
    got = post_handover_itls([s], sits)
    # 0.40->0.45 and 0.45->0.52 after the first HO, 0.90->0.94 after the second; the two SIT gaps out.
    assert np.allclose(got, [0.05, 0.07, 0.04])


def test_sessions_never_in_flight_across_a_handover_give_nothing():
    a = _session("a", [0.0, 0.05, 0.10])
    b = _session("b", [1.0, 1.2, 1.25], ue="ue2")
    sits = [sit_for_handover(Handover("ue2", 1.1, 1, 2), [a, b])]
    assert sits[0].session_id == "b"
    assert np.allclose(post_handover_itls([a, b], sits), [0.05])
    idle = HandoverSIT(Handover("ue1", 5.0, 1, 2))          # no session in flight: NaN SIT
    assert post_handover_itls([a], [idle]).size == 0


def test_stats_and_line_count_the_share_over_the_slo():
    g = np.array([0.04, 0.05, 0.15, 0.06])
    st = itl_stats(g)
    assert st["n"] == 4 and math.isclose(st["over_slo"], 0.25) and math.isclose(st["mean_s"], 0.075)
    assert "n 4" in itl_line("detour", g) and ">100 ms 25.0%" in itl_line("detour", g)
    assert math.isnan(itl_stats(np.zeros(0))["p99_s"]) and itl_line("x", np.zeros(0)) == "x: no gaps"
