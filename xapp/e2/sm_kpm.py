"""E2SM-KPM v02.00-v04.00 (O-RAN.WG3.E2SM-KPM clause 8.2 and 8.3): indication decode and the
subscription payloads.

Indication header Format 1 (``colletStartTime``: a 4-octet NTP seconds field in v02.0x, the full
8-octet NTP timestamp from v03.00 on, IETF RFC 5905 clause 6) and indication message Formats
1 (E2 node measurements), 2 (measurements per matching condition with the matching UEs) and 3
(per UE a Format 1 report). Format 2's ``MatchingCondItem`` is a CHOICE in v02.0x and a
SEQUENCE {choice, logicalOR} from v03.00 on, so the version picks the type; v04.00 keeps v03.00's
encoding of these types (treated as v03.00).

Every Format 1 body may hold any number of ``measData`` items (one per granularity period of
the reporting period), each with one record per (measurement, label) pair of ``measInfoList``
in order; ``noValue`` records are skipped. Each measurement is kept as a value under its name
(``measName``, or ``measID:<id>``), with its label appended when it is not ``noLabel``
(``name|fiveQI=9``). Problems confined to one UE (a record count that matches no layout, an
unsupported UE ID kind) drop that UE only (``KpmIndication.dropped``), never the indication.

One decode path: Format 3 with plain shapes (gNB UEIDs without optional parts or gNB-DU UEIDs, measName or
measID types with noLabel, integer/real/noValue records) is read by the walker
:func:`decode_f3_fast`, which yields exactly asn1tools' value (tested on generated PDUs) and
hands anything else to asn1tools on the same bytes.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .ie import Cgi, E2DecodeError, UeId, asn_decode, cgi_to_asn, e2sm_spec, ueid_from_asn
from .per import Bits, Unsupported

KPM_STYLE_UE_CONDITION = 4
NTP_EPOCH_OFFSET = 2208988800  # seconds from 1900-01-01 to 1970-01-01
#: KPM versions this decoder knows; "4.00" is read with v03.00's types (unchanged for these PDUs)
KPM_VERSIONS = ("2.00", "2.01", "2.02", "2.03", "3.00", "4.00")
DEFAULT_KPM_VERSION = "3.00"


def kpm_family(version: str | None) -> int:
    """KPM version string ('2.03', '3.00', ...) -> encoding family 2 (v02.0x) or 3 (v03.00 on).
    None -> the default (3). ValueError for a version this decoder does not know."""
    v = DEFAULT_KPM_VERSION if version is None else version
    if v not in KPM_VERSIONS:
        raise ValueError(f"unknown E2SM-KPM version {v!r} (known: {', '.join(KPM_VERSIONS)})")
    return 2 if v.startswith("2.") else 3


def time_to_ntp(t: float) -> bytes:
    """Unix time in s -> 8-octet NTP timestamp (IETF RFC 5905 clause 6), as KPM TimeStamp."""
    sec = int(math.floor(t))
    frac = int(round((t - sec) * (1 << 32)))
    if frac == 1 << 32:
        sec, frac = sec + 1, 0
    return struct.pack(">II", (sec + NTP_EPOCH_OFFSET) & 0xFFFFFFFF, frac)


def ntp_to_time(b: bytes) -> float:
    """8-octet NTP timestamp (or the 4-octet seconds part of v02.0x) -> Unix time in s."""
    if len(b) == 4:
        return struct.unpack(">I", b)[0] - NTP_EPOCH_OFFSET
    sec, frac = struct.unpack(">II", b)
    return sec - NTP_EPOCH_OFFSET + frac / (1 << 32)


@dataclass(frozen=True, slots=True)
class KpmUeReport:
    """One UE's measurements in a KPM indication.

    ``values``: (key, value) per measurement key in ``measInfoList`` order, the value of the
    latest granularity period that has one (None when every period had noValue).
    ``periods``: per measData item (one per granularity period, oldest first) the (key, value)
    pairs with noValue records left out. ``granularity_ms``: the granularity period (ms) if sent.
    """

    ue: UeId
    values: tuple[tuple[str, int | float | None], ...]
    granularity_ms: int | None = None
    periods: tuple[tuple[tuple[str, int | float], ...], ...] = ()


@dataclass(frozen=True, slots=True)
class KpmIndication:
    """A decoded KPM indication. ``collect_start``: Unix time in s; ``format``: message format
    1, 2 or 3; ``ue_reports``: per UE; ``node_values``: measurements not attributable to one UE
    (Format 1, or Format 2 items matching zero or several UEs), latest period's value;
    ``dropped``: per-UE (or per-item) reasons something was left out."""

    collect_start: float
    ue_reports: tuple[KpmUeReport, ...]
    sender_name: str | None = None
    format: int = 3
    node_values: tuple[tuple[str, int | float | None], ...] = ()
    dropped: tuple[str, ...] = ()


# ------------------------------------------------------------------------------------------------
# value -> KpmIndication (shared by the walker and asn1tools)
# ------------------------------------------------------------------------------------------------

def label_text(label: Mapping[str, Any]) -> str:
    """A MeasurementLabel value -> '' for noLabel, else 'field=value,...' (octets in hex, bit
    strings as integers, S-NSSAI as sST[-sD])."""
    parts = []
    for k, v in label.items():
        if k == "noLabel":
            continue
        if isinstance(v, (bytes, bytearray)):
            v = v.hex()
        elif isinstance(v, dict) and "sST" in v:
            v = v["sST"].hex() + ("-" + v["sD"].hex() if "sD" in v else "")
        parts.append(f"{k}={v}")
    return ",".join(parts)


def _meas_name(mt: tuple) -> str:
    return mt[1] if mt[0] == "measName" else f"measID:{mt[1]}"


def _keys(info: Sequence[Mapping]) -> tuple[list[str], list[str]]:
    """measInfoList -> (one key per (measurement, label) pair, one name per measurement)."""
    keys, names = [], []
    for mi in info:
        name = _meas_name(mi["measType"])
        names.append(name)
        for li in mi["labelInfoList"]:
            lt = label_text(li["measLabel"])
            keys.append(f"{name}|{lt}" if lt else name)
    return keys, names


def _periods(f1: Mapping, who: str) -> tuple[list[str], list[list[tuple[str, Any]]]]:
    """A Format 1 body -> (keys, per measData item the (key, value) pairs without noValue).
    E2DecodeError (the caller's per-UE drop) when a record matches neither layout."""
    if "measInfoList" not in f1:
        raise E2DecodeError(f"no measInfoList ({who})")
    keys, names = _keys(f1["measInfoList"])
    order: list[str] = []
    out = []
    for k, item in enumerate(f1["measData"]):
        rec = item["measRecord"]
        if len(rec) == len(keys):
            use = keys
        elif len(rec) == len(names):
            use = names  # one value per measurement: senders that ignore labels
        else:
            raise E2DecodeError(f"record count: measData item {k} has {len(rec)} values for {len(keys)} "
                                f"measurement/label pairs ({who})")
        order = order or use
        out.append([(n, v[1]) for n, v in zip(use, rec) if v[0] != "noValue"])
    return order or keys, out


def _latest(order: Sequence[str], periods: Sequence[Sequence[tuple[str, Any]]]) -> tuple[tuple[str, Any], ...]:
    latest: dict[str, Any] = {}
    for p in periods:
        latest.update(p)
    seen = dict.fromkeys(order)
    for k in latest:
        seen.setdefault(k, None)
    return tuple((k, latest.get(k)) for k in seen)


def _ue_report(ue_val: tuple, f1: Mapping, dropped: list[str]) -> KpmUeReport | None:
    try:
        ue = _ueid_cached(ue_val)
    except E2DecodeError as e:
        dropped.append(f"UE report: {e.reason}")
        return None
    try:
        order, periods = _periods(f1, f"UE {ue.key}")
    except E2DecodeError as e:
        dropped.append(e.reason)
        return None
    return KpmUeReport(ue, _latest(order, periods), f1.get("granulPeriod"),
                       tuple(tuple(p) for p in periods))


_UEID_CACHE: dict[Any, UeId] = {}


def _freeze(v: Any) -> Any:
    if isinstance(v, dict):
        return tuple((k, _freeze(x)) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


def _ueid_cached(v: tuple) -> UeId:
    key = _freeze(v)
    u = _UEID_CACHE.get(key)
    if u is None:
        u = ueid_from_asn(v)
        if len(_UEID_CACHE) >= 65536:
            _UEID_CACHE.clear()
        _UEID_CACHE[key] = u
    return u


def indication_from_value(h: Mapping, m: tuple) -> KpmIndication:
    """asn1tools-shaped values of the header Format 1 body and the message CHOICE -> KpmIndication."""
    alt, body = m
    dropped: list[str] = []
    ues: list[KpmUeReport] = []
    node: tuple = ()
    if alt == "indicationMessage-Format3":
        fmt = 3
        for it in body["ueMeasReportList"]:
            r = _ue_report(it["ueID"], it["measReport"], dropped)
            if r is not None:
                ues.append(r)
    elif alt == "indicationMessage-Format1":
        fmt = 1
        order, periods = _periods(body, "Format 1")
        node = _latest(order, periods)
    elif alt == "indicationMessage-Format2":
        fmt = 2
        ues, node = _format2(body, dropped)
    else:
        raise E2DecodeError(f"unsupported E2SM-KPM indication message {alt}")
    return KpmIndication(ntp_to_time(h["colletStartTime"]), tuple(ues), h.get("senderName"), fmt, node,
                         tuple(dropped))


def _format2(body: Mapping, dropped: list[str]) -> tuple[list[KpmUeReport], tuple]:
    """Format 2: a record per measCondUEidList item; an item matching exactly one UE is that UE's
    value, any other (aggregates over several or no UEs) an E2 node value."""
    conds = body["measCondUEidList"]
    per_ue: dict[UeId, list[list[tuple[str, Any]]]] = {}
    node_periods: list[list[tuple[str, Any]]] = []
    order = [_meas_name(c["measType"]) for c in conds]
    for k, item in enumerate(body["measData"]):
        rec = item["measRecord"]
        if len(rec) != len(conds):
            dropped.append(f"Format 2 record count: measData item {k} has {len(rec)} values for {len(conds)} conditions")
            continue
        node_p: list[tuple[str, Any]] = []
        ue_p: dict[UeId, list[tuple[str, Any]]] = {}
        for c, v in zip(conds, rec):
            if v[0] == "noValue":
                continue
            name = _meas_name(c["measType"])
            ues = c.get("matchingUEidList", ())
            if len(ues) == 1:
                try:
                    u = _ueid_cached(ues[0]["ueID"])
                except E2DecodeError as e:
                    dropped.append(f"Format 2 UE ID: {e.reason} ({name})")
                    continue
                ue_p.setdefault(u, []).append((name, v[1]))
            else:
                node_p.append((name, v[1]))
        node_periods.append(node_p)
        for u, p in ue_p.items():
            per_ue.setdefault(u, []).append(p)
    reports = [KpmUeReport(u, _latest([n for n, _ in sum(ps, [])], ps), body.get("granulPeriod"),
                           tuple(tuple(p) for p in ps)) for u, ps in per_ue.items()]
    return reports, _latest(order, node_periods) if any(node_periods) else ()


# ------------------------------------------------------------------------------------------------
# the Format 3 walker (aligned PER)
# ------------------------------------------------------------------------------------------------

def _glen(r: Bits) -> int:
    """General (semi-constrained) length determinant, aligned; unfragmented."""
    r.align()
    x = r.read(8)
    if x < 0x80:
        return x
    if x < 0xC0:
        return ((x & 0x3F) << 8) | r.read(8)
    raise Unsupported("fragmented length")


def _uint(r: Bits, octets_bits: int) -> int:
    """Constrained whole number with a range above 64K: octet count - 1 in ``octets_bits``
    bits, aligned octets (X.691 clause 11.5.7.4)."""
    n = r.read(octets_bits) + 1
    r.align()
    return r.read(8 * n)


_GUAMI_CACHE: dict[tuple, dict] = {}


def _ueid(r: Bits) -> tuple:
    alt = r.read(4)                  # UEID ext, alternative (3 bits)
    if alt == 1:                     # gNB-DU-UEID {gNB-CU-UE-F1AP-ID, ran-UEID OPTIONAL, ...}
        x = r.read(2)
        if x & 2:
            raise Unsupported("UEID-GNB-DU extension")
        du: dict = {"gNB-CU-UE-F1AP-ID": _uint(r, 2)}
        if x:
            r.align()
            du["ran-UEID"] = r.octets(8)
        return ("gNB-DU-UEID", du)
    if alt != 0 or r.read(6) != 0:   # gNB-UEID: UEID-GNB ext, 5 optionals all absent
        raise Unsupported("UEID shape")
    amf = _uint(r, 3)
    if r.read(1):
        raise Unsupported("GUAMI extension")
    r.align()
    g = r.read(48)                   # PLMN (24), AMF region (8), set (10), pointer (6)
    gv = _GUAMI_CACHE.get(g)
    if gv is None:
        gv = {"pLMNIdentity": (g >> 24).to_bytes(3, "big"), "aMFRegionID": (((g >> 16) & 0xFF).to_bytes(1, "big"), 8),
              "aMFSetID": ((((g >> 6) & 0x3FF) << 6).to_bytes(2, "big"), 10),
              "aMFPointer": (((g & 0x3F) << 2).to_bytes(1, "big"), 6)}
        if len(_GUAMI_CACHE) < 4096:
            _GUAMI_CACHE[g] = gv
    return ("gNB-UEID", {"amf-UE-NGAP-ID": amf, "guami": gv})


def _real(b: bytes) -> float:
    """X.690 clause 8.5 REAL contents -> float (binary base 2 and the special values)."""
    if not b:
        return 0.0
    f = b[0]
    if f & 0x80:
        if f & 0x30:
            raise Unsupported("REAL base 8/16")
        scale = (f >> 2) & 3
        ef = f & 3
        if ef == 3:
            raise Unsupported("REAL long exponent")
        ne = ef + 1
        if len(b) < 1 + ne + 1:
            raise Unsupported("REAL truncated")
        e = int.from_bytes(b[1:1 + ne], "big", signed=True)
        mant = int.from_bytes(b[1 + ne:], "big")
        try:
            v = math.ldexp(mant << scale, e)
        except OverflowError:        # beyond a double: the reference decoder decides
            raise Unsupported("REAL out of range") from None
        return -v if f & 0x40 else v
    raise Unsupported("REAL decimal or special")


def _records(r: Bits) -> list:
    n = _glen(r)
    out = []
    for _ in range(n):
        x = r.read(3)                # ext bit, alternative (2 bits)
        if x == 2:
            out.append(("noValue", None))
        elif x == 0:
            out.append(("integer", _uint(r, 2)))
        elif x == 1:
            ln = _glen(r)
            out.append(("real", _real(r.octets(ln))))
        else:
            raise Unsupported("record alternative")
    return out


_NO_LABEL = [{"measLabel": {"noLabel": "true"}}]


def _info(r: Bits) -> list:
    r.align()
    out = []
    for _ in range(r.read(16) + 1):
        x = r.read(3)                # item ext, type ext, alternative
        if x & 6:
            raise Unsupported("MeasurementInfoItem extension")
        if x == 0:
            if r.read(1):
                raise Unsupported("measName extension")
            n = r.read(8) + 1
            r.align()
            try:
                mt: tuple = ("measName", r.octets(n).decode("ascii"))
            except UnicodeDecodeError:
                raise Unsupported("measName characters") from None
        else:
            if r.read(1):
                raise Unsupported("measID extension")
            r.align()
            mt = ("measID", r.read(16) + 1)
        if _glen(r) != 1:
            raise Unsupported("several labels")
        # LabelInfoItem ext, MeasurementLabel ext, 21 presence bits (noLabel only), noLabel ext
        if r.read(24) != 0x200000:
            raise Unsupported("label other than noLabel")
        out.append({"measType": mt, "labelInfoList": _NO_LABEL})
    return out


def _format1(r: Bits) -> dict:
    x = r.read(3)                    # ext bit, measInfoList present, granulPeriod present
    if x & 4:
        raise Unsupported("Format 1 extension")
    r.align()
    data = []
    for _ in range(r.read(16) + 1):
        y = r.read(2)                # item ext, incompleteFlag present
        if y & 2:
            raise Unsupported("MeasurementDataItem extension")
        item: dict = {"measRecord": _records(r)}
        if y:
            if r.read(1):
                raise Unsupported("incompleteFlag extension")
            item["incompleteFlag"] = "true"
        data.append(item)
    f1: dict = {"measData": data}
    if x & 2:
        f1["measInfoList"] = _info(r)
    if x & 1:
        f1["granulPeriod"] = _uint(r, 2) + 1
    return f1


def decode_f3_fast(b: bytes) -> tuple:
    """The walker: E2SM-KPM-IndicationMessage octets -> asn1tools' value of the
    ``indicationMessage-formats`` CHOICE for Format 3 in the plain shapes (see the module
    docstring); :class:`~.per.Unsupported` otherwise."""
    r = Bits(b)
    # message ext, CHOICE ext (Format 3 is an extension addition), small number index 0
    if r.read(9) != 0b010000000:
        raise Unsupported("not Format 3")
    n = _glen(r)
    end = r.p + 8 * n
    if end > r.n:
        raise Unsupported("truncated open type")
    if r.read(1):
        raise Unsupported("Format 3 extension")
    r.align()
    reports = []
    for _ in range(r.read(16) + 1):
        if r.read(1):
            raise Unsupported("UEMeasurementReportItem extension")
        ue = _ueid(r)
        reports.append({"ueID": ue, "measReport": _format1(r)})
    r.align()
    if r.p != end or end != r.n:
        raise Unsupported("open type or message length mismatch")
    return ("indicationMessage-Format3", {"ueMeasReportList": reports})


def _header(header: bytes, family: int) -> dict:
    n = 8 if family == 3 else 4
    if len(header) == n + 1 and header[0] == 0:  # Format 1 with no optional part
        return {"colletStartTime": header[1:]}
    name = "E2SM-KPM-IndicationHeader" if family == 3 else "E2SM-KPM-IndicationHeader-v2"
    alt, h = asn_decode(name, header)["indicationHeader-formats"]
    return h


def decode_message_value(message: bytes, family: int = 3) -> tuple:
    """E2SM-KPM-IndicationMessage octets -> the ``indicationMessage-formats`` CHOICE value
    (walker for Format 3, asn1tools otherwise)."""
    try:
        return decode_f3_fast(message)
    except Unsupported:
        name = "E2SM-KPM-IndicationMessage" if family == 3 else "E2SM-KPM-IndicationMessage-v2"
        return asn_decode(name, message)["indicationMessage-formats"]


def decode_kpm_indication(header: bytes, message: bytes, version: str | None = None) -> KpmIndication:
    """(E2SM-KPM header, message) -> KpmIndication, read with the types of ``version`` (the E2
    node's declared KPM version, '2.00'..'4.00'; None: v03.00). E2DecodeError when the PDU is
    malformed as a whole; per-UE problems are in ``KpmIndication.dropped``."""
    family = kpm_family(version)
    h = _header(header, family)
    m = decode_message_value(message, family)
    try:
        return indication_from_value(h, m)
    except (KeyError, TypeError, IndexError) as e:
        raise E2DecodeError(f"E2SM-KPM: unexpected structure ({type(e).__name__}: {e})") from None


def decode_kpm_indication_asn1tools(header: bytes, message: bytes, version: str | None = None) -> KpmIndication:
    """The reference path (asn1tools only), for tests and benchmarks."""
    family = kpm_family(version)
    name = "E2SM-KPM-IndicationHeader" if family == 3 else "E2SM-KPM-IndicationHeader-v2"
    h = asn_decode(name, header)["indicationHeader-formats"][1]
    mname = "E2SM-KPM-IndicationMessage" if family == 3 else "E2SM-KPM-IndicationMessage-v2"
    return indication_from_value(h, asn_decode(mname, message)["indicationMessage-formats"])


# ------------------------------------------------------------------------------------------------
# subscription payloads (event trigger and action definition)
# ------------------------------------------------------------------------------------------------

def kpm_event_trigger(period_ms: int) -> bytes:
    """E2SM-KPM event trigger Format 1: report every ``period_ms`` ms."""
    return e2sm_spec().encode("E2SM-KPM-EventTriggerDefinition", {"eventDefinition-formats": (
        "eventDefinition-Format1", {"reportingPeriod": period_ms})})


def kpm_action_definition_ue_level(names: Sequence[str], granularity_ms: int,
                                   cell: Cgi | None = None) -> bytes:
    """E2SM-KPM action definition Format 4 (REPORT Style 4): the named UE-level measurements for
    every UE with an RSRP ("rSRP present"), collected every ``granularity_ms`` ms."""
    sub: dict = {"measInfoList": [{"measType": ("measName", n), "labelInfoList": [{"measLabel": {"noLabel": "true"}}]}
                                  for n in names], "granulPeriod": granularity_ms}
    if cell is not None:
        sub["cellGlobalID"] = cgi_to_asn(cell)
    return e2sm_spec().encode("E2SM-KPM-ActionDefinition", {
        "ric-Style-Type": KPM_STYLE_UE_CONDITION,
        "actionDefinition-formats": ("actionDefinition-Format4", {
            "matchingUeCondList": [{"testCondInfo": {"testType": ("rSRP", "true"), "testExpr": "present"}}],
            "subscriptionInfo": sub})})
