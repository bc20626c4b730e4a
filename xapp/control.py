"""The control loop: what the xApp knows of each UE, the decision cycle, handovers, telemetry.

    E2 reports --> tracks --> predictor (per UE) --> Scheduler Engine <-- agents' telemetry
                                                         |
                                                     actions --> ActionDispatcher

Clocks: the predictor and the tracks run on the trace clock, the Scheduler Engine on the wall
clock (the agents' telemetry carries wall-clock times); t_HO is moved by ``offset``.

Memory is bounded by the UEs and sessions alive: a UE silent for ``ue_silent_s`` (trace clock)
is forgotten with its track and predictor state (checked once per ``FORGET_EVERY_S`` of the
trace clock, so at most that much late), at most ``max_ues`` are kept (the least
recently heard goes first), and a session's token count and pending replies go when the engine
drops the session.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np
import structlog

from pallas_common.schemes import SessionState
from pallas_proto import pallas_pb2 as pb
from xapp.config import XappConfig
from xapp.dispatch import ActionDispatcher
from xapp.ports import DecisionEngine, E2Ingest, EventSink, TrackPredictor
from xapp.tracks import MeasurementReport, TrackStore

__all__ = ["ControlLoop", "UEState"]

log = structlog.get_logger("pallas.xapp.control")

# Session states (pallas_common.schemes.SessionState, as the agent reports them) passed to the
# Scheduler Engine: those in which the reporting agent serves the session, and its end; a failed
# session is passed on as finished.
_PASS_STATES = frozenset({SessionState.NEW, SessionState.SERVING, SessionState.MIGRATING,
                          SessionState.COMMITTING, SessionState.RESUMED, SessionState.FINISHED})


@dataclass
class UEState:
    """What the xApp knows of one UE: its serving cell and since when, when it was last heard
    (trace clock), its S-NSSAI (``"SST"`` or ``"SST-SD"``; None while unknown), the handover
    time its latest prediction gave (trace clock, NaN: none), and the E2 node (RMR MEID) its
    latest report came from ("" when unknown: a view forwarded by another replica)."""

    ue_id: str
    serving_cell: int = -1
    since: float = float("nan")
    reported_target: int = -2
    last_heard: float = float("nan")
    snssai: str | None = None
    predicted_t_ho: float = float("nan")
    e2_node: str = ""
    #: the interval between its two latest reports here (s, trace clock; NaN: one so far)
    period: float = float("nan")


class ControlLoop:
    """Per-UE state, the decision cycle and the handover path (module docstring).

    ``config_of()`` returns the configuration in force (it changes under A1 and reloads);
    ``dispatcher`` sends the actions; ``tokens`` (session -> (K, wall time), shared with the
    dispatcher) is filled from telemetry. ``PENDING_HO_S``: how long a handover of a UE whose
    session the telemetry has not shown yet is held (it is committed, by the fallback, as soon
    as the session appears at its old agent).
    """

    PENDING_HO_S = 3.0
    #: how often (trace clock, s) the cycle looks for silent UEs and ended sessions
    #: (:meth:`forget_silent`); a UE silent for ``ue_silent_s`` goes at most this much late
    FORGET_EVERY_S = 1.0

    def __init__(self, config_of: Callable[[], XappConfig], tracks: TrackStore, ingest: E2Ingest,
                 predictor: TrackPredictor, engine: DecisionEngine, dispatcher: ActionDispatcher,
                 events: EventSink, lock: threading.RLock,
                 offset: float = 0.0, *, tokens: dict[str, tuple[int, float]] | None = None,
                 ue_silent_s: float = 60.0, max_ues: int = 100_000) -> None:
        self._config_of = config_of
        self.tracks, self.ingest, self.predictor, self.engine = tracks, ingest, predictor, engine
        self.dispatcher, self.events, self._lock, self.offset = dispatcher, events, lock, offset
        self.ue_silent_s, self.max_ues = ue_silent_s, max_ues
        self.ues: OrderedDict[str, UEState] = OrderedDict()      # least recently heard first
        self.tokens: dict[str, tuple[int, float]] = {} if tokens is None else tokens  # session -> (K, wall t)
        self._pending_ho: dict[str, tuple[int, int, float]] = {}
        self._tracks_lock = threading.Lock()     # the ingest thread writes the tracks, the cycle reads
        self.cycles = 0
        self._forgot_at = -float("inf")          # trace time of the cycle's last forget_silent
        self.cycling = False                     # a control cycle runs (the receive loop defers to it)
        #: a replica of a scale-out (docs/scale-out.md §3): the first report of a UE whose
        #: session another cell's agent serves is a handover seen from its new cell's E2 node
        self.arrivals = False
        #: the replica's :class:`xapp.cluster.arrivals.ArrivalRelay`: an arrival whose session
        #: records another live replica owns is forwarded to it, not committed here (§3 rule 6)
        self.relay = None

    @property
    def config(self) -> XappConfig:
        return self._config_of()

    def now(self) -> float:
        """The trace clock now (live: wall clock)."""
        return time.time() - self.offset

    # -- indications --------------------------------------------------------------------------
    def on_indication(self, payload: bytes, e2_node: str = "", t: float | None = None, sub_id: int = -1) -> None:
        """Ingest one RIC_INDICATION; a change of serving cell commits at once."""
        with self._tracks_lock:
            reports = self.ingest.on_indication(payload, e2_node, t, sub_id)
        for r in reports:
            try:
                self.predictor.observe(r)
            except Exception as e:
                log.error("predictor observe failed", error=repr(e))
            self.on_report(r)

    def on_report(self, r: MeasurementReport) -> None:
        """One UE's report: its state is refreshed; a new serving cell is the handover. A
        replica of a scale-out (:attr:`arrivals`) takes the report of a UE that was away from
        its E2 nodes (:meth:`away`) as the UE's first report here: its view was stale."""
        snssai = getattr(r, "snssai", None)
        with self._lock:
            ue = self.ues.get(r.ue_id)
            if ue is not None and self.arrivals and self.away(ue, r.time):
                snssai = snssai or ue.snssai
                self.events.write("ue_returned", ue=r.ue_id, trace_t=r.time, to_cell=r.serving_cell,
                                  last_heard=ue.last_heard, last_cell=ue.serving_cell)
                del self.ues[r.ue_id]
                ue = None
            if ue is None:
                self.ues[r.ue_id] = UEState(r.ue_id, r.serving_cell, r.time, last_heard=r.time, snssai=snssai,
                                            e2_node=r.e2_node)
                self._bound()
                arrived = self.arrivals and self._arrived(r.ue_id, r.serving_cell)
                if not arrived:
                    return
        if ue is None:
            self.events.write("arrival", ue=r.ue_id, trace_t=r.time, to_cell=r.serving_cell)
            if self.relay is not None:
                with self._lock:
                    sids = [sm.session_id for sm in self.engine.sessions_of(r.ue_id)]
                owner = self.relay.forward(r.ue_id, sids, r.serving_cell, r.time)
                if owner is not None:
                    self.events.write("arrival_forwarded", ue=r.ue_id, trace_t=r.time,
                                      to_cell=r.serving_cell, owner=owner, sessions=sids)
                    return
            self.on_handover(r.ue_id, -1, r.serving_cell, r.time)
            return
        with self._lock:
            self.ues.move_to_end(r.ue_id)
            if r.time > ue.last_heard:
                ue.period = r.time - ue.last_heard
            ue.last_heard = r.time
            if r.serving_cell >= 0:
                ue.e2_node = r.e2_node
            if snssai:
                ue.snssai = snssai
            if r.serving_cell < 0 or r.serving_cell == ue.serving_cell:
                return
            old, predicted, error = self._moved(ue, r.serving_cell, r.time)
        self.events.write("handover", ue=r.ue_id, trace_t=r.time, from_cell=old, to_cell=r.serving_cell,
                          predicted_t_ho=None if error is None else predicted, timing_error_s=error,
                          margin_s=self.engine.ho_timing.margin_s)
        self.on_handover(r.ue_id, old, r.serving_cell, r.time)

    #: a UE is away from a replica's E2 nodes when a report comes this many of its report
    #: intervals after the one before, and at least :attr:`AWAY_MIN_S` (trace clock, s)
    AWAY_PERIODS = 3.0
    AWAY_MIN_S = 1.0

    def away(self, ue: UEState, t: float) -> bool:
        """Whether a report of ``ue`` at trace time ``t`` comes after the UE was away from this
        replica's E2 nodes: more than ``max(AWAY_MIN_S, AWAY_PERIODS x its report interval)``
        (an interval not known yet: 1 s) after its last report here. With several replicas
        (docs/scale-out.md §3 item 0) a replica hears a UE only from the nodes it owns: a UE
        that went to another replica's node and came back looks, without this, as if it had
        never left (its old cell, its old sessions' places)."""
        period = ue.period if ue.period == ue.period else 1.0
        return t - ue.last_heard > max(self.AWAY_MIN_S, self.AWAY_PERIODS * period)

    def _moved(self, ue: UEState, cell: int, t: float) -> tuple[int, float, float | None]:
        """``ue`` is served by ``cell`` from trace time ``t`` (under the engine lock): returns
        (the cell it left, the handover time last predicted (NaN: none), the prediction's
        timing error fed to the engine's margin (None: none))."""
        old, ue.serving_cell, ue.since = ue.serving_cell, cell, t
        predicted, ue.predicted_t_ho = ue.predicted_t_ho, float("nan")
        return old, predicted, self.engine.observe_ho_timing(predicted, t)

    def on_forwarded(self, ue_id: str, cell: int, t: float, sender: str) -> bool:
        """A UE's arrival at ``cell`` (report time ``t``, trace clock), forwarded by ``sender``,
        the owner of that cell's E2 node, because this replica owns the UE's session records
        (docs/scale-out.md §3 rule 6): the handover as if this replica had seen it (its
        prediction's timing error observed, then each session committed, prepared or by the
        fallback, under this replica's epochs). The UE's view here moves to ``cell`` at ``t``,
        so the records are written from that report. Ignored (False) when this replica heard
        the UE after ``t`` (it came back: the forward is stale) or already sees it on ``cell``."""
        with self._lock:
            ue = self.ues.get(ue_id)
            if ue is not None and (ue.last_heard > t or ue.serving_cell == cell):
                stale = True
            else:
                stale = False
                if ue is None:
                    ue = self.ues[ue_id] = UEState(ue_id, -1, t, last_heard=t)
                    self._bound()
                ue.last_heard, ue.e2_node = t, ""    # the new cell's node is the sender's
                old, predicted, error = self._moved(ue, cell, t)
        if stale:
            self.events.write("arrival_stale", ue=ue_id, trace_t=t, to_cell=cell, sender=sender)
            return False
        self.events.write("handover", ue=ue_id, trace_t=t, from_cell=old, to_cell=cell,
                          predicted_t_ho=None if error is None else predicted, timing_error_s=error,
                          margin_s=self.engine.ho_timing.margin_s, forwarded_by=sender)
        self.on_handover(ue_id, old, cell, t)
        return True

    def on_unanswered(self, ue_id: str, cell: int, t: float) -> None:
        """An arrival this replica forwarded and that the records' owner did not decide in
        time (it died, or its lease went): decided here, the take-over of docs/scale-out.md §3
        (a fallback commit under a new generation)."""
        self.events.write("arrival_unanswered", ue=ue_id, trace_t=t, to_cell=cell)
        self.on_handover(ue_id, -1, cell, t)

    def _parked(self, ue_id: str) -> list[str]:
        """The UE's sessions the engine holds parked (``SchedulerEngine.parked``: handed over
        by another replica's commit, served where no agent has said yet; under the engine
        lock). Always empty for one xApp."""
        parked = getattr(self.engine, "parked", None)
        if parked is None:
            return []
        return [sm.session_id for sm in self.engine.sessions_of(ue_id) if parked(sm.session_id)]

    def _arrived(self, ue_id: str, cell: int) -> bool:
        """Whether a UE first heard on ``cell`` has arrived there by a handover this xApp did
        not see (under the engine lock): one of its sessions is served by an agent other than
        the cell's. Asked only with :attr:`arrivals` (a replica of a scale-out: the handover's
        first report comes from the new cell's E2 node, which another replica may own)."""
        if cell < 0:
            return False
        ep = self.config.agent_for_cell(cell)
        return ep is not None and any(sm.source != ep.agent_id for sm in self.engine.sessions_of(ue_id))

    def note_slice(self, ue_id: str, snssai: str | None) -> None:
        """The UE's S-NSSAI (from whatever source knows it); per-slice proactive rules apply to
        it from the next cycle. Unknown UEs are ignored."""
        with self._lock:
            ue = self.ues.get(ue_id)
            if ue is not None:
                ue.snssai = snssai

    # -- forgetting ---------------------------------------------------------------------------
    def _bound(self) -> None:
        while len(self.ues) > self.max_ues:
            self._forget_ue(next(iter(self.ues)))

    def _forget_ue(self, ue_id: str) -> None:
        """Free what the xApp holds for a UE: its record, track slot and predictor state
        (lock order: the engine lock, then the tracks lock)."""
        self.ues.pop(ue_id, None)
        self._pending_ho.pop(ue_id, None)
        self.engine.forget_ue(ue_id)
        forget = getattr(self.predictor, "forget", None)
        with self._tracks_lock:
            self.tracks.release(ue_id)
            if forget is not None:
                forget(ue_id)

    def ue_left(self, ue_id: str) -> None:
        """A UE left (a release or handover-out notice from the E2 node): its track, predictor
        state and UE record are freed, and its prediction withdrawn (a trigger in flight is
        cancelled by the engine)."""
        with self._lock:
            self._forget_ue(ue_id)
            actions = self.engine.set_predictions([ue_id], [None], [float("nan")], [0.0], [False])
        self.dispatcher.send(actions)

    def forget_silent(self, now_trace: float) -> int:
        """Forget UEs not heard for ``ue_silent_s`` and the token counts of sessions the engine
        no longer tracks; returns how many UEs went."""
        with self._lock:
            gone = []
            for ue_id, ue in self.ues.items():       # least recently heard first
                if not now_trace - ue.last_heard > self.ue_silent_s:
                    break
                gone.append(ue_id)
            for ue_id in gone:
                self._forget_ue(ue_id)
            ended = [s for s in self.tokens if not self._tracked(s)]
            for s in ended:
                del self.tokens[s]
            ended += [s for s in self.dispatcher.pending if not self._tracked(s) and s not in ended]
        for s in ended:
            self.dispatcher.forget_session(s)
        return len(gone)

    def _tracked(self, session_id: str) -> bool:
        try:
            self.engine.session(session_id)
            return True
        except KeyError:
            return False

    # -- telemetry ----------------------------------------------------------------------------
    def on_telemetry(self, agent_id: str, rep: pb.TelemetryReport) -> None:
        """An agent's TelemetryReport: rates, server state and the sessions it serves go to the
        Scheduler Engine (sessions the agent only prepares or handed over are left out; a
        failed one is passed on as finished); a session tracked for the first time is bound to
        the agent in the journal."""
        states = [SessionState.of(s.state) for s in rep.sessions]
        # a replica of a scale-out learns from a handed-over copy that another replica moved
        # the session (SchedulerEngine.follow_moves)
        passing = _PASS_STATES | ({SessionState.HANDED_OVER}
                                  if getattr(self.engine, "follow_moves", False) else set())
        if any(st not in passing for st in states):
            r2 = pb.TelemetryReport()
            r2.CopyFrom(rep)
            del r2.sessions[:]
            for s, st in zip(rep.sessions, states):
                if st in passing or st is SessionState.FAILED:
                    x = r2.sessions.add()
                    x.CopyFrom(s)
                    if st is SessionState.FAILED:
                        x.state = SessionState.FINISHED.value
            rep = r2
        with self._lock:
            finished = [s for s in rep.sessions if SessionState.of(s.state) is SessionState.FINISHED]
            finishing = [s.session_id for s in finished if self._tracked(s.session_id)]
            for s in rep.sessions:
                if SessionState.of(s.state) is not SessionState.FINISHED:
                    self.tokens[s.session_id] = (int(s.tokens), float(rep.time or time.time()))
            fresh = [s for s in rep.sessions
                     if SessionState.of(s.state) is not SessionState.FINISHED and not self._tracked(s.session_id)]
            actions = self.engine.ingest_telemetry(rep, time.time())
            opened = [(s.session_id, s.ue_id) for s in fresh if self._tracked(s.session_id)]
            ended = [sid for sid in finishing if not self._tracked(sid)]
            for sid in ended:
                self.tokens.pop(sid, None)
            late = [(ue, ho) for ue, ho in self._pending_ho.items()
                    if self.engine.sessions_of(ue) and not self._parked(ue)]
            for ue, _ in late:
                del self._pending_ho[ue]
            stale = [ue for ue, ho in self._pending_ho.items() if self.now() - ho[2] > self.PENDING_HO_S]
            for ue in stale:
                del self._pending_ho[ue]
        for sid, ue_id in opened:
            self.dispatcher.opened(sid, rep.agent_id, ue_id)
        self.dispatcher.send(actions)
        for s in ended:
            self.dispatcher.forget_session(s)
        for ue, (f, t, t_ho) in late:
            self.events.write("late_session", ue=ue, trace_t=self.now(), handover_t=t_ho)
            self.on_handover(ue, f, t, t_ho)

    # -- the cycle ----------------------------------------------------------------------------
    def control_cycle(self) -> int:
        """One decision cycle: predictions, then the engine's vectorised decision; returns the
        number of actions sent.

        Tracks silent beyond the store's ``silence_s`` are freed and their predictions withdrawn.
        UEs silent for ``ue_silent_s`` and the token counts of ended sessions are forgotten
        (:meth:`forget_silent`) once per ``FORGET_EVERY_S`` of the trace clock (and whenever the
        clock went back), not every cycle: it walks every session's token count.
        A batch predictor (one with ``update(store)``, :class:`HandoverPredictor`) predicts only
        for the UEs with new reports since the last cycle, in one array pass; a per-UE predictor
        (``predict(track, now)``) is asked for every tracked UE. The proactive rules of the
        configuration in force are consulted per UE, with its slice where known
        (``UEState.snssai``; an unknown slice is judged by the cell rules and the default)."""
        self.cycling = True
        try:
            return self._cycle()
        finally:
            self.cycling = False

    def _cycle(self) -> int:
        now_trace, now_wall = self.now(), time.time()
        self.cycles += 1
        if not 0.0 <= now_trace - self._forgot_at < self.FORGET_EVERY_S:
            self._forgot_at = now_trace
            self.forget_silent(now_trace)
        cfg = self.config
        with self._tracks_lock:
            gone = self.tracks.expire(now_trace)
        with self._lock:
            for ue_id in gone:
                self._forget_ue(ue_id)
        ue_ids, targets, t_ho, conf, allow, cands = self._decisions(now_trace, cfg)
        if gone:
            ue_ids = gone + ue_ids
            targets = [None] * len(gone) + targets
            t_ho = np.concatenate([np.full(len(gone), np.nan), t_ho])
            conf = np.concatenate([np.zeros(len(gone)), conf])
            allow = [False] * len(gone) + allow
            if cands is not None:
                cands = [None] * len(gone) + cands
        with self._lock:
            actions = (self.engine.set_predictions(ue_ids, targets, t_ho, conf, allow, candidates=cands)
                       if ue_ids else [])
            actions += self.engine.cycle(now_wall)
        self.dispatcher.send(actions)
        return len(actions)

    def _decisions(self, now_trace: float, cfg: XappConfig) -> tuple[list[str], list[str | None], np.ndarray,
                                                                     np.ndarray, list[bool], list | None]:
        """The engine's inputs for the UEs decided on this cycle: (UE ids, target agent or None,
        t_HO on the wall clock (NaN: none), confidence, proactive allowed, candidates), one
        entry per UE. Candidates (issue 45) only while the engine prepares more than one target
        (``targets_k`` > 1; else None): per UE, the predictor's ranked (agent, calibrated p),
        each cell mapped to its agent, leaving out cells without an agent, the serving cell's
        agent and cells the proactive rules forbid (None for a UE without a usable prediction).

        A batch predictor's output stays in arrays (``xapp.predict.combined.Predictions``); the
        Python per UE is a dictionary lookup or two: the cell -> agent map is read once per
        distinct target cell, the proactive rules once per distinct (serving cell, target cell,
        slice) of the cycle, and a ``prediction`` event (a Prediction object) is made only for a
        UE whose reported target changed. A UE the loop no longer knows is left out."""
        rows = self._predictions(now_trace)
        if rows is None:
            return [], [], np.zeros(0), np.zeros(0), [], None
        ids, has, cell, tho, cf, get_pred, cands_of = rows
        multi = self.engine.cfg.targets_k > 1
        cands: list | None = [] if multi else None
        tl = np.where(has, cell, -1).tolist()
        tho = np.where(has, tho, np.nan)
        fin = np.isfinite(tho).tolist()
        tho_list = tho.tolist()
        agent = {c: (cfg.agent_for_cell(c) if c >= 0 else None) for c in set(tl)}
        rules: dict[tuple[int, int, str | None], bool] = {}
        known = self.ues.get
        keep: list[int] = []
        targets: list[str | None] = []
        allow: list[bool] = []
        usable: list[bool] = []
        for i, (uid, c) in enumerate(zip(ids, tl)):
            ue = known(uid)
            if ue is None:
                continue
            ue.predicted_t_ho = tho_list[i]
            if c != ue.reported_target:
                ue.reported_target = c
                pred = get_pred(i)
                self.events.write("prediction", ue=uid, trace_t=now_trace, serving_cell=ue.serving_cell,
                                  target_cell=c, t_ho=pred.t_ho if pred else None,
                                  confidence=pred.confidence if pred else None,
                                  source=pred.source if pred else None)
            ep = agent[c]
            keep.append(i)
            if ep is None:
                targets.append(None)
                usable.append(False)
                allow.append(False)
                if cands is not None:
                    cands.append(None)
                continue
            ok = fin[i]
            targets.append(ep.agent_id if ok else None)
            usable.append(ok)
            key = (ue.serving_cell, c, ue.snssai)
            a = rules.get(key)
            if a is None:
                a = rules[key] = cfg.proactive.allows(*key)
            allow.append(a)
            if cands is not None:
                cands.append(self._candidates(ue, cands_of(i), cfg, rules) if ok and a else None)
        k = np.asarray(keep, dtype=np.int64)
        t = np.where(np.asarray(usable, dtype=bool), tho[k] + self.offset, np.nan) if keep else np.zeros(0)
        return [ids[i] for i in keep], targets, t, np.where(has, cf, 0.0)[k], allow, cands

    @staticmethod
    def _candidates(ue: UEState, ranked: tuple[tuple[int, float], ...], cfg: XappConfig,
                    rules: dict[tuple[int, int, str | None], bool]) -> list[tuple[str, float]]:
        """``ue``'s ranked (cell, p) candidates as (agent id, p), best first: cells without an
        agent, on the serving cell's agent, or forbidden by the proactive rules (``rules``
        caches them per (serving cell, target cell, slice)) left out."""
        serving = cfg.agent_for_cell(ue.serving_cell) if ue.serving_cell >= 0 else None
        out: list[tuple[str, float]] = []
        for c, p in ranked:
            ep = cfg.agent_for_cell(c)
            if ep is None or (serving is not None and ep.agent_id == serving.agent_id):
                continue
            key = (ue.serving_cell, c, ue.snssai)
            a = rules.get(key)
            if a is None:
                a = rules[key] = cfg.proactive.allows(*key)
            if a:
                out.append((ep.agent_id, p))
        return out

    def _predictions(self, now_trace: float) -> tuple | None:
        """The predictions of the UEs to decide on this cycle (see control_cycle) as arrays:
        (UE ids, has (U,) bool, target cell (U,), t_ho (U,) trace clock, confidence (U,),
        i -> Prediction or None, i -> ranked (cell, p) candidates (empty: none)), or None when
        the batch predictor failed.

        A batch predictor (``update(store)``) is asked for the UEs with new reports; a per-UE
        predictor (``predict(track, now)``) for every tracked UE."""
        update = getattr(self.predictor, "update", None)
        if update is not None:
            with self._tracks_lock:
                try:
                    res = update(self.tracks)
                except Exception as e:
                    log.error("prediction failed", error=repr(e))
                    return None
            cc, cp = getattr(res, "cand_cell", None), getattr(res, "cand_p", None)

            def cands_of(i: int) -> tuple[tuple[int, float], ...]:
                if cc is None or cp is None:
                    return ()
                return tuple((int(c), float(p)) for c, p in zip(cc[i].tolist(), cp[i].tolist()) if c >= 0)
            return (res.ue_ids, np.asarray(res.has, dtype=bool), np.asarray(res.cell), np.asarray(res.t_ho, float),
                    np.asarray(res.conf, float), res.get, cands_of)
        with self._lock:
            ues = list(self.ues.values())
        ids, preds = [], []
        for ue in ues:
            with self._tracks_lock:
                track = self.tracks.get(ue.ue_id)
                if track is None or not len(track):
                    continue
                try:
                    pred = self.predictor.predict(track, now_trace)
                except Exception as e:
                    log.error("prediction failed", ue=ue.ue_id, error=repr(e))
                    continue
            ids.append(ue.ue_id)
            preds.append(pred)
        has = np.array([p is not None for p in preds], dtype=bool)
        return (ids, has, np.array([p.target_cell if p is not None else -1 for p in preds], dtype=np.int64),
                np.array([p.t_ho if p is not None else np.nan for p in preds], dtype=float),
                np.array([p.confidence if p is not None else 0.0 for p in preds], dtype=float), preds.__getitem__,
                lambda i: preds[i].candidates if preds[i] is not None else ())

    def on_handover(self, ue_id: str, from_cell: int, to_cell: int, t: float) -> None:
        """The UE is on ``to_cell`` (first report from it, trace time ``t``): the engine commits
        each of its sessions to that cell's agent, prepared or by the fallback."""
        tgt = self.config.agent_for_cell(to_cell)
        with self._lock:
            sessions = self.engine.sessions_of(ue_id)
            if tgt is None or not sessions:
                self.events.write("commit_skipped", ue=ue_id, trace_t=t, from_cell=from_cell, to_cell=to_cell,
                                  reason="no agent at the new cell" if tgt is None else "no session in flight")
                if tgt is not None:
                    prev = self._pending_ho.get(ue_id)
                    self._pending_ho[ue_id] = (prev[0] if prev else from_cell, to_cell, t)
                return
            actions = self.engine.on_handover(ue_id, tgt.agent_id, t + self.offset)
            parked = self._parked(ue_id)
            if parked:      # committed when an agent reports them serving (the pending handover)
                prev = self._pending_ho.get(ue_id)
                self._pending_ho[ue_id] = (prev[0] if prev else from_cell, to_cell, t)
                self.events.write("commit_skipped", ue=ue_id, trace_t=t, from_cell=from_cell, to_cell=to_cell,
                                  reason="moved by another replica", sessions=parked)
        if not actions and not parked:
            self.events.write("commit_skipped", ue=ue_id, trace_t=t, from_cell=from_cell, to_cell=to_cell,
                              reason="same server")
        self.dispatcher.send(actions, ho=(ue_id, from_cell, to_cell, t))
