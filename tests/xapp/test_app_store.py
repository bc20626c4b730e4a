"""The xApp's durable state wired into the running xApp (issue 16): the Scheduler Engine's epochs
come from the store, every order and reply goes through the MigrationJournal, sessions opening
and ending are recorded, and at start the migrations left in flight are cancelled or committed
again. Also: the RAN function versions of each configured E2 node from the R-NIB."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

from pallas_proto import pallas_pb2 as pb
from test_app_live import _RecordingPolicy
from xapp.policy import CallOutcome
from xapp.store import EPOCH_COUNTER_BITS, InFlightMigration, MemoryStore, SessionBinding

REPO = Path(__file__).resolve().parents[2]


class _Policy(_RecordingPolicy):
    """Records orders; an unknown agent raises KeyError, as PolicyClient does."""

    def cancel(self, source, session, epoch, reason=""):
        if source not in ("edge-a", "edge-b"):
            raise KeyError(source)
        super().cancel(source, session, epoch, reason)


def _app(store, policy, **kw):
    from xapp.app import EventLog, PallasXapp
    from xapp.config import load_controls
    c = copy.deepcopy(json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"])
    c["scheme"] = "pallas"
    c["agents"] = {
        "edge-a": {"e2_node_id": "gnb_a", "control_address": "127.0.0.1:1", "peer_address": "127.0.0.1:1001"},
        "edge-b": {"e2_node_id": "gnb_b", "control_address": "127.0.0.1:2", "peer_address": "127.0.0.1:1002"}}
    c["cells"] = {"1": "edge-a", "2": "edge-b"}
    return PallasXapp(load_controls(c), transport=None, policy=policy, telemetry=False,
                      events=EventLog(None), store=store, **kw)


def _report(agent: str, state: str = "serving") -> pb.TelemetryReport:
    rep = pb.TelemetryReport(agent_id=agent, time=time.time())
    rep.server.model.CopyFrom(pb.ModelIdentity(model="tiny", block_size=32, kv_bytes_per_token=16384))
    rep.server.prefill_rate, rep.server.free_kv_blocks = 5000.0, 10000
    rep.sessions.add(session_id="s1", ue_id="7", tokens=300, decode_rate=40.0, state=state,
                     remaining_tokens=5000)
    return rep


def test_orders_replies_and_session_ends_go_through_the_journal_with_the_stores_epochs():
    st = MemoryStore()
    st.generation = 3
    g = 3 << EPOCH_COUNTER_BITS
    policy = _RecordingPolicy()
    app = _app(st, policy)
    app._on_telemetry("edge-a", _report("edge-a"))
    assert st.binding("s1") == SessionBinding("s1", "edge-a", "7", pb.SCHEME_PALLAS, pb.SCHEME_CTHO)
    sm = app.engine.session("s1")
    assert sm.epoch == g | 1
    sm.predict("edge-b", time.time() + 2.0)
    app.dispatcher.send([sm.trigger(time.time(), 0.5, 0)])
    assert policy.calls == [("Trigger", "edge-a", "s1", g | 1, "edge-b")]
    assert st.migration("s1").phase == "preparing" and st.migration("s1").epoch == g | 1
    app.dispatcher.send(sm.handover("edge-b", time.time(), True))
    assert policy.calls[-1] == ("Commit", "edge-a", "s1", g | 1, "edge-b")
    assert (st.migration("s1").phase, sm.epoch) == ("committing", g | 2)
    app.dispatcher.on_reply(CallOutcome("Commit", "edge-a", "s1", g | 1, pb.ControlReply(
        status=pb.STATUS_OK, session_id="s1", epoch=g | 1, state=pb.SESSION_HANDED_OVER)))
    assert st.migration("s1") is None and st.binding("s1").agent_id == "edge-b"
    app._on_telemetry("edge-b", _report("edge-b", "finished"))    # the session ends where it is
    assert (st.binding("s1"), st.migration("s1"), st.last_epoch("s1")) == (None, None, 0)


def test_at_start_the_migrations_left_in_flight_are_cancelled_or_committed_once():
    st = MemoryStore()
    st.put_migration(InFlightMigration("s1", 11, "edge-a", "edge-b", "preparing", pb.SCHEME_PALLAS, 5.0, 1.0))
    st.put_migration(InFlightMigration("s2", 12, "edge-b", "edge-a", "committing", pb.SCHEME_PALLAS, 6.0, 2.0))
    st.put_migration(InFlightMigration("s3", 13, "edge-gone", "edge-a", "preparing", 0, 0.0, 3.0))
    policy = _Policy()
    app = _app(st, policy)
    app.start_telemetry()
    app.start_telemetry()
    # A preparing migration is cancelled at its source and at its target (the source may not
    # reach the target); one whose source is no longer configured, at its target alone.
    assert policy.calls == [("Cancel", "edge-a", "s1", 11, None), ("Cancel", "edge-b", "s1", 11, None),
                            ("Commit", "edge-b", "s2", 12, "edge-a"), ("Cancel", "edge-a", "s3", 13, None)]

    def reply(kind, agent, sid, epoch):
        app.dispatcher.on_reply(CallOutcome(kind, agent, sid, epoch, pb.ControlReply(
            status=pb.STATUS_OK, session_id=sid, epoch=epoch)))

    reply("Cancel", "edge-a", "s1", 11)
    reply("Commit", "edge-b", "s2", 12)
    assert [m.session_id for m in st.migrations()] == ["s1", "s3"]   # s1: the target has not answered
    reply("Cancel", "edge-b", "s1", 11)
    reply("Cancel", "edge-a", "s3", 13)
    assert st.migrations() == []
    assert st.binding("s2").agent_id == "edge-a"                 # the repeated commit rebound it


def test_each_configured_e2_nodes_declared_versions_come_from_the_rnib():
    from ricxappframe.entities.rnib.nodeb_info_pb2 import NodebInfo
    nb = NodebInfo()
    f = nb.gnb.ran_functions.add()
    f.ran_function_id, f.ran_function_oid = 2, "1.3.6.1.4.1.53148.1.2.2.2"
    asked = []

    def get_nodeb(meid):
        asked.append(meid)
        if meid == "gnb_b":
            raise ConnectionError("SDL down")
        return nb
    app = _app(MemoryStore(), _RecordingPolicy())
    assert app.declare_nodebs(get_nodeb) == {"gnb_a": {2: ("kpm", "2.03")}}
    assert asked == ["gnb_a", "gnb_b"] and app.ingest.declared == {("gnb_a", 2): "2.03"}
