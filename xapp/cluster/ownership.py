"""Which xApp replica owns which E2 node, and who may write a UE's session record (issue 46).

Pure rules over their inputs: no SDL, no clock of their own, no I/O. ``xapp.cluster.leases``
applies them to leases in SDL; docs/scale-out.md gives the design.

- **Rendezvous (highest-random-weight) hashing**: each (E2 node, replica) pair gets a weight from
  a keyed hash; a node belongs to the live replica of highest weight. A replica that joins or
  leaves moves only the nodes it wins or held (about 1/N of them), and every replica computes
  the same assignment from the same set of live replicas, without talking to the others.
- **Membership with a join delay** (:class:`Membership`): a replica counts as live for the
  assignment only once it has been seen live continuously for ``join_delay_s``; one that
  vanishes counts as gone at once. A replica whose liveness flaps faster than the delay never
  draws nodes to itself, so flapping moves nothing.
- **The lease rule** (:func:`plan_leases`): per heartbeat a replica renews every lease it
  holds; claims a node only when no lease on it is held (never claimed, released, or expired)
  and the assignment over every replica seen live (counted or not yet) gives it to this
  replica, at most ``max_claims`` per heartbeat; gives up
  a node the assignment gives to another live replica, at most ``max_releases`` per heartbeat
  (a starting replica takes its share a few nodes a heartbeat: no storm of re-subscriptions).
- **Session records and fencing** (:func:`write_session`): a UE's session record carries the
  replica that wrote it, the E2 node it was written for, the fencing token of that replica's
  lease on that node and the highest token each node has written it with. A write is refused
  when its token is lower than the highest one its node has written the record with (the
  writer's lease expired and another replica claimed the node since) or when it would lower
  the session's migration epoch. Fencing tokens count the claims of one E2 node's lease (1, 2,
  ...); they are compared per node only.
- **Arrivals** (:func:`arrival_owner`): a UE first heard at a node of this replica whose session
  records another live replica owns is that replica's handover to decide; this one forwards it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "weight", "rendezvous_owner", "assignment", "desired_nodes", "Membership", "LeasePlan",
    "plan_leases", "SessionRecord", "Writer", "WriteRefused", "write_session", "arrival_owner",
]


def weight(node: str, replica: str) -> int:
    """The rendezvous weight of ``replica`` for E2 node ``node``: 64 bits of BLAKE2b over both
    names (stable across processes and machines, unlike Python's salted ``hash``)."""
    h = hashlib.blake2b(f"{node}\x00{replica}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "big")


def rendezvous_owner(node: str, replicas: Iterable[str]) -> str | None:
    """The replica of highest :func:`weight` for ``node`` (ties: the larger replica id); None
    when ``replicas`` is empty."""
    best: tuple[int, str] | None = None
    for r in replicas:
        key = (weight(node, r), r)
        if best is None or key > best:
            best = key
    return None if best is None else best[1]


def assignment(nodes: Iterable[str], replicas: Iterable[str]) -> dict[str, str | None]:
    """E2 node -> its :func:`rendezvous_owner` among ``replicas``."""
    reps = sorted(set(replicas))
    return {n: rendezvous_owner(n, reps) for n in nodes}


def desired_nodes(replica: str, nodes: Iterable[str], replicas: Iterable[str]) -> frozenset[str]:
    """The E2 nodes that rendezvous hashing over ``replicas`` plus ``replica`` itself gives to
    ``replica``: its share."""
    reps = set(replicas) | {replica}
    return frozenset(n for n in nodes if rendezvous_owner(n, reps) == replica)


class Membership:
    """The live replicas as one replica sees them, with a join delay (module docstring).

    ``me``: this replica's id (always counted live: a replica alone claims at once);
    ``join_delay_s``: how long another replica must be seen live, without a gap, before it
    counts (s; 0: at once). Feed :meth:`observe` once per heartbeat with the replicas whose
    liveness lease was found in SDL.
    """

    def __init__(self, me: str, join_delay_s: float) -> None:
        if join_delay_s < 0:
            raise ValueError(f"join_delay_s {join_delay_s} must be >= 0")
        self.me = me
        self.join_delay_s = float(join_delay_s)
        self._since: dict[str, float] = {}  # replica -> first time seen in the current run

    def observe(self, live: Iterable[str], now: float) -> frozenset[str]:
        """Record the replicas seen live at ``now`` (s, any monotonic clock); return the ones
        that count: ``me`` and those seen at every observation since ``now - join_delay_s``."""
        seen = set(live) - {self.me}
        self._since = {r: self._since.get(r, now) for r in seen}
        return frozenset({self.me} | {r for r, t in self._since.items()
                                      if now - t >= self.join_delay_s})


@dataclass(frozen=True)
class LeasePlan:
    """What one replica does at one heartbeat (each tuple sorted by node id).

    ``renew``: leases it holds and keeps; ``claim``: unowned nodes it tries to take (then
    subscribes to); ``release``: leases it gives up (and deletes the subscriptions of);
    ``waiting``: nodes of its share still held by another replica (released to it later)."""

    renew: tuple[str, ...] = ()
    claim: tuple[str, ...] = ()
    release: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()


def plan_leases(me: str, nodes: Iterable[str], live: Iterable[str],
                owners: Mapping[str, str | None], *, max_claims: int, max_releases: int,
                seen: Iterable[str] | None = None) -> LeasePlan:
    """The lease rule for replica ``me`` at one heartbeat (module docstring).

    Args:
        me: this replica's id.
        nodes: the E2 nodes to share (every replica configured alike).
        live: the replicas that count (:meth:`Membership.observe`; ``me`` is added): a node is
            given up only to one of them.
        owners: E2 node -> the replica holding its lease now, None (or absent) when no lease
            is held. Nodes ``me`` holds that are not in ``nodes`` (configuration changed) are
            released, outside the bound.
        max_claims: most nodes claimed per heartbeat (>= 1).
        max_releases: most nodes given up to other replicas per heartbeat (>= 1).
        seen: every replica whose liveness lease was found now, counted or not (default:
            ``live``). An unowned node is claimed only when rendezvous hashing over these gives
            it to ``me``: a replica that has just started claims its own share of the unowned
            nodes, and the others leave it those (replicas starting together take disjoint
            shares at once), while they give up held nodes only to counted replicas.

    Raises ValueError when a bound is below 1.
    """
    if max_claims < 1 or max_releases < 1:
        raise ValueError(f"max_claims {max_claims} and max_releases {max_releases} must be >= 1")
    node_set = set(nodes)
    reps = set(live) | {me}
    mine = sorted(n for n, o in owners.items() if o == me)
    dropped = [n for n in mine if n not in node_set]
    give_up = [n for n in mine if n in node_set and rendezvous_owner(n, reps) != me]
    release = dropped + give_up[:max_releases]
    share = sorted(desired_nodes(me, node_set, reps))
    claimable = sorted(desired_nodes(me, node_set, reps if seen is None else set(seen) | reps))
    claim = [n for n in claimable if owners.get(n) is None][:max_claims]
    waiting = [n for n in share if owners.get(n) not in (None, me)]
    rel = set(release)
    return LeasePlan(renew=tuple(n for n in mine if n not in rel), claim=tuple(claim),
                     release=tuple(sorted(release)), waiting=tuple(waiting))


# -- session records --------------------------------------------------------------------------

class WriteRefused(Exception):
    """A session-record write broke the fencing, the hand-over or the epoch rule. ``reason``:
    ``stale_token``, ``moved``, ``stale_epoch`` (:func:`write_session`), or from
    ``NodeLeases.write_session`` ``not_owner`` / ``conflict``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class Writer:
    """Who writes a session record: ``replica`` holding the lease on E2 node ``node`` (the UE's
    serving node, as that replica's indications show it) with fencing token ``token`` (>= 1)."""

    replica: str
    node: str
    token: int


@dataclass(frozen=True)
class SessionRecord:
    """A UE session's record in SDL, the one copy every replica decides from.

    ``owner`` / ``node`` / ``token``: the last writer (:class:`Writer`); ``epoch``: the
    session's migration epoch (never lowered: the agents refuse a lower one as STALE);
    ``seen``: the time of the UE's latest report the last writer decided from (s, the
    trace clock in test mode, the wall clock live; None: not given);
    ``version``: writes so far (1 on creation); ``fences``: E2 node -> the highest fencing
    token the record was written with for that node; ``data``: the decision state (target,
    migration state, ...; JSON-serialisable, opaque here).
    """

    session_id: str
    owner: str
    node: str
    token: int
    epoch: int = 0
    version: int = 1
    fences: Mapping[str, int] = field(default_factory=dict)
    data: Mapping[str, Any] = field(default_factory=dict)
    seen: float | None = None

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (inverse: :meth:`from_dict`)."""
        return {"session_id": self.session_id, "owner": self.owner, "node": self.node,
                "token": self.token, "epoch": self.epoch, "version": self.version,
                "fences": dict(self.fences), "data": dict(self.data), "seen": self.seen}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SessionRecord":
        """Raises ValueError naming the record when a field is missing or of the wrong type."""
        try:
            return cls(str(d["session_id"]), str(d["owner"]), str(d["node"]), int(d["token"]),
                       int(d.get("epoch", 0)), int(d.get("version", 1)),
                       {str(k): int(v) for k, v in dict(d.get("fences", {})).items()},
                       dict(d.get("data", {})),
                       None if d.get("seen") is None else float(d["seen"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed session record {dict(d)!r}: {e}") from None


def write_session(current: SessionRecord | None, session_id: str, writer: Writer, *,
                  epoch: int, data: Mapping[str, Any],
                  seen: float | None = None) -> tuple[SessionRecord, bool]:
    """The record after ``writer`` writes ``epoch`` and ``data`` over ``current`` (None: no
    record yet), and whether the session was handed over (another replica wrote it last).
    ``seen``: the time of the UE's latest report ``writer`` decides from (None: it has none).

    Raises :class:`WriteRefused`
    - ``stale_token`` when ``writer.token`` is below the highest token ``writer.node`` has
      written the record with;
    - ``moved`` when another replica wrote the record last from a report of the UE newer than
      ``seen`` (or ``seen`` is None while the record has one): the UE has moved to a node of
      that replica, which now decides for the session; a replica takes a session over only
      with a view of the UE at least as recent as the record's (docs/scale-out.md §3);
    - ``stale_epoch`` when ``epoch`` is below the record's.
    ValueError for a token below 1. Atomicity (no write in between the read of ``current``
    and this one) is the caller's: a compare-and-set on the stored bytes.
    """
    if writer.token < 1:
        raise ValueError(f"fencing token {writer.token} must be >= 1")
    if current is None:
        return SessionRecord(session_id, writer.replica, writer.node, writer.token, int(epoch),
                             1, {writer.node: writer.token}, dict(data), seen), False
    fenced = current.fences.get(writer.node, 0)
    if writer.token < fenced:
        raise WriteRefused("stale_token", f"session {session_id}: {writer.replica}'s lease on "
                           f"{writer.node} has token {writer.token}, the record saw {fenced}")
    if current.owner != writer.replica and current.seen is not None \
            and (seen is None or seen < current.seen):
        raise WriteRefused("moved", f"session {session_id}: {current.owner} decides from a "
                           f"report at {current.seen}, {writer.replica}'s latest is {seen}")
    if epoch < current.epoch:
        raise WriteRefused("stale_epoch", f"session {session_id}: epoch {epoch} below the "
                           f"record's {current.epoch}")
    fences = dict(current.fences)
    fences[writer.node] = writer.token
    new = replace(current, owner=writer.replica, node=writer.node, token=writer.token,
                  epoch=int(epoch), version=current.version + 1, fences=fences, data=dict(data),
                  seen=seen)
    return new, current.owner != writer.replica


def arrival_owner(me: str, records: Iterable[SessionRecord | None],
                  holders: Mapping[str, str | None]) -> str | None:
    """The replica to which ``me`` forwards a UE's arrival at one of its E2 nodes (a handover
    from another replica's node, docs/scale-out.md §3), or None when ``me`` decides it itself.

    Args:
        me: the replica that saw the UE arrive (the new node's owner).
        records: the records of the UE's sessions (None: a session with no record yet).
        holders: E2 node -> the replica whose lease on it is held now (None: no lease held),
            for the node of every record.

    A record counts for its owner when the owner is another replica and still holds the lease
    of the node it wrote the record for (it is alive and may still write: its prepared attempt
    commits under its own epoch). Returns the owner of the most such records (ties: the
    smallest id); None when there is none (no record, records of ``me``, or owners whose lease
    expired or was claimed by another: ``me`` takes the sessions over, by the fallback).
    """
    count: dict[str, int] = {}
    for rec in records:
        if rec is not None and rec.owner != me and holders.get(rec.node) == rec.owner:
            count[rec.owner] = count.get(rec.owner, 0) + 1
    if not count:
        return None
    return min(count, key=lambda r: (-count[r], r))
