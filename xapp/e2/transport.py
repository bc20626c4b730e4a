"""RMR transport: the one seam between the xApp and the RIC's messaging.

Everything above this module sees only :class:`Transport` and :class:`RmrMessage`:

- :class:`RmrTransport` (live): OSC ricxappframe's ``RMRXapp`` (RMR C library ``librmr_si.so``
  needed at run time, imported lazily on :meth:`RmrTransport.start`, so importing this module,
  and everything else in the xApp, works without it). RMRXapp answers RIC_HEALTH_CHECK_REQ (100)
  itself with "OK"; Pallas's callback receives RIC_INDICATION (12050), A1_POLICY_REQ (20010)
  and any other type.
- :class:`TraceTransport` (test mode): replays a :mod:`xapp.e2.trace` file at recorded speed or
  as fast as possible; what the xApp sends is kept in ``sent`` instead of going anywhere.

Message types: ric-plt-lib-rmr ``RIC_message_types.h``.
"""

from __future__ import annotations

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

    def start(self, on_message: Callable[[RmrMessage], None]) -> None: ...

    def send(self, mtype: int, payload: bytes, sub_id: int = -1) -> bool: ...

    def rts(self, msg: RmrMessage, mtype: int, payload: bytes) -> bool: ...

    def stop(self) -> None: ...


def _safe(on_message: Callable[[RmrMessage], None], msg: RmrMessage) -> None:
    try:
        on_message(msg)
    except Exception as e:  # noqa: BLE001 - a handler bug must not stop message delivery
        log.error("rmr_handler_failed", mtype=msg.mtype, error=f"{type(e).__name__}: {e}")


class RmrTransport:
    """Live transport over ricxappframe 3.2.2's ``RMRXapp`` (threaded dispatch loop).

    ``rmr_port``: RMR data port (4560 in the descriptor). ``use_fake_sdl``: SDL in memory.
    ``wait_for_ready``: block start() until RMR has a route table. Raises OSError from
    start() when librmr_si.so is missing.
    """

    def __init__(self, rmr_port: int = 4560, use_fake_sdl: bool = False, wait_for_ready: bool = True,
                 rmr_timeout_s: int = 1) -> None:
        self.rmr_port = rmr_port
        self.use_fake_sdl = use_fake_sdl
        self.wait_for_ready = wait_for_ready
        self.rmr_timeout_s = rmr_timeout_s
        self.xapp: Any = None
        self._on_message: Callable[[RmrMessage], None] | None = None

    def _dispatch(self, xapp: Any, summary: dict, sbuf: Any) -> None:
        from ricxappframe.rmr import rmr  # lazy: needs librmr_si.so
        try:
            meid = summary.get(rmr.RMR_MS_MEID) or b""  # rmr_get_meid gives bytes
            msg = RmrMessage(
                mtype=summary[rmr.RMR_MS_MSG_TYPE], payload=bytes(summary[rmr.RMR_MS_PAYLOAD] or b""),
                sub_id=summary.get(rmr.RMR_MS_SUB_ID, -1),
                e2_node=meid.decode("utf-8", "replace") if isinstance(meid, bytes) else str(meid),
                time=_time.time(), handle=sbuf)
            if self._on_message is not None:
                _safe(self._on_message, msg)
        except Exception as e:  # noqa: BLE001 - never kill RMRXapp's loop thread
            log.error("rmr_dispatch_failed", error=f"{type(e).__name__}: {e}")
        finally:
            xapp.rmr_free(sbuf)

    def start(self, on_message: Callable[[RmrMessage], None]) -> None:
        """Create the RMRXapp, register the callbacks and run its loop in a thread."""
        from ricxappframe.xapp_frame import RMRXapp  # lazy: needs librmr_si.so
        self._on_message = on_message
        self.xapp = RMRXapp(self._dispatch, rmr_port=self.rmr_port, use_fake_sdl=self.use_fake_sdl,
                            rmr_wait_for_ready=self.wait_for_ready)
        for mtype in (RIC_INDICATION, A1_POLICY_REQ):
            self.xapp.register_callback(self._dispatch, mtype)
        self.xapp.run(thread=True, rmr_timeout=self.rmr_timeout_s)

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
        if self.xapp is not None:
            self.xapp.stop()
            self.xapp = None


class TraceTransport:
    """Test-mode transport: replays trace records as RmrMessages.

    ``source``: a trace file path or an iterable of TraceRecords. ``speed``: None/0 = as fast as
    possible, 1.0 = recorded speed. ``threaded``: False (default) makes start() replay in the
    calling thread and return at the end; True replays in a thread (:meth:`wait` joins it).
    Sent and returned messages are appended to ``sent`` as (mtype, payload, sub_id).
    """

    def __init__(self, source: str | Iterable[_trace.TraceRecord], speed: float | None = None,
                 threaded: bool = False, clock: Callable[[], float] = _time.monotonic,
                 sleep: Callable[[float], None] = _time.sleep) -> None:
        self.source = source
        self.speed = speed
        self.threaded = threaded
        self.clock = clock
        self.sleep = sleep
        self.sent: list[tuple[int, bytes, int]] = []
        self.delivered = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _run(self, on_message: Callable[[RmrMessage], None]) -> None:
        records = _trace.read_trace(self.source) if isinstance(self.source, str) else self.source

        def deliver(r: _trace.TraceRecord) -> None:
            _safe(on_message, RmrMessage(r.mtype, r.payload, r.sub_id, r.e2_node, r.time, handle=r))

        self.delivered = _trace.replay(records, deliver, self.speed, self.clock, self.sleep, self._stop.is_set)

    def start(self, on_message: Callable[[RmrMessage], None]) -> None:
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
        with self._lock:
            self.sent.append((mtype, bytes(payload), sub_id))
        return True

    def rts(self, msg: RmrMessage, mtype: int, payload: bytes) -> bool:
        return self.send(mtype, payload, msg.sub_id)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
