"""Session records in the decision path (issue 46, docs/scale-out.md §3, xapp/cluster/sessions.py).

The hand-over rule over its inputs (no Redis); the dispatcher sending nothing whose record was
refused; then :class:`SessionGuard` on the private redis-server with two replicas, one per E2
node: a UE's session moves from the first replica's node to the second's, the second takes
the record over under a new epoch generation, and the first's later orders are refused; a
handover forwarded over SDL pub/sub to the record's owner, which commits it prepared under the
Trigger's epoch while the new node's owner holds its own orders, then takes the record over
with its next order; a forward left unanswered (the owner's lease gone, or the wait over)
decided by the new node's owner (docs/scale-out.md §3 rule 6).
"""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path
import time
from types import SimpleNamespace

import pytest

from pallas_proto import pallas_pb2 as pb
from xapp.cluster.ownership import WriteRefused, Writer, write_session
from xapp.config import load_controls
from xapp.dispatch import ActionDispatcher
from xapp.events import EventLog
from xapp.scheduler import CancelAction, CommitAction, TriggerAction
from xapp.store import EPOCH_COUNTER_BITS, MemoryStore, split_epoch

REPO = Path(__file__).resolve().parents[2]
NODE_A, NODE_B = "gnb_001_001_0000000a", "gnb_001_001_0000000b"
CELL_A, CELL_B = 0xA01, 0xB01


def test_a_take_over_needs_a_view_of_the_ue_at_least_as_recent_as_the_records():
    r0, r1 = Writer("r0", NODE_A, 1), Writer("r1", NODE_B, 1)
    rec, _ = write_session(None, "s", r0, epoch=3, data={}, seen=10.0)
    with pytest.raises(WriteRefused) as e:
        write_session(rec, "s", r1, epoch=4, data={}, seen=9.5)      # r1's report is older
    assert e.value.reason == "moved"
    with pytest.raises(WriteRefused, match="moved"):
        write_session(rec, "s", r1, epoch=4, data={}, seen=None)     # r1 does not see the UE
    new, handed = write_session(rec, "s", r1, epoch=4, data={}, seen=12.0)
    assert handed and (new.owner, new.seen, new.epoch) == ("r1", 12.0, 4)
    same, handed = write_session(new, "s", r1, epoch=5, data={}, seen=None)  # its own: no check
    assert not handed and same.version == 3
    with pytest.raises(WriteRefused, match="moved"):                 # r0 lost the UE: quiet
        write_session(new, "s", r0, epoch=9, data={}, seen=10.0)
    assert type(new).from_dict(json.loads(json.dumps(new.to_dict()))) == new


class _Engine:
    def __init__(self):
        self.replies = []

    def session(self, sid):
        return SimpleNamespace(ue_id="ue-1", epoch=1)

    def on_reply(self, action, reply):
        self.replies.append((action, reply.status))
        if isinstance(action, TriggerAction):          # the attempt is cancelled, as the engine does
            return [CancelAction(action.session_id, action.epoch, action.source, action.target, "x")]
        return []


class _Refusing:
    def __init__(self, refuse):
        self.refuse, self.seen = refuse, []

    def check(self, a):
        self.seen.append(a.rpc)
        return (None, "moved") if a.rpc in self.refuse else (a, "")


class _Sent:
    def __init__(self):
        self.sent = []

    def send(self, a):
        self.sent.append(a)


def _trigger(epoch=2):
    return TriggerAction("s1", epoch, "a", "b", 1010.0, 3.0, 256)


def test_an_order_whose_record_is_refused_is_not_sent_and_the_engine_is_told():
    eng, pol, events = _Engine(), _Sent(), EventLog()
    d = ActionDispatcher(eng, pol, events, threading.RLock(), offset=lambda: 0.0, tokens={},
                         guard=_Refusing({"Trigger", "Cancel"}))
    d.send([_trigger()])
    assert pol.sent == [] and d.refused == 2 and d.pending == {}
    assert [(type(a).__name__, s) for a, s in eng.replies] == [("TriggerAction", pb.STATUS_ERROR),
                                                              ("CancelAction", pb.STATUS_ERROR)]
    ev = [(e["call"], e["reason"]) for e in events.events if e["kind"] == "order_refused"]
    assert ev == [("trigger", "moved"), ("cancel", "moved")]
    commit = CommitAction("s1", 3, "a", "b", None, pb.SCHEME_CTHO, 1011.0)
    d.guard = _Refusing({"Commit"})
    d.send([commit])
    assert d.gate.in_flight("s1") is None          # a refused commit holds nothing behind it
    d.guard = _Refusing(set())
    d.send([_trigger(4)])
    assert [a.rpc for a in pol.sent] == ["Trigger"] and d.refused == 3


def test_without_a_guard_every_order_goes_out_as_decided():
    pol = _Sent()
    d = ActionDispatcher(_Engine(), pol, EventLog(), threading.RLock(), offset=lambda: 0.0, tokens={})
    d.send([_trigger()])
    assert pol.sent == [_trigger()] and d.refused == 0


# -- two replicas on the real redis-server ---------------------------------------------------------

def _config():
    c = copy.deepcopy(json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"])
    c["agents"] = {"edge-a": {"e2_node_id": NODE_A, "control_address": "127.0.0.1:1",
                              "peer_address": "127.0.0.1:1001"},
                   "edge-b": {"e2_node_id": NODE_B, "control_address": "127.0.0.1:2",
                              "peer_address": "127.0.0.1:1002"}}
    c["cells"] = {str(CELL_A): "edge-a", str(CELL_B): "edge-b"}
    return load_controls(c)


class _Machine:
    """What the guard reads and moves of the engine's state machine."""

    def __init__(self, epoch):
        self.ue_id, self.epoch = "ue-1", epoch


class _OneSession:
    """The engine of one session ``s1``, its epoch moved by the engine's own ``renumber``."""

    from xapp.scheduler.engine import SchedulerEngine
    renumber = SchedulerEngine.renumber

    def __init__(self, sm):
        self._slot, self._sm = {"s1": 0}, [sm]

    def session(self, sid):
        return self._sm[self._slot[sid]]


def _replica(rid, node, ns, epoch):
    from xapp.cluster.leases import NodeLeases, open_sdl
    from xapp.cluster.sessions import SessionGuard
    # one heartbeat, none after: the lease must outlive the test however slowly it runs
    leases = NodeLeases(open_sdl(), rid, [node], namespace=ns, lease_s=60.0)
    leases.heartbeat()
    assert leases.owned() == (node,)        # x0 and x1: rendezvous gives A to x0, B to x1
    sm = _Machine(epoch)
    views: dict[str, tuple[int, float]] = {}
    engine = _OneSession(sm)
    cfg = _config()
    guard = SessionGuard(leases, MemoryStore(), engine, views.get, lambda: cfg, threading.RLock())
    return guard, views, sm


def test_the_new_nodes_owner_takes_the_record_over_under_a_new_generation(dbaas, sdl_ns):
    (g0, view0, sm0), (g1, view1, sm1) = (_replica("x0", NODE_A, sdl_ns, 1),
                                          _replica("x1", NODE_B, sdl_ns, 1))
    try:
        view0["ue-1"] = (CELL_A, 10.0)
        trig = TriggerAction("s1", 1, "edge-a", "edge-b", 1012.0, 2.0, 256)
        assert g0.check(trig) == (trig, "")                       # r0 writes the record first
        rec = g0.leases.read_session("s1")
        assert (rec.owner, rec.node, rec.epoch, rec.data["phase"]) == ("x0", NODE_A, 1, "preparing")
        drop = CancelAction("s1", 1, "edge-a", "edge-c", "left the target choice", only_target=True)
        assert g0.check(drop) == (drop, "")                       # an extra withdrawn alone:
        assert g0.leases.read_session("s1").data["phase"] == "preparing"   # the epoch goes on

        # r1 saw the UE arrive at B; its engine commits by the fallback under epoch 2 (its
        # report of the agent's epoch 1, plus one): inside r0's generation 0
        view1["ue-1"] = (CELL_B, 12.0)
        commit = CommitAction("s1", 2, "edge-a", "edge-b", None, pb.SCHEME_CTHO, 1012.0)
        sent, why = g1.check(commit)
        assert why == "" and sent.epoch != 2
        gen, n = split_epoch(sent.epoch)
        assert gen == g1.store.generation > 0 and g1.leases.counters.generations == 1
        assert sm1.epoch > sent.epoch                              # its next attempt goes above
        rec = g1.leases.read_session("s1")
        assert (rec.owner, rec.node, rec.epoch, rec.seen) == ("x1", NODE_B, sent.epoch, 12.0)
        assert g1.leases.counters.records_handed_over == 1

        # r0 lost the UE: the Cancel of its attempt (track gone silent) is refused, not sent
        assert g0.check(CancelAction("s1", 1, "edge-a", "edge-b", "silent")) == (None, "moved")
        # even a fresh epoch from r0 is refused: it has no newer view of the UE
        assert g0.check(TriggerAction("s1", 1 << EPOCH_COUNTER_BITS, "edge-a", "edge-b",
                                      1013.0, 2.0, 256)) == (None, "moved")
        # r1 writing for a node it does not own is refused as well
        view1["ue-1"] = (CELL_A, 13.0)
        assert g1.check(CancelAction("s1", sent.epoch, "edge-b", "edge-a", "x")) == (None, "not_owner")
        assert g0.leases.counters.writes_refused == {"moved": 2}
        assert g1.leases.counters.writes_refused == {"not_owner": 1}

        # the UE comes back to A and r0 sees it: r0 takes over above r1's generation
        view0["ue-1"] = (CELL_A, 14.0)
        back = CommitAction("s1", 5, "edge-b", "edge-a", None, pb.SCHEME_CTHO, 1014.0)
        sent0, why = g0.check(back)
        assert why == "" and sent0.epoch > sent.epoch
        assert split_epoch(sent0.epoch)[0] > g1.store.generation
    finally:
        for g in (g0, g1):
            g.leases.stop()
            g.leases.sdl.close()


def _relay(guard, check_s=0.05, timeout_s=None):
    from xapp.cluster.arrivals import ArrivalRelay
    relay = ArrivalRelay(guard.leases, check_s=check_s, timeout_s=timeout_s)
    got, late = [], []
    relay.attach(lambda *a: got.append(a), lambda *a: late.append(a))
    guard.relay = relay
    return relay, got, late


def _within(cond, timeout_s=10.0):
    """True once ``cond()`` holds (polled every 10 ms), False after ``timeout_s``: a deadline
    for a starved machine, not a bound the product promises."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_a_crossing_handover_is_committed_prepared_by_the_records_owner(dbaas, sdl_ns):
    (g0, view0, sm0), (g1, view1, sm1) = (_replica("x0", NODE_A, sdl_ns, 1),
                                          _replica("x1", NODE_B, sdl_ns, 2))
    (r0, got0, _), (r1, _, late1) = _relay(g0), _relay(g1)
    r0.start()
    r1.start()
    try:
        view0["ue-1"] = (CELL_A, 10.0)
        trig = TriggerAction("s1", 1, "edge-a", "edge-b", 1012.0, 2.0, 256)
        assert g0.check(trig) == (trig, "")                       # x0 prepared edge-b
        # x1 sees the UE's first report at B (t 12.0): x0 holds A's lease, so it is forwarded
        sent_at = time.time()
        assert r1.forward("ue-1", ["s1"], CELL_B, 12.0) == "x0"
        assert _within(lambda: got0 == [("ue-1", CELL_B, 12.0, "x1")]), got0
        # the publication-to-receipt latency of this forward: inside the time the test watched
        assert len(r0.latencies) == 1 and 0 <= r0.latencies[0] <= time.time() - sent_at
        # meanwhile x1's own orders for the session are held (not sent)
        view1["ue-1"] = (CELL_B, 12.0)
        fallback = CommitAction("s1", 2, "edge-a", "edge-b", None, pb.SCHEME_CTHO, 1012.0)
        assert g1.check(fallback) == (None, "forwarded")
        # x0 decides from the forwarded report: the prepared Commit under the Trigger's epoch,
        # its record written for A (the node it holds), seen at the arrival's time
        view0["ue-1"] = (CELL_B, 12.0)
        commit = CommitAction("s1", 1, "edge-a", "edge-b", "edge-b", pb.SCHEME_PALLAS, 1012.0)
        assert g0.check(commit) == (commit, "")
        rec = g0.leases.read_session("s1")
        assert (rec.owner, rec.node, rec.epoch, rec.seen, rec.data["phase"]) == \
            ("x0", NODE_A, 1, 12.0, "committing")
        # x1 sees the arrival decided; its next order takes the record over, above epoch 1
        assert _within(lambda: r1.holds("s1") is None)
        assert late1 == [] and r1.counts["unanswered"] == 0
        view1["ue-1"] = (CELL_B, 13.0)
        nxt = TriggerAction("s1", 2, "edge-b", "edge-a", 1014.0, 2.0, 256)
        sent, why = g1.check(nxt)
        assert why == "" and sent.epoch > 1
        rec = g1.leases.read_session("s1")
        assert (rec.owner, rec.node, rec.seen) == ("x1", NODE_B, 13.0)
        assert g1.leases.counters.records_handed_over == 1
        # x0 lost the UE: its later orders are refused (its view is B, which it does not hold,
        # and the record is no longer its own)
        assert g0.check(CancelAction("s1", 1, "edge-a", "edge-b", "silent")) == (None, "not_owner")
    finally:
        for r, g in ((r0, g0), (r1, g1)):
            r.stop()
            g.leases.stop()
            g.leases.sdl.close()


@pytest.mark.parametrize("how", ["lease_gone", "timeout"])
def test_an_unanswered_forward_is_decided_by_the_new_nodes_owner(dbaas, sdl_ns, how):
    (g0, view0, _), (g1, view1, _) = (_replica("x0", NODE_A, sdl_ns, 1),
                                      _replica("x1", NODE_B, sdl_ns, 2))
    timeout_s = 60.0 if how == "lease_gone" else 0.3
    r1, _, late1 = _relay(g1, timeout_s=timeout_s)
    r1.start()                           # x0 has no relay: it never answers
    try:
        view0["ue-1"] = (CELL_A, 10.0)
        assert g0.check(TriggerAction("s1", 1, "edge-a", "edge-b", 1012.0, 2.0, 256))[1] == ""
        t0 = time.monotonic()
        assert r1.forward("ue-1", ["s1"], CELL_B, 12.0) == "x0"
        if how == "lease_gone":
            g0.leases.stop()             # x0's lease on A is gone: no need to wait for the time
        # lease_gone: decided on the lease's end, within a third of the time-out
        assert _within(lambda: late1 == [("ue-1", CELL_B, 12.0)], 20.0), late1
        took = time.monotonic() - t0
        if how == "timeout":             # decided by the time-out: x0 still holds A's lease
            assert took >= timeout_s, took
            assert g1.leases.holders([NODE_A]) == {NODE_A: "x0"}
        assert r1.counts["unanswered"] == 1 and r1.holds("s1") is None
        # decided here: the take-over, a fallback under a new generation
        view1["ue-1"] = (CELL_B, 12.0)
        sent, why = g1.check(CommitAction("s1", 2, "edge-a", "edge-b", None, pb.SCHEME_CTHO,
                                          1012.0))
        assert why == "" and split_epoch(sent.epoch)[0] == g1.store.generation > 0
        # with no live owner at all an arrival is not forwarded
        if how == "lease_gone":
            assert r1.forward("ue-2", ["s1"], CELL_B, 13.0) is None
    finally:
        r1.stop()
        for g in (g0, g1):
            g.leases.stop()
            g.leases.sdl.close()


def test_the_writer_node_is_the_meid_of_the_ues_latest_report():
    """The record is written for the E2 node the UE's report came from (its RMR MEID, the name
    the leases and admit() use), not for the e2_node_id of the cell's agent: an agent's edge
    serves cells of several E2 nodes. Without a MEID (a forwarded view, a two-field view) the
    cell's agent's node stands in."""
    from xapp.cluster.sessions import view_node
    cfg = _config()
    meid = "gnb_001_01_00040000"         # a trace node no agent names
    assert view_node((CELL_B, 1.0, meid), cfg) == meid
    assert view_node((CELL_B, 1.0, ""), cfg) == view_node((CELL_B, 1.0), cfg) == NODE_B
    assert view_node((0xC01, 1.0), cfg) is None          # a cell of no agent, no MEID


def test_a_replica_writes_for_the_meid_it_owns_whatever_agent_serves_the_cell(dbaas, sdl_ns):
    g0, view0, _ = _replica("x0", NODE_A, sdl_ns, 1)
    try:
        # the UE's report came from NODE_A (owned) while its cell's agent names NODE_B
        view0["ue-1"] = (CELL_B, 10.0, NODE_A)
        trig = TriggerAction("s1", 1, "edge-b", "edge-a", 1012.0, 2.0, 256)
        assert g0.check(trig) == (trig, "")
        rec = g0.leases.read_session("s1")
        assert (rec.owner, rec.node, rec.seen) == ("x0", NODE_A, 10.0)
        # a report from a node x0 does not hold: refused, though the cell's agent names NODE_A
        view0["ue-1"] = (CELL_A, 11.0, NODE_B)
        assert g0.check(CancelAction("s1", 1, "edge-b", "edge-a", "x")) == (None, "not_owner")
    finally:
        g0.leases.stop()
        g0.leases.sdl.close()
