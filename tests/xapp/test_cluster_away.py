"""A replica hears a UE only from the E2 nodes it owns (docs/scale-out.md §3 item 0): a UE that
went to another replica's node and came back must not look as if it had never left.
:meth:`xapp.control.ControlLoop.away` over its inputs, and a replica's control loop (no Redis,
no relay) taking the returning UE's report as its first: its session, moved to another agent
meanwhile, is committed back to the cell's agent. A replica's engine following a session that
another replica committed (the source reports it handed over, the new agent serving it)."""

from __future__ import annotations

import time

import pytest

from xapp.control import ControlLoop, UEState
from xapp.tracks import MeasurementReport
from test_control_memory import CELL_A, CELL_B, _app, _telemetry


def test_a_ue_is_away_after_three_of_its_intervals_and_at_least_a_second():
    loop = ControlLoop.__new__(ControlLoop)
    ue = UEState("u", CELL_A, 0.0, last_heard=10.0)
    assert not loop.away(ue, 12.9) and loop.away(ue, 13.1)      # interval unknown: taken as 1 s
    ue.period = 0.2
    assert not loop.away(ue, 10.99) and loop.away(ue, 11.01)    # 3 x 0.2 < the 1 s floor
    ue.period = 1.0
    assert not loop.away(ue, 12.9) and loop.away(ue, 13.1)      # 3 x a 1 s interval


def _report(app, t, ue="7", cell=CELL_A):
    r = MeasurementReport(t, ue, cell, -80.0, e2_node="gnb_a")
    app.tracks.add(r)
    app.control.on_report(r)


def test_a_replica_takes_a_returning_ues_report_as_an_arrival():
    app = _app()
    app.control.arrivals = True
    now = time.time()
    app.control.offset = now - 100.0                          # trace clock: 100 s is now
    for k in range(5):                                        # heard here every 0.2 s
        _report(app, 99.0 + 0.2 * k)
    ue = app.control.ues["7"]
    assert ue.period == pytest.approx(0.2) and ue.e2_node == "gnb_a"
    app.on_telemetry("edge-b", _telemetry("edge-b", []))
    app.on_telemetry("edge-a", _telemetry("edge-a", [("s7", "7")]))
    # another replica committed the session to edge-b while the UE was on its node
    app.on_telemetry("edge-a", _telemetry("edge-a", [("s7", "7")], state="finished"))
    app.on_telemetry("edge-b", _telemetry("edge-b", [("s7", "7")]))
    assert app.engine.session("s7").source == "edge-b"
    kinds = lambda: [e["kind"] for e in app.events.events]    # noqa: E731
    _report(app, 99.9)                                        # 0.1 s later: no change
    assert "ue_returned" not in kinds()
    _report(app, 104.0)                                       # back at CELL_A after 4.1 s
    evs = app.events.events
    back = [e for e in evs if e["kind"] == "ue_returned"]
    assert len(back) == 1 and back[0]["last_heard"] == 99.9
    assert "arrival" in kinds()
    commit, = [e for e in evs if e["kind"] == "commit"]
    assert (commit["session"], commit["source_agent"], commit["target_agent"], commit["to_cell"]) == \
        ("s7", "edge-b", "edge-a", CELL_A)


def test_one_replica_never_takes_a_gap_for_an_arrival():
    app = _app()                                              # arrivals off: one xApp
    _report(app, 99.0)
    _report(app, 120.0)
    assert "ue_returned" not in [e["kind"] for e in app.events.events]


def test_a_replicas_engine_follows_a_move_another_replica_committed():
    app = _app()
    app.on_telemetry("edge-b", _telemetry("edge-b", []))
    app.on_telemetry("edge-a", _telemetry("edge-a", [("s9", "9")]))
    one = _app()                                              # one xApp: never follows
    one.on_telemetry("edge-b", _telemetry("edge-b", []))
    one.on_telemetry("edge-a", _telemetry("edge-a", [("s9", "9")]))
    app.engine.follow_moves = True                            # as PallasXapp sets it with a cluster
    for a in (app, one):
        a.on_telemetry("edge-b", _telemetry("edge-b", [("s9", "9")], state="resumed"))
        assert a.engine.session("s9").source == "edge-a"      # not before the source says so
        a.on_telemetry("edge-a", _telemetry("edge-a", [("s9", "9")], state="handed_over"))
        a.on_telemetry("edge-b", _telemetry("edge-b", [("s9", "9")], state="resumed"))
    assert app.engine.session("s9").source == "edge-b"
    assert one.engine.session("s9").source == "edge-a"
    # the old source's later reports (its stopped copy) move nothing back
    app.on_telemetry("edge-a", _telemetry("edge-a", [("s9", "9")], state="handed_over"))
    app.on_telemetry("edge-a", _telemetry("edge-a", [("s9", "9")], state="serving"))
    assert app.engine.session("s9").source == "edge-b"


def test_a_replica_does_not_commit_a_session_another_replica_handed_over():
    """UE 4 at 78.2 s of the 3-replica default replay (docs/scale-out.md §7): the session's
    source reported it handed over and no agent reported it serving since; the UE's handover
    here commits nothing from that source (it answered STATUS_INVALID), it waits as a pending
    handover until an agent reports the session serving."""
    app = _app()
    app.engine.follow_moves = True
    app.on_telemetry("edge-b", _telemetry("edge-b", []))
    app.on_telemetry("edge-a", _telemetry("edge-a", [("s4", "4")]))
    app.on_telemetry("edge-a", _telemetry("edge-a", [("s4", "4")], state="handed_over"))
    assert app.engine.parked("s4")
    t = time.time() - app.control.offset
    app.control.on_handover("4", CELL_A, CELL_B, t)
    kinds = [e["kind"] for e in app.events.events]
    skipped, = [e for e in app.events.events if e["kind"] == "commit_skipped"]
    assert "commit" not in kinds and skipped["reason"] == "moved by another replica" \
        and skipped["sessions"] == ["s4"]
    assert "4" in app.control._pending_ho
    app.on_telemetry("edge-b", _telemetry("edge-b", [("s4", "4")], state="resumed"))
    assert not app.engine.parked("s4") and app.engine.session("s4").source == "edge-b"
    assert "4" not in app.control._pending_ho                # replayed: already at edge-b
    assert "late_session" in [e["kind"] for e in app.events.events]
    assert "commit" not in [e["kind"] for e in app.events.events]
