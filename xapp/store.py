"""The xApp's durable state: migration epochs, session bindings, in-flight migrations (issue 16).

After a restart the xApp must never reissue a migration epoch (an agent that has seen epoch n
answers STALE_EPOCH to every later message of an epoch <= n, docs/model.md §5), and it must
find the migrations it had in flight so that each is resumed or cancelled at both agents. OSC
xApps keep such state in SDL (the RIC's shared data layer, Redis behind DBaaS).

One interface, :class:`XappStore`, two implementations:

- :class:`MemoryStore`: in memory (test mode, the local replay; nothing survives a restart).
- :class:`SdlStore`: OSC SDL through ricxappframe's ``SDLWrapper`` (``ricsdl``; the DBaaS
  address from ``DBAAS_SERVICE_HOST`` / ``DBAAS_SERVICE_PORT``, or the sentinel variables, as
  for every OSC xApp), under one SDL namespace.

Epochs. An epoch is ``(generation << EPOCH_COUNTER_BITS) | n`` where ``n`` counts the session's
allocations in this process (1, 2, ...) and ``generation`` is claimed once per process start:
:class:`SdlStore` claims the first free ``generation/<g>`` key with SETNX (an atomic claim:
two xApp instances, e.g. the old and the new pod of a rolling update, never share one), from
``max(last generation + 1, minutes since 2025-01-01)``. So

- an epoch is never reissued: not within a process (``n`` only grows; a session id that ends
  and comes back continues above every ``n`` handed out to an ended session), not across
  restarts or between instances (a later claim is a larger generation);
- the wall-clock floor keeps this true even if Redis lost its data (a DBaaS without
  persistence restarted), as long as the xApp restarted less than once a minute on average;
- allocation itself is local: no Redis round trip on the handover path;
- across scale-out replicas (issue 46) a replica that takes over a session whose record's epoch
  is at or above its own base claims a new generation above every one claimed so far
  (:func:`needs_new_generation`, :meth:`XappStore.adopt_generation`), never ``record + 1``.

:class:`MemoryStore` uses generation 0, so test mode numbers a session's epochs 1, 2, 3, ... as
the scheduler does today. Only plain Redis commands are used (SETNX, MGET, MSET, DEL, KEYS):
``SDLWrapper.set_if``/``delete_if`` need DBaaS's Redis module (SETIE/DELIE), which a plain
``redis-server`` lacks. Records are written last-writer-wins: the xApp is a single writer.
Listing records (:meth:`XappStore.bindings`, :meth:`XappStore.migrations`) scans the namespace's
keys (SDL ``find_and_get``): for the start-up recovery, not for the control loop.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from typing import Protocol, TypeVar

import structlog
from pallas_proto import pallas_pb2

from xapp.policy import CallOutcome
from xapp.scheduler.state import Action, CommitAction, TriggerAction

log = structlog.get_logger("pallas.xapp.store")

__all__ = [
    "EPOCH_COUNTER_BITS", "DEFAULT_NAMESPACE", "StoreError", "StoreUnavailable", "SessionBinding",
    "InFlightMigration", "RecoveryStep", "XappStore", "MemoryStore", "SdlStore", "open_store",
    "recovery_plan", "split_epoch", "next_generation", "needs_new_generation", "MigrationJournal",
]

EPOCH_COUNTER_BITS = 38
"""Low bits of an epoch: a session's allocations within one process (2^38 of them)."""

GENERATION_BITS = 24
"""High bits of an epoch: the process generation (epochs stay below 2^62, so they fit an int64
as well as the proto's uint64)."""

DEFAULT_NAMESPACE = "pallas"
"""SDL namespace of the xApp's keys (the descriptor's ``sdl.namespace`` overrides it)."""

_CLOCK_ORIGIN = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc).timestamp()
PHASES = ("preparing", "committing")


class StoreError(RuntimeError):
    """The store cannot do what was asked (bad record, epoch counter exhausted)."""


class StoreUnavailable(StoreError):
    """The SDL backend (Redis/DBaaS) did not answer or refused the operation; nothing was
    changed on the caller's side (an epoch that could not be claimed is never handed out)."""


@dataclass(frozen=True)
class SessionBinding:
    """Which agent serves an LLM session now (what the scheduler's SessionMigration is built
    from after a restart).

    ``agent_id``: the agent decoding the session (the migration source); ``ue_id``: the UE;
    ``scheme`` / ``fallback``: the proto Scheme values pinned for it; ``relay_hops``: Detour
    hops between that agent and the UE.
    """

    session_id: str
    agent_id: str
    ue_id: str = ""
    scheme: int = 0
    fallback: int = 0
    relay_hops: int = 0


@dataclass(frozen=True)
class InFlightMigration:
    """A migration the xApp has ordered and not yet seen finish (one per session at most).

    ``phase``: ``preparing`` (Trigger sent to ``source``; ``target`` prefills and receives the
    stream) or ``committing`` (Commit sent, reply not yet in). ``t_ho``: the predicted handover
    time (s, the xApp's clock); ``started_at``: wall-clock time of the order (s since 1970).
    """

    session_id: str
    epoch: int
    source: str
    target: str
    phase: str = "preparing"
    scheme: int = 0
    t_ho: float = 0.0
    started_at: float = 0.0

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise StoreError(f"phase {self.phase!r} not one of {PHASES}")
        if self.epoch <= 0:
            raise StoreError(f"epoch {self.epoch} must be positive")


@dataclass(frozen=True)
class RecoveryStep:
    """What a restarted xApp does about one in-flight migration: ``cancel`` (at the source
    and at the target) or ``commit`` (sent again; the agents answer a repeated
    (Commit, session, epoch) with the first reply)."""

    action: str
    migration: InFlightMigration


def split_epoch(epoch: int) -> tuple[int, int]:
    """``epoch`` -> ``(generation, n)`` (module docstring)."""
    return epoch >> EPOCH_COUNTER_BITS, epoch & ((1 << EPOCH_COUNTER_BITS) - 1)


def next_generation(claimed: Iterable[int], last: int, now: float) -> int:
    """The generation to try to claim first: above every generation in ``claimed`` (the
    ``generation/<g>`` keys found in SDL) and above ``last`` (the ``generation`` key: the last
    one claimed at a process start), and no lower than the minutes since 2025-01-01 at ``now``
    (s since 1970; the floor that survives a Redis that lost its data). The caller claims it
    with SETNX and tries the next one up while the claim fails (a concurrent claimer won it)."""
    return max(max(claimed, default=0) + 1, int(last) + 1, int((now - _CLOCK_ORIGIN) // 60), 1)


def needs_new_generation(record_epoch: int, generation: int) -> bool:
    """Whether a replica of generation ``generation`` that takes over a session whose record
    carries ``record_epoch`` must claim a new generation before it numbers an order (issue 46,
    docs/scale-out.md §3): when the record's epoch is at or above the replica's epoch base
    (``generation << EPOCH_COUNTER_BITS``), some of the replica's next epochs may lie at or below
    epochs another replica has issued for the session. Never ``record_epoch + 1``: that number
    lies in the other replica's generation, which may hand it out too."""
    return record_epoch >= generation << EPOCH_COUNTER_BITS


class XappStore(ABC):
    """The xApp's durable state (module docstring). Thread-safe.

    Subclasses set :attr:`generation` and implement the record I/O; epoch allocation is shared.
    """

    generation: int = 0

    def __init__(self) -> None:
        self._lock = threading.Lock()           # epoch counters
        self._records = threading.Lock()        # read-check-write of migration records
        self._counters: dict[str, int] = {}
        self._gens: dict[str, int] = {}   # session -> generation of its last allocation
        self._floor = 0  # the largest n ever handed out to a session that has ended

    # -- epochs ---------------------------------------------------------------------------------
    def allocate_epoch(self, session_id: str) -> int:
        """A fresh epoch for ``session_id``: larger than every epoch this store, an earlier
        process on the same backend, or another instance has handed out for that session id
        (epochs are per session, as the agents compare them). Raises StoreError when the
        session's 2^38 allocations in this process are used up."""
        with self._lock:
            n = self._counters.get(session_id, self._floor) + 1
            if n >= 1 << EPOCH_COUNTER_BITS:
                raise StoreError(f"epoch counter of session {session_id!r} exhausted")
            self._counters[session_id] = n
            g = self._gens[session_id] = self.generation
        return (g << EPOCH_COUNTER_BITS) | n

    def last_epoch(self, session_id: str) -> int:
        """The last epoch this process allocated for ``session_id`` (0: none since the start or
        since the session ended)."""
        with self._lock:
            n = self._counters.get(session_id)
            g = self._gens.get(session_id, self.generation)
        return 0 if n is None else (g << EPOCH_COUNTER_BITS) | n

    def adopt_generation(self, generation: int) -> None:
        """Number every later epoch in ``generation``, a generation this process has just
        claimed in SDL above every one claimed before (a replica taking over a session,
        :func:`needs_new_generation`; the claim: ``xapp.cluster.leases.NodeLeases.claim_generation``).
        The per-session counters go on, so each session's epochs still only grow. Raises
        StoreError for a generation that is not above the current one or does not fit
        ``GENERATION_BITS``."""
        if not self.generation < generation < 1 << GENERATION_BITS:
            raise StoreError(f"generation {generation}: must be above {self.generation} and "
                             f"below 2^{GENERATION_BITS}")
        with self._lock:
            self.generation = int(generation)
        log.info("generation_adopted", generation=generation)

    # -- records (subclasses) ---------------------------------------------------------------------
    @abstractmethod
    def _put(self, kind: str, session_id: str, record: dict) -> None: ...

    @abstractmethod
    def _get(self, kind: str, session_id: str) -> dict | None: ...

    @abstractmethod
    def _all(self, kind: str) -> dict[str, dict]: ...

    @abstractmethod
    def _delete(self, kind: str, session_ids: list[str]) -> None: ...

    def close(self) -> None:
        """Release the backend connection (the state stays in the backend)."""

    # -- bindings -------------------------------------------------------------------------------
    def put_binding(self, binding: SessionBinding) -> None:
        """Record (or replace) which agent serves ``binding.session_id``."""
        self._put("binding", binding.session_id, asdict(binding))

    def binding(self, session_id: str) -> SessionBinding | None:
        """The session's binding, None if it has none."""
        rec = self._get("binding", session_id)
        return None if rec is None else _load(SessionBinding, rec)

    def bindings(self) -> dict[str, SessionBinding]:
        """Every binding, by session id (a namespace scan: start-up use)."""
        return {sid: _load(SessionBinding, r) for sid, r in self._all("binding").items()}

    # -- in-flight migrations -------------------------------------------------------------------
    def put_migration(self, migration: InFlightMigration) -> bool:
        """Record the session's in-flight migration (replacing one of an epoch <= its own).
        False, and nothing written, if a newer epoch's migration is recorded already."""
        with self._records:
            cur = self._get("migration", migration.session_id)
            if cur is not None and int(cur["epoch"]) > migration.epoch:
                return False
            self._put("migration", migration.session_id, asdict(migration))
            return True

    def migration(self, session_id: str) -> InFlightMigration | None:
        """The session's in-flight migration, None if none."""
        rec = self._get("migration", session_id)
        return None if rec is None else _load(InFlightMigration, rec)

    def migrations(self) -> list[InFlightMigration]:
        """Every in-flight migration, oldest order first (a namespace scan: start-up use)."""
        out = [_load(InFlightMigration, r) for r in self._all("migration").values()]
        return sorted(out, key=lambda m: (m.started_at, m.session_id))

    def finish_migration(self, session_id: str, epoch: int) -> bool:
        """The migration of ``epoch`` finished (committed, cancelled or failed): forget it. False
        if the recorded one has another epoch (left as it is) or none is recorded."""
        with self._records:
            cur = self._get("migration", session_id)
            if cur is None or int(cur["epoch"]) != epoch:
                return False
            self._delete("migration", [session_id])
            return True

    def end_session(self, session_id: str) -> None:
        """The session ended: forget its binding, its in-flight migration and its counter (a
        later session of the same id still gets larger epochs)."""
        with self._lock:
            n = self._counters.pop(session_id, 0)
            self._gens.pop(session_id, None)
            self._floor = max(self._floor, n)
        self._delete("binding", [session_id])
        self._delete("migration", [session_id])


R = TypeVar("R", SessionBinding, InFlightMigration)


def _load(cls: type[R], rec: dict) -> R:
    """A record dict -> ``cls`` (unknown keys, written by a newer xApp, are ignored)."""
    names = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in rec.items() if k in names})
    except TypeError as exc:
        raise StoreError(f"malformed {cls.__name__} record {rec!r}: {exc}") from None


class MemoryStore(XappStore):
    """:class:`XappStore` in process memory (test mode): generation 0, nothing survives."""

    def __init__(self) -> None:
        super().__init__()
        self._data: dict[tuple[str, str], dict] = {}

    def _put(self, kind: str, session_id: str, record: dict) -> None:
        self._data[(kind, session_id)] = dict(record)

    def _get(self, kind: str, session_id: str) -> dict | None:
        rec = self._data.get((kind, session_id))
        return None if rec is None else dict(rec)

    def _all(self, kind: str) -> dict[str, dict]:
        return {sid: dict(r) for (k, sid), r in list(self._data.items()) if k == kind}

    def _delete(self, kind: str, session_ids: list[str]) -> None:
        for sid in session_ids:
            self._data.pop((kind, sid), None)


@contextmanager
def _sdl_errors(what: str) -> Iterator[None]:
    """ricsdl's exceptions (and the Redis client's) -> StoreUnavailable."""
    from ricsdl.exceptions import SdlException

    try:
        yield
    except SdlException as exc:
        raise StoreUnavailable(f"SDL {what}: {exc}") from exc


class SdlClient(Protocol):
    """What :class:`SdlStore` uses of ricxappframe's ``SDLWrapper`` (each call takes the SDL
    namespace first; values are JSON-able objects, which the wrapper serialises)."""

    def get(self, ns: str, key: str) -> object | None: ...

    def set(self, ns: str, key: str, value: object) -> None: ...

    def set_if_not_exists(self, ns: str, key: str, value: object) -> bool: ...

    def find_and_get(self, ns: str, prefix: str) -> dict[str, dict]: ...

    def delete(self, ns: str, key: str) -> None: ...


class SdlStore(XappStore):
    """:class:`XappStore` in OSC SDL (Redis behind DBaaS) under ``namespace``.

    Args:
        namespace: SDL namespace of every key (``generation``, ``generation/<g>``,
            ``binding/<session>``, ``migration/<session>``).
        sdl: an ``SDLWrapper`` (:class:`SdlClient`) to use (default: a new one; ricsdl reads ``DBAAS_SERVICE_HOST``,
            ``DBAAS_SERVICE_PORT`` and the sentinel variables when it is made).
        clock: wall clock, seconds since 1970 (the generation's floor).

    Claims this process's generation at construction (module docstring); raises
    StoreUnavailable if SDL cannot be reached then: the xApp must not start without it.
    """

    def __init__(self, namespace: str = DEFAULT_NAMESPACE, *, sdl: SdlClient | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        if sdl is None:
            if not os.environ.get("DBAAS_SERVICE_HOST"):
                raise StoreUnavailable("SDL: DBAAS_SERVICE_HOST is not set (the RIC's DBaaS "
                                       "address; test mode uses the memory store)")
            from ricxappframe.xapp_sdl import SDLWrapper

            sdl = SDLWrapper(use_fake_sdl=False)
        self.ns = namespace
        self._sdl = sdl
        self.generation = self._claim_generation(clock())
        log.info("sdl_store_ready", namespace=namespace, generation=self.generation)

    def _claim_generation(self, now: float) -> int:
        with _sdl_errors("claiming a generation"):
            last = self._sdl.get(self.ns, "generation") or 0
            g = next_generation((), int(last), now)
            while not self._sdl.set_if_not_exists(self.ns, f"generation/{g}",
                                                  {"pid": os.getpid(), "at": now}):
                g += 1
            if g >= 1 << GENERATION_BITS:
                raise StoreError(f"generation {g} does not fit {GENERATION_BITS} bits")
            self._sdl.set(self.ns, "generation", g)
        return g

    def _put(self, kind: str, session_id: str, record: dict) -> None:
        with _sdl_errors(f"writing {kind} {session_id}"):
            self._sdl.set(self.ns, f"{kind}/{session_id}", record)

    def _get(self, kind: str, session_id: str) -> dict | None:
        with _sdl_errors(f"reading {kind} {session_id}"):
            return self._sdl.get(self.ns, f"{kind}/{session_id}")

    def _all(self, kind: str) -> dict[str, dict]:
        prefix = f"{kind}/"
        with _sdl_errors(f"listing {kind}"):
            found = self._sdl.find_and_get(self.ns, prefix)
        return {k[len(prefix):]: v for k, v in found.items() if k.startswith(prefix)}

    def _delete(self, kind: str, session_ids: list[str]) -> None:
        with _sdl_errors(f"deleting {kind}"):
            for sid in session_ids:
                self._sdl.delete(self.ns, f"{kind}/{sid}")

    def close(self) -> None:
        """Close SDL's Redis connections."""
        backend = getattr(self._sdl, "_sdl", None)
        if backend is not None and hasattr(backend, "close"):
            backend.close()


def open_store(kind: str | None = None, namespace: str = DEFAULT_NAMESPACE) -> XappStore:
    """The store for this xApp: ``kind`` ``"sdl"`` or ``"memory"``; None picks SDL when
    ``DBAAS_SERVICE_HOST`` is set (as in a RIC) and memory otherwise (logged: epochs then start
    again after a restart). Raises ValueError for another kind, StoreUnavailable as
    :class:`SdlStore`."""
    if kind is None:
        kind = "sdl" if os.environ.get("DBAAS_SERVICE_HOST") else "memory"
    if kind == "sdl":
        return SdlStore(namespace)
    if kind == "memory":
        log.warning("memory_store",
                    note="test mode: epochs and migrations do not survive a restart")
        return MemoryStore()
    raise ValueError(f"store kind {kind!r}: one of 'sdl', 'memory'")


def recovery_plan(store: XappStore) -> list[RecoveryStep]:
    """What a restarted xApp owes each migration it had in flight (issue 16): a ``preparing``
    one is cancelled at both agents (its handover has not been seen; the source stops its
    stream and releases the target, the target releases what it holds even if the source
    cannot reach it), a
    ``committing`` one is committed again (the handover happened; a repeat is answered from the
    agents' reply cache). The caller sends them and calls :meth:`XappStore.finish_migration`
    with each one's epoch when the agent has answered."""
    return [RecoveryStep("commit" if m.phase == "committing" else "cancel", m)
            for m in store.migrations()]


class MigrationJournal:
    """Writes the scheduler's orders and the agents' replies through to ``store``, so that a
    restarted xApp finds what it had in flight (:func:`recovery_plan`) and who serves each
    session.

    Told of ``xapp.scheduler.state``'s actions (TriggerAction, CancelAction, CommitAction)
    and ``xapp.policy.CallOutcome``:

    - :meth:`sent` before an order goes out: a Trigger records a ``preparing`` migration (a
      Trigger of rank > 0, an extra target of the epoch, adds nothing to it), a
      Commit a ``committing`` one (a Cancel changes nothing: the record stays until the agent
      answers, so a restart in between cancels again, which the agents treat as a repeat);
    - :meth:`replied` with each outcome: an answered Cancel (naming no target: a targeted
      one withdraws an extra target and changes nothing) or Commit ends the record of its
      epoch (an unanswered call leaves it for the recovery; a Cancel sent to several agents,
      :meth:`cancelling`, ends it once every one of them answered); a Commit answered OK
      rebinds the session to the actual target, or, for Detour, adds a relay hop;
    - :meth:`opened` / :meth:`ended` when a session appears or ends.

    ``clock``: wall clock, seconds since 1970 (``started_at``).
    """

    def __init__(self, store: XappStore, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self._clock = clock
        self._commits: dict[tuple[str, int], CommitAction] = {}  # commits sent, by (session, epoch)
        # (session, epoch) -> (agents yet to answer its Cancel, whether one answered already)
        self._cancels: dict[tuple[str, int], tuple[set[str], list[bool]]] = {}
        self._lock = threading.Lock()  # replies arrive on the policy client's worker threads

    def opened(self, session_id: str, agent_id: str, *, ue_id: str = "", scheme: int = 0,
               fallback: int = 0) -> None:
        """A session is served by ``agent_id``."""
        self.store.put_binding(SessionBinding(session_id, agent_id, ue_id, scheme, fallback))

    def ended(self, session_id: str) -> None:
        """The session ended (:meth:`XappStore.end_session`)."""
        self.store.end_session(session_id)
        with self._lock:
            for d in (self._commits, self._cancels):
                for key in [k for k in d if k[0] == session_id]:
                    del d[key]

    def sent(self, action: Action) -> None:
        """Record ``action`` before it is sent (a CancelAction: nothing yet)."""
        if isinstance(action, TriggerAction) and action.rank > 0:
            # An extra target of the epoch (issue 45): the epoch's record is its primary's; a
            # recovery's Cancel at the source ends every target's attempt of the epoch.
            return
        if isinstance(action, TriggerAction):
            self.store.put_migration(InFlightMigration(
                action.session_id, int(action.epoch), action.source, action.target, "preparing",
                int(action.scheme), float(action.predicted_handover_time), self._clock()))
        elif isinstance(action, CommitAction):
            with self._lock:
                self._commits[(action.session_id, int(action.epoch))] = action
            self.store.put_migration(InFlightMigration(
                action.session_id, int(action.epoch), action.source, action.actual_target,
                "committing", int(action.scheme), float(action.handover_time), self._clock()))

    def cancelling(self, session_id: str, epoch: int, agents: list[str]) -> None:
        """A Cancel of ``epoch`` goes to each of ``agents`` (the source and the target, at the
        recovery): the record ends only when all of them answered."""
        with self._lock:
            self._cancels[(session_id, int(epoch))] = (set(agents), [False])

    def not_sent(self, session_id: str, epoch: int, agent_id: str) -> None:
        """The Cancel of ``epoch`` could not be sent to ``agent_id`` (no longer configured): it
        is not waited for; the record ends if every other agent has answered (it stays if none
        answered, for the next start)."""
        key = (session_id, int(epoch))
        with self._lock:
            entry = self._cancels.get(key)
            if entry is None:
                return
            entry[0].discard(agent_id)
            if entry[0] or not entry[1][0]:
                return
            del self._cancels[key]
        self.store.finish_migration(session_id, int(epoch))

    def replied(self, outcome: CallOutcome) -> None:
        """Record an agent's answer (no reply: nothing changes)."""
        if outcome.reply is None or outcome.kind not in ("Cancel", "Commit"):
            return
        if outcome.kind == "Cancel" and outcome.target:
            return   # a targeted Cancel (an extra target withdrawn): the epoch's record stays
        key = (outcome.session_id, int(outcome.epoch))
        if outcome.kind == "Cancel":
            with self._lock:
                entry = self._cancels.get(key)
                if entry is not None:
                    entry[0].discard(outcome.agent_id)
                    entry[1][0] = True
                    if entry[0]:
                        return
                    del self._cancels[key]
        self.store.finish_migration(outcome.session_id, int(outcome.epoch))
        with self._lock:
            commit = self._commits.pop((outcome.session_id, int(outcome.epoch)), None)
        if outcome.kind != "Commit" or commit is None or not outcome.ok:
            return
        old = self.store.binding(outcome.session_id) or SessionBinding(outcome.session_id,
                                                                       commit.source)
        if int(commit.scheme) == pallas_pb2.SCHEME_DETOUR:
            self.store.put_binding(replace(old, relay_hops=old.relay_hops + 1))
        else:
            self.store.put_binding(replace(old, agent_id=commit.actual_target, relay_hops=0))
