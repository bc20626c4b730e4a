"""The fault soak's pure parts (pallas_eval.soak_faults): the fault schedule, the classification
of a session's end, the two-holder check."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pallas_eval.soak_faults import (KILLS, FaultSchedule, classify, decoding_at_once,
                                     lease_report, plan_targets)

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


def test_a_multi_target_hop_prepares_k_distinct_targets_and_commits_mostly_at_rank_0():
    rng, others = random.Random(4), ["a", "b", "c", "d"]
    plans = [plan_targets(rng, others, 3, p_first=0.6, p_unprepared=0.1) for _ in range(4000)]
    ranks = Counter(p.rank for p in plans)
    for p in plans:
        assert len(p.prepared) == 3 == len(set(p.prepared)) and set(p.prepared) <= set(others)
        assert p.commit in others and p.commit not in p.released
        assert len(p.released) == (3 if p.rank is None else 2)
    assert 0.08 < ranks[None] / 4000 < 0.12                      # unprepared: all released
    assert 0.6 * 0.9 * 0.93 < ranks[0] / 4000 < 0.6 * 0.9 * 1.07
    assert abs(ranks[1] - ranks[2]) < 0.15 * ranks[1]            # the other ranks uniformly
    assert {p.prepared[0] for p in plans} == set(others)         # every agent gets rank 0


def test_a_multi_target_hop_with_few_agents_prepares_what_there_is():
    rng = random.Random(5)
    solo = plan_targets(rng, ["a"], 2, p_unprepared=1.0)      # one agent up: no fallback possible
    assert solo.prepared == ("a",) and solo.commit == "a" and solo.rank == 0
    two = [plan_targets(rng, ["a", "b"], 2, p_unprepared=0.0, p_first=0.0) for _ in range(50)]
    assert all(p.rank == 1 and len(p.prepared) == 2 for p in two)   # p_first takes effect
    fb = plan_targets(rng, ["a", "b"], 2, unprepared=True)    # K-1 prepared, the other reached
    assert len(fb.prepared) == 1 and fb.rank is None and fb.released == fb.prepared
    one = plan_targets(rng, ["a", "b", "c"], 1, unprepared=False)
    assert len(one.prepared) == 1 and one.commit == one.prepared[0]
    for bad in ({"k": 0}, {"k": 2, "p_first": 1.5}, {"k": 2, "p_unprepared": -0.1}):
        with pytest.raises(ValueError):
            plan_targets(rng, ["a", "b"], **bad)
    with pytest.raises(ValueError):
        plan_targets(rng, [], 2)


def test_the_lease_report_counts_the_run_and_finds_a_lease_that_never_ended():
    before = {"granted": 5, "renewed": 2, "released": 5}
    after = {"granted": 15, "renewed": 40, "committed": 4, "released": 9, "expired": 1,
             "evicted": 1}
    r = lease_report(before, after, 0)
    assert r == {"granted": 10, "renewed": 38, "committed": 4, "released": 4, "expired": 1,
                 "evicted": 1, "held_end": 0, "balanced": True}
    assert lease_report(before, after, 1)["balanced"] is False     # one held too many
    assert lease_report(before, {**after, "granted": 16}, 0)["balanced"] is False  # one lost
    assert lease_report(before, {**after, "granted": 16}, 1)["balanced"] is True   # still held
