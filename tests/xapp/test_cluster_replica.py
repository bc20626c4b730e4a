"""The live wiring of scale-out (issue 46, docs/scale-out.md): :class:`xapp.cluster.replica.
ClusterReplica` inside :class:`xapp.app.PallasXapp`.

Without Redis: a fake lease store whose owned set the test sets; the xApp drops and counts the
indications of E2 nodes it does not own, and re-syncs its subscriptions once per change of the
owned set. With the real redis-server (tests/xapp/conftest.py): two xApp instances in one
process (RMR replaced by a recording transport) split the E2 nodes disjointly, and one takes
the other's nodes over when it stops.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path

import pytest

from xapp.cluster.leases import Heartbeat, LeaseCounters
from xapp.cluster.replica import ClusterReplica
from xapp.config import load_controls
from xapp.e2.transport import RIC_INDICATION, RmrMessage

REPO = Path(__file__).resolve().parents[2]
NODES = [f"gnb_001_001_{i:08x}" for i in range(1, 9)]


def _config(nodes=NODES, **cluster):
    c = copy.deepcopy(json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"])
    c["agents"] = {f"edge-{i}": {"e2_node_id": n, "control_address": f"127.0.0.1:{1 + i}",
                                 "peer_address": f"127.0.0.1:{1001 + i}"}
                   for i, n in enumerate(nodes)}
    c["cells"] = {}
    c["cluster"] = {"enabled": True, **cluster}
    return load_controls(c)


class FakeLeases:
    """A lease store without SDL: ``held`` is what the next heartbeat leaves owned."""

    def __init__(self, me="xapp-0", nodes=NODES):
        self.me, self.nodes, self.counters = me, tuple(nodes), LeaseCounters()
        self.held: set[str] = set()
        self._owned: set[str] = set()
        self.beats = 0
        self.fail = False
        self.stopped_on: str | None = None

    def heartbeat(self) -> Heartbeat:
        self.beats += 1
        if self.fail:
            raise ConnectionError("SDL down")
        claimed, released = self.held - self._owned, self._owned - self.held
        self.counters.claims += len(claimed)
        self.counters.releases += len(released)
        self._owned = set(self.held)
        return Heartbeat(tuple(sorted(claimed)), tuple(sorted(released)), (), self.owned())

    def stop(self):
        self.stopped_on = threading.current_thread().name
        out, self._owned = self.owned(), set()
        return out

    def owns(self, node):
        return node in self._owned

    def owned(self):
        return tuple(sorted(self._owned))


class FakeSubscriptions:
    """Records each sync: (E2 nodes of the configuration, owned)."""

    def __init__(self):
        self.syncs: list[tuple[tuple[str, ...], frozenset | None]] = []
        self.deleted = 0
        self.ledger = None

    def sync(self, config, owned=None):
        self.syncs.append((config.e2_nodes, None if owned is None else frozenset(owned)))
        return []

    def start(self):
        return self

    def delete_all(self):
        self.deleted += 1
        return 0


class CountingIngest:
    """Stands in for the E2 ingest: records the E2 node of each indication it is handed."""

    def __init__(self):
        from xapp.e2.ingest import IngestConfig
        self.config, self.stats, self.nodes = IngestConfig(), {}, []

    def on_indication(self, payload, e2_node="", t=None, sub_id=-1):
        self.nodes.append(e2_node)
        return []

    def declare_nodeb(self, e2_node, nodeb):
        return {}


class NullTransport:
    def __init__(self):
        self.on_message = None

    def start(self, on_message):
        self.on_message = on_message

    def stop(self):
        pass


def _xapp(cfg, leases, subscriptions=None, heartbeat_s=0.05, registry=None):
    from xapp.app import PallasXapp
    cluster = ClusterReplica(leases, heartbeat_s=heartbeat_s, registry=registry)
    ingest = CountingIngest()
    app = PallasXapp(cfg, NullTransport(), policy=_NoPolicy(), telemetry=False, ingest=ingest,
                     subscriptions=subscriptions, cluster=cluster)
    return app, cluster, ingest


class _NoPolicy:
    on_reply = None

    def send(self, action):
        raise AssertionError(f"no order expected: {action}")

    def close(self):
        pass


def _until(cond, timeout_s=10.0):
    """Seconds until ``cond()`` held (polled every 20 ms), None if not within ``timeout_s``: a
    deadline for a starved machine, not a bound the product promises."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def _indicate(app, node):
    app.on_message(RmrMessage(RIC_INDICATION, b"\x00", 1, node, time.time()))


def test_an_indication_of_a_node_not_owned_is_dropped_and_counted():
    leases = FakeLeases()
    leases.held = {NODES[0], NODES[1]}
    app, cluster, ingest = _xapp(_config(), leases)
    cluster.beat()
    for node in (NODES[0], NODES[2], NODES[2], NODES[1], "", NODES[3]):
        _indicate(app, node)
    assert ingest.nodes == [NODES[0], NODES[1]]                  # owned: handled
    assert cluster.dropped == {NODES[2]: 2, "": 1, NODES[3]: 1}  # the rest: counted by MEID
    leases.held = {NODES[2]}                                     # a hand-over: the set moves
    cluster.beat()
    _indicate(app, NODES[0])
    _indicate(app, NODES[2])
    assert ingest.nodes[2:] == [NODES[2]] and cluster.dropped[NODES[0]] == 1


def test_without_a_cluster_every_indication_is_handled():
    from xapp.app import PallasXapp
    ingest = CountingIngest()
    app = PallasXapp(_config(), NullTransport(), policy=_NoPolicy(), telemetry=False, ingest=ingest)
    for node in NODES[:3]:
        _indicate(app, node)
    assert ingest.nodes == NODES[:3] and app.cluster is None


def test_a_change_of_the_owned_set_resyncs_the_subscriptions_once():
    leases, subs = FakeLeases(), FakeSubscriptions()
    app, cluster, _ = _xapp(_config(), leases, subs)
    leases.held = {NODES[0], NODES[3]}
    cluster.beat()
    assert subs.syncs == [(tuple(NODES), frozenset({NODES[0], NODES[3]}))]
    for _ in range(3):                      # nothing changed: no sync
        cluster.beat()
    assert len(subs.syncs) == 1 and cluster.resyncs == 1
    leases.held = {NODES[3]}                # one given up
    cluster.beat()
    cluster.beat()
    assert subs.syncs[1:] == [(tuple(NODES), frozenset({NODES[3]}))] and cluster.resyncs == 2


def test_a_failed_heartbeat_is_counted_and_leases_run_out_by_the_clock():
    leases, subs = FakeLeases(), FakeSubscriptions()
    app, cluster, _ = _xapp(_config(), leases, subs)
    leases.held = {NODES[0]}
    cluster.beat()
    leases.fail = True
    leases._owned = set()                   # the lease ran out by this replica's clock
    assert cluster.beat() is None and cluster.heartbeat_failures == 1
    assert subs.syncs[-1][1] == frozenset()  # its subscription is deleted all the same


def test_a_reconfiguration_shares_the_new_nodes_and_syncs_with_the_owned_set():
    leases, subs = FakeLeases(), FakeSubscriptions()
    app, cluster, _ = _xapp(_config(), leases, subs)
    leases.held = {NODES[0]}
    cluster.beat()
    app.reconfigure(_config(NODES[:4]))
    assert leases.nodes == tuple(sorted(NODES[:4]))
    assert subs.syncs[-1] == (tuple(NODES[:4]), frozenset({NODES[0]}))


def test_start_and_stop_run_the_heartbeat_on_its_own_thread_and_release_there():
    leases, subs = FakeLeases(), FakeSubscriptions()
    leases.held = {NODES[1]}
    app, cluster, ingest = _xapp(_config(), leases, subs, heartbeat_s=0.02)
    app.start()
    try:
        assert leases.owned() == (NODES[1],)          # the first heartbeat ran before the transport
        assert _until(lambda: subs.syncs == [(tuple(NODES), frozenset({NODES[1]}))]) is not None
        n = leases.beats
        assert _until(lambda: leases.beats > n + 2) is not None   # and it keeps beating
    finally:
        app.stop()
    assert leases.stopped_on == f"cluster-{leases.me}"   # released where the locks were taken
    assert subs.deleted == 1
    n = leases.beats
    time.sleep(0.1)
    assert leases.beats == n                          # no heartbeat after stop


def test_a_slow_submgr_never_delays_the_lease_renewals():
    """A subscription call waits for submgr (and the first encodes with the E2SM codecs): the
    heartbeat goes on meanwhile, else the leases would run out between renewals."""
    answer = threading.Event()

    class SlowSubscriptions(FakeSubscriptions):
        waiting = False                           # a sync is waiting for submgr

        def sync(self, config, owned=None):
            self.waiting = True
            answer.wait(30.0)                     # submgr answers when the test says so
            return super().sync(config, owned)

    leases, subs = FakeLeases(), SlowSubscriptions()
    leases.held = {NODES[0]}
    app, cluster, _ = _xapp(_config(), leases, subs, heartbeat_s=0.02)
    cluster.start()
    try:
        assert _until(lambda: subs.waiting) is not None
        n = leases.beats
        # beating while the sync still waits (however slowly this machine runs the threads)
        assert _until(lambda: leases.beats >= n + 5) is not None and subs.syncs == []
        answer.set()
        assert _until(lambda: len(subs.syncs) == 1) is not None
    finally:
        answer.set()
        cluster.stop()


def test_the_counters_are_prometheus_metrics():
    from prometheus_client import CollectorRegistry
    reg = CollectorRegistry()
    leases = FakeLeases()
    leases.held = {NODES[0], NODES[1]}
    app, cluster, _ = _xapp(_config(), leases, FakeSubscriptions(), registry=reg)
    cluster.beat()
    leases.counters.records_handed_over, leases.counters.cas_conflicts = 3, 2
    leases.counters.writes_refused["stale_token"] = 1
    _indicate(app, NODES[5])
    v = reg.get_sample_value
    assert v("pallas_xapp_cluster_nodes_owned") == 2
    assert v("pallas_xapp_cluster_lease_changes_total", {"change": "claimed"}) == 2
    assert v("pallas_xapp_cluster_records_handed_over_total") == 3
    assert v("pallas_xapp_cluster_cas_conflicts_total") == 2
    assert v("pallas_xapp_cluster_session_writes_refused_total", {"reason": "stale_token"}) == 1
    assert v("pallas_xapp_cluster_indications_not_owned_total", {"e2_node": NODES[5]}) == 1
    assert v("pallas_xapp_cluster_subscription_resyncs_total") == 1


# -- two replicas on the real redis-server --------------------------------------------------------

# The lease outlives 20 heartbeats: a heartbeat thread starved for most of LEASE on a loaded
# machine would (rightly) lose its leases, and a test of the split would see that instead.
LEASE, BEAT = 2.0, 0.1


class FakeSubmgr:
    """submgr's REST face for one replica: the subscriptions it holds now, by id."""

    def __init__(self):
        self.live: dict[str, str] = {}
        self.n = 0
        self.mu = threading.Lock()

    def subscribe(self, params):
        with self.mu:
            self.n += 1
            sid = f"sub-{self.n}"
            self.live[sid] = params["Meid"]
        return {"SubscriptionId": sid, "SubscriptionInstances": []}

    def unsubscribe(self, sid):
        with self.mu:
            del self.live[sid]

    def nodes(self):
        with self.mu:
            return sorted(self.live.values())


def _replica(rid, cfg, ns):
    from xapp.cluster.leases import NodeLeases, open_sdl
    from xapp.e2.subscription import SubscriptionManager
    c = cfg.cluster
    leases = NodeLeases(open_sdl(), rid, cfg.e2_nodes, namespace=ns, lease_s=c.lease_s,
                        max_claims=c.max_claims, max_releases=c.max_releases,
                        join_delay_s=c.join_delay_s)
    submgr = FakeSubmgr()
    app, cluster, ingest = _xapp(cfg, leases, SubscriptionManager(submgr), heartbeat_s=c.heartbeat_s)
    return app, submgr, ingest


@pytest.mark.parametrize("how", ["stop", "crash"])
def test_two_replicas_split_the_nodes_and_one_takes_over_when_the_other_ends(dbaas, sdl_ns, how,
                                                                          monkeypatch):
    from xapp.cluster.ownership import assignment
    cfg = _config(lease_s=LEASE, heartbeat_s=BEAT, join_delay_s=0.2, max_claims=64)
    (a, sub_a, in_a), (b, sub_b, in_b) = _replica("xapp-a", cfg, sdl_ns), _replica("xapp-b", cfg, sdl_ns)
    try:
        starts = [threading.Thread(target=x.start) for x in (a, b)]
        for t in starts:
            t.start()
        for t in starts:
            t.join()
        want = assignment(NODES, ["xapp-a", "xapp-b"])
        mine = {r: sorted(n for n in NODES if want[n] == r) for r in ("xapp-a", "xapp-b")}
        assert mine["xapp-a"] and mine["xapp-b"]          # both have a share of these 8 nodes

        def split():
            return (list(a.cluster.leases.owned()) == mine["xapp-a"]
                    and list(b.cluster.leases.owned()) == mine["xapp-b"]
                    and sub_a.nodes() == mine["xapp-a"] and sub_b.nodes() == mine["xapp-b"])
        assert _until(split) is not None, (a.cluster.leases.owned(), b.cluster.leases.owned())
        for n in NODES:                                   # every node's report reaches both
            _indicate(a, n)
            _indicate(b, n)
        assert in_a.nodes == mine["xapp-a"] and in_b.nodes == mine["xapp-b"]   # disjoint, all
        assert sum(a.cluster.dropped.values()) == len(mine["xapp-b"])
        assert sum(b.cluster.dropped.values()) == len(mine["xapp-a"])

        if how == "crash":                               # no release: the leases must expire
            monkeypatch.setattr(a.cluster.leases, "stop", lambda: ())
        claims = b.cluster.leases.counters.claims
        t_end = time.monotonic()
        a.stop()
        # a clean stop released every lease (b may hold some already, at its next heartbeat);
        # a crash left them a's until they expire
        held = set(a.cluster.leases.holders(mine["xapp-a"]).values())
        assert ("xapp-a" not in held) if how == "stop" else held == {"xapp-a"}, held
        t_poll = time.monotonic()
        took = _until(lambda: list(b.cluster.leases.owned()) == NODES and sub_b.nodes() == NODES)
        assert took is not None, b.cluster.leases.owned()
        if how == "crash":                                # not before the lease ran out
            assert took + (t_poll - t_end) >= LEASE * 0.9, took
        assert b.cluster.leases.counters.claims - claims == len(mine["xapp-a"])
        assert sub_a.nodes() == []                        # the stopped one unsubscribed
        for n in NODES:
            _indicate(b, n)
        assert in_b.nodes[len(mine["xapp-b"]):] == NODES  # the survivor handles every node now
    finally:
        for x in (a, b):
            x.stop()
            x.cluster.leases.sdl.close()
