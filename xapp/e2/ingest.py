"""E2 ingestion: RICindication PDUs -> MeasurementReports -> UE tracks.

One :class:`Ingestor` per xApp. :meth:`Ingestor.on_indication` takes the raw payload of an RMR
RIC_INDICATION (12050) and:

1. decodes the E2AP RICindication (:func:`codec.decode_ric_indication`);
2. picks the service model by the RAN function ID (``IngestConfig.ran_functions``; RAN
   function IDs are the E2 node's, announced at E2 Setup; OSC's convention is 2 = KPM, 3 = RC);
3. E2SM-RC REPORT Style 1 (message copy): decodes the copied NR RRC MeasurementReport and
   makes one report for the UE, serving cell from RAN parameter 6 (Cell Global ID), serving
   values from the PCell (servCellId 0, else the first serving MO), NR neighbours with PCI;
   E2SM-KPM Format 3: one report per UE from the configured measurement names; a KPM report
   carries no serving cell, so it keeps the UE's last known one (-1 if none);
4. appends each report to its UE's track in the :class:`~xapp.tracks.TrackStore`.

Anything wrong (malformed or truncated PDU, unknown RAN function, unsupported format, unknown
measurement name, a report older than the UE's newest) is logged with the reason through
structlog, counted, and dropped; no exception leaves :meth:`on_indication`, and a bad PDU never
touches another UE's track.
"""

from __future__ import annotations

import math
import time as _time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import structlog
from prometheus_client import CollectorRegistry, Counter as PromCounter

from ..tracks import MeasurementReport, NeighbourMeas, TrackStore
from . import codec

NAN = float("nan")
log = structlog.get_logger("xapp.e2.ingest")

# MeasurementReport fields a KPM measurement may fill: (unit, lowest, highest accepted value).
# Ranges are the measurement's physical or coding range (TS 38.133 ranges widened by 10 dB for
# vendor reporting); a value outside is dropped with a reason.
KPM_FIELDS = {
    "rsrp_dbm": ("dBm", -170.0, -20.0), "rsrq_db": ("dB", -53.0, 30.0), "sinr_db": ("dB", -33.0, 50.0),
    "lat": ("deg", -90.0, 90.0), "lon": ("deg", -180.0, 180.0), "speed_mps": ("m/s", 0.0, 600.0),
    "heading_deg": ("deg", 0.0, 360.0), "serving_cell": ("NR cell identity", 0, (1 << 36) - 1),
    "serving_pci": ("PCI", 0, 1007),
}

#: Default KPM measurement names (configurable): 3GPP TS 28.552 has no per-UE serving RSRP/RSRQ/
#: SINR measurement, so these follow its naming (L1M family) and an E2 node must be configured
#: to report them under these names, or the xApp configured with the E2 node's names.
DEFAULT_KPM_MEASUREMENTS: Mapping[str, str] = {
    "L1M.SS-RSRP": "rsrp_dbm",
    "L1M.SS-RSRQ": "rsrq_db",
    "L1M.SS-SINR": "sinr_db",
}


@dataclass(frozen=True)
class IngestConfig:
    """Ingestion settings (from the xApp descriptor's ``controls``).

    ``ran_functions``: RAN function ID -> service model, 'rc' or 'kpm'.
    ``kpm_measurements``: KPM measurement name -> MeasurementReport field (a key of
    :data:`KPM_FIELDS`); values must already be in that field's unit.
    """

    ran_functions: Mapping[int, str] = field(default_factory=lambda: {2: "kpm", 3: "rc"})
    kpm_measurements: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_KPM_MEASUREMENTS))

    def __post_init__(self) -> None:
        for rf, sm in self.ran_functions.items():
            if sm not in ("rc", "kpm") or not 0 <= int(rf) <= 4095:
                raise ValueError(f"ran_functions: {rf} -> {sm!r} (need 0..4095 -> 'rc'|'kpm')")
        for name, fld in self.kpm_measurements.items():
            if fld not in KPM_FIELDS:
                raise ValueError(f"kpm_measurements: {name!r} -> unknown field {fld!r}")


class Dropped(Exception):
    """An indication (or one UE's part of it) was dropped; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Decoded:
    """One decoded indication: the E2AP part, the service model, the reports it yields and the
    reasons any part of it was dropped."""

    indication: codec.RicIndication
    service_model: str
    reports: list[MeasurementReport]
    dropped: list[str]


def report_from_rc(copy: codec.RcMessageCopy, rrc: codec.RrcMeasReport, t: float, e2_node: str) -> MeasurementReport:
    """E2SM-RC message copy + its decoded MeasurementReport -> MeasurementReport (PCell values)."""
    if not rrc.serving:
        raise Dropped("MeasurementReport has no serving cell result")
    pcell = next((s for s in rrc.serving if s.serv_cell_index == 0), rrc.serving[0]).cell
    return MeasurementReport(
        time=t, ue_id=copy.ue.key, serving_cell=copy.cell.cell_id if copy.cell is not None else -1,
        rsrp_dbm=pcell.rsrp_dbm, rsrq_db=pcell.rsrq_db, sinr_db=pcell.sinr_db,
        neighbours=tuple(NeighbourMeas(pci=n.pci, rsrp_dbm=n.rsrp_dbm, rsrq_db=n.rsrq_db, sinr_db=n.sinr_db)
                         for n in rrc.neighbours),
        serving_pci=pcell.pci, lat=rrc.lat, lon=rrc.lon, speed_mps=rrc.speed_mps,
        heading_deg=rrc.heading_deg, e2_node=e2_node, connected=True)


def decode_indication(payload: bytes, e2_node: str, t: float, config: IngestConfig,
                      last_cell: Callable[[str], int] = lambda ue: -1) -> Decoded:
    """Decode one RIC_INDICATION payload into MeasurementReports (touches no track).

    Raises :class:`Dropped` when the whole indication must be dropped; per-UE or
    per-measurement problems of a KPM indication are listed in ``Decoded.dropped``.
    """
    try:
        ind = codec.decode_ric_indication(payload)
    except codec.E2DecodeError as e:
        raise Dropped(f"E2AP: {e.reason}") from None
    sm = config.ran_functions.get(ind.ran_function_id)
    if sm is None:
        raise Dropped(f"unknown RAN function {ind.ran_function_id}")
    dropped: list[str] = []
    try:
        if sm == "rc":
            copy = codec.decode_rc_message_copy(ind.header, ind.message)
            rrc = codec.decode_rrc_meas_report(copy.rrc)
            reports = [report_from_rc(copy, rrc, t, e2_node)]
        else:
            k = codec.decode_kpm_indication(ind.header, ind.message)
            reports = []
            for ur in k.ue_reports:
                fields: dict[str, Any] = {}
                for name, val in ur.values:
                    fld = config.kpm_measurements.get(name)
                    if fld is None:
                        dropped.append(f"unknown measurement name {name!r} (UE {ur.ue.key})")
                        continue
                    if val is None:
                        continue
                    _, lo, hi = KPM_FIELDS[fld]
                    if not lo <= val <= hi:  # also false for NaN
                        dropped.append(f"value out of range: {name}={val!r} (UE {ur.ue.key})")
                        continue
                    fields[fld] = int(val) if fld in ("serving_cell", "serving_pci") else float(val)
                if not fields:
                    dropped.append(f"UE {ur.ue.key}: no known measurement")
                    continue
                fields.setdefault("serving_cell", last_cell(ur.ue.key))
                reports.append(MeasurementReport(time=t, ue_id=ur.ue.key, e2_node=e2_node, **fields))
    except codec.E2DecodeError as e:
        raise Dropped(f"E2SM-{sm.upper()}: {e.reason}") from None
    return Decoded(ind, sm, reports, dropped)


class Ingestor:
    """RIC_INDICATION payloads in, UE tracks out. Thread-compatible, not thread-safe: call it
    from the one RMR receive thread (RMRXapp dispatches callbacks from one thread).

    ``stats`` counts outcomes: 'indications', 'reports', and 'dropped:<kind>' per reason kind.
    Metrics (prometheus-client, on ``registry`` if given): ``pallas_e2_indications_total``
    {outcome} and ``pallas_e2_reports_total``.
    """

    def __init__(self, store: TrackStore, config: IngestConfig | None = None,
                 registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = _time.time) -> None:
        self.store = store
        self.config = config or IngestConfig()
        self.clock = clock
        self.stats: Counter[str] = Counter()
        self._m_ind = PromCounter("pallas_e2_indications", "RIC indications by outcome",
                                  ["outcome"], registry=registry)
        self._m_rep = PromCounter("pallas_e2_reports", "UE measurement reports added to tracks",
                                  registry=registry)

    def _last_cell(self, ue: str) -> int:
        t = self.store.get(ue)
        return t.last_report.serving_cell if t is not None and t.last_report is not None else -1

    def _drop(self, reason: str, **ctx: Any) -> None:
        kind = reason.split(":")[0].split(" (")[0]
        self.stats[f"dropped:{kind}"] += 1
        log.warning("e2_dropped", reason=reason, **ctx)

    def on_indication(self, payload: bytes, e2_node: str = "", t: float | None = None,
                      sub_id: int = -1) -> list[MeasurementReport]:
        """Decode one RIC_INDICATION payload and append its reports to the tracks.

        ``t``: the report time in s (the trace record's time in test mode; receipt time from
        ``clock`` when None). Returns the reports added; never raises.
        """
        t = self.clock() if t is None else t
        self.stats["indications"] += 1
        ctx = {"e2_node": e2_node, "sub_id": sub_id, "bytes": len(payload)}
        try:
            d = decode_indication(payload, e2_node, t, self.config, self._last_cell)
        except Dropped as e:
            self._m_ind.labels("dropped").inc()
            self._drop(e.reason, **ctx)
            return []
        except Exception as e:  # noqa: BLE001 - last line of defence: a PDU never stops the xApp
            self._m_ind.labels("dropped").inc()
            self._drop(f"internal error: {type(e).__name__}: {e}", **ctx)
            return []
        for reason in d.dropped:
            self._drop(reason, ran_function=d.indication.ran_function_id, **ctx)
        added = []
        for r in d.reports:
            if not (math.isfinite(r.time)):
                self._drop("non-finite report time", ue=r.ue_id, **ctx)
                continue
            try:
                self.store.add(r)
            except ValueError as e:
                self._drop(f"out of order: {e}", ue=r.ue_id, **ctx)
                continue
            added.append(r)
        self.stats["reports"] += len(added)
        self._m_ind.labels("ok").inc()
        self._m_rep.inc(len(added))
        return added
