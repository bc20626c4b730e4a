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

A malformed value (a REAL with a reserved base or special value, a decimal REAL with
non-numeric contents, a REAL beyond a double: :func:`~.per.decode_real`) drops that record
only, with its reason in ``dropped`` (``malformed value: ...``), in every format: the rest of
the UE's record and every other UE stay (issue 28).

One decode path: Format 3 with plain shapes (gNB UEIDs without optional parts or gNB-DU UEIDs, measName or
measID types with noLabel, integer/real/noValue records) is read by the walker
:func:`decode_f3_fast`, which yields exactly the reference's value (tested on generated PDUs)
and hands anything else to the reference on the same bytes: asn1tools with every REAL read as
its contents octets, decoded by :func:`~.per.decode_real` (:func:`asn1tools_message_value`;
asn1tools' own REAL decoder reads base 2 with scale factor 0 only and raises on a malformed
REAL, which would drop the whole indication).
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .ie import Cgi, E2DecodeError, UeId, asn_decode, asn_decode_raw_reals, cgi_to_asn, e2sm_spec, ueid_from_asn
from .per import BadValue, Bits, Unsupported, bit_reader, decode_real

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
    #: the header's other optional fields (clause 8.3.x): file format version, sender type,
    #: vendor name; None when absent
    file_format_version: str | None = None
    sender_type: str | None = None
    vendor_name: str | None = None
    #: Format 1's granularity period in ms (Format 3 has one per UE: KpmUeReport), if sent
    granularity_ms: int | None = None


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


def _periods(f1: Mapping, who: str, dropped: list[str]) -> tuple[list[str], list[list[tuple[str, Any]]]]:
    """A Format 1 body -> (keys, per measData item the (key, value) pairs without noValue and
    without malformed values: each of those is left out with its reason in ``dropped``).
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
        vals = []
        for n, v in zip(use, rec):
            x = v[1]
            if v[0] == "noValue":
                continue
            if type(x) is BadValue:
                dropped.append(f"malformed value: {x.reason} (measData item {k}, {n}, {who})")
                continue
            vals.append((n, x))
        out.append(vals)
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
        order, periods = _periods(f1, f"UE {ue.key}", dropped)
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
        order, periods = _periods(body, "Format 1", dropped)
        node = _latest(order, periods)
    elif alt == "indicationMessage-Format2":
        fmt = 2
        ues, node = _format2(body, dropped)
    else:
        raise E2DecodeError(f"unsupported E2SM-KPM indication message {alt}")
    return KpmIndication(ntp_to_time(h["colletStartTime"]), tuple(ues), h.get("senderName"), fmt, node,
                         tuple(dropped), h.get("fileFormatversion"), h.get("senderType"), h.get("vendorName"),
                         body.get("granulPeriod") if fmt != 3 else None)


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
            if type(v[1]) is BadValue:
                dropped.append(f"malformed value: {v[1].reason} (measData item {k}, Format 2, {name})")
                continue
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


def _records(r: Bits) -> list:
    n = r.aligned_length()
    out = []
    for _ in range(n):
        x = r.read(3)                # ext bit, alternative (2 bits)
        if x == 2:
            out.append(("noValue", None))
        elif x == 0:
            out.append(("integer", _uint(r, 2)))
        elif x == 1:
            ln = r.aligned_length()
            out.append(("real", decode_real(r.octets(ln))))
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
        if r.aligned_length() != 1:
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


def _open_type(b: bytes, i: int) -> bytes:
    """The contents of an open type whose aligned length determinant is at octet ``i`` and
    that runs to the end of ``b``; reassembled when fragmented (X.691 clause 11.9.3.8: parts of
    16K, 32K, 48K or 64K octets, each after an octet 0xC1..0xC4, then a last part under 16K
    with its own length, possibly 0), as a message of many UEs is. Unsupported when the parts
    do not fill ``b`` exactly."""
    n = len(b)
    parts = []
    while True:
        if i >= n:
            raise Unsupported("truncated open type")
        x = b[i]
        if x < 0x80:
            ln, i = x, i + 1
        elif x < 0xC0:
            if i + 1 >= n:
                raise Unsupported("truncated open type")
            ln, i = ((x & 0x3F) << 8) | b[i + 1], i + 2
        elif 0xC1 <= x <= 0xC4:
            ln, i = (x & 7) << 14, i + 1
        else:
            raise Unsupported("bad length fragment")
        if i + ln > n:
            raise Unsupported("truncated open type")
        parts.append(b[i:i + ln])
        i += ln
        if x < 0xC0:
            break
    if i != n:
        raise Unsupported("open type or message length mismatch")
    return parts[0] if len(parts) == 1 else b"".join(parts)


def decode_f3_fast(b: bytes) -> tuple:
    """The walker: E2SM-KPM-IndicationMessage octets -> the reference's value
    (:func:`asn1tools_message_value`) of the ``indicationMessage-formats`` CHOICE for Format 3
    in the plain shapes (see the module docstring); :class:`~.per.Unsupported` otherwise."""
    # message ext, CHOICE ext (Format 3 is an extension addition), small number index 0, then
    # the open type from octet 2 (aligned)
    if len(b) < 3 or b[0] != 0x40 or b[1] & 0x80:
        raise Unsupported("not Format 3")
    r = bit_reader(_open_type(b, 2))
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
    if r.p != r.n:
        raise Unsupported("open type length mismatch")
    return ("indicationMessage-Format3", {"ueMeasReportList": reports})


def _header(header: bytes, family: int) -> dict:
    n = 8 if family == 3 else 4
    if len(header) == n + 1 and header[0] == 0:  # Format 1 with no optional part
        return {"colletStartTime": header[1:]}
    name = "E2SM-KPM-IndicationHeader" if family == 3 else "E2SM-KPM-IndicationHeader-v2"
    alt, h = asn_decode(name, header)["indicationHeader-formats"]
    return h


def _with_reals(m: tuple) -> tuple:
    """asn1tools' value of the message CHOICE decoded with REALs as their contents octets
    (:func:`~.ie.asn_decode_raw_reals`) -> the same value with each REAL record a float, or a
    :class:`~.per.BadValue` where its contents are malformed (dropped per record later)."""
    alt, body = m
    bodies = [it["measReport"] for it in body["ueMeasReportList"]] if alt == "indicationMessage-Format3" else [body]
    for b in bodies:
        for item in b.get("measData", ()) if isinstance(b, dict) else ():
            item["measRecord"] = [("real", decode_real(v[1])) if v[0] == "real" else v for v in item["measRecord"]]
    return m


def asn1tools_message_value(message: bytes, family: int = 3) -> tuple:
    """The reference: E2SM-KPM-IndicationMessage octets, decoded by asn1tools with the types of
    ``family`` (REAL contents by :func:`~.per.decode_real`) -> the ``indicationMessage-formats``
    CHOICE value. E2DecodeError when malformed as a whole."""
    name = "E2SM-KPM-IndicationMessage" if family == 3 else "E2SM-KPM-IndicationMessage-v2"
    return _with_reals(asn_decode_raw_reals(name, _asn1tools_open_type(message))["indicationMessage-formats"])


def _asn1tools_open_type(message: bytes) -> bytes:
    """A Format 3 message whose open type is 16K octets or more, fragmented as X.691 says ->
    the form asn1tools 0.169 reads (and writes): one fragment octet, then the whole contents.
    asn1tools decodes an extension addition from the octets after its first length octet, so
    it misreads the standard form (the fragment headers inside); anything else unchanged."""
    if len(message) > 16384 and message[0] == 0x40 and 0xC1 <= message[2] <= 0xC4:
        try:
            return message[:2] + b"\xc1" + _open_type(message, 2)
        except Unsupported:
            pass                      # asn1tools' own form already (or malformed: it says so)
    return message


def decode_message_value(message: bytes, family: int = 3) -> tuple:
    """E2SM-KPM-IndicationMessage octets -> the ``indicationMessage-formats`` CHOICE value
    (walker for Format 3, asn1tools otherwise: :func:`asn1tools_message_value`)."""
    try:
        return decode_f3_fast(message)
    except Unsupported:
        return asn1tools_message_value(message, family)


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
    return indication_from_value(h, asn1tools_message_value(message, family))


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
