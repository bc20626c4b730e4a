"""A replica's engine and a session another replica handed over (docs/scale-out.md §7, UE 4 at
78.2 s of the 3-replica default replay: STATUS_INVALID). The new node's owner still tracked an
older session of the UE whose source had reported it handed over (another replica committed
it); no agent reported it serving again, so ``follow_moves`` never moved it, and the UE's
handover committed it a second time from that source. With ``follow_moves`` such a session is
parked: never committed nor triggered until an agent reports it serving (then followed) or
finished (then dropped). One xApp (``follow_moves`` off) is unchanged."""

from __future__ import annotations

from pallas_proto import pallas_pb2
from xapp.scheduler import CommitAction, MigrationState, SchedulerEngine, TriggerAction

from sched_helpers import server_report

T0 = 1_000.0


def _session(sid: str, state: str = "serving", tokens: int = 2000) -> pallas_pb2.SessionTelemetry:
    return pallas_pb2.SessionTelemetry(session_id=sid, ue_id="ue4", tokens=tokens, decode_rate=30.0,
                                       state=state, remaining_tokens=100_000)


def _engine(cfg, follow: bool) -> SchedulerEngine:
    """UE 4's two sessions served by agent a; then a reports the older one handed over
    (another replica committed it), the newer one serving; b and c report no session."""
    eng = SchedulerEngine(cfg)
    eng.follow_moves = follow
    for agent in ("b", "c"):
        eng.ingest_telemetry(server_report(agent, T0))
    eng.ingest_telemetry(server_report("a", T0, sessions=[_session("old"), _session("new")]))
    eng.ingest_telemetry(server_report("a", T0 + 0.5, sessions=[_session("old", "handed_over"),
                                                                 _session("new")]))
    for agent in ("b", "c"):
        eng.ingest_telemetry(server_report(agent, T0 + 0.5))
    return eng


def test_a_session_handed_over_by_another_replica_is_not_committed_again(cfg):
    eng = _engine(cfg, follow=True)
    assert eng.parked("old") and not eng.parked("new")
    assert {sm.session_id for sm in eng.sessions_of("ue4")} == {"old", "new"}   # still tracked
    eng.set_prediction("ue4", "c", T0 + 1.5)
    trig = eng.cycle(T0 + 1.0)                        # the newer session alone is prepared
    assert [(type(a), a.session_id) for a in trig] == [(TriggerAction, "new")]
    acts = eng.on_handover("ue4", "c", T0 + 1.5)
    assert [(type(a), a.session_id, a.source, a.actual_target, a.prepared_target) for a in acts] == \
        [(CommitAction, "new", "a", "c", "c")]        # no second commit of "old" from a
    assert eng.session("old").source == "a" and eng.session("old").state is MigrationState.PLANNED
    # b, where the other replica committed it, reports it: followed, the stale plan dropped
    eng.ingest_telemetry(server_report("b", T0 + 2.0, sessions=[_session("old", "resumed")]))
    old = eng.session("old")
    assert not eng.parked("old") and old.source == "b" and old.state is MigrationState.IDLE
    assert eng._source[eng._slot["old"]] == eng._agent_idx["b"] and not eng._planned[eng._slot["old"]]
    acts = eng.on_handover("ue4", "a", T0 + 3.0)      # from now on it moves with the UE again
    assert ("old", "b", "a") in [(a.session_id, a.source, a.actual_target) for a in acts]


def test_one_xapp_commits_as_before(cfg):
    """follow_moves off: a handed-over report is never passed on, nothing is parked, and the
    engine's inputs give both commits as they did (one xApp's own commit moves the source
    first, so this cannot arise there)."""
    eng = _engine(cfg, follow=False)
    assert not eng.parked("old")
    acts = eng.on_handover("ue4", "c", T0 + 1.5)
    assert sorted((a.session_id, a.source) for a in acts) == [("new", "a"), ("old", "a")]


def test_a_parked_session_reported_finished_anywhere_is_dropped(cfg):
    eng = _engine(cfg, follow=True)
    eng.ingest_telemetry(server_report("b", T0 + 1.0, sessions=[_session("old", "finished")]))
    assert [sm.session_id for sm in eng.sessions_of("ue4")] == ["new"] and not eng.parked("old")
    # one not parked is ended by its source alone (the stopped copy elsewhere says finished)
    eng.ingest_telemetry(server_report("b", T0 + 1.1, sessions=[_session("new", "finished")]))
    assert [sm.session_id for sm in eng.sessions_of("ue4")] == ["new"]


def test_a_parked_session_is_not_followed_back_to_the_source_that_handed_it_over(cfg):
    eng = _engine(cfg, follow=True)
    eng.ingest_telemetry(server_report("a", T0 + 1.0, sessions=[_session("old", "serving")]))
    assert eng.parked("old") and eng.session("old").source == "a"
