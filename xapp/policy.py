"""The xApp's side of the wire contract with the agents (``pallas.proto``, service Control).

- :class:`PolicyClient`: Trigger / Cancel / Commit to an agent's Control service over gRPC, with
  a deadline per attempt and retries with backoff on transient failures (UNAVAILABLE,
  DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED). Calls are idempotent by (kind, session, epoch): a call
  already answered is answered again from the cache and not sent twice (the agent is idempotent
  too, proto header). Calls to one agent are sent in order on one worker thread, so a Commit
  never overtakes the Trigger before it; the caller is never blocked (``submit`` returns a
  Future, the ``on_reply`` hook gets every outcome).
- :class:`TelemetryConsumer`: one thread per agent reading its Telemetry stream, reconnecting with
  backoff, handing each TelemetryReport to a callback (the scheduler's telemetry EWMAs).

The paper's §4.1 control loop: the xApp decides, the agents act. Times are seconds.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Mapping

import grpc
import structlog

from pallas_proto import pallas_pb2 as pb
from pallas_proto import pallas_pb2_grpc as pbg

log = structlog.get_logger("pallas.xapp.policy")

_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
              grpc.StatusCode.RESOURCE_EXHAUSTED}

SCHEMES: dict[str, int] = {
    "pallas": pb.SCHEME_PALLAS, "full-copy": pb.SCHEME_FULL_COPY, "recomputation": pb.SCHEME_RECOMPUTATION,
    "ctho": pb.SCHEME_CTHO, "detour": pb.SCHEME_DETOUR, "no-rc": pb.SCHEME_NO_RC, "no-sm": pb.SCHEME_NO_SM,
}
"""CLI/config scheme names to the proto's Scheme enum."""

PROACTIVE = {"pallas", "no-rc", "no-sm"}
"""Schemes that trigger before the handover; the others only commit (recover) after it."""


def scheme_value(name: str) -> int:
    """The Scheme enum value of a scheme name (case-insensitive; ``_`` same as ``-``).
    Raises ValueError with the valid names."""
    key = name.strip().lower().replace("_", "-")
    if key not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r}; one of {sorted(SCHEMES)}")
    return SCHEMES[key]


def scheme_name(value: int) -> str:
    for k, v in SCHEMES.items():
        if v == value:
            return k
    return "unspecified"


@dataclass(frozen=True)
class AgentEndpoint:
    """An edge server's agent: its id, its Control address (for the xApp) and its PeerTransfer
    address (what a source agent dials as the migration target)."""

    agent_id: str
    control_address: str
    peer_address: str

    def peer(self) -> pb.PeerEndpoint:
        return pb.PeerEndpoint(agent_id=self.agent_id, address=self.peer_address)


@dataclass
class CallOutcome:
    """What a policy call came to: the reply (None if it never got one), the error, attempts."""

    kind: str
    agent_id: str
    session_id: str
    epoch: int
    reply: pb.ControlReply | None
    error: str = ""
    attempts: int = 0
    latency_s: float = 0.0
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.reply is not None and self.reply.status == pb.STATUS_OK


class PolicyClient:
    """gRPC client to the agents' Control services.

    ``agents``: agent_id -> AgentEndpoint. ``deadline_s`` bounds one attempt of Trigger and
    Cancel, ``commit_deadline_s`` one attempt of Commit (a commit returns once the target has
    the session, which under Full-Copy means the whole cache crossed the link); ``retries`` extra
    attempts follow transient errors after ``backoff_s * 2**i`` (a retry is safe: the agents
    answer a repeated (call, session, epoch) with the first call's reply). ``on_reply(outcome)``
    is called on the agent's worker thread for every finished call. Unknown agent ids raise
    KeyError. ``channel_factory(address) -> grpc.Channel`` opens each agent's channel (default
    plaintext; mutual TLS: ``pallas_common.tls.open_channel(address, watcher)``).
    """

    def __init__(self, agents: Mapping[str, AgentEndpoint], *, deadline_s: float = 5.0,
                 commit_deadline_s: float = 60.0, retries: int = 3, backoff_s: float = 0.1,
                 on_reply: Callable[[CallOutcome], None] | None = None,
                 channel_factory: Callable[[str], grpc.Channel] = grpc.insecure_channel) -> None:
        self.channel_factory = channel_factory
        self.agents = dict(agents)
        self.deadline_s = deadline_s
        self.commit_deadline_s = commit_deadline_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.on_reply = on_reply
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, pbg.ControlStub] = {}
        self._workers: dict[str, ThreadPoolExecutor] = {}
        self._done: dict[tuple[str, str, int], CallOutcome] = {}
        self._lock = threading.Lock()

    def _stub(self, agent_id: str) -> pbg.ControlStub:
        with self._lock:
            if agent_id not in self._stubs:
                ep = self.agents[agent_id]
                ch = self.channel_factory(ep.control_address)
                self._channels[agent_id] = ch
                self._stubs[agent_id] = pbg.ControlStub(ch)
                self._workers[agent_id] = ThreadPoolExecutor(1, thread_name_prefix=f"policy-{agent_id}")
            return self._stubs[agent_id]

    def _call(self, kind: str, agent_id: str, request) -> CallOutcome:
        key = (kind, request.session_id, int(request.epoch))
        with self._lock:
            prev = self._done.get(key)
        if prev is not None and prev.reply is not None:
            out = CallOutcome(kind, agent_id, request.session_id, int(request.epoch), prev.reply, cached=True)
            return out
        stub = self._stub(agent_id)
        method = getattr(stub, kind)
        t0 = time.monotonic()
        err = ""
        for attempt in range(self.retries + 1):
            try:
                reply = method(request, timeout=self.commit_deadline_s if kind == "Commit" else self.deadline_s)
                out = CallOutcome(kind, agent_id, request.session_id, int(request.epoch), reply,
                                  attempts=attempt + 1, latency_s=time.monotonic() - t0)
                with self._lock:
                    self._done[key] = out
                return out
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else None
                err = f"{code}: {e.details() if hasattr(e, 'details') else e}"
                if code not in _TRANSIENT or attempt == self.retries:
                    break
                time.sleep(self.backoff_s * (2 ** attempt))
        log.warning("policy call failed", kind=kind, agent=agent_id, session=request.session_id,
                    epoch=int(request.epoch), error=err)
        return CallOutcome(kind, agent_id, request.session_id, int(request.epoch), None, err,
                           attempts=attempt + 1, latency_s=time.monotonic() - t0)

    def _submit(self, kind: str, agent_id: str, request) -> "Future[CallOutcome]":
        self._stub(agent_id)

        def run() -> CallOutcome:
            out = self._call(kind, agent_id, request)
            log.info("policy", kind=kind, agent=agent_id, session=out.session_id, epoch=out.epoch,
                     ok=out.ok, status=pb.Status.Name(out.reply.status) if out.reply else None,
                     error=out.error or None, latency_ms=round(out.latency_s * 1000, 1), cached=out.cached)
            if self.on_reply is not None:
                try:
                    self.on_reply(out)
                except Exception as e:  # a hook failure never stops the policy path
                    log.error("on_reply hook failed", error=repr(e))
            return out

        return self._workers[agent_id].submit(run)

    # --- the three orders (all return a Future of CallOutcome) -----------------------------
    def trigger(self, source_agent: str, session_id: str, epoch: int, target_agent: str, *,
                split_tokens: int = 0, predicted_handover_time: float = 0.0, scheme: str = "pallas",
                window_s: float = 0.0) -> "Future[CallOutcome]":
        """Trigger (architecture step 1) at the source agent: prepare ``target_agent`` for the
        session, with the block-aligned split (0: the source decides) and the chosen T_w*."""
        req = pb.TriggerRequest(session_id=session_id, epoch=epoch, target=self.agents[target_agent].peer(),
                                split_tokens=int(split_tokens), predicted_handover_time=float(predicted_handover_time),
                                scheme=scheme_value(scheme), window_s=float(window_s))
        return self._submit("Trigger", source_agent, req)

    def cancel(self, source_agent: str, session_id: str, epoch: int, reason: str = "") -> "Future[CallOutcome]":
        """Cancel epoch ``epoch`` of the session's migration (model.md section 5)."""
        return self._submit("Cancel", source_agent, pb.CancelRequest(session_id=session_id, epoch=epoch, reason=reason))

    def commit(self, source_agent: str, session_id: str, epoch: int, actual_target: str, *,
               scheme: str = "pallas", handover_time: float = 0.0) -> "Future[CallOutcome]":
        """Commit at the handover (architecture step 3); the actual target may differ from the
        prepared one, and with no trigger this asks for post-handover recovery under ``scheme``."""
        req = pb.CommitRequest(session_id=session_id, epoch=epoch, actual_target=self.agents[actual_target].peer(),
                               scheme=scheme_value(scheme), handover_time=float(handover_time))
        return self._submit("Commit", source_agent, req)

    def close(self) -> None:
        """Finish queued calls, then close the channels."""
        for w in list(self._workers.values()):
            w.shutdown(wait=True)
        for ch in list(self._channels.values()):
            ch.close()
        self._workers.clear()
        self._channels.clear()
        self._stubs.clear()


class TelemetryConsumer:
    """Reads each agent's Telemetry stream on its own thread and hands every report to
    ``on_report(agent_id, TelemetryReport)``; reconnects after ``retry_s`` on any error. ``stop``
    cancels the streams and joins the threads. ``channel_factory`` as :class:`PolicyClient`'s."""

    def __init__(self, agents: Mapping[str, AgentEndpoint], on_report: Callable[[str, pb.TelemetryReport], None],
                 *, period_ms: int = 200, retry_s: float = 0.5,
                 channel_factory: Callable[[str], grpc.Channel] = grpc.insecure_channel) -> None:
        self.channel_factory = channel_factory
        self.agents = dict(agents)
        self.on_report = on_report
        self.period_ms = period_ms
        self.retry_s = retry_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._calls: dict[str, object] = {}
        self.reports = 0

    def start(self) -> "TelemetryConsumer":
        for aid in self.agents:
            th = threading.Thread(target=self._run, args=(aid,), name=f"telemetry-{aid}", daemon=True)
            th.start()
            self._threads.append(th)
        return self

    def _run(self, agent_id: str) -> None:
        ep = self.agents[agent_id]
        while not self._stop.is_set():
            ch = self.channel_factory(ep.control_address)
            try:
                call = pbg.ControlStub(ch).Telemetry(pb.TelemetryRequest(period_ms=self.period_ms))
                self._calls[agent_id] = call
                for rep in call:
                    if self._stop.is_set():
                        break
                    self.reports += 1
                    try:
                        self.on_report(agent_id, rep)
                    except Exception as e:
                        log.error("telemetry handler failed", agent=agent_id, error=repr(e))
            except grpc.RpcError as e:
                if not self._stop.is_set():
                    log.debug("telemetry stream down", agent=agent_id, code=str(e.code()) if hasattr(e, "code") else "")
            finally:
                ch.close()
            self._stop.wait(self.retry_s)

    def stop(self) -> None:
        self._stop.set()
        for c in list(self._calls.values()):
            try:
                c.cancel()  # type: ignore[attr-defined]
            except Exception:
                pass
        for th in self._threads:
            th.join(timeout=2.0)
