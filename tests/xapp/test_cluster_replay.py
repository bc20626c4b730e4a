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
two replicas in one epoch; every UE's handover is committed once, at the agent that served the
session; a handover that crosses replicas is forwarded by the new node's owner to the owner of
the session's record, which commits it PREPARED under its Trigger's epoch (docs/scale-out.md §3
rule 6), so the per-handover outcomes (prepared commit or fallback, and where) equal those of
one replica on the same trace (both are run). With the record's owner killed before the
handovers (its leases left to expire), its crossing handovers are committed by the fallback by
the new node's owner within the lease time.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
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
    # agent i names node i+3, not the node of its cell (NODES[i], the MEID of cell i's
    # indications): an agent's edge serves cells of other E2 nodes too, and the replicas must
    # key everything by the MEID (docs/scale-out.md §2-§3), never by the agent's e2_node_id
    c["agents"] = {AGENTS[i]: {"e2_node_id": NODES[(i + 3) % N_NODES],
                               "control_address": f"127.0.0.1:{1 + i}",
                               "peer_address": f"127.0.0.1:{1001 + i}"} for i in range(N_NODES)}
    c["cells"] = {str(CELLS[i]): AGENTS[i] for i in range(N_NODES)}
    c["sdl"] = {"store": "memory", "namespace": ns}
    c["cluster"] = {"enabled": True, "lease_s": 3.0, "heartbeat_s": 0.2, "join_delay_s": 0.2,
                    "max_claims": 64}
    return load_controls(c)


@dataclass(frozen=True)
class Order:
    """One order an agent got: its sender, kind, session, epoch, the agent it went to, whether a
    Commit was prepared (its target prepared by a Trigger), and when (wall clock, s)."""

    replica: str
    rpc: str
    session: str
    epoch: int
    to: str
    prepared: bool
    at: float


class StubAgents:
    """The edge agents, shared by every replica: orders recorded with their sender, answered."""

    def __init__(self):
        self.serving = {f"sess-{u}": AGENTS[u] for u in UES}     # session -> agent decoding it
        self.epochs: dict[str, int] = defaultdict(int)            # session -> highest epoch seen
        self.orders: list[Order] = []
        self.mu = threading.Lock()

    def order(self, replica: str, a) -> pb.ControlReply:
        with self.mu:
            self.orders.append(Order(replica, a.rpc, a.session_id, int(a.epoch), a.source,
                                     getattr(a, "prepared_target", None) is not None, time.time()))
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
    return app, start


@dataclass
class Run:
    """What one replay left: the agents' log, the assignment of the nodes over the replicas
    started, the nodes each replica held before and after, and the replicas themselves."""

    agents: StubAgents
    rids: list
    want: dict
    owned: dict
    owned_end: dict
    apps: list
    records: list
    start_at: float
    t0: float
    killed: str | None = None
    stats: dict = field(default_factory=dict)


def _run(sdl_ns: str, rids: list, *, kill: str | None = None, kill_at_s: float = 0.0,
         kill_once=None, settle_s: float = 1.5) -> Run:
    """Replay the trace with one xApp replica per id in ``rids`` (leases first, then the
    replay 3 s later, or 2 s after the leases are shared when that took longer); ``kill``: the replica crashed (leases not released: they expire)
    ``kill_at_s`` into the replay, or later once ``kill_once(agents)`` holds (polled; at the
    latest 0.1 s before the handovers)."""
    from xapp.cluster.ownership import assignment
    cfg = _config(sdl_ns)
    agents = StubAgents()
    t0 = 1000.0
    records = _trace(t0)
    start_at = time.time() + 3.0
    apps, starts = map(list, zip(*(_replica(r, cfg, agents, records, start_at, t0) for r in rids)))
    want = assignment(NODES, rids)
    stop = threading.Event()
    dead: set = set()

    def telemetry():                       # every agent streams to every replica alive
        while not stop.wait(0.1):
            for agent in AGENTS:
                rep = agents.report(agent)
                for app, r in zip(apps, rids):
                    if r not in dead:
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
        if time.time() + 2.0 > start_at:   # a slow machine: the replay starts later, all of it
            start_at = time.time() + 2.0
            for app, start in zip(apps, starts):
                start.move(start_at)
                app.offset = start.offset
        tele.start()
        for app in apps:
            app.start()
        assert time.time() < start_at, "the replicas were not ready before the replay's start"
        if kill is not None:
            victim = apps[rids.index(kill)]
            time.sleep(max(0.0, start_at + kill_at_s - time.time()))
            latest = start_at + PERIOD_S * REPORTS - 0.1
            while kill_once is not None and not kill_once(agents) and time.time() < latest:
                time.sleep(0.01)
            victim.cluster.leases.stop = lambda: ()     # a crash: nothing released
            dead.add(kill)
            victim.stop()
        for app, r in zip(apps, rids):
            if r not in dead:
                assert app.transport.wait(30.0)
        time.sleep(settle_s)               # replies and commits settle
        owned_end = {r: set(app.cluster.leases.owned()) for app, r in zip(apps, rids)}
    finally:
        stop.set()
        for app in apps:
            app.stop()
            app.cluster.leases.sdl.close()
    return Run(agents, rids, want, owned, owned_end, apps, records, start_at, t0, kill)


def _crossing(want: dict) -> list:
    """The UEs whose handover goes from a node of one replica to a node of another."""
    return [u for u in UES if want[NODES[u]] != want[NODES[(u + 1) % N_NODES]]]


def _one_epoch_one_replica(agents: StubAgents) -> None:
    """No session ever got orders from two replicas in one epoch (the agents' log)."""
    senders = defaultdict(set)
    for o in agents.orders:
        senders[(o.session, o.epoch)].add(o.replica)
    assert all(len(s) == 1 for s in senders.values()), \
        {k: s for k, s in senders.items() if len(s) > 1}


def _outcomes(agents: StubAgents) -> dict:
    """session -> [(prepared, agent it was committed from)] over its Commits, in order."""
    out = defaultdict(list)
    for o in agents.orders:
        if o.rpc == "Commit":
            out[o.session].append((o.prepared, o.to))
    return dict(out)


def test_three_replicas_commit_crossing_handovers_prepared_as_one_replica_does(dbaas, sdl_ns):
    rids = [f"xapp-{i}" for i in range(N_REPLICAS)]
    run = _run(sdl_ns + "-3", rids)
    one = _run(sdl_ns + "-1", ["solo"])
    agents, want, apps = run.agents, run.want, run.apps

    # every E2 node owned by exactly one replica, before and after the replay
    for o in (run.owned, run.owned_end):
        assert sorted(n for r in rids for n in o[r]) == sorted(NODES), o
        assert all(o[r] == {n for n in NODES if want[n] == r} for r in rids), o
    # every indication handled by exactly one replica, the owner of its node
    per_node = defaultdict(int)
    for rec in run.records:
        per_node[rec.e2_node] += 1
    for app, r in zip(apps, rids):
        assert app.transport.delivered == len(run.records)
        assert app.cluster.dropped == {n: k for n, k in per_node.items() if want[n] != r}
    _one_epoch_one_replica(agents)
    # every UE's handover committed once, at the agent that served its session
    commits = [(o.session, o.to) for o in agents.orders if o.rpc == "Commit"]
    assert sorted(commits) == sorted((f"sess-{u}", AGENTS[u]) for u in UES), agents.orders
    assert agents.serving == {f"sess-{u}": AGENTS[(u + 1) % N_NODES] for u in UES}
    # a crossing handover is forwarded to the record's owner (the old node's, which triggered
    # it) and committed there, PREPARED, under the Trigger's epoch (docs/scale-out.md §3 rule 6)
    crossing = _crossing(want)
    assert crossing, want
    triggered = {o.session: o for o in agents.orders if o.rpc == "Trigger"}
    committed = {o.session: o for o in agents.orders if o.rpc == "Commit"}
    assert set(triggered) == {f"sess-{u}" for u in UES}, agents.orders
    for u in UES:
        sid = f"sess-{u}"
        c, tr = committed[sid], triggered[sid]
        assert (c.replica, c.prepared, c.epoch) == (want[NODES[u]], True, tr.epoch), (sid, c, tr)
    forwarded = sum(app.relay.counts["forwarded"] for app in apps)
    received = sum(app.relay.counts["received"] for app in apps)
    assert forwarded == received == len(crossing), [app.relay.counts for app in apps]
    assert not any(app.relay.counts[k] for app in apps for k in ("unanswered", "failed", "owner_gone"))
    assert not any(app.dispatcher.refused for app in apps)
    assert sum(app.cluster.leases.counters.records_handed_over for app in apps) == 0
    # the same per-handover outcomes as one replica on the same trace
    assert _outcomes(agents) == _outcomes(one.agents), (agents.orders, one.agents.orders)
    assert all(o.replica == "solo" for o in one.agents.orders)
    # the forward's added latency: publication on SDL to receipt at the records' owner
    lat = sorted(x for app in apps for x in app.relay.latencies)
    assert len(lat) == len(crossing)
    print(f"\nforwarded arrivals: {len(lat)}, SDL publish->receipt median "
          f"{1e3 * lat[len(lat) // 2]:.2f} ms, max {1e3 * lat[-1]:.2f} ms")
    assert lat[-1] < 1.0, lat


def test_a_dead_records_owner_leaves_its_crossing_handovers_to_the_fallback(dbaas, sdl_ns):
    """The replica that triggered (and owns the records of) sessions whose UEs cross to another
    replica's node crashes 0.5 s before the handovers (once it triggered them): each arrival, forwarded to it, goes
    unanswered, and the new node's owner commits by the fallback (not prepared) under a new
    generation within the lease time of the arrival; no epoch ordered by two replicas."""
    rids = ["xapp-a", "xapp-b"]
    from xapp.cluster.ownership import assignment
    want = assignment(NODES, rids)
    out = {r: [u for u in _crossing(want) if want[NODES[u]] == r] for r in rids}
    kill = max(rids, key=lambda r: len(out[r]))
    assert out[kill], want
    mine = {f"sess-{u}" for u in out[kill]}

    def triggered_all(agents):             # the victim prepared its crossing sessions
        with agents.mu:
            return mine <= {o.session for o in agents.orders if o.rpc == "Trigger"}
    run = _run(sdl_ns, rids, kill=kill, kill_at_s=PERIOD_S * REPORTS - 0.5,
               kill_once=triggered_all, settle_s=4.0)
    agents = run.agents
    survivor = next(app for app, r in zip(run.apps, rids) if r != kill)
    lease_s = survivor.cluster.leases.lease_s
    _one_epoch_one_replica(agents)
    triggered = {o.session: o for o in agents.orders if o.rpc == "Trigger"}
    delays = []
    for u in out[kill]:
        sid = f"sess-{u}"
        commits = [o for o in agents.orders if o.rpc == "Commit" and o.session == sid]
        assert len(commits) == 1, (sid, agents.orders)
        c = commits[0]
        assert triggered[sid].replica == kill, (sid, agents.orders)
        assert (c.replica, c.prepared, c.to) == (want[NODES[(u + 1) % N_NODES]], False, AGENTS[u])
        assert c.epoch > triggered[sid].epoch
        arrived = run.start_at + PERIOD_S * REPORTS + 0.01 * u     # the arrival report, wall
        delays.append(c.at - arrived)
        assert c.at - arrived <= lease_s + 2 * survivor.cluster.heartbeat_s, (c.at - arrived, lease_s)
        assert agents.serving[sid] == AGENTS[(u + 1) % N_NODES]
    print(f"\ndead records' owner: {len(delays)} crossing handovers committed by the fallback "
          f"{min(delays):.2f}-{max(delays):.2f} s after the arrival (lease {lease_s} s)")
    counts = survivor.relay.counts
    assert counts["forwarded"] == len(out[kill]), counts
    assert counts["unanswered"] == len(out[kill]) and counts["received"] == 0, counts
