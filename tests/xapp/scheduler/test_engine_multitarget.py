"""The control cycle's extra targets (issue 45; docs/model.md §4.1): with ``targets_k`` K > 1 a
PREPARING session gets a Trigger of the same epoch for each further target
``choose_targets`` picks from its UE's ranked candidates; K = 1 is the single-target cycle."""

import dataclasses

import pytest

from pallas_proto import pallas_pb2
from xapp.scheduler import (CancelAction, CommitAction, InvalidTransition, MigrationState,
                            PreparedTarget, SessionMigration, TriggerAction)

from sched_helpers import server_report
from test_engine import T0, add, make_engine, run_until_trigger

S = MigrationState
PALLAS = pallas_pb2.SCHEME_PALLAS
T_HO = T0 + 8.0
CANDS = [("b", 0.5), ("c", 0.4)]
OK = pallas_pb2.ControlReply(status=pallas_pb2.STATUS_OK)


def k2(cfg, **kw):
    return dataclasses.replace(cfg, targets_k=2, **kw)


def engine(cfg, agents=("a", "b", "c", "d"), **kw):
    eng = make_engine(cfg, agents=agents, **kw)
    add(eng)
    return eng


def predict(eng, target="b", cands=CANDS, t_ho=T_HO):
    return eng.set_predictions(["ue1"], [target], [t_ho], [dict(cands).get(target, 1.0)],
                               candidates=[cands])


def run(eng, start=T0, stop=T_HO):
    return run_until_trigger(eng, start, stop)


def triggered_pair(cfg):
    """An engine whose s1 was triggered at b (rank 0) and c (rank 1); (engine, time, actions)."""
    eng = engine(k2(cfg))
    predict(eng)
    t, acts = run(eng)
    return eng, t, acts


def test_k1_with_candidates_acts_exactly_as_without(cfg):
    runs = []
    for cands in (None, CANDS):
        eng = engine(cfg)
        eng.set_predictions(["ue1"], ["b"], [T_HO], [0.5], candidates=None if cands is None else [cands])
        t, acts = run(eng)
        runs.append((t, acts, eng.on_handover("ue1", "c", T_HO)))
    assert runs[0] == runs[1]
    t, acts, commit = runs[0]
    assert [(a.target, a.rank) for a in acts] == [("b", 0)]
    assert commit[-1].prepared_target is None            # c was never prepared with K = 1


def test_two_candidates_give_two_triggers_of_one_epoch(cfg):
    eng, t, acts = triggered_pair(cfg)
    assert [type(a) for a in acts] == [TriggerAction, TriggerAction]
    assert [(a.target, a.rank, a.epoch, a.source) for a in acts] == [("b", 0, 1, "a"), ("c", 1, 1, "a")]
    assert all(a.scheme == PALLAS and a.predicted_handover_time == T_HO for a in acts)
    extra = acts[1]
    assert extra.window_s > 0 and extra.predicted_split_tokens % 16 == 0
    assert extra.predicted_sit_s is not None and extra.rates.r_p == pytest.approx(2700.0)
    assert extra.to_proto("c:1").rank == 1 and acts[0].to_proto("b:1").rank == 0
    sm = eng.session("s1")
    assert sm.state is S.PREPARING and sm.target == "b"
    assert sm.prepared == {"b": PreparedTarget("b", 0, PALLAS), "c": PreparedTarget("c", 1, PALLAS)}
    assert eng.reserved_at("b") > 0 and eng.reserved_at("c") > 0
    assert eng.cycle(t + 0.1) == []                      # each target is triggered once


def test_handover_to_the_rank1_target_is_a_prepared_commit_and_frees_every_target(cfg):
    eng, t, _ = triggered_pair(cfg)
    acts = eng.on_handover("ue1", "c", T_HO)
    assert acts == [CommitAction("s1", 1, "a", "c", "c", PALLAS, T_HO)]
    sm = eng.session("s1")
    assert sm.state is S.COMMITTED and sm.source == "c" and sm.prepared == {}
    assert eng.reserved_at("b") > 0                      # until the commit's reply
    eng.on_reply(acts[0], OK)
    assert eng.reserved_at("b") == eng.reserved_at("c") == 0


def test_a_new_primary_prediction_cancels_every_target(cfg):
    eng, t, _ = triggered_pair(cfg)
    acts = predict(eng, "d", [("d", 0.6), ("b", 0.3)])
    assert acts == [CancelAction("s1", 1, "a", "b", "target changed")]
    sm = eng.session("s1")
    assert sm.state is S.PLANNED and sm.target == "d" and sm.epoch == 2 and sm.prepared == {}
    assert eng.reserved_at("b") == eng.reserved_at("c") == 0
    eng.ingest_telemetry(server_report("d", t))
    _, acts = run(eng, t + 0.1)
    assert [(a.target, a.rank, a.epoch) for a in acts] == [("d", 0, 2), ("b", 1, 2)]


def test_a_prepared_extra_named_primary_keeps_the_epoch(cfg):
    eng, t, _ = triggered_pair(cfg)
    assert predict(eng, "c", [("c", 0.6), ("b", 0.3)]) == []
    sm = eng.session("s1")
    assert sm.target == "c" and sm.epoch == 1 and set(sm.prepared) == {"b", "c"}
    assert eng.cycle(t + 0.1) == []
    assert eng.on_handover("ue1", "b", T_HO)[0].prepared_target == "b"


def test_admission_refused_at_the_second_target_does_not_block_the_first(cfg):
    eng = engine(k2(cfg))
    predict(eng)
    t, acts = T0, []
    while not acts and t < T_HO:
        for agent in ("b", "c"):                                       # c is full
            eng.ingest_telemetry(server_report(agent, t, free_blocks=10 if agent == "c" else 100_000))
        acts = eng.cycle(t)
        t = round(t + 0.1, 9)
    assert [(a.target, a.rank) for a in acts] == [("b", 0)]
    assert eng.reserved_at("c") == 0
    eng.ingest_telemetry(server_report("c", t))                          # c has room again
    acts = eng.cycle(t)
    assert [(a.target, a.rank, a.epoch) for a in acts] == [("c", 1, 1)]  # later in the window


def test_a_refused_extra_trigger_drops_that_target_alone(cfg):
    eng, t, acts = triggered_pair(cfg)
    refused = pallas_pb2.ControlReply(status=pallas_pb2.STATUS_REJECTED, message="full")
    assert eng.on_reply(acts[1], refused) == []
    sm = eng.session("s1")
    assert sm.state is S.PREPARING and set(sm.prepared) == {"b"}
    assert eng.reserved_at("c") == 0 and eng.reserved_at("b") > 0
    assert eng.cycle(t + 0.1) == []                      # c is not asked again this epoch
    cancel, commit = eng.on_handover("ue1", "c", T_HO)   # a fallback there
    assert cancel == CancelAction("s1", 1, "a", "b", "mispredicted target")
    assert commit.prepared_target is None and commit.scheme == pallas_pb2.SCHEME_CTHO


def test_a_refused_primary_cancels_the_extras_too(cfg):
    eng, t, acts = triggered_pair(cfg)
    refused = pallas_pb2.ControlReply(status=pallas_pb2.STATUS_ERROR, message="boom")
    assert eng.on_reply(acts[0], refused) == [CancelAction("s1", 1, "a", "b", "trigger refused: boom")]
    assert eng.session("s1").prepared == {} and eng.reserved_at("c") == 0


def test_targets_k_set_by_reconfigure_takes_effect(cfg):
    eng = engine(cfg)
    predict(eng)
    t, acts = run(eng)
    assert len(acts) == 1
    eng.reconfigure(k2(cfg))
    predict(eng)                                         # the next prediction brings candidates
    assert [(a.target, a.rank) for a in eng.cycle(t + 0.1)] == [("c", 1)]
    eng.reconfigure(cfg)                                 # back to K = 1: candidates are dropped
    predict(eng, "d", [("d", 0.5), ("b", 0.4)])
    eng.ingest_telemetry(server_report("d", t))
    _, acts = run(eng, t + 0.2)
    assert [a.target for a in acts] == ["d"]


def test_split_and_p_floor_keep_a_single_target(cfg):
    for knobs in ({"targets_split": 0.5}, {"targets_p_floor": 0.45}):
        eng = engine(k2(cfg, **knobs))
        predict(eng)
        _, acts = run(eng)
        assert [a.target for a in acts] == ["b"], knobs


def test_a_tight_backhaul_budget_prepares_the_second_target_prefix_only(cfg):
    share = 30.0 * 163840 / cfg.default_goodput_bytes_per_s   # one suffix stream's share
    eng = engine(k2(cfg, targets_backhaul_share=1.5 * share))
    predict(eng)
    _, acts = run(eng)
    assert [(a.target, a.scheme) for a in acts] == [("b", PALLAS), ("c", pallas_pb2.SCHEME_NO_SM)]
    assert eng.on_handover("ue1", "c", T_HO)[0].scheme == pallas_pb2.SCHEME_NO_SM
    # A scheme without a prefix-only form prepares no PREFIX target.
    eng = engine(k2(cfg, targets_backhaul_share=1.5 * share), scheme=pallas_pb2.SCHEME_NO_RC)
    predict(eng)
    _, acts = run(eng)
    assert [a.target for a in acts] == ["b"]


def test_candidates_are_merged_scaled_and_checked(cfg):
    eng = engine(k2(cfg))
    predict(eng, "b", [("b", 0.7), ("c", 0.4), ("c", 0.3)])      # c twice; sum 1.4
    assert dict(eng._cands["ue1"]) == pytest.approx({"b": 0.5, "c": 0.5})
    with pytest.raises(ValueError, match="outside"):
        predict(eng, "b", [("b", 1.5), ("c", 0.1)])
    with pytest.raises(ValueError, match="length"):
        eng.set_predictions(["ue1"], ["b"], [T_HO], [0.5], candidates=[CANDS, CANDS])
    eng.set_predictions(["ue1"], ["b"], [T_HO], [0.5])            # no candidates: forgotten
    assert "ue1" not in eng._cands


def test_the_source_is_never_an_extra_target(cfg):
    eng = engine(k2(cfg))
    predict(eng, "b", [("b", 0.5), ("a", 0.4)])
    _, acts = run(eng)
    assert [a.target for a in acts] == ["b"]


def test_a_session_ending_cancels_and_frees_every_target(cfg):
    eng, _, _ = triggered_pair(cfg)
    assert eng.remove_session("s1") == [CancelAction("s1", 1, "a", "b", "session ended")]
    assert eng.reserved_at("b") == eng.reserved_at("c") == 0 and eng._cands == {}


def test_trigger_extra_refuses_what_the_state_does_not_allow():
    sm = SessionMigration("s9", "a")
    with pytest.raises(InvalidTransition):
        sm.trigger_extra("c", 1, 1.0, 16)                # not PREPARING
    sm.predict("b", T_HO)
    sm.trigger(T0, 1.0, 16)
    for target, rank in (("a", 1), ("b", 1), ("c", 0)):  # the source, the primary, rank 0
        with pytest.raises(ValueError):
            sm.trigger_extra(target, rank, 1.0, 16)
    assert sm.trigger_extra("c", 2, 1.0, 16).rank == 2 and sm.extras == {"c": PreparedTarget("c", 2, PALLAS)}


def test_an_extra_that_leaves_the_choice_is_cancelled_alone_and_the_epoch_goes_on(cfg):
    """Issue 45: c (rank 1) falls below the probability floor while the primary b holds: the
    cycle sends a targeted Cancel of epoch 1 naming c (only c's reservation freed); c is not
    prepared again under the epoch, a handover to b is still a prepared commit."""
    from prometheus_client import REGISTRY

    def extras():
        return {e: REGISTRY.get_sample_value("pallas_scheduler_extra_targets_total", {"event": e}) or 0.0
                for e in ("prepared", "dropped")}

    before = extras()
    eng = engine(k2(cfg, targets_p_floor=0.2))
    predict(eng)
    t, acts = run(eng)
    assert [(a.target, a.rank) for a in acts] == [("b", 0), ("c", 1)]
    assert predict(eng, "b", [("b", 0.85), ("c", 0.1)]) == []
    acts = eng.cycle(t + 0.1)
    assert {k: v - before[k] for k, v in extras().items()} == {"prepared": 1, "dropped": 1}
    assert acts == [CancelAction("s1", 1, "a", "c", "left the target choice", only_target=True)]
    req = acts[0].to_proto("c:1")
    assert req.HasField("target") and (req.target.agent_id, req.target.address) == ("c", "c:1")
    sm = eng.session("s1")
    assert sm.state is S.PREPARING and sm.epoch == 1 and set(sm.prepared) == {"b"}
    assert "c" in sm.declined
    assert eng.reserved_at("c") == 0 and eng.reserved_at("b") > 0
    predict(eng, "b", CANDS)                             # c is likely again: not this epoch
    assert eng.cycle(t + 0.2) == []
    assert eng.on_handover("ue1", "b", T_HO) == [CommitAction("s1", 1, "a", "b", "b", PALLAS, T_HO)]


def test_extras_are_cancelled_when_the_primary_is_the_only_candidate_left(cfg):
    eng, t, _ = triggered_pair(cfg)
    predict(eng, "b", [("b", 0.9)])                      # one candidate: the UE's cands go
    assert "ue1" not in eng._cands
    assert eng.cycle(t + 0.1) == [CancelAction("s1", 1, "a", "c", "left the target choice: one "
                                               "candidate left", only_target=True)]
    assert set(eng.session("s1").prepared) == {"b"} and eng.reserved_at("b") > 0


def test_the_primary_is_never_cancelled_by_the_choice(cfg):
    """The choice may name an extra alone (its p above the split); the primary holds by Eq. 9
    and the extra stays: nothing is cancelled."""
    eng, t, _ = triggered_pair(cfg)
    eng.reconfigure(k2(cfg, targets_split=0.9))
    assert predict(eng, "b", [("c", 0.95), ("b", 0.04)]) == []
    assert eng.cycle(t + 0.1) == []
    assert set(eng.session("s1").prepared) == {"b", "c"}


def test_drop_extra_refuses_the_primary_an_unprepared_target_and_other_states():
    sm = SessionMigration("s9", "a")
    with pytest.raises(InvalidTransition):
        sm.drop_extra("c", "x")                          # not PREPARING
    sm.predict("b", T_HO)
    sm.trigger(T0, 1.0, 16)
    for target in ("b", "d"):                            # the primary, never prepared
        with pytest.raises(ValueError):
            sm.drop_extra(target, "x")
    sm.trigger_extra("c", 1, 1.0, 16)
    whole = CancelAction("s9", 1, "a", "b", "x")
    assert whole.peer_field is None and not whole.to_proto().HasField("target")
    assert sm.drop_extra("c", "x").peer_field == "target" and sm.epoch == 1


# -- the predicted target on the session's own agent (a three-sector site, a cell of the same
# -- edge server): the best candidate elsewhere is the one to prepare, and the own agent is one
# -- of the K (docs/model.md §4.1).
OWN = [("b", 0.3), ("c", 0.1)]          # what the control loop hands over: the own agent "a" left out


def predict_own(eng, cands=OWN, p_own=0.6):
    """The predictor names a cell of the session's own agent "a" with probability ``p_own``."""
    return eng.set_predictions(["ue1"], ["a"], [T_HO], [p_own], candidates=[cands])


def test_own_agent_first_prepares_the_next_candidate_at_rank0(cfg):
    eng = engine(k2(cfg))
    assert predict_own(eng) == []
    sm = eng.session("s1")
    assert sm.state is S.PLANNED and sm.target == "b" and eng._conf[0] == pytest.approx(0.3)
    t, acts = run(eng)
    assert [(a.target, a.rank, a.epoch, a.predicted_handover_time) for a in acts] == [("b", 0, 1, T_HO)]
    assert eng.cycle(t + 0.1) == []                  # "a" counts as one of K = 2: c stays unprepared
    acts = eng.on_handover("ue1", "b", T_HO)
    assert acts[-1].prepared_target == "b"


def test_own_agent_first_with_k3_prepares_two_others(cfg):
    eng = engine(dataclasses.replace(cfg, targets_k=3))
    predict_own(eng)
    t, acts = run(eng)
    assert [(a.target, a.rank) for a in acts] == [("b", 0), ("c", 1)]


def test_own_agent_first_with_k1_prepares_nothing(cfg):
    eng = engine(cfg)
    predict_own(eng)
    assert eng.session("s1").target is None
    assert run(eng)[1] == []
    assert eng.on_handover("ue1", "b", T_HO)[-1].prepared_target is None


def test_own_agent_first_respects_split_and_floor(cfg):
    for knobs, own_p in (({"targets_split": 0.5}, 0.6), ({"targets_p_floor": 0.35}, 0.5)):
        eng = engine(k2(cfg, **knobs))
        predict_own(eng, p_own=own_p)
        assert eng.session("s1").target is None, knobs
        assert run(eng)[1] == [], knobs


def test_own_agent_named_later_keeps_the_prepared_next_candidate(cfg):
    eng, t, _ = triggered_pair(cfg)                  # b (rank 0) and c (rank 1) prepared
    assert predict_own(eng) == []                    # now the own agent first, b next: kept
    sm = eng.session("s1")
    assert sm.state is S.PREPARING and sm.target == "b" and sm.epoch == 1
    assert predict_own(eng, [("d", 0.2)]) == [CancelAction("s1", 1, "a", "b", "target changed")]
    assert eng.session("s1").target == "d"


def test_a_single_candidate_is_kept_only_beside_another_target(cfg):
    eng = engine(k2(cfg))
    predict(eng, "b", [("b", 0.5)])
    assert "ue1" not in eng._cands                   # the primary alone
    predict_own(eng, [("b", 0.3)])
    assert eng._cands["ue1"] == (("b", 0.3),)


# -- the return rule: the agent a UE just left (targets_return_s, docs/model.md §4.1) ------------
def handed_to_b(cfg):
    """s1 of ue1 prepared at b and handed over a -> b at T_HO, the commit answered; (engine)."""
    eng = engine(cfg)
    eng.set_predictions(["ue1"], ["b"], [T_HO], [0.9])
    run(eng)
    commit = eng.on_handover("ue1", "b", T_HO)
    eng.on_reply(commit[-1], OK)
    assert eng.session("s1").source == "b"
    return eng


def back_to_a(eng, t_ho, now=T_HO + 0.5):
    """The predictor names a again (the agent left) with a dwell time ``t_ho``; cycles at ``now``."""
    eng.set_predictions(["ue1"], ["a"], [t_ho], [0.7])
    for agent in ("a", "b", "c"):
        eng.ingest_telemetry(server_report(agent, now))
    return eng.cycle(now)


def test_the_agent_just_left_is_prepared_at_once_when_named_with_a_far_time(cfg):
    eng = handed_to_b(k2(cfg))
    acts = back_to_a(eng, T_HO + 30.0)                # dwell time far off: Eq. 9 would wait
    assert [(type(a), a.source, a.target, a.rank) for a in acts] == [(TriggerAction, "b", "a", 0)]
    assert acts[0].window_s == 0.0 and acts[0].predicted_handover_time == T_HO + 0.5
    assert eng.on_handover("ue1", "a", T_HO + 2.0)[-1].prepared_target == "a"


def test_the_return_rule_holds_for_targets_return_s_only(cfg):
    eng = handed_to_b(k2(cfg, targets_return_s=4.0))
    assert back_to_a(eng, T_HO + 30.0, now=T_HO + 4.5) == []   # the hold is over
    assert eng._returns == {}
    eng = handed_to_b(k2(cfg, targets_return_s=4.0))
    assert len(back_to_a(eng, T_HO + 30.0, now=T_HO + 3.9)) == 1


def test_the_return_rule_is_off_with_k1_or_zero_hold_and_moves_no_other_target(cfg):
    for c in (cfg, k2(cfg, targets_return_s=0.0)):
        eng = handed_to_b(c)
        assert back_to_a(eng, T_HO + 30.0) == [], c.targets_k
    eng = handed_to_b(k2(cfg))
    eng.set_predictions(["ue1"], ["c"], [T_HO + 30.0], [0.7])      # not the agent left
    assert eng.cycle(T_HO + 0.5) == []
    assert eng.session("s1").t_ho is None or eng.session("s1").t_ho == T_HO + 30.0
