"""The per-session migration state machine: every transition (docs/model.md §5)."""

import pytest

from pallas_proto import pallas_pb2
from xapp.scheduler import (CancelAction, CommitAction, InvalidTransition, MigrationState,
                            SessionMigration, TriggerAction)

S = MigrationState


def planned(target="b", t_ho=100.0, source="a", **kw):
    sm = SessionMigration("s1", source, ue_id="ue1", **kw)
    assert sm.predict(target, t_ho) == []
    assert sm.state is S.PLANNED and sm.target == target and sm.t_ho == t_ho
    return sm


def preparing(**kw):
    sm = planned(**kw)
    act = sm.trigger(now=98.8, window_s=1.2, predicted_split_tokens=2960)
    assert sm.state is S.PREPARING
    return sm, act


def test_idle_to_planned_and_replans_before_the_trigger():
    sm = SessionMigration("s1", "a")
    assert sm.state is S.IDLE and sm.epoch == 1
    assert sm.predict(None, None) == [] and sm.state is S.IDLE
    assert sm.predict("b", 100.0) == [] and sm.state is S.PLANNED
    assert sm.predict("b", 101.5) == [] and sm.t_ho == 101.5              # new t_HO: replan
    assert sm.predict("c", 99.0) == [] and sm.target == "c" and sm.epoch == 1   # new target
    assert sm.predict(None, None) == [] and sm.state is S.IDLE and sm.target is None


def test_a_target_equal_to_the_source_is_no_prediction():
    sm = SessionMigration("s1", "a")
    assert sm.predict("a", 100.0) == [] and sm.state is S.IDLE


def test_trigger():
    sm, act = preparing()
    assert act == TriggerAction("s1", 1, "a", "b", 100.0, 1.2, 2960, pallas_pb2.SCHEME_PALLAS)
    assert sm.trigger_time == 98.8 and sm.window_s == 1.2
    req = act.to_proto("10.0.0.2:7001")
    assert (req.session_id, req.epoch, req.target.agent_id, req.target.address) == ("s1", 1, "b", "10.0.0.2:7001")
    assert req.split_tokens == 0 and req.window_s == 1.2 and req.scheme == pallas_pb2.SCHEME_PALLAS
    with pytest.raises(InvalidTransition):
        sm.trigger(now=99.0, window_s=1.0, predicted_split_tokens=0)
    with pytest.raises(InvalidTransition):
        SessionMigration("s2", "a").trigger(now=0.0, window_s=0.0, predicted_split_tokens=0)


def test_new_handover_time_after_the_trigger_keeps_the_preparation():
    sm, _ = preparing()
    assert sm.predict("b", 99.5) == [] and sm.state is S.PREPARING and sm.t_ho == 99.5   # earlier
    assert sm.predict("b", 103.0) == [] and sm.state is S.PREPARING and sm.t_ho == 103.0  # later
    assert sm.epoch == 1


def test_target_change_after_the_trigger_cancels_and_replans_with_a_new_epoch():
    sm, _ = preparing()
    acts = sm.predict("c", 101.0)
    assert acts == [CancelAction("s1", 1, "a", "b", "target changed")]
    assert acts[0].to_proto() == pallas_pb2.CancelRequest(session_id="s1", epoch=1, reason="target changed")
    assert sm.state is S.PLANNED and sm.target == "c" and sm.epoch == 2
    act = sm.trigger(now=100.0, window_s=1.0, predicted_split_tokens=16)
    assert act.epoch == 2 and act.target == "c" and act.source == "a"


def test_withdrawn_prediction_after_the_trigger_cancels():
    sm, _ = preparing()
    assert sm.predict(None, None) == [CancelAction("s1", 1, "a", "b", "prediction withdrawn")]
    assert sm.state is S.CANCELLED and sm.target is None and sm.epoch == 2
    assert sm.predict("b", 120.0) == [] and sm.state is S.PLANNED
    assert sm.trigger(now=119.0, window_s=1.0, predicted_split_tokens=0).epoch == 2


def test_handover_to_the_prepared_target_commits_and_chains():
    sm, _ = preparing()
    acts = sm.handover("b", now=99.7, target_can_serve=True)
    assert acts == [CommitAction("s1", 1, "a", "b", "b", pallas_pb2.SCHEME_PALLAS, 99.7)]
    req = acts[0].to_proto("10.0.0.2:7001")
    assert req.actual_target.agent_id == "b" and req.epoch == 1 and req.handover_time == 99.7
    assert sm.state is S.COMMITTED and sm.source == "b" and sm.target is None and sm.epoch == 2
    # The next handover chains from the new serving agent.
    assert sm.predict("c", 150.0) == [] and sm.state is S.PLANNED
    act = sm.trigger(now=149.0, window_s=1.0, predicted_split_tokens=0)
    assert (act.source, act.target, act.epoch) == ("b", "c", 2)
    assert sm.handover("c", 150.2, True)[0].source == "b" and sm.source == "c"


def test_mispredicted_target_cancels_and_falls_back_to_ctho():
    sm, _ = preparing()
    acts = sm.handover("c", now=99.9, target_can_serve=True)
    assert acts == [CancelAction("s1", 1, "a", "b", "mispredicted target"),
                    CommitAction("s1", 2, "a", "c", None, pallas_pb2.SCHEME_CTHO, 99.9)]
    assert sm.state is S.FALLBACK and sm.source == "c" and sm.epoch == 3 and sm.relay_hops == 0


def test_mispredicted_target_that_cannot_serve_gets_detour():
    sm, _ = preparing()
    acts = sm.handover("c", now=99.9, target_can_serve=False)
    assert isinstance(acts[0], CancelAction)
    assert acts[1].scheme == pallas_pb2.SCHEME_DETOUR and acts[1].actual_target == "c"
    assert sm.state is S.FALLBACK and sm.source == "a" and sm.relay_hops == 1   # still decoding at a
    sm.handover("d", now=120.0, target_can_serve=False)
    assert sm.relay_hops == 2 and sm.source == "a"
    assert sm.handover("a", now=130.0, target_can_serve=True) == [] and sm.relay_hops == 0


def test_handover_earlier_than_the_trigger_falls_back():
    sm = planned(t_ho=100.0)
    acts = sm.handover("b", now=96.0, target_can_serve=True)     # before any preparation
    assert acts == [CommitAction("s1", 1, "a", "b", None, pallas_pb2.SCHEME_CTHO, 96.0)]
    assert sm.state is S.FALLBACK and sm.source == "b" and sm.epoch == 2


def test_handover_earlier_than_predicted_after_the_trigger_commits():
    sm, _ = preparing()                                           # t_HO predicted 100.0
    acts = sm.handover("b", now=99.0, target_can_serve=True)      # 1 s early: work lands in SIT
    assert len(acts) == 1 and acts[0].prepared_target == "b" and sm.state is S.COMMITTED


def test_unpredicted_handover_and_configured_fallback():
    sm = SessionMigration("s1", "a", fallback=pallas_pb2.SCHEME_RECOMPUTATION)
    acts = sm.handover("b", now=5.0, target_can_serve=True)
    assert acts[0].scheme == pallas_pb2.SCHEME_RECOMPUTATION and sm.state is S.FALLBACK
    assert sm.handover("a", now=6.0, target_can_serve=True)[0].source == "b"   # chains from b


def test_refused_trigger():
    sm, _ = preparing()
    assert sm.refused(epoch=0, reason="old") == [] and sm.state is S.PREPARING     # stale reply
    acts = sm.refused(epoch=1, reason="no KV memory")
    assert acts == [CancelAction("s1", 1, "a", "b", "trigger refused: no KV memory")]
    assert sm.state is S.CANCELLED and sm.epoch == 2
    assert sm.handover("b", 100.0, True)[0].prepared_target is None                # falls back


def test_end():
    sm, _ = preparing()
    assert sm.end() == [CancelAction("s1", 1, "a", "b", "session ended")]
    assert sm.state is S.IDLE
    assert planned().end() == []


def test_ablation_schemes_commit_with_their_scheme_and_reactive_ones_are_refused():
    sm, act = preparing(scheme=pallas_pb2.SCHEME_NO_SM)
    assert act.scheme == pallas_pb2.SCHEME_NO_SM
    assert sm.handover("b", 100.0, True)[0].scheme == pallas_pb2.SCHEME_NO_SM
    with pytest.raises(ValueError):
        SessionMigration("s1", "a", scheme=pallas_pb2.SCHEME_FULL_COPY)


def test_transition_callback_sees_every_change():
    seen = []
    sm = SessionMigration("s1", "a", on_transition=lambda m, old: seen.append((old, m.state)))
    sm.predict("b", 10.0)
    sm.trigger(9.0, 1.0, 0)
    sm.predict("c", 10.0)
    sm.handover("d", 10.0, True)
    assert seen == [(S.IDLE, S.PLANNED), (S.PLANNED, S.PREPARING), (S.PREPARING, S.PLANNED),
                    (S.PLANNED, S.FALLBACK)]


def test_epochs_come_from_the_given_allocator_and_never_fall_below_the_current_one():
    """Issue 16: the xApp's store hands out the epochs (generation << 38 | n); an epoch moved up
    from an agent's report is never undercut by a smaller allocation."""
    from xapp.store import EPOCH_COUNTER_BITS, MemoryStore
    st = MemoryStore()
    st.generation = 5
    g = 5 << EPOCH_COUNTER_BITS
    sm = SessionMigration("s1", "a", epochs=st.allocate_epoch)
    assert sm.epoch == g | 1
    sm.predict("b", 100.0)
    sm.trigger(now=98.0, window_s=1.0, predicted_split_tokens=0)
    cancel = sm.predict(None, None)[0]
    assert (cancel.epoch, sm.epoch) == (g | 1, g | 2)
    sm.epoch = g | 40                      # an agent reported epoch g|39 (engine.ingest_telemetry)
    sm.predict("b", 100.0)
    sm.trigger(now=98.0, window_s=1.0, predicted_split_tokens=0)
    commit = sm.handover("b", 100.0, target_can_serve=True)[0]
    assert (commit.epoch, sm.epoch) == (g | 40, g | 41)
