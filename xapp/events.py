"""The xApp's event log: one JSON line per decision and policy outcome.

The replay harness joins it with what the UEs saw (``t`` wall clock, ``trace_t`` trace clock).
Events stream to a file as they happen (line-buffered); memory holds only the most recent
``keep`` of them (for tests and status), so a long run's log never grows the process.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EventLog"]


class EventLog:
    """Append-only JSON-lines log of the xApp's decisions (thread-safe).

    ``path``: the file the events stream to (appended; None: memory only). ``keep``: how many of
    the latest events stay in :attr:`events` (0: none). Non-finite floats are written as null,
    numpy scalars as plain numbers.
    """

    def __init__(self, path: str | Path | None = None, keep: int = 10_000) -> None:
        self._fh = open(path, "a", buffering=1) if path else None
        self._lock = threading.Lock()
        self.keep = int(keep)
        self.events: deque[dict] = deque(maxlen=max(0, self.keep))
        self.written = 0

    def write(self, kind: str, **fields: Any) -> None:
        """Log one event of ``kind`` with ``fields`` (JSON-serialisable values)."""
        rec: dict[str, Any] = {"t": time.time(), "kind": kind}
        for k, v in fields.items():
            if isinstance(v, (np.floating, np.integer)):
                v = v.item()
            rec[k] = None if isinstance(v, float) and not math.isfinite(v) else v
        with self._lock:
            self.written += 1
            if self.keep:
                self.events.append(rec)
            if self._fh:
                self._fh.write(json.dumps(rec) + "\n")

    def close(self) -> None:
        """Close the file (idempotent); later events stay in memory only."""
        with self._lock:
            if self._fh:
                self._fh.close()
                self._fh = None
