"""The E2 nodes the replicas share (issue 46, docs/scale-out.md §2, xapp/cluster/nodes.py).

Pure parts: names normalised and refused, e2mgr's ``/v1/nodeb/states`` parsed, the trace's
nodes read. e2mgr over HTTP: a local server answering as e2mgr does, failing, or too long.
:class:`ClusterReplica` reading its node source before the first heartbeat and then every
``refresh_s`` (a fake lease store and clock). On the real redis-server: three test-mode
replicas (``open_cluster`` over a trace of twelve E2 nodes) own every node exactly once.
"""

from __future__ import annotations

import copy
import http.server
import json
import threading
import time
from pathlib import Path

import pytest

from xapp.cluster.nodes import (E2mgrNodes, StaticNodes, normalise_node, normalise_nodes,
                                parse_nodeb_states, trace_nodes)
from xapp.cluster.ownership import assignment
from xapp.cluster.replica import ClusterReplica
from xapp.config import load_controls
from xapp.e2.trace import TraceRecord, write_trace

REPO = Path(__file__).resolve().parents[2]
TRACE_NODES = [f"gnb_001_01_{0x40000 + 0x40 * i:08x}" for i in range(12)]


def test_a_node_name_is_stripped_and_refused_outside_its_alphabet():
    assert normalise_node("  gnb_001_01_00040000\n") == "gnb_001_01_00040000"
    assert normalise_node("enb:208-92-1a.b") == "enb:208-92-1a.b"
    for bad in ("", "   ", "gnb 1", "gnb/1", "gnb*", "x" * 151, None, 7, b"gnb"):
        assert normalise_node(bad) is None, bad
    assert normalise_node("x" * 150) == "x" * 150
    assert normalise_nodes(["b", " a", "b", "a*", None]) == (("a", "b"), 2)


def test_e2mgr_states_keep_the_connected_nodes_and_those_without_a_status():
    body = json.dumps([
        {"inventoryName": "gnb_b", "globalNbId": {"plmnId": "02f810", "nbId": "1"},
         "connectionStatus": "CONNECTED"},
        {"inventoryName": "gnb_a"},                                     # an older e2mgr
        {"inventoryName": "gnb_c", "connectionStatus": "DISCONNECTED"},
        {"inventoryName": "gnb_d", "connectionStatus": "SHUTTING_DOWN"},
        {"inventoryName": "bad name", "connectionStatus": "CONNECTED"},
        {"connectionStatus": "CONNECTED"},                              # no name
    ])
    assert parse_nodeb_states(body) == (("gnb_a", "gnb_b"), 2)
    assert parse_nodeb_states(b"[]") == ((), 0)
    for bad in ('{"inventoryName": "gnb_a"}', '["gnb_a"]', "not json"):
        with pytest.raises(ValueError):
            parse_nodeb_states(bad)


def _trace(path, nodes):
    recs = [TraceRecord(1000.0 + i, n, 12050, b"\x00") for i, n in enumerate(nodes)]
    recs.append(TraceRecord(2000.0, "", 20010, b"{}"))                  # A1: no node
    recs.append(TraceRecord(2001.0, "gnb_not_indicating", 12011, b""))  # not an indication
    write_trace(path, recs)
    return path


def test_the_trace_nodes_are_the_meids_of_its_indications(tmp_path):
    p = _trace(tmp_path / "t.e2trace", TRACE_NODES + TRACE_NODES[:3] + ["bad node"])
    assert trace_nodes(p) == tuple(sorted(TRACE_NODES))


class _E2mgr(http.server.BaseHTTPRequestHandler):
    answer: tuple[int, bytes] = (200, b"[]")

    def do_GET(self):          # noqa: N802 (http.server's name)
        status, body = type(self).answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def e2mgr():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _E2mgr)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1/nodeb/states"
    srv.shutdown()
    srv.server_close()


def test_e2mgr_nodes_over_http(e2mgr):
    _E2mgr.answer = (200, json.dumps([{"inventoryName": n, "connectionStatus": "CONNECTED"}
                                      for n in ("gnb_2", "gnb_1")]).encode())
    src = E2mgrNodes(e2mgr, timeout_s=5.0, max_bytes=200)
    assert src.nodes() == ("gnb_1", "gnb_2") and src.failures == 0
    _E2mgr.answer = (200, b"[" + b'{"inventoryName": "gnb_x"},' * 20 + b"{}]")   # over 200 octets
    assert src.nodes() is None and src.failures == 1
    _E2mgr.answer = (503, b"[]")
    assert src.nodes() is None and src.failures == 2
    _E2mgr.answer = (200, b'{"error": "x"}')
    assert src.nodes() is None and src.failures == 3
    gone = E2mgrNodes("http://127.0.0.1:9/v1/nodeb/states", timeout_s=2.0)   # nothing listens
    assert gone.nodes() is None and gone.failures == 1
    with pytest.raises(ValueError):
        E2mgrNodes("e2mgr:3800/v1/nodeb/states")


class _Leases:
    """A lease store that owns nothing; ``nodes`` is what the replica shares."""

    def __init__(self):
        self.me, self.nodes, self.counters = "xapp-0", (), None
        self.beats_saw: list[tuple[str, ...]] = []

    def heartbeat(self):
        self.beats_saw.append(self.nodes)

    def stop(self):
        return ()

    def owns(self, node):
        return False

    def owned(self):
        return ()


class _Source:
    def __init__(self, *answers):
        self.answers, self.reads = list(answers), 0

    def nodes(self):
        self.reads += 1
        return self.answers.pop(0)


def test_the_replica_reads_its_node_source_before_the_first_heartbeat_then_every_refresh():
    clock = [0.0]
    leases = _Leases()
    src = _Source(("gnb_a", "gnb_b"), None, ("gnb_b", "gnb_c"))
    rep = ClusterReplica(leases, heartbeat_s=0.05, clock=lambda: clock[0], nodes=src, refresh_s=10.0)
    rep.start(wait_s=30.0)
    try:
        assert leases.beats_saw[0] == ("gnb_a", "gnb_b")      # the first heartbeat had them
        assert not rep.refresh_nodes() and src.reads == 1      # not due: the source not read
        clock[0] = 10.0
        assert not rep.refresh_nodes() and src.reads == 2      # it did not know: set kept
        assert leases.nodes == ("gnb_a", "gnb_b")
        clock[0] = 20.0
        assert rep.refresh_nodes() and leases.nodes == ("gnb_b", "gnb_c")
        rep.follow(_config())                                  # a source: config not shared
        assert leases.nodes == ("gnb_b", "gnb_c") and rep.node_refreshes == 2
    finally:
        rep.stop()


def _config(**cluster):
    c = copy.deepcopy(json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"])
    c["cluster"] = {"enabled": True, **cluster}
    return load_controls(c)


def test_three_test_mode_replicas_own_every_trace_node_exactly_once(dbaas, sdl_ns, tmp_path):
    """The real wiring (open_cluster in test mode) on the real redis-server: the shared set is
    the trace's twelve E2 nodes, not the three the agents name."""
    from xapp.main import open_cluster
    trace = _trace(tmp_path / "t.e2trace", TRACE_NODES)
    cfg = _config(lease_s=3.0, heartbeat_s=0.1, join_delay_s=0.2)
    cfg = load_controls({**cfg.controls, "sdl": {"store": "sdl", "namespace": sdl_ns}})
    assert not set(cfg.e2_nodes) & set(TRACE_NODES)
    reps = [open_cluster(cfg, f"xapp-{i}", trace=str(trace)) for i in range(3)]
    want = assignment(TRACE_NODES, [r.replica_id for r in reps])
    try:
        for r in reps:
            r.start(wait_s=30.0)
            assert r.leases.nodes == tuple(sorted(TRACE_NODES))
        # xapp-0 started first and took every node; the others take their shares once they
        # count (join delay), a few nodes a heartbeat: wait for the rendezvous shares
        owners = {}
        t0 = time.monotonic()     # a deadline for a starved machine, not a promised bound
        while time.monotonic() - t0 < 30.0:
            owners = {n: [r.replica_id for r in reps if r.leases.owns(n)] for n in TRACE_NODES}
            if owners == {n: [w] for n, w in want.items()}:
                break
            time.sleep(0.05)
        assert owners == {n: [w] for n, w in want.items()}     # every node owned exactly once
        assert all(r.leases.owned() for r in reps)             # each owns some
        for r in reps:                                         # admit() is by the MEID
            mine = r.leases.owned()
            assert all(r.admit(n) for n in mine)
            assert not any(r.admit(n) for n in TRACE_NODES if n not in mine)
            assert not any(r.admit(n) for n in cfg.e2_nodes)
    finally:
        for r in reps:
            r.stop()
            r.leases.sdl.close()
