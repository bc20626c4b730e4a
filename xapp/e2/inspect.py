"""Print what a trace, or one PDU, contains, decoded, as JSON lines.

    python -m xapp.e2.inspect TRACE.e2trace [--limit N]
    python -m xapp.e2.inspect --hex 0005404200... [--e2-node NAME] [--mtype 12050]

One line per message: ``time``, ``e2_node``, ``mtype`` (and its name), ``sub_id``; for a
RIC_INDICATION also ``ran_function``, ``service_model``, ``request`` (requestor/instance id),
``action``, ``sn`` and ``reports``: per UE the ``ue``, ``serving_cell``, ``serving_pci``,
serving ``rsrp_dbm``/``rsrq_db``/``sinr_db``, ``neighbours`` and ``lat``/``lon``/
``speed_mps``/``heading_deg`` when known; or ``error`` with the reason it could not be decoded.
A1 messages are shown as their JSON when they parse. Exit status 1 if any message failed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Iterable, Sequence, TextIO

from ..tracks import MeasurementReport
from .ingest import Dropped, IngestConfig, decode_indication
from .trace import TraceFormatError, TraceRecord, read_trace
from .transport import A1_POLICY_REQ, A1_POLICY_RESP, MTYPE_NAMES, RIC_INDICATION


def _num(x: float) -> float | None:
    return None if x != x or math.isinf(x) else round(x, 7)


def report_json(r: MeasurementReport) -> dict[str, Any]:
    """A MeasurementReport as a JSON-able dict (NaN values left out)."""
    d: dict[str, Any] = {"ue": r.ue_id, "serving_cell": r.serving_cell}
    if r.serving_pci >= 0:
        d["serving_pci"] = r.serving_pci
    for k in ("rsrp_dbm", "rsrq_db", "sinr_db", "lat", "lon", "speed_mps", "heading_deg"):
        v = _num(getattr(r, k))
        if v is not None:
            d[k] = v
    if r.neighbours:
        d["neighbours"] = [{k: v for k, v in (("pci", n.pci if n.pci >= 0 else None),
                                              ("rsrp_dbm", _num(n.rsrp_dbm)), ("rsrq_db", _num(n.rsrq_db)),
                                              ("sinr_db", _num(n.sinr_db))) if v is not None}
                           for n in r.neighbours]
    return d


def describe(rec: TraceRecord, config: IngestConfig) -> dict[str, Any]:
    """One record -> its JSON line as a dict (never raises)."""
    out: dict[str, Any] = {"time": rec.time, "e2_node": rec.e2_node, "mtype": rec.mtype,
                           "mtype_name": MTYPE_NAMES.get(rec.mtype, "unknown"), "sub_id": rec.sub_id}
    if rec.mtype == RIC_INDICATION:
        try:
            d = decode_indication(rec.payload, rec.e2_node, rec.time, config)
        except Dropped as e:
            out["error"] = e.reason
            return out
        except Exception as e:  # noqa: BLE001 - an inspector shows every failure, it never stops
            out["error"] = f"internal error: {type(e).__name__}: {e}"
            return out
        ind = d.indication
        out.update(ran_function=ind.ran_function_id, service_model=d.service_model,
                   request=[ind.ric_requestor_id, ind.ric_instance_id], action=ind.action_id,
                   sn=ind.sn, reports=[{**report_json(r), "rs": rs} for r, rs in zip(d.reports, d.rs)])
        if d.dropped:
            out["dropped"] = d.dropped
        if d.unused:
            out["unused"] = d.unused
        if d.kpm_values:
            out["kpm_values"] = {ue or "e2_node": {k: _num(v) if isinstance(v, float) else v for k, v in vals.items()}
                                 for ue, vals in d.kpm_values.items()}
    elif rec.mtype in (A1_POLICY_REQ, A1_POLICY_RESP):
        try:
            out["a1"] = json.loads(rec.payload)
        except ValueError as e:
            out["error"] = f"A1 payload is not JSON: {e}"
        except RecursionError:  # json's C decoder recurses per nesting level
            out["error"] = "A1 payload is not JSON: nested too deeply"
    else:
        out["payload_hex"] = rec.payload.hex()
    return out


def inspect_records(records: Iterable[TraceRecord], out: TextIO, config: IngestConfig | None = None,
                    limit: int | None = None) -> tuple[int, int]:
    """Write one JSON line per record; returns (messages, failures)."""
    cfg = config or IngestConfig()
    n = bad = 0
    for rec in records:
        if limit is not None and n >= limit:
            break
        d = describe(rec, cfg)
        bad += "error" in d
        out.write(json.dumps(d) + "\n")
        n += 1
    return n, bad


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    """``python -m xapp.e2.inspect``: print a trace file's messages, or one hex PDU, decoded as
    JSON lines on ``out`` (see :func:`describe`). Returns the process exit status."""
    ap = argparse.ArgumentParser(prog="python -m xapp.e2.inspect", description=__doc__.split("\n")[0])
    ap.add_argument("trace", nargs="?", help="a trace file (.e2trace)")
    ap.add_argument("--hex", help="one RMR payload as hex instead of a trace")
    ap.add_argument("--mtype", type=int, default=RIC_INDICATION, help="RMR message type of --hex (12050)")
    ap.add_argument("--e2-node", default="", help="E2 node name shown for --hex")
    ap.add_argument("--limit", type=int, default=None, help="stop after N messages")
    a = ap.parse_args(argv)
    if (a.trace is None) == (a.hex is None):
        ap.error("give a trace file or --hex, not both")
    if a.hex is not None:
        try:
            payload = bytes.fromhex(a.hex.replace(" ", ""))
        except ValueError as e:
            ap.error(f"--hex: {e}")
        records: Iterable[TraceRecord] = [TraceRecord(0.0, a.e2_node, a.mtype, payload)]
    else:
        records = read_trace(a.trace)
    try:
        _, bad = inspect_records(records, out, limit=a.limit)
    except (TraceFormatError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
