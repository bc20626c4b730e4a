"""xapp.cluster.ownership: rendezvous hashing, the lease rule and session-record fencing, over
their inputs (no SDL). A small simulator plays heartbeats of several replicas against one owner
map, as SDL's leases would settle them (a claim succeeds only on a node nobody holds)."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, strategies as st

from xapp.cluster.ownership import (Membership, SessionRecord, WriteRefused, Writer,
                                    arrival_owner, assignment, desired_nodes, plan_leases,
                                    rendezvous_owner, write_session)

NODES = [f"gnb-{i:03d}" for i in range(120)]


class Cluster:
    """Replicas taking heartbeats in turn over one owner map (node -> replica or None)."""

    def __init__(self, nodes, *, max_claims=8, max_releases=4, join_delay=0.0):
        self.nodes = list(nodes)
        self.owners: dict[str, str | None] = {n: None for n in self.nodes}
        self.members: dict[str, Membership] = {}
        self.alive: set[str] = set()
        self.kw = dict(max_claims=max_claims, max_releases=max_releases)
        self.join_delay = join_delay
        self.changes: list[collections.Counter] = []  # per round: replica -> claims+releases

    def start(self, r):
        self.members.setdefault(r, Membership(r, self.join_delay))
        self.alive.add(r)

    def kill(self, r):
        """r stops; its leases expire (as SDL's would, after the lease time)."""
        self.alive.discard(r)
        for n, o in self.owners.items():
            if o == r:
                self.owners[n] = None

    def round(self, now):
        changes = collections.Counter()
        for r in sorted(self.alive):
            live = self.members[r].observe(self.alive, now)
            plan = plan_leases(r, self.nodes, live, self.owners, seen=self.alive, **self.kw)
            for n in plan.release:
                assert self.owners[n] == r
                self.owners[n] = None
            for n in plan.claim:
                if self.owners[n] is None:
                    self.owners[n] = r
                    changes[r] += 1
            changes[r] += len(plan.release)
        self.changes.append(changes)

    def settled(self):
        return self.owners == assignment(self.nodes, self.alive)


def test_rendezvous_is_stable_and_shares_nodes_evenly():
    reps = ["xapp-0", "xapp-1", "xapp-2"]
    a = assignment(NODES, reps)
    assert a == assignment(NODES, list(reversed(reps)))
    counts = collections.Counter(a.values())
    assert set(counts) == set(reps) and min(counts.values()) >= 25  # 40 each on average
    assert rendezvous_owner("gnb-000", []) is None
    # a replica leaving moves only its own nodes
    b = assignment(NODES, reps[:2])
    assert all(b[n] == a[n] for n in NODES if a[n] != "xapp-2")
    # a replica joining takes nodes only to itself
    c = assignment(NODES, reps + ["xapp-3"])
    assert all(c[n] in (a[n], "xapp-3") for n in NODES)
    assert desired_nodes("xapp-3", NODES, reps) == {n for n in NODES if c[n] == "xapp-3"}


@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=6, unique=True),
       st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=40, unique=True))
def test_every_node_has_exactly_one_owner_among_the_replicas(reps, nodes):
    shares = [desired_nodes(r, nodes, reps) for r in reps]
    assert sum(len(s) for s in shares) == len(nodes)
    assert frozenset().union(*shares) == frozenset(nodes)


def test_a_single_replica_claims_every_node_within_its_bound():
    c = Cluster(NODES, max_claims=50)
    c.start("xapp-0")
    for t in range(3):
        c.round(t)
    assert c.settled() and set(c.owners.values()) == {"xapp-0"}
    assert [c.changes[t]["xapp-0"] for t in range(3)] == [50, 50, 20]


def test_a_joining_replica_takes_its_share_a_few_nodes_per_heartbeat():
    c = Cluster(NODES, max_claims=200, max_releases=4, join_delay=2.0)
    for r in ("xapp-0", "xapp-1"):
        c.start(r)
    c.round(0)
    assert c.settled()
    c.start("xapp-2")
    share = len(desired_nodes("xapp-2", NODES, ["xapp-0", "xapp-1"]))
    for t in range(1, 40):
        c.round(float(t))
        # never two owners: the map holds one per node by construction; never a node lost for
        # more than the one heartbeat between a release and the new owner's claim
        assert sum(o is None for o in c.owners.values()) <= 2 * 4
        if c.settled():
            break
    assert c.settled()
    # nothing moved during the join delay; then each old owner gave up at most 4 a heartbeat
    assert all(c.changes[t]["xapp-0"] == 0 and c.changes[t]["xapp-1"] == 0 for t in (1, 2))
    assert max(ch[r] for ch in c.changes[1:] for r in ("xapp-0", "xapp-1")) <= 4
    assert sum(ch["xapp-2"] for ch in c.changes) == share


def test_a_dead_replicas_nodes_are_claimed_at_the_first_heartbeat_after_its_leases_expire():
    c = Cluster(NODES, max_claims=64)
    for r in ("xapp-0", "xapp-1", "xapp-2"):
        c.start(r)
    c.round(0)
    assert c.settled()
    lost = [n for n, o in c.owners.items() if o == "xapp-2"]
    c.kill("xapp-2")
    c.round(1)
    assert c.settled() and all(c.owners[n] in ("xapp-0", "xapp-1") for n in lost)


def test_a_flapping_replica_draws_no_node_to_itself():
    c = Cluster(NODES, max_claims=64, join_delay=3.0)
    for r in ("xapp-0", "xapp-1"):
        c.start(r)
    c.round(0)   # started together: each claims its own share at once, despite the delay
    assert c.settled()
    before = dict(c.owners)
    for t in range(1, 21):
        if t % 2:
            c.start("xapp-9")     # seen live one heartbeat, gone the next
        else:
            c.kill("xapp-9")
        c.round(float(t))
    assert all(c.owners[n] == before[n] for n in NODES if before[n] != "xapp-9")
    assert sum(c.changes[t][r] for t in range(1, 21) for r in ("xapp-0", "xapp-1")) == 0
    assert "xapp-9" not in c.owners.values()  # every node was held whenever it looked


def test_membership_counts_a_replica_after_the_join_delay_and_drops_it_at_once():
    m = Membership("a", join_delay_s=1.0)
    assert m.observe(["b"], 0.0) == {"a"}
    assert m.observe(["b"], 0.5) == {"a"}
    assert m.observe(["b", "c"], 1.0) == {"a", "b"}
    assert m.observe(["c"], 1.5) == {"a"}          # b gone: at once; c seen 0.5 s only
    assert m.observe(["b", "c"], 2.0) == {"a", "c"}  # b starts its delay again
    with pytest.raises(ValueError, match="join_delay_s"):
        Membership("a", -1)


def test_the_plan_renews_what_it_keeps_and_releases_nodes_no_longer_configured():
    owners = {"n1": "a", "n2": "a", "gone": "a", "n3": None}
    p = plan_leases("a", ["n1", "n2", "n3"], [], owners, max_claims=1, max_releases=1)
    assert p.renew == ("n1", "n2") and p.release == ("gone",) and p.claim == ("n3",)
    with pytest.raises(ValueError, match="max_claims"):
        plan_leases("a", [], [], {}, max_claims=0, max_releases=1)


def test_the_plan_never_claims_a_held_node_and_waits_for_it():
    nodes = ["n1", "n2", "n3", "n4"]
    share_b = desired_nodes("b", nodes, ["a", "b"])
    owners = {n: "a" for n in nodes}
    p = plan_leases("b", nodes, ["a"], owners, max_claims=10, max_releases=10)
    assert p.claim == () and set(p.waiting) == share_b and p.renew == ()


# -- session records --------------------------------------------------------------------------

def test_the_first_write_creates_and_the_owner_continues():
    r, ho = write_session(None, "s1", Writer("a", "gnb-1", 3), epoch=1, data={"target": "x"})
    assert not ho and r.owner == "a" and r.version == 1 and r.fences == {"gnb-1": 3}
    r2, ho = write_session(r, "s1", Writer("a", "gnb-1", 3), epoch=2, data={"target": "y"})
    assert not ho and r2.version == 2 and r2.epoch == 2 and r2.data == {"target": "y"}
    assert SessionRecord.from_dict(r2.to_dict()) == r2


def test_a_handover_to_a_node_of_another_replica_hands_the_record_over():
    r, _ = write_session(None, "s1", Writer("a", "gnb-1", 3), epoch=4, data={})
    r2, ho = write_session(r, "s1", Writer("b", "gnb-2", 1), epoch=4, data={"from": "gnb-1"})
    assert ho and r2.owner == "b" and r2.node == "gnb-2" and r2.fences == {"gnb-1": 3, "gnb-2": 1}
    # and back: gnb-1's owner (same lease, token 3) takes it again
    r3, ho = write_session(r2, "s1", Writer("a", "gnb-1", 3), epoch=5, data={})
    assert ho and r3.owner == "a"


def test_a_writer_whose_lease_was_claimed_again_is_fenced_off():
    r, _ = write_session(None, "s1", Writer("a", "gnb-1", 3), epoch=1, data={})
    # a's lease on gnb-1 expired (a paused); c claimed gnb-1 (token 4) and wrote
    r2, ho = write_session(r, "s1", Writer("c", "gnb-1", 4), epoch=2, data={})
    assert ho
    with pytest.raises(WriteRefused) as e:
        write_session(r2, "s1", Writer("a", "gnb-1", 3), epoch=3, data={})
    assert e.value.reason == "stale_token"
    # even after the UE moved on and the record's node is another one
    r3, _ = write_session(r2, "s1", Writer("b", "gnb-2", 7), epoch=3, data={})
    with pytest.raises(WriteRefused, match="stale_token"):
        write_session(r3, "s1", Writer("a", "gnb-1", 3), epoch=4, data={})


def test_a_write_may_not_lower_the_epoch():
    r, _ = write_session(None, "s1", Writer("a", "gnb-1", 1), epoch=9, data={})
    with pytest.raises(WriteRefused, match="stale_epoch"):
        write_session(r, "s1", Writer("b", "gnb-2", 1), epoch=8, data={})
    with pytest.raises(ValueError, match="fencing token 0"):
        write_session(r, "s1", Writer("b", "gnb-2", 0), epoch=9, data={})
    with pytest.raises(ValueError, match="malformed session record"):
        SessionRecord.from_dict({"owner": "a"})


def test_an_arrival_goes_to_the_live_owner_of_the_ues_records():
    def rec(sid, owner, node):
        return SessionRecord(sid, owner, node, 1)
    holders = {"gnb-a": "r0", "gnb-b": "r1", "gnb-c": None, "gnb-d": "r3"}
    assert arrival_owner("r1", [], holders) is None                         # no session
    assert arrival_owner("r1", [None], holders) is None                     # no record yet
    assert arrival_owner("r1", [rec("s", "r1", "gnb-b")], holders) is None  # its own record
    assert arrival_owner("r1", [rec("s", "r0", "gnb-a")], holders) == "r0"  # r0 holds gnb-a
    # the owner's lease expired (no holder) or the node was claimed by another: decided here
    assert arrival_owner("r1", [rec("s", "r2", "gnb-c")], holders) is None
    assert arrival_owner("r1", [rec("s", "r2", "gnb-d")], holders) is None
    # several owners: the one with the most records, then the smallest id
    two = [rec("s1", "r3", "gnb-d"), rec("s2", "r0", "gnb-a"), rec("s3", "r3", "gnb-d")]
    assert arrival_owner("r1", two, holders) == "r3"
    assert arrival_owner("r1", two[:2], holders) == "r0"
