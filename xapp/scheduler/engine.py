"""The Scheduler Engine: one control cycle over every session, vectorised (paper §4.2, Alg. 1).

Inputs: per-UE handover predictions (target agent, t_HO, confidence), per-session and
per-agent telemetry (:class:`~xapp.scheduler.telemetry.TelemetryStore`), handovers seen on E2,
and the agents' replies. Output: actions (:mod:`xapp.scheduler.state`) for the composition
root to send. No I/O and no clock: every call takes ``now`` (s, the same clock as t_HO).

Per cycle (:meth:`SchedulerEngine.cycle`):

1. Sessions in PLANNED whose predicted HO, brought forward by the timing margin M
   (:mod:`xapp.scheduler.ho_timing`: how late the recent predictions have been), is within
   T_max + the trigger lookahead are gathered into arrays; T_remain_hat below is
   t_HO_hat - M - now. The rest cannot trigger this cycle (T_w* <= T_max), so their
   evaluation is skipped; so are sessions that will finish generating before the HO.
2. K_curr is extrapolated from the last report at the session's r_d; r_p (target), r_d
   (session) and B (source -> target) are the EWMA estimates, or the conservative defaults
   where stale (docs/model.md §2).
3. :func:`pallas_common.timing.decide` evaluates the 0..T_max grid for all of them at once
   (Eqs. 4-9) and applies the trigger rule.
4. For each session whose trigger fires, admission (model and KV memory, with the memory
   already promised to this cycle's and earlier unreported triggers at that target
   subtracted) decides between a TriggerAction and deferring.
5. With ``targets_k`` K > 1 (issue 45; docs/model.md §4.1), each PREPARING session whose UE has
   ranked candidates (:meth:`SchedulerEngine.set_predictions`, ``candidates``) gets
   :func:`~xapp.scheduler.targets.choose_targets` over them; every chosen target other than
   those already prepared whose own trigger rule holds (T_remain_hat <= its T_w* + look-ahead)
   and which passes admission there gets a TriggerAction of the same epoch with its rank
   (:meth:`SessionMigration.trigger_extra`). A FULL target is prepared with the session's
   scheme; a PREFIX one with ``SCHEME_NO_SM`` (prefix warm-up, no suffix stream) when the
   session's scheme is Pallas, and not at all under any other scheme (the agents' other
   proactive schemes have no prefix-only form). An extra target already prepared that the
   choice no longer names (its UE's candidates now its primary alone included) is dropped by a
   targeted Cancel (:meth:`SessionMigration.drop_extra`); the primary holds by step 3's rule.
   A UE whose predicted target is its session's own agent has that agent counted as one of the
   K, and its most likely candidate on another agent is the session's primary
   (:meth:`SchedulerEngine._next_after_own`). Within ``targets_return_s`` of a UE's handover,
   a PLANNED session of it whose target is the agent it left is due at once, whatever its
   predicted t_HO (the return rule, :meth:`SchedulerEngine._returns_due`). With K = 1 nothing
   of this runs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Iterable, Sequence

import numpy as np
import structlog
from prometheus_client import Counter, Histogram

from pallas_common.schemes import PROACTIVE, SessionState
from pallas_common.timing import Decision, DecisionParams, WindowInputs, decide, evaluate_windows
from pallas_proto import pallas_pb2

from .admission import ModelKey, admit
from .benefit import fallback_sit, worth_preparing
from .config import SchedulerConfig
from .ho_timing import HandoverTimingError
from .state import (Action, CancelAction, CommitAction, DecidedRates, MigrationState,
                    SessionMigration, TriggerAction)
from .targets import Candidate, Level, choose_targets
from .telemetry import TelemetryStore

__all__ = ["SchedulerEngine"]

log = structlog.get_logger(__name__)

ACTIONS = Counter("pallas_scheduler_actions_total", "Actions emitted by the Scheduler Engine",
                  ["kind", "scheme"])
CYCLE_SECONDS = Histogram("pallas_scheduler_cycle_seconds", "Time of one Scheduler Engine cycle",
                          buckets=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.3, 1.0))
ADMISSION_REFUSED = Counter("pallas_scheduler_admission_refused_total",
                            "Triggers deferred because admission at the target failed")
EXTRA_TARGETS = Counter("pallas_scheduler_extra_targets_total",
                        "Extra targets (beside a UE's primary, issue 45) by event: prepared "
                        "(their Trigger sent) or dropped (withdrawn by a targeted Cancel when "
                        "they left the target choice)", ["event"])
for _event in ("prepared", "dropped"):   # exposed from the start, as the descriptor declares it
    EXTRA_TARGETS.labels(_event)


class SchedulerEngine:
    """Every session's migration state, and the vectorised decision over them.

    ``cfg``: :class:`SchedulerConfig`; ``telemetry``: a store to share (a new one if None);
    ``scheme``: the descriptor's scheme as a ``pallas_pb2.Scheme`` (Pallas or an ablation
    prepares ahead; a reactive baseline never triggers, every HO takes ``fallback``);
    ``fallback``: the reactive scheme for an unprepared target that can serve the model
    (Detour where it cannot); ``min_confidence``: predictions below it count as none.
    ``epochs(session_id)``: fresh migration epochs for every session's state machine (the
    xApp's ``XappStore.allocate_epoch``; default: each machine counts from 1).
    """

    def __init__(self, cfg: SchedulerConfig, telemetry: TelemetryStore | None = None, *,
                 scheme: int = pallas_pb2.SCHEME_PALLAS, fallback: int = pallas_pb2.SCHEME_CTHO,
                 min_confidence: float = 0.0, capacity: int = 1024,
                 epochs: Callable[[str], int] | None = None) -> None:
        self.cfg = cfg
        self._epochs = epochs
        self.telemetry = telemetry if telemetry is not None else TelemetryStore(cfg)
        self.scheme, self.fallback = scheme, fallback
        self.proactive = scheme in PROACTIVE
        # The scheme a handover without preparation uses where the target can serve.
        self._reactive = fallback if self.proactive else scheme
        self.min_confidence = float(min_confidence)
        self._params = cfg.decision_params()
        self._horizon = _horizon(cfg, self._params)
        self.ho_timing = HandoverTimingError(cfg.ho_timing_quantile, cfg.ho_timing_max_margin_s,
                                             cfg.ho_timing_window)
        #: a replica of a scale-out (docs/scale-out.md §3): another replica may commit a session
        #: this engine tracks; its move is then followed from the agents' telemetry
        #: (:meth:`_follow_move`). False (one xApp): a session moves only by this engine's orders.
        self.follow_moves = False
        # session -> the source that reported it handed over, while no agent reports it serving
        # since: the session is parked (:meth:`parked`), never committed nor triggered
        self._left: dict[str, str] = {}
        # Sessions: a slot each; arrays indexed by slot.
        self._slot: dict[str, int] = {}
        self._free: list[int] = []
        self._sm: list[SessionMigration | None] = []
        self._model: list[ModelKey | None] = []
        self._ue_slots: dict[str, list[int]] = {}
        self._ue_first: dict[str, int] = {}           # the UE's first session's slot
        self._ue_multi: dict[str, list[int]] = {}     # its other sessions' slots, if any
        self._n = 0
        cap = max(1, capacity)
        self._alive = np.zeros(cap, bool)
        self._planned = np.zeros(cap, bool)           # state is PLANNED
        self._preparing = np.zeros(cap, bool)         # state is PREPARING
        self._allowed = np.ones(cap, bool)            # proactive migration allowed (A1 rules)
        self._tokens = np.zeros(cap)                  # K at the last report
        self._tokens_time = np.zeros(cap)
        self._remaining = np.full(cap, np.inf)        # tokens still to generate then
        self._s_kv = np.ones(cap)
        self._block = np.full(cap, 16.0)
        self._decode_slot = np.full(cap, -1, np.int64)
        self._source = np.full(cap, -1, np.int64)     # agent index
        self._target = np.full(cap, -1, np.int64)     # the state machine's target, -1 none
        self._t_ho = np.full(cap, np.nan)
        self._conf = np.ones(cap)                     # the prediction's calibrated probability
        # K > 1: the predictor's target is on the session's own agent, so its machine's target
        # is the best other candidate and that own agent counts as one of the K (set_predictions)
        self._own_rank0 = np.zeros(cap, bool)
        self.last_window = np.full(cap, np.nan)       # T_w* of the last decision, s
        # Agents: an index each; r_p slot per agent, B slot per (source, target) pair.
        self._agent_idx: dict[str, int] = {}
        self._agents: list[str] = []
        self._prefill_slot = np.zeros(0, np.int64)
        self._pair_slot = np.zeros((0, 0), np.int64)
        # KV memory promised at targets by triggers: session -> {target: (bytes, expiry time)}
        # (several targets with K > 1). Held until the commit's reply, a cancel or the expiry
        # (t_HO + stale_age_s), whatever the target's reports say meanwhile (their free memory
        # may not show it yet).
        self._reservations: dict[str, dict[str, tuple[int, float]]] = {}
        # The UEs' ranked candidate targets, (agent, p) best first, kept only while K > 1.
        self._cands: dict[str, tuple[tuple[str, float], ...]] = {}
        # K > 1: UE -> (index of the agent it left at its last handover, until when a
        # prediction naming that agent is due at once, s); :meth:`_returns_due`
        self._returns: dict[str, tuple[int, float]] = {}
        # UE -> its latest prediction as set_predictions took it (target, t_HO, confidence,
        # allowed, candidates): a session first seen between two of its UE's reports is
        # planned with it at once (ingest_telemetry), not at the UE's next report
        self._ue_pred: dict[str, tuple] = {}

    # -- run-time configuration ----------------------------------------------------------------
    def reconfigure(self, cfg: SchedulerConfig | None = None, *, scheme: int | None = None,
                    fallback: int | None = None) -> list[Action]:
        """The one way to change the engine's knobs while it runs (A1 instance, descriptor reload).

        ``cfg`` (alpha, dt_s, t_max_s, rates' defaults, ...) applies from the next
        :meth:`cycle` on, the telemetry estimates' weight, staleness and defaults with it;
        ``scheme`` and ``fallback`` (``pallas_pb2.Scheme`` values) apply to every session's next
        decision: a session not yet triggered takes the new proactive scheme, and every
        session's unprepared handover the new fallback. A switch to a reactive scheme (one that
        never prepares) cancels the attempts in flight and returns those CancelActions (the
        handovers then recover with that scheme); otherwise returns [].
        """
        if cfg is not None:
            self.cfg = cfg
            self._params = cfg.decision_params()
            self._horizon = _horizon(cfg, self._params)
            self.telemetry.reconfigure(cfg)
            self.ho_timing.configure(cfg.ho_timing_quantile, cfg.ho_timing_max_margin_s,
                                     cfg.ho_timing_window)
        if scheme is not None:
            self.scheme, self.proactive = scheme, scheme in PROACTIVE
        if fallback is not None:
            self.fallback = fallback
        self._reactive = self.fallback if self.proactive else self.scheme
        actions: list[Action] = []
        for sm in self._sm:
            if sm is None:
                continue
            sm.fallback = self._reactive
            if sm.state is MigrationState.PREPARING:
                if not self.proactive:
                    actions += sm.withdraw("scheme changed to " + pallas_pb2.Scheme.Name(self.scheme))
            elif self.proactive:
                sm.scheme = self.scheme
        self._count(actions)
        return actions

    # -- KV reservations at targets -----------------------------------------------------------
    def reserved_at(self, target: str, now: float | None = None) -> int:
        """KV bytes promised at ``target`` by triggers not yet committed, cancelled or expired."""
        total = 0
        for held in self._reservations.values():
            r = held.get(target)
            if r is not None and (now is None or r[1] >= now):
                total += r[0]
        return total

    def _reserve(self, session_id: str, target: str, need_bytes: int, expiry: float) -> None:
        self._reservations.setdefault(session_id, {})[target] = (int(need_bytes), float(expiry))

    def _release(self, session_id: str, target: str | None = None) -> None:
        """Free the session's reservations: at every target, or at ``target`` only."""
        if target is None:
            self._reservations.pop(session_id, None)
            return
        held = self._reservations.get(session_id)
        if held is not None:
            held.pop(target, None)
            if not held:
                del self._reservations[session_id]

    def _expire_reservations(self, now: float) -> None:
        for sid in list(self._reservations):
            held = self._reservations[sid]
            for tgt in [t for t, (_, exp) in held.items() if exp < now]:
                del held[tgt]
            if not held:
                del self._reservations[sid]

    # -- registries ---------------------------------------------------------------------------
    def _agent(self, agent_id: str) -> int:
        i = self._agent_idx.get(agent_id)
        if i is not None:
            return i
        i = len(self._agents)
        self._agents.append(agent_id)
        self._agent_idx[agent_id] = i
        self._prefill_slot = np.append(self._prefill_slot, self.telemetry.prefill.slot(agent_id))
        pair = np.full((i + 1, i + 1), -1, np.int64)
        pair[:i, :i] = self._pair_slot
        for j, other in enumerate(self._agents):
            pair[j, i] = self.telemetry.goodput.slot((other, agent_id))
            pair[i, j] = self.telemetry.goodput.slot((agent_id, other))
        self._pair_slot = pair
        return i

    def _index_ue(self, ue_id: str) -> None:
        slots = self._ue_slots.get(ue_id)
        self._ue_first.pop(ue_id, None)
        self._ue_multi.pop(ue_id, None)
        if slots:
            self._ue_first[ue_id] = slots[0]
            if len(slots) > 1:
                self._ue_multi[ue_id] = slots[1:]

    def _grow(self) -> None:
        cap = self._alive.size
        for name in ("_alive", "_planned", "_preparing", "_allowed", "_tokens", "_tokens_time", "_remaining",
                     "_s_kv", "_block", "_decode_slot", "_source", "_target", "_t_ho", "_conf",
                     "_own_rank0", "last_window"):
            a = getattr(self, name)
            setattr(self, name, np.concatenate([a, np.empty(cap, a.dtype)]))

    def _on_transition(self, sm: SessionMigration, old: MigrationState) -> None:
        slot = self._slot.get(sm.session_id)
        if slot is None:
            return
        self._planned[slot] = sm.state is MigrationState.PLANNED
        self._preparing[slot] = sm.state is MigrationState.PREPARING
        self._target[slot] = -1 if sm.target is None else self._agent(sm.target)
        self._source[slot] = self._agent(sm.source)
        if sm.state is not MigrationState.PLANNED and sm.state is not MigrationState.PREPARING:
            self._t_ho[slot] = np.nan

    # -- sessions -----------------------------------------------------------------------------
    def add_session(self, session_id: str, source: str, *, s_kv: int, block_size: int,
                    now: float, ue_id: str = "", tokens: int = 0,
                    remaining_tokens: int | None = None, model: ModelKey | None = None) -> None:
        """Start tracking ``session_id``, served by agent ``source``.

        ``s_kv``: KV bytes per token (Eq. 1); ``block_size``: P, tokens; ``tokens``: K at
        ``now``; ``remaining_tokens``: still to generate (None: unknown); ``model``: the
        source's model identity, for admission. Re-adding a known session updates it.
        Raises ValueError for a non-positive ``s_kv`` or ``block_size``.
        """
        if s_kv <= 0 or block_size <= 0:
            raise ValueError(f"session {session_id}: s_kv and block_size must be > 0")
        slot = self._slot.get(session_id)
        if slot is None:
            if self._free:
                slot = self._free.pop()
            else:
                slot = self._n
                self._n += 1
                if slot >= self._alive.size:
                    self._grow()
                self._sm.append(None)
                self._model.append(None)
            self._slot[session_id] = slot
            sm = SessionMigration(session_id, source, ue_id=ue_id,
                                  scheme=self.scheme if self.proactive else pallas_pb2.SCHEME_PALLAS,
                                  fallback=self._reactive, on_transition=self._on_transition,
                                  epochs=self._epochs)
            self._sm[slot] = sm
            self._ue_slots.setdefault(ue_id, []).append(slot)
            self._index_ue(ue_id)
            self._alive[slot], self._allowed[slot] = True, True
            self._planned[slot] = self._preparing[slot] = self._own_rank0[slot] = False
            self._target[slot], self._t_ho[slot], self.last_window[slot] = -1, np.nan, np.nan
            self._decode_slot[slot] = self.telemetry.decode.slot(session_id)
            self._source[slot] = self._agent(source)
        self._s_kv[slot], self._block[slot] = float(s_kv), float(block_size)
        if model is not None:
            self._model[slot] = model
        self.update_session(session_id, tokens, now, remaining_tokens)

    def update_session(self, session_id: str, tokens: int, now: float,
                       remaining_tokens: int | None = None) -> None:
        """New token count K (and tokens still to generate) of a known session at ``now``."""
        slot = self._slot[session_id]
        self._tokens[slot], self._tokens_time[slot] = float(tokens), float(now)
        self._remaining[slot] = np.inf if remaining_tokens is None else float(remaining_tokens)

    def remove_session(self, session_id: str, reason: str = "session ended") -> list[Action]:
        """Stop tracking a session (finished or gone); cancels a running attempt."""
        slot = self._slot.get(session_id)
        if slot is None:
            return []
        sm = self._sm[slot]
        actions = sm.end(reason) if sm is not None else []
        del self._slot[session_id]
        self._left.pop(session_id, None)
        if sm is not None:
            slots = self._ue_slots.get(sm.ue_id, [])
            if slot in slots:
                slots.remove(slot)
            if not slots:
                self._ue_slots.pop(sm.ue_id, None)
            self._index_ue(sm.ue_id)
            if sm.ue_id not in self._ue_slots:
                self._cands.pop(sm.ue_id, None)
        self._sm[slot], self._model[slot] = None, None
        self._release(session_id)
        self._alive[slot] = self._planned[slot] = self._preparing[slot] = False
        self._decode_slot[slot] = -1
        self._free.append(slot)
        self.telemetry.forget_session(session_id)
        self._count(actions)
        return actions

    def session(self, session_id: str) -> SessionMigration:
        """The state machine of ``session_id`` (KeyError if unknown)."""
        return self._sm[self._slot[session_id]]  # type: ignore[return-value]

    def parked(self, session_id: str) -> bool:
        """Whether ``session_id`` is parked (only with :attr:`follow_moves`): its source
        reported it handed over, another replica having committed it, and no agent has reported
        it serving since. Where it is served is unknown, so :meth:`on_handover` does not commit
        it and :meth:`cycle` does not trigger it (an order to the old source would be refused:
        STATUS_INVALID, the session is handed over there) until an agent reports it serving
        (:meth:`_follow_move`) or it is reported finished (removed)."""
        return session_id in self._left

    def _follow_move(self, sm: SessionMigration, agent: str, state: SessionState) -> None:
        """With :attr:`follow_moves`: a session's source reporting it ``handed_over`` was moved
        by another replica's commit: it is parked (:meth:`parked`); the next other agent to
        report it serving (``new``, ``serving``, ``resumed``) while this engine has no attempt
        in flight (not PREPARING) is its source from then on, and a plan made against the old
        source (PLANNED) is dropped (the next prediction replans from the new one). One xApp's
        own commit moves the source before the old one says so."""
        sid = sm.session_id
        if agent == sm.source and state is SessionState.HANDED_OVER:
            if sid not in self._left:
                log.info("session_parked", session=sid, source=agent, state=sm.state.value)
            self._left[sid] = agent
        elif (sid in self._left and agent != sm.source
              and state in (SessionState.NEW, SessionState.SERVING, SessionState.RESUMED)
              and sm.state is not MigrationState.PREPARING):
            del self._left[sid]
            log.info("session_moved_elsewhere", session=sid, source=sm.source, now_at=agent)
            if sm.state is MigrationState.PLANNED:
                sm.predict(None, None)
            sm.source, sm.relay_hops = agent, 0
            self._source[self._slot[sid]] = self._agent(agent)

    def renumber(self, session_id: str, epoch: int, *, next_above: bool = False) -> bool:
        """Move ``session_id``'s state machine to migration epoch ``epoch``, given to one of its
        orders outside the engine (a scale-out take-over, docs/scale-out.md §3 rule 3): the
        attempt runs under it (its later Commit or Cancel carries it); ``next_above``: an
        attempt ended with that order (a fallback Commit), so only the next attempt's epoch is
        raised to at least ``epoch``, never lowered. Returns False for a session not tracked.
        Call under the lock the engine's callers share."""
        slot = self._slot.get(session_id)
        sm = None if slot is None else self._sm[slot]
        if sm is None:
            return False
        sm.epoch = max(int(sm.epoch), int(epoch)) if next_above else int(epoch)
        return True

    def sessions_of(self, ue_id: str) -> list[SessionMigration]:
        """The state machines of ``ue_id``'s sessions (parked ones included, :meth:`parked`)."""
        return [self._sm[s] for s in self._ue_slots.get(ue_id, ())]  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self._slot)

    def ingest_telemetry(self, report, now: float | None = None) -> list[Action]:
        """Fold in a ``pallas_pb2.TelemetryReport`` from an agent.

        Rates and server state go to the store. Sessions the report's agent serves update
        their K; unknown ones are registered if the agent's model (s_kv, block size) is
        known, and planned at once with their UE's latest prediction (the inputs
        :meth:`set_predictions` last took for that UE; the control loop predicts a UE only at
        its next radio report, up to 1 s later on the drive logs); sessions their serving agent
        reports ``finished`` are removed (cancelling a running attempt).
        Reports about sessions the agent does not serve (say, the target of a preparation)
        only feed the rates of tracked sessions; an untracked session's rate is not kept. Memory reservations at the agent are kept (see :meth:`reserved_at`).
        The agent's epoch of a session it serves moves the session's next attempt past it
        (an agent that has seen epoch n answers any older one STALE_EPOCH: after an xApp
        restart, or a session first seen mid-life).
        """
        samples = self.telemetry.ingest(report, now)
        agent = report.agent_id
        model = self.telemetry.model_of(agent)
        actions: list[Action] = []
        new_ues: list[str] = []
        for s in samples:
            slot = self._slot.get(s.session_id)
            if s.state is SessionState.HANDED_OVER:      # passed on only with follow_moves
                if slot is not None and self.follow_moves:
                    self._follow_move(self._sm[slot], agent, s.state)  # type: ignore[arg-type]
                continue
            if s.state is SessionState.FINISHED:
                # Only the agent serving the session ends it: after a commit the old source
                # reports its stopped copy as finished while the new one decodes on. A parked
                # session is served by none this engine knows: any agent's word ends it.
                if slot is not None and (self._sm[slot].source == agent  # type: ignore[union-attr]
                                         or s.session_id in self._left):
                    actions += self.remove_session(s.session_id, "session finished")
                continue
            if slot is None:
                if model is None or model.kv_bytes_per_token <= 0 or model.block_size <= 0:
                    log.info("session_not_tracked", session=s.session_id, agent=agent,
                             reason="agent's model (s_kv, block size) unknown")
                    continue
                self.add_session(s.session_id, agent, ue_id=s.ue_id, s_kv=model.kv_bytes_per_token,
                                 block_size=model.block_size, now=s.time, tokens=s.tokens,
                                 remaining_tokens=s.remaining_tokens, model=model)
                new_ues.append(s.ue_id)
            elif self._sm[slot].source == agent:  # type: ignore[union-attr]
                self.update_session(s.session_id, s.tokens, s.time, s.remaining_tokens)
                if model is not None and self._model[slot] is None:
                    self._model[slot] = model
            sm = self._sm[self._slot[s.session_id]]
            if sm is not None and self.follow_moves:
                self._follow_move(sm, agent, s.state)
            if sm is not None and sm.source == agent and sm.state is not MigrationState.PREPARING \
                    and s.epoch >= sm.epoch:
                sm.epoch = s.epoch + 1
        for s in samples:   # rates of sessions not tracked (ended, or another agent's) are not kept
            if s.session_id not in self._slot:
                self.telemetry.forget_session(s.session_id)
        for ue in dict.fromkeys(new_ues):   # a new session: its UE's latest prediction at once
            p = self._ue_pred.get(ue)
            if p is not None:
                actions += self.set_predictions([ue], [p[0]], [p[1]], [p[2]], [p[3]],
                                                candidates=None if p[4] is None else [p[4]])
        return actions

    # -- predictions --------------------------------------------------------------------------
    def forget_ue(self, ue_id: str) -> None:
        """Drop what the engine keeps per UE beyond its sessions: the latest prediction (kept
        for the UE's next session), its ranked candidates and its return rule. The xApp calls
        it when it forgets the UE (gone silent, or pushed out of its capped UE table), so that
        UEs that vanish without a release notice leave nothing here. Sessions are untouched:
        they end with their agents' reports. An unknown UE is a no-op."""
        self._ue_pred.pop(ue_id, None)
        self._cands.pop(ue_id, None)
        self._returns.pop(ue_id, None)

    def set_prediction(self, ue_id: str, target: str | None, t_ho: float | None,
                       confidence: float = 1.0, proactive: bool = True) -> list[Action]:
        """The predictor's latest (target agent, t_HO, confidence) for ``ue_id``.

        ``target`` None (or a confidence below ``min_confidence``) withdraws it;
        ``proactive`` False (the A1 / descriptor rules forbid it for this source, target or
        slice) keeps the plan but never triggers, so the HO takes the fallback. Returns the
        actions a target change causes at once (cancelling a running attempt).
        """
        return self.set_predictions([ue_id], [target], [np.nan if t_ho is None else t_ho],
                                    [confidence], [proactive])

    def set_predictions(self, ue_ids: Sequence[str], targets: Sequence[str | None],
                        t_ho: Sequence[float] | np.ndarray, confidence: Sequence[float] | np.ndarray | None = None,
                        proactive: Sequence[bool] | np.ndarray | None = None,
                        candidates: Sequence[Sequence[tuple[str, float]] | None] | None = None) -> list[Action]:
        """Batch form of :meth:`set_prediction`: equal-length sequences, one entry per UE.

        Unknown UEs are ignored. Only sessions whose target changes go through their state
        machine; the others get their t_HO updated in place.

        ``candidates``: per UE, the predictor's ranked candidate targets as (agent id,
        calibrated probability) pairs, best first (the cells mapped to their agents; None or
        empty: none). They are kept only while ``targets_k`` > 1, for the extra targets of
        step 5 of the cycle (module docstring); None for the whole argument forgets those of
        the UEs named. An agent named twice keeps the sum of its probabilities; a UE's
        probabilities summing above 1 are scaled to sum to 1. Raises ValueError for a
        probability outside [0, 1] or a length unlike ``ue_ids``'s.
        """
        n = len(ue_ids)
        t_ho = np.asarray(t_ho, dtype=np.float64)
        conf = np.ones(n) if confidence is None else np.asarray(confidence, dtype=np.float64)
        allow = np.ones(n, bool) if proactive is None else np.asarray(proactive, dtype=bool)
        if not (len(targets) == t_ho.size == conf.size == allow.size == n):
            raise ValueError("set_predictions: sequences of different lengths")
        usable = (conf >= self.min_confidence) & np.isfinite(t_ho)
        if candidates is not None and len(candidates) != n:
            raise ValueError("set_predictions: candidates of a different length than ue_ids")
        # kept for the UE's next session (ingest_telemetry): one dict update at C speed, then
        # the withdrawn ones dropped (benchmarks/scheduler.py "predict", 10,000 UEs: 2.5 ms a
        # call against 3.9 with a per-UE loop indexing the arrays)
        pred = self._ue_pred
        pred.update(zip(ue_ids, zip(targets, t_ho.tolist(), conf.tolist(), allow.tolist(),
                                    candidates if candidates is not None else (None,) * n)))
        if None in targets:                                  # the last entry of a UE wins
            for u, tgt in zip(ue_ids, targets):
                if tgt is None and u in pred and pred[u][0] is None:
                    del pred[u]
        self._set_candidates(ue_ids, candidates, usable, targets)
        actions: list[Action] = []
        agent_idx = self._agent_idx
        for tgt in set(targets) - agent_idx.keys():          # first sight of an agent
            if tgt is not None:
                self._agent(tgt)
        first = self._ue_first
        slots = np.array([first.get(u, -1) for u in ue_ids], dtype=np.int64)
        tidx = np.array([agent_idx.get(t, -1) for t in targets], dtype=np.int64)  # None -> -1
        tidx[~usable] = -1
        ue_row = np.arange(n)                                # each row's index in ue_ids
        if self._ue_multi:                                   # UEs with several sessions
            extra = [(i, s) for i, u in enumerate(ue_ids) for s in self._ue_multi.get(u, ())]
            if extra:
                rows = np.array([e[0] for e in extra])
                ue_row = np.concatenate([ue_row, rows])
                slots = np.concatenate([slots, [e[1] for e in extra]])
                tidx = np.concatenate([tidx, tidx[rows]])
                t_ho = np.concatenate([t_ho, t_ho[rows]])
                allow = np.concatenate([allow, allow[rows]])
        known = slots >= 0
        if self._ue_multi and len(slots) > n:
            conf = np.concatenate([conf, conf[rows]])
        slots, tidx, t_ho, allow, conf = slots[known], tidx[known], t_ho[known], allow[known], conf[known]
        ue_row = ue_row[known]
        self._allowed[slots] = allow
        self._conf[slots] = conf
        for k in np.flatnonzero(~allow & self._preparing[slots]):   # a rule now forbids it
            actions += self._sm[int(slots[k])].withdraw(  # type: ignore[union-attr]
                "proactive migration not allowed (proactive rules)")
        own = (tidx >= 0) & (tidx == self._source[slots])
        tidx[own] = -1                                       # intra-agent HO: nothing to move
        self._own_rank0[slots] = False
        if self._cands and own.any():                        # K > 1: the next candidate instead
            self._next_after_own(np.flatnonzero(own), slots, tidx, conf, [ue_ids[i] for i in ue_row.tolist()])
        diff = tidx != self._target[slots]                   # the machine's target changes
        keep = ~diff & (tidx >= 0)
        self._t_ho[slots[keep]] = t_ho[keep]
        for k in np.flatnonzero(keep & self._preparing[slots]):   # few: HO within ~T_max
            self._sm[int(slots[k])].predict(self._agents[tidx[k]], float(t_ho[k]))  # type: ignore[union-attr]
        for k in np.flatnonzero(diff):
            slot = int(slots[k])
            sm = self._sm[slot]
            target = None if tidx[k] < 0 else self._agents[tidx[k]]
            acts = sm.predict(target, None if target is None else float(t_ho[k]))  # type: ignore[union-attr]
            if sm.target is not None:                                               # type: ignore[union-attr]
                self._t_ho[slot] = t_ho[k]
                self._target[slot] = self._agent(sm.target)  # type: ignore[union-attr]  # an extra made primary
            actions += acts
        self._count(actions)
        return actions

    def _next_after_own(self, rows: np.ndarray, slots: np.ndarray, tidx: np.ndarray, conf: np.ndarray,
                        row_ue: list[str]) -> None:
        """K > 1, the rows ``rows`` whose predicted target is their session's own agent (a
        handover there moves nothing): the machine's target becomes the UE's most likely
        candidate on another agent (``tidx`` and ``_conf`` of the row set to it, in place), and
        the own agent counts as one of the K targets (``_own_rank0``), as the top-K candidates
        name it; t_HO stays the prediction's. Not where the own agent's p (``conf``) is at
        least ``targets_split`` (a confident prediction keeps its single target, here the
        free one) or where that candidate's p is below ``targets_p_floor``."""
        cfg = self.cfg
        for k in rows.tolist():
            if conf[k] >= cfg.targets_split:
                continue
            slot = int(slots[k])
            src = self._agents[int(self._source[slot])]
            best = next(((a, p) for a, p in self._cands.get(row_ue[k], ()) if a != src), None)
            if best is None or best[1] < cfg.targets_p_floor:
                continue
            tidx[k] = self._agent(best[0])
            self._conf[slot] = best[1]
            self._own_rank0[slot] = True

    def _set_candidates(self, ue_ids: Sequence[str], candidates, usable: np.ndarray,
                        targets: Sequence[str | None]) -> None:
        """Keep (K > 1) or forget the UEs' ranked candidates (see :meth:`set_predictions`); a
        single candidate is kept only where it is not the UE's predicted target."""
        if candidates is None or self.cfg.targets_k <= 1:
            if self._cands:
                for u in ue_ids:
                    self._cands.pop(u, None)
            return
        if len(candidates) != len(ue_ids):
            raise ValueError("set_predictions: candidates of a different length than ue_ids")
        for u, ok, cs, tgt in zip(ue_ids, usable.tolist(), candidates, targets):
            merged: dict[str, float] = {}
            for agent, p in (cs or ()) if ok else ():
                p = float(p)
                if not 0.0 <= p <= 1.0:
                    raise ValueError(f"UE {u}: candidate {agent!r} probability {p!r} outside [0, 1]")
                if agent is not None and p > 0.0:
                    merged[agent] = merged.get(agent, 0.0) + p
            total = sum(merged.values())
            if total > 1.0:
                merged = {a: p / total for a, p in merged.items()}
            if len(merged) > 1 or (merged and tgt not in merged):
                self._cands[u] = tuple(sorted(merged.items(), key=lambda ap: -ap[1]))
            else:
                self._cands.pop(u, None)      # none, or the primary alone

    # -- the cycle ----------------------------------------------------------------------------
    def cycle(self, now: float) -> list[Action]:
        """One control cycle at ``now``: decide for every PLANNED session; trigger where due.

        Returns the TriggerActions (in slot order). Cost: Python work only for sessions that
        trigger; everything else is array arithmetic (module docstring).
        """
        t0 = time.perf_counter()
        actions: list[Action] = []
        self._expire_reservations(now)
        if self._returns:
            self._returns_due(now)
        if self.proactive and self._n:
            n = self._n
            ahead = now + self.ho_timing.margin_s       # plan for the HO coming M early
            cand = np.flatnonzero(self._planned[:n] & self._allowed[:n]
                                  & (self._t_ho[:n] - ahead <= self._horizon))
            if self._left and cand.size:                      # parked: not triggered
                cand = np.array([c for c in cand.tolist() if self._sm[c].session_id not in self._left],  # type: ignore[union-attr]
                                dtype=np.int64)
            if cand.size:
                actions = self._decide(cand, now, ahead)
            if self.cfg.targets_k > 1:
                actions += self._extend(now, ahead)
        CYCLE_SECONDS.observe(time.perf_counter() - t0)
        self._count(actions)
        return actions

    def _returns_due(self, now: float) -> None:
        """K > 1, the return rule (docs/model.md §4.1): within ``targets_return_s`` of a UE's
        handover, a PLANNED session of that UE whose target is the agent the UE left is due at
        once (its t_HO brought to ``now`` at the latest, so Eq. 9 fires this cycle with the
        window T_remain_hat allows): a ping-pong back, which the predictor names with a dwell
        time still far off, meets a prepared target. Entries past their time are forgotten."""
        for ue, (agent, until) in list(self._returns.items()):
            if now > until:
                del self._returns[ue]
                continue
            for slot in self._ue_slots.get(ue, ()):
                if self._planned[slot] and self._target[slot] == agent and self._source[slot] != agent:
                    self._t_ho[slot] = min(self._t_ho[slot], now)

    def _decide(self, cand: np.ndarray, now: float, ahead: float) -> list[Action]:
        """Eq. 9 and admission for the candidate slots ``cand`` at ``now``; T_remain_hat is
        t_HO_hat - ``ahead`` (``ahead`` = now + the timing margin, s)."""
        r_d = self.telemetry.decode.read(self._decode_slot[cand], now)
        age = np.maximum(now - self._tokens_time[cand], 0.0)
        grown = np.minimum(r_d * age, self._remaining[cand])
        k_curr = self._tokens[cand] + grown
        left = self._remaining[cand] - grown                  # tokens still to generate now
        t_remain = self._t_ho[cand] - ahead
        alive_at_ho = left > r_d * np.maximum(t_remain, 0.0)  # still generating at the HO
        if not alive_at_ho.all():
            cand, r_d, k_curr, t_remain = (cand[alive_at_ho], r_d[alive_at_ho],
                                           k_curr[alive_at_ho], t_remain[alive_at_ho])
            if cand.size == 0:
                return []
        src, tgt = self._source[cand], self._target[cand]
        inputs = WindowInputs(
            k_curr=k_curr, t_remain=t_remain, block_size=self._block[cand],
            r_p=self.telemetry.prefill.read(self._prefill_slot[tgt], now), r_d=r_d,
            bandwidth=self.telemetry.goodput.read(self._pair_slot[src, tgt], now),
            s_kv=self._s_kv[cand], c_sync=self.cfg.c_sync_s)
        d = decide(inputs, self._params)
        if self.cfg.fixed_window_s is not None:
            d = fixed_window_decision(inputs, d, self.cfg.fixed_window_s, self._params)
        if self.cfg.warmup_cost_weight > 0 and d.trigger.any():
            # the expected-benefit rule (docs/model.md §4.2): a likely wasted warm-up waits
            fb = fallback_sit(d.k_ho, inputs.block_size, inputs.r_p, inputs.s_kv, inputs.bandwidth,
                              self.cfg.c_sync_s, self._reactive == pallas_pb2.SCHEME_RECOMPUTATION) + 1.0 / r_d
            worth = worth_preparing(self._conf[cand], fb, d.t_sit, d.l_hist, inputs.r_p,
                                    self.cfg.warmup_cost_weight)
            d = dataclasses.replace(d, trigger=d.trigger & worth)
        self.last_window[cand] = d.window
        actions: list[Action] = []
        for i in np.flatnonzero(d.trigger):
            slot = int(cand[i])
            sm = self._sm[slot]
            assert sm is not None and sm.target is not None
            server = self.telemetry.server(sm.target, now)
            reserved = self.reserved_at(sm.target, now)
            res = admit(self._model[slot], server, float(d.k_ho[i]), int(self._s_kv[slot]),
                        self.cfg.kv_headroom_fraction, reserved)
            if not res.admitted:
                ADMISSION_REFUSED.inc()
                if sm.last_reason != res.reason:
                    sm.last_reason = res.reason
                    log.info("trigger_deferred", session=sm.session_id, target=sm.target,
                             reason=res.reason)
                continue
            sm.t_ho = float(self._t_ho[slot])
            self._reserve(sm.session_id, sm.target, res.need_bytes, sm.t_ho + self.cfg.stale_age_s)
            actions.append(sm.trigger(now, float(d.window[i]), int(d.l_hist[i]),
                                      predicted_sit_s=float(d.t_sit[i]),
                                      predicted_early_s=float(d.t_early[i]),
                                      rates=DecidedRates(float(inputs.r_p[i]), float(inputs.r_d[i]),
                                                         float(inputs.bandwidth[i]), int(self._s_kv[slot]),
                                                         int(self._block[slot]))))
        return actions

    def _extend(self, now: float, ahead: float) -> list[Action]:
        """Step 5 of the cycle (module docstring): extra targets of the PREPARING sessions
        whose UE has candidates; ``ahead`` = now + the timing margin, s."""
        n = self._n
        slots = np.flatnonzero(self._preparing[:n] & self._allowed[:n])
        actions: list[Action] = []
        for slot in slots.tolist():
            sm = self._sm[slot]
            if sm is None or sm.session_id in self._left:   # parked: not extended
                continue
            k_max = self.cfg.targets_k - int(self._own_rank0[slot])   # the own agent is one
            cands = self._cands.get(sm.ue_id)
            if cands is None:                  # the primary alone is a candidate now
                actions += [sm.drop_extra(t, "left the target choice: one candidate left")
                            for t in sm.extras]
            elif len(sm.prepared) < k_max or sm.extras:
                actions += self._extend_one(slot, sm, cands, now, ahead, k_max)
        return actions

    def _extend_one(self, slot: int, sm: SessionMigration, cands: tuple[tuple[str, float], ...],
                    now: float, ahead: float, k_max: int) -> list[Action]:
        """The extra TriggerActions of one PREPARING session (docs/model.md §4.1, Eq. 11):
        :func:`choose_targets` over its UE's candidates (the source's agent left out), at most
        ``k_max`` targets in all (K, less one where the own agent was the top candidate), at the
        session's K_curr and T_remain_hat; a chosen target not yet prepared is triggered once
        its own window is reached and admission passes (memory for its level: S_kv(K_HO) for
        FULL, S_kv(L_hist) for PREFIX). A refusal defers that target alone; a target whose
        agent refused this epoch's Trigger (``SessionMigration.declined``) is not asked again.
        An extra target prepared before that the choice no longer names is dropped (a targeted
        CancelAction, :meth:`SessionMigration.drop_extra`), before any is added."""
        cands = tuple((a, p) for a, p in cands if a != sm.source)
        cfg = self.cfg
        if sm.t_ho is None:
            return []
        if not sm.extras and (not cands or cands[0][1] >= cfg.targets_split or not any(
                a not in sm.prepared and a not in sm.declined and p >= cfg.targets_p_floor
                for a, p in cands)):
            return []                          # nothing the choice could add (cheap test first)
        r_d = float(self.telemetry.decode.read(self._decode_slot[slot:slot + 1], now)[0])
        k_curr = self._tokens[slot] + min(r_d * max(now - self._tokens_time[slot], 0.0),
                                          self._remaining[slot])
        t_remain = sm.t_ho - ahead
        s_kv, block = int(self._s_kv[slot]), int(self._block[slot])
        rates = {a: (self.telemetry.prefill_rate(a, now),
                     self.telemetry.goodput_bytes_per_s(sm.source, a, now)) for a, _ in cands}
        knobs = {**self.cfg.target_choice(), "k_max": k_max}
        choice = choose_targets([Candidate(a, p, *rates[a]) for a, p in cands], k_curr=k_curr,
                                t_remain=t_remain, block_size=block, r_d=r_d, s_kv=s_kv,
                                c_sync=self.cfg.c_sync_s, **knobs)
        chosen = {plan.target for plan in choice.prepared}
        actions: list[Action] = [sm.drop_extra(t, "left the target choice")
                                 for t in sm.extras if t not in chosen]
        for plan in choice.prepared:
            if plan.target in sm.prepared or plan.target in sm.declined \
                    or len(sm.prepared) >= k_max:
                continue
            if plan.level is Level.PREFIX:
                if sm.scheme != pallas_pb2.SCHEME_PALLAS:
                    continue                   # no prefix-only form of this scheme
                scheme = pallas_pb2.SCHEME_NO_SM
            else:
                scheme = sm.scheme
            if t_remain > plan.window + self._params.trigger_lookahead + 1e-9:
                continue                       # its own window is not reached yet
            tokens = plan.costs.kv_bytes / s_kv
            res = admit(self._model[slot], self.telemetry.server(plan.target, now), tokens, s_kv,
                        self.cfg.kv_headroom_fraction, self.reserved_at(plan.target, now))
            if not res.admitted:
                ADMISSION_REFUSED.inc()
                log.info("extra_target_deferred", session=sm.session_id, target=plan.target,
                         rank=plan.rank, reason=res.reason)
                continue
            self._reserve(sm.session_id, plan.target, res.need_bytes, sm.t_ho + self.cfg.stale_age_s)
            r_p, bw = rates[plan.target]
            actions.append(sm.trigger_extra(plan.target, max(1, plan.rank), plan.window, int(plan.l_hist),
                                            scheme=scheme, predicted_sit_s=plan.sit,
                                            rates=DecidedRates(r_p, r_d, bw, s_kv, block)))
        return actions

    # -- handovers and replies ----------------------------------------------------------------
    def observe_ho_timing(self, predicted_t_ho: float, actual_t_ho: float) -> float | None:
        """A handover at ``actual_t_ho`` (s) whose latest prediction said ``predicted_t_ho``
        (s, the same clock; NaN: none): its error feeds the trigger margin from the next
        :meth:`cycle` on. Returns the error recorded, s, or None (no usable prediction)."""
        return self.ho_timing.observe(predicted_t_ho, actual_t_ho)

    def on_handover(self, ue_id: str, actual_target: str, now: float) -> list[Action]:
        """E2 shows ``ue_id`` now served by a cell of agent ``actual_target``.

        Each of the UE's sessions commits (prepared there) or falls back: the configured
        fallback if ``actual_target`` passes admission (model and memory), else Detour. A
        parked session (:meth:`parked`) is left as it is: no commit names a source that handed
        it over.
        """
        actions: list[Action] = []
        hold = self.cfg.targets_return_s if self.cfg.targets_k > 1 else 0.0
        for slot in list(self._ue_slots.get(ue_id, ())):
            sm = self._sm[slot]
            if sm is None:
                continue
            if hold > 0 and sm.source != actual_target:       # the agent left: due back at once
                self._returns[ue_id] = (self._agent(sm.source), now + hold)
            if sm.session_id in self._left:
                log.info("commit_skipped_parked", session=sm.session_id, ue=ue_id,
                         handed_over_by=self._left[sm.session_id], target=actual_target)
                continue
            r_d = float(self.telemetry.decode.read(self._decode_slot[slot:slot + 1], now)[0])
            k_now = self._tokens[slot] + min(r_d * max(now - self._tokens_time[slot], 0.0),
                                             self._remaining[slot])
            can_serve = admit(self._model[slot], self.telemetry.server(actual_target, now), k_now,
                              int(self._s_kv[slot]), self.cfg.kv_headroom_fraction,
                              self.reserved_at(actual_target, now)
                              - self._reserved_by(sm.session_id, actual_target)).admitted
            rates = DecidedRates(self.telemetry.prefill_rate(actual_target, now), r_d,
                                 self.telemetry.goodput_bytes_per_s(sm.source, actual_target, now),
                                 int(self._s_kv[slot]), int(self._block[slot]))
            actions += sm.handover(actual_target, now, can_serve, rates)
        self._count(actions)
        return actions

    def _reserved_by(self, session_id: str, target: str) -> int:
        r = self._reservations.get(session_id, {}).get(target)
        return r[0] if r is not None else 0

    def on_reply(self, action: Action, reply) -> list[Action]:
        """An agent's ``pallas_pb2.ControlReply`` to ``action``.

        Only STATUS_OK is success. A refused or failed trigger (STALE_EPOCH included: the
        agent has seen a newer attempt, so this one prepared nothing) cancels that attempt and
        frees its reservation (the HO then falls back); a refused extra target (rank > 0) is
        dropped alone, its reservation freed, the other targets kept. Replies to cancels are logged only. A
        commit's reply, whatever it says, frees the reservation at the target; a failed commit
        leaves the session at the commit's source (the agents keep serving from the source
        whatever happens to a migration), so the session is bound back to it.
        """
        ok = reply.status == pallas_pb2.STATUS_OK
        if isinstance(action, TriggerAction) and not ok:
            slot = self._slot.get(action.session_id)
            if slot is None:
                return []
            sm = self._sm[slot]
            acts = sm.refused(action.epoch, reply.message or  # type: ignore[union-attr]
                              pallas_pb2.Status.Name(reply.status), target=action.target)
            if action.epoch == sm.epoch and action.target not in sm.prepared:  # type: ignore[union-attr]
                self._release(action.session_id, action.target)
            self._count(acts)
            return acts
        if not ok:
            log.warning("control_call_failed", kind=type(action).__name__,
                        session=action.session_id, epoch=action.epoch,
                        status=pallas_pb2.Status.Name(reply.status), message=reply.message)
        if isinstance(action, CommitAction):
            self._release(action.session_id)
        if isinstance(action, CommitAction) and not ok:
            # The session did not move: it is still served by the commit's source.
            slot = self._slot.get(action.session_id)
            sm = self._sm[slot] if slot is not None else None
            if sm is not None and sm.source == action.actual_target:
                sm.source, sm.relay_hops = action.source, 0
        return []

    # -- metrics ------------------------------------------------------------------------------
    def _count(self, actions: Iterable[Action]) -> None:
        """Count the actions emitted (``pallas_scheduler_actions_total``; an extra target's
        Trigger and a targeted Cancel also in ``pallas_scheduler_extra_targets_total``); a
        cancel frees its session's reservations (a targeted one, that target's alone)."""
        for a in actions:
            if isinstance(a, TriggerAction):
                ACTIONS.labels("trigger", pallas_pb2.Scheme.Name(a.scheme)).inc()
                if a.rank > 0:
                    EXTRA_TARGETS.labels("prepared").inc()
            elif isinstance(a, CancelAction):
                self._release(a.session_id, a.target if a.only_target else None)
                ACTIONS.labels("cancel", "").inc()
                if a.only_target:
                    EXTRA_TARGETS.labels("dropped").inc()
            elif isinstance(a, CommitAction):
                ACTIONS.labels("commit", pallas_pb2.Scheme.Name(a.scheme)).inc()


def _horizon(cfg: SchedulerConfig, params: DecisionParams) -> float:
    """How far ahead of its predicted HO a session becomes a candidate, s: the largest window
    (T_max, or a longer fixed window) plus the trigger look-ahead."""
    return max(cfg.t_max_s, cfg.fixed_window_s or 0.0) + params.trigger_lookahead


def fixed_window_decision(inputs: WindowInputs, d: Decision, window_s: float, params: DecisionParams) -> Decision:
    """``d`` with its window forced to ``window_s`` (``SchedulerConfig.fixed_window_s``): every
    UE's window is min(T_w, max(T_remain_hat, 0)) s; SIT, T_early, J, T_ready and L_hist are
    Eqs. 4-8 at that window (``timing.evaluate_windows``, alpha of ``params``), K_HO and
    T_limit are unchanged; the trigger fires where T_remain_hat <= T_w + look-ahead. Shapes
    (n_ue,) as in ``d``. The fixed-window baseline of Figure 6 (paper section 6.3)."""
    w = np.minimum(float(window_s), np.maximum(inputs.t_remain, 0.0))
    c = evaluate_windows(inputs, w[:, None], params.alpha)
    return dataclasses.replace(
        d, window=w, index=np.full(w.shape, -1, np.int64), j=c.j[:, 0], t_sit=c.t_sit[:, 0],
        t_early=c.t_early[:, 0], t_ready=c.t_ready[:, 0], l_hist=c.l_hist[:, 0],
        trigger=inputs.t_remain <= float(window_s) + params.trigger_lookahead + 1e-9)
