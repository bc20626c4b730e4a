"""A stand-in for RMR's C library (librmr_si.so) under ricxappframe's own ctypes wrappers.

``ricxappframe.rmr.rmrclib.rmrclib`` dlopens librmr_si.so at import; where it is missing,
:func:`install_rmrclib` puts a module with the constants in its place (docs/osc.md §1.2,
tests without the C library). :class:`FakeRmrLib` then replaces the C entry points that
``ricxappframe.rmr.rmr`` wraps (``_rmr_alloc_msg``, ``_rmr_torcv_msg``, ``_rmr_free_msg``,
``_rmr_get_meid``, ``_rmr_rts_msg``, ``_rmr_send_msg``, ``_rmr_payload_size``, ``_rmr_get_src``,
``_rmr_init``, ``_rmr_ready``, ``_rmr_close``, ...) with Python functions over **real**
``rmr_mbuf_t`` ctypes structures (payload and transaction id in ctypes buffers), so that
ricxappframe's Python wrappers (``rmr_torcv_msg``, ``message_summary``, ``rmr_alloc_msg`` with
its keywords, ``rmr_rts_msg``) and the xApp's receive loop run unchanged on top.

Inbound messages sit in a ring of ``ring_size`` (RMR SI's is 4096; when full a message is
dropped and counted in ``ring_dropped``, as RMR does). ``inflow``: a callable that makes the next
message whenever the ring is empty, i.e. a continuous inflow that never lets a receive come
back empty (``rmr_rcvall_msgs_raw`` never returns under it). ``clock``: the time the fake stamps
arrivals with (``arrivals[seq]``); with ``virtual_rate`` the fake keeps its own clock, advanced
by 1/rate per message made, so a test reads times that do not depend on the machine's load.
"""

from __future__ import annotations

import collections
import ctypes
import sys
import threading
import types
from typing import Any, Callable
from unittest import mock

CONSTS = {"RMR_MAX_RCV_BYTES": 4096, "RMRFL_MTCALL": 2, "RMRFL_NONE": 0, "RMR_OK": 0,
          "RMR_ERR_BADARG": 1, "RMR_ERR_NOENDPT": 2, "RMR_ERR_EMPTY": 3, "RMR_ERR_NOHDR": 4,
          "RMR_ERR_SENDFAILED": 5, "RMR_ERR_CALLFAILED": 6, "RMR_ERR_NOWHOPEN": 7, "RMR_ERR_WHID": 8,
          "RMR_ERR_OVERFLOW": 9, "RMR_ERR_RETRY": 10, "RMR_ERR_RCVFAILED": 11, "RMR_ERR_TIMEOUT": 12,
          "RMR_ERR_UNSET": 13, "RMR_ERR_TRUNC": 14, "RMR_ERR_INITFAILED": 15, "RMR_ERR_NOTSUPP": 16,
          "RMR_MAX_MEID": 32, "RMR_MAX_XID": 32, "RMR_MAX_SRC": 64}


def real_rmr_available() -> bool:
    """True when librmr_si.so loads (the by-hand build on LD_LIBRARY_PATH)."""
    try:
        ctypes.CDLL("librmr_si.so")
        return True
    except OSError:
        return False


def install_rmrclib() -> None:
    """Make ``ricxappframe.rmr.rmr`` importable: the real rmrclib when librmr_si.so loads, else
    a module with RMR's constants (its ``rmr_c_lib`` a MagicMock whose calls tests replace)."""
    name = "ricxappframe.rmr.rmrclib.rmrclib"
    if name in sys.modules:
        return
    try:
        __import__(name)
        return
    except OSError:
        pass
    m = types.ModuleType(name)
    m._pallas_fake = True
    m.rmr_c_lib = mock.MagicMock()
    m.get_constants = lambda cache={}: CONSTS
    m.get_mapping_dict = lambda cache={}: {v: k for k, v in CONSTS.items() if k.startswith("RMR_")}
    names = {v: k for k, v in CONSTS.items() if k.startswith("RMR_ERR") or k == "RMR_OK"}
    m.state_to_status = lambda s: names.get(s, "RMR_ERR_UNSET")
    sys.modules[name] = m
    import ricxappframe.rmr.rmrclib as pkg
    pkg.rmrclib = m


class FakeRmrLib:
    """RMR's C primitives in Python (module docstring). ``sent``: (mtype, payload, kind) for
    every send ('send') and return to sender ('rts'), with ``sent_at`` the fake's clock then.
    ``allocs``/``frees``: buffers made and freed (``live()``: held now). ``on_send(mtype,
    payload)``: optional hook called on each send/rts."""

    def __init__(self, ring_size: int = 4096, inflow: Callable[[int], tuple | None] | None = None,
                 virtual_rate: float | None = None, clock: Callable[[], float] | None = None,
                 t0: float = 1_000_000.0) -> None:
        import time
        self.ring_size = ring_size
        self.ring: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.inflow = inflow
        self.virtual_rate = virtual_rate
        self._t = t0
        self.t0 = t0
        self._clock = clock or time.time
        self.seq = 0                         # messages that arrived (sequence numbers 0..)
        self.arrivals: dict[int, float] = {}
        self.ring_dropped = 0
        self.allocs = self.frees = 0
        self._held: dict[int, tuple] = {}    # address of the struct -> (struct, buffers)
        self.sent: list[tuple[int, bytes, str]] = []
        self.sent_at: list[float] = []
        self.on_send: Callable[[int, bytes], None] | None = None
        self.closed = False

    # ------------------------------------------------------------------ time and inflow
    def now(self) -> float:
        """The fake's clock: virtual (advanced per message made) or the wall clock."""
        return self._t if self.virtual_rate else self._clock()

    def push(self, mtype: int, payload: bytes, meid: bytes = b"", sub_id: int = -1) -> int:
        """One message arrives (into the ring; dropped when it is full). Returns its sequence
        number, which is also its RMR transaction id."""
        with self.cond:
            return self._arrive(mtype, payload, meid, sub_id)

    def _arrive(self, mtype: int, payload: bytes, meid: bytes, sub_id: int) -> int:
        seq = self.seq
        self.seq += 1
        if self.virtual_rate:
            self._t = self.t0 + self.seq / self.virtual_rate
        self.arrivals[seq] = self.now()
        if len(self.ring) >= self.ring_size:
            self.ring_dropped += 1
        else:
            self.ring.append((mtype, payload, meid, sub_id, seq))
        self.cond.notify_all()
        return seq

    # ------------------------------------------------------------------ buffers
    def _new(self, size: int) -> Any:
        from ricxappframe.rmr import rmr
        m = rmr.rmr_mbuf_t()
        payload = ctypes.create_string_buffer(max(size, 1))
        xaction = ctypes.create_string_buffer(CONSTS["RMR_MAX_XID"] + 1)
        m.payload = ctypes.cast(payload, ctypes.POINTER(ctypes.c_char))
        m.xaction = ctypes.cast(xaction, ctypes.POINTER(ctypes.c_char))
        m.state, m.mtype, m.len, m.sub_id = 0, -1, 0, -1
        box = {"payload": payload, "xaction": xaction, "meid": b"", "size": max(size, 1)}
        self._held[ctypes.addressof(m)] = (m, box)
        self.allocs += 1
        return ctypes.pointer(m)

    def _box(self, p: Any) -> dict:
        return self._held[ctypes.addressof(p.contents)][1]

    def live(self) -> int:
        """Buffers allocated and not yet freed."""
        return len(self._held)

    def _fill(self, p: Any, mtype: int, payload: bytes, meid: bytes, sub_id: int, seq: int) -> None:
        box = self._box(p)
        if len(payload) > box["size"]:
            box["payload"] = ctypes.create_string_buffer(payload, len(payload))
            box["size"] = len(payload)
            p.contents.payload = ctypes.cast(box["payload"], ctypes.POINTER(ctypes.c_char))
        ctypes.memmove(p.contents.payload, payload, len(payload))
        c = p.contents
        c.state, c.mtype, c.len, c.sub_id, c.tp_state = 0, mtype, len(payload), sub_id, 0
        box["meid"] = meid
        xid = str(seq).encode()[:32]
        ctypes.memmove(c.xaction, xid + b"\0", len(xid) + 1)

    # ------------------------------------------------------------------ the C entry points
    def alloc_msg(self, vctx: Any, size: int) -> Any:
        return self._new(size)

    def free_msg(self, p: Any) -> None:
        if p:
            if self._held.pop(ctypes.addressof(p.contents), None) is not None:
                self.frees += 1

    def torcv_msg(self, vctx: Any, old: Any, ms: int) -> Any:
        """rmr_torcv_msg: the next message (the old buffer freed, as RMR SI does), or the old
        buffer with state RMR_ERR_TIMEOUT after ``ms`` ms (0: poll)."""
        with self.cond:
            if not self.ring and self.inflow is not None:
                item = self.inflow(self.seq)
                if item is not None:
                    self._arrive(*item)
            if not self.ring and ms > 0:
                self.cond.wait(ms / 1000.0)
            if not self.ring:
                if old:
                    old.contents.state, old.contents.len = CONSTS["RMR_ERR_TIMEOUT"], 0
                return old
            mtype, payload, meid, sub_id, seq = self.ring.popleft()
        self.free_msg(old)
        p = self._new(len(payload))
        self._fill(p, mtype, payload, meid, sub_id, seq)
        return p

    def get_meid(self, p: Any, dest: Any) -> bytes:
        meid = self._box(p)["meid"]
        ctypes.memmove(dest, meid + b"\0", len(meid) + 1)
        return meid

    def get_src(self, p: Any, dest: Any) -> bytes:
        ctypes.memmove(dest, b"fake:4560\0", 10)
        return b"fake:4560"

    def payload_size(self, p: Any) -> int:
        return self._box(p)["size"]

    def realloc_payload(self, p: Any, new_len: int, copy: int, clone: int) -> Any:
        box = self._box(p)
        if new_len > box["size"]:
            buf = ctypes.create_string_buffer(new_len)
            if copy:
                ctypes.memmove(buf, p.contents.payload, p.contents.len)
            box["payload"], box["size"] = buf, new_len
            p.contents.payload = ctypes.cast(buf, ctypes.POINTER(ctypes.c_char))
        return p

    def bytes2meid(self, p: Any, src: bytes, n: int) -> int:
        self._box(p)["meid"] = bytes(src[:n])
        return n

    def _sent(self, p: Any, kind: str) -> Any:
        c = p.contents
        payload = ctypes.string_at(c.payload, c.len)
        self.sent.append((c.mtype, payload, kind))
        self.sent_at.append(self.now())
        c.state = 0
        if self.on_send is not None:
            self.on_send(c.mtype, payload)
        return p

    def send_msg(self, vctx: Any, p: Any) -> Any:
        return self._sent(p, "send")

    def rts_msg(self, vctx: Any, p: Any) -> Any:
        return self._sent(p, "rts")

    def install(self, monkeypatch: Any) -> "FakeRmrLib":
        """Replace ricxappframe.rmr.rmr's C entry points with this fake's (undone by
        ``monkeypatch``); ricxappframe's appmgr registration and its 10 s shutdown wait are
        switched off too. Returns self."""
        install_rmrclib()
        from ricxappframe.rmr import rmr
        from ricxappframe import xapp_frame

        for name, fn in {
            "_rmr_alloc_msg": self.alloc_msg, "_rmr_free_msg": self.free_msg,
            "_rmr_torcv_msg": self.torcv_msg, "_rmr_get_meid": self.get_meid, "_rmr_get_src": self.get_src,
            "_rmr_payload_size": self.payload_size, "_rmr_realloc_payload": self.realloc_payload,
            "_rmr_bytes2meid": self.bytes2meid, "_rmr_send_msg": self.send_msg, "_rmr_rts_msg": self.rts_msg,
            "_rmr_init": lambda port, size, flags: 12345, "_rmr_ready": lambda vctx: 1,
            "_rmr_close": lambda vctx: setattr(self, "closed", True),
        }.items():
            monkeypatch.setattr(rmr, name, fn)
        monkeypatch.setattr(xapp_frame._BaseXapp, "registerXapp", lambda self: None)
        monkeypatch.setattr(xapp_frame._BaseXapp, "xapp_shutdown", lambda self: None)
        monkeypatch.delenv("CONFIG_FILE", raising=False)
        return self
