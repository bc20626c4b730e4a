"""The xApp's one composition root, for both of its modes.

    transport (RMR live | trace replay) --RIC_INDICATION--> E2 ingest --> TrackStore
        --> predictor (per UE with a session in flight) --> Scheduler Engine
            (telemetry from the agents' Telemetry streams: r_p, r_d, B, free KV, model identity)
        --> actions (trigger / cancel / commit) --> policy (gRPC Control calls to the agents)

Only the transport differs between the modes:

- ``live``: ricxappframe's RMRXapp (RIC_INDICATION 12050, A1_POLICY_REQ 20010 answered with
  A1_POLICY_RESP 20011, health checks), E2 subscriptions created at start through the
  subscription manager's REST API, configuration from ``$CONFIG_FILE`` (and again on every
  change of that file) and from A1 policy instances.
- ``test``: the same xApp fed by the trace reader, which replays recorded E2 messages (at their
  recorded pace from a given wall-clock start, or as fast as possible).

Every decision and every policy outcome is also written as one JSON line to an optional event
log (the replay harness joins it with what the UEs saw). Times in the log: ``t`` wall clock,
``trace_t`` the trace's clock (equal in live mode).

Handover detection: the first report of a UE from a new serving cell is the handover (the UE is
on the new cell); the commit is sent at once from the ingest path, not at the next control cycle.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import structlog

from xapp.config import XappConfig
from xapp.policy import AgentEndpoint as PolicyEndpoint
from xapp.policy import CallOutcome, PolicyClient, TelemetryConsumer, scheme_name
from xapp.tracks import MeasurementReport, TrackStore

log = structlog.get_logger("pallas.xapp.app")

RIC_INDICATION = 12050
A1_POLICY_REQ = 20010
A1_POLICY_RESP = 20011
A1_POLICY_QUERY = 20012


class EventLog:
    """Append-only JSON-lines log of the xApp's decisions (thread-safe). ``path`` None: no file,
    events are only kept in memory (``events``) for tests."""

    def __init__(self, path: str | Path | None = None, keep: bool = True) -> None:
        self._fh = open(path, "a", buffering=1) if path else None
        self._lock = threading.Lock()
        self.keep = keep
        self.events: list[dict] = []

    def write(self, kind: str, **fields: Any) -> None:
        rec = {"t": time.time(), "kind": kind}
        rec.update({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in fields.items()})
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


@dataclass
class UESession:
    """A session in flight as the agents' telemetry shows it (SessionTelemetry, pallas.proto)."""

    session_id: str
    ue_id: str
    agent_id: str
    tokens: int = 0
    decode_rate: float = 0.0
    remaining_tokens: int = 0
    state: str = ""
    seen: float = 0.0


@dataclass
class UEState:
    """What the xApp knows of one UE: serving cell (since when), the PCI of it, and its session."""

    ue_id: str
    serving_cell: int = -1
    serving_since: float = float("nan")
    session: UESession | None = None
    last_prediction: Any = None
    handovers: int = 0


class Transport(Protocol):
    """What the app needs from an RMR transport (live RMRXapp or trace replay)."""

    def register(self, mtype: int, handler: Callable[[int, bytes, Mapping[str, Any]], None]) -> None: ...
    def run(self) -> None: ...
    def stop(self) -> None: ...
