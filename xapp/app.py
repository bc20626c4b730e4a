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

from pallas_proto import pallas_pb2 as pb
from xapp.config import XappConfig
from xapp.policy import PROACTIVE, AgentEndpoint, CallOutcome, PolicyClient, TelemetryConsumer, scheme_name
from xapp.tracks import MeasurementReport, TrackStore

log = structlog.get_logger("pallas.xapp.app")

RIC_INDICATION = 12050
A1_POLICY_REQ = 20010
A1_POLICY_RESP = 20011

# Session states (agent/session.py SessionState values) in which the reporting agent serves it.
_SERVING_STATES = {"serving", "migrating", "committing", "resumed", "new"}


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


class Ewma:
    """An EWMA of one rate with the time of its newest sample (model.md section 2)."""

    __slots__ = ("value", "when")

    def __init__(self) -> None:
        self.value = float("nan")
        self.when = -math.inf

    def add(self, x: float, now: float, weight: float) -> None:
        if not (math.isfinite(x) and x > 0):
            return
        self.value = x if not math.isfinite(self.value) else weight * x + (1 - weight) * self.value
        self.when = now

    def get(self, now: float, stale_s: float, default: float) -> float:
        return self.value if math.isfinite(self.value) and now - self.when <= stale_s else default


@dataclass
class SessionView:
    """A session in flight as the agents' telemetry shows it (pallas.proto SessionTelemetry)."""

    session_id: str
    ue_id: str
    agent_id: str
    tokens: int = 0
    decode_rate: float = 0.0
    remaining_tokens: int = 0
    state: str = ""
    seen: float = 0.0


@dataclass
class Migration:
    """The xApp's side of one session's migration (model.md sections 4-5).

    ``state``: idle (no preparation), preparing (triggered at ``epoch`` for ``target_cell``),
    committed. ``epoch`` rises with every trigger and every commit, so no epoch is reused.
    """

    session_id: str
    state: str = "idle"
    epoch: int = 0
    source_agent: str = ""
    target_cell: int = -1
    target_agent: str = ""
    window_s: float = float("nan")
    t_early_s: float = float("nan")
    triggered_at: float = float("nan")


@dataclass
class UEState:
    """What the xApp knows of one UE: its serving cell and since when (trace clock)."""

    ue_id: str
    serving_cell: int = -1
    since: float = float("nan")
    reported_target: int = -2


class PallasXapp:
    """The xApp: ingest -> tracks -> predictor -> window decision -> policies (module docstring).

    Args:
        config: the typed configuration (``xapp.config``).
        transport: an ``xapp.e2.transport`` Transport (live RMR or trace replay).
        policy: the gRPC client to the agents (built from ``config.agents`` when None).
        telemetry: a TelemetryConsumer (built from ``config.agents`` when None; ``False``: none).
        predictor: an object with ``observe(report)`` and ``predict(track, now)`` (default:
            ``xapp.predict.HandoverPredictor`` from ``config.predictor``).
        nrt: a neighbour relation table {PCI: NR cell identity} to seed the predictor with.
        events: the event log; ``offset``: wall clock minus trace clock (s).
        a1: an ``xapp.a1.A1PolicyHandler`` (live mode) or None.
    """

    def __init__(self, config: XappConfig, transport: Any, *, policy: PolicyClient | None = None,
                 telemetry: TelemetryConsumer | None | bool = None, predictor: Any = None,
                 nrt: Mapping[int, int] | None = None, events: EventLog | None = None, offset: float = 0.0,
                 a1: Any = None, ingest: Any = None) -> None:
        from xapp.e2.ingest import Ingestor

        self.config = config
        self.transport = transport
        self.events = events or EventLog(None)
        self.offset = offset
        self.a1 = a1
        self.tracks = TrackStore()
        self.ingest = ingest or Ingestor(self.tracks)
        self.predictor = predictor if predictor is not None else self._build_predictor(config, nrt)
        endpoints = self._endpoints(config)
        self.policy = policy or PolicyClient(endpoints, on_reply=self._on_reply)
        if policy is not None and policy.on_reply is None:
            policy.on_reply = self._on_reply
        if telemetry is None:
            telemetry = TelemetryConsumer(endpoints, self._on_telemetry,
                                          period_ms=int(self._sched("control_period_s", 0.1) * 1000))
        self.telemetry = telemetry or None
        self.ues: dict[str, UEState] = {}
        self.sessions: dict[str, SessionView] = {}          # by session id
        self.migrations: dict[str, Migration] = {}          # by session id
        self.r_p: dict[str, Ewma] = {}                      # by target agent
        self.r_d: dict[str, Ewma] = {}                      # by session
        self.goodput: dict[tuple[str, str], Ewma] = {}      # by (source, target) agent
        self.identity: dict[str, pb.ModelIdentity] = {}     # by agent
        self.free_kv_blocks: dict[str, int] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._cycle_thread: threading.Thread | None = None
        self._telemetry_started = False
        self.cycles = 0

    # ------------------------------------------------------------------ construction helpers
    @staticmethod
    def _endpoints(config: XappConfig) -> dict[str, AgentEndpoint]:
        return {aid: AgentEndpoint(aid, a.control_address, a.peer_address) for aid, a in config.agents.items()}

    @staticmethod
    def _build_predictor(config: XappConfig, nrt: Mapping[int, int] | None) -> Any:
        from xapp.predict import HandoverPredictor, PredictorConfig

        raw = dict(config.predictor) if isinstance(config.predictor, Mapping) else None
        try:
            cfg = config.predictor if not isinstance(config.predictor, Mapping) else PredictorConfig.from_dict(raw)
        except ValueError as e:  # the descriptor's predictor section speaks another dialect
            log.warning("predictor config not understood, using defaults", error=str(e))
            cfg = PredictorConfig()
        p = HandoverPredictor(cfg)
        for pci, cell in (nrt or {}).items():
            p.knowledge.nrt.add_serving(int(pci), int(cell))
        return p

    def _sched(self, key: str, default: float) -> float:
        s = self.config.scheduler
        v = s.get(key) if isinstance(s, Mapping) else getattr(s, key, None)
        return float(v) if v is not None else default

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
                ue = self.ues[r.ue_id] = UEState(r.ue_id, r.serving_cell, r.time)
                return
            if r.serving_cell < 0 or r.serving_cell == ue.serving_cell:
                return
            old, ue.serving_cell, ue.since = ue.serving_cell, r.serving_cell, r.time
        self.events.write("handover", ue=r.ue_id, trace_t=r.time, from_cell=old, to_cell=r.serving_cell)
        self.on_handover(r.ue_id, old, r.serving_cell, r.time)

    # ------------------------------------------------------------------ telemetry
    def _on_telemetry(self, agent_id: str, rep: pb.TelemetryReport) -> None:
        now = self.now()
        w = self._sched("ewma_weight", 0.3)
        with self._lock:
            if rep.HasField("server"):
                srv = rep.server
                if srv.HasField("model"):
                    self.identity[agent_id] = srv.model
                self.r_p.setdefault(agent_id, Ewma()).add(srv.prefill_rate, now, w)
                self.free_kv_blocks[agent_id] = int(srv.free_kv_blocks)
            for p in rep.peers:
                self.goodput.setdefault((agent_id, p.agent_id), Ewma()).add(p.goodput_bytes_per_s, now, w)
            for s in rep.sessions:
                if s.state not in _SERVING_STATES:
                    cur = self.sessions.get(s.session_id)
                    if cur is not None and cur.agent_id == agent_id and s.state in ("finished", "failed"):
                        del self.sessions[s.session_id]
                    continue
                v = self.sessions.get(s.session_id)
                if v is None:
                    v = self.sessions[s.session_id] = SessionView(s.session_id, s.ue_id, agent_id)
                v.agent_id, v.ue_id = agent_id, s.ue_id or v.ue_id
                v.tokens, v.decode_rate, v.state = int(s.tokens), float(s.decode_rate), s.state
                v.remaining_tokens, v.seen = int(s.remaining_tokens), now
                self.r_d.setdefault(s.session_id, Ewma()).add(s.decode_rate, now, w)

    def session_of(self, ue_id: str) -> SessionView | None:
        """The UE's session in flight (newest telemetry), or None."""
        best = None
        for v in self.sessions.values():
            if v.ue_id == ue_id and (best is None or v.seen > best.seen):
                best = v
        return best

    # ------------------------------------------------------------------ the control cycle
    def control_cycle(self, now: float | None = None) -> int:
        """One decision cycle over every UE with a session in flight; returns actions taken."""
        now = self.now() if now is None else now
        self.cycles += 1
        acted = 0
        with self._lock:
            work = [(ue, self.session_of(ue.ue_id)) for ue in self.ues.values()]
        for ue, sess in work:
            track = self.tracks.get(ue.ue_id)
            if track is None or not len(track):
                continue
            try:
                pred = self.predictor.predict(track, now)
            except Exception as e:
                log.error("prediction failed", ue=ue.ue_id, error=repr(e))
                continue
            tgt = pred.target_cell if pred is not None else -1
            if tgt != ue.reported_target:
                ue.reported_target = tgt
                self.events.write("prediction", ue=ue.ue_id, trace_t=now, serving_cell=ue.serving_cell,
                                  target_cell=tgt, t_ho=pred.t_ho if pred else None,
                                  confidence=pred.confidence if pred else None,
                                  source=pred.source if pred else None)
            if sess is None:
                continue
            acted += self._decide(ue, sess, pred, now)
        return acted

    def _rates(self, source: str, target: str, sess: SessionView, now: float) -> dict[str, float]:
        stale = self._sched("stale_age_s", 5.0)
        ident = self.identity.get(target) or self.identity.get(source)
        r_p = self.r_p.get(target, Ewma()).get(now, stale, self._sched("default_prefill_rate_tps", 1000.0))
        r_d = self.r_d.get(sess.session_id, Ewma()).get(now, stale, self._sched("default_decode_rate_tps", 20.0))
        bw = self.goodput.get((source, target), Ewma()).get(now, stale, self.config.default_goodput_bytes_per_s)
        return {"r_p": r_p, "r_d": r_d, "bandwidth": bw,
                "s_kv": float(ident.kv_bytes_per_token) if ident and ident.kv_bytes_per_token else 0.0,
                "block_size": float(ident.block_size) if ident and ident.block_size else 0.0}

    def _decide(self, ue: UEState, sess: SessionView, pred: Any, now: float) -> int:
        """Model.md sections 4-5 for one session: cancel on a withdrawn or changed target,
        else run Eq. 9 and trigger once T_remain_hat <= T_w*."""
        from pallas_common import timing

        scheme = self.config.scheme.replace("_", "-")
        m = self.migrations.setdefault(sess.session_id, Migration(sess.session_id))
        tgt_ep = self.config.agent_for_cell(pred.target_cell) if pred is not None and pred.target_cell >= 0 else None
        if m.state == "preparing":
            if tgt_ep is None or pred.target_cell != m.target_cell:
                self._cancel(m, "target changed" if tgt_ep is not None else "prediction withdrawn", now)
                if tgt_ep is None:
                    return 1
            else:
                return 0
        if m.state != "idle" or scheme not in PROACTIVE or tgt_ep is None:
            return 0
        if tgt_ep.agent_id == sess.agent_id or not math.isfinite(pred.t_ho):
            return 0
        if not self.config.proactive.allows(ue.serving_cell, pred.target_cell):
            return 0
        rates = self._rates(sess.agent_id, tgt_ep.agent_id, sess, now)
        if rates["s_kv"] <= 0 or rates["block_size"] <= 0:
            return 0  # no model identity yet: nothing to size the migration with
        t_remain = pred.t_ho - now
        x = timing.WindowInputs(k_curr=max(sess.tokens, 0), t_remain=t_remain, block_size=rates["block_size"],
                                r_p=rates["r_p"], r_d=rates["r_d"], bandwidth=rates["bandwidth"],
                                s_kv=rates["s_kv"], c_sync=self._sched("c_sync_s", 0.05))
        params = timing.DecisionParams(alpha=self._sched("alpha", 0.8), dt=self._sched("dt_s", 0.1),
                                       t_max=self._sched("t_max_s", 5.0),
                                       trigger_lookahead=self._sched("control_period_s", 0.1))
        d = timing.decide(x, params)
        if not bool(d.trigger[0]):
            return 0
        m.state, m.epoch = "preparing", m.epoch + 1
        m.source_agent, m.target_cell, m.target_agent = sess.agent_id, pred.target_cell, tgt_ep.agent_id
        m.window_s, m.t_early_s, m.triggered_at = float(d.window[0]), float(d.t_early[0]), now
        self.events.write("trigger", ue=ue.ue_id, session=sess.session_id, epoch=m.epoch, trace_t=now,
                          source_agent=sess.agent_id, source_cell=ue.serving_cell, target_cell=pred.target_cell,
                          target_agent=tgt_ep.agent_id, t_ho_pred=pred.t_ho, t_remain=t_remain,
                          window_s=m.window_s, t_early_s=m.t_early_s, t_sit_s=float(d.t_sit[0]),
                          l_hist=float(d.l_hist[0]), k_curr=sess.tokens, confidence=pred.confidence, **rates)
        self.policy.trigger(sess.agent_id, sess.session_id, m.epoch, tgt_ep.agent_id, split_tokens=0,
                            predicted_handover_time=pred.t_ho + self.offset, scheme=scheme, window_s=m.window_s)
        return 1

    def _cancel(self, m: Migration, reason: str, now: float) -> None:
        self.events.write("cancel", session=m.session_id, epoch=m.epoch, trace_t=now, reason=reason,
                          target_agent=m.target_agent)
        self.policy.cancel(m.source_agent, m.session_id, m.epoch, reason)
        m.state, m.target_cell, m.target_agent = "idle", -1, ""

    def on_handover(self, ue_id: str, from_cell: int, to_cell: int, t: float) -> None:
        """The UE is on ``to_cell``: commit its session to that cell's agent (prepared or not:
        an unprepared or mispredicted target is recovered by the agent's fallback)."""
        with self._lock:
            sess = self.session_of(ue_id)
            if sess is None:
                self.events.write("commit_skipped", ue=ue_id, trace_t=t, reason="no session in flight",
                                  from_cell=from_cell, to_cell=to_cell)
                return
            tgt = self.config.agent_for_cell(to_cell)
            m = self.migrations.setdefault(sess.session_id, Migration(sess.session_id))
            if tgt is None or tgt.agent_id == sess.agent_id:
                self.events.write("commit_skipped", ue=ue_id, session=sess.session_id, trace_t=t,
                                  reason="no agent at the new cell" if tgt is None else "same server",
                                  from_cell=from_cell, to_cell=to_cell)
                if m.state == "preparing" and tgt is None:
                    self._cancel(m, "handover to a cell without an agent", t)
                return
            prepared = m.state == "preparing" and m.target_agent == tgt.agent_id
            if m.state == "preparing" and not prepared:
                self._cancel(m, "actual target differs from the prepared one", t)
            if not prepared:
                m.epoch += 1
            scheme = self.config.scheme.replace("_", "-")
            source = sess.agent_id
            self.events.write("commit", ue=ue_id, session=sess.session_id, epoch=m.epoch, trace_t=t,
                              source_agent=source, target_agent=tgt.agent_id, from_cell=from_cell,
                              to_cell=to_cell, prepared=prepared, scheme=scheme, window_s=m.window_s if prepared
                              else None, t_early_s=m.t_early_s if prepared else None, k_curr=sess.tokens)
            m.state = "committed"
            if scheme != "detour":
                # After the commit the target's agent serves the session (repeated handovers chain);
                # its telemetry confirms, this only avoids a stale source in between.
                sess.agent_id = tgt.agent_id
        self.policy.commit(source, sess.session_id, m.epoch, tgt.agent_id, scheme=scheme,
                           handover_time=t + self.offset)
        with self._lock:
            m.state, m.window_s, m.t_early_s = "idle", float("nan"), float("nan")

    def _on_reply(self, out: CallOutcome) -> None:
        r = out.reply
        self.events.write("reply", call=out.kind.lower(), agent=out.agent_id, session=out.session_id,
                          epoch=out.epoch, ok=out.ok, status=pb.Status.Name(r.status) if r else None,
                          state=r.state if r else None, scheme=scheme_name(r.scheme) if r else None,
                          split_tokens=int(r.split_tokens) if r else None, message=r.message if r else out.error,
                          latency_s=out.latency_s, attempts=out.attempts)
        if out.kind == "Trigger" and not out.ok:
            with self._lock:
                m = self.migrations.get(out.session_id)
                if m is not None and m.epoch == out.epoch and m.state == "preparing":
                    m.state = "idle"   # refused: the handover will be recovered by the fallback

    # ------------------------------------------------------------------ configuration
    def reconfigure(self, config: XappConfig) -> None:
        """Take a new configuration (A1 or CONFIG_FILE change): new agents get channels."""
        with self._lock:
            self.config = config
            for aid, ep in self._endpoints(config).items():
                self.policy.agents.setdefault(aid, ep)
        log.info("configuration applied", scheme=config.scheme, agents=len(config.agents), cells=len(config.cells))

    # ------------------------------------------------------------------ run / stop
    def _cycle_loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.control_cycle()
            except Exception as e:
                log.error("control cycle failed", error=repr(e))
            self._stop.wait(max(0.0, self._sched("control_period_s", 0.1) - (time.monotonic() - t0)))

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


def subscribe_all(config: XappConfig, client: Any = None) -> list[dict]:
    """Create the E2 subscriptions (E2SM-RC REPORT Style 1 message copy of UL-DCCH
    MeasurementReports) at every E2 node of the configured agents through submgr's REST API.
    Returns submgr's answers; a failed node is logged and skipped (the xApp runs on)."""
    from xapp.e2 import subscription as sub

    e2 = config.e2
    client = client or sub.SubmgrClient(e2.submgr_url)
    trigger, actions = sub.rc_message_copy_details()
    out = []
    for node in config.e2_nodes:
        params = sub.subscription_params(host=e2.client_host, http_port=e2.client_http_port,
                                         rmr_port=e2.client_rmr_port, meid=node,
                                         ran_function_id=e2.rc_ran_function_id,
                                         event_trigger=trigger, actions=actions)
        try:
            out.append(client.subscribe(params))
            log.info("subscribed", e2_node=node)
        except Exception as e:
            log.error("subscription failed", e2_node=node, error=repr(e))
    return out
