"""E2 ingestion: RICindication PDUs -> MeasurementReports -> UE tracks.

One :class:`Ingestor` per xApp. :meth:`Ingestor.on_indication` takes the raw payload of an RMR
RIC_INDICATION (12050) and:

1. decodes the E2AP RICindication (:func:`.e2ap.decode_ric_indication`);
2. picks the service model by the RAN function ID (``IngestConfig.ran_functions``; RAN
   function IDs are the E2 node's, announced at E2 Setup; OSC's convention is 2 = KPM, 3 = RC)
   and its version: pinned per E2 node in ``IngestConfig.sm_versions``, else what the node
   declared for the RAN function (its RAN function OID, as the E2 manager holds it:
   :meth:`Ingestor.declare_ran_function`, :func:`versions_from_nodeb`), else the default;
3. E2SM-RC REPORT Style 1 (message copy, :mod:`.sm_rc`, header Formats 1-3): decodes the
   copied NR RRC MeasurementReport (:mod:`.rrc`) and makes one report for the UE, serving cell
   from RAN parameter 6 (Cell Global ID), serving values from the PCell (servCellId 0, else the
   first serving MO) on its SSB cell results, or on its CSI-RS cell results when the SSB ones
   are absent (labelled: ``Decoded.rs``), NR neighbours with PCI on the same reference signal;
   E2SM-KPM (:mod:`.sm_kpm`, Formats 1-3): one report per UE from its latest valid values of
   the mapped measurement names; every other name is kept as a value (``Decoded.kpm_values``,
   ``Ingestor.kpm_values``); a KPM report carries no serving cell, so it keeps the UE's last
   known one (-1 if none);
4. appends each report to its UE's track in the :class:`~xapp.tracks.TrackStore`.

Anything wrong (malformed or truncated PDU, unknown RAN function, unsupported format, a report
older than the UE's newest) is logged with the reason through structlog, counted
(``dropped:<kind>``) and dropped; a problem confined to one UE drops that UE only. Every value
read but not used (SCell results, per-beam results, E-UTRA neighbours, a neighbour measured on
another reference signal than the serving cell) is counted with its reason (``unused:<kind>``).
No exception leaves :meth:`on_indication`, and a bad PDU never touches another UE's track.
"""

from __future__ import annotations

import math
import re
import time as _time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily

from ..tracks import MeasurementReport, NeighbourMeas, TrackStore
from . import e2ap, rrc, sm_kpm, sm_rc
from .ie import E2DecodeError
from .per import Unsupported

NAN = float("nan")
_SSB = ("ssb",)
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
    #: E2 node name (or "*" for every node) -> {"kpm": "2.03", ...}: pinned E2SM versions that
    #: override what the node declared (descriptor ``controls.e2.sm_versions``)
    sm_versions: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for node, vs in self.sm_versions.items():
            for sm, v in vs.items():
                if sm == "kpm":
                    sm_kpm.kpm_family(v)  # ValueError for an unknown version
                elif sm != "rc":
                    raise ValueError(f"sm_versions[{node!r}]: unknown service model {sm!r}")
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
    """One decoded indication: the E2AP part, the service model, the reports it yields, the
    reasons any part of it was dropped, the values read but not used (``unused``: reasons), the
    reference signal each report's serving/neighbour values come from (``rs``: 'ssb' or
    'csi-rs', one per report; KPM reports say 'kpm') and the KPM values per UE key (every
    measurement name, mapped or not; ``""`` for E2 node values)."""

    indication: e2ap.RicIndication
    service_model: str
    reports: list[MeasurementReport]
    dropped: list[str]
    unused: list[str] = field(default_factory=list)
    rs: list[str] = field(default_factory=list)
    kpm_values: dict[str, dict[str, Any]] = field(default_factory=dict)


def _rs_values(c: rrc.CellResult, rs: str) -> tuple[float, float, float]:
    return (c.rsrp_dbm, c.rsrq_db, c.sinr_db) if rs == "ssb" else (c.csi_rsrp_dbm, c.csi_rsrq_db, c.csi_sinr_db)


def report_from_rc(copy: sm_rc.RcMessageCopy, m: rrc.RrcMeasReport, t: float, e2_node: str,
                   unused: list[str] | None = None) -> tuple[MeasurementReport, str]:
    """E2SM-RC message copy + its decoded MeasurementReport -> (MeasurementReport, reference
    signal). The PCell's SSB cell results, or its CSI-RS cell results when it has no SSB ones
    (TS 38.331 MeasResultNR: either may be configured); neighbours on the same reference
    signal. Each value left out is appended to ``unused`` with its reason. Raises
    :class:`Dropped` when there is no serving cell result with values."""
    if not m.serving:
        raise Dropped("MeasurementReport has no serving cell result")
    unused = [] if unused is None else unused
    ps = next((s for s in m.serving if s.serv_cell_index == 0), m.serving[0])
    pcell = ps.cell
    ue = copy.ue.key
    rs = "ssb" if pcell.has_ssb else "csi-rs" if pcell.has_csi_rs else ""
    if not rs:
        raise Dropped(f"MeasurementReport serving cell has no cell-level results (UE {ue})")
    if rs == "ssb" and pcell.has_csi_rs:
        unused.append(f"CSI-RS cell results of the PCell (SSB used) (UE {ue})")
    for s in m.serving:
        if s is not ps:
            unused.append(f"SCell results (servCellId {s.serv_cell_index}) (UE {ue})")
    nbs = []
    for c in (pcell, *m.neighbours):
        if c.beams:
            unused.append(f"per-beam results ({len(c.beams)} beams, PCI {c.pci}) (UE {ue})")
    for n in m.neighbours:
        vals = _rs_values(n, rs)
        other = "csi-rs" if rs == "ssb" else "ssb"
        if any(v == v for v in _rs_values(n, other)):
            unused.append(f"neighbour {other.upper()} results (serving on {rs.upper()}, PCI {n.pci}) (UE {ue})")
        if not any(v == v for v in vals) and not n.beams and not any(v == v for v in _rs_values(n, other)):
            unused.append(f"neighbour without results (PCI {n.pci}) (UE {ue})")
        if any(v == v for v in vals):
            nbs.append(NeighbourMeas(pci=n.pci, rsrp_dbm=vals[0], rsrq_db=vals[1], sinr_db=vals[2]))
    for e in m.eutra_neighbours:
        unused.append(f"E-UTRA neighbour (PCI {e.pci}, RSRP index {e.rsrp_index}) (UE {ue})")
    rsrp, rsrq, sinr = _rs_values(pcell, rs)
    return MeasurementReport(
        time=t, ue_id=ue, serving_cell=copy.cell.cell_id if copy.cell is not None else -1,
        rsrp_dbm=rsrp, rsrq_db=rsrq, sinr_db=sinr, neighbours=tuple(nbs),
        serving_pci=pcell.pci, lat=m.lat, lon=m.lon, speed_mps=m.speed_mps,
        heading_deg=m.heading_deg, e2_node=e2_node, connected=True), rs


def report_from_ssb(copy: sm_rc.RcMessageCopy, m: rrc.SsbMeasReport, t: float, e2_node: str) -> MeasurementReport:
    """E2SM-RC message copy + its MeasurementReport of the common SSB shape
    (:func:`rrc.decode_ssb_meas_report`) -> MeasurementReport: what :func:`report_from_rc`
    makes of the same report (one serving MO, every value used), without the general path's
    per-cell checks."""
    return _ssb_report(t, copy.ue.key, copy.cell.cell_id if copy.cell is not None else -1, m, e2_node)


def _ssb_report(t: float, ue: str, cell: int, m: rrc.SsbMeasReport, e2_node: str) -> MeasurementReport:
    get = _NB_MEMO.get
    nbs = tuple([get(c) or _neighbour(c) for c in m.neighbour_codes])
    return MeasurementReport(t, ue, cell, m.rsrp_dbm, m.rsrq_db, m.sinr_db, nbs, m.pci, m.lat, m.lon, m.speed_mps,
                             m.heading_deg, e2_node, True)


def rc_ssb_report(payload: bytes, e2_node: str, t: float, config: IngestConfig) -> MeasurementReport:
    """The fast path of :func:`decode_indication` for the indication E2 nodes send most: a
    RICindication of an E2SM-RC RAN function carrying a plain message copy
    (:func:`.sm_rc.message_copy_parts`) of an NR MeasurementReport of the common SSB shape
    (:func:`.rrc.decode_ssb_meas_report`) -> its MeasurementReport, equal to the one
    ``decode_indication`` makes (reference signal 'ssb', nothing unused or dropped), without
    its intermediate objects. Raises (:class:`~.per.Unsupported`, E2DecodeError) for anything
    else: decode it with ``decode_indication`` then, for its reports or its reasons."""
    ran, header, message = e2ap.indication_parts(payload)
    if config.ran_functions.get(ran) != "rc":
        raise Unsupported("not an E2SM-RC RAN function")
    copy, ue, cell = sm_rc.message_copy_parts(header, message)
    return _ssb_report(t, ue, cell, rrc.decode_ssb_meas_report(copy), e2_node)


#: cell code -> its NeighbourMeas (immutable, so one object serves every report that carries
#: the same PCI and quantised values); emptied when it reaches _NB_MEMO_MAX entries
_NB_MEMO: dict[int, NeighbourMeas] = {}
_NB_MEMO_MAX = 16384


def _neighbour(code: int) -> NeighbourMeas:
    if len(_NB_MEMO) >= _NB_MEMO_MAX:
        _NB_MEMO.clear()
    pci, rsrp, rsrq, sinr = rrc.ssb_cell_values(code)
    nb = _NB_MEMO[code] = NeighbourMeas(pci, -1, rsrp, rsrq, sinr)
    return nb


#: RAN function OID arcs (O-RAN E2SM modules: iso(1) identified-organization(3) dod(6)
#: internet(1) private(4) enterprise(1) oran(53148) e2(1) version(N) e2sm(2) <module>(M)):
#: module 2 = E2SM-KPM, 3 = E2SM-RC
_OID_PREFIX = "1.3.6.1.4.1.53148.1."
_OID_SM = {"2": "kpm", "3": "rc"}
#: the version an OID's version arc stands for (the OID carries the major version only)
_OID_VERSION = {"kpm": {"1": "1.00", "2": "2.03", "3": "3.00", "4": "4.00"},
                "rc": {"1": "1.03", "2": "2.00", "3": "3.00", "4": "4.00"}}


def sm_version_from_oid(oid: str) -> tuple[str, str] | None:
    """A RAN function OID (E2AP RANfunctionOID, as e2mgr's nodeb record holds it) -> (service
    model 'kpm'|'rc', version), or None when it is not an E2SM-KPM/RC OID Pallas knows."""
    if not isinstance(oid, str) or not oid.startswith(_OID_PREFIX):
        return None
    arcs = oid[len(_OID_PREFIX):].split(".")
    if len(arcs) != 3 or arcs[1] != "2" or arcs[2] not in _OID_SM:
        return None
    sm = _OID_SM[arcs[2]]
    v = _OID_VERSION[sm].get(arcs[0])
    return (sm, v) if v is not None else None


_OID_IN_TEXT = re.compile(rb"1\.3\.6\.1\.4\.1\.53148\.1\.[0-9]+\.2\.[0-9]+")


def declared_version(oid: str = "", definition: str | bytes = b"") -> tuple[str, str] | None:
    """What a RAN function declares: its RAN function OID (E2AP v02.00 on) or, when that is
    empty, the E2SM OID inside its RAN function definition (``RANfunction-Name.ranFunction-E2SM-OID``,
    a PrintableString that aligned PER writes as plain octets; the definition as octets or as
    e2mgr's hex string) -> (service model, version), or None."""
    got = sm_version_from_oid(oid) if oid else None
    if got is None and definition:
        raw = definition
        if isinstance(raw, str):
            try:
                raw = bytes.fromhex(raw)
            except ValueError:
                raw = raw.encode("latin-1", "replace")
        m = _OID_IN_TEXT.search(raw)
        got = sm_version_from_oid(m.group().decode()) if m else None
    return got


def _get(x: Any, *names: str) -> Any:
    for n in names:
        if isinstance(x, Mapping):
            if n in x:
                return x[n]
        elif hasattr(x, n):
            return getattr(x, n)
    return None


def versions_from_nodeb(nodeb: Any) -> dict[int, tuple[str, str]]:
    """The E2 manager's nodeb record -> {RAN function ID: (service model, version)} for the
    E2SM-KPM/RC functions it declares. Accepts e2mgr's REST JSON (GET /v1/nodeb/{ranName}:
    ``gnb.ranFunctions[]`` with ``ranFunctionId``, ``ranFunctionOid``, ``ranFunctionDefinition``)
    or the R-NIB ``NodebInfo`` protobuf (ricxappframe ``GetNodeb``: ``gnb.ran_functions[]``);
    functions of other service models are left out."""
    out: dict[int, tuple[str, str]] = {}
    for kind in ("gnb", "enb"):
        node = _get(nodeb, kind)
        for f in _get(node, "ranFunctions", "ran_functions") or () if node is not None else ():
            rid = _get(f, "ranFunctionId", "ran_function_id")
            got = declared_version(_get(f, "ranFunctionOid", "ran_function_oid") or "",
                                   _get(f, "ranFunctionDefinition", "ran_function_definition") or b"")
            if got is not None and isinstance(rid, int) and 0 <= rid <= 4095:
                out[rid] = got
    return out


def decode_indication(payload: bytes, e2_node: str, t: float, config: IngestConfig,
                      last_cell: Callable[[str], int] = lambda ue: -1,
                      declared: Mapping[tuple[str, int], str] | None = None) -> Decoded:
    """Decode one RIC_INDICATION payload into MeasurementReports (touches no track).

    ``declared``: (E2 node, RAN function ID) -> the version the node declared; the pinned
    ``config.sm_versions`` win over it. Raises :class:`Dropped` when the whole indication must
    be dropped; per-UE or per-measurement problems are listed in ``Decoded.dropped``.
    """
    try:
        ind = e2ap.decode_ric_indication(payload)
    except E2DecodeError as e:
        raise Dropped(f"E2AP: {_unprefixed(e.reason, 'E2AP')}") from None
    sm = config.ran_functions.get(ind.ran_function_id)
    if sm is None:
        raise Dropped(f"unknown RAN function: {ind.ran_function_id}")
    pinned = config.sm_versions.get(e2_node) or config.sm_versions.get("*") or {}
    version = pinned.get(sm) or (declared or {}).get((e2_node, ind.ran_function_id))
    d = Decoded(ind, sm, [], [])
    try:
        if sm == "rc":
            copy = sm_rc.decode_rc_message_copy(ind.header, ind.message)
            try:
                rep, rs = report_from_ssb(copy, rrc.decode_ssb_meas_report(copy.rrc), t, e2_node), "ssb"
            except Unsupported:       # any other shape: the general walker (pycrate behind it)
                m = rrc.decode_rrc_meas_report(copy.rrc)
                rep, rs = report_from_rc(copy, m, t, e2_node, d.unused)
            d.reports.append(rep)
            d.rs.append(rs)
        else:
            k = sm_kpm.decode_kpm_indication(ind.header, ind.message, version)
            d.dropped.extend(k.dropped)
            if k.node_values:
                d.kpm_values[""] = dict(k.node_values)
            for ur in k.ue_reports:
                key = ur.ue.key
                d.kpm_values[key] = dict(ur.values)
                if len(ur.periods) > 1:
                    d.unused.append(f"earlier granularity periods ({len(ur.periods) - 1}, latest values used) (UE {key})")
                fields: dict[str, Any] = {}
                for name, val in ur.values:
                    fld = config.kpm_measurements.get(name)
                    if fld is None or val is None:
                        continue  # kept as a value (kpm_values); noValue in every period
                    _, lo, hi = KPM_FIELDS[fld]
                    if not lo <= val <= hi:  # also false for NaN
                        d.dropped.append(f"value out of range: {name}={val!r} (UE {key})")
                        continue
                    fields[fld] = int(val) if fld in ("serving_cell", "serving_pci") else float(val)
                if not fields:
                    d.unused.append(f"no mapped measurement (UE {key})")
                    continue
                fields.setdefault("serving_cell", last_cell(key))
                d.reports.append(MeasurementReport(time=t, ue_id=key, e2_node=e2_node, **fields))
                d.rs.append("kpm")
    except E2DecodeError as e:
        layer = f"E2SM-{sm.upper()}"
        raise Dropped(f"{layer}{' v' + version if version else ''}: {_unprefixed(e.reason, layer)}") from None
    return d


def _unprefixed(reason: str, layer: str) -> str:
    """``reason`` without a leading ``layer`` name (the decoders name their layer too, which
    the drop reason already starts with: "E2SM-RC: E2SM-RC message copy ..." reads
    "E2SM-RC: message copy ...")."""
    if reason.startswith(layer) and reason[len(layer):len(layer) + 1] in (" ", ":"):
        rest = reason[len(layer):].lstrip(": ")
        return rest or reason
    return reason


_PARENS = re.compile(r"\s*\([^()]*\)")
_LAYER = re.compile(r"^(E2AP|E2SM-[A-Z]+)( v[0-9.]+)?$")


def reason_class(reason: str) -> str:
    """A drop reason without its variable details, for a metric label: parenthesised parts
    removed, a layer's version dropped, cut after the first clause that follows the layer
    ("E2SM-KPM v2.03: record count: measData item 3 ..." -> "E2SM-KPM: record count"; "value
    out of range: L1M.SS-RSRP=NaN (UE 7)" -> "value out of range"); at most 80 characters."""
    r = reason
    for _ in range(3):                                  # nested parentheses, innermost first
        r = _PARENS.sub("", r)
    parts = r.split(": ")
    m = _LAYER.match(parts[0])
    if m and len(parts) > 1:
        out = f"{m.group(1)}: {parts[1]}"
    else:
        out = parts[0]
    return " ".join(out.split())[:80]


class Ingestor:
    """RIC_INDICATION payloads in, UE tracks out. Thread-compatible, not thread-safe: call it
    from the one RMR receive thread (RMRXapp dispatches callbacks from one thread).

    ``stats`` counts outcomes: 'indications', 'reports', 'dropped:<kind>' per drop reason kind,
    'unused:<kind>' per kind of value read but not used, 'rs:<ssb|csi-rs|kpm>' per report's
    source. ``kpm_values``: per UE key its latest KPM values by measurement name (every name,
    mapped or not; ``max_kpm_ues`` most recent UEs kept). Metrics (prometheus-client, on
    ``registry`` if given): ``pallas_e2_indications_total`` {outcome},
    ``pallas_e2_reports_total``, ``pallas_e2_dropped_total`` {reason} (:func:`reason_class`; an
    indication dropped whole and one UE's report dropped count one each) and
    ``pallas_e2_unused_total`` {kind}.
    """

    def __init__(self, store: TrackStore, config: IngestConfig | None = None,
                 registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = _time.time, max_kpm_ues: int = 65536) -> None:
        self.store = store
        self.declared: dict[tuple[str, int], str] = {}
        self.kpm_values: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.max_kpm_ues = max_kpm_ues
        self.config = config or IngestConfig()
        self.clock = clock
        self.stats: Counter[str] = Counter()
        #: drops per :func:`reason_class` (at most MAX_REASON_CLASSES, the rest as "other")
        self.reasons: Counter[str] = Counter()
        self._n_dropped = 0                            # indications dropped whole
        if registry is not None:
            registry.register(self)                    # metrics read at scrape time: collect()

    def _last_cell(self, ue: str) -> int:
        t = self.store.get(ue)
        return t.last_report.serving_cell if t is not None and t.last_report is not None else -1

    def declare_ran_function(self, e2_node: str, ran_function_id: int, oid: str) -> tuple[str, str] | None:
        """Record the E2SM version an E2 node declared for a RAN function (its RAN function OID,
        as the E2 manager holds it: see :func:`versions_from_nodeb`). Returns (service model,
        version), or None when the OID is not one of E2SM-KPM/RC (nothing recorded)."""
        got = sm_version_from_oid(oid)
        if got is not None:
            self.declared[(e2_node, int(ran_function_id))] = got[1]
        return got

    def declare_nodeb(self, e2_node: str, nodeb: Any) -> dict[int, tuple[str, str]]:
        """Record every E2SM version an E2 node's nodeb record declares (:func:`versions_from_nodeb`)."""
        got = versions_from_nodeb(nodeb)
        for rid, (_, v) in got.items():
            self.declared[(e2_node, rid)] = v
        return got

    @staticmethod
    def _kind(reason: str) -> str:
        """The counted kind of a reason: its text before the first ':' or ' (' (the variable
        details follow those), at most 60 characters, so that untrusted PDUs cannot grow
        ``stats`` without bound."""
        return reason.split(":")[0].split(" (")[0][:60]

    MAX_REASON_CLASSES = 64

    def _drop(self, reason: str, **ctx: Any) -> None:
        self.stats[f"dropped:{self._kind(reason)}"] += 1
        cls = reason_class(reason)
        if cls not in self.reasons and len(self.reasons) >= self.MAX_REASON_CLASSES:
            cls = "other"
        self.reasons[cls] += 1
        log.warning("e2_dropped", reason=reason, **ctx)

    def on_indication(self, payload: bytes, e2_node: str = "", t: float | None = None,
                      sub_id: int = -1) -> list[MeasurementReport]:
        """Decode one RIC_INDICATION payload and append its reports to the tracks.

        ``t``: the report time in s (the trace record's time in test mode; receipt time from
        ``clock`` when None). Returns the reports added; never raises.
        """
        t = self.clock() if t is None else t
        stats = self.stats
        stats["indications"] += 1
        ctx = {"e2_node": e2_node, "sub_id": sub_id, "bytes": len(payload)}
        try:                          # the common shape first (rc_ssb_report), else the full decode
            reports, rss = [rc_ssb_report(payload, e2_node, t, self.config)], _SSB
        except Exception:  # noqa: BLE001 - the full decode says what is wrong
            try:
                d = decode_indication(payload, e2_node, t, self.config, self._last_cell, self.declared)
            except Dropped as e:
                self._n_dropped += 1
                self._drop(e.reason, **ctx)
                return []
            except Exception as e:  # noqa: BLE001 - last line of defence: a PDU never stops the xApp
                self._n_dropped += 1
                self._drop(f"internal error: {type(e).__name__}: {e}", **ctx)
                return []
            self._note(d, e2_node, ctx)
            reports, rss = d.reports, d.rs
        added = []
        for r, rs in zip(reports, rss):
            if not (math.isfinite(r.time)):
                self._drop("non-finite report time", ue=r.ue_id, **ctx)
                continue
            try:
                self.store.add(r)
            except ValueError as e:
                self._drop(f"out of order: {e}", ue=r.ue_id, **ctx)
                continue
            added.append(r)
            stats["rs:" + rs] += 1
        stats["reports"] += len(added)
        return added

    def _note(self, d: Decoded, e2_node: str, ctx: dict[str, Any]) -> None:
        """Count and log what a decoded indication dropped and left unused; keep its KPM values."""
        for reason in d.dropped:
            self._drop(reason, ran_function=d.indication.ran_function_id, **ctx)
        for reason in d.unused:
            self.stats[f"unused:{self._kind(reason)}"] += 1
            log.debug("e2_unused", reason=reason, **ctx)
        for key, vals in d.kpm_values.items():
            k = key or f"node:{e2_node}"
            self.kpm_values.pop(k, None)
            self.kpm_values[k] = vals
            if len(self.kpm_values) > self.max_kpm_ues:
                self.kpm_values.popitem(last=False)

    def collect(self) -> Iterator[CounterMetricFamily]:
        """The metrics (prometheus-client custom collector), read from the counts at scrape
        time so that an indication costs no metric update."""
        ind = CounterMetricFamily("pallas_e2_indications", "RIC indications by outcome", labels=["outcome"])
        ind.add_metric(["ok"], self.stats["indications"] - self._n_dropped)
        if self._n_dropped:
            ind.add_metric(["dropped"], self._n_dropped)
        yield ind
        rep = CounterMetricFamily("pallas_e2_reports", "UE measurement reports added to tracks")
        rep.add_metric([], self.stats["reports"])
        yield rep
        drop = CounterMetricFamily("pallas_e2_dropped", "indications or UE reports dropped, by reason "
                                   "(reason_class: the reason without its details)", labels=["reason"])
        for cls, n in list(self.reasons.items()):
            drop.add_metric([cls], n)
        yield drop
        unused = CounterMetricFamily("pallas_e2_unused", "values read but not used, by kind", labels=["kind"])
        for k, n in list(self.stats.items()):
            if k.startswith("unused:"):
                unused.add_metric([k[7:]], n)
        yield unused


def decode_trace(path: str, config: IngestConfig | None = None) -> tuple[list[tuple[float, MeasurementReport]], dict]:
    """Every RIC_INDICATION of the E2 trace at ``path`` (``xapp.e2.trace`` format) through the
    xApp's own ingest: ``([(record time s, report)], ingest stats)``, in file order.

    What the xApp would make of the trace if it received it live (undecodable indications are
    counted in the stats and dropped, as live). Raises ``TraceFormatError`` where the file
    breaks the trace format and ``OSError`` if it cannot be read.
    """
    from .trace import read_trace
    from .transport import RIC_INDICATION

    ing = Ingestor(TrackStore(capacity=4), config or IngestConfig())
    out: list[tuple[float, MeasurementReport]] = []
    for rec in read_trace(path):
        if rec.mtype != RIC_INDICATION:
            continue
        for r in ing.on_indication(rec.payload, rec.e2_node, rec.time, rec.sub_id):
            out.append((rec.time, r))
    return out, dict(ing.stats)
