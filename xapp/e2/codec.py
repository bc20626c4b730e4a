"""E2AP RICindication, E2SM-RC / E2SM-KPM payloads and NR RRC MeasurementReport: encode and decode.

Layers (outermost first):

- E2AP (O-RAN.WG3.E2AP, aligned PER): ``RICindication`` (procedure code 5) with its IEs
  RICrequestID (29), RANfunctionID (5), RICactionID (15), RICindicationSN (27),
  RICindicationType (28), RICindicationHeader (25), RICindicationMessage (26) and
  RICcallProcessID (20). Encoded and decoded with pycrate's bundled ``E2AP`` module; the
  decoder first tries :mod:`xapp.e2.fastper`, a walker for exactly this envelope that hands
  anything unusual back to pycrate (see that module).
- E2SM-RC REPORT Style 1 "Message Copy" (O-RAN.WG3.E2SM-RC-v01.03 clauses 7.4.2, 8.2.1, 9.2.1):
  indication header Format 1 (event trigger condition ID) and indication message Format 1 with
  the RAN parameters of clause 8.2.1: 3 "RRC Message" (the copied UL-DCCH PDU), 4 "UE ID" and
  6 "Cell Global ID". Parameters 4 and 6 are ELEMENTs whose value is an OCTET STRING holding
  the aligned-PER encoding of the E2SM common ``UEID`` / ``CGI``.
- E2SM-KPM REPORT Style 4 (O-RAN.WG3.E2SM-KPM-v03.00 clause 8.2.1): indication header Format 1
  and indication message Format 3 (``ueMeasReportList``: per UE a Format 1 report with its
  ``measInfoList``), plus the event trigger (Format 1) and action definition (Format 4).
  Both service models use the project's own ASN.1 module ``asn1/pallas-e2sm.asn`` compiled with
  asn1tools (codec 'per', aligned).
- NR RRC (TS 38.331, unaligned PER) ``UL-DCCH-Message`` carrying a ``MeasurementReport`` with
  serving and NR neighbour SSB cell results and, when known, the R16 ``locationInfo-r16``
  (``commonLocationInfo-r16``: ``locationCoordinate-r16`` = TS 37.355 LocationCoordinates
  Ellipsoid-Point and ``velocityEstimate-r16`` = TS 37.355 Velocity horizontalVelocity, both
  UPER inside the OCTET STRING). pycrate's ``RRCNR`` and ``LPP`` modules encode and decode;
  the decoder first tries :mod:`xapp.e2.fastper`'s walker for the fields Pallas reads.

Every ``decode_*`` raises :class:`E2DecodeError` with a reason on any malformed, truncated or
unsupported input; nothing else escapes.
"""

from __future__ import annotations

import functools
import math
import os
import struct
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Sequence

from . import units

NAN = float("nan")

# E2AP protocol IE ids (O-RAN.WG3.E2AP E2AP-Constants)
IE_RIC_REQUEST_ID = 29
IE_RAN_FUNCTION_ID = 5
IE_RIC_ACTION_ID = 15
IE_RIC_INDICATION_SN = 27
IE_RIC_INDICATION_TYPE = 28
IE_RIC_INDICATION_HEADER = 25
IE_RIC_INDICATION_MESSAGE = 26
IE_RIC_CALL_PROCESS_ID = 20
PROC_RIC_INDICATION = 5

# E2SM-RC REPORT Style 1 RAN parameter ids (O-RAN.WG3.E2SM-RC-v01.03 clause 8.2.1)
RC_PARAM_RRC_MESSAGE = 3
RC_PARAM_UE_ID = 4
RC_PARAM_CELL_GLOBAL_ID = 6
RC_STYLE_MESSAGE_COPY = 1
KPM_STYLE_UE_CONDITION = 4
# UL-DCCH-MessageType c1 alternative index of measurementReport (TS 38.331), used as messageID
RRC_MSG_ID_MEASUREMENT_REPORT = 0

ASN1_PATH = os.path.join(os.path.dirname(__file__), "asn1", "pallas-e2sm.asn")


class E2DecodeError(ValueError):
    """A PDU could not be decoded; ``reason`` says why (malformed, truncated, unsupported)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ------------------------------------------------------------------------------------------------
# compiled specifications (cached: compiling costs 0.4 s for asn1tools, ~1 s for pycrate's modules)
# ------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def e2sm_spec() -> Any:
    """The project's E2SM-RC/KPM module compiled with asn1tools, codec 'per' (aligned)."""
    import asn1tools
    return asn1tools.compile_files(ASN1_PATH, "per")


@functools.lru_cache(maxsize=None)
def _e2ap_pdu() -> Any:
    from pycrate_asn1dir import E2AP
    return E2AP.E2AP_PDU_Descriptions.E2AP_PDU


@functools.lru_cache(maxsize=None)
def _ul_dcch() -> Any:
    from pycrate_asn1dir import RRCNR
    return RRCNR.NR_RRC_Definitions.UL_DCCH_Message


@functools.lru_cache(maxsize=None)
def _lpp() -> Any:
    from pycrate_asn1dir import LPP
    return LPP.LPP_PDU_Definitions


# ------------------------------------------------------------------------------------------------
# identities
# ------------------------------------------------------------------------------------------------

def plmn_to_bytes(plmn: str) -> bytes:
    """'MCCMNC' (5 or 6 digits) -> 3-octet TBCD PLMN identity (TS 38.413 clause 9.3.3.5)."""
    if not (plmn.isdigit() and len(plmn) in (5, 6)):
        raise ValueError(f"PLMN must be 5 or 6 digits, got {plmn!r}")
    d = [int(c) for c in plmn]
    mnc3 = d[5] if len(d) == 6 else 0xF
    return bytes([(d[1] << 4) | d[0], (mnc3 << 4) | d[2], (d[4] << 4) | d[3]])


def plmn_from_bytes(b: bytes) -> str:
    """3-octet TBCD PLMN identity -> 'MCCMNC'. Raises E2DecodeError on a non-BCD digit."""
    if len(b) != 3:
        raise E2DecodeError(f"PLMN identity has {len(b)} octets, not 3")
    digits = [b[0] & 0xF, b[0] >> 4, b[1] & 0xF, b[2] & 0xF, b[2] >> 4]
    if any(x > 9 for x in digits):
        raise E2DecodeError("PLMN identity is not BCD")
    mnc3 = b[1] >> 4
    s = "".join(map(str, digits))
    if mnc3 == 0xF:
        return s
    if mnc3 > 9:
        raise E2DecodeError("PLMN identity is not BCD")
    return s + str(mnc3)


@dataclass(frozen=True, slots=True)
class Guami:
    """GUAMI (TS 38.413 clause 9.3.3.3): PLMN, AMF region (8 bit), set (10 bit), pointer (6 bit)."""

    plmn: str = "00101"
    amf_region_id: int = 1
    amf_set_id: int = 1
    amf_pointer: int = 0


@dataclass(frozen=True, slots=True)
class GlobalGnbId:
    """Global gNB ID: PLMN and a gNB ID of ``length`` bits (22..32)."""

    plmn: str
    gnb_id: int
    length: int = 28


@dataclass(frozen=True, slots=True)
class UeId:
    """E2SM common ``UEID`` (O-RAN.WG3.E2SM-v02.01 clause 6.2.2.1) for the three NG-RAN kinds Pallas
    consumes: ``kind`` 'gNB' (amf_ue_ngap_id, guami, optional lists and ids), 'gNB-DU'
    (f1ap_ids[0], ran_ue_id) or 'gNB-CU-UP' (e1ap_ids[0], ran_ue_id).

    :attr:`key` is the track key: the AMF UE NGAP ID for a gNB UE (kept by the AMF across
    Xn handovers, so a UE's track survives its handovers), else a prefixed F1AP/E1AP id.
    """

    kind: str = "gNB"
    amf_ue_ngap_id: int = -1
    guami: Guami | None = None
    f1ap_ids: tuple[int, ...] = ()
    e1ap_ids: tuple[int, ...] = ()
    ran_ue_id: bytes | None = None
    xnap_id: int | None = None
    global_gnb: GlobalGnbId | None = None

    @property
    def key(self) -> str:
        if self.kind == "gNB":
            return str(self.amf_ue_ngap_id)
        if self.kind == "gNB-DU":
            return f"du-f1ap-{self.f1ap_ids[0]}"
        return f"cuup-e1ap-{self.e1ap_ids[0]}"


@dataclass(frozen=True, slots=True)
class Cgi:
    """Cell global identity: ``rat`` 'nr' (36-bit NR cell identity) or 'eutra' (28-bit ECI)."""

    plmn: str
    cell_id: int
    rat: str = "nr"


def _bits(v: int, n: int) -> tuple[bytes, int]:
    if not 0 <= v < (1 << n):
        raise ValueError(f"{v} does not fit in {n} bits")
    nbytes = (n + 7) // 8
    return (v << (8 * nbytes - n)).to_bytes(nbytes, "big"), n


def _unbits(t: tuple[bytes, int]) -> int:
    b, n = t
    return int.from_bytes(b, "big") >> (8 * len(b) - n)


def _guami_val(g: Guami) -> dict:
    return {"pLMNIdentity": plmn_to_bytes(g.plmn), "aMFRegionID": _bits(g.amf_region_id, 8),
            "aMFSetID": _bits(g.amf_set_id, 10), "aMFPointer": _bits(g.amf_pointer, 6)}


def ueid_to_asn(u: UeId) -> tuple:
    """UeId -> asn1tools value of ``UEID``."""
    if u.kind == "gNB":
        if u.guami is None or u.amf_ue_ngap_id < 0:
            raise ValueError("a gNB UEID needs amf_ue_ngap_id and guami")
        v: dict = {"amf-UE-NGAP-ID": u.amf_ue_ngap_id, "guami": _guami_val(u.guami)}
        if u.f1ap_ids:
            v["gNB-CU-UE-F1AP-ID-List"] = [{"gNB-CU-UE-F1AP-ID": i} for i in u.f1ap_ids]
        if u.e1ap_ids:
            v["gNB-CU-CP-UE-E1AP-ID-List"] = [{"gNB-CU-CP-UE-E1AP-ID": i} for i in u.e1ap_ids]
        if u.ran_ue_id is not None:
            v["ran-UEID"] = u.ran_ue_id
        if u.xnap_id is not None:
            v["m-NG-RAN-UE-XnAP-ID"] = u.xnap_id
        if u.global_gnb is not None:
            g = u.global_gnb
            v["globalGNB-ID"] = {"pLMNIdentity": plmn_to_bytes(g.plmn),
                                 "gNB-ID": ("gNB-ID", _bits(g.gnb_id, g.length))}
        return ("gNB-UEID", v)
    if u.kind == "gNB-DU":
        v = {"gNB-CU-UE-F1AP-ID": u.f1ap_ids[0]}
        if u.ran_ue_id is not None:
            v["ran-UEID"] = u.ran_ue_id
        return ("gNB-DU-UEID", v)
    if u.kind == "gNB-CU-UP":
        v = {"gNB-CU-CP-UE-E1AP-ID": u.e1ap_ids[0]}
        if u.ran_ue_id is not None:
            v["ran-UEID"] = u.ran_ue_id
        return ("gNB-CU-UP-UEID", v)
    raise ValueError(f"unknown UEID kind {u.kind!r}")


def ueid_from_asn(t: tuple) -> UeId:
    """asn1tools value of ``UEID`` -> UeId. E2DecodeError for the kinds Pallas does not consume."""
    alt, v = t
    if alt == "gNB-UEID":
        g = v["guami"]
        gg = None
        if "globalGNB-ID" in v:
            gid = v["globalGNB-ID"]
            bits = gid["gNB-ID"][1]
            gg = GlobalGnbId(plmn_from_bytes(gid["pLMNIdentity"]), _unbits(bits), bits[1])
        return UeId(
            kind="gNB", amf_ue_ngap_id=v["amf-UE-NGAP-ID"],
            guami=Guami(plmn_from_bytes(g["pLMNIdentity"]), _unbits(g["aMFRegionID"]),
                        _unbits(g["aMFSetID"]), _unbits(g["aMFPointer"])),
            f1ap_ids=tuple(i["gNB-CU-UE-F1AP-ID"] for i in v.get("gNB-CU-UE-F1AP-ID-List", ())),
            e1ap_ids=tuple(i["gNB-CU-CP-UE-E1AP-ID"] for i in v.get("gNB-CU-CP-UE-E1AP-ID-List", ())),
            ran_ue_id=v.get("ran-UEID"), xnap_id=v.get("m-NG-RAN-UE-XnAP-ID"), global_gnb=gg)
    if alt == "gNB-DU-UEID":
        return UeId(kind="gNB-DU", f1ap_ids=(v["gNB-CU-UE-F1AP-ID"],), ran_ue_id=v.get("ran-UEID"))
    if alt == "gNB-CU-UP-UEID":
        return UeId(kind="gNB-CU-UP", e1ap_ids=(v["gNB-CU-CP-UE-E1AP-ID"],),
                    ran_ue_id=v.get("ran-UEID"))
    raise E2DecodeError(f"unsupported UEID kind {alt}")


def cgi_to_asn(c: Cgi) -> tuple:
    """Cgi -> asn1tools value of ``CGI``."""
    if c.rat == "nr":
        return ("nR-CGI", {"pLMNIdentity": plmn_to_bytes(c.plmn), "nRCellIdentity": _bits(c.cell_id, 36)})
    if c.rat == "eutra":
        return ("eUTRA-CGI", {"pLMNIdentity": plmn_to_bytes(c.plmn),
                              "eUTRACellIdentity": _bits(c.cell_id, 28)})
    raise ValueError(f"unknown RAT {c.rat!r}")


def cgi_from_asn(t: tuple) -> Cgi:
    """asn1tools value of ``CGI`` -> Cgi."""
    alt, v = t
    if alt == "nR-CGI":
        return Cgi(plmn_from_bytes(v["pLMNIdentity"]), _unbits(v["nRCellIdentity"]), "nr")
    if alt == "eUTRA-CGI":
        return Cgi(plmn_from_bytes(v["pLMNIdentity"]), _unbits(v["eUTRACellIdentity"]), "eutra")
    raise E2DecodeError(f"unsupported CGI kind {alt}")


def e2_node_name(plmn: str, gnb_id: int) -> str:
    """OSC-style E2 node (RAN) name of a gNB: ``gnb_<mcc>_<mnc>_<gNB id as 8 hex digits>``."""
    return f"gnb_{plmn[:3]}_{plmn[3:]}_{gnb_id:08x}"


# ------------------------------------------------------------------------------------------------
# NR RRC MeasurementReport (TS 38.331 clause 6.2.2, UL-DCCH, unaligned PER)
# ------------------------------------------------------------------------------------------------

class CellResult(NamedTuple):
    """One cell's SSB results in a MeasurementReport: PCI (-1 when absent) and RSRP dBm, RSRQ dB,
    SINR dB after TS 38.133 conversion (NaN when the UE did not report the quantity).
    (A NamedTuple: the decoder makes several per report.)"""

    pci: int = -1
    rsrp_dbm: float = NAN
    rsrq_db: float = NAN
    sinr_db: float = NAN


class ServingResult(NamedTuple):
    """A serving MO's result: ``serv_cell_index`` (ServCellIndex 0..31) and the cell's results."""

    serv_cell_index: int
    cell: CellResult


@dataclass(frozen=True, slots=True)
class RrcMeasReport:
    """The fields of an NR MeasurementReport (TS 38.331 MeasResults) Pallas reads.

    ``serving``: measResultServingMOList; ``neighbours``: measResultNeighCells/measResultListNR;
    ``lat``/``lon`` degrees, ``speed_mps`` m/s, ``heading_deg`` degrees clockwise from north
    from locationInfo-r16 (NaN when absent).
    """

    meas_id: int
    serving: tuple[ServingResult, ...]
    neighbours: tuple[CellResult, ...] = ()
    lat: float = NAN
    lon: float = NAN
    speed_mps: float = NAN
    heading_deg: float = NAN


def _quant_val(c: CellResult) -> dict:
    q: dict = {}
    if c.rsrp_dbm == c.rsrp_dbm:
        q["rsrp"] = units.rsrp_to_index(c.rsrp_dbm)
    if c.rsrq_db == c.rsrq_db:
        q["rsrq"] = units.rsrq_to_index(c.rsrq_db)
    if c.sinr_db == c.sinr_db:
        q["sinr"] = units.sinr_to_index(c.sinr_db)
    return q


def _meas_result_nr(c: CellResult) -> dict:
    v: dict = {"measResult": {"cellResults": {}}}
    q = _quant_val(c)
    if q:
        v["measResult"]["cellResults"]["resultsSSB-Cell"] = q
    if c.pci >= 0:
        v["physCellId"] = c.pci
    return v


def _cell_from_val(v: Mapping) -> CellResult:
    q = v["measResult"]["cellResults"].get("resultsSSB-Cell", {})
    return CellResult(
        pci=v.get("physCellId", -1),
        rsrp_dbm=units.index_to_rsrp(q["rsrp"]) if "rsrp" in q else NAN,
        rsrq_db=units.index_to_rsrq(q["rsrq"]) if "rsrq" in q else NAN,
        sinr_db=units.index_to_sinr(q["sinr"]) if "sinr" in q else NAN)


def encode_location(lat: float, lon: float) -> bytes:
    """TS 37.355 LocationCoordinates (ellipsoidPoint), UPER, for locationCoordinate-r16."""
    L = _lpp().LocationCoordinates
    sign, nlat = units.lat_to_lpp(lat)
    L.set_val(("ellipsoidPoint", {"latitudeSign": sign, "degreesLatitude": nlat,
                                  "degreesLongitude": units.lon_to_lpp(lon)}))
    return L.to_uper()


def encode_velocity(speed_mps: float, heading_deg: float) -> bytes:
    """TS 37.355 Velocity (horizontalVelocity), UPER, for velocityEstimate-r16."""
    V = _lpp().Velocity
    V.set_val(("horizontalVelocity", {"bearing": units.heading_to_bearing(heading_deg),
                                      "horizontalSpeed": units.speed_to_kmh(speed_mps)}))
    return V.to_uper()


def decode_location(b: bytes) -> tuple[float, float]:
    """locationCoordinate-r16 contents -> (lat, lon) degrees. E2DecodeError if not an
    ellipsoid point (with or without uncertainty/altitude: the point is taken)."""
    L = _lpp().LocationCoordinates
    try:
        L.from_uper(b)
        alt, v = L.get_val()
    except Exception as e:  # noqa: BLE001 - pycrate raises many types
        raise E2DecodeError(f"locationCoordinate-r16: {type(e).__name__}: {e}") from None
    if "latitudeSign" not in v:
        raise E2DecodeError(f"unsupported LocationCoordinates {alt}")
    return units.lpp_to_lat(v["latitudeSign"], v["degreesLatitude"]), units.lpp_to_lon(v["degreesLongitude"])


def decode_velocity(b: bytes) -> tuple[float, float]:
    """velocityEstimate-r16 contents -> (speed m/s, heading degrees)."""
    V = _lpp().Velocity
    try:
        V.from_uper(b)
        alt, v = V.get_val()
    except Exception as e:  # noqa: BLE001
        raise E2DecodeError(f"velocityEstimate-r16: {type(e).__name__}: {e}") from None
    if "bearing" not in v or "horizontalSpeed" not in v:
        raise E2DecodeError(f"unsupported Velocity {alt}")
    return units.kmh_to_speed(v["horizontalSpeed"]), float(v["bearing"])


def _idx(c: CellResult) -> tuple[int | None, int | None, int | None]:
    return (units.rsrp_to_index(c.rsrp_dbm) if c.rsrp_dbm == c.rsrp_dbm else None,
            units.rsrq_to_index(c.rsrq_db) if c.rsrq_db == c.rsrq_db else None,
            units.sinr_to_index(c.sinr_db) if c.sinr_db == c.sinr_db else None)


def encode_rrc_meas_report(r: RrcMeasReport) -> bytes:
    """RrcMeasReport -> UL-DCCH-Message (UPER). Position is written as locationInfo-r16 when
    lat/lon are known, velocity when speed and heading are both known. Uses the fast encoder
    of :mod:`fastper` (byte-identical to :func:`encode_rrc_meas_report_pycrate`, tested)."""
    loc = vel = None
    if r.lat == r.lat and r.lon == r.lon:
        sign, nlat = units.lat_to_lpp(r.lat)
        loc = fastper.encode_ellipsoid_point(sign, nlat, units.lon_to_lpp(r.lon))
    if r.speed_mps == r.speed_mps and r.heading_deg == r.heading_deg:
        vel = fastper.encode_horizontal_velocity(units.heading_to_bearing(r.heading_deg),
                                                 units.speed_to_kmh(r.speed_mps))
    try:
        return fastper.encode_meas_report(
            r.meas_id, [(s.serv_cell_index, s.cell.pci, _idx(s.cell)) for s in r.serving],
            [(n.pci, _idx(n)) for n in r.neighbours], loc, vel)
    except fastper.Unsupported:
        return encode_rrc_meas_report_pycrate(r)


def encode_rrc_meas_report_pycrate(r: RrcMeasReport) -> bytes:
    """RrcMeasReport -> UL-DCCH-Message (UPER) with pycrate's RRCNR and LPP (the reference)."""
    mr: dict = {"measId": r.meas_id, "measResultServingMOList": [
        {"servCellId": s.serv_cell_index, "measResultServingCell": _meas_result_nr(s.cell)}
        for s in r.serving]}
    if r.neighbours:
        mr["measResultNeighCells"] = ("measResultListNR", [_meas_result_nr(n) for n in r.neighbours])
    common: dict = {}
    if r.lat == r.lat and r.lon == r.lon:
        common["locationCoordinate-r16"] = encode_location(r.lat, r.lon)
    if r.speed_mps == r.speed_mps and r.heading_deg == r.heading_deg:
        common["velocityEstimate-r16"] = encode_velocity(r.speed_mps, r.heading_deg)
    if common:
        mr["locationInfo-r16"] = {"commonLocationInfo-r16": common}
    U = _ul_dcch()
    U.set_val({"message": ("c1", ("measurementReport", {
        "criticalExtensions": ("measurementReport", {"measResults": mr})}))})
    return U.to_uper()


def _rrc_from_val(v: Mapping) -> RrcMeasReport:
    msg = v["message"]
    if msg[0] != "c1" or msg[1][0] != "measurementReport":
        raise E2DecodeError(f"UL-DCCH message is {msg[0]}/{msg[1][0] if msg[0] == 'c1' else '?'}, "
                            "not a measurementReport")
    ce = msg[1][1]["criticalExtensions"]
    if ce[0] != "measurementReport":
        raise E2DecodeError("MeasurementReport criticalExtensionsFuture")
    mr = ce[1]["measResults"]
    serving = tuple(ServingResult(s["servCellId"], _cell_from_val(s["measResultServingCell"]))
                    for s in mr["measResultServingMOList"])
    nbs: tuple[CellResult, ...] = ()
    nc = mr.get("measResultNeighCells")
    if nc is not None and nc[0] == "measResultListNR":
        nbs = tuple(_cell_from_val(n) for n in nc[1])
    lat = lon = speed = heading = NAN
    common = mr.get("locationInfo-r16", {}).get("commonLocationInfo-r16", {})
    if "locationCoordinate-r16" in common:
        lat, lon = decode_location(common["locationCoordinate-r16"])
    if "velocityEstimate-r16" in common:
        speed, heading = decode_velocity(common["velocityEstimate-r16"])
    return RrcMeasReport(mr["measId"], serving, nbs, lat, lon, speed, heading)


def decode_rrc_meas_report_pycrate(b: bytes) -> RrcMeasReport:
    """UL-DCCH-Message bytes -> RrcMeasReport with pycrate's RRCNR (the full decoder)."""
    U = _ul_dcch()
    try:
        U.from_uper(b)
        v = U.get_val()
    except Exception as e:  # noqa: BLE001
        raise E2DecodeError(f"RRC UL-DCCH: {type(e).__name__}: {e}") from None
    try:
        return _rrc_from_val(v)
    except (KeyError, TypeError, IndexError, AttributeError) as e:
        raise E2DecodeError(f"RRC UL-DCCH: unexpected structure ({type(e).__name__}: {e})") from None


def decode_rrc_meas_report(b: bytes) -> RrcMeasReport:
    """UL-DCCH-Message bytes -> RrcMeasReport. Tries the fast walker, falls back to pycrate for
    anything it does not cover (same result; tests check both agree)."""
    try:
        r = fastper.decode_meas_report(b)
    except fastper.Unsupported:
        return decode_rrc_meas_report_pycrate(b)
    if r.loc is not None or r.vel is not None:
        lat = lon = speed = heading = NAN
        if r.loc is not None:
            try:
                lat, lon = fastper.decode_ellipsoid_point(r.loc)
            except fastper.Unsupported:
                lat, lon = decode_location(r.loc)
        if r.vel is not None:
            try:
                speed, heading = fastper.decode_horizontal_velocity(r.vel)
            except fastper.Unsupported:
                speed, heading = decode_velocity(r.vel)
        return RrcMeasReport(r.meas_id, r.serving, r.neighbours, lat, lon, speed, heading)
    return RrcMeasReport(r.meas_id, r.serving, r.neighbours)


# ------------------------------------------------------------------------------------------------
# E2AP RICindication
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RicIndication:
    """An E2AP RICindication (O-RAN.WG3.E2AP clause 9.1.1.7): ids, type and the E2SM octets."""

    ric_requestor_id: int
    ric_instance_id: int
    ran_function_id: int
    action_id: int
    header: bytes
    message: bytes
    sn: int | None = None
    ind_type: str = "report"
    call_process_id: bytes | None = None


def _indication_ies(ind: RicIndication) -> list[tuple[int, Any]]:
    ies: list[tuple[int, Any]] = [
        (IE_RIC_REQUEST_ID, {"ricRequestorID": ind.ric_requestor_id, "ricInstanceID": ind.ric_instance_id}),
        (IE_RAN_FUNCTION_ID, ind.ran_function_id), (IE_RIC_ACTION_ID, ind.action_id)]
    if ind.sn is not None:
        ies.append((IE_RIC_INDICATION_SN, ind.sn))
    ies += [(IE_RIC_INDICATION_TYPE, ind.ind_type), (IE_RIC_INDICATION_HEADER, ind.header),
            (IE_RIC_INDICATION_MESSAGE, ind.message)]
    if ind.call_process_id is not None:
        ies.append((IE_RIC_CALL_PROCESS_ID, ind.call_process_id))
    return ies


def encode_ric_indication(ind: RicIndication) -> bytes:
    """RicIndication -> E2AP-PDU (aligned PER), IEs in the E2AP clause 9.1.1.7 order. Uses the
    fast encoder of :mod:`fastper` (byte-identical to :func:`encode_ric_indication_pycrate`,
    tested); values out of their ranges raise ValueError."""
    if not (0 <= ind.ric_requestor_id <= 65535 and 0 <= ind.ric_instance_id <= 65535
            and 0 <= ind.ran_function_id <= 4095 and 0 <= ind.action_id <= 255
            and (ind.sn is None or 0 <= ind.sn <= 65535) and ind.ind_type in ("report", "insert")):
        raise ValueError(f"RICindication field out of range: {ind}")
    try:
        return fastper.encode_ric_indication_ies(_indication_ies(ind))
    except fastper.Unsupported:
        return encode_ric_indication_pycrate(ind)


def encode_ric_indication_pycrate(ind: RicIndication) -> bytes:
    """RicIndication -> E2AP-PDU (aligned PER) with pycrate (the reference encoder)."""
    ies = [
        {"id": IE_RIC_REQUEST_ID, "criticality": "reject", "value": (
            "RICrequestID", {"ricRequestorID": ind.ric_requestor_id, "ricInstanceID": ind.ric_instance_id})},
        {"id": IE_RAN_FUNCTION_ID, "criticality": "reject", "value": ("RANfunctionID", ind.ran_function_id)},
        {"id": IE_RIC_ACTION_ID, "criticality": "reject", "value": ("RICactionID", ind.action_id)},
    ]
    if ind.sn is not None:
        ies.append({"id": IE_RIC_INDICATION_SN, "criticality": "reject", "value": ("RICindicationSN", ind.sn)})
    ies += [
        {"id": IE_RIC_INDICATION_TYPE, "criticality": "reject", "value": ("RICindicationType", ind.ind_type)},
        {"id": IE_RIC_INDICATION_HEADER, "criticality": "reject", "value": ("RICindicationHeader", ind.header)},
        {"id": IE_RIC_INDICATION_MESSAGE, "criticality": "reject", "value": ("RICindicationMessage", ind.message)},
    ]
    if ind.call_process_id is not None:
        ies.append({"id": IE_RIC_CALL_PROCESS_ID, "criticality": "reject",
                    "value": ("RICcallProcessID", ind.call_process_id)})
    P = _e2ap_pdu()
    P.set_val(("initiatingMessage", {"procedureCode": PROC_RIC_INDICATION, "criticality": "ignore",
                                     "value": ("RICindication", {"protocolIEs": ies})}))
    return P.to_aper()


def decode_e2ap_pycrate(b: bytes) -> RicIndication:
    """E2AP-PDU bytes -> RicIndication with pycrate (the full decoder)."""
    P = _e2ap_pdu()
    try:
        P.from_aper(b)
        v = P.get_val()
    except Exception as e:  # noqa: BLE001
        raise E2DecodeError(f"E2AP: {type(e).__name__}: {e}") from None
    try:
        kind, body = v
        name = body["value"][0] if isinstance(body.get("value"), tuple) else "(unknown value)"
        if kind != "initiatingMessage" or name != "RICindication":
            raise E2DecodeError(f"E2AP {kind} {name} is not a RICindication")
        f: dict[int, Any] = {ie["id"]: ie["value"][1] for ie in body["value"][1]["protocolIEs"]}
        return _indication_from_ies(f)
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as e:
        if isinstance(e, E2DecodeError):
            raise
        raise E2DecodeError(f"E2AP: unexpected structure ({type(e).__name__}: {e})") from None


def _indication_from_ies(f: Mapping[int, Any]) -> RicIndication:
    for need in (IE_RIC_REQUEST_ID, IE_RAN_FUNCTION_ID, IE_RIC_ACTION_ID, IE_RIC_INDICATION_TYPE,
                 IE_RIC_INDICATION_HEADER, IE_RIC_INDICATION_MESSAGE):
        if need not in f:
            raise E2DecodeError(f"RICindication lacks mandatory IE {need}")
    rid = f[IE_RIC_REQUEST_ID]
    return RicIndication(
        ric_requestor_id=rid["ricRequestorID"], ric_instance_id=rid["ricInstanceID"],
        ran_function_id=f[IE_RAN_FUNCTION_ID], action_id=f[IE_RIC_ACTION_ID],
        header=f[IE_RIC_INDICATION_HEADER], message=f[IE_RIC_INDICATION_MESSAGE],
        sn=f.get(IE_RIC_INDICATION_SN), ind_type=f[IE_RIC_INDICATION_TYPE],
        call_process_id=f.get(IE_RIC_CALL_PROCESS_ID))


def decode_ric_indication(b: bytes) -> RicIndication:
    """E2AP-PDU bytes -> RicIndication. The fast envelope walker first; pycrate for the rest."""
    try:
        return _indication_from_ies(fastper.decode_ric_indication_ies(b))
    except fastper.Unsupported:
        return decode_e2ap_pycrate(b)


# ------------------------------------------------------------------------------------------------
# E2SM-RC REPORT Style 1 (message copy)
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RcMessageCopy:
    """An E2SM-RC REPORT Style 1 indication: the copied RRC PDU with its UE and serving cell."""

    rrc: bytes
    ue: UeId
    cell: Cgi | None = None
    condition_id: int | None = 1


def _elem_octs(pid: int, b: bytes) -> dict:
    """One E2SM-RC RAN parameter ELEMENT holding an OCTET STRING (asn1tools value)."""
    return {"ranParameter-ID": pid, "ranParameter-valueType": (
        "ranP-Choice-ElementTrue", {"ranParameter-value": ("valueOctS", b)})}


@functools.lru_cache(maxsize=65536)
def encode_ueid(u: UeId) -> bytes:
    """UeId -> aligned-PER ``UEID`` octets (memoised: a UE's ID is the same in every report)."""
    return e2sm_spec().encode("UEID", ueid_to_asn(u))


@functools.lru_cache(maxsize=65536)
def encode_cgi(c: Cgi) -> bytes:
    """Cgi -> aligned-PER ``CGI`` octets (memoised)."""
    return e2sm_spec().encode("CGI", cgi_to_asn(c))


@functools.lru_cache(maxsize=1024)
def _rc_header(condition_id: int | None) -> bytes:
    hdr: dict = {}
    if condition_id is not None:
        hdr["ric-eventTriggerCondition-ID"] = condition_id
    return e2sm_spec().encode("E2SM-RC-IndicationHeader", {"ric-indicationHeader-formats": ("indicationHeader-Format1", hdr)})


def encode_rc_message_copy(m: RcMessageCopy) -> tuple[bytes, bytes]:
    """RcMessageCopy -> (E2SM-RC IndicationHeader Format 1, IndicationMessage Format 1), aligned PER.
    The message is written by :func:`fastper.encode_rc_octs_params` (byte-identical to
    asn1tools, tested), the header, UEID and CGI by asn1tools (memoised)."""
    items = [(RC_PARAM_RRC_MESSAGE, m.rrc), (RC_PARAM_UE_ID, encode_ueid(m.ue))]
    if m.cell is not None:
        items.append((RC_PARAM_CELL_GLOBAL_ID, encode_cgi(m.cell)))
    try:
        message = fastper.encode_rc_octs_params(items)
    except fastper.Unsupported:
        message = e2sm_spec().encode("E2SM-RC-IndicationMessage", {"ric-indicationMessage-formats": (
            "indicationMessage-Format1", {"ranP-Reported-List": [_elem_octs(p, b) for p, b in items]})})
    return _rc_header(m.condition_id), message


def _asn_decode(type_name: str, b: bytes) -> Any:
    try:
        return e2sm_spec().decode(type_name, b)
    except Exception as e:  # noqa: BLE001 - asn1tools raises DecodeError and others
        raise E2DecodeError(f"{type_name}: {type(e).__name__}: {e}") from None


@functools.lru_cache(maxsize=4096)
def _rc_header_condition(header: bytes) -> int | None:
    h = _asn_decode("E2SM-RC-IndicationHeader", header)["ric-indicationHeader-formats"]
    if h[0] != "indicationHeader-Format1":
        raise E2DecodeError(f"unsupported E2SM-RC indication header {h[0]}")
    return h[1].get("ric-eventTriggerCondition-ID")


@functools.lru_cache(maxsize=65536)
def decode_ueid(b: bytes) -> UeId:
    """Aligned-PER ``UEID`` octets -> UeId (memoised: a UE's ID octets repeat in every report)."""
    return ueid_from_asn(_asn_decode("UEID", b))


@functools.lru_cache(maxsize=65536)
def decode_cgi(b: bytes) -> Cgi:
    """Aligned-PER ``CGI`` octets -> Cgi (memoised: an E2 node reports few cells)."""
    return cgi_from_asn(_asn_decode("CGI", b))


def _rc_params_asn1tools(message: bytes) -> dict[int, bytes]:
    mm = _asn_decode("E2SM-RC-IndicationMessage", message)["ric-indicationMessage-formats"]
    if mm[0] != "indicationMessage-Format1":
        raise E2DecodeError(f"unsupported E2SM-RC indication message {mm[0]}")
    params: dict[int, bytes] = {}
    for it in mm[1]["ranP-Reported-List"]:
        vt = it["ranParameter-valueType"]
        if vt[0] == "ranP-Choice-ElementTrue" and vt[1]["ranParameter-value"][0] == "valueOctS":
            params[it["ranParameter-ID"]] = vt[1]["ranParameter-value"][1]
    return params


def decode_rc_message_copy(header: bytes, message: bytes) -> RcMessageCopy:
    """(E2SM-RC indication header, message) -> RcMessageCopy. E2DecodeError when not a
    Format 1 message copy carrying an RRC message and a UE ID.

    The message's RAN parameter list is read by :func:`fastper.decode_rc_octs_params` when it
    has the plain message-copy shape, else by asn1tools; header, UEID and CGI decodes are
    memoised on their octets (pure functions of the bytes).
    """
    cond = _rc_header_condition(header)
    try:
        params = fastper.decode_rc_octs_params(message)
    except fastper.Unsupported:
        params = _rc_params_asn1tools(message)
    if RC_PARAM_RRC_MESSAGE not in params:
        raise E2DecodeError("E2SM-RC message copy has no RRC Message (RAN parameter 3)")
    if RC_PARAM_UE_ID not in params:
        raise E2DecodeError("E2SM-RC message copy has no UE ID (RAN parameter 4)")
    ue = decode_ueid(params[RC_PARAM_UE_ID])
    cell = decode_cgi(params[RC_PARAM_CELL_GLOBAL_ID]) if RC_PARAM_CELL_GLOBAL_ID in params else None
    return RcMessageCopy(params[RC_PARAM_RRC_MESSAGE], ue, cell, cond)


# ------------------------------------------------------------------------------------------------
# E2SM-KPM indication Format 3 (UE-level measurements)
# ------------------------------------------------------------------------------------------------

NTP_EPOCH_OFFSET = 2208988800  # seconds from 1900-01-01 to 1970-01-01


def time_to_ntp(t: float) -> bytes:
    """Unix time in s -> 8-octet NTP timestamp (IETF RFC 5905 clause 6), as KPM TimeStamp."""
    sec = int(math.floor(t))
    frac = int(round((t - sec) * (1 << 32)))
    if frac == 1 << 32:
        sec, frac = sec + 1, 0
    return struct.pack(">II", (sec + NTP_EPOCH_OFFSET) & 0xFFFFFFFF, frac)


def ntp_to_time(b: bytes) -> float:
    """8-octet NTP timestamp -> Unix time in s."""
    sec, frac = struct.unpack(">II", b)
    return sec - NTP_EPOCH_OFFSET + frac / (1 << 32)


@dataclass(frozen=True, slots=True)
class KpmUeReport:
    """One UE's measurements in a KPM Format 3 indication: ``values`` maps measurement name to
    its value (int or float; None for noValue), in the order reported."""

    ue: UeId
    values: tuple[tuple[str, int | float | None], ...]
    granularity_ms: int | None = None


@dataclass(frozen=True, slots=True)
class KpmIndication:
    """A KPM indication (header Format 1, message Format 3). ``collect_start`` is Unix time in s."""

    collect_start: float
    ue_reports: tuple[KpmUeReport, ...]
    sender_name: str | None = None


def _record_item(x: int | float | None) -> tuple:
    if x is None:
        return ("noValue", None)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"KPM record value must be int, float or None, got {x!r}")
    if isinstance(x, int):
        return ("integer", x)
    return ("real", float(x))


def encode_kpm_indication(k: KpmIndication) -> tuple[bytes, bytes]:
    """KpmIndication -> (E2SM-KPM IndicationHeader Format 1, IndicationMessage Format 3)."""
    s = e2sm_spec()
    h: dict = {"colletStartTime": time_to_ntp(k.collect_start)}
    if k.sender_name is not None:
        h["senderName"] = k.sender_name
    header = s.encode("E2SM-KPM-IndicationHeader", {"indicationHeader-formats": ("indicationHeader-Format1", h)})
    reports = []
    for r in k.ue_reports:
        if not r.values:
            raise ValueError("a KPM UE report needs at least one measurement")
        f1: dict = {
            "measData": [{"measRecord": [_record_item(v) for _, v in r.values]}],
            "measInfoList": [{"measType": ("measName", n), "labelInfoList": [{"measLabel": {"noLabel": "true"}}]}
                             for n, _ in r.values]}
        if r.granularity_ms is not None:
            f1["granulPeriod"] = r.granularity_ms
        reports.append({"ueID": ueid_to_asn(r.ue), "measReport": f1})
    message = s.encode("E2SM-KPM-IndicationMessage", {"indicationMessage-formats": (
        "indicationMessage-Format3", {"ueMeasReportList": reports})})
    return header, message


def decode_kpm_indication(header: bytes, message: bytes) -> KpmIndication:
    """(E2SM-KPM header, message) -> KpmIndication. Format 3 only; a UE report whose record count
    differs from its measInfoList, or without a measInfoList, raises E2DecodeError."""
    h = _asn_decode("E2SM-KPM-IndicationHeader", header)["indicationHeader-formats"][1]
    m = _asn_decode("E2SM-KPM-IndicationMessage", message)["indicationMessage-formats"]
    if m[0] != "indicationMessage-Format3":
        raise E2DecodeError(f"unsupported E2SM-KPM indication message {m[0]}")
    out = []
    for it in m[1]["ueMeasReportList"]:
        f1 = it["measReport"]
        if "measInfoList" not in f1:
            raise E2DecodeError("KPM UE report has no measInfoList")
        names = []
        for mi in f1["measInfoList"]:
            mt = mi["measType"]
            names.append(mt[1] if mt[0] == "measName" else f"measID:{mt[1]}")
        if len(f1["measData"]) != 1:
            raise E2DecodeError(f"KPM UE report has {len(f1['measData'])} measData items, expected 1")
        rec = f1["measData"][0]["measRecord"]
        if len(rec) != len(names):
            raise E2DecodeError(f"KPM UE report has {len(rec)} values for {len(names)} measurements")
        vals = tuple((n, v[1] if v[0] != "noValue" else None) for n, v in zip(names, rec))
        out.append(KpmUeReport(ueid_from_asn(it["ueID"]), vals, f1.get("granulPeriod")))
    return KpmIndication(ntp_to_time(h["colletStartTime"]), tuple(out), h.get("senderName"))


# ------------------------------------------------------------------------------------------------
# subscription payloads (event trigger and action definitions)
# ------------------------------------------------------------------------------------------------

def rc_event_trigger_message_copy(condition_id: int = 1) -> bytes:
    """E2SM-RC event trigger Format 1 (clause 9.2.1.1.1): an NR UL-DCCH MeasurementReport."""
    return e2sm_spec().encode("E2SM-RC-EventTrigger", {"ric-eventTrigger-formats": ("eventTrigger-Format1", {
        "message-List": [{"ric-eventTriggerCondition-ID": condition_id, "messageType": (
            "messageType-Choice-RRC", {"rRC-Message": {"rrcType": ("nR", "uL-DCCH"),
                                                       "messageID": RRC_MSG_ID_MEASUREMENT_REPORT}})}]})})


def rc_action_definition_message_copy() -> bytes:
    """E2SM-RC action definition Format 1, REPORT Style 1: report RAN parameters 3, 4 and 6."""
    return e2sm_spec().encode("E2SM-RC-ActionDefinition", {
        "ric-Style-Type": RC_STYLE_MESSAGE_COPY,
        "ric-actionDefinition-formats": ("actionDefinition-Format1", {"ranP-ToBeReported-List": [
            {"ranParameter-ID": p} for p in (RC_PARAM_RRC_MESSAGE, RC_PARAM_UE_ID, RC_PARAM_CELL_GLOBAL_ID)]})})


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


# imported last: fastper uses the result types above (CellResult, ServingResult)
from . import fastper  # noqa: E402
