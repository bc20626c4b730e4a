"""Session records in the decision path of a replica (issue 46, docs/scale-out.md §3).

Every order the Scheduler Engine gives (Trigger, Commit, Cancel) passes :meth:`SessionGuard.check`
before it leaves the replica: the session's record is written through
:meth:`xapp.cluster.leases.NodeLeases.write_session` first, and an order whose write is refused
is not sent. The rules, in order:

1. **Who writes.** The writer's E2 node is the E2 node (RMR MEID) of the UE's latest report as
   this replica's indications show it, the name its lease and its indications carry (after a
   handover: the new cell's node, whose owner is the replica that saw the handover), else, for
   a UE this replica does not track, the source agent's E2 node (``controls.agents[..].e2_node_id``). The writer must hold that node's lease (``not_owner``).
2. **Take-over.** A record last written by another replica is taken over only with a view of the
   UE at least as recent as the record's (``seen``, the time of the UE's latest report; else
   ``moved``): the replica that saw the UE arrive decides, the one that lost it goes quiet.
3. **Epochs of a take-over.** When the record's epoch is at or above this replica's epoch base,
   the replica claims a new generation above every one claimed so far
   (:meth:`NodeLeases.claim_generation`, :meth:`xapp.store.XappStore.adopt_generation`). An order
   that opens an attempt (a Trigger, or a Commit without a prepared target: the fallback)
   numbered outside this replica's current generation (the engine drew it before the claim, or
   from an agent's report of the other replica's epoch, ``epoch + 1``) gets a fresh epoch from
   the store, and the session's state machine moves to it (as the engine itself moves it from
   an agent's report), so the attempt's later Commit or Cancel carries it too. So no epoch is
   ever used by two replicas.
4. **Continuing.** A replica that takes a record over does not continue the old owner's prepared
   attempt under that attempt's epoch (that would be one epoch ordered by two replicas): its
   engine decides from what it sees (at a handover: a fallback commit), under an epoch of its
   own generation, which is above the old attempt's; the agents' epoch rule supersedes the old
   attempt at both agents (docs/model.md §5). The old owner's later orders for the session are
   refused (``moved``, ``not_owner`` or ``stale_epoch``) and not sent; its engine is told they
   failed, so its state machine leaves the attempt. A take-over at a handover happens only when
   the record's owner is gone (rule 6).
5. **Refusals** are counted by reason (``NodeLeases.counters.writes_refused``, the metric
   ``pallas_xapp_cluster_session_writes_refused_total{reason}``), logged, and written to the
   event log as ``order_refused``.
6. **Handovers that cross replicas** (:mod:`xapp.cluster.arrivals`): the new node's owner
   forwards the UE's arrival to the record's owner while that owner holds the lease of the
   record's node, and holds its own orders for the session (``forwarded``) until the record
   shows the arrival decided (``seen`` at or after the arrival) or the relay gives up waiting.
   The owner decides from the forwarded report (a prepared Commit under the Trigger's epoch)
   and, for a view that is such an arrival, writes the record for the node it holds (rule 1's
   exception: the UE's new node is not its own). The next order of the new node's owner, from a
   view at least as recent, takes the record over (rules 2-4).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from xapp.cluster.ownership import WriteRefused
from xapp.store import needs_new_generation, split_epoch

if TYPE_CHECKING:
    from xapp.config import XappConfig
    from xapp.store import XappStore

log = structlog.get_logger("pallas.xapp.cluster")

__all__ = ["SessionGuard", "PHASE_OF", "view_node"]

PHASE_OF = {"Trigger": "preparing", "Commit": "committing", "Cancel": "cancelled"}
"""The migration state a session's record carries after each kind of order (a targeted Cancel,
which withdraws one extra target while the epoch goes on, leaves it ``preparing``)."""


def view_node(view: tuple, config: XappConfig) -> str | None:
    """The E2 node a UE's ``view`` (serving cell, report time[, MEID]) puts it at, spelled as
    the leases and the indications spell it: the MEID of the UE's latest report; without one
    (a view forwarded by another replica, or a view of two fields), the ``e2_node_id`` of the
    agent of the serving cell; None when neither is known."""
    if len(view) > 2 and view[2]:
        return str(view[2])
    ep = config.agent_for_cell(view[0])
    return ep.e2_node_id if ep is not None and ep.e2_node_id else None


class SessionGuard:
    """Writes a session's record before each of its orders leaves this replica (module
    docstring).

    Args:
        leases: this replica's :class:`~xapp.cluster.leases.NodeLeases`.
        store: the xApp's epoch store (``xapp.store.XappStore``): the generation it numbers in.
        engine: the Scheduler Engine (``session(id)`` -> its state machine, KeyError when gone;
            ``renumber``: :meth:`xapp.scheduler.engine.SchedulerEngine.renumber`).
        ue_view: UE id -> (serving cell, time of its latest report[, the E2 node (RMR MEID)
            that report came from, "" when unknown]) as this replica's indications show it, or
            None for a UE it does not track (:func:`view_node`).
        config_of: the configuration in force (cells -> agents -> E2 nodes).
        lock: the engine's lock (the state machine's epoch is moved under it, by the engine).
    """

    def __init__(self, leases: Any, store: XappStore, engine: Any,
                 ue_view: Callable[[str], tuple | None],
                 config_of: Callable[[], XappConfig], lock: threading.RLock) -> None:
        self.leases, self.store, self.engine = leases, store, engine
        self.ue_view, self.config_of, self._lock = ue_view, config_of, lock
        self.renumbered = 0        # orders given a fresh epoch on a take-over
        #: the replica's :class:`~xapp.cluster.arrivals.ArrivalRelay` (rule 6), or None
        self.relay: Any = None

    def writer_node(self, action: Any, rec: Any = None) -> tuple[str | None, float | None, str]:
        """(the writer's E2 node, the time of the UE's latest report or None, the UE id) for
        ``action`` (rule 1); ``rec``: the session's record as read (None: none). The serving
        node as this replica sees it, except for a view that is an arrival another replica
        forwarded to this one (rule 6): then the node of the record this replica owns, if it
        holds that node's lease (the node it decided the session from)."""
        cfg = self.config_of()
        try:
            ue = self.engine.session(action.session_id).ue_id
        except KeyError:
            ue = ""
        view = self.ue_view(ue) if ue else None
        if view is not None:
            node = view_node(view, cfg)
            if node:
                if (rec is not None and rec.owner == self.leases.me and rec.node != node
                        and self.relay is not None and self.relay.decides_from(ue, view[1])
                        and self.leases.owns(rec.node)):
                    node = rec.node
                return node, view[1], ue
        src = cfg.agents.get(action.source)
        return (src.e2_node_id if src is not None else None), None, ue

    def check(self, action: Any) -> tuple[Any | None, str]:
        """``(the order to send, "")``, possibly with a fresh epoch (rule 3), or ``(None,
        reason)`` when the record's write was refused (nothing is sent). SDL failures refuse
        too (reason ``sdl``): an order never leaves without its record."""
        try:
            rec = self.leases.read_session(action.session_id)
            if rec is not None and rec.owner != self.leases.me and self.relay is not None:
                t = self.relay.holds(action.session_id)
                if t is not None and (rec.seen is None or rec.seen < t):
                    return None, self._refuse(action, "forwarded", f"arrival at {t} forwarded "
                                              f"to {rec.owner}, which decides it")
                if t is not None:
                    self.relay.answered(action.session_id)
            node, seen, ue = self.writer_node(action, rec)
            if node is None:
                return None, self._refuse(action, "no_node", "source agent has no E2 node")
            if rec is not None and rec.owner != self.leases.me:
                action = self._take_over(action, rec.epoch)
            phase = "preparing" if getattr(action, "only_target", False) else PHASE_OF[action.rpc]
            data = {"rpc": action.rpc, "phase": phase, "source": action.source,
                    "target": getattr(action, "actual_target", None) or action.target,
                    "ue": ue}
            self.leases.write_session(action.session_id, node, epoch=int(action.epoch),
                                      data=data, seen=seen)
        except WriteRefused as e:
            return None, self._refuse(action, e.reason, str(e))
        except Exception as e:           # SDL unreachable, a malformed record
            return None, self._refuse(action, "sdl", repr(e))
        return action, ""

    def _take_over(self, action: Any, record_epoch: int) -> Any:
        """Rule 3: a new generation when the record's epoch is at or above this replica's base;
        a fresh epoch for an order that opens an attempt outside the current generation."""
        if needs_new_generation(record_epoch, self.store.generation):
            self.store.adopt_generation(self.leases.claim_generation())
        opens = action.rpc == "Trigger" or (action.rpc == "Commit"
                                            and getattr(action, "prepared_target", 0) is None)
        if not opens or split_epoch(int(action.epoch))[0] >= self.store.generation:
            return action
        fresh = self.store.allocate_epoch(action.session_id)
        with self._lock:
            # a Trigger's attempt now runs under ``fresh``; after a commit the next one goes above
            if action.rpc == "Trigger":
                self.engine.renumber(action.session_id, fresh)
            else:
                self.engine.renumber(action.session_id, self.store.allocate_epoch(action.session_id),
                                     next_above=True)
        self.renumbered += 1
        log.info("order_renumbered", session=action.session_id, rpc=action.rpc,
                 epoch=action.epoch, fresh=fresh, generation=self.store.generation)
        return dataclasses.replace(action, epoch=fresh)

    def _refuse(self, action: Any, reason: str, detail: str) -> str:
        if reason in ("no_node", "sdl", "forwarded"):    # the others are counted by NodeLeases
            w = self.leases.counters.writes_refused
            w[reason] = w.get(reason, 0) + 1
        log.warning("order_refused", replica=self.leases.me, rpc=action.rpc,
                    session=action.session_id, epoch=action.epoch, reason=reason, detail=detail)
        return reason
