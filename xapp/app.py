"""The xApp's composition root, for both of its modes: it builds the parts and wires them.

    transport (RMR live | trace replay) --RIC_INDICATION--> IndicationHandler --> ControlLoop
        (E2 ingest -> tracks -> predictor -> Scheduler Engine) --> ActionDispatcher --> agents
    A1_POLICY_REQ --> A1Handler --> A1_POLICY_RESP, and the new configuration applied
    agents' Telemetry streams --> TelemetryHandler --> ControlLoop (rates, sessions)
    submgr's notification (HTTP) --> SubscriptionNotificationHandler --> SubscriptionLedger

One handler per message kind, each in its module of :mod:`xapp.handlers` (:attr:`PallasXapp.handlers`
for the RMR ones, keyed by message type, routed by :class:`xapp.handlers.MessageRouter`), one action dispatcher (:mod:`xapp.dispatch`), one control loop (:mod:`xapp.control`).
RMR message types are those of :mod:`xapp.e2.transport`.

Only the transport differs between the modes:

- ``live``: ricxappframe's RMRXapp (``xapp.e2.transport.RmrTransport``), E2 subscriptions kept
  by :class:`xapp.e2.subscription.SubscriptionManager` (added and removed with the configured
  agents, retried with backoff, deleted at stop), configuration from ``$CONFIG_FILE`` (reloaded
  on a change of content) and from A1 policy instances (``xapp.a1``).
- ``test``: the same xApp fed by ``xapp.e2.transport.TraceTransport``, which replays a recorded
  E2 trace at its recorded pace from a given wall-clock start (or as fast as possible).

Every decision and policy outcome is written to the event log (:mod:`xapp.events`).

Durable state (issue 16): the Scheduler Engine draws its migration epochs from the
:class:`xapp.store.XappStore` (SDL in a RIC, memory in test mode), and a
:class:`xapp.store.MigrationJournal` records every order and reply there; at start
(:meth:`PallasXapp.recover`) the migrations an earlier process left in flight are cancelled
(still preparing) or committed again (committing). The gRPC links to the agents open their
channels through ``security`` (:class:`pallas_common.tls.LinkSecurity`: mutual TLS, or
plaintext when chosen explicitly).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable, Mapping

import structlog

from xapp.config import XappConfig
from xapp.control import ControlLoop, UEState
from xapp.dispatch import ActionDispatcher
from xapp.e2.transport import A1_POLICY_REQ, RIC_INDICATION, RmrMessage
from xapp.events import EventLog
from xapp.handlers import (A1Handler, IndicationHandler, MessageRouter, SubscriptionNotificationHandler,
                            TelemetryHandler)
from pallas_common.schemes import scheme_name
from xapp.policy import AgentEndpoint, PolicyClient, TelemetryConsumer, scheme_value
from xapp.store import MemoryStore, MigrationJournal, XappStore, recovery_plan
from xapp.ports import (A1Port, DecisionEngine, E2Ingest, EventSink, PolicyPort, SubscriptionPort,
                         TelemetrySource, TrackPredictor, Transport)
from xapp.tracks import TrackStore

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from pallas_common.tls import LinkSecurity
    from pallas_proto import pallas_pb2 as pb
    from xapp.cluster.arrivals import ArrivalRelay
    from xapp.cluster.leases import Heartbeat
    from xapp.cluster.replica import ClusterReplica
    from xapp.cluster.sessions import SessionGuard
    from xapp.e2.ingest import IngestConfig
    from xapp.e2.subscription import SubmgrClient, SubscriptionLedger

__all__ = ["EventLog", "PallasXapp", "UEState", "subscribe_all"]

log = structlog.get_logger("pallas.xapp.app")


class PallasXapp:
    """The xApp: builds and wires the parts (module docstring).

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
        subscriptions: an ``xapp.e2.subscription.SubscriptionManager`` (live mode) or None:
            synced with the configuration at start and on every change, emptied at stop.
        store: the durable state (``xapp.store``; default a MemoryStore): the engine's epochs
            (when ``engine`` is built here), the migration journal, the recovery at start.
        security: a ``pallas_common.tls.LinkSecurity`` whose ``channel`` opens the policy and
            telemetry channels (None: plaintext channels, as the library's default).
        registry: a prometheus-client registry (live mode: the default one, which
            ``/ric/v1/metrics`` serves) for the E2 ingest counters (when ``ingest`` is built
            here) and ``pallas_xapp_unknown_messages_total{mtype}`` (RMR messages of a type
            the xApp has no handler for; at most 64 distinct types, the rest as ``other``).
        cluster: an ``xapp.cluster.replica.ClusterReplica`` when the xApp runs as one of several
            replicas (``controls.cluster.enabled``, docs/scale-out.md): it admits only the
            indications of the E2 nodes this replica owns and keeps ``subscriptions`` at those
            nodes (heartbeat thread, started and stopped with the xApp). None: one replica.
    """

    def __init__(self, config: XappConfig, transport: Transport, *, policy: PolicyPort | None = None,
                 telemetry: TelemetrySource | None | bool = None, predictor: TrackPredictor | None = None,
                 engine: DecisionEngine | None = None, nrt: Mapping[int, int] | None = None,
                 events: EventSink | None = None, offset: float = 0.0, a1: A1Port | None = None,
                 ingest: E2Ingest | None = None, subscriptions: SubscriptionPort | None = None,
                 store: XappStore | None = None, security: LinkSecurity | None = None,
                 registry: CollectorRegistry | None = None, cluster: ClusterReplica | None = None) -> None:
        from xapp.e2.ingest import Ingestor

        self.config = config
        self.transport = transport
        self.events: EventSink = events or EventLog(None)
        self._offset = offset
        self.a1 = a1
        self.subscriptions = subscriptions
        self.store = store if store is not None else MemoryStore()
        self.journal = MigrationJournal(self.store)
        self.security = security
        self._lock = threading.RLock()
        self.predictor: TrackPredictor = predictor if predictor is not None else self._build_predictor(config, nrt)
        pcfg = getattr(self.predictor, "cfg", None)
        # the tracks hold what the predictor reads; a UE silent for ue_silence_s is freed
        self.tracks = TrackStore(capacity=getattr(pcfg, "window_reports", 32),
                                 silence_s=getattr(pcfg, "ue_silence_s", 30.0))
        self.ingest: E2Ingest = ingest or Ingestor(self.tracks, self._ingest_config(config), registry=registry)
        self.router = MessageRouter(registry=registry)
        self.unknown_types = self.router.unknown_types     # RMR message type (or "other") -> count
        self.engine: DecisionEngine = engine if engine is not None else self._build_engine(config, self.store)
        endpoints = self._endpoints(config)
        channel = {} if security is None else {"channel_factory": security.channel}
        self.policy: PolicyPort = policy or PolicyClient(endpoints, **channel)
        tokens: dict[str, tuple[int, float]] = {}      # session -> (K, wall time) from telemetry
        self.guard = self._session_guard(cluster)
        self.dispatcher = ActionDispatcher(self.engine, self.policy, self.events, self._lock,
                                           lambda: self.offset, tokens, journal=self.journal,
                                           guard=self.guard)
        if getattr(self.policy, "on_reply", None) is None:
            self.policy.on_reply = self.dispatcher.on_reply
        self.control = ControlLoop(lambda: self.config, self.tracks, self.ingest, self.predictor, self.engine,
                                   self.dispatcher, self.events, self._lock, offset, tokens=tokens)
        self.on_telemetry = TelemetryHandler(self.control)
        if telemetry is None:
            telemetry = TelemetryConsumer(endpoints, self.on_telemetry,
                                          period_ms=int(self.engine.cfg.control_period_s * 1000), **channel)
        self.telemetry: TelemetrySource | None = telemetry or None
        self.handlers = self.router.handlers
        self.cluster = cluster
        if cluster is not None:
            cluster.attach(lambda: self.config, subscriptions)
            cluster.on_beat = self._lease_event
            self.control.arrivals = True     # a handover may start at another replica's node
            self.engine.follow_moves = True  # another replica may commit a session tracked here
        self.relay = self._arrival_relay(cluster)
        self.handlers[RIC_INDICATION] = IndicationHandler(self.control, None if cluster is None else cluster.admit)
        if a1 is not None:
            self.handlers[A1_POLICY_REQ] = A1Handler(a1, transport, self.reconfigure)
        self.on_subscription_response = (SubscriptionNotificationHandler(subscriptions.ledger)
                                         if subscriptions is not None else None)
        self._stop = threading.Event()
        self.stopping: str | None = None        # the step stop() is in (a shutdown's log)
        self._cycle_thread: threading.Thread | None = None
        self._telemetry_started = False
        self._recovered: list | None = None
        self._get_nodeb: Callable[[str], object] | None = None

    # ------------------------------------------------------------------ construction helpers
    def _session_guard(self, cluster: ClusterReplica | None) -> SessionGuard | None:
        """A replica's guard of its orders (session records in SDL, docs/scale-out.md §3) when
        its lease store keeps session records (``NodeLeases``); None for one replica."""
        if cluster is None or not hasattr(cluster.leases, "write_session"):
            return None
        from xapp.cluster.sessions import SessionGuard
        return SessionGuard(cluster.leases, self.store, self.engine, self._ue_view,
                            lambda: self.config, self._lock)

    def _arrival_relay(self, cluster: ClusterReplica | None) -> ArrivalRelay | None:
        """A replica's relay of handovers that cross replicas (docs/scale-out.md §3 rule 6),
        wired into the control loop and the guard; None without session records."""
        if self.guard is None or cluster is None:
            return None
        from xapp.cluster.arrivals import ArrivalRelay
        relay = ArrivalRelay(cluster.leases, check_s=cluster.heartbeat_s)
        relay.attach(self.control.on_forwarded, self.control.on_unanswered)
        self.control.relay = self.guard.relay = cluster.relay = relay
        return relay

    def _lease_event(self, hb: Heartbeat) -> None:
        """A ``lease`` event (nodes claimed, released, lost, owned) for a heartbeat that changed
        the nodes this replica owns: the replay times a fail-over from them (pallas_eval.failover)."""
        fields = hb.changes()
        if fields is not None:
            self.events.write("lease", **fields)

    def _ue_view(self, ue_id: str) -> tuple[int, float, str] | None:
        """(serving cell, trace time of the latest report, the E2 node (MEID) it came from, ""
        when unknown) of a UE this xApp tracks, or None."""
        ue = self.control.ues.get(ue_id)
        return None if ue is None else (ue.serving_cell, ue.last_heard, ue.e2_node)

    @staticmethod
    def _endpoints(config: XappConfig) -> dict[str, AgentEndpoint]:
        return {aid: AgentEndpoint(aid, a.control_address, a.peer_address) for aid, a in config.agents.items()}

    @staticmethod
    def _ingest_config(config: XappConfig) -> IngestConfig:
        """E2 ingestion settings from ``controls.e2`` (RAN function -> service model, KPM names),
        the ingest's defaults where the configuration does not give them."""
        from xapp.e2.ingest import IngestConfig
        e2 = config.e2
        kw: dict[str, object] = {}
        rf = getattr(e2, "ran_functions", None)
        if rf:
            kw["ran_functions"] = {int(k): v for k, v in dict(rf).items()}
        km = getattr(e2, "kpm_measurements", None)
        if isinstance(km, Mapping) and km:
            kw["kpm_measurements"] = dict(km)
        sv = getattr(e2, "sm_versions", None)
        if isinstance(sv, Mapping) and sv:
            kw["sm_versions"] = {k: dict(v) for k, v in sv.items()}
        return IngestConfig(**kw)

    @staticmethod
    def _build_predictor(config: XappConfig, nrt: Mapping[int, int] | None) -> TrackPredictor:
        """The handover predictor of the configuration; with ``association_map.path`` it
        starts from what it learns from those drive-test CSVs, with ``association_map.calibration``
        it maps its raw scores through those tables (ValueError if either is unusable)."""
        from xapp.predict import HandoverPredictor, PredictorConfig, knowledge_from_drives_at, load_calibrators

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
        calibrators = None
        cal_path = getattr(config, "calibration_path", "")
        if cal_path:
            calibrators = load_calibrators(cal_path)
            log.info("predictor calibration loaded", path=cal_path, tables=sorted(calibrators))
        p = HandoverPredictor(cfg, knowledge=knowledge, calibrators=calibrators)
        for pci, cell in (nrt or {}).items():
            p.knowledge.nrt.add_serving(int(pci), int(cell))
        return p

    @staticmethod
    def _build_engine(config: XappConfig, store: XappStore | None = None) -> DecisionEngine:
        from xapp.scheduler import SchedulerConfig, SchedulerEngine

        sc = config.scheduler
        cfg = sc if isinstance(sc, SchedulerConfig) else SchedulerConfig.from_dict(dict(sc))
        return SchedulerEngine(cfg, scheme=scheme_value(config.scheme), fallback=scheme_value(config.fallback),
                               epochs=None if store is None else store.allocate_epoch)


    # ------------------------------------------------------------------ the parts' faces
    @property
    def offset(self) -> float:
        """Wall clock minus trace clock (s): one value for the control loop (its ``now``, the
        silence and the t_HO it hands the engine) and the dispatcher."""
        control = getattr(self, "control", None)
        return self._offset if control is None else control.offset

    @offset.setter
    def offset(self, value: float) -> None:
        self._offset = value
        control = getattr(self, "control", None)
        if control is not None:
            control.offset = value

    @property
    def ues(self) -> dict[str, UEState]:
        return self.control.ues

    @property
    def tokens(self) -> dict[str, tuple[int, float]]:
        return self.control.tokens

    @property
    def cycles(self) -> int:
        return self.control.cycles

    def now(self) -> float:
        """The trace clock now (live: wall clock)."""
        return self.control.now()

    def on_message(self, msg: RmrMessage) -> None:
        """The transport callback (one thread): the handler of the message's type
        (:class:`xapp.handlers.MessageRouter`). Never raises."""
        self.router(msg)

    def on_indication(self, payload: bytes, e2_node: str = "", t: float | None = None, sub_id: int = -1) -> None:
        self.control.on_indication(payload, e2_node, t, sub_id)

    def _on_telemetry(self, agent_id: str, rep: pb.TelemetryReport) -> None:
        self.on_telemetry(agent_id, rep)

    def control_cycle(self) -> int:
        return self.control.control_cycle()

    def ue_left(self, ue_id: str) -> None:
        """A UE left (release or handover-out notice): see :meth:`ControlLoop.ue_left`."""
        self.control.ue_left(ue_id)

    def on_handover(self, ue_id: str, from_cell: int, to_cell: int, t: float) -> None:
        self.control.on_handover(ue_id, from_cell, to_cell, t)

    def warm_up(self, payload: bytes, e2_node: str = "") -> None:
        """Decode one indication without keeping it, so that the E2SM and NR RRC codecs are
        compiled and loaded before the first real message (their first use takes seconds on a
        busy machine, which would delay the first handovers' commits). Never raises."""
        from xapp.e2.ingest import decode_indication
        try:
            decode_indication(payload, e2_node, 0.0, self.ingest.config)
        except Exception as e:
            log.info("warm-up decode failed (harmless)", error=repr(e))

    # ------------------------------------------------------------------ configuration
    def reconfigure(self, config: XappConfig) -> None:
        """Take a new configuration (A1 or CONFIG_FILE change). The engine takes the scheduler
        parameters, scheme and fallback for its next decision (``SchedulerEngine.reconfigure``;
        attempts a reactive scheme no longer wants are cancelled); the proactive rules apply
        from the next cycle; the policy channels, Telemetry streams and E2 subscriptions follow
        the agents (new, removed, moved)."""
        from xapp.scheduler import SchedulerConfig
        sc = config.scheduler
        cfg = sc if isinstance(sc, SchedulerConfig) else SchedulerConfig.from_dict(dict(sc))
        with self._lock:
            self.config = config
            actions = self.engine.reconfigure(cfg, scheme=scheme_value(config.scheme),
                                              fallback=scheme_value(config.fallback))
            endpoints = self._endpoints(config)
        set_agents = getattr(self.policy, "set_agents", None)
        if set_agents is not None:
            set_agents(endpoints)
        if self.telemetry is not None:
            self.telemetry.set_agents(endpoints)
        if self.cluster is not None:
            self.cluster.follow(config)       # the subscriptions of the nodes owned
        elif self.subscriptions is not None:
            self.subscriptions.sync(config)
        if self._get_nodeb is not None:
            self.declare_nodebs(self._get_nodeb)
        self.dispatcher.send(actions)
        log.info("configuration applied", scheme=config.scheme, agents=len(config.agents), cells=len(config.cells))

    # ------------------------------------------------------------------ restart, R-NIB
    def recover(self) -> list:
        """Finish what an earlier process left in flight (``xapp.store.recovery_plan``), once:
        a migration still preparing is cancelled at its source and at its target (the source
        releases the target, and the target releases its attempt itself in case the source
        cannot reach it; the record ends when both answered), one
        committing has its Commit sent again (the agents answer a repeat with the first reply).
        The orders go through the journal and the policy client before any new order, so each
        reply ends its record (and a commit's rebinds the session); an unanswered one stays for
        the next start. Returns the plan's steps (``RecoveryStep``). Never raises: a store that
        cannot be read is logged and nothing is recovered."""
        if self._recovered is not None:
            return self._recovered
        from xapp.scheduler import CancelAction, CommitAction
        try:
            steps = recovery_plan(self.store)
        except Exception as e:
            log.error("recovery plan unreadable", error=repr(e))
            steps = []
        self._recovered = steps
        for step in steps:
            m = step.migration
            self.events.write("recover", action=step.action, session=m.session_id, epoch=m.epoch,
                              source_agent=m.source, target_agent=m.target, phase=m.phase)
            try:
                if step.action == "commit":
                    act = CommitAction(m.session_id, m.epoch, m.source, m.target, m.target,
                                       m.scheme, m.t_ho)
                    self.journal.sent(act)
                    self.policy.commit(m.source, m.session_id, m.epoch, m.target,
                                       scheme=scheme_name(m.scheme), handover_time=m.t_ho)
                else:
                    self.journal.sent(CancelAction(m.session_id, m.epoch, m.source, m.target,
                                                   "xapp restarted"))
                    agents = [a for a in dict.fromkeys((m.source, m.target)) if a]
                    self.journal.cancelling(m.session_id, m.epoch, agents)
                    for a in agents:    # the target too: the source may not reach it
                        try:
                            self.policy.cancel(a, m.session_id, m.epoch, "xapp restarted")
                        except KeyError:
                            log.error("recovery cancel: agent no longer configured", agent=a,
                                      session=m.session_id, epoch=m.epoch)
                            self.journal.not_sent(m.session_id, m.epoch, a)
            except Exception as e:   # an agent no longer configured, a store failure
                log.error("recovery step failed", action=step.action, session=m.session_id,
                          epoch=m.epoch, error=repr(e))
        if steps:
            log.info("recovered", cancelled=sum(s.action == "cancel" for s in steps),
                     committed=sum(s.action == "commit" for s in steps))
        return steps

    def declare_nodebs(self, get_nodeb: Callable[[str], object]) -> dict[str, dict[int, tuple[str, str]]]:
        """Read each configured agent's E2 node from the R-NIB (``get_nodeb(meid)``: ricxappframe's
        ``RMRXapp.GetNodeb``) and record the RAN function versions it declares in the ingest
        (``Ingestor.declare_nodeb``; the descriptor's ``controls.e2.sm_versions`` pins still win).
        Kept for later configuration changes. A node that cannot be read, or has no record, is
        logged and skipped. Returns {E2 node: {RAN function ID: (service model, version)}}."""
        self._get_nodeb = get_nodeb
        out: dict[str, dict[int, tuple[str, str]]] = {}
        for node in self.config.e2_nodes:
            try:
                nodeb = get_nodeb(node)
            except Exception as e:
                log.warning("nodeb_unreadable", e2_node=node, error=repr(e))
                continue
            if nodeb is None:
                log.warning("nodeb_unknown", e2_node=node, note="no R-NIB record; versions from the PDUs")
                continue
            out[node] = got = self.ingest.declare_nodeb(node, nodeb)
            log.info("nodeb_declared", e2_node=node,
                     ran_functions={rid: f"{sm} {v}" for rid, (sm, v) in got.items()})
        return out

    # ------------------------------------------------------------------ run / stop
    def _cycle_loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.control.control_cycle()
            except Exception as e:
                log.error("control cycle failed", error=repr(e))
            self._stop.wait(max(0.0, self.engine.cfg.control_period_s - (time.monotonic() - t0)))

    def start_telemetry(self) -> None:
        """Recover what an earlier process left in flight (:meth:`recover`), then start reading
        the agents' Telemetry streams (idempotent)."""
        self.recover()
        if self.telemetry is not None and not self._telemetry_started:
            self.telemetry.start()
            self._telemetry_started = True

    def start(self) -> None:
        """Subscribe (live), start telemetry and the control cycle (threads), then the transport
        (one with a ``defer`` hook, ``RmrTransport``, is told when a cycle runs)."""
        if self.cluster is not None:          # subscribes to the nodes it claims, one heartbeat
            self.cluster.start()
        elif self.subscriptions is not None:
            self.subscriptions.sync(self.config)
        if self.relay is not None:            # arrivals forwarded to this replica
            self.relay.start()
        if self.subscriptions is not None:
            self.subscriptions.start()
        self.start_telemetry()
        self._cycle_thread = threading.Thread(target=self._cycle_loop, name="control-cycle", daemon=True)
        self._cycle_thread.start()
        if hasattr(self.transport, "defer"):     # live: the receive loop lets a cycle run undisturbed
            self.transport.defer = lambda: self.control.cycling
        self.transport.start(self.on_message)

    def stop(self) -> None:
        """Delete the E2 subscriptions (live), stop the transport, the cycle and telemetry;
        finish queued policy calls (``PolicyClient.close``: bounded). A step that raises is
        logged and the next ones run. :attr:`stopping` names the step in progress (None before
        and after), for a shutdown that overruns its time (xapp.main's ``--shutdown-s``)."""
        self._stop.set()
        steps: list[tuple[str, Callable[[], object]]] = []
        if self.relay is not None:
            steps.append(("arrival relay", self.relay.stop))
        if self.cluster is not None:          # leases given up; no heartbeat subscribes again
            steps.append(("cluster leases", self.cluster.stop))
        if self.subscriptions is not None:
            steps.append(("E2 subscription delete", self.subscriptions.delete_all))
        steps.append(("transport", self.transport.stop))
        if self._cycle_thread is not None:
            steps.append(("control cycle", lambda: self._cycle_thread.join(2.0)))
        if self.telemetry is not None:
            steps.append(("telemetry", self.telemetry.stop))
        steps += [("policy calls", self.policy.close),
                  ("event log", self.events.close), ("store", self.store.close)]
        for name, step in steps:
            self.stopping = name
            try:
                step()
            except Exception as e:            # the next parts are stopped all the same
                log.error("stop step failed", step=name, error=repr(e))
        self.stopping = None


def subscribe_all(config: XappConfig, client: SubmgrClient | None = None,
                  ledger: SubscriptionLedger | None = None) -> list[dict]:
    """Create the E2 subscriptions of ``config`` once (E2SM-RC REPORT Style 1 message copy at
    every E2 node of the configured agents) through submgr's REST API; returns submgr's
    answers (recorded in ``ledger`` too). A failed node is logged and skipped. For the whole
    lifecycle (retries, reloads, deletion at shutdown) use
    :class:`xapp.e2.subscription.SubscriptionManager`."""
    from xapp.e2 import subscription as sub
    mgr = sub.SubscriptionManager(client or sub.SubmgrClient(config.e2.submgr_url), ledger)
    return mgr.sync(config)
