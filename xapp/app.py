"""The xApp's one composition root, for both of its modes.

    transport (RMR live | trace replay) --RIC_INDICATION--> E2 ingest --> TrackStore
        --> predictor (per UE with a session in flight) --> Scheduler Engine
            (telemetry from the agents' Telemetry streams: r_p, r_d, B, free KV, model identity)
        --> actions (trigger / cancel / commit) --> policy (gRPC Control calls to the agents)

Only the transport differs between the modes (:func:`build_app`):

- ``live``: ricxappframe's RMRXapp (``xapp.e2.transport.RmrTransport``: RIC_INDICATION 12050,
  A1_POLICY_REQ 20010 answered with A1_POLICY_RESP 20011 by return-to-sender, health checks
  answered by RMRXapp), E2 subscriptions created at start through the subscription manager's
  REST API (``xapp.e2.subscription``; one per E2 node of the configured agents), configuration
  from ``$CONFIG_FILE`` (reloaded when the file changes) and from A1 policy instances
  (``xapp.a1``).
- ``test``: the same xApp fed by ``xapp.e2.transport.TraceTransport``, which replays a recorded
  E2 trace at its recorded pace from a given wall-clock start (or as fast as possible).

Clocks: reports carry the trace's clock (the record time; live: receipt time). ``offset`` is
wall clock minus trace clock (0 live), so a predicted handover time is sent to the agents on
the wall clock they use.

Handover detection: the first report of a UE from a new serving cell is the handover (the UE is
on the new cell): the commit is sent at once from the ingest path, not at the next cycle.

Every decision and every policy outcome is written as one JSON line to an optional event log,
which the replay harness joins with what the UEs saw (``t`` wall clock, ``trace_t`` trace clock).
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import structlog

from pallas_common.contract import COMMIT_MOVED_FIELDS, commit_choice_of
from pallas_proto import pallas_pb2 as pb
from xapp.config import XappConfig
from xapp.policy import AgentEndpoint, CallOutcome, PolicyClient, TelemetryConsumer, scheme_name, scheme_value
from xapp.tracks import MeasurementReport, TrackStore

log = structlog.get_logger("pallas.xapp.app")

RIC_INDICATION = 12050
A1_POLICY_REQ = 20010
A1_POLICY_RESP = 20011

class EventLog:
    """Append-only JSON-lines log of the xApp's decisions (thread-safe). ``path`` None: events
    are only kept in memory (``events``)."""

    def __init__(self, path: str | Path | None = None, keep: bool = True) -> None:
        self._fh = open(path, "a", buffering=1) if path else None
        self._lock = threading.Lock()
        self.keep = keep
        self.events: list[dict] = []

    def write(self, kind: str, **fields: Any) -> None:
        rec: dict[str, Any] = {"t": time.time(), "kind": kind}
        for k, v in fields.items():
            if isinstance(v, (np.floating, np.integer)):
                v = v.item()
            rec[k] = None if isinstance(v, float) and not math.isfinite(v) else v
        with self._lock:
            if self.keep:
                self.events.append(rec)
            if self._fh:
                self._fh.write(json.dumps(rec) + "\n")

    def close(self) -> None:
        with self._lock:
            if self._fh:
                self._fh.close()
                self._fh = None


# Session states (agent/session.py SessionState values) passed to the Scheduler Engine: those in
# which the reporting agent serves the session, and its end.
_PASS_STATES = {"new", "serving", "migrating", "committing", "resumed", "finished"}


@dataclass
class UEState:
    """What the xApp knows of one UE: its serving cell and since when (trace clock)."""

    ue_id: str
    serving_cell: int = -1
    since: float = float("nan")
    reported_target: int = -2


class PallasXapp:
    """The xApp: ingest -> tracks -> predictor -> Scheduler Engine -> policies (module docstring).

    Args:
        config: the typed configuration (``xapp.config``).
        transport: an ``xapp.e2.transport`` Transport (live RMR or trace replay).
        policy: the gRPC client to the agents (built from ``config.agents`` when None).
        telemetry: a TelemetryConsumer (built from ``config.agents`` when None; ``False``: none).
        predictor: an object with ``observe(report)`` and ``predict(track, now)`` (default:
            ``xapp.predict.HandoverPredictor`` from ``config.predictor``).
        engine: an ``xapp.scheduler.SchedulerEngine`` (built from ``config.scheduler``).
        nrt: a neighbour relation table {PCI: NR cell identity} to seed the predictor with.
        events: the event log; ``offset``: wall clock minus trace clock (s).
        a1: an ``xapp.a1.A1PolicyHandler`` (live mode) or None.

    Clocks: the predictor and the tracks run on the trace clock, the Scheduler Engine on the
    wall clock (the agents' telemetry carries wall-clock times); t_HO is moved by ``offset``.

    A handover of a UE whose session the telemetry has not shown yet (opened less than a
    telemetry period before it) is held for ``PENDING_HO_S`` and committed (by the fallback)
    as soon as the session appears at its old agent.
    """

    PENDING_HO_S = 3.0

    def __init__(self, config: XappConfig, transport: Any, *, policy: PolicyClient | None = None,
                 telemetry: TelemetryConsumer | None | bool = None, predictor: Any = None, engine: Any = None,
                 nrt: Mapping[int, int] | None = None, events: EventLog | None = None, offset: float = 0.0,
                 a1: Any = None, ingest: Any = None) -> None:
        from xapp.e2.ingest import Ingestor

        self.config = config
        self.transport = transport
        self.events = events or EventLog(None)
        self.offset = offset
        self.a1 = a1
        self.tracks = TrackStore()
        self.ingest = ingest or Ingestor(self.tracks, self._ingest_config(config))
        self.predictor = predictor if predictor is not None else self._build_predictor(config, nrt)
        self.engine = engine if engine is not None else self._build_engine(config)
        endpoints = self._endpoints(config)
        self.policy = policy or PolicyClient(endpoints, on_reply=self._on_reply)
        if policy is not None and policy.on_reply is None:
            policy.on_reply = self._on_reply
        if telemetry is None:
            telemetry = TelemetryConsumer(endpoints, self._on_telemetry,
                                          period_ms=int(self.engine.cfg.control_period_s * 1000))
        self.telemetry = telemetry or None
        self.ues: dict[str, UEState] = {}
        self.tokens: dict[str, tuple[int, float]] = {}       # session -> (K, wall time) from telemetry
        self._actions: dict[tuple[str, str, int], Any] = {}  # (kind, session, epoch) -> action
        # Handovers of UEs whose session the telemetry has not shown yet (opened just before the
        # handover): ue -> (from cell, to cell, trace time); committed when the session appears.
        self._pending_ho: dict[str, tuple[int, int, float]] = {}
        self._lock = threading.RLock()
        from xapp.scheduler.gate import CommitGate
        self._gate: CommitGate = CommitGate()      # a session's calls wait for its commit in flight
        self._stop = threading.Event()
        self._cycle_thread: threading.Thread | None = None
        self._telemetry_started = False
        self.cycles = 0

    # ------------------------------------------------------------------ construction helpers
    @staticmethod
    def _endpoints(config: XappConfig) -> dict[str, AgentEndpoint]:
        return {aid: AgentEndpoint(aid, a.control_address, a.peer_address) for aid, a in config.agents.items()}

    @staticmethod
    def _ingest_config(config: XappConfig) -> Any:
        """E2 ingestion settings from ``controls.e2`` (RAN function -> service model, KPM names),
        the ingest's defaults where the configuration does not give them."""
        from xapp.e2.ingest import IngestConfig
        e2 = config.e2
        kw: dict[str, Any] = {}
        rf = getattr(e2, "ran_functions", None)
        if rf:
            kw["ran_functions"] = {int(k): v for k, v in dict(rf).items()}
        km = getattr(e2, "kpm_measurements", None)
        if isinstance(km, Mapping) and km:
            kw["kpm_measurements"] = dict(km)
        return IngestConfig(**kw)

    @staticmethod
    def _build_predictor(config: XappConfig, nrt: Mapping[int, int] | None) -> Any:
        """The handover predictor of the configuration; with ``association_map.path`` it
        starts from what it learns from those drive-test CSVs (ValueError if unusable)."""
        from xapp.predict import HandoverPredictor, PredictorConfig, knowledge_from_drives_at

        cfg = config.predictor
        if isinstance(cfg, Mapping):
            try:
                cfg = PredictorConfig.from_dict(dict(cfg))
            except ValueError as e:  # the descriptor's predictor section speaks another dialect
                log.warning("predictor config not understood, using defaults", error=str(e))
                cfg = PredictorConfig()
        knowledge = None
        if config.association_map_path:
            knowledge = knowledge_from_drives_at(config.association_map_path, cfg.cvh.tile_m,
                                                 cfg.history.smoothing, cfg.history.backoff_weight)
            log.info("association map learned", path=config.association_map_path,
                     tiles=len(knowledge.assoc))
        p = HandoverPredictor(cfg, knowledge=knowledge)
        for pci, cell in (nrt or {}).items():
            p.knowledge.nrt.add_serving(int(pci), int(cell))
        return p

    @staticmethod
    def _build_engine(config: XappConfig) -> Any:
        from xapp.scheduler import SchedulerConfig, SchedulerEngine

        sc = config.scheduler
        cfg = sc if isinstance(sc, SchedulerConfig) else SchedulerConfig.from_dict(dict(sc))
        return SchedulerEngine(cfg, scheme=scheme_value(config.scheme), fallback=scheme_value(config.fallback))

    # ------------------------------------------------------------------ clocks
    def now(self) -> float:
        """The trace clock now (live: wall clock)."""
        return time.time() - self.offset

    # ------------------------------------------------------------------ message path
    def on_message(self, msg: Any) -> None:
        """The transport callback (one thread). Never raises."""
        try:
            if msg.mtype == RIC_INDICATION:
                self.on_indication(msg.payload, msg.e2_node, msg.time if msg.time else None, msg.sub_id)
            elif msg.mtype == A1_POLICY_REQ and self.a1 is not None:
                reply = self.a1.handle(msg.payload)
                if reply:
                    self.transport.rts(msg, A1_POLICY_RESP, reply)
                self.reconfigure(self.a1.config)
            else:
                log.debug("message ignored", mtype=msg.mtype)
        except Exception as e:  # a bad message never stops the xApp
            log.error("message handling failed", mtype=getattr(msg, "mtype", None), error=repr(e))

    def on_indication(self, payload: bytes, e2_node: str = "", t: float | None = None, sub_id: int = -1) -> None:
        """Ingest one RIC_INDICATION; a change of serving cell commits at once."""
        reports = self.ingest.on_indication(payload, e2_node, t, sub_id)
        for r in reports:
            try:
                self.predictor.observe(r)
            except Exception as e:
                log.error("predictor observe failed", error=repr(e))
            self._on_report(r)

    def _on_report(self, r: MeasurementReport) -> None:
        with self._lock:
            ue = self.ues.get(r.ue_id)
            if ue is None:
                self.ues[r.ue_id] = UEState(r.ue_id, r.serving_cell, r.time)
                return
            if r.serving_cell < 0 or r.serving_cell == ue.serving_cell:
                return
            old, ue.serving_cell, ue.since = ue.serving_cell, r.serving_cell, r.time
        self.events.write("handover", ue=r.ue_id, trace_t=r.time, from_cell=old, to_cell=r.serving_cell)
        self.on_handover(r.ue_id, old, r.serving_cell, r.time)

    def warm_up(self, payload: bytes, e2_node: str = "") -> None:
        """Decode one indication without keeping it, so that the E2SM and NR RRC codecs are
        compiled and loaded before the first real message (their first use takes seconds on a
        busy machine, which would delay the first handovers' commits). Never raises."""
        from xapp.e2.ingest import decode_indication
        try:
            decode_indication(payload, e2_node, 0.0, self.ingest.config)
        except Exception as e:
            log.info("warm-up decode failed (harmless)", error=repr(e))

    # ------------------------------------------------------------------ telemetry
    def _on_telemetry(self, agent_id: str, rep: pb.TelemetryReport) -> None:
        """An agent's TelemetryReport: rates, server state and the sessions it serves go to the
        Scheduler Engine (sessions the agent only prepares or handed over are left out)."""
        keep = [s for s in rep.sessions if s.state in _PASS_STATES or s.state == "failed"]
        if len(keep) != len(rep.sessions):
            r2 = pb.TelemetryReport()
            r2.CopyFrom(rep)
            del r2.sessions[:]
            for s in keep:
                x = r2.sessions.add()
                x.CopyFrom(s)
                if s.state == "failed":
                    x.state = "finished"
            rep = r2
        with self._lock:
            for s in rep.sessions:
                self.tokens[s.session_id] = (int(s.tokens), float(rep.time or time.time()))
            actions = self.engine.ingest_telemetry(rep, time.time())
            late = [(ue, ho) for ue, ho in self._pending_ho.items() if self.engine.sessions_of(ue)]
            for ue, _ in late:
                del self._pending_ho[ue]
            stale = [ue for ue, ho in self._pending_ho.items() if self.now() - ho[2] > self.PENDING_HO_S]
            for ue in stale:
                del self._pending_ho[ue]
        self._send(actions)
        for ue, (f, t, t_ho) in late:
            self.events.write("late_session", ue=ue, trace_t=self.now(), handover_t=t_ho)
            self.on_handover(ue, f, t, t_ho)

    # ------------------------------------------------------------------ the control cycle
    def control_cycle(self) -> int:
        """One decision cycle: predictions for every UE, then the engine's vectorised decision;
        returns the number of actions sent."""
        now_trace, now_wall = self.now(), time.time()
        self.cycles += 1
        ue_ids, targets, t_ho, conf, allow = [], [], [], [], []
        with self._lock:
            ues = list(self.ues.values())
        for ue in ues:
            track = self.tracks.get(ue.ue_id)
            if track is None or not len(track):
                continue
            try:
                pred = self.predictor.predict(track, now_trace)
            except Exception as e:
                log.error("prediction failed", ue=ue.ue_id, error=repr(e))
                continue
            tgt_cell = pred.target_cell if pred is not None else -1
            if tgt_cell != ue.reported_target:
                ue.reported_target = tgt_cell
                self.events.write("prediction", ue=ue.ue_id, trace_t=now_trace, serving_cell=ue.serving_cell,
                                  target_cell=tgt_cell, t_ho=pred.t_ho if pred else None,
                                  confidence=pred.confidence if pred else None,
                                  source=pred.source if pred else None)
            ep = self.config.agent_for_cell(tgt_cell) if tgt_cell >= 0 else None
            ue_ids.append(ue.ue_id)
            targets.append(ep.agent_id if ep is not None and pred is not None and math.isfinite(pred.t_ho) else None)
            t_ho.append(pred.t_ho + self.offset if pred is not None and math.isfinite(pred.t_ho) else float("nan"))
            conf.append(pred.confidence if pred is not None else 0.0)
            allow.append(ep is not None and self.config.proactive.allows(ue.serving_cell, tgt_cell))
        with self._lock:
            actions = self.engine.set_predictions(ue_ids, targets, t_ho, conf, allow) if ue_ids else []
            actions += self.engine.cycle(now_wall)
        self._send(actions)
        return len(actions)

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
        if not actions:
            self.events.write("commit_skipped", ue=ue_id, trace_t=t, from_cell=from_cell, to_cell=to_cell,
                              reason="same server")
        self._send(actions, ho=(ue_id, from_cell, to_cell, t))

    # ------------------------------------------------------------------ actions -> policies
    def _t_early(self, a: Any, now: float) -> tuple[float, float]:
        """Eq. 6-7 at the chosen window for a trigger (model estimate): (T_SIT, T_early), s."""
        from pallas_common import timing
        try:
            sm = self.engine.session(a.session_id)
            tel = self.engine.telemetry
            k, t_k = self.tokens.get(a.session_id, (0, now))
            r_d = tel.decode_rate(a.session_id, now)
            ident = tel.model_of(a.source)
            x = timing.WindowInputs(k_curr=k + r_d * max(0.0, now - t_k), t_remain=max(0.0, a.predicted_handover_time - now),
                                    block_size=ident.block_size, r_p=tel.prefill_rate(a.target, now), r_d=r_d,
                                    bandwidth=tel.goodput_bytes_per_s(a.source, a.target, now),
                                    s_kv=ident.kv_bytes_per_token, c_sync=self.engine.cfg.c_sync_s)
            c = timing.evaluate_windows(x, np.array([a.window_s]), self.engine.cfg.alpha)
            del sm
            return float(c.t_sit[0, 0]), float(c.t_early[0, 0])
        except Exception:
            return float("nan"), float("nan")

    def _send(self, actions: list, ho: tuple | None = None) -> None:
        from xapp.scheduler import CancelAction, CommitAction, TriggerAction

        now = time.time()
        for a in actions:
            with self._lock:
                go = self._gate.admit(a, ho)
            if not go:
                self.events.write("held", call=type(a).__name__.replace("Action", "").lower(),
                                  session=a.session_id, epoch=a.epoch,
                                  behind_commit=self._gate.in_flight(a.session_id))
                continue
            try:
                if isinstance(a, TriggerAction):
                    t_sit, t_early = self._t_early(a, now)
                    sch = scheme_name(a.scheme)
                    ident = self.engine.telemetry.model_of(a.source)
                    self.events.write("trigger", session=a.session_id, epoch=a.epoch, trace_t=now - self.offset,
                                      ue=self.engine.session(a.session_id).ue_id, source_agent=a.source,
                                      target_agent=a.target, t_ho_pred=a.predicted_handover_time - self.offset,
                                      t_remain=a.predicted_handover_time - now, window_s=a.window_s,
                                      l_hist=a.predicted_split_tokens, t_sit_s=t_sit, t_early_s=t_early, scheme=sch,
                                      r_p=self.engine.telemetry.prefill_rate(a.target, now),
                                      r_d=self.engine.telemetry.decode_rate(a.session_id, now),
                                      bandwidth=self.engine.telemetry.goodput_bytes_per_s(a.source, a.target, now),
                                      s_kv=ident.kv_bytes_per_token if ident else None,
                                      block_size=ident.block_size if ident else None)
                    self._actions[("Trigger", a.session_id, a.epoch)] = (a, t_early)
                    self.policy.trigger(a.source, a.session_id, a.epoch, a.target, split_tokens=a.split_tokens,
                                        predicted_handover_time=a.predicted_handover_time, scheme=sch,
                                        window_s=a.window_s)
                elif isinstance(a, CancelAction):
                    self.events.write("cancel", session=a.session_id, epoch=a.epoch, trace_t=now - self.offset,
                                      source_agent=a.source, target_agent=a.target, reason=a.reason)
                    self._actions[("Cancel", a.session_id, a.epoch)] = (a, None)
                    self.policy.cancel(a.source, a.session_id, a.epoch, a.reason)
                elif isinstance(a, CommitAction):
                    trig = self._actions.get(("Trigger", a.session_id, a.epoch))
                    k = self.tokens.get(a.session_id, (None, 0))[0]
                    ue, f, t, t_ho = ho if ho else ("", -1, -1, a.handover_time - self.offset)
                    tel = self.engine.telemetry
                    ident = tel.model_of(a.source)
                    self.events.write("commit", ue=ue, session=a.session_id, epoch=a.epoch, trace_t=t_ho,
                                      source_agent=a.source, target_agent=a.actual_target, from_cell=f, to_cell=t,
                                      prepared=a.prepared_target is not None, scheme=scheme_name(a.scheme),
                                      window_s=trig[0].window_s if trig and a.prepared_target else None,
                                      t_early_s=trig[1] if trig and a.prepared_target else None, k_curr=k,
                                      r_p=tel.prefill_rate(a.actual_target, now), r_d=tel.decode_rate(a.session_id, now),
                                      bandwidth=tel.goodput_bytes_per_s(a.source, a.actual_target, now),
                                      s_kv=ident.kv_bytes_per_token if ident else None,
                                      block_size=ident.block_size if ident else None)
                    self._actions[("Commit", a.session_id, a.epoch)] = (a, None)
                    self.policy.commit(a.source, a.session_id, a.epoch, a.actual_target, scheme=scheme_name(a.scheme),
                                       handover_time=a.handover_time)
            except KeyError as e:
                log.error("action for an unknown agent dropped", action=repr(a), error=repr(e))

    def _on_reply(self, out: CallOutcome) -> None:
        r = out.reply
        # A commit's reply also says what the handover moved (blocks, bytes, reused/recomputed).
        moved = ({f: int(getattr(r, f)) for f in COMMIT_MOVED_FIELDS}
                 if r is not None and out.kind == "Commit" else {})
        if out.kind == "Commit" and commit_choice_of(r):  # the agent's commit-time choice
            moved["choice"] = commit_choice_of(r)
        self.events.write("reply", call=out.kind.lower(), agent=out.agent_id, session=out.session_id,
                          epoch=out.epoch, ok=out.ok, status=pb.Status.Name(r.status) if r else None,
                          state=r.state if r else None, scheme=scheme_name(r.scheme) if r else None,
                          split_tokens=int(r.split_tokens) if r else None, message=r.message if r else out.error,
                          latency_s=out.latency_s, attempts=out.attempts, **moved)
        entry = self._actions.get((out.kind, out.session_id, out.epoch))
        if entry is None:
            return
        reply = r if r is not None else pb.ControlReply(status=pb.STATUS_ERROR, message=out.error)
        released: list = []
        with self._lock:
            more = self.engine.on_reply(entry[0], reply)
            if out.kind == "Commit":
                released = self._gate.settle(entry[0], reply.status == pb.STATUS_OK)
        self._send(more)
        for a, ho in released:
            self._send([a], ho=ho)

    # ------------------------------------------------------------------ configuration
    def reconfigure(self, config: XappConfig) -> None:
        """Take a new configuration (A1 or CONFIG_FILE change): new agents get channels, the
        engine takes the new scheduler parameters and scheme (sessions in flight keep theirs)."""
        with self._lock:
            old = self.config
            self.config = config
            for aid, ep in self._endpoints(config).items():
                self.policy.agents.setdefault(aid, ep)
            if (dict(config.scheduler) if isinstance(config.scheduler, Mapping) else config.scheduler) != \
                    (dict(old.scheduler) if isinstance(old.scheduler, Mapping) else old.scheduler) \
                    or config.scheme != old.scheme or config.fallback != old.fallback:
                from xapp.scheduler import SchedulerConfig
                sc = config.scheduler
                cfg = sc if isinstance(sc, SchedulerConfig) else SchedulerConfig.from_dict(dict(sc))
                e = self.engine
                e.cfg, e._params = cfg, cfg.decision_params()
                e._horizon = cfg.t_max_s + e._params.trigger_lookahead
                e.scheme, e.fallback = scheme_value(config.scheme), scheme_value(config.fallback)
        log.info("configuration applied", scheme=config.scheme, agents=len(config.agents), cells=len(config.cells))

    # ------------------------------------------------------------------ run / stop
    def _cycle_loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.control_cycle()
            except Exception as e:
                log.error("control cycle failed", error=repr(e))
            self._stop.wait(max(0.0, self.engine.cfg.control_period_s - (time.monotonic() - t0)))

    def start_telemetry(self) -> None:
        """Start reading the agents' Telemetry streams (idempotent)."""
        if self.telemetry is not None and not self._telemetry_started:
            self.telemetry.start()
            self._telemetry_started = True

    def start(self) -> None:
        """Start telemetry and the control cycle (threads), then the transport."""
        self.start_telemetry()
        self._cycle_thread = threading.Thread(target=self._cycle_loop, name="control-cycle", daemon=True)
        self._cycle_thread.start()
        self.transport.start(self.on_message)

    def stop(self) -> None:
        """Stop the transport, the cycle and telemetry; finish queued policy calls."""
        self._stop.set()
        try:
            self.transport.stop()
        except Exception as e:
            log.error("transport stop failed", error=repr(e))
        if self._cycle_thread is not None:
            self._cycle_thread.join(2.0)
        if self.telemetry is not None:
            self.telemetry.stop()
        self.policy.close()
        self.events.close()


def subscribe_all(config: XappConfig, client: Any = None, ledger: Any = None) -> list[dict]:
    """Create the E2 subscriptions (E2SM-RC REPORT Style 1 message copy of UL-DCCH
    MeasurementReports) at every E2 node of the configured agents through submgr's REST API.
    Returns submgr's answers (also recorded in ``ledger``, an
    :class:`xapp.e2.subscription.SubscriptionLedger`, for submgr's later notification); a
    failed node is logged and skipped (the xApp runs on)."""
    from xapp.e2 import subscription as sub

    e2 = config.e2
    client = client or sub.SubmgrClient(e2.submgr_url)
    trigger, actions = sub.rc_message_copy_details()
    rc_ids = getattr(e2, "rc_ran_function_ids", None) or (getattr(e2, "rc_ran_function_id", 3),)
    out = []
    for node in config.e2_nodes:
        for rf in rc_ids:
            params = sub.subscription_params(host=e2.client_host, http_port=e2.client_http_port,
                                             rmr_port=e2.client_rmr_port, meid=node, ran_function_id=int(rf),
                                             event_trigger=trigger, actions=actions)
            try:
                answer = client.subscribe(params)
                out.append(answer)
                if ledger is not None:
                    ledger.requested(answer, node, int(rf))
                log.info("subscribed", e2_node=node, ran_function=rf)
            except Exception as e:
                log.error("subscription failed", e2_node=node, ran_function=rf, error=repr(e))
    return out
