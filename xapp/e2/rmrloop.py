"""The xApp's own RMR receive loop: bounded batches, bounded queues, receipt times, shedding.

Why (issue 28): ricxappframe 3.2.2's ``RmrLoop`` receives with ``rmr_rcvall_msgs_raw``, which
keeps receiving until a receive comes back empty and holds the whole burst in a list until then:
under a continuous inflow the application sees nothing, memory grows, RMR's ring (4096
messages, ``uta_mk_ring`` in ric-plt-lib-rmr ``rmr_si.c``) overflows and RMR drops; messages
were stamped with the time they were handled, so a backlog put tracks and predicted handover
times seconds off; and health checks and A1 requests waited behind indications.

:class:`RmrReceiver` runs one receive thread (``rmr-rx``) over RMR's primitives
(``rmr_torcv_msg``, ``rmr_alloc_msg``, ``rmr_free_msg``, ``rmr_rts_msg``, ``rmr_get_meid``
through ricxappframe's ctypes wrappers) in rounds:

1. **receive** at most ``batch`` messages from RMR (the first waits up to ``wait_ms`` only when
   nothing is queued here; the others poll with a zero timeout), each stamped with its receipt
   time (``clock``, Unix s), which is the message's time from then on (``RmrMessage.time``: the
   report time of the tracks and the predictor):

   - RIC_HEALTH_CHECK_REQ (100) is answered at once, return to sender, with
     RIC_HEALTH_CHECK_RESP (101) ``OK\\n`` (``ERROR [...]\\n`` when ``healthy()`` says no), as
     RMRXapp answers it (``rmr_probe``, the descriptor's liveness probe);
   - RIC_INDICATION (12050): its payload, E2 node (MEID) and sub id are copied into the
     indication queue (at most ``queue_size``; when full the oldest is dropped and counted, it is
     the stalest) and the RMR buffer is reused for the next receive;
   - any other type (A1_POLICY_REQ, submgr's messages, unknown ones): its buffer goes to the
     control queue (at most ``control_queue_size``; a message that finds it full is dropped and
     counted), which a second thread (``rmr-ctl``) hands to ``on_message`` and frees, so that
     an A1 request never waits behind indications and a slow A1 change never stops receiving;

2. **handle** queued indications, oldest first, at most ``handle_max`` or for ``handle_budget_s``
   (whichever ends first; so a health check waits at most about one budget, and RMR's ring is
   drained every few milliseconds even when the xApp cannot keep up, so that what cannot be
   handled is dropped here, counted, rather than in RMR): one older than
   ``shed_after_s`` when its turn comes is shed (counted; not handed on, and not counted against
   ``handle_max``, so a full queue of stale indications cannot starve the fresh ones behind
   it), the others go to ``on_message``.

3. **defer to the decision cycle**: while ``defer()`` says a control cycle runs, the handle
   phase is skipped and the thread sleeps ``DEFER_SLEEP_S`` between receive phases, for at most
   ``defer_max_s`` in a row (a longer cycle shares the interpreter as before). An indication
   handed on during a cycle is used by the next cycle anyway, while every moment of the GIL the
   receive thread takes from the cycle delays the end of the cycle, and with it every
   decision of that cycle (the lag from receipt to the decision). Receiving goes on (health
   checks are answered, RMR's ring is drained into the queue); the queue's and the shedding's
   bounds hold as before.

Counts (:attr:`RmrReceiver.stats`, and Prometheus metrics by :meth:`RmrReceiver.collect`):
received per kind, dropped per reason, shed, handled, health checks answered, the queue depths,
the age of the oldest queued indication and a histogram of the age (receipt to handling) of the
indications handled. Drops and sheds are logged, at most once a second with the counts so far.
Nothing is lost silently.

Memory is bounded by ``queue_size`` indications (their payload bytes) plus ``control_queue_size``
RMR buffers, whatever the inflow.

CPython note: every call through a ctypes ``CDLL`` releases the GIL, and a thread that releases
it while another thread is busy may wait a whole switch interval (5 ms) to get it back. Where the
real ``librmr_si.so`` is loaded, the calls that never block (the zero-timeout poll, the MEID copy)
go through GIL-holding function pointers (``ctypes.PYFUNCTYPE``) of the same C functions, so that
receiving a burst costs microseconds per message rather than a switch interval; only the waiting
receive releases the GIL.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import threading
import time as _time
from typing import TYPE_CHECKING, Callable, Iterator, Protocol

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

import structlog

log = structlog.get_logger("xapp.e2.rmrloop")

RIC_HEALTH_CHECK_REQ = 100
RIC_HEALTH_CHECK_RESP = 101
RIC_INDICATION = 12050

#: RMR message states (ric-plt-lib-rmr rmr.h): RMR_OK, RMR_ERR_TIMEOUT, RMR_ERR_RETRY
RMR_OK, RMR_ERR_RETRY, RMR_ERR_TIMEOUT = 0, 10, 12
#: the size a fresh receive buffer is allocated with (what ricxappframe's helpers use)
RCV_BUF_SIZE = 4096
#: how long the receive thread sleeps between receive phases while it defers to a cycle (s)
DEFER_SLEEP_S = 0.0005
#: upper bounds (s) of the message-age histogram buckets (+Inf added)
AGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

RmrContext = object
"""RMR's context (``rmr_init``'s ``void *``): opaque here, only passed back to RMR."""


class MbufFields(Protocol):
    """The fields of RMR's ``rmr_mbuf_t`` the loop reads (ric-plt-lib-rmr ``rmr.h``)."""

    state: int
    mtype: int
    len: int
    sub_id: int
    payload: object     # char *: read with ctypes.string_at(payload, len)


class Mbuf(Protocol):
    """An RMR message buffer: a ctypes pointer to ``rmr_mbuf_t`` (false when NULL)."""

    @property
    def contents(self) -> MbufFields: ...

    def __bool__(self) -> bool: ...


class Received(Protocol):
    """A message handed on (:class:`xapp.e2.transport.RmrMessage`): type, payload bytes,
    subscription id, E2 node (MEID) and receipt time (Unix s)."""

    @property
    def mtype(self) -> int: ...

    @property
    def payload(self) -> bytes: ...

    @property
    def time(self) -> float: ...


class MessageFactory(Protocol):
    """The delivered message's constructor (:class:`xapp.e2.transport.RmrMessage`); ``handle``
    is the RMR buffer of a control-queue message, valid during its ``on_message`` call."""

    def __call__(self, mtype: int, payload: bytes, sub_id: int, e2_node: str, time: float, *,
                 handle: Mbuf | None = None) -> Received: ...


class RmrCalls:
    """The RMR primitives the receive loop uses, from ricxappframe's ctypes wrappers
    (``ricxappframe.rmr.rmr``; needs librmr_si.so or a stub of ``ricxappframe.rmr.rmrclib.rmrclib``).

    ``wait(mrc, mbuf, ms)``: ``rmr_torcv_msg`` with a timeout (releases the GIL).
    ``poll(mrc, mbuf)``: ``rmr_torcv_msg`` with timeout 0 (GIL held when the real library is
    loaded, see the module docstring). ``meid(mbuf)``: the MEID bytes. ``alloc(mrc)``: a fresh
    receive buffer. ``free(mbuf)``, ``rts(mrc, mbuf, payload, mtype)``: as RMR's. The names are
    looked up in ``ricxappframe.rmr.rmr`` when called, so a test may replace its functions."""

    def __init__(self) -> None:
        from ricxappframe.rmr import rmr
        from ricxappframe.rmr.rmrclib import rmrclib

        self.rmr = rmr
        self._meid_buf = ctypes.create_string_buffer(32)   # RMR_MAX_MEID; one receive thread
        # ctypes function pointers (PYFUNCTYPE) of the same C calls, or None
        self._fast_poll: Callable[[RmrContext, Mbuf, int], Mbuf] | None = None
        self._fast_meid: Callable[[Mbuf, ctypes.Array[ctypes.c_char]], bytes] | None = None
        lib = getattr(rmrclib, "rmr_c_lib", None)
        real = ctypes._CFuncPtr  # type: ignore[attr-defined]
        # only over the real library, and only where nothing (a test's stub) replaced its calls
        if isinstance(lib, ctypes.CDLL) and isinstance(getattr(rmr, "_rmr_torcv_msg", None), real) \
                and isinstance(getattr(rmr, "_rmr_get_meid", None), real):
            P = ctypes.POINTER(rmr.rmr_mbuf_t)
            self._fast_poll = ctypes.PYFUNCTYPE(P, ctypes.c_void_p, P, ctypes.c_int)(("rmr_torcv_msg", lib))
            self._fast_meid = ctypes.PYFUNCTYPE(ctypes.c_char_p, P, ctypes.c_char_p)(("rmr_get_meid", lib))

    def wait(self, mrc: RmrContext, mbuf: Mbuf, ms: int) -> Mbuf:
        return self.rmr.rmr_torcv_msg(mrc, mbuf, ms)

    def poll(self, mrc: RmrContext, mbuf: Mbuf) -> Mbuf:
        if self._fast_poll is not None:
            return self._fast_poll(mrc, mbuf, 0)
        return self.rmr.rmr_torcv_msg(mrc, mbuf, 0)

    def meid(self, mbuf: Mbuf) -> bytes:
        if self._fast_meid is not None:
            self._meid_buf[0] = b"\0"
            self._fast_meid(mbuf, self._meid_buf)
            return self._meid_buf.value
        return self.rmr.rmr_get_meid(mbuf) or b""

    def alloc(self, mrc: RmrContext) -> Mbuf:
        return self.rmr.rmr_alloc_msg(mrc, RCV_BUF_SIZE)

    def free(self, mbuf: Mbuf) -> None:
        self.rmr.rmr_free_msg(mbuf)

    def rts(self, mrc: RmrContext, mbuf: Mbuf, payload: bytes, mtype: int) -> Mbuf:
        return self.rmr.rmr_rts_msg(mrc, mbuf, payload=payload, mtype=mtype)


class RmrReceiver:
    """The bounded receive loop (module docstring) over an RMR context ``mrc``.

    ``message``: the delivered message's constructor, called as ``message(mtype, payload,
    sub_id, e2_node, time[, handle=mbuf])`` (:class:`xapp.e2.transport.RmrMessage`; passed in,
    so that this module imports nothing of the transport that starts it). ``on_message(message)`` gets indications from the ``rmr-rx`` thread and every other
    message from the ``rmr-ctl`` thread (one message at a time per thread; it must not raise,
    what it raises is logged and swallowed). ``healthy()`` decides the health-check answer.
    ``clock``: the receipt clock (Unix s). ``defer()`` (None: never) says whether to hold the
    indications back for now (a decision cycle runs), for at most ``defer_max_s`` in a row
    (module docstring, step 3). Call :meth:`start` once, :meth:`stop` to end
    (idempotent; frees every buffer it holds, does not close ``mrc``).

    Raises ValueError for a non-positive bound.
    """

    def __init__(self, mrc: RmrContext, on_message: Callable[[Received], None], *, message: MessageFactory,
                 calls: RmrCalls | None = None,
                 healthy: Callable[[], bool] = lambda: True, queue_size: int = 8192, batch: int = 512,
                 handle_max: int = 32, handle_budget_s: float = 0.005, shed_after_s: float = 1.0,
                 control_queue_size: int = 256, wait_ms: int = 100,
                 clock: Callable[[], float] = _time.time, defer: Callable[[], bool] | None = None,
                 defer_max_s: float = 0.02) -> None:
        for name, v in (("queue_size", queue_size), ("batch", batch), ("handle_max", handle_max),
                        ("control_queue_size", control_queue_size), ("wait_ms", wait_ms)):
            if int(v) < 1:
                raise ValueError(f"{name} must be >= 1, got {v!r}")
        if not handle_budget_s > 0 or not shed_after_s > 0:
            raise ValueError("handle_budget_s and shed_after_s must be > 0")
        if not defer_max_s >= 0:
            raise ValueError("defer_max_s must be >= 0")
        self._Msg = message
        self.mrc = mrc
        self.on_message = on_message
        self.calls = calls or RmrCalls()
        self.healthy = healthy
        self.queue_size, self.batch, self.handle_max = int(queue_size), int(batch), int(handle_max)
        self.handle_budget_s, self.shed_after_s = float(handle_budget_s), float(shed_after_s)
        self.control_queue_size, self.wait_ms = int(control_queue_size), int(wait_ms)
        self.clock = clock
        self.defer, self.defer_max_s = defer, float(defer_max_s)
        self.indications: collections.deque[Received] = collections.deque()
        self.control: collections.deque[tuple[float, Mbuf]] = collections.deque()   # (receipt t, buffer)
        self._ctl_ready = threading.Condition(threading.Lock())
        #: counters: received:<indication|health|control>, dropped:<reason>, shed, handled,
        #: health_answered, health_failed, rounds, deferred (receive phases whose handle phase
        #: waited for a cycle)
        self.stats: collections.Counter[str] = collections.Counter()
        self.age_counts = [0] * (len(AGE_BUCKETS) + 1)
        self.age_sum = 0.0
        self.last_round = 0.0            # monotonic time the receive thread last began a round
        self._stop = threading.Event()
        self._rx: threading.Thread | None = None
        self._ctl: threading.Thread | None = None
        self._meids: dict[bytes, str] = {}
        self._logged_at = 0.0
        self._logged = (0, 0)

    # ------------------------------------------------------------------ run / stop
    def start(self) -> None:
        """Start the receive and control threads (daemons)."""
        if self._rx is not None:
            raise RuntimeError("RmrReceiver already started")
        self.last_round = _time.monotonic()
        self._rx = threading.Thread(target=self._run_rx, name="rmr-rx", daemon=True)
        self._ctl = threading.Thread(target=self._run_ctl, name="rmr-ctl", daemon=True)
        self._ctl.start()
        self._rx.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End both threads (within ``wait_ms`` plus the message being handled) and free the
        buffers still queued; idempotent."""
        self._stop.set()
        with self._ctl_ready:
            self._ctl_ready.notify_all()
        for th in (self._rx, self._ctl):
            if th is not None and th is not threading.current_thread():
                th.join(timeout)
        self.stats["queued_at_stop"] = len(self.indications)
        while self.control:
            try:
                self.calls.free(self.control.popleft()[1])
            except IndexError:
                break
        self.indications.clear()

    def alive(self, stall_s: float = 5.0) -> bool:
        """True while both threads run and the receive thread began a round within ``stall_s``."""
        return (self._rx is not None and self._rx.is_alive() and self._ctl is not None and self._ctl.is_alive()
                and _time.monotonic() - self.last_round < stall_s)

    # ------------------------------------------------------------------ the receive thread
    def _run_rx(self) -> None:
        calls, mrc = self.calls, self.mrc
        mbuf: Mbuf | None = None
        defer, since = self.defer, None
        try:
            mbuf = calls.alloc(mrc)
            while not self._stop.is_set():
                self.last_round = now = _time.monotonic()
                self.stats["rounds"] += 1
                mbuf = self._receive(mbuf)
                if defer is not None and self.indications and defer():
                    if since is None:
                        since = now
                    if now - since < self.defer_max_s:
                        self.stats["deferred"] += 1
                        _time.sleep(DEFER_SLEEP_S)
                        continue
                else:
                    since = None
                self._handle()
                self._maybe_log()
        except Exception as e:  # noqa: BLE001 - logged; alive() turns false, the probes see it
            log.exception("rmr_receive_loop_failed", error=f"{type(e).__name__}: {e}")
        finally:
            if mbuf:
                try:
                    calls.free(mbuf)
                except Exception:  # noqa: BLE001
                    pass

    def _receive(self, mbuf: Mbuf) -> Mbuf:
        """One receive phase: at most ``batch`` messages; returns the buffer to receive into next."""
        calls, mrc, clock = self.calls, self.mrc, self.clock
        ind, stats = self.indications, self.stats
        string_at = ctypes.string_at
        Msg = self._Msg
        for k in range(self.batch):
            if k == 0 and not ind:
                mbuf = calls.wait(mrc, mbuf, self.wait_ms)
            else:
                mbuf = calls.poll(mrc, mbuf)
            if not mbuf:                          # RMR gave no buffer back: take a fresh one
                mbuf = calls.alloc(mrc)
                break
            c = mbuf.contents
            state = c.state
            if state != RMR_OK:
                if state != RMR_ERR_TIMEOUT:
                    stats[f"dropped:receive state {state}"] += 1
                break
            t = clock()
            mtype = c.mtype
            if mtype == RIC_INDICATION:
                raw = calls.meid(mbuf)
                node = self._meids.get(raw)
                if node is None:
                    node = self._node_name(raw)
                if len(ind) >= self.queue_size:
                    ind.popleft()
                    stats["dropped:queue full"] += 1
                ind.append(Msg(mtype, string_at(c.payload, c.len), c.sub_id, node, t))
                stats["received:indication"] += 1
            elif mtype == RIC_HEALTH_CHECK_REQ:
                stats["received:health"] += 1
                mbuf = self._answer_health(mbuf)
            else:
                stats["received:control"] += 1
                self._to_control(mbuf, t)
                mbuf = calls.alloc(mrc)
        return mbuf

    def _node_name(self, raw: bytes) -> str:
        if len(self._meids) >= 4096:                # MEIDs come from the network: bounded
            self._meids.clear()
        node = self._meids[raw] = raw.decode("utf-8", "replace") if raw else ""
        return node

    def _answer_health(self, mbuf: Mbuf) -> Mbuf:
        try:
            ok = bool(self.healthy())
        except Exception:  # noqa: BLE001 - a failing check is an unhealthy answer
            ok = False
        payload = b"OK\n" if ok else b"ERROR [RMR or SDL is unhealthy]\n"
        for _ in range(3):
            mbuf = self.calls.rts(self.mrc, mbuf, payload, RIC_HEALTH_CHECK_RESP)
            if not mbuf:
                mbuf = self.calls.alloc(self.mrc)
                break
            if mbuf.contents.state == RMR_OK:
                self.stats["health_answered"] += 1
                return mbuf
            if mbuf.contents.state != RMR_ERR_RETRY:
                break
        self.stats["health_failed"] += 1
        return mbuf

    def _to_control(self, mbuf: Mbuf, t: float) -> None:
        with self._ctl_ready:
            if len(self.control) >= self.control_queue_size:
                self.stats["dropped:control queue full"] += 1
                self.calls.free(mbuf)
                return
            self.control.append((t, mbuf))
            self._ctl_ready.notify()

    def _handle(self) -> None:
        """One handle phase: queued indications, oldest first, within the phase's bounds."""
        ind, stats, on_message = self.indications, self.stats, self.on_message
        if not ind:
            return
        clock, shed_after = self.clock, self.shed_after_s
        counts, buckets = self.age_counts, AGE_BUCKETS
        end = _time.monotonic() + self.handle_budget_s
        n = 0
        while n < self.handle_max:
            try:
                msg = ind.popleft()
            except IndexError:
                return
            age = clock() - msg.time
            if age > shed_after:      # costs nothing: not counted against handle_max
                stats["shed"] += 1
                continue
            n += 1
            counts[bisect.bisect_left(buckets, age)] += 1
            self.age_sum += age
            stats["handled"] += 1
            try:
                on_message(msg)
            except Exception as e:  # noqa: BLE001 - a handler bug never stops receiving
                log.error("rmr_handler_failed", mtype=msg.mtype, error=f"{type(e).__name__}: {e}")
            if _time.monotonic() >= end:
                return

    def _maybe_log(self) -> None:
        t = _time.monotonic()
        if t - self._logged_at < 1.0:
            return
        self._logged_at = t
        s = self.stats
        dropped = sum(v for k, v in s.items() if k.startswith("dropped:"))
        now = (dropped, s["shed"])
        if now != self._logged:
            self._logged = now
            log.warning("rmr_overload", dropped=dropped, shed=s["shed"], queued=len(self.indications),
                        reasons={k[8:]: v for k, v in s.items() if k.startswith("dropped:")},
                        note="indications dropped (queue full) or shed (older than shed_after_s)")

    # ------------------------------------------------------------------ the control thread
    def _run_ctl(self) -> None:
        rmr_msg = self._Msg
        while True:
            with self._ctl_ready:
                while not self.control and not self._stop.is_set():
                    self._ctl_ready.wait(0.5)
                if self._stop.is_set():
                    return
                t, mbuf = self.control.popleft()
            try:
                c = mbuf.contents
                raw = self.calls.rmr.rmr_get_meid(mbuf) or b""    # not calls.meid: its buffer is rx's
                msg = rmr_msg(c.mtype, ctypes.string_at(c.payload, c.len) if c.len > 0 else b"", c.sub_id,
                              raw.decode("utf-8", "replace"), t, handle=mbuf)
                self.stats["handled_control"] += 1
                self.on_message(msg)
            except Exception as e:  # noqa: BLE001 - never stops the control thread
                log.error("rmr_control_handler_failed", error=f"{type(e).__name__}: {e}")
            finally:
                try:
                    self.calls.free(mbuf)
                except Exception:  # noqa: BLE001
                    pass

    # ------------------------------------------------------------------ metrics
    def oldest_age(self) -> float:
        """Age (s) of the oldest queued indication, 0 when none."""
        try:
            return max(0.0, self.clock() - self.indications[0].time)
        except IndexError:
            return 0.0

    def collect(self) -> Iterator[Metric]:
        """Prometheus metrics (a custom collector: read from the counts at scrape time, so a
        message costs no metric update): ``pallas_rmr_received_total{kind}``,
        ``pallas_rmr_dropped_total{reason}``, ``pallas_rmr_shed_total``,
        ``pallas_rmr_handled_total``, ``pallas_rmr_health_checks_total{outcome}``,
        ``pallas_rmr_queue_depth{queue}``, ``pallas_rmr_queue_capacity{queue}``,
        ``pallas_rmr_oldest_age_seconds``, ``pallas_rmr_message_age_seconds`` (histogram,
        receipt to handling of the indications handled)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        s = dict(self.stats)
        rec = CounterMetricFamily("pallas_rmr_received", "RMR messages received, by kind", labels=["kind"])
        for kind in ("indication", "health", "control"):
            rec.add_metric([kind], s.get(f"received:{kind}", 0))
        yield rec
        drop = CounterMetricFamily("pallas_rmr_dropped", "RMR messages dropped by the xApp, by reason",
                                   labels=["reason"])
        for reason in ("queue full", "control queue full"):
            drop.add_metric([reason.replace(" ", "_")], s.get(f"dropped:{reason}", 0))
        for k, v in s.items():
            if k.startswith("dropped:") and k[8:] not in ("queue full", "control queue full"):
                drop.add_metric([k[8:].replace(" ", "_")], v)
        yield drop
        yield CounterMetricFamily("pallas_rmr_shed", "indications shed: older than shed_after_s when their "
                                  "turn came", value=s.get("shed", 0))
        yield CounterMetricFamily("pallas_rmr_handled", "indications handed to the xApp", value=s.get("handled", 0))
        hc = CounterMetricFamily("pallas_rmr_health_checks", "RIC_HEALTH_CHECK_REQ answered", labels=["outcome"])
        hc.add_metric(["answered"], s.get("health_answered", 0))
        hc.add_metric(["failed"], s.get("health_failed", 0))
        yield hc
        depth = GaugeMetricFamily("pallas_rmr_queue_depth", "messages queued in the xApp", labels=["queue"])
        depth.add_metric(["indication"], len(self.indications))
        depth.add_metric(["control"], len(self.control))
        yield depth
        cap = GaugeMetricFamily("pallas_rmr_queue_capacity", "queue bounds", labels=["queue"])
        cap.add_metric(["indication"], self.queue_size)
        cap.add_metric(["control"], self.control_queue_size)
        yield cap
        yield GaugeMetricFamily("pallas_rmr_oldest_age_seconds", "age of the oldest queued indication",
                                value=self.oldest_age())
        cum, buckets = 0, []
        counts = list(self.age_counts)
        for ub, n in zip(AGE_BUCKETS, counts):
            cum += n
            buckets.append((repr(ub), cum))
        cum += counts[-1]
        buckets.append(("+Inf", cum))
        yield HistogramMetricFamily("pallas_rmr_message_age_seconds", "receipt to handling of indications",
                                    buckets=buckets, sum_value=self.age_sum)
