"""RMR transport: the one seam between the xApp and the RIC's messaging.

Everything above this module sees only :class:`Transport` and :class:`RmrMessage`:

- :class:`RmrTransport` (live): the xApp's own bounded receive loop (:mod:`xapp.e2.rmrloop`)
  over OSC ricxappframe's RMR primitives (RMR C library ``librmr_si.so`` needed at run time,
  imported lazily on :meth:`RmrTransport.start`, so importing this module, and everything else
  in the xApp, works without it). The loop answers RIC_HEALTH_CHECK_REQ (100) itself with "OK";
  Pallas's callback receives RIC_INDICATION (12050), A1_POLICY_REQ (20010) and any other type,
  each stamped with its receipt time.
- :class:`TraceTransport` (test mode): replays a :mod:`xapp.e2.trace` file at recorded speed or
  as fast as possible; what the xApp sends is kept in ``sent`` instead of going anywhere.

Message types: ric-plt-lib-rmr ``RIC_message_types.h``.
"""

from __future__ import annotations

import os
import threading
import time as _time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

import structlog

from . import trace as _trace

log = structlog.get_logger("xapp.e2.transport")

RIC_HEALTH_CHECK_REQ = 100
RIC_HEALTH_CHECK_RESP = 101
RIC_SUB_REQ = 12010
RIC_SUB_RESP = 12011
RIC_SUB_DEL_REQ = 12020
RIC_INDICATION = 12050
A1_POLICY_REQ = 20010
A1_POLICY_RESP = 20011
A1_POLICY_QUERY = 20012

MTYPE_NAMES = {
    RIC_HEALTH_CHECK_REQ: "RIC_HEALTH_CHECK_REQ", RIC_HEALTH_CHECK_RESP: "RIC_HEALTH_CHECK_RESP",
    RIC_SUB_REQ: "RIC_SUB_REQ", RIC_SUB_RESP: "RIC_SUB_RESP", RIC_SUB_DEL_REQ: "RIC_SUB_DEL_REQ",
    RIC_INDICATION: "RIC_INDICATION", A1_POLICY_REQ: "A1_POLICY_REQ",
    A1_POLICY_RESP: "A1_POLICY_RESP", A1_POLICY_QUERY: "A1_POLICY_QUERY",
}


@dataclass(frozen=True, slots=True)
class RmrMessage:
    """A received RMR message.

    ``time``: receipt time, Unix s (the record's time in test mode). ``e2_node``: the RMR MEID
    (the E2 node's name for E2 messages, "" otherwise). ``handle``: the transport's own handle,
    valid only during the ``on_message`` call, for :meth:`Transport.rts`.
    """

    mtype: int
    payload: bytes
    sub_id: int = -1
    e2_node: str = ""
    time: float = 0.0
    handle: Any = field(default=None, compare=False, repr=False)


class Transport(Protocol):
    """What the xApp needs from RMR.

    ``start(on_message)``: begin delivering received messages to ``on_message``, one at a time
    from one thread; ``on_message`` must not raise (a transport logs and swallows if it does).
    ``send(mtype, payload, sub_id)``: route a message by type (and sub id); True if sent.
    ``rts(msg, mtype, payload)``: return-to-sender a reply to ``msg``; only valid inside the
    ``on_message`` call that delivered ``msg``; True if sent.
    ``stop()``: stop delivering and release the transport; idempotent.
    """

    def start(self, on_message: Callable[[RmrMessage], None]) -> None:
        """Begin delivering received messages to ``on_message`` (see the class docstring)."""

    def send(self, mtype: int, payload: bytes, sub_id: int = -1) -> bool:
        """Route ``payload`` as RMR message type ``mtype`` (and ``sub_id``); True if sent."""

    def rts(self, msg: RmrMessage, mtype: int, payload: bytes) -> bool:
        """Return-to-sender a reply to ``msg`` (inside its ``on_message`` call); True if sent."""

    def stop(self) -> None:
        """Stop delivering and release the transport; idempotent."""


def _safe(on_message: Callable[[RmrMessage], None], msg: RmrMessage) -> None:
    try:
        on_message(msg)
    except Exception as e:  # noqa: BLE001 - a handler bug must not stop message delivery
        log.error("rmr_handler_failed", mtype=msg.mtype, error=f"{type(e).__name__}: {e}")


class RmrTransport:
    """Live transport: the xApp's own bounded RMR receive loop (:class:`xapp.e2.rmrloop.RmrReceiver`)
    over ricxappframe 3.2.2's RMR primitives, and ricxappframe's framework for the rest (SDL,
    the R-NIB's ``GetNodeb``, appmgr registration, ``rmr_send``/``rmr_rts``) without its
    ``RmrLoop`` (whose ``rmr_rcvall_msgs_raw`` stalls under a continuous inflow, issue 28).

    ``rmr_port``: RMR data port (4560 in the descriptor). ``use_fake_sdl``: SDL in memory.
    ``wait_for_ready``: block start() until RMR has a route table. ``rmr_timeout_s``: the
    longest a receive waits when nothing arrives (the loop's stop latency). The receive loop's
    bounds (``queue_size``, ``batch``, ``handle_max``, ``handle_budget_s``, ``shed_after_s``,
    ``control_queue_size``, ``defer_max_s``) and ``clock`` (receipt times, Unix s) are
    :class:`~xapp.e2.rmrloop.RmrReceiver`'s. ``registry``: a
    prometheus-client registry the loop's metrics are registered with (None: none).
    RIC_HEALTH_CHECK_REQ (100) is answered by the loop itself (``OK`` while the loop runs and
    SDL answers). ``defer`` (set before :meth:`start`; None: never): the receive loop holds
    indications back while it says a decision cycle runs (``RmrReceiver``'s ``defer``; the
    xApp sets it). ``tap`` (set before :meth:`start`; None: none): called with each message the
    loop hands to the xApp, just before the xApp's handler (``pallas-xapp --record``,
    ``xapp.e2.record``). Raises OSError from start() when librmr_si.so is missing, and
    ``ricxappframe.rmr.exceptions.InitFailed`` when RMR cannot start (port taken).
    """

    def __init__(self, rmr_port: int = 4560, use_fake_sdl: bool = False, wait_for_ready: bool = True,
                 rmr_timeout_s: float = 0.1, *, queue_size: int = 8192, batch: int = 512,
                 handle_max: int = 32, handle_budget_s: float = 0.005, shed_after_s: float = 1.0,
                 control_queue_size: int = 256, registry: Any = None,
                 clock: Callable[[], float] = _time.time, defer_max_s: float = 0.02) -> None:
        self.rmr_port = rmr_port
        self.use_fake_sdl = use_fake_sdl
        self.wait_for_ready = wait_for_ready
        self.rmr_timeout_s = rmr_timeout_s
        self.bounds = dict(queue_size=queue_size, batch=batch, handle_max=handle_max,
                           handle_budget_s=handle_budget_s, shed_after_s=shed_after_s,
                           control_queue_size=control_queue_size, clock=clock, defer_max_s=defer_max_s)
        self.registry = registry
        self.xapp: Any = None          # the framework: SDL, GetNodeb, rmr_send, rmr_rts
        self.receiver: Any = None      # xapp.e2.rmrloop.RmrReceiver
        self.mrc: Any = None
        self.defer: Callable[[], bool] | None = None
        self.tap: Callable[[RmrMessage], None] | None = None
        self._sdl_ok = (0.0, True)

    def healthy(self) -> bool:
        """The receive loop runs (a round began within 5 s) and SDL answers (checked at most
        once a second)."""
        if self.receiver is None or not self.receiver.alive():
            return False
        at, ok = self._sdl_ok
        now = _time.monotonic()
        if now - at >= 1.0 and self.xapp is not None:
            try:
                ok = bool(self.xapp.sdl.healthcheck())
            except Exception:  # noqa: BLE001 - an SDL that cannot answer is unhealthy
                ok = False
            self._sdl_ok = (now, ok)
        return ok

    def start(self, on_message: Callable[[RmrMessage], None]) -> None:
        """Start RMR (``rmr_init``, multi-threaded receive), wait for a route table when asked,
        then the framework (SDL, registration) and the receive loop's threads."""
        from ricxappframe.rmr import rmr  # lazy: needs librmr_si.so
        from .rmrloop import RmrReceiver

        self.mrc = rmr.rmr_init(str(self.rmr_port).encode(), rmr.RMR_MAX_RCV_BYTES, rmr.RMRFL_MTCALL)
        if self.wait_for_ready:
            while rmr.rmr_ready(self.mrc) == 0:
                _time.sleep(0.1)
        tap = self.tap
        handle = (lambda m: _safe(on_message, m)) if tap is None else (lambda m: (_safe(tap, m), _safe(on_message, m)))
        self.receiver = RmrReceiver(self.mrc, handle, message=RmrMessage,
                                    healthy=self.healthy, defer=self.defer,
                                    wait_ms=max(1, int(self.rmr_timeout_s * 1000)), **self.bounds)
        self.xapp = _framework(self.receiver, self.mrc, self.use_fake_sdl)
        if self.registry is not None:
            self.registry.register(self.receiver)
        self.receiver.start()

    def send(self, mtype: int, payload: bytes, sub_id: int = -1) -> bool:
        """rmr_send by message type. The RMR sub id of a fresh buffer is -1 (ricxappframe's
        rmr_send sets none); ``sub_id`` != -1 is logged and sent without it."""
        if self.xapp is None:
            raise RuntimeError("RmrTransport.send before start")
        if sub_id != -1:
            log.warning("rmr_send_sub_id_ignored", mtype=mtype, sub_id=sub_id)
        return bool(self.xapp.rmr_send(payload, mtype))

    def rts(self, msg: RmrMessage, mtype: int, payload: bytes) -> bool:
        """Return to sender with a new type and payload (e.g. A1_POLICY_RESP)."""
        if self.xapp is None or msg.handle is None:
            raise RuntimeError("rts needs the message being handled")
        return bool(self.xapp.rmr_rts(msg.handle, new_payload=payload, new_mtype=mtype))

    def stop(self) -> None:
        """Deregister from appmgr (when registered), stop the receive loop, close RMR; idempotent."""
        if self.xapp is None:
            return
        xapp, self.xapp = self.xapp, None
        try:
            xapp.xapp_shutdown()
        except Exception as e:  # noqa: BLE001 - the loop still stops
            log.error("rmr_deregister_failed", error=repr(e))
        self.receiver.stop()          # its metrics stay on the registry, frozen
        from ricxappframe.rmr import rmr
        rmr.rmr_close(self.mrc)


def _framework(receiver: Any, mrc: Any, use_fake_sdl: bool) -> Any:
    """ricxappframe's ``_BaseXapp`` services (SDL, R-NIB reads such as ``GetNodeb``,
    ``rmr_send``/``rmr_rts``/``rmr_free``, appmgr registration when ``$CONFIG_FILE`` names a
    file) on the RMR context ``mrc``, without the ``RmrLoop`` its constructor would start:
    ``receiver`` (an :class:`~xapp.e2.rmrloop.RmrReceiver`) receives instead. Built on
    ricxappframe 3.2.2's attributes (the version pyproject pins)."""
    import json
    from mdclogpy import Logger
    from ricxappframe.util.constants import Constants
    from ricxappframe.xapp_frame import _BaseXapp
    from ricxappframe.xapp_sdl import SDLWrapper

    class _Loop:                      # what _BaseXapp reads of its RmrLoop
        def __init__(self) -> None:
            self.mrc = mrc

        def healthcheck(self, seconds: float = 30) -> bool:
            return receiver.alive(stall_s=seconds)

        def stop(self) -> None:
            receiver.stop()

    class Framework(_BaseXapp):
        def __init__(self) -> None:   # deliberately not _BaseXapp.__init__ (it starts RmrLoop)
            self.logger = Logger(name="pallas.xapp.rmr")
            self._rmr_loop = _Loop()
            self._mrc = mrc
            self.sdl = SDLWrapper(use_fake_sdl)
            self._config_path = os.environ.get(Constants.CONFIG_FILE_ENV, None)
            self._inotify = None
            self._config_data = {}
            if self._config_path and os.path.isfile(self._config_path):
                with open(self._config_path) as f:
                    self._config_data = json.load(f)
            self._keep_registration = bool(self._config_data)
            self.registered = self._keep_registration
            threading.Thread(target=self.registerXapp, name="appmgr-register", daemon=True).start()
            self._appthread = None

        def xapp_shutdown(self) -> None:
            """Deregister and wait for appmgr (ricxappframe's, 10 s) only when registration ran."""
            self._keep_registration = False
            if self.registered:
                super().xapp_shutdown()

    return Framework()


class TraceTransport:
    """Test-mode transport: replays trace records as RmrMessages.

    ``source``: a trace file path (str or os.PathLike) or an iterable of TraceRecords. ``speed``: None/0 = as fast as
    possible, 1.0 = recorded speed. ``threaded``: False (default) makes start() replay in the
    calling thread and return at the end; True replays in a thread (:meth:`wait` joins it).
    Sent and returned messages are appended to ``sent`` as (mtype, payload, sub_id).
    ``delivered`` counts the records delivered; a trace file that turns out damaged
    (:class:`~xapp.e2.trace.TraceFormatError`) or unreadable ends the replay with the reason
    logged and kept in ``error`` (None otherwise); nothing raises from the replay.
    """

    def __init__(self, source: str | os.PathLike | Iterable[_trace.TraceRecord], speed: float | None = None,
                 threaded: bool = False, clock: Callable[[], float] = _time.monotonic,
                 sleep: Callable[[float], None] = _time.sleep) -> None:
        self.source = source
        self.speed = speed
        self.threaded = threaded
        self.clock = clock
        self.sleep = sleep
        self.sent: list[tuple[int, bytes, int]] = []
        self.delivered = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _run(self, on_message: Callable[[RmrMessage], None]) -> None:
        records = (_trace.read_trace(self.source) if isinstance(self.source, (str, os.PathLike))
                   else self.source)

        self.delivered = 0

        def deliver(r: _trace.TraceRecord) -> None:
            _safe(on_message, RmrMessage(r.mtype, r.payload, r.sub_id, r.e2_node, r.time, handle=r))
            self.delivered += 1

        try:
            _trace.replay(records, deliver, self.speed, self.clock, self.sleep, self._stop.is_set)
        except (_trace.TraceFormatError, OSError) as e:
            # A damaged or unreadable trace ends the replay; what came before it was delivered.
            self.error = f"{type(e).__name__}: {e}"
            log.error("trace_replay_stopped", source=str(self.source), reason=self.error,
                      delivered=self.delivered)

    def start(self, on_message: Callable[[RmrMessage], None]) -> None:
        """Replay the trace to ``on_message``: in this thread (returns at the end) or, when
        ``threaded``, in a daemon thread (returns at once; :meth:`wait` joins it)."""
        if self.threaded:
            self._thread = threading.Thread(target=self._run, args=(on_message,), name="trace-replay", daemon=True)
            self._thread.start()
        else:
            self._run(on_message)

    def wait(self, timeout: float | None = None) -> bool:
        """Join a threaded replay; True when it has finished."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def send(self, mtype: int, payload: bytes, sub_id: int = -1) -> bool:
        """Record ``(mtype, payload, sub_id)`` in :attr:`sent`; always True."""
        with self._lock:
            self.sent.append((mtype, bytes(payload), sub_id))
        return True

    def rts(self, msg: RmrMessage, mtype: int, payload: bytes) -> bool:
        """Record the reply in :attr:`sent` with ``msg``'s sub id; always True."""
        return self.send(mtype, payload, msg.sub_id)

    def stop(self) -> None:
        """Stop the replay after the message being delivered; joins a replay thread (5 s)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
