"""The xApp-facing Control service of an agent (``pallas.v1.Control``, grpc.aio).

Trigger / Cancel / Commit drive one session's migration through :class:`agent.schemes.
SchemeRunner` (which applies Pallas or a baseline through the migration core of issue 2);
Telemetry streams the rates the xApp's window decision needs (model.md sections 2-4).

Contract (proto/pallas_proto/pallas.proto, "Conventions"):

- Idempotent under retries: a call repeating an earlier call's (method, session_id, epoch)
  returns the earlier reply and does no work twice; a retry that arrives while the first call
  is still running waits for it and gets the same reply.
- Epochs (model.md section 5): a call whose epoch is below the newest epoch seen for the
  session is answered ``STATUS_STALE_EPOCH`` and does nothing. A Trigger for an epoch that was
  already cancelled or committed is stale as well. A newer epoch supersedes older attempts
  (the scheme runner releases the old target's state).
- Clear statuses: ``STATUS_INVALID`` for malformed requests (empty session id, missing
  target), ``STATUS_UNKNOWN_SESSION`` when this agent does not hold the session,
  ``STATUS_REJECTED`` for admission refusals, ``STATUS_ERROR`` for internal failures (the
  source keeps serving). ``message`` says what happened in words.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from pallas_proto import pallas_pb2, pallas_pb2_grpc

from agent.obs import COMMIT_SECONDS, CONTROL_CALLS, get_logger
from agent.schemes import SchemeRunner, scheme_name
from pallas_common.contract import COMMIT_MOVED_FIELDS

__all__ = ["ControlService", "EpochLedger", "add_control_service"]

S = pallas_pb2
_log = get_logger("pallas.agent.control")

_STATUS_NAME = {v: k for k, v in S.Status.items()}


@dataclass
class _SessionLedger:
    newest: int = 0
    closed: dict[int, str] = field(default_factory=dict)  # epoch -> "cancelled" | "committed"
    replies: dict[tuple[str, int], asyncio.Future] = field(default_factory=dict)
    touched: float = field(default_factory=time.monotonic)


class EpochLedger:
    """Per-session epoch bookkeeping and the reply cache that makes calls idempotent.

    Args:
        max_sessions: sessions remembered (least recently used are forgotten first).
    """

    def __init__(self, max_sessions: int = 10_000) -> None:
        self.max_sessions = max_sessions
        self._by_session: collections.OrderedDict[str, _SessionLedger] = collections.OrderedDict()

    def get(self, session_id: str) -> _SessionLedger:
        """The ledger of one session (created on first use)."""
        led = self._by_session.get(session_id)
        if led is None:
            led = self._by_session[session_id] = _SessionLedger()
            while len(self._by_session) > self.max_sessions:
                self._by_session.popitem(last=False)
        else:
            self._by_session.move_to_end(session_id)
        led.touched = time.monotonic()
        return led

    def newest(self, session_id: str) -> int:
        """Newest epoch seen for the session (0 if none)."""
        led = self._by_session.get(session_id)
        return led.newest if led else 0

    def forget(self, session_id: str) -> None:
        """Drop a session's ledger (after it finished)."""
        self._by_session.pop(session_id, None)


def _reply(status: int, message: str, session_id: str, epoch: int, *, state: str = "",
           split_tokens: int = 0, scheme: int = 0) -> pallas_pb2.ControlReply:
    return S.ControlReply(status=status, message=message, session_id=session_id, epoch=epoch,
                          state=state, split_tokens=split_tokens, scheme=scheme)


def _endpoint_ok(ep: pallas_pb2.PeerEndpoint) -> bool:
    return bool(ep.address or ep.agent_id)


class ControlService(pallas_pb2_grpc.ControlServicer):
    """``pallas.v1.Control`` for one agent.

    Args:
        runner: applies the schemes (and owns the migration core).
        agent_id: this agent's id (in Telemetry reports and logs).
        has_session: ``has_session(session_id) -> bool``: does this agent hold the session
            (as its source)? Calls for sessions it does not hold get
            ``STATUS_UNKNOWN_SESSION``.
        session_state: ``session_state(session_id) -> str``: the session's state for replies.
        telemetry: ``telemetry() -> pallas_pb2.TelemetryReport``: one report (see
            :class:`agent.telemetry.TelemetryCollector`).
        default_period_s: Telemetry period when the request gives 0.
        min_period_s: lower bound on a requested period (protects the agent).
    """

    def __init__(
        self,
        runner: SchemeRunner,
        *,
        agent_id: str,
        has_session: Callable[[str], bool],
        session_state: Callable[[str], str] | None = None,
        telemetry: Callable[[], pallas_pb2.TelemetryReport] | None = None,
        default_period_s: float = 0.1,
        min_period_s: float = 0.02,
    ) -> None:
        self.runner = runner
        self.agent_id = agent_id
        self.has_session = has_session
        self.session_state = session_state or (lambda sid: "")
        self.telemetry = telemetry
        self.default_period_s = default_period_s
        self.min_period_s = min_period_s
        self.ledger = EpochLedger()

    # ------------------------------------------------------------------ shared machinery
    async def _once(self, method: str, session_id: str, epoch: int, work) -> pallas_pb2.ControlReply:
        """Run ``work()`` once per (method, session, epoch); retries share its reply."""
        led = self.ledger.get(session_id)
        key = (method, epoch)
        fut = led.replies.get(key)
        if fut is not None:
            reply = await asyncio.shield(fut)
            _log.info("control_retry", method=method, session=session_id, epoch=epoch,
                      status=_STATUS_NAME.get(reply.status))
            return reply
        fut = asyncio.get_running_loop().create_future()
        led.replies[key] = fut
        try:
            reply = await work()
        except Exception as e:  # noqa: BLE001 - internal failure is a reply, not a crash
            _log.exception("control_failed", method=method, session=session_id, epoch=epoch)
            reply = _reply(S.STATUS_ERROR, f"{method} failed: {e!r}; the source keeps serving",
                           session_id, epoch, state=self.session_state(session_id))
        if not fut.done():
            fut.set_result(reply)
        return reply

    def _check(self, method: str, session_id: str, epoch: int, *, allow_closed: tuple[str, ...] = ()) -> pallas_pb2.ControlReply | None:
        """Validate a call; returns a reply to send instead of doing work, or None.

        ``allow_closed``: how an epoch may already have been closed ("cancelled",
        "committed") for this call to go ahead; any other closed epoch is stale."""
        if not session_id:
            return _reply(S.STATUS_INVALID, "session_id is empty", session_id, epoch)
        led = self.ledger.get(session_id)
        if (method, epoch) in led.replies:
            return None  # a retry: the cached reply answers it
        if epoch < led.newest:
            return _reply(S.STATUS_STALE_EPOCH,
                          f"epoch {epoch} is older than the newest epoch {led.newest} seen for this session",
                          session_id, epoch, state=self.session_state(session_id))
        if epoch in led.closed and led.closed[epoch] not in allow_closed:
            return _reply(S.STATUS_STALE_EPOCH,
                          f"epoch {epoch} was already {led.closed[epoch]}; use a new epoch",
                          session_id, epoch, state=self.session_state(session_id))
        if not self.has_session(session_id):
            return _reply(S.STATUS_UNKNOWN_SESSION, f"agent {self.agent_id} does not serve session {session_id}",
                          session_id, epoch)
        return None

    def _done(self, method: str, reply: pallas_pb2.ControlReply, context) -> pallas_pb2.ControlReply:
        CONTROL_CALLS.labels(method, _STATUS_NAME.get(reply.status, str(reply.status))).inc()
        _log.info("control_reply", method=method, session=reply.session_id, epoch=reply.epoch,
                  status=_STATUS_NAME.get(reply.status), state=reply.state,
                  scheme=scheme_name(reply.scheme), split=reply.split_tokens, message=reply.message)
        return reply

    # ------------------------------------------------------------------ RPCs
    async def Trigger(self, request: pallas_pb2.TriggerRequest, context) -> pallas_pb2.ControlReply:
        """Start preparing ``request.session_id`` at ``request.target`` (epoch ``request.epoch``).

        ``split_tokens`` 0 lets the source choose the block-aligned split (floor(K/P)*P at the
        trigger, model.md section 3); a non-zero split must be a multiple of the block size and
        is passed on unchanged. Reactive baselines record the prediction and do nothing else.
        """
        sid, epoch = request.session_id, int(request.epoch)
        bad = self._check("trigger", sid, epoch)
        if bad is None and not _endpoint_ok(request.target):
            bad = _reply(S.STATUS_INVALID, "target endpoint is empty", sid, epoch)
        if bad is not None:
            return self._done("trigger", bad, context)

        async def work():
            led = self.ledger.get(sid)
            led.newest = max(led.newest, epoch)
            reply, scheme = await self.runner.trigger(sid, epoch, request.target, int(request.split_tokens),
                                                      request.scheme or None)
            _log.info("trigger", session=sid, epoch=epoch, peer=request.target.agent_id or request.target.address,
                      scheme=scheme_name(scheme), window_s=request.window_s,
                      t_ho=request.predicted_handover_time)
            if reply is None:
                return _reply(S.STATUS_OK, f"{scheme_name(scheme)} prepares nothing before the handover; recorded",
                              sid, epoch, state=self.session_state(sid), scheme=scheme)
            return _reply(int(getattr(reply, "status", S.STATUS_OK) or S.STATUS_OK),
                          getattr(reply, "message", "") or "triggered", sid, epoch,
                          state=getattr(reply, "state", "") or self.session_state(sid),
                          split_tokens=int(getattr(reply, "split_tokens", 0) or 0), scheme=scheme)

        return self._done("trigger", await self._once("trigger", sid, epoch, work), context)

    async def Cancel(self, request: pallas_pb2.CancelRequest, context) -> pallas_pb2.ControlReply:
        """Cancel the preparation of epoch ``request.epoch``: the target releases all it holds.

        Decoding at the source never stops. Cancelling an epoch with nothing prepared is OK
        (nothing to release)."""
        sid, epoch = request.session_id, int(request.epoch)
        bad = self._check("cancel", sid, epoch, allow_closed=("cancelled",))
        if bad is not None:
            return self._done("cancel", bad, context)

        async def work():
            led = self.ledger.get(sid)
            led.newest = max(led.newest, epoch)
            led.closed[epoch] = "cancelled"
            reply = await self.runner.cancel(sid, epoch, request.reason)
            status = int(getattr(reply, "status", S.STATUS_OK) or S.STATUS_OK) if reply is not None else S.STATUS_OK
            if status == S.STATUS_UNKNOWN_SESSION:
                status = S.STATUS_OK  # nothing was prepared for it: nothing to release
            msg = getattr(reply, "message", "") if reply is not None else ""
            return _reply(status, msg or f"epoch {epoch} cancelled ({request.reason or 'no reason given'})",
                          sid, epoch, state=self.session_state(sid))

        return self._done("cancel", await self._once("cancel", sid, epoch, work), context)

    async def Commit(self, request: pallas_pb2.CommitRequest, context) -> pallas_pb2.ControlReply:
        """Hand the session over to ``request.actual_target`` (the UE is on its cell now).

        The prepared path is used when the actual target is the prepared one at this epoch;
        otherwise the session is recovered by ctHO at the actual target, or by Detour when
        that target cannot serve the model (model.md sections 5-6). The reply's ``scheme`` is
        the scheme actually used."""
        sid, epoch = request.session_id, int(request.epoch)
        bad = self._check("commit", sid, epoch, allow_closed=("cancelled",))
        if bad is None and not _endpoint_ok(request.actual_target):
            bad = _reply(S.STATUS_INVALID, "actual_target endpoint is empty", sid, epoch)
        if bad is not None:
            return self._done("commit", bad, context)

        async def work():
            led = self.ledger.get(sid)
            led.newest = max(led.newest, epoch)
            t0 = time.perf_counter()
            out = await self.runner.commit(sid, epoch, request.actual_target, request.scheme or None)
            COMMIT_SECONDS.labels(scheme_name(out.scheme)).observe(time.perf_counter() - t0)
            if out.status == S.STATUS_OK:
                led.closed[epoch] = "committed"
            rep = _reply(out.status, out.message, sid, epoch, state=out.state,
                         split_tokens=out.split_tokens, scheme=out.scheme)
            if out.status == S.STATUS_OK and isinstance(out.reply, S.ControlReply):
                for f in COMMIT_MOVED_FIELDS:  # what the migration core says the handover moved
                    setattr(rep, f, getattr(out.reply, f))
            return rep

        return self._done("commit", await self._once("commit", sid, epoch, work), context)

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
