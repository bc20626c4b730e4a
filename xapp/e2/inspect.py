"""Print what a trace, or one PDU, contains, decoded, as JSON lines.

    python -m xapp.e2.inspect TRACE.e2trace [--limit N]
    python -m xapp.e2.inspect --hex 0005404200... [--e2-node NAME] [--mtype 12050]

One line per message: ``time``, ``e2_node``, ``mtype`` (and its name), ``sub_id``; for a
RIC_INDICATION also the E2AP fields (``ran_function``, ``request`` (requestor/instance id),
``action``, ``sn``, ``ind_type``, ``call_process_id``), ``service_model``, ``reports`` (what the
xApp's ingest makes of it: per UE the ``ue``, ``serving_cell``, ``serving_pci``, serving
``rsrp_dbm``/``rsrq_db``/``sinr_db``, ``neighbours`` and ``lat``/``lon``/``speed_mps``/
``heading_deg`` when known) and every field the service model's decoders read (``e2sm``):
- E2SM-KPM: ``format``, ``collect_start`` (Unix s) and ``collect_start_utc``, ``sender_name``,
  ``sender_type``, ``vendor_name``, ``file_format_version``, Format 1's ``granularity_ms``,
  ``ue_reports`` (per UE its identity ``ue`` (every UEID field), ``key``, ``granularity_ms``,
  latest ``values`` and ``periods``: one object of values per granularity period, oldest first),
  ``node_values`` and ``dropped`` (per-UE or per-value reasons);
- E2SM-RC: the ``header`` (format, condition id, UE identity, INSERT style/indication id), the
  ``ue`` identity and serving ``cell`` of the copy, ``ran_parameters`` (every ELEMENT of the RAN
  parameter tree: path, ID, key flag, value type and value) and the copied ``rrc``
  MeasurementReport (every serving and neighbour cell with SSB, CSI-RS and per-beam results,
  E-UTRA neighbours, location and velocity);
or ``error`` with the reason it could not be decoded (with the E2AP fields when that layer
decoded). A1 messages are shown as their JSON when they parse. Exit status 1 if any message
failed. Values: NaN left out, octets as hex, a malformed value as {"malformed": reason}.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import math
import sys
from typing import Any, Iterable, Sequence, TextIO

from ..tracks import MeasurementReport
from . import e2ap, rrc, sm_kpm, sm_rc
from .ingest import Dropped, IngestConfig, decode_indication
from .per import BadValue, Unsupported
from .trace import TraceFormatError, TraceRecord, read_trace
from .transport import A1_POLICY_REQ, A1_POLICY_RESP, MTYPE_NAMES, RIC_INDICATION


def _num(x: float) -> float | None:
    return None if x != x or math.isinf(x) else round(x, 7)


def jsonable(x: Any) -> Any:
    """A decoded value (dataclasses, NamedTuples, tuples, octets, floats) -> JSON-able: objects
    with their set fields (None, NaN, -1 ids and empty tuples left out), octets as hex,
    :class:`~.per.BadValue` as {"malformed": reason, "octets": hex}."""
    if isinstance(x, BadValue):
        return {"malformed": x.reason, "octets": x.octets.hex()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _object({f.name: getattr(x, f.name) for f in dataclasses.fields(x)})
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return _object(x._asdict())
    if isinstance(x, (bytes, bytearray)):
        return bytes(x).hex()
    if isinstance(x, float):
        return _num(x)
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, dict):
        return _object(x)
    return x


def _object(d: dict) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        j = jsonable(v)
        if j is None or j == [] or (k in ("pci", "amf_ue_ngap_id") and j == -1):
            continue
        out[str(k)] = j
    return out


def _values(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    return {k: jsonable(v) for k, v in pairs}


def kpm_json(k: sm_kpm.KpmIndication) -> dict[str, Any]:
    """Every field of a decoded E2SM-KPM indication (see the module docstring)."""
    t = k.collect_start
    out: dict[str, Any] = {"format": k.format, "collect_start": t}
    if math.isfinite(t):
        out["collect_start_utc"] = _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(
            timespec="microseconds").replace("+00:00", "Z")
    for f in ("sender_name", "sender_type", "vendor_name", "file_format_version", "granularity_ms"):
        if getattr(k, f) is not None:
            out[f] = getattr(k, f)
    out["ue_reports"] = [{"ue": jsonable(r.ue), "key": r.ue.key,
                          **({"granularity_ms": r.granularity_ms} if r.granularity_ms is not None else {}),
                          "values": _values(r.values), "periods": [_values(p) for p in r.periods]}
                         for r in k.ue_reports]
    if k.node_values:
        out["node_values"] = _values(k.node_values)
    if k.dropped:
        out["dropped"] = list(k.dropped)
    return out


def _leaf_json(leaf: sm_rc.RcLeaf) -> dict[str, Any]:
    path, pid, key, val = leaf
    d: dict[str, Any] = {"id": pid, "key": key}
    if path:
        d["in"] = path.rstrip("/")
    if val is None:
        d["type"] = None
    else:
        d["type"], d["value"] = val[0], jsonable(val[1])
        if val[0] == "valueBitS":
            d["value"] = {"bits": val[1][1], "hex": val[1][0].hex()}
    return d


def rc_json(header: bytes, message: bytes) -> dict[str, Any]:
    """Every field of an E2SM-RC message copy (see the module docstring). E2DecodeError as
    :func:`.sm_rc.decode_rc_message_copy` raises it."""
    copy = sm_rc.decode_rc_message_copy(header, message)
    try:
        leaves = sm_rc.rc_leaves_fast(message)
    except Unsupported:
        leaves = sm_rc.rc_leaves_asn1tools(message)
    out: dict[str, Any] = {"header": jsonable(sm_rc.decode_rc_header(header)), "ue": jsonable(copy.ue),
                           "ue_key": copy.ue.key}
    if copy.cell is not None:
        out["cell"] = jsonable(copy.cell)
    out["ran_parameters"] = [_leaf_json(x) for x in leaves]
    m = rrc.decode_rrc_meas_report(copy.rrc)
    out["rrc"] = {"message": "MeasurementReport", "octets": len(copy.rrc), **jsonable(m)}
    return out


def _kpm_version(rec: TraceRecord, config: IngestConfig) -> str | None:
    pinned = config.sm_versions.get(rec.e2_node) or config.sm_versions.get("*") or {}
    return pinned.get("kpm")


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
            ind = e2ap.decode_ric_indication(rec.payload)
        except Exception:  # noqa: BLE001 - decode_indication below says why
            ind = None
        if ind is not None:
            out.update(ran_function=ind.ran_function_id, request=[ind.ric_requestor_id, ind.ric_instance_id],
                       action=ind.action_id, sn=ind.sn, ind_type=ind.ind_type)
            if ind.call_process_id is not None:
                out["call_process_id"] = ind.call_process_id.hex()
        try:
            d = decode_indication(rec.payload, rec.e2_node, rec.time, config)
        except Dropped as e:
            out["error"] = e.reason
            return out
        except Exception as e:  # noqa: BLE001 - an inspector shows every failure, it never stops
            out["error"] = f"internal error: {type(e).__name__}: {e}"
            return out
        ind = d.indication
        out.update(service_model=d.service_model,
                   reports=[{**report_json(r), "rs": rs} for r, rs in zip(d.reports, d.rs)])
        try:
            if d.service_model == "kpm":
                out["e2sm"] = kpm_json(sm_kpm.decode_kpm_indication(
                    ind.header, ind.message, _kpm_version(rec, config)))
            else:
                out["e2sm"] = rc_json(ind.header, ind.message)
        except Exception as e:  # noqa: BLE001 - decoded once already; an inspector never stops
            out["e2sm_error"] = f"{type(e).__name__}: {e}"
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
