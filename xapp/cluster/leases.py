"""E2 node leases and session records of the xApp's replicas in OSC SDL (issue 46).

:class:`NodeLeases` applies the rules of :mod:`xapp.cluster.ownership` through ricsdl's own
primitives, one SDL namespace shared by every replica of the xApp:

- ``replica/<id>``: a replica's liveness, an SDL lock resource (``SyncStorage.get_lock_resource``,
  expiring after the lease time) that the replica refreshes every heartbeat. ricsdl keeps a
  lock under the same ``{namespace},<name>`` key as data, so ``find_keys(ns, "replica/*")``
  lists the live replicas and ``get`` of a lock's name says whether it is held.
- ``lease/<E2 node>``: the node's lease, an SDL lock resource of the same expiry: claimed with
  a non-blocking ``acquire`` (one holder at a time, Redis ``SET NX PX``), renewed with
  ``refresh``, given up with ``release``; a replica that stops renewing loses it when it expires.
- ``fence/<E2 node>``: ``{"replica", "token"}`` (JSON), the node's current holder and its
  fencing token: the number of times the node's lease was claimed. A replica that acquired
  the lease raises it by one with a compare-and-set (``set_if_not_exists`` / ``set_if``).
- ``generation/<g>``, ``generation``: the epoch generations claimed (:meth:`NodeLeases.claim_generation`),
  the same keys, in the same msgpack encoding, as ``xapp.store.SdlStore``'s claim at a process
  start, so a generation claimed either way is never claimed again.
- ``session/<session id>``: a UE session's record (:class:`~xapp.cluster.ownership.SessionRecord`,
  JSON), written only by compare-and-set on the bytes read, so a write based on a stale read
  fails and is retried from a fresh read; the fencing rule refuses a writer whose lease was
  claimed again since.

``set_if`` is SDL's compare-and-set. ricsdl sends it as ``SETIE``, a command of DBaaS's Redis
module (the RIC's database); a plain ``redis-server`` (the tests', a lab's) lacks it and answers
"unknown command". Then, and only then, the same compare-and-set runs as a Redis Lua script
over ricsdl's connection (one atomic ``GET``/compare/``SET``), as ricsdl's own locks do.

Threads: ricsdl's locks keep their token per thread (redis-py ``Lock``), so :meth:`heartbeat`,
:meth:`stop` and every claim run on one thread; :meth:`owns`, :meth:`token` and the session
writes may run on any.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from xapp.cluster.ownership import (Membership, SessionRecord, WriteRefused, Writer, plan_leases,
                                    write_session)

log = structlog.get_logger("pallas.xapp.cluster")

__all__ = ["NodeLeases", "Heartbeat", "LeaseError", "open_sdl"]

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,252}$")

# SETIE's semantics (DBaaS redismodule): set KEYS[1] to ARGV[1] if it now holds ARGV[2].
_SET_IF_LUA = """
if redis.call('get', KEYS[1]) == ARGV[2] then
    redis.call('set', KEYS[1], ARGV[1])
    return 1
end
return 0
"""


class LeaseError(RuntimeError):
    """Bad arguments to :class:`NodeLeases` (an id SDL key patterns cannot hold, a lease time
    that is not positive)."""


def open_sdl() -> Any:
    """A ricsdl ``SyncStorage`` on the RIC's DBaaS (``DBAAS_SERVICE_HOST`` / ``_PORT`` or the
    sentinel variables, read by ricsdl). Raises LeaseError when ``DBAAS_SERVICE_HOST`` is unset."""
    import os

    if not os.environ.get("DBAAS_SERVICE_HOST"):
        raise LeaseError("SDL: DBAAS_SERVICE_HOST is not set (the RIC's DBaaS address)")
    from ricsdl.syncstorage import SyncStorage

    return SyncStorage()


@dataclass(frozen=True)
class Heartbeat:
    """What one :meth:`NodeLeases.heartbeat` changed (node ids, sorted): ``claimed`` (subscribe
    to these now), ``released`` and ``lost`` (delete their subscriptions; ``lost``: the lease
    had expired or could not be renewed in time), ``owned`` (held now), ``live`` (the replicas
    counted for the assignment) and ``seen`` (every replica whose liveness was found)."""

    claimed: tuple[str, ...] = ()
    released: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    owned: tuple[str, ...] = ()
    live: tuple[str, ...] = ()
    seen: tuple[str, ...] = ()

    def changes(self) -> dict[str, list[str]] | None:
        """The fields of a ``lease`` event (``claimed``, ``released``, ``lost``, ``owned``: lists
        of node ids) when this heartbeat changed the owned set, else None. The replay reads them
        to time a fail-over (``pallas_eval.failover``)."""
        if not (self.claimed or self.released or self.lost):
            return None
        return {"claimed": list(self.claimed), "released": list(self.released),
                "lost": list(self.lost), "owned": list(self.owned)}


@dataclass
class _Held:
    lock: Any
    token: int
    valid_until: float  # this replica's clock; the lease's server-side expiry is no earlier


@dataclass
class LeaseCounters:
    """What a replica's leases and session records did since it started (the metrics read them)."""

    claims: int = 0
    releases: int = 0
    losses: int = 0
    records_handed_over: int = 0
    cas_conflicts: int = 0
    generations: int = 0        # epoch generations claimed on a take-over
    writes_refused: dict = field(default_factory=dict)


class NodeLeases:
    """One replica's E2 node leases and session-record writes in SDL (module docstring).

    Args:
        sdl: a ricsdl ``SyncStorage`` (:func:`open_sdl`); one per replica.
        replica_id: this replica's identity (the pod name): letters, digits, ``._:@-``.
        nodes: the E2 node ids shared among the replicas (every replica configured alike).
        namespace: the SDL namespace of the xApp's keys.
        lease_s: lease time (s): a replica that stops renewing loses its nodes, and counts as
            gone, this long after its last renewal. Call :meth:`heartbeat` well within it
            (a third of it or more often).
        max_claims / max_releases: per-heartbeat bounds of :func:`~xapp.cluster.ownership.plan_leases`.
        join_delay_s: how long another replica must be seen live before nodes are given up to
            it (default: ``lease_s``).
        clock: monotonic clock (s).

    Raises LeaseError for bad arguments. SDL failures raise ricsdl's ``SdlException`` from
    :meth:`heartbeat` (nothing held is dropped until its lease time has passed).
    """

    def __init__(self, sdl: Any, replica_id: str, nodes: Iterable[str], *,
                 namespace: str = "pallas", lease_s: float = 3.0, max_claims: int = 16,
                 max_releases: int = 4, join_delay_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not _ID.match(replica_id or ""):
            raise LeaseError(f"replica id {replica_id!r}: 1-253 letters, digits or ._:@- "
                             "(an SDL key pattern must not read it as a glob)")
        if not lease_s > 0:
            raise LeaseError(f"lease_s {lease_s} must be > 0")
        if max_claims < 1 or max_releases < 1:
            raise LeaseError(f"max_claims {max_claims} / max_releases {max_releases} must be >= 1")
        self.sdl = sdl
        self.me = replica_id
        self.nodes = tuple(sorted(set(nodes)))
        self.ns = namespace
        self.lease_s = float(lease_s)
        self.max_claims, self.max_releases = int(max_claims), int(max_releases)
        self.clock = clock
        self.membership = Membership(replica_id, lease_s if join_delay_s is None else join_delay_s)
        self.counters = LeaseCounters()
        self._held: dict[str, _Held] = {}
        self._mu = threading.Lock()
        self._alive: Any = None   # this replica's liveness lock
        self._lua: Any = None     # the compare-and-set script, once SETIE proved absent

    # -- ownership ------------------------------------------------------------------------------
    def owns(self, node: str) -> bool:
        """Whether this replica holds ``node``'s lease now (renewed less than the lease time
        ago, by this replica's clock)."""
        with self._mu:
            h = self._held.get(node)
            return h is not None and self.clock() < h.valid_until

    def token(self, node: str) -> int | None:
        """The fencing token of this replica's lease on ``node`` (None: not held)."""
        with self._mu:
            h = self._held.get(node)
            return None if h is None else h.token

    def owned(self) -> tuple[str, ...]:
        """The E2 nodes this replica holds now (:meth:`owns`), sorted."""
        now = self.clock()
        with self._mu:
            return tuple(sorted(n for n, h in self._held.items() if now < h.valid_until))

    def heartbeat(self) -> Heartbeat:
        """Renew this replica's liveness and leases, then claim and give up nodes by the lease
        rule (:func:`~xapp.cluster.ownership.plan_leases`). Returns what changed."""
        from ricsdl.exceptions import SdlException

        lost = self._renew()
        seen = self._live_replicas()
        live = self.membership.observe(seen, self.clock())
        owners = self._owners()
        plan = plan_leases(self.me, self.nodes, live, owners, max_claims=self.max_claims,
                           max_releases=self.max_releases, seen=seen)
        released = []
        for n in plan.release:
            with self._mu:
                h = self._held.pop(n, None)
            if h is None:
                continue
            try:
                h.lock.release()
            except SdlException:
                pass   # expired already: given up either way
            released.append(n)
            self.counters.releases += 1
        claimed = [n for n in plan.claim if self._claim(n)]
        if claimed or released or lost:
            log.info("node_leases", replica=self.me, claimed=claimed, released=released,
                     lost=lost, owned=len(self._held))
        return Heartbeat(tuple(claimed), tuple(released), tuple(lost), self.owned(),
                         tuple(sorted(live)), tuple(sorted(seen)))

    def stop(self) -> tuple[str, ...]:
        """Give up every lease and the liveness (a clean shutdown: the others claim the nodes
        at their next heartbeat instead of after the lease time). Returns the nodes given up."""
        from ricsdl.exceptions import SdlException

        with self._mu:
            held, self._held = self._held, {}
        for h in list(held.values()) + ([] if self._alive is None else [self._alive]):
            try:
                (h.lock if isinstance(h, _Held) else h).release()
            except SdlException:
                pass
        self._alive = None
        self.counters.releases += len(held)
        return tuple(sorted(held))

    def _renew(self) -> list[str]:
        from ricsdl.exceptions import SdlException

        if self._alive is None:
            self._alive = self.sdl.get_lock_resource(self.ns, f"replica/{self.me}", self.lease_s)
        try:
            self._alive.refresh()
        except SdlException:
            # not held (first heartbeat, or it expired): take it again
            self._alive.acquire(retry_interval=0.01, retry_timeout=0)
        lost = []
        with self._mu:
            held = list(self._held.items())
        for n, h in held:
            t0 = self.clock()
            try:
                h.lock.refresh()
                h.valid_until = t0 + self.lease_s
                continue
            except SdlException as e:
                gone = _not_owned(e) or t0 >= h.valid_until
            if gone:
                with self._mu:
                    self._held.pop(n, None)
                lost.append(n)
                self.counters.losses += 1
        return lost

    def _live_replicas(self) -> set[str]:
        keys = self.sdl.find_keys(self.ns, "replica/*")
        return {k[len("replica/"):] for k in keys} | {self.me}

    def _owners(self) -> dict[str, str | None]:
        with self._mu:
            mine = set(self._held)
        owners: dict[str, str | None] = {n: self.me for n in mine}
        others = self.holders(n for n in self.nodes if n not in mine)
        for n, holder in others.items():
            # held by someone; a holder named as this replica is a lease it no longer has
            owners[n] = "?" if holder == self.me else holder
        return owners

    def holders(self, nodes: Iterable[str]) -> dict[str, str | None]:
        """E2 node -> the replica whose lease on it is held now in SDL (the ``fence/<node>``
        holder while ``lease/<node>`` exists; ``"?"`` when the fence names none), None when no
        lease on it is held (never claimed, released, or expired). One SDL read."""
        nodes = sorted(set(nodes))
        names = {f"lease/{n}" for n in nodes} | {f"fence/{n}" for n in nodes}
        got = self.sdl.get(self.ns, names) if nodes else {}
        out: dict[str, str | None] = {}
        for n in nodes:
            if f"lease/{n}" not in got:
                out[n] = None
                continue
            holder = (_json(got.get(f"fence/{n}")) or {}).get("replica")
            out[n] = str(holder) if holder else "?"
        return out

    def _claim(self, node: str) -> bool:
        from ricsdl.exceptions import SdlException

        lock = self.sdl.get_lock_resource(self.ns, f"lease/{node}", self.lease_s)
        t0 = self.clock()
        if not lock.acquire(retry_interval=0.01, retry_timeout=0):
            return False
        try:
            token = self._bump_fence(node)
        except SdlException:
            token = None
        if token is None:
            try:
                lock.release()
            except SdlException:
                pass
            return False
        with self._mu:
            self._held[node] = _Held(lock, token, t0 + self.lease_s)
        self.counters.claims += 1
        return True

    def _bump_fence(self, node: str) -> int | None:
        """Raise ``fence/<node>``'s token by one, naming this replica (a compare-and-set: the
        lease is held, so only a holder whose lease expired meanwhile can race it)."""
        key = f"fence/{node}"
        raw = self.sdl.get(self.ns, {key}).get(key)
        cur = _json(raw) or {}
        token = int(cur.get("token", 0)) + 1
        new = _dumps({"replica": self.me, "token": token})
        return token if self._cas(key, raw, new) else None

    # -- epoch generations ----------------------------------------------------------------------
    def claim_generation(self, now: float | None = None) -> int:
        """Claim an epoch generation above every generation claimed so far by any replica or
        process on this SDL (``generation/<g>`` keys; ``xapp.store.next_generation``), with SETNX
        from there upward, and point ``generation`` at it. Returns it; the caller's store adopts
        it (``XappStore.adopt_generation``). ``now``: wall clock, s since 1970 (the floor).

        Why above every one *found* is enough: a session record's epoch was numbered in a
        generation claimed before the record was written, so before the caller read it; the
        scan, made after that read, finds that claim. Raises ricsdl's ``SdlException`` when SDL
        does not answer (nothing claimed)."""
        import msgpack

        from xapp.store import GENERATION_BITS, next_generation
        claimed = [int(k.split("/", 1)[1]) for k in self.sdl.find_keys(self.ns, "generation/*")
                   if k.split("/", 1)[1].isdigit()]
        raw = self.sdl.get(self.ns, {"generation"}).get("generation")
        last = int(msgpack.unpackb(raw)) if raw is not None else 0
        wall = time.time() if now is None else now
        g = next_generation(claimed, last, wall)
        mark = msgpack.packb({"replica": self.me, "at": wall}, use_bin_type=True)
        while not self.sdl.set_if_not_exists(self.ns, f"generation/{g}", mark):
            g += 1
        if g >= 1 << GENERATION_BITS:
            raise LeaseError(f"generation {g} does not fit {GENERATION_BITS} bits")
        self.sdl.set(self.ns, {"generation": msgpack.packb(g, use_bin_type=True)})
        self.counters.generations += 1
        log.info("generation_claimed", replica=self.me, generation=g)
        return g

    # -- session records ----------------------------------------------------------------------
    def read_session(self, session_id: str) -> SessionRecord | None:
        """The session's record in SDL, None when it has none."""
        raw = self.sdl.get(self.ns, {f"session/{session_id}"}).get(f"session/{session_id}")
        return None if raw is None else SessionRecord.from_dict(json.loads(raw))

    def write_session(self, session_id: str, node: str, *, epoch: int,
                      data: Mapping[str, Any], seen: float | None = None) -> SessionRecord:
        """Write the session's record as the owner of E2 node ``node`` (the UE's serving node).

        Raises :class:`~xapp.cluster.ownership.WriteRefused` with reason ``not_owner`` (this
        replica does not hold ``node``'s lease now), ``stale_token`` / ``stale_epoch`` (the
        fencing and epoch rules), ``moved`` (another replica decides from a newer report of
        the UE than ``seen``) or ``conflict`` (the compare-and-set lost three times in a
        row)."""
        with self._mu:
            h = self._held.get(node)
            valid = h is not None and self.clock() < h.valid_until
        if not valid:
            self._refused("not_owner")
            raise WriteRefused("not_owner", f"{self.me} does not hold E2 node {node}'s lease")
        return self.cas_session(session_id, Writer(self.me, node, h.token), epoch=epoch,
                                data=data, seen=seen)

    def cas_session(self, session_id: str, writer: Writer, *, epoch: int,
                    data: Mapping[str, Any], tries: int = 3,
                    seen: float | None = None) -> SessionRecord:
        """The compare-and-set under :meth:`write_session`, for ``writer`` as given (no check
        of this replica's leases: what a replica paused past its lease would do). Raises as
        :meth:`write_session`."""
        key = f"session/{session_id}"
        for _ in range(tries):
            raw = self.sdl.get(self.ns, {key}).get(key)
            cur = None if raw is None else SessionRecord.from_dict(json.loads(raw))
            try:
                new, handed_over = write_session(cur, session_id, writer, epoch=epoch, data=data,
                                                 seen=seen)
            except WriteRefused as e:
                self._refused(e.reason)
                raise
            if self._cas(key, raw, _dumps(new.to_dict())):
                if handed_over:
                    self.counters.records_handed_over += 1
                    log.info("session_handed_over", session=session_id, replica=self.me,
                             previous=cur.owner if cur else None, node=writer.node)
                return new
            self.counters.cas_conflicts += 1
        self._refused("conflict")
        raise WriteRefused("conflict", f"session {session_id}: compare-and-set lost {tries} times")

    def _refused(self, reason: str) -> None:
        w = self.counters.writes_refused
        w[reason] = w.get(reason, 0) + 1

    # -- compare-and-set ------------------------------------------------------------------------
    def _cas(self, key: str, old: bytes | None, new: bytes) -> bool:
        """Set ``key`` to ``new`` if it holds ``old`` now (None: if it is absent)."""
        from ricsdl.exceptions import RejectedByBackend

        if old is None:
            return bool(self.sdl.set_if_not_exists(self.ns, key, new))
        if self._lua is None:
            try:
                return bool(self.sdl.set_if(self.ns, key, old, new))
            except RejectedByBackend as e:
                if "unknown command" not in str(e).lower():
                    raise
                conn = self.sdl.get_backend().get_redis_connection(self.ns)
                self._lua = conn.register_script(_SET_IF_LUA)
                log.info("sdl_set_if_lua", note="no SETIE (plain Redis): compare-and-set by "
                         "a Lua script")
        # ricsdl's key layout: "{namespace},key"
        return bool(self._lua(keys=["{" + self.ns + "}," + key], args=[new, old]))


def _not_owned(exc: BaseException) -> bool:
    """Whether a ricsdl lock error says the lock is no longer ours (expired, taken)."""
    from redis.exceptions import LockNotOwnedError

    return isinstance(exc.__cause__, LockNotOwnedError)


def _json(raw: bytes | None) -> dict | None:
    if raw is None:
        return None
    try:
        v = json.loads(raw)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
