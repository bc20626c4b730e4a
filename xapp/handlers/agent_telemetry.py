"""An agent's TelemetryReport (its gRPC Telemetry stream) into the control loop."""

from __future__ import annotations

from pallas_proto import pallas_pb2 as pb
from xapp.control import ControlLoop


class TelemetryHandler:
    """``handler(agent_id, report)``: :meth:`ControlLoop.on_telemetry` (rates, sessions)."""

    def __init__(self, control: ControlLoop) -> None:
        self.control = control

    def __call__(self, agent_id: str, report: pb.TelemetryReport) -> None:
        self.control.on_telemetry(agent_id, report)
