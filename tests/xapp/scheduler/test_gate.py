"""A session's calls wait for its commit in flight; a failed commit leaves the session where it was."""

from pallas_proto import pallas_pb2
from xapp.scheduler import CancelAction, CommitAction, TriggerAction
from xapp.scheduler.gate import CommitGate

from test_engine import T0, add, make_engine


def commit(epoch, src, dst, sid="s1"):
    return CommitAction(sid, epoch, src, dst, None, pallas_pb2.SCHEME_CTHO, T0)


def test_actions_behind_a_commit_wait_and_go_out_in_order_when_it_lands():
    g = CommitGate()
    c1 = commit(1, "a", "b")
    assert g.admit(c1, "ho1") and g.in_flight("s1") == 1
    c2 = commit(2, "b", "c")                     # the UE hands over again before the reply
    trig = TriggerAction("s1", 3, "b", "c", T0 + 5.0, 0.2, 64)
    assert not g.admit(c2, "ho2") and not g.admit(trig, None) and g.held("s1") == 2
    assert g.admit(commit(1, "x", "y", sid="s2"), None)   # other sessions are not held
    assert g.settle(commit(9, "a", "b"), True) == [] and g.held("s1") == 2  # not the one in flight
    out = g.settle(c1, True)
    assert out == [(c2, "ho2"), (trig, None)] and g.in_flight("s1") is None
    # Passed through admit again, the first commit among them holds the rest.
    assert g.admit(c2, "ho2") and not g.admit(trig, None)


def test_a_failed_commit_rebinds_held_actions_to_where_the_session_stayed():
    g = CommitGate()
    c1 = commit(1, "a", "b")
    g.admit(c1, None)
    onward = commit(2, "b", "c")                 # would go to b, which never got the session
    back = commit(3, "b", "a")                   # the UE came back to a: nothing to move
    cancel = CancelAction("s1", 4, "b", "c", "withdrawn")
    for x in (onward, back, cancel):
        assert not g.admit(x, None)
    out = [a for a, _ in g.settle(c1, False)]
    assert out == [commit(2, "a", "c"), CancelAction("s1", 4, "a", "c", "withdrawn")]


def test_engine_binds_the_session_back_after_a_failed_commit(cfg):
    eng = make_engine(cfg)
    add(eng)
    (c,) = eng.on_handover("ue1", "b", T0 + 1.0)
    assert isinstance(c, CommitAction) and eng.session("s1").source == "b"
    eng.on_reply(c, pallas_pb2.ControlReply(status=pallas_pb2.STATUS_INVALID, message="session is finished"))
    assert eng.session("s1").source == "a"
    (c2,) = eng.on_handover("ue1", "c", T0 + 2.0)
    assert c2.source == "a" and eng.session("s1").source == "c"
    eng.on_reply(c2, pallas_pb2.ControlReply(status=pallas_pb2.STATUS_OK))
    assert eng.session("s1").source == "c"
