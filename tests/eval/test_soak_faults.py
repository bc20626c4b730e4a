"""The fault soak's pure parts (pallas_eval.soak_faults): the fault schedule, the classification
of a session's end, the two-holder check."""

from __future__ import annotations

import random
from collections import Counter

from pallas_eval.soak_faults import KILLS, FaultSchedule, classify, decoding_at_once

REF = [5, 6, 7, 8, 9]


def test_a_session_end_is_exact_failed_short_mismatch_or_hung():
    assert classify(REF, REF, 5, True, None) == "exact"
    assert classify(REF + [1], REF, 5, True, None) == "exact"        # past max_tokens ignored
    assert classify(REF[:2], REF, 5, True, "vLLM engine gone") == "failed"
    assert classify([], REF, 5, True, "target refused") == "failed"
    assert classify(REF[:2], REF, 5, True, None) == "short"           # finished short, no reason
    assert classify(REF[:2], REF, 5, True, "") == "short"
    assert classify([5, 6, 1], REF, 5, True, "x") == "mismatch"       # a wrong token wins
    assert classify([5, 6, 7, 8, 1], REF, 5, True, None) == "mismatch"
    assert classify(REF[:3], REF, 5, False, None) == "hung"
    assert classify(REF[:3], REF, 5, False, "late reason") == "hung"


def test_the_schedule_draws_its_share_caps_the_kills_and_spares_a_degraded_soak():
    sch = FaultSchedule(random.Random(1), share=0.25, max_kills=3)
    drawn = [sch.draw(True) for _ in range(4000)]
    faults = [d for d in drawn if d is not None]
    assert 0.22 < len(faults) / len(drawn) < 0.28
    c = Counter(faults)
    assert sum(c[k] for k in KILLS) == 3 == sch.kills
    assert {"bad-block", "target-full", "sync-deadline", "peer-restart"} <= set(c)
    degraded = FaultSchedule(random.Random(2), share=1.0)
    got = {degraded.draw(False) for _ in range(500)}
    assert got and not got & {*KILLS, "peer-restart"} and degraded.kills == 0
    assert FaultSchedule(random.Random(3), share=0.0).draw(True) is None


def test_two_copies_publishing_at_once_are_caught_a_handover_or_a_frozen_source_is_not():
    handover = [("s1", "a", False, 40, 40), ("s1", "b", True, 40, 43)]   # a committing
    frozen = [("s2", "a", False, 40, 40), ("s2", "b", True, 40, 41)]     # failed commit, a frozen
    both = [("s3", "a", True, 50, 52), ("s3", "b", True, 48, 49)]
    idle = [("s4", "a", True, 50, 52), ("s4", "b", True, 49, 49)]         # b resumed, no token yet
    same = [("s5", "a", True, 1, 2), ("s5", "a", True, 0, 3)]             # two copies, one agent
    assert decoding_at_once(handover + frozen + both + idle + same) == {"s3"}
    assert decoding_at_once([]) == set()
