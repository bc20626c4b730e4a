"""Three xApp replicas replay one E2 trace against one real redis-server (issue 46 item 3,
docs/scale-out.md §6-§7).

Three :class:`xapp.app.PallasXapp` instances in one process, each a replica of a scale-out
(``controls.cluster.enabled``, E2 node leases and session records in SDL on the private
redis-server of tests/xapp/conftest.py), each fed the whole trace at its recorded pace by its
own ``TraceTransport`` (as test mode does; a non-owner drops what is not its node's). Six E2
nodes in a ring, one cell and one edge agent each; six UEs, each driving from one node's cell
to the next's (a report every 200 ms for 4 s, then the first report from the new cell, sent by
the new node), each with one LLM session at the agent of its first cell. The agents are stubs
shared by the replicas: they record every order with the replica that sent it, answer it (a
stale epoch as STALE_EPOCH, as the real agents do), move a session on an answered commit, and
stream each session in their telemetry with the last epoch they saw.

Checked: every E2 node is owned by exactly one replica; every indication is handled by exactly
one replica (the owner of its node) and dropped by the others; no session ever got orders from
two replicas in one epoch; every UE's handover is committed, at the agent that served the
session; handovers that cross replicas hand the session record over.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from pallas_proto import pallas_pb2 as pb
from test_app_live import _indication

REPO = Path(__file__).resolve().parents[2]
N_NODES, N_REPLICAS = 6, 3
NODES = [f"gnb_001_001_{0xA810 + i:08x}" for i in range(N_NODES)]
CELLS = [0xA8100001 + (i << 12) for i in range(N_NODES)]
PCIS = [101 + i for i in range(N_NODES)]
AGENTS = [f"edge-{i}" for i in range(N_NODES)]
UES = list(range(N_NODES))          # UE u drives from cell u to cell u+1 (mod 6)
REPORTS, PERIOD_S = 20, 0.2


def _trace(t0: float):
    from xapp.e2.trace import TraceRecord
    from xapp.e2.transport import RIC_INDICATION
    recs = []
    for u in UES:
        a, b = u, (u + 1) % N_NODES
        for k in range(REPORTS):
            recs.append(TraceRecord(t0 + PERIOD_S * k + 0.01 * u, NODES[a], RIC_INDICATION,
                                    _indication(CELLS[a], PCIS[a], -80.0 - 0.8 * k, PCIS[b],
                                                -100.0 + 0.8 * k, k, ue=100 + u), 1))
        recs.append(TraceRecord(t0 + PERIOD_S * REPORTS + 0.01 * u, NODES[b], RIC_INDICATION,
                                _indication(CELLS[b], PCIS[b], -80.0, PCIS[a], -100.0, REPORTS,
                                            ue=100 + u), 1))
    return sorted(recs, key=lambda r: r.time)


def _config(ns: str):
    from xapp.config import load_controls
    c = copy.deepcopy(json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"])
    c["scheme"] = "pallas"
    c["agents"] = {AGENTS[i]: {"e2_node_id": NODES[i], "control_address": f"127.0.0.1:{1 + i}",
                               "peer_address": f"127.0.0.1:{1001 + i}"} for i in range(N_NODES)}
    c["cells"] = {str(CELLS[i]): AGENTS[i] for i in range(N_NODES)}
    c["sdl"] = {"store": "memory", "namespace": ns}
    c["cluster"] = {"enabled": True, "lease_s": 3.0, "heartbeat_s": 0.2, "join_delay_s": 0.2,
                    "max_claims": 64}
    return load_controls(c)


class StubAgents:
    """The edge agents, shared by every replica: orders recorded with their sender, answered."""

    def __init__(self):
        self.serving = {f"sess-{u}": AGENTS[u] for u in UES}     # session -> agent decoding it
        self.epochs: dict[str, int] = defaultdict(int)            # session -> highest epoch seen
        self.orders: list[tuple[str, str, str, int, str]] = []   # (replica, rpc, session, epoch, to)
        self.mu = threading.Lock()

    def order(self, replica: str, a) -> pb.ControlReply:
        with self.mu:
            self.orders.append((replica, a.rpc, a.session_id, int(a.epoch), a.source))
            stale = a.epoch < self.epochs[a.session_id]
            if not stale:
                self.epochs[a.session_id] = int(a.epoch)
                if a.rpc == "Commit" and a.scheme != pb.SCHEME_DETOUR:
                    self.serving[a.session_id] = a.actual_target
        status = pb.STATUS_STALE_EPOCH if stale else pb.STATUS_OK
        return pb.ControlReply(status=status, session_id=a.session_id, epoch=a.epoch,
                               scheme=pb.SCHEME_PALLAS)

    def report(self, agent: str) -> pb.TelemetryReport:
        rep = pb.TelemetryReport(agent_id=agent, time=time.time())
        rep.server.model.CopyFrom(pb.ModelIdentity(model="tiny", block_size=32,
                                                   kv_bytes_per_token=16384))
        rep.server.prefill_rate = 5000.0
        rep.server.free_kv_blocks = 10000
        with self.mu:
            for sid, at in self.serving.items():
                if at == agent:
                    rep.sessions.add(session_id=sid, ue_id=str(100 + int(sid.split("-")[1])),
                                     tokens=480, decode_rate=50.0, state="serving",
                                     remaining_tokens=5000, epoch=self.epochs[sid])
        return rep


class ReplicaPolicy:
    """One replica's policy client over the stub agents: each order answered at once."""

    def __init__(self, agents: StubAgents, replica: str):
        self.agents, self.replica, self.on_reply = agents, replica, None

    def send(self, a) -> None:
        from xapp.policy import CallOutcome
        reply = self.agents.order(self.replica, a)
        self.on_reply(CallOutcome(a.rpc, a.source, a.session_id, int(a.epoch), reply, attempts=1))

    def close(self) -> None:
        pass


def _replica(rid, cfg, agents, records, start_at, first_t):
    from xapp.app import PallasXapp
    from xapp.cluster.leases import NodeLeases, open_sdl
    from xapp.cluster.replica import ClusterReplica
    from xapp.e2.transport import TraceTransport
    from xapp.main import ReplayStart
    c = cfg.cluster
    leases = NodeLeases(open_sdl(), rid, cfg.e2_nodes, namespace=cfg.controls["sdl"]["namespace"],
                        lease_s=c.lease_s, max_claims=c.max_claims, join_delay_s=c.join_delay_s)
    start = ReplayStart(start_at, first_t)
    transport = TraceTransport(records, speed=1.0, threaded=True, clock=start.clock)
    app = PallasXapp(cfg, transport, policy=ReplicaPolicy(agents, rid), telemetry=False,
                     nrt=dict(zip(PCIS, CELLS)), offset=start.offset,
                     cluster=ClusterReplica(leases, heartbeat_s=c.heartbeat_s))
    return app


def test_three_replicas_split_the_nodes_and_no_session_gets_one_epoch_from_two(dbaas, sdl_ns):
    from xapp.cluster.ownership import assignment
    cfg = _config(sdl_ns)
    agents = StubAgents()
    t0 = 1000.0
    records = _trace(t0)
    start_at = time.time() + 3.0
    rids = [f"xapp-{i}" for i in range(N_REPLICAS)]
    apps = [_replica(r, cfg, agents, records, start_at, t0) for r in rids]
    want = assignment(NODES, rids)
    stop = threading.Event()

    def telemetry():                       # every agent streams to every replica
        while not stop.wait(0.1):
            for agent in AGENTS:
                rep = agents.report(agent)
                for app in apps:
                    app.on_telemetry(agent, rep)
    tele = threading.Thread(target=telemetry, daemon=True)
    try:
        for app in apps:                   # leases first: every replica claims its share
            app.cluster.start()
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(
                list(app.cluster.leases.owned()) != sorted(n for n in NODES if want[n] == r)
                for app, r in zip(apps, rids)):
            time.sleep(0.05)
        owned = {r: set(app.cluster.leases.owned()) for app, r in zip(apps, rids)}
        tele.start()
        for app in apps:
            app.start()
        assert time.time() < start_at, "the replicas were not ready before the replay's start"
        for app in apps:
            assert app.transport.wait(30.0)
        time.sleep(1.5)                    # replies and commits settle
        owned_end = {r: set(app.cluster.leases.owned()) for app, r in zip(apps, rids)}
    finally:
        stop.set()
        for app in apps:
            app.stop()
            app.cluster.leases.sdl.close()

    # every E2 node owned by exactly one replica, before and after the replay
    for o in (owned, owned_end):
        assert sorted(n for r in rids for n in o[r]) == sorted(NODES), o
        assert all(o[r] == {n for n in NODES if want[n] == r} for r in rids), o
    # every indication handled by exactly one replica, the owner of its node
    per_node = defaultdict(int)
    for rec in records:
        per_node[rec.e2_node] += 1
    for app, r in zip(apps, rids):
        assert app.transport.delivered == len(records)
        assert app.cluster.dropped == {n: k for n, k in per_node.items() if want[n] != r}
    # no session ever got orders from two replicas in one epoch
    senders = defaultdict(set)
    for replica, rpc, sid, epoch, _ in agents.orders:
        senders[(sid, epoch)].add(replica)
    assert all(len(s) == 1 for s in senders.values()), \
        {k: s for k, s in senders.items() if len(s) > 1}
    # every UE's handover committed once, at the agent that served its session
    commits = [(sid, to) for _, rpc, sid, _, to in agents.orders if rpc == "Commit"]
    assert sorted(commits) == sorted((f"sess-{u}", AGENTS[u]) for u in UES), agents.orders
    assert agents.serving == {f"sess-{u}": AGENTS[(u + 1) % N_NODES] for u in UES}
    # handovers crossing replicas: the new node's owner committed and took the record over
    crossing = [u for u in UES if want[NODES[u]] != want[NODES[(u + 1) % N_NODES]]]
    assert crossing, want
    by_commit = {sid: replica for replica, rpc, sid, _, _ in agents.orders if rpc == "Commit"}
    for u in UES:
        assert by_commit[f"sess-{u}"] == want[NODES[(u + 1) % N_NODES]]
    # a session triggered by its first node's owner is handed over at a crossing handover,
    # and committed by the new owner above the old attempt's epoch (docs/scale-out.md §3)
    handed = sum(app.cluster.leases.counters.records_handed_over for app in apps)
    triggered = {sid: e for _, rpc, sid, e, _ in agents.orders if rpc == "Trigger"}
    taken = [f"sess-{u}" for u in crossing if f"sess-{u}" in triggered]
    assert handed == len(taken), (handed, crossing, agents.orders)
    committed = {sid: e for _, rpc, sid, e, _ in agents.orders if rpc == "Commit"}
    assert all(committed[sid] > triggered[sid] for sid in taken), agents.orders
    assert not any(app.dispatcher.refused for app in apps)
