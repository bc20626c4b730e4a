"""Record mode: the E2 indications a live xApp handles, written as an E2 trace (``xapp.e2.trace``).

``pallas-xapp --record FILE`` (live mode) hands every RIC_INDICATION the RMR receive loop
delivers to :class:`TraceRecorder` before the xApp handles it, so an operator can replay their
own network's reports in test mode (``pallas-xapp --mode test --trace FILE``) or learn the
association map from them (``controls.association_map.path``, ``--history``).

- What is written: per indication, its receipt time (Unix s; the time the live xApp used), the
  sending E2 node (RMR MEID), the RMR message type (12050) and sub id, and the payload byte for
  byte. Indications the receive loop shed or dropped under overload were never handled and are
  not written. Other message types (A1, health checks) are not written.
- Readable after a kill: the file is opened unbuffered and each record goes out in one
  ``write`` of the whole record, so a SIGKILL leaves whole records (the reader stops cleanly at
  the end); nothing is buffered in the process.
- Bounded: a record that would take the file past ``max_bytes`` is not written; recording
  stops there (logged once, :attr:`stopped` set) and the xApp runs on.
- Times are kept non-decreasing, as the format requires: a receipt time earlier than the
  previous record's (the wall clock stepped back) is written as the previous time.

Errors: :class:`OSError` from the constructor when the file cannot be created; a write that
fails later (disk full) stops the recording with the error logged, never the xApp.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import structlog

from xapp.e2 import trace as _trace

log = structlog.get_logger("pallas.xapp.record")

RIC_INDICATION = 12050
DEFAULT_MAX_MB = 1024.0


class TraceRecorder:
    """Appends handled RIC_INDICATION messages to an E2 trace at ``path`` (module docstring).

    ``max_bytes``: the file's cap (header included). :attr:`count` records written,
    :attr:`bytes` the file's size, :attr:`stopped` the reason recording stopped (None while it
    records). Thread-safe: :meth:`on_message` may be called from any thread."""

    def __init__(self, path: str | os.PathLike, max_bytes: int) -> None:
        self.path = str(path)
        self.max_bytes = int(max_bytes)
        self._f = open(self.path, "wb", buffering=0)
        self._w = _trace.TraceWriter(self._f)
        self.bytes = _trace.HEADER_SIZE
        self.count = 0
        self.stopped: str | None = None
        self._last = float("-inf")
        self._lock = threading.Lock()

    def on_message(self, msg: Any) -> None:
        """Write ``msg`` (an ``xapp.e2.transport.RmrMessage``) if it is a RIC_INDICATION and the
        recorder still records."""
        if msg.mtype != RIC_INDICATION or self.stopped is not None:
            return
        with self._lock:
            if self.stopped is not None:
                return
            t = max(float(msg.time), self._last)
            rec = _trace.TraceRecord(t, msg.e2_node, msg.mtype, bytes(msg.payload), msg.sub_id)
            size = _trace.record_size(rec)
            if self.bytes + size > self.max_bytes:
                self._stop(f"the trace reached its cap of {self.max_bytes} bytes (--record-max-mb)")
                return
            try:
                self._w.write(rec)
            except OSError as e:
                self._stop(f"write failed: {e}")
                return
            self._last = t
            self.bytes += size
            self.count += 1

    def _stop(self, why: str) -> None:
        self.stopped = why
        log.error("recording_stopped", path=self.path, records=self.count, bytes=self.bytes, reason=why)

    def close(self) -> None:
        """Close the file (idempotent); later messages are not written."""
        with self._lock:
            if self.stopped is None:
                self.stopped = "closed"
            if not self._f.closed:
                self._f.close()
