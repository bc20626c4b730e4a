"""``pallas.v1.Control``: the xApp-facing gRPC service, a thin servicer over the migration engine.

Trigger/Cancel/Commit validate their endpoint and go to :class:`agent.migration.MigrationEngine`,
which keeps the epochs and the idempotency contract and answers with the statuses of
proto/pallas_proto/pallas.proto ("Conventions"); with a directory (issue 16), a Trigger or
Commit naming a target outside it is ``STATUS_REJECTED`` before the engine sees it (nothing is
sent there, the source keeps serving). Telemetry streams the rates the xApp's window decision
needs (docs/model.md §2-4).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection

import grpc
from pallas_proto import pallas_pb2, pallas_pb2_grpc

from agent.migration import MigrationEngine
from agent.obs import COMMIT_SECONDS, CONTROL_CALLS, get_logger
from pallas_common.aio import cancel_and_wait
from pallas_common.schemes import SessionState, scheme_name

__all__ = ["ControlService", "add_control_service"]

S = pallas_pb2
_log = get_logger("pallas.agent.control")
_STATUS_NAME = {v: k for k, v in S.Status.items()}


class ControlService(pallas_pb2_grpc.ControlServicer):
    """``pallas.v1.Control`` for one agent.

    Args:
        migration: the agent's migration engine.
        agent_id: this agent's id (logs).
        telemetry: ``telemetry() -> pallas_pb2.TelemetryReport`` (agent.meter).
        default_period_s: Telemetry period when the request gives 0.
        min_period_s: lower bound on a requested period (protects the agent).
        directory: the agent ids a Trigger or Commit may name as target (issue 16: the source
            would otherwise send the session's tokens and KV cache wherever a caller says);
            None: no check (tests, plaintext without a directory).
    """

    def __init__(self, migration: MigrationEngine, *, agent_id: str,
                 telemetry: Callable[[], pallas_pb2.TelemetryReport] | None = None,
                 default_period_s: float = 0.1, min_period_s: float = 0.02,
                 directory: Collection[str] | None = None) -> None:
        self.migration = migration
        self.directory = None if directory is None else frozenset(directory)
        self.agent_id = agent_id
        self.telemetry = telemetry
        self.default_period_s = default_period_s
        self.min_period_s = min_period_s
        self._running: set[asyncio.Future] = set()

    def _done(self, method: str, reply: pallas_pb2.ControlReply) -> pallas_pb2.ControlReply:
        CONTROL_CALLS.labels(method, _STATUS_NAME.get(reply.status, str(reply.status))).inc()
        _log.info("control_reply", method=method, session=reply.session_id, epoch=reply.epoch,
                  status=_STATUS_NAME.get(reply.status),
                  state=SessionState.name_of(reply.state),
                  scheme=scheme_name(reply.scheme), split=reply.split_tokens,
                  message=reply.message,
                  choice=reply.choice.option if reply.HasField("choice") else None)
        return reply

    def _no_endpoint(self, ep: pallas_pb2.PeerEndpoint, what: str, sid: str, epoch: int):
        """A refusal for a target without an address (INVALID) or, with a directory, one whose
        agent id is not in it (REJECTED); None when the target may be used."""
        if not ep.address:
            return S.ControlReply(status=S.STATUS_INVALID, message=f"{what} has no address",
                                  session_id=sid, epoch=epoch)
        if self.directory is not None and ep.agent_id not in self.directory:
            _log.warning("target_not_in_directory", what=what, session=sid, epoch=epoch,
                         agent=ep.agent_id, address=ep.address)
            return S.ControlReply(status=S.STATUS_REJECTED, session_id=sid, epoch=epoch,
                                  message=f"{what} {ep.agent_id!r} is not a directory agent")
        return None

    async def _detached(self, call: Awaitable[pallas_pb2.ControlReply]) -> pallas_pb2.ControlReply:
        """Run an engine call to its end even if the caller goes away.

        gRPC cancels a handler whose client disconnected (an xApp killed mid-call): the engine's
        work must not be cut there, or a commit would leave the session frozen at the source and
        the epoch's reply unset (every retry of the restarted xApp would wait on it forever).
        The call runs as its own task; the handler only awaits it (shielded)."""
        task = asyncio.ensure_future(call)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return await asyncio.shield(task)

    async def close(self) -> None:
        """Cancel the engine calls still running (the agent is stopping)."""
        await cancel_and_wait(*self._running)

    async def Trigger(self, request: pallas_pb2.TriggerRequest, context) -> pallas_pb2.ControlReply:
        """Start preparing ``request.session_id`` at ``request.target`` (epoch ``request.epoch``)."""
        sid, epoch = request.session_id, int(request.epoch)
        rep = self._no_endpoint(request.target, "target", sid, epoch) or await self._detached(
            self.migration.trigger(sid, epoch, request.target, int(request.split_tokens),
                                   request.scheme or None, rank=int(request.rank)))
        return self._done("trigger", rep)

    async def Cancel(self, request: pallas_pb2.CancelRequest, context) -> pallas_pb2.ControlReply:
        """Cancel the attempt of ``request.epoch`` (at ``request.target`` only, when set: the
        epoch's other targets stay prepared). At the source the target is told to release
        all it holds; at the target (an agent holding an attempt prepared here for the session,
        of this epoch or older) the attempt is released here too, so an xApp that restarted
        cleans both ends even when the source can no longer reach the target (issue 16)."""
        return self._done("cancel", await self._detached(self._cancel(request)))

    async def _cancel(self, request: pallas_pb2.CancelRequest) -> pallas_pb2.ControlReply:
        sid, epoch = request.session_id, int(request.epoch)
        target = request.target if request.HasField("target") and request.target.address else None
        rep = await self.migration.cancel(sid, epoch, request.reason, target=target)
        if self.migration.ctx.inbound.get(sid) is None or (
                target is not None and target.agent_id != self.migration.ctx.agent_id):
            return rep   # nothing prepared here, or a targeted Cancel naming another agent
        rel = await self.migration.target.on_release(pallas_pb2.ReleaseRequest(
            session_id=sid, epoch=epoch, reason=request.reason or "cancelled by the xApp"),
            undo_resume=False)
        _log.info("cancel_released_inbound", session=sid, epoch=epoch,
                  status=_STATUS_NAME.get(rel.status), blocks=rel.blocks_released)
        if rep.status == S.STATUS_UNKNOWN_SESSION:  # only the attempt lives here
            rep = S.ControlReply(status=rel.status, session_id=sid, epoch=epoch,
                                 message=f"released the attempt prepared here "
                                         f"({rel.blocks_released} blocks) {rel.message}".strip())
        return rep

    async def Commit(self, request: pallas_pb2.CommitRequest, context) -> pallas_pb2.ControlReply:
        """Hand the session over to ``request.actual_target`` with the named scheme."""
        sid, epoch = request.session_id, int(request.epoch)
        t0 = time.perf_counter()
        rep = self._no_endpoint(request.actual_target, "actual_target", sid, epoch) or \
            await self._detached(self.migration.commit(sid, epoch, request.actual_target,
                                                       request.scheme or None))
        COMMIT_SECONDS.labels(scheme_name(rep.scheme)).observe(time.perf_counter() - t0)
        return self._done("commit", rep)

    async def Telemetry(self, request: pallas_pb2.TelemetryRequest, context):
        """Stream one :class:`TelemetryReport` every ``period_ms`` (default: the agent's)."""
        period = request.period_ms / 1000.0 if request.period_ms else self.default_period_s
        period = max(period, self.min_period_s)
        if self.telemetry is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "telemetry is not configured")
            return
        _log.info("telemetry_stream_open", period_s=period, peer=context.peer() if context else None)
        try:
            while True:
                t0 = time.monotonic()
                try:
                    report = self.telemetry()
                except Exception:  # noqa: BLE001 - a bad sample is skipped, the stream runs on
                    _log.exception("telemetry_failed")
                    report = None
                if report is not None:
                    yield report
                await asyncio.sleep(max(0.0, period - (time.monotonic() - t0)))
        finally:
            _log.info("telemetry_stream_closed")


def add_control_service(server: grpc.aio.Server, service: ControlService) -> None:
    """Register ``service`` on a grpc.aio server."""
    pallas_pb2_grpc.add_ControlServicer_to_server(service, server)
