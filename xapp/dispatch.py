"""Actions of the Scheduler Engine -> Control calls to the agents, and their replies back.

:class:`ActionDispatcher` is the one place an action becomes a policy call: each action kind
(its ``rpc``, the one name of the kind: :mod:`xapp.scheduler.state`) has its event writer (a
table, not a chain of type tests); the event carries the model estimates the engine decided
with (the action's ``rates``, not read again at send time), and the action is sent as built
(:meth:`xapp.policy.PolicyClient.send`) and remembered until its reply, which goes back to the
engine (:meth:`SchedulerEngine.on_reply`). A session's actions decided while one of its
commits is in flight wait in the :class:`~xapp.scheduler.gate.CommitGate` until that reply.
Every order sent and every reply also go to the :class:`~xapp.store.MigrationJournal` (when
one is given), which keeps the in-flight migrations in the xApp's store (SDL in a RIC) for a
restart (issue 16). With several xApp replicas (issue 46) every order first passes the
``guard`` (:class:`xapp.cluster.sessions.SessionGuard`): the session's record is written in SDL,
and an order whose write is refused is not sent (an ``order_refused`` event; the engine is told
the call failed, so its state machine leaves the attempt).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import structlog

from pallas_common.contract import COMMIT_MOVED_FIELDS, commit_choice_of
from pallas_common.schemes import SessionState, scheme_name
from pallas_proto import pallas_pb2 as pb
from xapp.ports import DecisionEngine, EventSink, Journal, OrderGuard, PolicyPort
from xapp.policy import CallOutcome
from xapp.scheduler import Action, CancelAction, CommitAction, TriggerAction
from xapp.scheduler.gate import CommitGate

__all__ = ["ActionDispatcher"]

log = structlog.get_logger("pallas.xapp.dispatch")

Handover = tuple[str, int, int, float]
"""The handover an action belongs to: (UE, from cell, to cell, trace time)."""

EventWriter = Callable[[Action, float, Handover | None], None]
"""Writes the event of one action kind before it is sent: (the action, wall time now, its
handover or None). Each writer is filed under its kind's ``rpc`` and is only ever called with
an action of that kind (so it reads that kind's fields)."""


class ActionDispatcher:
    """Sends the engine's actions through ``policy`` (a :class:`xapp.policy.PolicyClient`).

    ``engine``: the SchedulerEngine; ``events``: the event log; ``lock``: the lock that guards
    the engine (shared with the control loop); ``offset()``: wall clock minus trace clock, s;
    ``tokens``: session -> (K, wall time) from telemetry (read only). Entries of
    :attr:`pending` (actions waiting for their reply) go when the reply is handled, or with
    their session (:meth:`forget_session`), so they are bounded by the live sessions.
    ``journal``: an ``xapp.store.MigrationJournal`` told of every order before it is sent, of
    every reply, and of sessions opening and ending (None: nothing kept). A failing store is
    logged and never stops an order. ``guard``: a replica's
    :class:`~xapp.cluster.sessions.SessionGuard` (``check(action)`` -> (the order to send or
    None, the refusal's reason)); None (one replica): every order goes out as decided.
    """

    def __init__(self, engine: DecisionEngine, policy: PolicyPort, events: EventSink, lock: threading.RLock,
                 offset: Callable[[], float], tokens: dict[str, tuple[int, float]],
                 journal: Journal | None = None, guard: OrderGuard | None = None) -> None:
        self.engine, self.policy, self.events, self._lock = engine, policy, events, lock
        self.journal = journal
        self.guard = guard
        self.refused = 0          # orders not sent: their session record's write was refused
        self._offset, self._tokens = offset, tokens
        self.gate: CommitGate[Handover | None] = CommitGate()
        # session -> {(rpc, epoch, a Trigger's target or ""): (action, T_early of a trigger)};
        # one epoch may hold Triggers at several targets (issue 45)
        self.pending: dict[str, dict[tuple[str, int, str], tuple[Action, float | None]]] = {}
        # the event each kind writes before it is sent, by the action's rpc
        self._events: dict[str, EventWriter] = {
            "Trigger": self._trigger, "Cancel": self._cancel, "Commit": self._commit}

    # -- out ----------------------------------------------------------------------------------
    def send(self, actions: list[Action], ho: Handover | None = None) -> None:
        """Send each action (or hold it behind its session's commit in flight). Never raises
        for an action naming an agent no longer configured (logged and dropped)."""
        now = time.time()
        for a in actions:
            with self._lock:
                go = self.gate.admit(a, ho)
            if not go:
                self.events.write("held", call=a.rpc.lower(),
                                  session=a.session_id, epoch=a.epoch,
                                  behind_commit=self.gate.in_flight(a.session_id))
                continue
            if self.guard is not None:
                checked, why = self.guard.check(a)
                if checked is None:
                    self._not_sent(a, why)
                    continue
                a = checked
            self._journal("sent", a)
            try:
                self._events[a.rpc](a, now, ho)
                self._remember(a, a.predicted_early_s if a.rpc == "Trigger" else None)
                self.policy.send(a)
            except KeyError as e:
                log.error("action for an unknown agent dropped", action=repr(a), error=repr(e))
                if self.journal is not None and a.rpc != "Cancel":
                    self._journal_call(self.journal.store.finish_migration, a.session_id, a.epoch)

    def _not_sent(self, a: Action, why: str) -> None:
        """``a``'s session record was refused (``why``): the order is not sent; the engine is
        told the call failed (a trigger's attempt is cancelled, a commit leaves the session at
        its source and releases what waits behind it), and what it decides is sent in turn."""
        self.refused += 1
        self.events.write("order_refused", call=a.rpc.lower(), session=a.session_id, epoch=a.epoch,
                          source_agent=a.source, reason=why)
        reply = pb.ControlReply(status=pb.STATUS_ERROR, session_id=a.session_id, epoch=a.epoch,
                                message=f"not sent: session record refused ({why})")
        released: list[tuple[Action, Handover | None]] = []
        with self._lock:
            more = self.engine.on_reply(a, reply)
            if a.rpc == "Commit":
                released = self.gate.settle(a, False)
        self.send(more)
        for b, ho in released:
            self.send([b], ho=ho)

    def _journal(self, event: str, *args: object, **kw: object) -> None:
        """``journal.<event>(*args)`` if there is a journal; a store failure is logged."""
        if self.journal is not None:
            self._journal_call(getattr(self.journal, event), *args, **kw)

    @staticmethod
    def _journal_call(fn: Callable[..., object], *args: object, **kw: object) -> None:
        try:
            fn(*args, **kw)
        except Exception as e:  # the store (SDL) failing never stops the control path
            log.error("journal write failed", call=getattr(fn, "__name__", "?"), error=repr(e))

    def opened(self, session_id: str, agent_id: str, ue_id: str = "") -> None:
        """A session newly tracked, served by ``agent_id`` (its binding is journalled)."""
        self._journal("opened", session_id, agent_id, ue_id=ue_id, scheme=int(self.engine.scheme),
                      fallback=int(self.engine.fallback))

    def _remember(self, a: Action, extra: float | None = None) -> None:
        with self._lock:
            self.pending.setdefault(a.session_id, {})[_key(a)] = (a, extra)

    def _trigger(self, a: TriggerAction, now: float, ho: Handover | None) -> None:
        off = self._offset()
        # The model's T_SIT and T_early at T_w* as the engine decided them (its margin for the
        # predictor's timing error included), not evaluated again here.
        t_sit, t_early = (float("nan") if v is None else v for v in (a.predicted_sit_s, a.predicted_early_s))
        sch = scheme_name(a.scheme)
        self.events.write("trigger", session=a.session_id, epoch=a.epoch, trace_t=now - off,
                          ue=self.engine.session(a.session_id).ue_id, source_agent=a.source,
                          target_agent=a.target, t_ho_pred=a.predicted_handover_time - off,
                          t_remain=a.predicted_handover_time - now, window_s=a.window_s,
                          l_hist=a.predicted_split_tokens, t_sit_s=t_sit, t_early_s=t_early, scheme=sch,
                          rank=a.rank, **a.rates.fields())

    def _cancel(self, a: CancelAction, now: float, ho: Handover | None) -> None:
        self.events.write("cancel", session=a.session_id, epoch=a.epoch, trace_t=now - self._offset(),
                          source_agent=a.source, target_agent=a.target, reason=a.reason,
                          only_target=a.only_target)

    def _commit(self, a: CommitAction, now: float, ho: Handover | None) -> None:
        with self._lock:
            trig = self.pending.get(a.session_id, {}).get(("Trigger", a.epoch, a.actual_target))
        k = self._tokens.get(a.session_id, (None, 0))[0]
        ue, f, t, t_ho = ho if ho else ("", -1, -1, a.handover_time - self._offset())
        prepared = a.prepared_target is not None
        self.events.write("commit", ue=ue, session=a.session_id, epoch=a.epoch, trace_t=t_ho,
                          source_agent=a.source, target_agent=a.actual_target, from_cell=f, to_cell=t,
                          prepared=prepared, scheme=scheme_name(a.scheme),
                          window_s=trig[0].window_s if trig and prepared else None,
                          t_early_s=trig[1] if trig and prepared else None, k_curr=k,
                          **a.rates.fields())

    # -- back ---------------------------------------------------------------------------------
    def on_reply(self, out: CallOutcome) -> None:
        """A call's outcome (the PolicyClient's hook): logged, then handed to the engine; a
        commit's reply releases the session's held actions."""
        self._journal("replied", out)
        r = out.reply
        # A commit's reply also says what the handover moved (blocks, bytes, reused/recomputed).
        moved = ({f: int(getattr(r, f)) for f in COMMIT_MOVED_FIELDS}
                 if r is not None and out.kind == "Commit" else {})
        if out.kind == "Commit" and commit_choice_of(r):  # the agent's commit-time choice
            moved["choice"] = commit_choice_of(r)
        self.events.write("reply", call=out.kind.lower(), agent=out.agent_id, session=out.session_id,
                          epoch=out.epoch, ok=out.ok, status=pb.Status.Name(r.status) if r else None,
                          state=SessionState.name_of(r.state) if r else None, scheme=scheme_name(r.scheme) if r else None,
                          split_tokens=int(r.split_tokens) if r else None, message=r.message if r else out.error,
                          latency_s=out.latency_s, attempts=out.attempts, **moved)
        with self._lock:
            mine = self.pending.get(out.session_id, {})
            entry = mine.get((out.kind, out.epoch, out.target))
            if entry is None:
                return
            if out.kind != "Trigger":        # a trigger stays until its commit or cancel
                del mine[(out.kind, out.epoch, out.target)]
                for key in [k for k in mine if k[0] == "Trigger" and k[1] == out.epoch
                            and (not out.target or k[2] == out.target)]:
                    del mine[key]            # every target's trigger of the epoch (a targeted
                                             # Cancel's: that target's alone)
            if not mine:
                self.pending.pop(out.session_id, None)
        reply = r if r is not None else pb.ControlReply(status=pb.STATUS_ERROR, message=out.error)
        released: list[tuple[Action, Handover | None]] = []
        with self._lock:
            more = self.engine.on_reply(entry[0], reply)
            if out.kind == "Commit":
                released = self.gate.settle(entry[0], reply.status == pb.STATUS_OK)
        self.send(more)
        for a, ho in released:
            self.send([a], ho=ho)

    def forget_session(self, session_id: str) -> None:
        """The session ended: drop what waits for its replies and its cached replies, and its
        records in the journal's store."""
        self._journal("ended", session_id)
        with self._lock:
            self.pending.pop(session_id, None)
            self.gate.forget(session_id)
        forget = getattr(self.policy, "forget_session", None)
        if forget is not None:
            forget(session_id)


def _key(a: Action) -> tuple[str, int, str]:
    """An action's key in :attr:`ActionDispatcher.pending`: (rpc, epoch, the Trigger's or the
    targeted Cancel's target, or "") as a reply (``CallOutcome``: kind, epoch, target) names it."""
    named = isinstance(a, TriggerAction) or (isinstance(a, CancelAction) and a.only_target)
    return (a.rpc, a.epoch, a.target if named else "")
