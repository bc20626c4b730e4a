"""The expected-cost choice of up to K targets (xapp/scheduler/targets.py; docs/model.md §4.1)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pallas_common import timing
from xapp.scheduler.targets import Candidate, Level, PrepBudget, choose_targets

# Qwen3-32B behind 300 Mbit/s (docs/model.md §1): a suffix stream takes r_d s_kv / B = 17.5%
# of a link; the unprepared fallback (ctHO) costs about 0.64 s, a prepared target about 0.1 s.
B = timing.mbit_per_s(300.0)
SESSION = dict(k_curr=1024, t_remain=3.0, block_size=16, r_d=25.0, s_kv=262144.0, c_sync=0.05)
SHARE = 25.0 * 262144.0 / B


def split_pair(pa: float = 0.5, pb: float = 0.4) -> list[Candidate]:
    return [Candidate("a", pa, 1850.0, B), Candidate("b", pb, 1850.0, B)]


def levels(choice) -> dict[str, Level]:
    return {t.target: t.level for t in choice.plans}


def test_k1_is_todays_single_target_with_its_eq9_window():
    got = choose_targets(split_pair(), k_max=1, **SESSION)
    assert levels(got) == {"a": Level.FULL, "b": Level.NONE}
    a = got.plans[0]
    one = timing.decide(timing.WindowInputs(r_p=1850.0, bandwidth=B, **SESSION))
    assert a.window == pytest.approx(float(one.window[0]))
    assert a.sit_full == pytest.approx(float(one.t_sit[0]))
    assert a.l_hist == pytest.approx(float(one.l_hist[0]))
    # only candidate, certain: the same
    solo = choose_targets([Candidate("a", 1.0, 1850.0, B)], **SESSION)
    assert [t.level for t in solo.plans] == [Level.FULL]
    assert solo.expected_sit == pytest.approx(float(one.t_sit[0]))


def test_a_split_prediction_with_budget_prepares_both_fully():
    got = choose_targets(split_pair(), k_max=2, **SESSION)
    assert levels(got) == {"a": Level.FULL, "b": Level.FULL}
    a, b = got.plans
    rest = max(a.sit_none, b.sit_none)          # sit_elsewhere's default
    assert got.expected_sit == pytest.approx(0.5 * a.sit_full + 0.4 * b.sit_full + 0.1 * rest)
    assert got.expected_sit_none == pytest.approx(0.5 * a.sit_none + 0.4 * b.sit_none + 0.1 * rest)
    assert got.expected_sit < choose_targets(split_pair(), k_max=1, **SESSION).expected_sit
    assert got.costs.backhaul_share == pytest.approx(2 * SHARE)


def test_a_tight_budget_prepares_the_second_prefix_only_or_not_at_all():
    one_stream = PrepBudget(backhaul_share=1.5 * SHARE)
    got = choose_targets(split_pair(), k_max=2, budget=one_stream, **SESSION)
    assert levels(got) == {"a": Level.FULL, "b": Level.PREFIX}
    a, b = got.plans
    assert a.sit_full < b.sit_prefix < b.sit_none
    assert b.costs.backhaul_share == 0 and b.costs.prefill_s > 0
    # the prefill of one prefix only: the second is not prepared at all
    one_prefix = PrepBudget(backhaul_share=1.5 * SHARE, prefill_s=1.5 * a.costs.prefill_s)
    got = choose_targets(split_pair(), k_max=2, budget=one_prefix, **SESSION)
    assert levels(got) == {"a": Level.FULL, "b": Level.NONE}
    # a budget without room for any stream: the most likely gets the prefix
    none = choose_targets(split_pair(), k_max=2, budget=PrepBudget(backhaul_share=0.0), **SESSION)
    assert levels(none) == {"a": Level.PREFIX, "b": Level.PREFIX}
    # KV memory the budget's bound
    kv = choose_targets(split_pair(), k_max=2, budget=PrepBudget(kv_bytes=0.0), **SESSION)
    assert levels(kv) == {"a": Level.NONE, "b": Level.NONE}
    assert kv.expected_sit == pytest.approx(kv.expected_sit_none)


def test_a_candidate_below_the_floor_is_never_prepared():
    cs = split_pair(0.6, 0.04)
    got = choose_targets(cs, k_max=3, p_floor=0.05, **SESSION)
    assert levels(got) == {"a": Level.FULL, "b": Level.NONE}
    assert levels(choose_targets(cs, k_max=3, p_floor=0.0, **SESSION))["b"] == Level.FULL
    low = choose_targets(split_pair(0.03, 0.02), k_max=2, p_floor=0.05, **SESSION)
    assert not low.prepared
    zero = choose_targets(split_pair(0.5, 0.0), k_max=2, **SESSION)   # p = 0: nothing to gain
    assert levels(zero)["b"] == Level.NONE


def test_a_confident_top_candidate_prepares_no_second_target():
    assert levels(choose_targets(split_pair(0.85, 0.1), k_max=2, split=0.8, **SESSION)) == \
        {"a": Level.FULL, "b": Level.NONE}
    assert levels(choose_targets(split_pair(0.75, 0.2), k_max=2, split=0.8, **SESSION)) == \
        {"a": Level.FULL, "b": Level.FULL}


def test_candidates_are_ranked_by_probability_and_k_bounds_the_count():
    cs = [Candidate("c", 0.1, 1850.0, B), Candidate("a", 0.5, 1850.0, B),
          Candidate("b", 0.3, 1850.0, B)]
    got = choose_targets(cs, k_max=2, **SESSION)
    assert [(t.target, t.rank) for t in got.plans] == [("a", 0), ("b", 1), ("c", 2)]
    assert [t.target for t in got.prepared] == ["a", "b"]


def test_a_slow_target_is_worth_less_than_a_fast_one():
    # b's link is so slow that its stream cannot keep up; it is still worth its prefix
    cs = [Candidate("a", 0.5, 1850.0, B), Candidate("b", 0.45, 1850.0, B / 40)]
    got = choose_targets(cs, k_max=2, budget=PrepBudget(backhaul_share=1.0), **SESSION)
    a, b = got.plans
    assert a.level == Level.FULL and b.level == Level.PREFIX
    assert b.costs.backhaul_share == 0


def test_sit_elsewhere_weighs_the_rest_and_moves_no_choice():
    g1 = choose_targets(split_pair(), k_max=2, sit_elsewhere=1.0, **SESSION)
    g2 = choose_targets(split_pair(), k_max=2, sit_elsewhere=3.0, **SESSION)
    assert levels(g1) == levels(g2)
    assert g2.expected_sit - g1.expected_sit == pytest.approx(0.1 * 2.0)
    empty = choose_targets([], k_max=2, sit_elsewhere=0.7, **SESSION)
    assert empty.plans == () and empty.expected_sit == 0.7


@pytest.mark.parametrize("bad, match", [
    (dict(candidates=split_pair(1.2, 0.0)), "<= 1"),
    (dict(candidates=split_pair(0.7, 0.6)), "sum to"),
    (dict(candidates=split_pair(), k_max=0), "k_max"),
    (dict(candidates=[Candidate("a", 0.5, 0.0, B)]), "r_p"),
    (dict(candidates=split_pair(), p_floor=math.nan), "p_floor"),
])
def test_bad_input_is_one_clear_error(bad, match):
    args = dict(SESSION, **bad)
    with pytest.raises(ValueError, match=match):
        choose_targets(**args)
    with pytest.raises(ValueError, match="backhaul_share"):
        PrepBudget(backhaul_share=-1.0)


def test_the_enumeration_is_exact_against_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(1, 5))
        p = rng.dirichlet(np.ones(n + 1))[:n]
        cs = [Candidate(f"t{i}", float(p[i]), float(rng.uniform(500, 3000)),
                        float(B * rng.uniform(0.05, 2.0))) for i in range(n)]
        budget = PrepBudget(backhaul_share=float(rng.uniform(0, 1)),
                            prefill_s=float(rng.uniform(0, 2)))
        got = choose_targets(cs, k_max=2, budget=budget, **SESSION)
        plans = got.plans
        best = math.inf
        for lv in np.ndindex(*(3,) * n):
            if sum(1 for v in lv if v) > 2:
                continue
            share = sum(SHARE * B / cs_.bandwidth for cs_, v in zip(sorted(cs, key=lambda c: -c.p), lv) if v == 2)
            pre = sum(t.l_hist / c.r_p for t, c, v in zip(plans, sorted(cs, key=lambda c: -c.p), lv) if v)
            if share > budget.backhaul_share * (1 + 1e-9) or pre > budget.prefill_s * (1 + 1e-9):
                continue
            e = sum(t.p * (t.sit_none, t.sit_prefix, t.sit_full)[v] for t, v in zip(plans, lv))
            best = min(best, e)
        rest = got.expected_sit_none - sum(t.p * t.sit_none for t in plans)
        assert got.expected_sit - rest == pytest.approx(best, abs=1e-9)


# ---- the knobs (descriptor controls.scheduler and the A1 policy type) take effect where read

def test_the_descriptor_knobs_reach_the_choice():
    from xapp.scheduler import SchedulerConfig
    assert levels(choose_targets(split_pair(), **SchedulerConfig().target_choice(), **SESSION)) \
        == {"a": Level.FULL, "b": Level.NONE}                 # defaults: today's single target
    two = SchedulerConfig.from_dict({"targets_k": 2})
    assert levels(choose_targets(split_pair(), **two.target_choice(), **SESSION)) == \
        {"a": Level.FULL, "b": Level.FULL}
    tight = SchedulerConfig.from_dict({"targets_k": 2, "targets_backhaul_share": 1.5 * SHARE})
    assert levels(choose_targets(split_pair(), **tight.target_choice(), **SESSION)) == \
        {"a": Level.FULL, "b": Level.PREFIX}
    no_pre = SchedulerConfig.from_dict({"targets_k": 2, "targets_prefill_s": 0.0})
    assert not choose_targets(split_pair(), **no_pre.target_choice(), **SESSION).prepared
    confident = SchedulerConfig.from_dict({"targets_k": 2, "targets_split": 0.5})
    assert levels(choose_targets(split_pair(), **confident.target_choice(), **SESSION))["b"] == Level.NONE
    floor = SchedulerConfig.from_dict({"targets_k": 2, "targets_p_floor": 0.45})
    assert levels(choose_targets(split_pair(), **floor.target_choice(), **SESSION))["b"] == Level.NONE
    from xapp.scheduler import SchedulerConfigError
    with pytest.raises(SchedulerConfigError, match="targets_k"):
        SchedulerConfig.from_dict({"targets_k": 1.5})


def test_an_a1_instance_sets_k_split_and_budget():
    import json
    from pathlib import Path
    from jsonschema import Draft7Validator
    from xapp.a1 import apply_instance
    from xapp.scheduler import SchedulerConfig
    root = Path(__file__).resolve().parents[3] / "descriptors"
    controls = json.loads((root / "config-file.json").read_text())["controls"]
    ptype = json.loads((root / "policytype-26001.json").read_text())["create_schema"]
    payload = {"targets_k": 2, "targets_split": 0.9, "targets_backhaul_share": 1.5 * SHARE,
               "targets_return_s": 0.0}
    Draft7Validator(ptype).validate(payload)
    cfg = SchedulerConfig.from_dict(apply_instance(controls, payload)["scheduler"])
    assert (cfg.targets_k, cfg.targets_split, cfg.targets_return_s) == (2, 0.9, 0.0)
    assert SchedulerConfig.from_dict(controls["scheduler"]).targets_return_s == 10.0
    assert not Draft7Validator(ptype).is_valid({"targets_return_s": 61})
    assert levels(choose_targets(split_pair(), **cfg.target_choice(), **SESSION)) == \
        {"a": Level.FULL, "b": Level.PREFIX}
    assert SchedulerConfig.from_dict(controls["scheduler"]).targets_k == 1
    assert not Draft7Validator(ptype).is_valid({"targets_k": 9})
