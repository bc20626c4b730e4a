"""``benchmarks/rmr_load.py --replicas N`` (issue 46): the fake subscription manager and the routes
it gives the E2 termination (per subscription, as OSC's submgr and rtmgr), the cells' layout over
the replicas' E2 nodes and the per-phase accounting, without RMR; and one test over the real RMR
library (marked ``rmr``, skipped without it) that such a route table sends each subscription's
indications to its subscriber alone."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fake_rmr import real_rmr_available

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import fake_submgr as fs  # noqa: E402
import rmr_load as rl  # noqa: E402
from xapp.cluster.ownership import assignment  # noqa: E402
from xapp.config import load_controls  # noqa: E402
from xapp.e2.subscription import (SubmgrClient, SubscriptionError, SubscriptionLedger,  # noqa: E402
                                  SubscriptionManager)
from xapp.handlers import SubscriptionNotificationHandler  # noqa: E402
from xapp.httpd import serve_http  # noqa: E402

NODES = rl.e2_node_names(4)


def _config(rmr_port: int, http_port: int, submgr_url: str):
    """The shipped descriptor's controls with four E2 nodes and this replica's endpoint."""
    c = json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"]
    c["agents"] = {f"edge-{k}": {"e2_node_id": n, "control_address": f"127.0.0.1:{9000 + k}",
                                 "peer_address": f"127.0.0.1:{9100 + k}"} for k, n in enumerate(NODES)}
    c["cells"] = {str(k + 1): f"edge-{k}" for k in range(len(NODES))}
    c["e2"]["submgr_url"] = submgr_url
    c["e2"]["client_endpoint"] = {"host": "127.0.0.1", "http_port": http_port, "rmr_port": rmr_port}
    return load_controls(c)


@pytest.fixture
def submgr():
    s = fs.FakeSubmgr()
    yield s
    s.close()


def test_each_subscription_is_routed_to_the_replica_that_made_it(submgr):
    """Two replicas' SubscriptionManagers, each syncing its owned nodes: one E2 instance per
    node, routed to its subscriber's RMR port only; a node given up leaves the table; the
    rest keeps its instance id."""
    a = SubscriptionManager(SubmgrClient(submgr.url))
    b = SubscriptionManager(SubmgrClient(submgr.url))
    ca, cb = _config(4560, 18080, submgr.url), _config(4570, 18081, submgr.url)
    a.sync(ca, owned=NODES[:3])
    b.sync(cb, owned=NODES[3:])
    routes = fs.routes_by_node(submgr.ledger.snapshot())
    assert {n: eps for n, (_, eps) in routes.items()} == {
        NODES[0]: ("127.0.0.1:4560",), NODES[1]: ("127.0.0.1:4560",), NODES[2]: ("127.0.0.1:4560",),
        NODES[3]: ("127.0.0.1:4570",)}
    ids = {n: i for n, (i, _) in routes.items()}
    assert len(set(ids.values())) == 4 and all(1 <= i <= 65535 for i in ids.values())
    table = fs.route_table(submgr.ledger.snapshot(), ["mse|100|-1|127.0.0.1:4560;127.0.0.1:4570"])
    lines = table.splitlines()
    assert lines[0] == "newrt|start" and lines[-1] == "newrt|end"
    assert lines[1] == "mse|100|-1|127.0.0.1:4560;127.0.0.1:4570"
    assert sorted(lines[2:-1]) == sorted(
        f"mse|12050|{ids[n]}|127.0.0.1:{4560 if n != NODES[3] else 4570}" for n in NODES)
    owners = {n: "a" for n in NODES[:3]} | {NODES[3]: "b"}
    endpoint = {"a": "127.0.0.1:4560", "b": "127.0.0.1:4570"}
    assert rl.settled(routes, owners, endpoint)
    a.sync(ca, owned=NODES[:2])                    # node 2 given up: its subscription deleted
    routes = fs.routes_by_node(submgr.ledger.snapshot())
    assert NODES[2] not in routes and f"|{ids[NODES[2]]}|" not in fs.route_table(submgr.ledger.snapshot())
    assert routes[NODES[0]][0] == ids[NODES[0]]
    assert not rl.settled(routes, owners, endpoint)
    assert submgr.ledger.changes == 5              # 4 made, 1 deleted


def test_identical_subscriptions_are_merged_and_fanned_out(submgr):
    """Both replicas subscribed to one node (a hand-over in progress): one E2 instance, both
    endpoints as fan-out groups; not settled; the old owner's delete leaves the new one's."""
    a = SubscriptionManager(SubmgrClient(submgr.url))
    b = SubscriptionManager(SubmgrClient(submgr.url))
    ca, cb = _config(4560, 18080, submgr.url), _config(4570, 18081, submgr.url)
    a.sync(ca, owned=NODES[:1])
    b.sync(cb, owned=NODES[:1])
    (inst,) = submgr.ledger.snapshot()
    assert inst.meid == NODES[0] and len(inst.clients) == 2
    assert f"mse|12050|{inst.instance_id}|127.0.0.1:4560;127.0.0.1:4570" in fs.route_table([inst])
    routes = fs.routes_by_node([inst])
    assert not rl.settled(routes, {NODES[0]: "b"}, {"a": "127.0.0.1:4560", "b": "127.0.0.1:4570"})
    a.sync(ca, owned=())
    routes = fs.routes_by_node(submgr.ledger.snapshot())
    assert routes == {NODES[0]: (inst.instance_id, ("127.0.0.1:4570",))}
    assert rl.settled(routes, {NODES[0]: "b"}, {"a": "127.0.0.1:4560", "b": "127.0.0.1:4570"})


def test_submgr_notifies_the_xapp_and_refuses_bad_requests(submgr):
    """The E2 outcome reaches the xApp's notification endpoint (its ledger then knows the E2
    instance: the indications' RMR sub id); a body without Meid is a 400, nothing recorded;
    an unknown delete a 404."""
    ledger = SubscriptionLedger()
    http = serve_http("127.0.0.1", 0, lambda: True,
                      on_subscription_response=SubscriptionNotificationHandler(ledger))
    try:
        port = http.server_address[1]
        m = SubscriptionManager(SubmgrClient(submgr.url), ledger)
        m.sync(_config(4560, port, submgr.url), owned=NODES[:1])
        inst = submgr.ledger.snapshot()[0].instance_id
        deadline = time.time() + 10
        while inst not in ledger.active and time.time() < deadline:
            time.sleep(0.02)
        assert ledger.active.get(inst) in ledger.subscriptions and submgr.notify_failures == 0
    finally:
        http.shutdown()
    client = SubmgrClient(submgr.url)
    with pytest.raises(SubscriptionError) as e:
        client.subscribe({"RANFunctionID": 3, "ClientEndpoint": {"Host": "h", "RMRPort": 1},
                          "SubscriptionDetails": []})
    assert e.value.status == 400 and len(submgr.ledger.snapshot()) == 1
    with pytest.raises(SubscriptionError) as e:
        client.unsubscribe("no-such-id")
    assert e.value.status == 404
    with pytest.raises(ValueError, match="several subscriptions"):
        fs.routes_by_node([fs.E2Instance(1, "n", 3, "x"), fs.E2Instance(2, "n", 2, "x")])


def test_layout_evens_the_replicas_shares_of_ues():
    """Cells on the replicas' own nodes, UEs split as evenly as whole cells allow; every node
    owned; one replica: the nodes evened instead."""
    cell_ues = {c: u for c, u in zip(range(1, 43), [138, 104, 98, 92, 89, 78, 76] + [40] * 30 + [8, 6, 6, 1, 1])}
    nodes = rl.e2_node_names(8)
    rids = rl.replica_ids(2)
    owners = rl.expected_owners(nodes, rids)
    assert owners == assignment(nodes, rids) and set(owners.values()) == set(rids)
    lay = rl.layout(cell_ues, nodes, owners)
    assert set(lay) == set(cell_ues) and set(lay.values()) <= set(nodes)
    share = {r: sum(u for c, u in cell_ues.items() if owners[lay[c]] == r) for r in rids}
    assert abs(share["xapp-0"] - share["xapp-1"]) <= max(cell_ues.values())
    assert sum(share.values()) == sum(cell_ues.values())
    one = rl.layout(cell_ues, nodes, rl.expected_owners(nodes, ["xapp-0"]))
    per_node = [sum(u for c, u in cell_ues.items() if one[c] == n) for n in nodes]
    assert max(per_node) - min(per_node) <= max(cell_ues.values())
    with pytest.raises(ValueError, match="owner"):
        rl.layout(cell_ues, nodes, {nodes[0]: "xapp-0"})
    with pytest.raises(ValueError):
        rl.e2_node_names(0)
    with pytest.raises(ValueError):
        rl.replica_ids(0)
    assert rl.e2_node_names(2) == ["gnb_001_01_00000000", "gnb_001_01_00000001"]


def _mark(**kw):
    m = dict(cpu=0.0, cpu_rx=0.0, cpu_cycle=0.0, received=0, handled=0, shed=0, dropped=0, queued=0,
             not_owned=0, wall=0.0, lag_p50=0.01, lag_p99=0.02, ingest_p99=0.005, rss=2 ** 20 * 100,
             owned=4, lease_changes=2)
    m.update(kw)
    return m


def test_phase_figures_account_for_every_indication():
    """Handled excludes what a replica dropped as not its node's; lost is sent minus received;
    unaccounted is what no counter holds; the lag is the slower replica's; CPU per replica."""
    sent = {"sent": 10_000, "seconds": 2.0, "health_max": 0.01, "health_unanswered": 0, "failed": 0, "retries": 3}
    m0 = [_mark(), _mark(cpu=5.0, wall=100.0)]
    m1 = [_mark(cpu=0.6, wall=2.5, received=6000, handled=5900, shed=50, dropped=40, queued=10, not_owned=100,
                lag_p99=0.08),
          _mark(cpu=5.5, wall=102.5, received=3990, handled=3989, queued=0, lag_p99=float("nan"))]
    row, reps = rl.phase_figures(sent, m0, m1)
    assert reps[0]["handled_s"] == pytest.approx(2900.0) and reps[1]["handled_s"] == pytest.approx(1994.5)
    assert reps[0]["unaccounted"] == 0 and reps[1]["unaccounted"] == 1
    assert reps[0]["cpu_us"] == pytest.approx(100.0) and reps[1]["cpu_us"] == pytest.approx(1e6 * 0.5 / 3990)
    assert reps[0]["cpu_share"] == pytest.approx(0.24)
    assert row["lost"] == 10 and row["not_owned"] == 100 and row["unaccounted"] == 1
    assert row["handled_s"] == pytest.approx(4894.5) and row["sent_s"] == 5000.0
    assert row["lag_p99_ms"] == pytest.approx(80.0) and row["dropped"] == 40 and row["shed"] == 50
    assert row["lease_changes"] == 0 and row["send_retries"] == 3


def test_a_health_check_waits_for_every_replica():
    sent = {b"x": [time.time(), 2]}
    rtt: list[float] = []
    rl._health_answer(sent, b"x", rtt)
    assert sent[b"x"][1] == 1 and len(rtt) == 1
    rl._health_answer(sent, b"y", rtt)             # not ours: ignored
    rl._health_answer(sent, b"x", rtt)
    assert sent == {} and len(rtt) == 2


@pytest.mark.rmr
@pytest.mark.skipif(not real_rmr_available(), reason="librmr_si.so not on LD_LIBRARY_PATH")
def test_real_rmr_routes_each_subscription_to_its_subscriber(tmp_path, monkeypatch):
    """Over the real library: the sender's table from :func:`fake_submgr.route_table`, two
    receivers; indications of sub id 1 reach only the first, of sub id 2 only the second."""
    insts = [fs.E2Instance(1, NODES[0], 3, "d", {"s1": "127.0.0.1:4593"}),
             fs.E2Instance(2, NODES[1], 3, "d", {"s2": "127.0.0.1:4594"})]
    rt = tmp_path / "route.rt"
    rt.write_text(fs.route_table(insts))
    for k, v in (("RMR_SEED_RT", str(rt)), ("RMR_ASYNC_CONN", "0"), ("RMR_RTG_SVC", "-1"),
                 ("RMR_SRC_ID", "127.0.0.1")):
        monkeypatch.setenv(k, v)
    from ricxappframe.rmr import rmr
    ctx = {p: rmr.rmr_init(str(p).encode(), rmr.RMR_MAX_RCV_BYTES, rmr.RMRFL_MTCALL) for p in (4593, 4594, 4595)}
    try:
        for c in ctx.values():
            deadline = time.time() + 10
            while rmr.rmr_ready(c) == 0 and time.time() < deadline:
                time.sleep(0.1)
        snd = ctx[4595]
        sent = {1: 0, 2: 0}
        for k in range(200):
            sub = 1 + k % 2
            m = rmr.rmr_alloc_msg(snd, 64)
            rmr.set_payload_and_length(f"{sub}".encode(), m)
            m.contents.mtype, m.contents.sub_id = 12050, sub
            for _ in range(50):
                m = rmr.rmr_send_msg(snd, m)
                if m.contents.state != 10:
                    break
                time.sleep(0.01)
            sent[sub] += m.contents.state == 0
            rmr.rmr_free_msg(m)
        got = {4593: [], 4594: []}
        for port in got:
            deadline = time.time() + 5
            while len(got[port]) < 100 and time.time() < deadline:
                r = rmr.rmr_torcv_msg(ctx[port], None, 100)
                if r.contents.state == 0:
                    got[port].append((r.contents.sub_id, rmr.get_payload(r)))
                rmr.rmr_free_msg(r)
        assert sent == {1: 100, 2: 100}
        assert got[4593] == [(1, b"1")] * 100 and got[4594] == [(2, b"2")] * 100
    finally:
        for c in ctx.values():
            rmr.rmr_close(c)
