"""The E2 trace format of test mode: an ordered file of received RMR messages.

A trace is what the xApp would have received over RMR, kept byte for byte, so that test mode
replays exactly the PDUs a live RIC delivers (RIC_INDICATION 12050 with an E2AP RICindication,
A1_POLICY_REQ 20010 with A1 JSON, ...).

Layout (all integers little-endian)::

    file    := header record*
    header  := magic "PLLSE2TR" (8 octets) | version u16 (= 1) | reserved u16 (= 0)
    record  := time f64 | mtype i32 | sub_id i32 | node_len u16 | payload_len u32
               | e2_node (node_len octets, UTF-8) | payload (payload_len octets)

- ``time``: when the message was received (Unix time in s, float64); records are in
  non-decreasing time (the writer enforces it).
- ``mtype``: the RMR message type (12050 RIC_INDICATION, 20010 A1_POLICY_REQ, ...).
- ``sub_id``: the RMR subscription id (the E2 subscription's instance id; -1 if none).
- ``e2_node``: the sending E2 node's name (RMR MEID), e.g. ``gnb_001_01_00a81b0c``; empty for
  messages not from an E2 node.
- ``payload``: the raw RMR payload, e.g. the aligned-PER E2AP-PDU.

A file that ends inside a record, has a bad header, or holds a record whose time is NaN or
older than the previous record's raises :class:`TraceFormatError` with the offset.
"""

from __future__ import annotations

import math
import os
import struct
import time as _time
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterable, Iterator

MAGIC = b"PLLSE2TR"
VERSION = 1
_HEADER = struct.Struct("<8sHH")
_RECORD = struct.Struct("<diiHI")
HEADER_SIZE = _HEADER.size


def encode_record(r: "TraceRecord") -> bytes:
    """One record's octets (module docstring's ``record``)."""
    node = r.e2_node.encode("utf-8")
    return _RECORD.pack(r.time, r.mtype, r.sub_id, len(node), len(r.payload)) + node + bytes(r.payload)


def record_size(r: "TraceRecord") -> int:
    """The octets :func:`encode_record` makes of ``r``."""
    return _RECORD.size + len(r.e2_node.encode("utf-8")) + len(r.payload)


class TraceFormatError(ValueError):
    """A trace file is not in the format above (bad header, truncated record, disorder)."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One received RMR message: time (Unix s), E2 node, RMR message type, sub id, raw payload."""

    time: float
    e2_node: str
    mtype: int
    payload: bytes
    sub_id: int = -1


class TraceWriter:
    """Writes records to a binary file object or a path (str or os.PathLike), in
    non-decreasing time. Each record goes to the file object in one ``write`` call, so on an
    unbuffered file a killed writer leaves whole records (``xapp.e2.record``)."""

    def __init__(self, dest: str | os.PathLike | BinaryIO) -> None:
        self._own = isinstance(dest, (str, os.PathLike))
        self._f: BinaryIO = open(dest, "wb") if self._own else dest  # type: ignore[assignment]
        self._f.write(_HEADER.pack(MAGIC, VERSION, 0))
        self._last = float("-inf")
        self.count = 0

    def write(self, r: TraceRecord) -> None:
        """Append one record. ValueError if older than the previous one."""
        if not r.time >= self._last:
            raise ValueError(f"trace record at t={r.time} is older than the previous (t={self._last})")
        self._f.write(encode_record(r))
        self._last = r.time
        self.count += 1

    def close(self) -> None:
        """Close the file if this writer opened it, else flush the caller's stream."""
        if self._own:
            self._f.close()
        else:
            self._f.flush()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_trace(path: str | os.PathLike, records: Iterable[TraceRecord]) -> int:
    """Write ``records`` to ``path``; returns the number written."""
    with TraceWriter(path) as w:
        for r in records:
            w.write(r)
        return w.count


def read_trace(src: str | os.PathLike | BinaryIO) -> Iterator[TraceRecord]:
    """Yield the records of a trace file (a path, str or os.PathLike, or a binary file object),
    in file order. Raises :class:`TraceFormatError` (module docstring) where the file breaks
    the format, after yielding the records before that point."""
    own = isinstance(src, (str, os.PathLike))
    f: BinaryIO = open(src, "rb") if own else src  # type: ignore[assignment]
    try:
        h = f.read(_HEADER.size)
        if len(h) != _HEADER.size:
            raise TraceFormatError("trace shorter than its header")
        magic, version, _ = _HEADER.unpack(h)
        if magic != MAGIC:
            raise TraceFormatError(f"not a Pallas E2 trace (magic {magic!r})")
        if version != VERSION:
            raise TraceFormatError(f"unsupported trace version {version}")
        off = _HEADER.size
        last = -math.inf
        while True:
            fixed = f.read(_RECORD.size)
            if not fixed:
                return
            if len(fixed) != _RECORD.size:
                raise TraceFormatError(f"truncated record header at offset {off}")
            t, mtype, sub_id, nlen, plen = _RECORD.unpack(fixed)
            if not t >= last:
                raise TraceFormatError(f"record at offset {off} has time {t!r}, before the previous "
                                       f"record's {last!r} (or NaN)")
            last = t
            body = f.read(nlen + plen)
            if len(body) != nlen + plen:
                raise TraceFormatError(f"truncated record at offset {off}")
            try:
                node = body[:nlen].decode("utf-8")
            except UnicodeDecodeError:
                raise TraceFormatError(f"E2 node name not UTF-8 at offset {off}") from None
            yield TraceRecord(t, node, mtype, body[nlen:], sub_id)
            off += _RECORD.size + nlen + plen
    finally:
        if own:
            f.close()


def replay(records: Iterable[TraceRecord], on_record: Callable[[TraceRecord], None],
           speed: float | None = None, clock: Callable[[], float] = _time.monotonic,
           sleep: Callable[[float], None] = _time.sleep,
           stop: Callable[[], bool] = lambda: False) -> int:
    """Feed records to ``on_record`` in order.

    ``speed``: None or 0 = as fast as possible; 1.0 = at recorded speed (the gaps between
    record times are kept); 2.0 = twice as fast. ``stop()`` is polled before every record.
    Returns the number of records delivered.
    """
    n = 0
    t0_trace = t0_wall = None
    for r in records:
        if stop():
            break
        if speed:
            if t0_trace is None:
                t0_trace, t0_wall = r.time, clock()
            due = t0_wall + (r.time - t0_trace) / speed
            wait = due - clock()
            if wait > 0:
                sleep(wait)
        on_record(r)
        n += 1
    return n
