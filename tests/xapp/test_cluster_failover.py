"""A replica killed (issue 46, second must-show; pallas_eval/failover.py): three replica
processes (tests/xapp/failover_replica.py: the xApp with ``controls.cluster`` on the real
redis-server) share nine E2 nodes; one is SIGKILLed, so its leases are not released; the two
survivors own all nine again, each of the dead replica's nodes claimed once, not before its
lease could have expired and within the lease time plus one heartbeat of the kill, as the
replay's fail-over report (read from the processes' own ``lease`` events) says.

Without Redis: a heartbeat that changes the owned set becomes one ``lease`` event of the xApp."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from xapp.cluster.leases import Heartbeat

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NODES = [f"gnb_001_001_{i:08x}" for i in range(1, 10)]
# The replay's own settings (pallas_eval.replicas.REPLAY_CLUSTER).
LEASE, BEAT = 1.5, 0.5


def test_a_heartbeat_that_changes_the_owned_set_is_one_lease_event():
    from test_cluster_replica import FakeLeases, _config, _xapp
    app, cluster, _ = _xapp(_config(), FakeLeases())
    cluster.on_beat(Heartbeat(owned=("a",)))                       # nothing changed
    cluster.on_beat(Heartbeat(claimed=("b",), lost=("c",), owned=("a", "b")))
    assert [(e["kind"], e["claimed"], e["released"], e["lost"], e["owned"]) for e in app.events.events] == [
        ("lease", ["b"], [], ["c"], ["a", "b"])]
    assert Heartbeat(owned=("a",)).changes() is None


def test_the_end_event_counts_each_nodes_indications_handled_and_dropped():
    from test_cluster_replica import NODES as EIGHT, FakeLeases, _config, _indicate, _xapp
    from xapp.main import _cluster_end
    leases = FakeLeases()
    app, cluster, ingest = _xapp(_config(), leases)
    leases.held = {EIGHT[0]}
    cluster.beat()                                            # claims EIGHT[0]: one lease event
    for n in (EIGHT[0], EIGHT[0], EIGHT[1]):
        _indicate(app, n)
    assert ingest.nodes == [EIGHT[0], EIGHT[0]]
    assert _cluster_end(app) == {"cluster": {"admitted": {EIGHT[0]: 2}, "dropped": {EIGHT[1]: 1},
                                             "owned": [EIGHT[0]], "claims": 1, "releases": 0, "losses": 0}}
    assert [e["claimed"] for e in app.events.events if e["kind"] == "lease"] == [[EIGHT[0]]]


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:      # a line being written
            pass
    return out


def _owned(path: Path) -> list[str] | None:
    beats = [e for e in _read(path) if e["kind"] == "beat"]
    return beats[-1]["owned"] if beats else None


def _until(cond, timeout_s=30.0):
    """Poll ``cond`` every 20 ms; its value, or None after ``timeout_s`` (a deadline for a
    starved machine, not a bound the product promises)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    return None


def test_the_survivors_own_a_killed_replicas_nodes_within_the_lease_and_a_heartbeat(dbaas, sdl_ns, tmp_path):
    from pallas_eval.failover import failover_report, owned_at
    from xapp.cluster.ownership import assignment
    from pallas_eval.replicas import merge_events
    rids = ["xapp-0", "xapp-1", "xapp-2"]
    files = {r: tmp_path / f"events-{r}.jsonl" for r in rids}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "proto")]))
    procs = {r: subprocess.Popen([sys.executable, str(HERE / "failover_replica.py"), r, sdl_ns, str(LEASE),
                                  str(BEAT), str(files[r]), *NODES], env=env, stdout=subprocess.DEVNULL,
                                 stderr=open(tmp_path / f"{r}.log", "wb"))
             for r in rids}
    try:
        want = assignment(NODES, rids)        # the rendezvous shares, once all three count
        shares = {r: sorted(n for n in NODES if want[n] == r) for r in rids}
        assert all(shares.values())
        assert _until(lambda: all(_owned(files[r]) == shares[r] for r in rids)), \
            {r: (_owned(files[r]), (tmp_path / f"{r}.log").read_text()[-2000:]) for r in rids}
        victim = "xapp-1"
        held = shares[victim]
        # Kill half a heartbeat after the victim's latest heartbeat (its latest renewal), so the
        # bound below measures the survivors, not where in its period the victim happened to die.
        n0 = len([e for e in _read(files[victim]) if e["kind"] == "beat"])
        assert _until(lambda: len([e for e in _read(files[victim]) if e["kind"] == "beat"]) > n0)
        time.sleep(BEAT / 2)
        t_kill = time.time()
        procs[victim].send_signal(signal.SIGKILL)
        assert procs[victim].wait(10) == -signal.SIGKILL

        survivors = [r for r in rids if r != victim]
        assert _until(lambda: sorted(n for r in survivors for n in (_owned(files[r]) or [])) == NODES), \
            {r: _owned(files[r]) for r in survivors}
        events = merge_events([(r, files[r]) for r in rids])
        rep = failover_report(events, killed=victim, t_kill=t_kill, start_at=t_kill - 40.0, lease_s=LEASE,
                              heartbeat_s=BEAT)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            p.wait(20)

    print(f"\n{victim}'s {len(held)} nodes owned again {rep['reowned_min_s']}-{rep['reowned_max_s']} s after "
          f"the kill (lease {LEASE} s + heartbeat {BEAT} s), by {rep['owned_again_by']}")
    assert sorted(owned_at(events, victim, t_kill)) == held
    assert [r["node"] for r in rep["nodes"]] == held
    assert all(r["owned_again_by"] in survivors for r in rep["nodes"]), rep["nodes"]
    # each of its nodes claimed once by one survivor after the kill; nothing else moved
    after = [(n, e["replica"]) for e in events if e["kind"] == "lease" and e["t"] >= t_kill
             for n in e["claimed"]]
    assert sorted(n for n, _ in after) == held, after
    assert not [e for e in events if e["kind"] == "lease" and e["t"] >= t_kill and (e["released"] or e["lost"])]
    # not before its lease could expire (renewed at most half a heartbeat, plus the poll, before the
    # kill), and within the lease time plus one heartbeat of the kill
    assert rep["reowned_min_s"] >= LEASE - BEAT, rep["nodes"]
    assert rep["within_bound"] is True and rep["reowned_max_s"] <= LEASE + BEAT, rep["nodes"]
    assert rep["nodes_not_owned_again"] == []
    ends = {r: set(_owned(files[r]) or []) for r in survivors}
    assert not ends[survivors[0]] & ends[survivors[1]]
