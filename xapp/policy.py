"""The xApp's side of the wire contract with the agents (``pallas.proto``, service Control).

- :class:`PolicyClient`: Trigger / Cancel / Commit to an agent's Control service over gRPC, with
  a deadline per attempt and retries with backoff on transient failures (UNAVAILABLE,
  DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED). Calls are idempotent by (kind, agent, session, epoch): a call
  already answered is answered again from the cache and not sent twice (the agent is idempotent
  too, proto header). Calls of one session are sent in order (a Commit never overtakes the
  Trigger before it), calls of different sessions run at once on a shared pool, so a 60 s
  Commit never delays another session's calls to the same agent; the caller is never blocked
  (each order returns a Future, the ``on_reply`` hook gets every outcome). The reply cache is
  bounded (least recently used out) and a session's entries go when it is forgotten.
- :class:`TelemetryConsumer`: one thread per agent reading its Telemetry stream, reconnecting with
  backoff, handing each TelemetryReport to a callback (the scheduler's telemetry EWMAs).

Both follow the descriptor's agents (:meth:`PolicyClient.set_agents`,
:meth:`TelemetryConsumer.set_agents`): a new agent is dialled, a removed one closed, and one
whose address changed is closed and dialled at its new address.

The paper's §4.1 control loop: the xApp decides, the agents act. Times are seconds.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Callable, Mapping

import grpc
import structlog

from pallas_common import schemes
from pallas_common.msglimits import control_limits
from pallas_proto import pallas_pb2 as pb
from pallas_proto import pallas_pb2_grpc as pbg
from xapp.scheduler.state import Action, CancelAction, CommitAction, TriggerAction

log = structlog.get_logger("pallas.xapp.policy")

# Per-RPC message limits of Control (pallas_common.msglimits): small orders and replies, larger
# Telemetry reports; gRPC refuses a larger message (RESOURCE_EXHAUSTED).
_CONTROL_OPTIONS = control_limits().channel_options()

_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
              grpc.StatusCode.RESOURCE_EXHAUSTED}

def scheme_value(name: str) -> int:
    """The Scheme enum value of a scheme name (case-insensitive; ``_`` same as ``-``), through
    the one vocabulary (:func:`pallas_common.schemes.scheme_value`).

    Raises:
        ValueError: an empty or unknown name, with the valid names.
    """
    if not name or not name.strip():
        raise ValueError(f"unknown scheme {name!r}; one of {sorted(schemes.NAMES)}")
    return schemes.scheme_value(name)


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
    """What a policy call came to: the reply (None if it never got one), the error, attempts.
    ``target``: the agent a Trigger prepares (one epoch may prepare several: issue 45) or a
    targeted Cancel withdraws, else ""."""

    kind: str
    agent_id: str
    session_id: str
    epoch: int
    reply: pb.ControlReply | None
    error: str = ""
    attempts: int = 0
    latency_s: float = 0.0
    cached: bool = False
    target: str = ""

    @property
    def ok(self) -> bool:
        return self.reply is not None and self.reply.status == pb.STATUS_OK


def _target_of(kind: str, request) -> str:
    """The target agent a call names, as its outcome and its reply cache key it: a Trigger's
    target, a targeted Cancel's (``CancelRequest.target``, issue 45: Cancels of one epoch at
    different targets, and the epoch's untargeted Cancel, are different calls); "" otherwise."""
    if kind == "Trigger" or (kind == "Cancel" and request.HasField("target")):
        return request.target.agent_id
    return ""


class PolicyClient:
    """gRPC client to the agents' Control services.

    ``agents``: agent_id -> AgentEndpoint. ``deadline_s`` bounds one attempt of Trigger and
    Cancel, ``commit_deadline_s`` one attempt of Commit (a commit returns once the target has
    the session, which under Full-Copy means the whole cache crossed the link); ``retries`` extra
    attempts follow transient errors after ``backoff_s * 2**i`` (a retry is safe: the agents
    answer a repeated (call, session, epoch) with the first call's reply). ``on_reply(outcome)``
    is called on a pool thread for every finished call. ``workers``: calls in flight at once
    (all agents together); ``cache_size``: answered calls remembered; ``close_wait_s``: the
    longest :meth:`close` waits for queued calls (s). Unknown agent ids raise
    KeyError. ``channel_factory(address, options=...) -> grpc.Channel`` opens each agent's
    channel with Control's per-RPC message limits (default
    plaintext; mutual TLS: ``pallas_common.tls.LinkSecurity.channel``).
    """

    def __init__(self, agents: Mapping[str, AgentEndpoint], *, deadline_s: float = 5.0,
                 commit_deadline_s: float = 60.0, retries: int = 3, backoff_s: float = 0.1,
                 on_reply: Callable[[CallOutcome], None] | None = None, workers: int = 32,
                 cache_size: int = 4096, close_wait_s: float = 10.0,
                 channel_factory: Callable[[str], grpc.Channel] = grpc.insecure_channel) -> None:
        self.channel_factory = channel_factory
        self.close_wait_s = float(close_wait_s)
        self.agents = dict(agents)
        self.deadline_s = deadline_s
        self.commit_deadline_s = commit_deadline_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.on_reply = on_reply
        self.cache_size = cache_size
        self._channels: dict[str, tuple[str, grpc.Channel, pbg.ControlStub]] = {}
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="policy")
        self._tails: dict[str, Future] = {}       # session -> its last call's Future
        # (kind, agent, session, epoch, the target named: _target_of) -> outcome: the same order
        # sent to two agents (a Cancel at the source and at the target) is two calls, each
        # answered by its agent; Triggers (and targeted Cancels) of one epoch at several targets
        # (issue 45) are one call each.
        self._done: OrderedDict[tuple[str, str, str, int, str], CallOutcome] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    def set_agents(self, agents: Mapping[str, AgentEndpoint]) -> None:
        """Follow a new agent map: channels of removed agents, and of agents whose Control
        address changed, are closed (the next call dials the new address)."""
        with self._lock:
            self.agents = dict(agents)
            for aid in list(self._channels):
                ep = self.agents.get(aid)
                if ep is None or ep.control_address != self._channels[aid][0]:
                    self._channels.pop(aid)[1].close()

    def _stub(self, agent_id: str) -> pbg.ControlStub:
        with self._lock:
            if self._closed:
                raise ValueError("the policy client is closed")
            ep = self.agents[agent_id]
            ch = self._channels.get(agent_id)
            if ch is None:
                channel = self.channel_factory(ep.control_address, options=_CONTROL_OPTIONS)
                ch = self._channels[agent_id] = (ep.control_address, channel, pbg.ControlStub(channel))
            return ch[2]

    def forget_session(self, session_id: str) -> None:
        """Drop the cached replies of a session that ended."""
        with self._lock:
            for key in [k for k in self._done if k[2] == session_id]:
                del self._done[key]

    def _call(self, kind: str, agent_id: str, request) -> CallOutcome:
        target = _target_of(kind, request)
        key = (kind, agent_id, request.session_id, int(request.epoch), target)
        with self._lock:
            prev = self._done.get(key)
        if prev is not None and prev.reply is not None:
            out = CallOutcome(kind, agent_id, request.session_id, int(request.epoch), prev.reply, cached=True,
                              target=target)
            return out
        t0 = time.monotonic()
        err = ""
        for attempt in range(self.retries + 1):
            try:
                method = getattr(self._stub(agent_id), kind)
                reply = method(request, timeout=self.commit_deadline_s if kind == "Commit" else self.deadline_s)
                out = CallOutcome(kind, agent_id, request.session_id, int(request.epoch), reply,
                                  attempts=attempt + 1, latency_s=time.monotonic() - t0, target=target)
                with self._lock:
                    self._done[key] = out
                    while len(self._done) > self.cache_size:
                        self._done.popitem(last=False)
                return out
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else None
                err = f"{code}: {e.details() if hasattr(e, 'details') else e}"
                if code not in _TRANSIENT or attempt == self.retries:
                    break
                time.sleep(self.backoff_s * (2 ** attempt))
            except ValueError as e:  # a channel closed under the call by an address change
                err = f"channel closed: {e}"
                if attempt == self.retries or self._closed:
                    break
        log.warning("policy call failed", kind=kind, agent=agent_id, session=request.session_id,
                    epoch=int(request.epoch), error=err)
        return CallOutcome(kind, agent_id, request.session_id, int(request.epoch), None, err,
                           attempts=attempt + 1, latency_s=time.monotonic() - t0, target=target)

    def _submit(self, kind: str, agent_id: str, request) -> "Future[CallOutcome]":
        if agent_id not in self.agents:
            raise KeyError(agent_id)
        sid = request.session_id
        done: Future = Future()

        def run() -> None:
            out = None
            try:
                out = self._call(kind, agent_id, request)
                log.info("policy", kind=kind, agent=agent_id, session=out.session_id, epoch=out.epoch,
                         ok=out.ok, status=pb.Status.Name(out.reply.status) if out.reply else None,
                         error=out.error or None, latency_ms=round(out.latency_s * 1000, 1),
                         cached=out.cached)
                if self.on_reply is not None:
                    try:
                        self.on_reply(out)
                    except Exception as e:  # a hook failure never stops the policy path
                        log.error("on_reply hook failed", error=repr(e))
            except Exception as e:   # a fault here must still end the Future (close waits on it)
                log.error("policy call failed", kind=kind, agent=agent_id, error=repr(e))
                if out is None:
                    out = CallOutcome(kind, agent_id, sid, int(request.epoch), None, repr(e),
                                      target=_target_of(kind, request))
            finally:
                with self._lock:
                    if self._tails.get(sid) is done:
                        del self._tails[sid]
                done.set_result(out)

        def start(_: object = None) -> None:
            try:
                self._pool.submit(run)
            except RuntimeError as e:   # the pool is shut down: the call is not made
                done.set_result(CallOutcome(kind, agent_id, sid, int(request.epoch), None, str(e),
                                            target=_target_of(kind, request)))

        with self._lock:
            prev = self._tails.get(sid)
            self._tails[sid] = done
        if prev is None:
            start()
        else:
            prev.add_done_callback(start)   # after the session's previous call, in order
        return done

    # --- the three orders (all return a Future of CallOutcome) -----------------------------
    def send(self, action: Action) -> "Future[CallOutcome]":
        """Send one Scheduler Engine action to its source agent's Control service as it was
        built: the RPC its kind names (``action.rpc``), the request its ``to_proto`` makes (with
        the PeerTransfer address, from this client's agent map, of the agent its
        ``peer_field`` names).

        Raises:
            KeyError: the source or the peer is not a configured agent.
            TypeError: not a Scheduler Engine action.
        """
        rpc = getattr(action, "rpc", None)
        if rpc not in ("Trigger", "Cancel", "Commit"):
            raise TypeError(f"not a Scheduler Engine action: {action!r}")
        peer = action.peer_field
        request = action.to_proto(self.agents[getattr(action, peer)].peer_address) if peer else action.to_proto()
        return self._submit(rpc, action.source, request)

    def trigger(self, source_agent: str, session_id: str, epoch: int, target_agent: str, *,
                split_tokens: int = 0, predicted_handover_time: float = 0.0, scheme: str = schemes.PALLAS,
                window_s: float = 0.0) -> "Future[CallOutcome]":
        """Trigger (docs/architecture.md step 1) at the source agent by hand: prepare
        ``target_agent`` for the session, with the block-aligned split (0: the source decides)
        and T_w*. The xApp's own orders go through :meth:`send`."""
        return self.send(TriggerAction(
            session_id=session_id, epoch=epoch, source=source_agent, target=target_agent,
            predicted_handover_time=float(predicted_handover_time), window_s=float(window_s),
            predicted_split_tokens=int(split_tokens), scheme=scheme_value(scheme), split_tokens=int(split_tokens)))

    def cancel(self, source_agent: str, session_id: str, epoch: int, reason: str = "") -> "Future[CallOutcome]":
        """Cancel epoch ``epoch`` of the session's migration (docs/model.md §5)."""
        return self.send(CancelAction(session_id=session_id, epoch=epoch, source=source_agent, target="",
                                      reason=reason))

    def commit(self, source_agent: str, session_id: str, epoch: int, actual_target: str, *,
               scheme: str = schemes.PALLAS, handover_time: float = 0.0) -> "Future[CallOutcome]":
        """Commit at the handover (docs/architecture.md step 3) by hand; the actual target may
        differ from the prepared one, and with no trigger this asks for post-handover recovery
        under ``scheme``."""
        return self.send(CommitAction(session_id=session_id, epoch=epoch, source=source_agent,
                                      actual_target=actual_target, prepared_target=None,
                                      scheme=scheme_value(scheme), handover_time=float(handover_time)))

    def close(self) -> None:
        """Finish queued calls for at most ``close_wait_s`` (a shutdown's share: a Commit may
        wait 60 s per attempt; what is cut short is in the migration journal, which the next
        start recovers), then close the channels: calls not started by then are not made, the
        ones in flight end CANCELLED and are not retried."""
        end = time.monotonic() + self.close_wait_s
        while True:
            with self._lock:
                tails = list(self._tails.values())
            if not tails:
                break
            try:
                for f in tails:
                    f.result(max(0.0, end - time.monotonic()))
            except FutureTimeout:
                log.warning("policy calls cut short at close", sessions=len(tails), waited_s=self.close_wait_s)
                break
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._closed = True
            for _, ch, _ in self._channels.values():
                ch.close()
            self._channels.clear()


class TelemetryConsumer:
    """Reads each agent's Telemetry stream on its own thread and hands every report to
    ``on_report(agent_id, TelemetryReport)``; reconnects after ``retry_s`` on any error.
    :meth:`set_agents` follows a new agent map (streams started, stopped, or restarted at a new
    address); ``stop`` cancels the streams and joins the threads."""

    def __init__(self, agents: Mapping[str, AgentEndpoint], on_report: Callable[[str, pb.TelemetryReport], None],
                 *, period_ms: int = 200, retry_s: float = 0.5,
                 channel_factory: Callable[[str], grpc.Channel] = grpc.insecure_channel) -> None:
        self.channel_factory = channel_factory
        self.agents = dict(agents)
        self.on_report = on_report
        self.period_ms = period_ms
        self.retry_s = retry_s
        self._stop = threading.Event()
        self._started = False
        self._lock = threading.Lock()
        # agent -> (endpoint, its stop event, its thread, its call holder)
        self._streams: dict[str, tuple[AgentEndpoint, threading.Event, threading.Thread, list]] = {}
        self.reports = 0

    def start(self) -> "TelemetryConsumer":
        with self._lock:
            self._started = True
            for aid, ep in self.agents.items():
                self._open(aid, ep)
        return self

    def _open(self, agent_id: str, ep: AgentEndpoint) -> None:
        stop, holder = threading.Event(), []
        th = threading.Thread(target=self._run, args=(agent_id, ep, stop, holder),
                              name=f"telemetry-{agent_id}", daemon=True)
        self._streams[agent_id] = (ep, stop, th, holder)
        th.start()

    def _close(self, agent_id: str) -> threading.Thread:
        _, stop, th, holder = self._streams.pop(agent_id)
        stop.set()
        for c in list(holder):
            try:
                c.cancel()
            except Exception:
                pass
        return th

    def set_agents(self, agents: Mapping[str, AgentEndpoint]) -> list[str]:
        """Follow a new agent map; returns the agents whose stream was (re)started."""
        opened, closing = [], []
        with self._lock:
            self.agents = dict(agents)
            if not self._started:
                return []
            for aid in list(self._streams):
                ep = self.agents.get(aid)
                if ep is None or ep.control_address != self._streams[aid][0].control_address:
                    closing.append(self._close(aid))
            for aid, ep in self.agents.items():
                if aid not in self._streams:
                    self._open(aid, ep)
                    opened.append(aid)
        for th in closing:
            th.join(timeout=2.0)
        return opened

    @property
    def streams(self) -> dict[str, str]:
        """agent id -> the Control address its stream reads."""
        with self._lock:
            return {aid: s[0].control_address for aid, s in self._streams.items()}

    def _run(self, agent_id: str, ep: AgentEndpoint, stop: threading.Event, holder: list) -> None:
        while not (stop.is_set() or self._stop.is_set()):
            ch = self.channel_factory(ep.control_address, options=_CONTROL_OPTIONS)
            try:
                call = pbg.ControlStub(ch).Telemetry(pb.TelemetryRequest(period_ms=self.period_ms))
                holder[:] = [call]
                for rep in call:
                    if stop.is_set() or self._stop.is_set():
                        break
                    self.reports += 1
                    try:
                        self.on_report(agent_id, rep)
                    except Exception as e:
                        log.error("telemetry handler failed", agent=agent_id, error=repr(e))
            except grpc.RpcError as e:
                if not (stop.is_set() or self._stop.is_set()):
                    log.debug("telemetry stream down", agent=agent_id, code=str(e.code()) if hasattr(e, "code") else "")
            finally:
                ch.close()
            stop.wait(self.retry_s)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            threads = [self._close(aid) for aid in list(self._streams)]
        for th in threads:
            th.join(timeout=2.0)
