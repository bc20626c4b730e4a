"""Handovers that cross replicas: the new node's owner forwards the UE's arrival to the replica
that owns the UE's session records (issue 46, docs/scale-out.md §3).

A handover between E2 nodes of two replicas is seen only by the new node's owner (the UE's first
report comes from the new node), while the session's prepared attempt (its Trigger, its epoch)
is the old node's owner's. So the session's decisions stay with the replica that owns its record
until its commit: the replica that sees the arrival publishes it on the owner's SDL channel
instead of committing; the owner runs its ordinary handover path (a prepared Commit under the
Trigger's epoch when the UE arrived where it prepared, else its fallback) and writes the record
from the arrival's report; the record then moves to the new node's owner with the next order
that replica writes (a view of the UE at least as recent, §3 rule 2).

    new node's owner                     SDL (Redis)                      record's owner
    first report of UE u  --route-->  session records, leases
    owner alive           --publish-->  arrivals/<owner>  --listener-->  on_forwarded(u, cell, t)
    orders for u's sessions held                                          Commit (prepared|fallback),
    until the record shows t  <-------- session/<id> (seen = t) <-------- record written first
    no answer within the lease time, or the owner's lease gone: the arrival is decided here
    (the take-over, a fallback under a new generation: §3 items 2-4)

Messages: JSON ``{"ue", "cell", "t", "from", "to", "sessions", "sent"}`` (``t``: the arrival
report's time, the trace clock in test mode; ``sent``: the wall clock at publication, s since
1970, for the latency). They go out with SDL's ``set_and_publish`` (DBaaS's ``MSETMPUB``: the key
``arrivals/<owner>`` holds the latest arrival forwarded to that replica, so the keys stay one per
replica); a plain ``redis-server`` lacks that command, and then, and only then, the same SET and
PUBLISH run as one Lua script over ricsdl's connection (as ``NodeLeases`` does for ``set_if``).
They arrive through ricsdl's ``subscribe_channel`` and ``start_event_listener`` (redis-py's
listener thread).
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from xapp.cluster.ownership import arrival_owner

log = structlog.get_logger("pallas.xapp.cluster")

__all__ = ["ArrivalRelay", "Forwarded"]

# MSETMPUB's semantics for one key and one channel (DBaaS redismodule)
_SET_AND_PUBLISH_LUA = """
redis.call('set', KEYS[1], ARGV[1])
redis.call('publish', ARGV[2], ARGV[3])
return 1
"""
_SEPARATOR = "___"   # ricsdl splits an event at its event separator; one event is sent, rejoined


@dataclass
class Forwarded:
    """An arrival this replica forwarded and waits on: the UE, its new cell, the arrival report's
    time ``t``, the replica it went to, the sessions whose orders are held here meanwhile, and
    the deadline (this replica's monotonic clock, s)."""

    ue: str
    cell: int
    t: float
    owner: str
    sessions: tuple[str, ...]
    deadline: float


class ArrivalRelay:
    """Forwards arrivals to the owner of the UE's session records and receives those forwarded to
    this replica (module docstring).

    Args:
        leases: this replica's :class:`~xapp.cluster.leases.NodeLeases` (``me``, ``ns``,
            ``sdl``, ``read_session``, ``holders``, ``lease_s``).
        timeout_s: how long a forwarded arrival waits for its owner's record before this
            replica decides it (s; default: the lease time, after which a dead owner has lost
            its lease anyway).
        check_s: how often the forwarded arrivals are checked (s).
        clock: monotonic clock (s).

    :meth:`attach` gives it the control loop's two entries (``on_forwarded(ue, cell, t, by)``,
    ``on_unanswered(ue, cell, t)``); :meth:`start` subscribes and starts the checker thread.
    Counters: ``forwarded``, ``received``, ``unanswered`` (decided here after the wait),
    ``owner_gone`` (decided here at once: no live owner), ``failed`` (a publication SDL
    refused: decided here); ``latencies``: publication-to-receipt times (s) of the arrivals
    received, the latest 1024.
    """

    #: UEs whose latest arrival received is remembered (the least recent go first)
    RECEIVED = 4096

    def __init__(self, leases: Any, *, timeout_s: float | None = None, check_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not check_s > 0:
            raise ValueError(f"check_s {check_s} must be > 0")
        self.leases = leases
        self.me = leases.me
        self.timeout_s = float(leases.lease_s if timeout_s is None else timeout_s)
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s {self.timeout_s} must be > 0")
        self.check_s, self.clock = float(check_s), clock
        self.counts = {"forwarded": 0, "received": 0, "unanswered": 0, "owner_gone": 0,
                       "failed": 0}
        self.latencies: collections.deque[float] = collections.deque(maxlen=1024)
        self._pending: dict[str, Forwarded] = {}     # UE -> the arrival forwarded
        # UE -> the time of the latest arrival forwarded to this replica (the latest RECEIVED)
        self._received: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._held: dict[str, str] = {}              # session -> UE, while forwarded
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lua: Any = None
        self._on_forwarded: Callable[[str, int, float, str], Any] | None = None
        self._on_unanswered: Callable[[str, int, float], Any] | None = None

    @property
    def channel(self) -> str:
        """This replica's SDL channel (and the key holding the latest arrival sent on it)."""
        return f"arrivals/{self.me}"

    def attach(self, on_forwarded: Callable[[str, int, float, str], Any],
               on_unanswered: Callable[[str, int, float], Any]) -> None:
        """``on_forwarded(ue, cell, t, sender)``: an arrival this replica must decide;
        ``on_unanswered(ue, cell, t)``: an arrival it forwarded that no owner decided."""
        self._on_forwarded, self._on_unanswered = on_forwarded, on_unanswered

    # -- out ------------------------------------------------------------------------------------
    def forward(self, ue: str, sessions: Iterable[str], cell: int, t: float) -> str | None:
        """Route the arrival of ``ue`` (first report at ``cell``, report time ``t``) whose
        sessions are ``sessions``: returns the replica it was forwarded to, or None when this
        replica decides it (no live owner other than itself, :func:`arrival_owner`; or SDL
        failed: counted in ``failed``, logged). While forwarded, the sessions' orders from this
        replica are held (:meth:`holds`)."""
        sids = tuple(sessions)
        try:
            records = [self.leases.read_session(s) for s in sids]
            holders = self.leases.holders(r.node for r in records if r is not None)
            owner = arrival_owner(self.me, records, holders)
            if owner is None:
                if any(r is not None and r.owner != self.me for r in records):
                    self.counts["owner_gone"] += 1
                return None
            with self._mu:
                self._pending[ue] = Forwarded(ue, cell, t, owner, sids,
                                              self.clock() + self.timeout_s)
                for s in sids:
                    self._held[s] = ue
            msg = {"ue": ue, "cell": int(cell), "t": float(t), "from": self.me, "to": owner,
                   "sessions": list(sids), "sent": time.time()}
            self._publish(owner, json.dumps(msg, separators=(",", ":")))
        except Exception as e:        # SDL unreachable, a malformed record: decide here
            self._drop(ue)
            self.counts["failed"] += 1
            log.error("arrival_not_forwarded", replica=self.me, ue=ue, error=repr(e))
            return None
        self.counts["forwarded"] += 1
        log.info("arrival_forwarded", replica=self.me, ue=ue, cell=cell, t=t, owner=owner)
        return owner

    def holds(self, session_id: str) -> float | None:
        """The arrival time ``t`` of the forwarded arrival that holds ``session_id``'s orders
        at this replica, None when none does."""
        with self._mu:
            ue = self._held.get(session_id)
            f = self._pending.get(ue) if ue is not None else None
            return None if f is None else f.t

    def decides_from(self, ue: str, seen: float | None) -> bool:
        """Whether ``seen`` (the time of this replica's latest report of ``ue``) is that of an
        arrival another replica forwarded to it: its orders from that view are written for the
        node of the session's record, which it holds (docs/scale-out.md §3 rule 6)."""
        with self._mu:
            return seen is not None and self._received.get(ue) == seen

    def answered(self, session_id: str) -> None:
        """The session's record shows the forwarded arrival decided (its ``seen`` reached the
        arrival's time): its orders are no longer held here, nor those of its UE's arrival."""
        with self._mu:
            ue = self._held.get(session_id)
        if ue is not None:
            self._drop(ue)

    def _drop(self, ue: str) -> Forwarded | None:
        with self._mu:
            f = self._pending.pop(ue, None)
            if f is not None:
                for s in f.sessions:
                    if self._held.get(s) == ue:
                        del self._held[s]
            return f

    def _publish(self, owner: str, event: str) -> None:
        from ricsdl.exceptions import RejectedByBackend

        sdl, ns, key = self.leases.sdl, self.leases.ns, f"arrivals/{owner}"
        if self._lua is None:
            try:
                sdl.set_and_publish(ns, {key: [event]}, {key: event.encode()})
                return
            except RejectedByBackend as e:
                if "unknown command" not in str(e).lower():
                    raise
                conn = sdl.get_backend().get_redis_connection(ns)
                self._lua = conn.register_script(_SET_AND_PUBLISH_LUA)
                log.info("sdl_publish_lua", note="no MSETMPUB (plain Redis): set and publish "
                         "by a Lua script")
        full = "{" + ns + "}," + key         # ricsdl's layout of keys and channels
        self._lua(keys=[full], args=[event.encode(), full, event.encode()])

    # -- in -------------------------------------------------------------------------------------
    def _receive(self, channel: str, events: list[str]) -> None:
        """ricsdl's listener thread: one arrival forwarded to this replica."""
        try:
            msg = json.loads(_SEPARATOR.join(events))
            ue, cell, t, sender = str(msg["ue"]), int(msg["cell"]), float(msg["t"]), str(msg["from"])
            sent = float(msg["sent"])
        except (ValueError, KeyError, TypeError) as e:
            log.error("arrival_malformed", replica=self.me, channel=channel, error=repr(e))
            return
        self.latencies.append(time.time() - sent)
        self.counts["received"] += 1
        with self._mu:
            self._received[ue] = t
            self._received.move_to_end(ue)
            while len(self._received) > self.RECEIVED:
                self._received.popitem(last=False)
        if self._on_forwarded is None:
            return
        try:
            self._on_forwarded(ue, cell, t, sender)
        except Exception as e:
            log.error("arrival_not_handled", replica=self.me, ue=ue, error=repr(e))

    def check(self) -> list[Forwarded]:
        """One pass over the arrivals forwarded (on the checker thread): one whose sessions'
        records all show it decided (``seen`` >= its time) is done; one past its deadline, or
        whose owner no longer holds the lease of the node it wrote the records for, is decided
        here (``on_unanswered``). Returns the arrivals decided here."""
        with self._mu:
            pending = list(self._pending.values())
        now, late = self.clock(), []
        for f in pending:
            try:
                records = [self.leases.read_session(s) for s in f.sessions]
                if all(r is None or (r.seen is not None and r.seen >= f.t) for r in records):
                    self._drop(f.ue)
                    continue
                nodes = [r.node for r in records if r is not None and r.owner == f.owner]
                gone = any(h != f.owner for h in self.leases.holders(nodes).values())
            except Exception as e:    # SDL unreachable: wait for the deadline
                log.warning("arrival_check_failed", replica=self.me, ue=f.ue, error=repr(e))
                gone = False
            if gone or now >= f.deadline:
                if self._drop(f.ue) is not None:
                    late.append(f)
        for f in late:
            self.counts["unanswered"] += 1
            log.warning("arrival_unanswered", replica=self.me, ue=f.ue, owner=f.owner, t=f.t)
            if self._on_unanswered is not None:
                try:
                    self._on_unanswered(f.ue, f.cell, f.t)
                except Exception as e:
                    log.error("arrival_not_handled", replica=self.me, ue=f.ue, error=repr(e))
        return late

    # -- threads --------------------------------------------------------------------------------
    def start(self) -> None:
        """Subscribe to this replica's channel (ricsdl's listener thread) and start the checker
        thread. Raises ricsdl's ``SdlException`` when SDL does not answer."""
        if self._thread is not None:
            return
        sdl = self.leases.sdl
        sdl.subscribe_channel(self.leases.ns, self._receive, self.channel)
        sdl.start_event_listener()
        self._thread = threading.Thread(target=self._run, name=f"arrivals-{self.me}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.check_s):
            self.check()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Unsubscribe, stop the listener (ricsdl has no call for it: redis-py's worker thread
        is stopped on each of the backend's connections) and the checker. Idempotent."""
        self._stop.set()
        if self._thread is None:
            return
        sdl = self.leases.sdl
        try:
            sdl.unsubscribe_channel(self.leases.ns, self.channel)
        except Exception as e:
            log.warning("arrivals_unsubscribe_failed", replica=self.me, error=repr(e))
        for ctx in getattr(sdl.get_backend(), "clients", ()):
            worker = getattr(ctx, "pubsub_thread", None)
            if worker is not None and hasattr(worker, "stop"):
                worker.stop()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
