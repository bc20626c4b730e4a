"""The E2 subscription lifecycle (xapp.e2.subscription.SubscriptionManager): made through
submgr for every E2 node of the configured agents, retried with backoff when submgr fails,
added and removed when the descriptor changes, deleted at shutdown."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from xapp.config import load_controls
from xapp.e2.subscription import SubscriptionError, SubscriptionLedger, SubscriptionManager

REPO = Path(__file__).resolve().parents[2]


def _config(agents: dict[str, str]):
    """The repository's descriptor with ``agents`` = {agent id: E2 node id}."""
    c = copy.deepcopy(json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"])
    c["agents"] = {aid: {"e2_node_id": node, "control_address": f"{aid}:50051", "peer_address": f"{aid}:50052"}
                   for aid, node in agents.items()}
    c["cells"] = {}
    return load_controls(c)


class FakeSubmgr:
    """submgr's REST API as the manager uses it; ``down`` nodes fail (HTTP 503)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.live: dict[str, str] = {}        # SubscriptionId -> Meid
        self.down: set[str] = set()
        self.n = 0

    def subscribe(self, params: dict) -> dict:
        meid = params["Meid"]
        self.calls.append(("POST", meid))
        if meid in self.down:
            raise SubscriptionError("POST /subscriptions: HTTP 503", 503)
        self.n += 1
        sid = f"sub-{self.n}"
        self.live[sid] = meid
        return {"SubscriptionId": sid, "SubscriptionInstances": []}

    def unsubscribe(self, sid: str) -> None:
        self.calls.append(("DELETE", self.live.get(sid, sid)))
        del self.live[sid]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_subscribes_each_e2_node_once_and_deletes_all_at_shutdown():
    sm = FakeSubmgr()
    mgr = SubscriptionManager(sm, SubscriptionLedger())
    answers = mgr.sync(_config({"a": "gnb_a", "b": "gnb_b", "c": "gnb_a"}))
    assert sorted(sm.live.values()) == ["gnb_a", "gnb_b"] and len(answers) == 2
    assert {v["meid"] for v in mgr.ledger.subscriptions.values()} == {"gnb_a", "gnb_b"}
    assert mgr.delete_all() == 2
    assert sm.live == {} and mgr.active == {} and mgr.ledger.subscriptions == {}
    assert sorted(c for c in sm.calls if c[0] == "DELETE") == [("DELETE", "gnb_a"), ("DELETE", "gnb_b")]


def test_a_failed_subscription_is_retried_with_backoff():
    """Issue 14: a failed subscription was never retried."""
    sm, clock = FakeSubmgr(), Clock()
    sm.down = {"gnb_b"}
    mgr = SubscriptionManager(sm, backoff_s=1.0, max_backoff_s=4.0, clock=clock)
    mgr.sync(_config({"a": "gnb_a", "b": "gnb_b"}))
    assert list(sm.live.values()) == ["gnb_a"] and ("gnb_b", 3) in mgr.pending
    tries = []
    for t in [0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 9.0, 13.0]:
        clock.t = t
        before = sm.calls.count(("POST", "gnb_b"))
        mgr.retry_due()
        if sm.calls.count(("POST", "gnb_b")) > before:
            tries.append(t)
    assert tries == [1.0, 3.0, 8.0, 13.0]                # after 1, 2, 4, 4 (capped) seconds
    sm.down.clear()
    clock.t = 17.0
    assert mgr.retry_due() == 1
    assert sorted(sm.live.values()) == ["gnb_a", "gnb_b"] and mgr.pending == {}


def test_a_reload_adds_and_removes_subscriptions():
    sm = FakeSubmgr()
    mgr = SubscriptionManager(sm)
    mgr.sync(_config({"a": "gnb_a", "b": "gnb_b"}))
    sm.calls.clear()
    mgr.sync(_config({"a": "gnb_a", "d": "gnb_d"}))      # b left the descriptor, d came
    assert sm.calls == [("DELETE", "gnb_b"), ("POST", "gnb_d")]
    assert sorted(sm.live.values()) == ["gnb_a", "gnb_d"]
    sm.calls.clear()
    mgr.sync(_config({"a": "gnb_a", "d": "gnb_d"}))      # nothing changed: nothing sent
    assert sm.calls == []


def test_a_replica_subscribes_only_to_the_e2_nodes_it_owns():
    """Scale-out (docs/scale-out.md): sync with the nodes whose lease the replica holds; a
    node given up or lost is unsubscribed, a node claimed is subscribed, whether an agent names
    it or not (the shared nodes are the RIC's, §2)."""
    sm = FakeSubmgr()
    mgr = SubscriptionManager(sm)
    cfg = _config({"a": "gnb_a", "b": "gnb_b", "c": "gnb_c"})
    mgr.sync(cfg, owned={"gnb_a", "gnb_b", "gnb_x"})  # gnb_x: the RIC's, no agent of its own
    assert sorted(sm.live.values()) == ["gnb_a", "gnb_b", "gnb_x"]
    mgr.sync(cfg, owned={"gnb_a", "gnb_b"})
    assert sorted(sm.live.values()) == ["gnb_a", "gnb_b"]
    sm.calls.clear()
    mgr.sync(cfg, owned={"gnb_b", "gnb_c"})           # gave up gnb_a, claimed gnb_c
    assert sm.calls == [("DELETE", "gnb_a"), ("POST", "gnb_c")]
    sm.calls.clear()
    mgr.sync(cfg, owned=())                           # every lease lost
    assert sm.live == {} and sorted(sm.calls) == [("DELETE", "gnb_b"), ("DELETE", "gnb_c")]


def test_a_removed_node_stops_being_retried():
    sm, clock = FakeSubmgr(), Clock()
    sm.down = {"gnb_b"}
    mgr = SubscriptionManager(sm, clock=clock)
    mgr.sync(_config({"a": "gnb_a", "b": "gnb_b"}))
    mgr.sync(_config({"a": "gnb_a"}))
    clock.t = 100.0
    sm.down.clear()
    assert mgr.retry_due() == 0 and mgr.pending == {}


def test_the_xapp_syncs_subscriptions_on_start_reconfigure_and_stop():
    from xapp.app import PallasXapp

    class NullTransport:
        def start(self, on_message):
            pass

        def stop(self):
            pass

    sm = FakeSubmgr()
    mgr = SubscriptionManager(sm)
    cfg = _config({"a": "gnb_a"})
    app = PallasXapp(cfg, NullTransport(), telemetry=False, subscriptions=mgr)
    app.start()
    try:
        assert list(sm.live.values()) == ["gnb_a"]
        app.reconfigure(_config({"a": "gnb_a", "b": "gnb_b"}))
        assert sorted(sm.live.values()) == ["gnb_a", "gnb_b"]
        assert app.on_subscription_response({"SubscriptionId": "sub-2", "SubscriptionInstances": [
            {"XappEventInstanceId": 1, "E2EventInstanceId": 9}]}) == 1
        assert mgr.ledger.active == {9: "sub-2"}
    finally:
        app.stop()
    assert sm.live == {}                                   # deleted at stop (SIGTERM's path)


def test_sigterm_deletes_the_subscriptions_through_submgr(tmp_path, monkeypatch):
    """pallas-xapp live, RMR replaced by a recording transport: on SIGTERM the xApp deletes at
    submgr every subscription it made (issue 14: the ids were discarded, nothing was deleted)."""
    import os
    import signal
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import xapp.e2.transport as transport_mod
    from xapp import main as xmain

    seen: list[tuple[str, str]] = []

    class Submgr(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(("POST", body["Meid"]))
            out = json.dumps({"SubscriptionId": f"id-{body['Meid']}", "SubscriptionInstances": []}).encode()
            self.send_response(201)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def do_DELETE(self):  # noqa: N802
            seen.append(("DELETE", self.path.rsplit("/", 1)[-1]))
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    class Transport:
        def __init__(self, *a, **kw):
            self.sent = []

        def start(self, on_message):
            pass

        def send(self, mtype, payload, sub_id=-1):
            self.sent.append(mtype)
            return True

        def stop(self):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Submgr)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        http_port = s.getsockname()[1]
    doc = json.loads((REPO / "descriptors" / "config-file.json").read_text())
    doc["controls"]["e2"]["submgr_url"] = f"http://127.0.0.1:{srv.server_port}/ric/v1"
    doc["controls"]["e2"]["client_endpoint"]["http_port"] = http_port
    path = tmp_path / "config-file.json"
    path.write_text(json.dumps(doc))
    nodes = sorted({a["e2_node_id"] for a in doc["controls"]["agents"].values()})
    monkeypatch.setattr(transport_mod, "RmrTransport", Transport)
    old = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    def send_sigterm_once_subscribed():
        for _ in range(200):
            if len(seen) >= len(nodes):
                break
            threading.Event().wait(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=send_sigterm_once_subscribed, daemon=True).start()
    try:
        assert xmain.main(["--mode", "live", "--config", str(path), "--log-level", "WARNING",
                           "--insecure", "--store", "memory"]) == 0
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])
        srv.shutdown()
    assert sorted(m for k, m in seen if k == "POST") == nodes
    assert sorted(m for k, m in seen if k == "DELETE") == [f"id-{n}" for n in nodes]
