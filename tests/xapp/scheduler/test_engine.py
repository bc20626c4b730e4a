"""The Scheduler Engine's control cycle: decisions, triggers, admission and handovers."""

import dataclasses

import numpy as np
import pytest

from pallas_common import timing
from pallas_proto import pallas_pb2
from xapp.scheduler import (CancelAction, CommitAction, MigrationState, SchedulerEngine,
                            TriggerAction)

from sched_helpers import BLOCK, MODEL, S_KV, server_report

S = MigrationState
T0 = 1_000.0


def make_engine(cfg, now=T0, agents=("a", "b", "c"), **kw):
    eng = SchedulerEngine(cfg, **kw)
    for agent in agents:
        eng.ingest_telemetry(server_report(agent, now))
    return eng


def add(eng, sid="s1", ue="ue1", source="a", tokens=2850, now=T0, remaining=None):
    eng.add_session(sid, source, ue_id=ue, s_kv=S_KV, block_size=BLOCK, now=now, tokens=tokens,
                    remaining_tokens=remaining, model=MODEL)
    eng.telemetry.observe_decode_rate(sid, 30.0, now)


def run_until_trigger(eng, start, stop, period=0.1, refresh=True):
    """Cycles every ``period`` s; keeps telemetry fresh; returns (time, actions) at the first action."""
    t = start
    while t <= stop + 1e-9:
        if refresh:
            for agent in ("a", "b", "c"):
                eng.ingest_telemetry(server_report(agent, t))
            for sm in list(eng._sm):
                if sm is not None:
                    eng.telemetry.observe_decode_rate(sm.session_id, 30.0, t)
        acts = eng.cycle(t)
        if acts:
            return t, acts
        t = round(t + period, 9)
    return None, []


def expected_window(cfg, k_curr, t_remain):
    inp = timing.WindowInputs(k_curr=k_curr, t_remain=t_remain, block_size=BLOCK, r_p=2700.0,
                              r_d=30.0, bandwidth=cfg.default_goodput_bytes_per_s, s_kv=S_KV,
                              c_sync=cfg.c_sync_s)
    return float(timing.decide(inp, cfg.decision_params()).window[0])


def test_defers_then_triggers_at_the_chosen_window(cfg):
    eng = make_engine(cfg)
    add(eng)
    t_ho = T0 + 8.0
    assert eng.set_prediction("ue1", "b", t_ho) == []
    assert eng.session("s1").state is S.PLANNED
    t, acts = run_until_trigger(eng, T0, t_ho)
    assert len(acts) == 1 and isinstance(acts[0], TriggerAction)
    act = acts[0]
    assert (act.session_id, act.epoch, act.source, act.target) == ("s1", 1, "a", "b")
    assert act.predicted_handover_time == t_ho
    # The trigger came in the last cycle before T_remain fell below T_w* (one period lookahead).
    k_now = 2850 + 30.0 * (t - T0)
    w_star = expected_window(cfg, k_now, t_ho - t)
    assert act.window_s == pytest.approx(w_star)
    assert w_star <= t_ho - t <= w_star + cfg.trigger_lookahead_s + 1e-9
    assert 0.5 <= act.window_s <= 2.0                    # the Figure 2 knee region
    assert act.predicted_split_tokens % BLOCK == 0
    costs = timing.evaluate_windows(timing.WindowInputs(
        k_curr=k_now, t_remain=t_ho - t, block_size=BLOCK, r_p=2700.0, r_d=30.0,
        bandwidth=cfg.default_goodput_bytes_per_s, s_kv=S_KV, c_sync=cfg.c_sync_s), [w_star])
    assert act.predicted_sit_s == pytest.approx(costs.t_sit[0, 0])
    assert act.predicted_early_s == pytest.approx(costs.t_early[0, 0])
    assert eng.session("s1").state is S.PREPARING
    assert eng.cycle(t + 0.1) == []                      # a trigger is one-time


def test_target_change_after_the_trigger_then_commit(cfg):
    eng = make_engine(cfg)
    add(eng)
    t_ho = T0 + 8.0
    eng.set_prediction("ue1", "b", t_ho)
    t, _ = run_until_trigger(eng, T0, t_ho)
    acts = eng.set_prediction("ue1", "c", t_ho)
    assert acts == [CancelAction("s1", 1, "a", "b", "target changed")]
    sm = eng.session("s1")
    assert sm.state is S.PLANNED and sm.target == "c" and sm.epoch == 2
    t2, acts = run_until_trigger(eng, t + 0.1, t_ho)
    assert acts[0].target == "c" and acts[0].epoch == 2 and t2 == pytest.approx(t + 0.1)
    acts = eng.on_handover("ue1", "c", t_ho)
    assert acts == [CommitAction("s1", 2, "a", "c", "c", pallas_pb2.SCHEME_PALLAS, t_ho)]
    assert sm.state is S.COMMITTED and sm.source == "c"


def test_earlier_and_later_handover_than_predicted(cfg):
    eng = make_engine(cfg)
    add(eng, "s1", "ue1")
    add(eng, "s2", "ue2")
    eng.set_predictions(["ue1", "ue2"], ["b", "b"], [T0 + 8.0, T0 + 8.0])
    t, acts = run_until_trigger(eng, T0, T0 + 8.0)
    assert {a.session_id for a in acts} == {"s1", "s2"}
    # ue1 hands over 0.3 s earlier than predicted: still a Pallas commit (work lands in SIT).
    assert eng.on_handover("ue1", "b", t + 0.1)[0].scheme == pallas_pb2.SCHEME_PALLAS
    # ue2's HO is predicted 3 s later: the preparation stays, no new trigger, commit later.
    assert eng.set_prediction("ue2", "b", T0 + 11.0) == []
    assert eng.session("s2").state is S.PREPARING and eng.session("s2").t_ho == T0 + 11.0
    _, acts = run_until_trigger(eng, t + 0.1, T0 + 11.0)
    assert acts == []
    acts = eng.on_handover("ue2", "b", T0 + 11.0)
    assert acts[0].prepared_target == "b" and acts[0].epoch == 1


def test_mispredicted_target_falls_back_to_ctho_or_detour(cfg):
    eng = make_engine(cfg, agents=("a", "b", "c"))
    other = dataclasses.replace(MODEL, model="meta-llama/Meta-Llama-3-8B")
    eng.ingest_telemetry(server_report("d", T0, model=other))
    add(eng, "s1", "ue1")
    add(eng, "s2", "ue2")
    eng.set_predictions(["ue1", "ue2"], ["b", "b"], [T0 + 8.0, T0 + 8.0])
    t, _ = run_until_trigger(eng, T0, T0 + 8.0)
    for agent in ("b", "c", "d"):
        eng.ingest_telemetry(server_report(agent, t, model=other if agent == "d" else MODEL))
    a1 = eng.on_handover("ue1", "c", t + 0.2)
    assert isinstance(a1[0], CancelAction) and a1[0].target == "b"
    assert a1[1].scheme == pallas_pb2.SCHEME_CTHO and a1[1].actual_target == "c"
    assert eng.session("s1").source == "c"
    a2 = eng.on_handover("ue2", "d", t + 0.2)                 # d serves another model
    assert a2[1].scheme == pallas_pb2.SCHEME_DETOUR and eng.session("s2").source == "a"


def test_chained_handovers(cfg):
    eng = make_engine(cfg)
    add(eng)
    eng.set_prediction("ue1", "b", T0 + 8.0)
    run_until_trigger(eng, T0, T0 + 8.0)
    eng.on_handover("ue1", "b", T0 + 8.0)
    eng.set_prediction("ue1", "c", T0 + 20.0)
    t, acts = run_until_trigger(eng, T0 + 8.1, T0 + 20.0)
    assert acts[0].source == "b" and acts[0].target == "c" and acts[0].epoch == 2
    assert eng.on_handover("ue1", "c", T0 + 20.0)[0].source == "b"
    assert eng.session("s1").source == "c"


def test_admission_defers_until_memory_is_free_and_reserves_it(cfg):
    eng = make_engine(cfg)
    add(eng, "s1", "ue1")
    add(eng, "s2", "ue2")
    eng.set_predictions(["ue1", "ue2"], ["b", "b"], [T0 + 1.0, T0 + 1.0])   # due at once
    eng.ingest_telemetry(server_report("b", T0, free_blocks=10))
    assert eng.cycle(T0) == []
    assert "free KV memory" in eng.session("s1").last_reason
    # Room for one cache: exactly one of the two triggers in this cycle.
    eng.ingest_telemetry(server_report("b", T0 + 0.1, free_blocks=250))
    acts = eng.cycle(T0 + 0.1)
    assert len(acts) == 1
    assert eng.cycle(T0 + 0.2) == []
    # b's next reports do not show s1's memory yet: the reservation holds (issue 14: it was
    # wiped by every server report, so two migrations could over-commit one target).
    for k in range(3, 6):
        eng.ingest_telemetry(server_report("b", T0 + k / 10, free_blocks=250))
        assert eng.cycle(T0 + k / 10) == []
    assert eng.reserved_at("b") > 0
    # The handover commits s1 at b; its reply frees the reservation, and s2 may go.
    commit = eng.on_handover(eng.session(acts[0].session_id).ue_id, "b", T0 + 0.6)
    assert eng.cycle(T0 + 0.6) == []                      # the commit's reply is not in yet
    eng.on_reply(commit[0], pallas_pb2.ControlReply(status=pallas_pb2.STATUS_OK))
    assert eng.reserved_at("b") == 0
    assert len(eng.cycle(T0 + 0.7)) == 1


def test_incompatible_or_silent_target_never_triggers(cfg):
    eng = make_engine(cfg, agents=("a",))
    eng.ingest_telemetry(server_report("b", T0, model=dataclasses.replace(MODEL, block_size=32)))
    add(eng)
    eng.set_prediction("ue1", "b", T0 + 0.5)
    assert eng.cycle(T0) == [] and "block_size" in eng.session("s1").last_reason
    eng.set_prediction("ue1", "z", T0 + 0.5)             # an agent that never reported
    assert eng.cycle(T0) == [] and "telemetry" in eng.session("s1").last_reason


def test_sessions_finishing_before_the_handover_do_not_trigger(cfg):
    eng = make_engine(cfg)
    add(eng, remaining=20)                               # ~0.7 s of decoding left
    eng.set_prediction("ue1", "b", T0 + 3.0)
    _, acts = run_until_trigger(eng, T0, T0 + 3.0, refresh=False)
    assert acts == []


def test_stale_telemetry_falls_back_to_defaults(cfg):
    eng = make_engine(cfg)
    add(eng)
    eng.telemetry.observe_prefill_rate("b", 200.0, T0)    # a slow target...
    eng.telemetry.observe_goodput("a", "b", 1e6, T0)      # ...behind a slow link
    eng.set_prediction("ue1", "b", T0 + 30.0)
    now = T0 + 27.0                                        # 27 s later every estimate is stale
    eng.cycle(now)
    slot = eng._slot["s1"]
    k_now = 2850 + cfg.default_decode_rate_tps * 27.0
    inp = timing.WindowInputs(k_curr=k_now, t_remain=3.0, block_size=BLOCK,
                              r_p=cfg.default_prefill_rate_tps, r_d=cfg.default_decode_rate_tps,
                              bandwidth=cfg.default_goodput_bytes_per_s, s_kv=S_KV, c_sync=cfg.c_sync_s)
    assert eng.last_window[slot] == pytest.approx(timing.decide(inp, cfg.decision_params()).window[0])


def test_refused_trigger_cancels_and_the_handover_falls_back(cfg):
    eng = make_engine(cfg)
    add(eng)
    eng.set_prediction("ue1", "b", T0 + 0.5)
    (trig,) = eng.cycle(T0)
    acts = eng.on_reply(trig, pallas_pb2.ControlReply(status=pallas_pb2.STATUS_REJECTED, message="no room"))
    assert acts == [CancelAction("s1", 1, "a", "b", "trigger refused: no room")]
    assert eng.session("s1").state is S.CANCELLED
    assert eng.on_reply(trig, pallas_pb2.ControlReply(status=pallas_pb2.STATUS_OK)) == []
    acts = eng.on_handover("ue1", "b", T0 + 0.5)
    assert acts[0].prepared_target is None and acts[0].scheme == pallas_pb2.SCHEME_CTHO


def test_reactive_scheme_never_prepares(cfg):
    eng = make_engine(cfg, scheme=pallas_pb2.SCHEME_FULL_COPY)
    add(eng)
    eng.set_prediction("ue1", "b", T0 + 0.5)
    assert eng.cycle(T0) == []
    acts = eng.on_handover("ue1", "b", T0 + 0.5)
    assert acts[0].scheme == pallas_pb2.SCHEME_FULL_COPY


def test_low_confidence_and_forbidden_predictions(cfg):
    eng = make_engine(cfg, min_confidence=0.6)
    add(eng, "s1", "ue1")
    add(eng, "s2", "ue2")
    eng.set_predictions(["ue1", "ue2", "nobody"], ["b", "b", "b"], [T0 + 0.5] * 3,
                        confidence=[0.5, 0.9, 1.0], proactive=[True, False, True])
    assert eng.session("s1").state is S.IDLE               # below min_confidence
    assert eng.session("s2").state is S.PLANNED
    assert eng.cycle(T0) == []                             # s2: proactive migration forbidden
    with pytest.raises(ValueError):
        eng.set_predictions(["ue1"], ["b", "c"], [1.0])


def test_telemetry_registers_updates_and_ends_sessions(cfg):
    eng = make_engine(cfg)
    sess = pallas_pb2.SessionTelemetry(session_id="s9", ue_id="ue9", tokens=2000, decode_rate=30.0,
                                       state="serving")
    eng.ingest_telemetry(server_report("a", T0, sessions=[sess]))
    sm = eng.session("s9")
    assert sm.source == "a" and eng.sessions_of("ue9") == [sm]
    sess.tokens = 2100
    eng.ingest_telemetry(server_report("b", T0 + 1, sessions=[sess]))   # not its source: ignored
    assert eng._tokens[eng._slot["s9"]] == 2000
    eng.ingest_telemetry(server_report("a", T0 + 1, sessions=[sess]))
    assert eng._tokens[eng._slot["s9"]] == 2100
    eng.set_prediction("ue9", "b", T0 + 1.5)
    (trig,) = eng.cycle(T0 + 1)
    sess.state = "finished"
    assert eng.ingest_telemetry(server_report("b", T0 + 1.1, sessions=[sess])) == []  # not its source
    assert eng.session("s9").state is S.PREPARING
    acts = eng.ingest_telemetry(server_report("a", T0 + 1.2, sessions=[sess]))
    assert acts == [CancelAction("s9", 1, "a", "b", "session finished")]
    assert len(eng) == 0 and eng.sessions_of("ue9") == []
    with pytest.raises(KeyError):
        eng.session("s9")


def test_vectorised_cycle_matches_per_session_decisions(cfg):
    rng = np.random.default_rng(3)
    eng = make_engine(cfg)
    n = 300
    tokens = rng.integers(200, 8000, n)
    t_ho = T0 + rng.uniform(0.5, 20.0, n)
    rates = rng.uniform(5.0, 80.0, n)
    for i in range(n):
        eng.add_session(f"s{i}", "a", ue_id=f"ue{i}", s_kv=S_KV, block_size=BLOCK, now=T0,
                        tokens=int(tokens[i]), model=MODEL)
        eng.telemetry.observe_decode_rate(f"s{i}", rates[i], T0)
    eng.set_predictions([f"ue{i}" for i in range(n)], ["b" if i % 2 else "c" for i in range(n)], t_ho)
    acts = eng.cycle(T0)
    triggered = {a.session_id for a in acts}
    horizon = cfg.t_max_s + cfg.trigger_lookahead_s
    checked = 0
    for i in range(n):
        t_remain = t_ho[i] - T0
        if t_remain > horizon:
            assert f"s{i}" not in triggered
            continue
        inp = timing.WindowInputs(k_curr=tokens[i], t_remain=t_remain, block_size=BLOCK,
                                  r_p=2700.0, r_d=rates[i], bandwidth=cfg.default_goodput_bytes_per_s,
                                  s_kv=S_KV, c_sync=cfg.c_sync_s)
        d = timing.decide(inp, cfg.decision_params())
        assert eng.last_window[eng._slot[f"s{i}"]] == pytest.approx(d.window[0])
        assert (f"s{i}" in triggered) == bool(d.trigger[0])
        checked += 1
    assert checked > 50 and triggered


# --- run-time knobs through SchedulerEngine.reconfigure (issue 14: A1 fallback and scheme
# changes had no effect; reconfigure wrote private fields from outside) -------------------------
def test_a_new_fallback_applies_to_the_next_unprepared_handover(cfg):
    eng = make_engine(cfg)
    add(eng)
    assert eng.reconfigure(fallback=pallas_pb2.SCHEME_RECOMPUTATION) == []
    acts = eng.on_handover("ue1", "b", T0 + 1.0)          # nothing prepared: the fallback
    assert [type(a) for a in acts] == [CommitAction]
    assert acts[0].scheme == pallas_pb2.SCHEME_RECOMPUTATION


def test_a_switch_to_a_reactive_scheme_stops_triggering_and_cancels_attempts(cfg):
    eng = make_engine(cfg)
    add(eng, "s1", "ue1")
    add(eng, "s2", "ue2")
    eng.set_prediction("ue1", "b", T0 + 8.0)
    run_until_trigger(eng, T0, T0 + 8.0)
    assert eng.session("s1").state is S.PREPARING
    eng.set_prediction("ue2", "b", T0 + 9.0)
    cancels = eng.reconfigure(scheme=pallas_pb2.SCHEME_CTHO)
    assert [(type(a), a.session_id) for a in cancels] == [(CancelAction, "s1")]
    assert eng.reserved_at("b") == 0
    t, acts = run_until_trigger(eng, T0 + 0.1, T0 + 9.0)
    assert acts == []                                      # ctHO never prepares
    commit = eng.on_handover("ue2", "b", T0 + 9.0)
    assert commit[0].scheme == pallas_pb2.SCHEME_CTHO and commit[0].prepared_target is None


def test_a_switch_between_proactive_schemes_applies_to_the_next_trigger(cfg):
    eng = make_engine(cfg)
    add(eng)
    eng.reconfigure(scheme=pallas_pb2.SCHEME_NO_RC)
    eng.set_prediction("ue1", "b", T0 + 8.0)
    _, acts = run_until_trigger(eng, T0, T0 + 8.0)
    assert acts[0].scheme == pallas_pb2.SCHEME_NO_RC


@pytest.mark.parametrize("knob, value", [("alpha", 0.0), ("alpha", 0.3), ("t_max_s", 0.5), ("dt_s", 0.5)])
def test_a_new_window_knob_changes_the_next_decision(cfg, knob, value):
    """One knob changed by reconfigure: the next cycle's window is Eq. 9's under the new knob
    (pallas_common.timing.decide on the same inputs), and differs from the old knob's."""
    eng = make_engine(cfg)
    add(eng)
    eng.set_prediction("ue1", "b", T0 + 30.0)              # far: evaluated, not triggered
    new = dataclasses.replace(cfg, **{knob: value})
    t = T0 + 30.0 - min(cfg.t_max_s, new.t_max_s + 0.1)   # within both horizons
    k_curr, t_remain = 2850 + 30.0 * (t - T0), T0 + 30.0 - t
    old_w, new_w = expected_window(cfg, k_curr, t_remain), expected_window(new, k_curr, t_remain)
    assert old_w != new_w                                  # the case discriminates
    eng.reconfigure(new)
    for agent in ("a", "b", "c"):
        eng.ingest_telemetry(server_report(agent, t))
    eng.telemetry.observe_decode_rate("s1", 30.0, t)
    eng.cycle(t)                                           # last_window: the decision, trigger or not
    assert float(eng.last_window[eng._slot["s1"]]) == pytest.approx(new_w)


def test_stale_epoch_is_a_failure_and_the_next_attempt_passes_the_agents_epoch(cfg):
    """Issue 14: STALE_EPOCH counted as success, so the xApp believed sessions prepared."""
    eng = make_engine(cfg)
    add(eng)
    eng.set_prediction("ue1", "b", T0 + 8.0)
    t, acts = run_until_trigger(eng, T0, T0 + 8.0)
    trig = acts[0]
    out = eng.on_reply(trig, pallas_pb2.ControlReply(status=pallas_pb2.STATUS_STALE_EPOCH,
                                                     message="newest epoch is 7"))
    assert [type(a) for a in out] == [CancelAction] and eng.session("s1").state is S.CANCELLED
    assert eng.reserved_at("b") == 0
    # The agent's telemetry says it has seen epoch 7: the next attempt starts past it.
    eng.ingest_telemetry(server_report("a", t + 0.1, sessions=[pallas_pb2.SessionTelemetry(
        session_id="s1", ue_id="ue1", tokens=2900, state="serving", epoch=7)]))
    eng.set_prediction("ue1", "c", T0 + 8.0)              # a new plan (a refused target waits)
    _, again = run_until_trigger(eng, t + 0.1, T0 + 8.0)
    assert again and again[0].epoch == 8


def test_a_failed_commit_frees_its_reservation_and_the_session_stays_at_the_source(cfg):
    eng = make_engine(cfg)
    add(eng)
    eng.set_prediction("ue1", "b", T0 + 8.0)
    run_until_trigger(eng, T0, T0 + 8.0)
    assert eng.reserved_at("b") > 0
    commit = eng.on_handover("ue1", "b", T0 + 8.0)[0]
    assert eng.reserved_at("b") > 0                          # until the commit's reply
    eng.on_reply(commit, pallas_pb2.ControlReply(status=pallas_pb2.STATUS_STALE_EPOCH))
    assert eng.reserved_at("b") == 0 and eng.session("s1").source == "a"


def test_a_reservation_lapses_after_its_expiry_and_a_cancel_frees_it(cfg):
    eng = make_engine(cfg)
    add(eng)
    eng.set_prediction("ue1", "b", T0 + 8.0)
    t, _ = run_until_trigger(eng, T0, T0 + 8.0)
    held = eng.reserved_at("b")
    assert held > 0 and eng.reserved_at("b", T0 + 8.0 + cfg.stale_age_s) == held
    eng.cycle(T0 + 8.0 + cfg.stale_age_s + 0.01)
    assert eng.reserved_at("b") == 0
    eng2 = make_engine(cfg)
    add(eng2)
    eng2.set_prediction("ue1", "b", T0 + 8.0)
    run_until_trigger(eng2, T0, T0 + 8.0)
    eng2.set_prediction("ue1", "c", T0 + 8.0)              # target changed: the attempt is cancelled
    assert eng2.reserved_at("b") == 0


def test_a_rule_that_now_forbids_proactive_migration_cancels_a_prepared_attempt(cfg):
    eng = make_engine(cfg)
    add(eng)
    eng.set_prediction("ue1", "b", T0 + 8.0)
    run_until_trigger(eng, T0, T0 + 8.0)
    acts = eng.set_prediction("ue1", "b", T0 + 8.0, proactive=False)
    assert [type(a) for a in acts] == [CancelAction]
    assert eng.session("s1").state is S.PLANNED and eng.reserved_at("b") == 0
    assert eng.on_handover("ue1", "b", T0 + 8.0)[0].prepared_target is None


# --- a fixed window (controls.scheduler.fixed_window_s; issue 17's window experiment) ----------
@pytest.mark.parametrize("fixed", [0.2, 3.0])
def test_a_fixed_window_triggers_at_that_window_not_the_selected_one(cfg, fixed):
    """With fixed_window_s the trigger comes when T_remain_hat falls to the fixed window (within
    one cycle), whatever Eq. 9 would pick, and its predicted SIT/T_early/prefix are Eqs. 4-8 at
    that window."""
    eng0 = make_engine(cfg)
    add(eng0)
    t_ho = T0 + 8.0
    eng0.set_prediction("ue1", "b", t_ho)
    _, sel = run_until_trigger(eng0, T0, t_ho)
    selected = sel[0].window_s
    assert abs(selected - fixed) > 0.3                  # the selected one differs from both
    fcfg = dataclasses.replace(cfg, fixed_window_s=fixed)
    eng = make_engine(fcfg)
    add(eng)
    eng.set_prediction("ue1", "b", t_ho)
    t, acts = run_until_trigger(eng, T0, t_ho)
    assert len(acts) == 1 and isinstance(acts[0], TriggerAction)
    act = acts[0]
    assert fixed <= t_ho - t <= fixed + fcfg.trigger_lookahead_s + 1e-9
    assert act.window_s == pytest.approx(fixed)
    k_now = 2850 + 30.0 * (t - T0)
    costs = timing.evaluate_windows(timing.WindowInputs(
        k_curr=k_now, t_remain=t_ho - t, block_size=BLOCK, r_p=2700.0, r_d=30.0,
        bandwidth=cfg.default_goodput_bytes_per_s, s_kv=S_KV, c_sync=cfg.c_sync_s), [fixed])
    assert act.predicted_sit_s == pytest.approx(costs.t_sit[0, 0])
    assert act.predicted_early_s == pytest.approx(costs.t_early[0, 0])
    assert act.predicted_split_tokens == pytest.approx(costs.l_hist[0, 0])


def test_a_fixed_window_beyond_the_prediction_lead_triggers_at_once(cfg):
    """A prediction 1 s ahead with a 3 s fixed window: triggered in the first cycle, window 1 s."""
    fcfg = dataclasses.replace(cfg, fixed_window_s=3.0)
    eng = make_engine(fcfg)
    add(eng)
    eng.set_prediction("ue1", "b", T0 + 1.0)
    t, acts = run_until_trigger(eng, T0, T0 + 1.0)
    assert t == T0 and acts[0].window_s == pytest.approx(1.0)


def test_fixed_window_config_is_optional_and_bounded():
    from xapp.scheduler import SchedulerConfig
    from xapp.scheduler.config import SchedulerConfigError
    assert SchedulerConfig.from_dict({}).fixed_window_s is None
    assert "fixed_window_s" not in SchedulerConfig().to_dict()
    assert SchedulerConfig.from_dict({"fixed_window_s": 1.6}).fixed_window_s == 1.6
    with pytest.raises(SchedulerConfigError, match="fixed_window_s"):
        SchedulerConfig.from_dict({"fixed_window_s": -0.1})


def test_actions_carry_the_rates_they_were_decided_with(cfg):
    """The trigger carries the r_p, r_d, B, s_kv and block size its window was chosen with; the
    commit those at the handover; later telemetry changes neither."""
    from xapp.scheduler import DecidedRates
    eng = make_engine(cfg)
    add(eng)
    t_ho = T0 + 8.0
    eng.set_prediction("ue1", "b", t_ho)
    t, acts = run_until_trigger(eng, T0, t_ho)
    assert acts[0].rates == DecidedRates(2700.0, 30.0, cfg.default_goodput_bytes_per_s, S_KV, BLOCK)
    eng.ingest_telemetry(server_report("b", t, prefill_rate=900.0))
    eng.telemetry.observe_decode_rate("s1", 10.0, t)
    assert acts[0].rates.r_p == 2700.0
    commit, = eng.on_handover("ue1", "b", t + 0.05)
    r = commit.rates
    assert (r.s_kv, r.block_size, r.bandwidth) == (S_KV, BLOCK, cfg.default_goodput_bytes_per_s)
    assert r.r_p == pytest.approx(eng.telemetry.prefill_rate("b", t + 0.05)) and r.r_p < 2700.0
    assert r.r_d == pytest.approx(eng.telemetry.decode_rate("s1", t + 0.05)) and r.r_d < 30.0


@pytest.mark.parametrize("k", [1, 2])
def test_a_session_first_seen_between_reports_is_planned_with_its_ues_prediction(cfg, k):
    """The UE's next session (a new request) appears in the agent's telemetry between two of
    the UE's radio reports: it takes the UE's latest prediction at once, so a handover due now
    is prepared this cycle, not one report (up to 1 s on the drive logs) later."""
    eng = make_engine(dataclasses.replace(cfg, targets_k=k))
    sess = lambda sid, state="serving": pallas_pb2.SessionTelemetry(   # noqa: E731
        session_id=sid, ue_id="ue9", tokens=1000, decode_rate=30.0, state=state)
    eng.ingest_telemetry(server_report("a", T0, sessions=[sess("s1")]))
    eng.set_predictions(["ue9"], ["b"], [T0 + 0.5], [0.8], candidates=[[("b", 0.8), ("c", 0.1)]])
    assert {a.session_id for a in eng.cycle(T0)} == {"s1"}
    eng.ingest_telemetry(server_report("a", T0 + 0.2, sessions=[sess("s1", "finished"), sess("s2")]))
    assert eng.session("s2").state is S.PLANNED and eng.session("s2").target == "b"
    trig = eng.cycle(T0 + 0.2)                   # K = 2: c too, under the same epoch
    assert [(a.session_id, a.target) for a in trig][:1] == [("s2", "b")]
    assert {a.session_id for a in trig} == {"s2"}
    eng.set_predictions(["ue9"], [None], [np.nan], [0.0])                 # withdrawn: forgotten
    eng.ingest_telemetry(server_report("a", T0 + 0.3, sessions=[sess("s3")]))
    assert eng.session("s3").target is None and eng.cycle(T0 + 0.3) == []
