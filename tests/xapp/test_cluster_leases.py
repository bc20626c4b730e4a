"""xapp.cluster.leases: E2 node leases and session records of several replicas on one real
redis-server (tests/xapp/redis_server.py), reached as in a RIC (DBAAS_SERVICE_HOST/PORT, ricsdl's
SyncStorage). Lease times are short (2 s) so expiry is seen within a few seconds; heartbeats come
every 0.1 s, well within a third of the lease as NodeLeases asks, even on a loaded host (with a
0.6 s lease a 3-replica beat round at load 32 took longer than a third of it, and the convergence
test saw leases lapse mid-way)."""

from __future__ import annotations

import time

import pytest

from xapp.cluster.leases import LeaseError, NodeLeases, open_sdl
from xapp.cluster.ownership import WriteRefused, Writer, assignment

NODES = [f"gnb-{i:02d}" for i in range(24)]
LEASE = 2.0
BEAT = 0.1


@pytest.fixture
def make(dbaas, sdl_ns):
    """A factory of replicas (each its own SyncStorage) sharing one fresh namespace."""
    made = []

    def make_one(rid, nodes=NODES, **kw):
        kw = {"lease_s": LEASE, "max_claims": 64, "max_releases": 4, "join_delay_s": 0.2} | kw
        r = NodeLeases(open_sdl(), rid, nodes, namespace=sdl_ns, **kw)
        made.append(r)
        return r
    yield make_one
    for r in made:
        r.stop()
        r.sdl.close()


def beat(replicas, rounds=1):
    out = []
    for _ in range(rounds):
        out.append({r.me: r.heartbeat() for r in replicas})
        time.sleep(BEAT)
    return out


def ownership(replicas):
    return {n: [r.me for r in replicas if r.owns(n)] for n in NODES}


def test_three_replicas_converge_to_disjoint_shares_covering_every_node(make):
    reps = [make(f"xapp-{i}") for i in range(3)]
    beat(reps[:1], 2)                       # one starts alone and takes every node
    assert all(v == ["xapp-0"] for v in ownership(reps).values())
    history = beat(reps, 12)                # two more join: hand-over, a few nodes a beat
    own = ownership(reps)
    assert all(len(v) == 1 for v in own.values()), own
    want = assignment(NODES, [r.me for r in reps])
    assert {n: v[0] for n, v in own.items()} == want
    for hb in history:                      # never more than 4 given up per beat by xapp-0
        assert len(hb["xapp-0"].released) <= 4
    # a fencing token per claim: the nodes xapp-0 gave up were claimed a second time
    moved = [n for n in NODES if want[n] != "xapp-0"]
    assert {reps[[r.me for r in reps].index(want[n])].token(n) for n in moved} == {2}


def test_a_replica_that_stops_renewing_loses_its_nodes_within_the_lease_time_and_a_beat(make):
    reps = [make(f"xapp-{i}") for i in range(3)]
    beat(reps, 4)
    dead = reps[2]
    its = set(dead.owned())
    assert its and all(len(v) == 1 for v in ownership(reps).values())
    t_dead = time.monotonic()               # it stops: no heartbeat, no release
    taken_at = None
    while time.monotonic() - t_dead < 3 * LEASE:
        beat(reps[:2])
        if all(reps[0].owns(n) or reps[1].owns(n) for n in its):
            taken_at = time.monotonic() - t_dead
            break
    assert taken_at is not None and taken_at <= LEASE + 2 * BEAT, taken_at
    assert not dead.owns(next(iter(its)))   # its own clock says so too (no renewal)
    assert dead.heartbeat().lost            # and it finds out at its next heartbeat
    survivors = assignment(NODES, ["xapp-0", "xapp-1"])
    assert {n: reps[0].me if reps[0].owns(n) else reps[1].me for n in NODES} == survivors


def test_a_clean_stop_hands_the_nodes_over_at_the_next_heartbeat(make):
    a, b = make("xapp-a"), make("xapp-b")
    beat([a, b], 3)
    given = a.stop()
    assert given
    hb = b.heartbeat()
    assert set(given) <= set(hb.claimed) and set(b.owned()) == set(NODES)


def test_session_records_hand_over_between_owners_and_a_stale_token_is_refused(make):
    a, b = make("xapp-a", join_delay_s=0.0), make("xapp-b", join_delay_s=0.0)
    beat([a, b], 3)
    na, nb = a.owned()[0], b.owned()[0]
    r1 = a.write_session("s1", na, epoch=1, data={"target": nb})
    assert r1.owner == "xapp-a" and r1.token == a.token(na)
    r2 = b.write_session("s1", nb, epoch=1, data={"state": "committed"})
    assert r2.owner == "xapp-b" and b.counters.records_handed_over == 1
    assert b.read_session("s1") == r2
    with pytest.raises(WriteRefused, match="not_owner"):
        a.write_session("s1", nb, epoch=2, data={})
    # a paused past its lease: b claims na (token + 1) and writes; a's late write is fenced
    old = Writer("xapp-a", na, a.token(na))
    time.sleep(LEASE + BEAT)                # a's leases expire; a does not beat
    beat([b], 2)
    assert b.owns(na) and b.token(na) == old.token + 1
    b.write_session("s1", na, epoch=2, data={})
    with pytest.raises(WriteRefused, match="stale_token"):
        a.cas_session("s1", old, epoch=3, data={})
    assert a.counters.writes_refused == {"not_owner": 1, "stale_token": 1}
    with pytest.raises(WriteRefused, match="stale_epoch"):
        b.write_session("s1", na, epoch=1, data={})


def test_a_compare_and_set_that_loses_is_counted_and_retried(make):
    a = make("xapp-a")
    beat([a])
    n = a.owned()[0]
    a.write_session("s1", n, epoch=1, data={"k": 0})
    real_get = a.sdl.get
    raced = []

    def racing_get(ns, keys):
        got = real_get(ns, keys)
        if "session/s1" in keys and not raced:   # another write lands between read and CAS
            raced.append(1)
            a.cas_session("s1", Writer("xapp-a", n, a.token(n)), epoch=1, data={"k": 1})
        return got
    a.sdl.get = racing_get
    rec = a.write_session("s1", n, epoch=2, data={"k": 2})
    assert rec.version == 3 and rec.data == {"k": 2} and a.counters.cas_conflicts == 1


def test_bad_arguments_are_refused_in_one_line(make):
    with pytest.raises(LeaseError, match="replica id"):
        make("xapp*")
    with pytest.raises(LeaseError, match="lease_s"):
        make("xapp-0", lease_s=0)
