"""The faces of the xApp's collaborators: what the composition root (:mod:`xapp.app`), the
control loop (:mod:`xapp.control`) and the action dispatcher (:mod:`xapp.dispatch`) need of
each part, as :class:`typing.Protocol` classes.

A part fits by shape, not by inheritance: the live part, a wrapper (``xapp.hold.HoldCorrect``
around the predictor) and a test's fake all satisfy the same Protocol. Nothing here is checked
at run time; the Protocols say what a replacement must offer.

    part              Protocol              the xApp's own implementation
    ---------------   -------------------   ------------------------------------------------
    transport         Transport             xapp.e2.transport.RmrTransport / TraceTransport
    predictor         TrackPredictor        xapp.predict.HandoverPredictor
    engine            DecisionEngine        xapp.scheduler.SchedulerEngine
    ingest            E2Ingest              xapp.e2.ingest.Ingestor
    journal           Journal               xapp.store.MigrationJournal
    event log         EventSink             xapp.events.EventLog
    agents' Control   PolicyPort            xapp.policy.PolicyClient
    agents' streams   TelemetrySource       xapp.policy.TelemetryConsumer
    A1                A1Port                xapp.a1.A1PolicyHandler
    E2 subscriptions  SubscriptionPort      xapp.e2.subscription.SubscriptionManager

Times are seconds; "trace clock" and "wall clock" as in :mod:`xapp.control`.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from xapp.e2.transport import RmrMessage, Transport

if TYPE_CHECKING:
    import numpy as np

    from pallas_proto import pallas_pb2 as pb
    from xapp.a1 import A1Outcome
    from xapp.config import XappConfig
    from xapp.e2.ingest import IngestConfig
    from xapp.e2.subscription import SubscriptionLedger
    from xapp.policy import AgentEndpoint, CallOutcome
    from xapp.predict.base import Prediction
    from xapp.scheduler.config import SchedulerConfig
    from xapp.scheduler.ho_timing import HandoverTimingError
    from xapp.scheduler.state import Action, SessionMigration
    from xapp.scheduler.telemetry import TelemetryStore
    from xapp.store import XappStore
    from xapp.tracks import MeasurementReport, UETrack

__all__ = ["A1Port", "DecisionEngine", "E2Ingest", "EventSink", "Journal", "OrderGuard", "PolicyPort",
           "RmrMessage", "SubscriptionPort", "TelemetrySource", "TrackPredictor", "Transport"]


class TrackPredictor(Protocol):
    """The handover predictor the control loop asks.

    ``observe(report)``: one UE's measurement report (trace clock), before the track is read.
    ``predict(track, now)``: the UE's prediction at trace time ``now``, or None.
    Optional, looked up by name: ``update(store) -> Predictions`` (a batch predictor: the UEs
    with new reports since the last call, in one array pass), ``forget(ue_id)`` (free a UE's
    state), ``cfg`` (its ``PredictorConfig``: ``window_reports`` and ``ue_silence_s`` size the
    tracks)."""

    def observe(self, report: MeasurementReport) -> None: ...

    def predict(self, track: UETrack, now: float) -> Prediction | None: ...


class DecisionEngine(Protocol):
    """The Scheduler Engine (:class:`xapp.scheduler.SchedulerEngine`): the per-session
    migration decisions, all on the wall clock. Every event returns the actions to send."""

    cfg: SchedulerConfig
    scheme: int
    fallback: int
    telemetry: TelemetryStore
    ho_timing: HandoverTimingError

    def reconfigure(self, cfg: SchedulerConfig | None = None, *, scheme: int | None = None,
                    fallback: int | None = None) -> list[Action]: ...

    def ingest_telemetry(self, report: pb.TelemetryReport, now: float | None = None) -> list[Action]: ...

    def set_predictions(self, ue_ids: Sequence[str], targets: Sequence[str | None],
                        t_ho: Sequence[float] | np.ndarray, confidence: Sequence[float] | np.ndarray,
                        proactive: Sequence[bool] | np.ndarray | None = None,
                        candidates: Sequence[Sequence[tuple[str, float]] | None] | None = None) -> list[Action]: ...

    def cycle(self, now: float) -> list[Action]: ...

    def forget_ue(self, ue_id: str) -> None: ...

    def on_handover(self, ue_id: str, actual_target: str, now: float) -> list[Action]: ...

    def on_reply(self, action: Action, reply: pb.ControlReply) -> list[Action]: ...

    def observe_ho_timing(self, predicted_t_ho: float, actual_t_ho: float) -> float | None: ...

    def session(self, session_id: str) -> SessionMigration: ...

    def sessions_of(self, ue_id: str) -> list[SessionMigration]: ...


class E2Ingest(Protocol):
    """E2 indications in, measurement reports out (:class:`xapp.e2.ingest.Ingestor`).

    ``stats``: outcome counts (written to the test-mode ``end`` event); ``config``: the
    ingest settings (the warm-up decode uses them)."""

    config: IngestConfig
    stats: Mapping[str, int]

    def on_indication(self, payload: bytes, e2_node: str = "", t: float | None = None,
                      sub_id: int = -1) -> list[MeasurementReport]: ...

    def declare_nodeb(self, e2_node: str, nodeb: Any) -> dict[int, tuple[str, str]]:
        """``nodeb``: ricxappframe's R-NIB record (a protobuf NbIdentity/NodebInfo), as read."""
        ...


class EventSink(Protocol):
    """The event log (:class:`xapp.events.EventLog`): one JSON line per event."""

    def write(self, kind: str, **fields: Any) -> None: ...

    def close(self) -> None: ...


class Journal(Protocol):
    """The durable record of migrations in flight (:class:`xapp.store.MigrationJournal`):
    told of every order before it is sent and of every reply; ``store`` is where it keeps them."""

    store: XappStore

    def opened(self, session_id: str, agent_id: str, *, ue_id: str = "", scheme: int = 0,
               fallback: int = 0) -> None: ...

    def ended(self, session_id: str) -> None: ...

    def sent(self, action: Action) -> None: ...

    def cancelling(self, session_id: str, epoch: int, agents: list[str]) -> None: ...

    def not_sent(self, session_id: str, epoch: int, agent_id: str) -> None: ...

    def replied(self, outcome: CallOutcome) -> None: ...


class OrderGuard(Protocol):
    """What an order passes before it leaves a replica of a scale-out
    (:class:`xapp.cluster.sessions.SessionGuard`): ``check(action)`` writes the session's
    record and returns (the order to send, possibly renumbered, ""), or (None, the reason its
    record was refused)."""

    def check(self, action: Action) -> tuple[Action | None, str]: ...


class PolicyPort(Protocol):
    """The client to the agents' Control services (:class:`xapp.policy.PolicyClient`).

    ``send(action)`` sends a Scheduler Engine action as built; ``commit``/``cancel`` send one
    by hand (the recovery at start). Each returns a Future of the call's outcome, which also
    goes to ``on_reply``. Raises KeyError for an agent not configured. Optional, looked up by
    name: ``set_agents(endpoints)`` (follow a new agent map), ``forget_session(id)``."""

    on_reply: Callable[[CallOutcome], None] | None

    def send(self, action: Action) -> Future[CallOutcome]: ...

    def commit(self, source_agent: str, session_id: str, epoch: int, actual_target: str, *,
               scheme: str = ..., handover_time: float = 0.0) -> Future[CallOutcome]: ...

    def cancel(self, source_agent: str, session_id: str, epoch: int,
               reason: str = "") -> Future[CallOutcome]: ...

    def close(self) -> None: ...


class TelemetrySource(Protocol):
    """The agents' Telemetry streams (:class:`xapp.policy.TelemetryConsumer`)."""

    def start(self) -> object: ...

    def set_agents(self, agents: Mapping[str, AgentEndpoint]) -> list[str]: ...

    def stop(self) -> None: ...


class A1Port(Protocol):
    """The A1 policy handler (:class:`xapp.a1.A1PolicyHandler`): ``process`` answers one
    A1_POLICY_REQ payload (an ``A1Outcome``: ``changed``, ``response``,
    ``policy_instance_id``); ``config`` is the configuration in force after it."""

    config: XappConfig

    def process(self, message: bytes | str) -> A1Outcome: ...


class SubscriptionPort(Protocol):
    """The E2 subscriptions' lifecycle (:class:`xapp.e2.subscription.SubscriptionManager`);
    ``ledger.notify(body)`` takes submgr's notifications."""

    ledger: SubscriptionLedger

    def sync(self, config: XappConfig) -> list[dict]: ...

    def start(self) -> object: ...

    def delete_all(self) -> int: ...
