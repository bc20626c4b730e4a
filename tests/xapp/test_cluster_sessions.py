"""Session records in the decision path (issue 46, docs/scale-out.md §3, xapp/cluster/sessions.py).

The hand-over rule over its inputs (no Redis); the dispatcher sending nothing whose record was
refused; then :class:`SessionGuard` on the private redis-server with two replicas, one per E2
node: a UE's session moves from the first replica's node to the second's, the second takes
the record over under a new epoch generation, and the first's later orders are refused.
"""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path
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


def _replica(rid, node, ns, epoch):
    from xapp.cluster.leases import NodeLeases, open_sdl
    from xapp.cluster.sessions import SessionGuard
    leases = NodeLeases(open_sdl(), rid, [node], namespace=ns, lease_s=5.0)
    leases.heartbeat()
    assert leases.owned() == (node,)        # x0 and x1: rendezvous gives A to x0, B to x1
    sm = _Machine(epoch)
    views: dict[str, tuple[int, float]] = {}
    engine = SimpleNamespace(session=lambda sid: sm)
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
