"""The xApp's gRPC client to the agents (xapp.policy): calls of different sessions never wait
behind each other, calls of one session stay in order, the reply cache is bounded, and the
clients follow the descriptor's agents (new, removed, moved)."""

from __future__ import annotations

import queue
import threading
import time
from concurrent import futures

import grpc
import pytest

from pallas_proto import pallas_pb2 as pb
from pallas_proto import pallas_pb2_grpc as pbg
from xapp.policy import AgentEndpoint, PolicyClient, TelemetryConsumer


class SlowAgent(pbg.ControlServicer):
    """Commit blocks until ``release`` is set (a Full-Copy commit moving a large cache);
    every call is recorded in arrival order."""

    def __init__(self, name: str = "edge-a") -> None:
        self.name = name
        self.release = threading.Event()
        self.order: "queue.Queue[tuple[str, str, int]]" = queue.Queue()

    def _ok(self, req):
        return pb.ControlReply(status=pb.STATUS_OK, session_id=req.session_id, epoch=req.epoch)

    def Trigger(self, request, context):
        self.order.put(("Trigger", request.session_id, request.epoch))
        return self._ok(request)

    def Cancel(self, request, context):
        self.order.put(("Cancel", request.session_id, request.epoch))
        return self._ok(request)

    def Commit(self, request, context):
        self.order.put(("Commit", request.session_id, request.epoch))
        self.release.wait(30)
        return self._ok(request)

    def Telemetry(self, request, context):
        while context.is_active():
            yield pb.TelemetryReport(agent_id=self.name, time=time.time())
            time.sleep(0.02)


@pytest.fixture
def agent():
    a = SlowAgent()
    srv = grpc.server(futures.ThreadPoolExecutor(8))
    pbg.add_ControlServicer_to_server(a, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    a.address = f"127.0.0.1:{port}"
    yield a
    a.release.set()
    srv.stop(0)


def _client(agent, **kw):
    eps = {"edge-a": AgentEndpoint("edge-a", agent.address, "127.0.0.1:1"),
           "edge-b": AgentEndpoint("edge-b", "127.0.0.1:2", "127.0.0.1:2")}
    return PolicyClient(eps, **kw)


def test_a_slow_commit_does_not_hold_another_sessions_calls(agent):
    """Issue 14: one worker thread per agent, so a 60 s Commit blocked every other session's
    calls to that agent."""
    c = _client(agent)
    try:
        slow = c.commit("edge-a", "s1", 1, "edge-b")
        assert agent.order.get(timeout=5) == ("Commit", "s1", 1)
        fast = c.trigger("edge-a", "s2", 1, "edge-b")
        out = fast.result(timeout=3)            # answered while s1's commit still runs
        assert out.ok and out.session_id == "s2" and not slow.done()
    finally:
        agent.release.set()
        c.close()


def test_calls_of_one_session_keep_their_order(agent):
    c = _client(agent)
    try:
        c.commit("edge-a", "s1", 1, "edge-b")
        later = c.cancel("edge-a", "s1", 2)    # must not overtake the commit before it
        assert agent.order.get(timeout=5) == ("Commit", "s1", 1)
        time.sleep(0.3)
        assert agent.order.empty() and not later.done()
        agent.release.set()
        assert later.result(timeout=5).ok
        assert agent.order.get(timeout=1) == ("Cancel", "s1", 2)
    finally:
        agent.release.set()
        c.close()


def test_the_reply_cache_is_bounded_and_forgets_a_session(agent):
    c = _client(agent, cache_size=3)
    agent.release.set()
    try:
        for i in range(5):
            c.trigger("edge-a", f"s{i}", 1, "edge-b").result(timeout=5)
        assert [k[2] for k in c._done] == ["s2", "s3", "s4"]
        c.forget_session("s3")
        assert [k[2] for k in c._done] == ["s2", "s4"]
        assert not c._tails                      # no Future kept once answered
    finally:
        c.close()


def test_the_same_order_to_two_agents_reaches_both(agent):
    """The restart's Cancel goes to the source and to the target with the same session and
    epoch: the reply cache is per agent, so the second is sent, not answered from the first."""
    b = SlowAgent("edge-b")
    srv = grpc.server(futures.ThreadPoolExecutor(4))
    pbg.add_ControlServicer_to_server(b, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    c = PolicyClient({"edge-a": AgentEndpoint("edge-a", agent.address, "127.0.0.1:1"),
                      "edge-b": AgentEndpoint("edge-b", f"127.0.0.1:{port}", "127.0.0.1:2")})
    try:
        first = c.cancel("edge-a", "s1", 7, "xapp restarted").result(timeout=5)
        second = c.cancel("edge-b", "s1", 7, "xapp restarted").result(timeout=5)
        again = c.cancel("edge-b", "s1", 7, "xapp restarted").result(timeout=5)
    finally:
        c.close()
        srv.stop(0)
    assert (first.agent_id, first.cached, second.agent_id, second.cached) == \
        ("edge-a", False, "edge-b", False)
    assert again.cached                          # a repeat to the same agent is answered
    assert agent.order.get_nowait() == ("Cancel", "s1", 7)
    assert b.order.get_nowait() == ("Cancel", "s1", 7) and b.order.empty()


def test_triggers_of_one_epoch_at_two_targets_are_two_calls(agent):
    """Issue 45: a second target of the same epoch is a call of its own (the reply cache is
    per target for a Trigger), and each outcome names its target."""
    eps = {n: AgentEndpoint(n, agent.address, f"127.0.0.1:{i + 1}")
           for i, n in enumerate(("edge-a", "edge-b", "edge-c"))}
    c = PolicyClient(eps)
    try:
        outs = [c.trigger("edge-a", "s1", 3, t).result(timeout=5) for t in ("edge-b", "edge-c", "edge-c")]
    finally:
        c.close()
    assert [(o.target, o.cached) for o in outs] == [("edge-b", False), ("edge-c", False), ("edge-c", True)]
    assert [agent.order.get_nowait() for _ in range(2)] == [("Trigger", "s1", 3)] * 2
    assert agent.order.empty()


def test_targeted_cancels_of_one_epoch_and_its_untargeted_cancel_are_separate_calls(agent):
    """Issue 45: a Cancel naming a target (an extra withdrawn) is a call of its own, cached per
    target, so neither a Cancel at another target nor the epoch's untargeted Cancel is
    answered from its cache; each outcome names what it cancelled."""
    from xapp.scheduler import CancelAction

    eps = {n: AgentEndpoint(n, agent.address, f"127.0.0.1:{i + 1}")
           for i, n in enumerate(("edge-a", "edge-b", "edge-c"))}
    c = PolicyClient(eps)
    try:
        outs = [c.send(CancelAction("s1", 3, "edge-a", t, "x", only_target=True)).result(timeout=5)
                for t in ("edge-c", "edge-b", "edge-c")]
        outs.append(c.cancel("edge-a", "s1", 3, "withdrawn").result(timeout=5))
    finally:
        c.close()
    assert [(o.target, o.cached) for o in outs] == [("edge-c", False), ("edge-b", False),
                                                    ("edge-c", True), ("", False)]
    assert [agent.order.get_nowait() for _ in range(3)] == [("Cancel", "s1", 3)] * 3
    assert agent.order.empty()


def test_an_agents_address_change_is_followed(agent):
    c = _client(agent)
    agent.release.set()
    moved = SlowAgent()
    moved.release.set()
    srv = grpc.server(futures.ThreadPoolExecutor(4))
    pbg.add_ControlServicer_to_server(moved, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:
        assert c.trigger("edge-a", "s1", 1, "edge-b").result(timeout=5).ok
        c.set_agents({"edge-a": AgentEndpoint("edge-a", f"127.0.0.1:{port}", "127.0.0.1:1"),
                      "edge-b": AgentEndpoint("edge-b", "127.0.0.1:2", "127.0.0.1:2")})
        assert c.trigger("edge-a", "s2", 1, "edge-b").result(timeout=5).ok
        assert moved.order.get(timeout=1) == ("Trigger", "s2", 1)
        c.set_agents({"edge-b": AgentEndpoint("edge-b", "127.0.0.1:2", "127.0.0.1:2")})
        with pytest.raises(KeyError):
            c.trigger("edge-a", "s3", 1, "edge-b")
    finally:
        c.close()
        srv.stop(0)


def test_telemetry_streams_follow_the_agent_map(agent):
    seen: "queue.Queue[str]" = queue.Queue()
    tc = TelemetryConsumer({"edge-a": AgentEndpoint("edge-a", agent.address, "x")},
                           lambda aid, rep: seen.put(aid), period_ms=20, retry_s=0.05)
    other = SlowAgent("edge-c")
    srv = grpc.server(futures.ThreadPoolExecutor(4))
    pbg.add_ControlServicer_to_server(other, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:
        tc.start()
        assert seen.get(timeout=5) == "edge-a"
        opened = tc.set_agents({"edge-c": AgentEndpoint("edge-c", f"127.0.0.1:{port}", "x")})
        assert opened == ["edge-c"] and tc.streams == {"edge-c": f"127.0.0.1:{port}"}
        while seen.get(timeout=5) != "edge-c":
            pass
        # the address of edge-c moves to edge-a's server: the stream is reopened there
        assert tc.set_agents({"edge-c": AgentEndpoint("edge-c", agent.address, "x")}) == ["edge-c"]
        assert tc.streams == {"edge-c": agent.address}
    finally:
        tc.stop()
        srv.stop(0)


def test_control_orders_are_held_to_their_message_limit(agent):
    """Per-RPC limits on the xApp's channels (pallas_common.msglimits): an order of exactly the
    Control request limit goes, one byte more is refused before it is sent."""
    from pallas_common.msglimits import CONTROL_REQUEST_MAX

    c = _client(agent, retries=0)
    base = pb.CancelRequest(session_id="s1", epoch=3).ByteSize()
    try:
        outs = []
        for extra in (0, 1):
            n = CONTROL_REQUEST_MAX - base - 3 + extra     # a 3-byte length prefix for the reason
            assert pb.CancelRequest(session_id="s1", epoch=3 + extra, reason="r" * n).ByteSize() \
                == CONTROL_REQUEST_MAX + extra
            outs.append(c.cancel("edge-a", "s1", 3 + extra, "r" * n).result(timeout=5))
    finally:
        c.close()
    assert outs[0].ok
    assert outs[1].reply is None and "RESOURCE_EXHAUSTED" in outs[1].error \
        and "Sent message larger than max" in outs[1].error, outs[1].error
    assert agent.order.get_nowait() == ("Cancel", "s1", 3) and agent.order.empty()


def test_close_waits_for_queued_calls_at_most_close_wait_s(agent):
    """A shutdown's share (xapp.main --shutdown-s): a Commit the target still moves (60 s
    deadline) does not hold close(); the call in flight ends CANCELLED (not retried), the one
    queued behind it ends with an error without being sent."""
    c = _client(agent, close_wait_s=0.3)
    slow = c.commit("edge-a", "s1", 1, "edge-b")
    behind = c.cancel("edge-a", "s1", 2)
    assert agent.order.get(timeout=5) == ("Commit", "s1", 1)
    t0 = time.monotonic()
    c.close()
    assert 0.3 <= time.monotonic() - t0 < 10.0      # waited its share, not the Commit's 60 s
    out = slow.result(timeout=10)
    assert not out.ok and "CANCELLED" in out.error and out.attempts == 1, out
    agent.release.set()
    assert not behind.result(timeout=5).ok and agent.order.empty()   # ended, never sent


def test_a_call_that_fails_outside_grpc_still_ends_its_future():
    """A fault in a call (here: the channel cannot be made) ends the call's Future with the
    error, so the session's next call runs and close() does not wait for it forever."""
    def no_channel(address, options=None):
        raise RuntimeError("no channel")
    c = PolicyClient({"edge-a": AgentEndpoint("edge-a", "127.0.0.1:1", "127.0.0.1:1")},
                     channel_factory=no_channel)
    first = c.trigger("edge-a", "s1", 1, "edge-a").result(timeout=5)
    assert not first.ok and "no channel" in first.error
    assert not c.cancel("edge-a", "s1", 2).result(timeout=5).ok    # the next one ran too
    c.close()
