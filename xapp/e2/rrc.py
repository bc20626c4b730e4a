"""NR RRC MeasurementReport (TS 38.331 clause 6.2.2, UL-DCCH-Message, unaligned PER): decode.

What is read, per measured cell (``MeasResultNR``): the PCI, the cell-level results of both
reference signals (``resultsSSB-Cell`` and ``resultsCSI-RS-Cell``: RSRP, RSRQ, SINR after TS
38.133 conversion) and the per-beam results (``rsIndexResults``: per SSB index and per CSI-RS
resource index); the serving MOs (``measResultServingMOList``), the NR neighbours
(``measResultListNR``), the E-UTRA neighbours (``measResultListEUTRA``: PCI and the raw TS
36.133 indices, noted, not converted) and, when present, the R16 ``locationInfo-r16``
(``commonLocationInfo-r16``: ``locationCoordinate-r16`` = TS 37.355 LocationCoordinates and
``velocityEstimate-r16`` = TS 37.355 Velocity, both UPER inside the OCTET STRING).

One decode path: :func:`decode_meas_report_fast`, a walker for the common shapes, field by
field as X.691 lays them out (clauses 10.9 lengths, 12 integers, 19 sequences, 23 choices),
hands anything else (an E-UTRA neighbour list, a MeasResultNR extension, an unknown extension
group content) to pycrate's ``RRCNR``/``LPP`` modules on the same bytes. The tests require equal
results on generated PDUs.

Walker layout: UL-DCCH-Message c1/measurementReport/criticalExtensions measurementReport;
MeasResults {measId (1..64), measResultServingMOList (1..32), measResultNeighCells
measResultListNR (1..8) OPTIONAL, ...}; MeasResultNR {physCellId (0..1007) OPTIONAL, measResult
{cellResults {resultsSSB-Cell, resultsCSI-RS-Cell}, rsIndexResults {resultsSSB-Indexes (1..64)
{ssb-Index (0..63), ssb-Results OPTIONAL}, resultsCSI-RS-Indexes (1..64) {csi-RS-Index
(0..95), csi-RS-Results OPTIONAL}} OPTIONAL}, ...}; MeasQuantityResults {rsrp, rsrq, sinr
(0..127) all OPTIONAL}; extension group 3 of MeasResults holding only locationInfo-r16; other
MeasResults extension groups are skipped as the open types they are.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

from . import units
from .ie import E2DecodeError, pycrate_decode
from .per import Bits, Unsupported

NAN = float("nan")
# UL-DCCH-MessageType c1 alternative index of measurementReport (TS 38.331), used as messageID
RRC_MSG_ID_MEASUREMENT_REPORT = 0


class BeamResult(NamedTuple):
    """One beam's results (``rsIndexResults``): ``rs`` 'ssb' (index 0..63) or 'csi-rs' (0..95),
    RSRP dBm, RSRQ dB, SINR dB (NaN when not reported)."""

    rs: str
    index: int
    rsrp_dbm: float = NAN
    rsrq_db: float = NAN
    sinr_db: float = NAN


class CellResult(NamedTuple):
    """One cell's results in a MeasurementReport: PCI (-1 when absent); SSB cell-level RSRP dBm,
    RSRQ dB, SINR dB; CSI-RS cell-level ``csi_*``; per-beam results ``beams`` (all after TS
    38.133 conversion, NaN when the UE did not report the quantity). A NamedTuple: the decoder
    makes several per report."""

    pci: int = -1
    rsrp_dbm: float = NAN
    rsrq_db: float = NAN
    sinr_db: float = NAN
    csi_rsrp_dbm: float = NAN
    csi_rsrq_db: float = NAN
    csi_sinr_db: float = NAN
    beams: tuple[BeamResult, ...] = ()

    @property
    def has_ssb(self) -> bool:
        """Any SSB cell-level quantity reported."""
        return self.rsrp_dbm == self.rsrp_dbm or self.rsrq_db == self.rsrq_db or self.sinr_db == self.sinr_db

    @property
    def has_csi_rs(self) -> bool:
        """Any CSI-RS cell-level quantity reported."""
        return (self.csi_rsrp_dbm == self.csi_rsrp_dbm or self.csi_rsrq_db == self.csi_rsrq_db
                or self.csi_sinr_db == self.csi_sinr_db)


class ServingResult(NamedTuple):
    """A serving MO's result: ``serv_cell_index`` (ServCellIndex 0..31) and the cell's results."""

    serv_cell_index: int
    cell: CellResult


class EutraResult(NamedTuple):
    """An E-UTRA neighbour (MeasResultEUTRA): PCI (0..503) and the raw TS 36.133 report indices
    (RSRP-RangeEUTRA 0..97, RSRQ-RangeEUTRA 0..34, SINR-RangeEUTRA 0..127; None when absent)."""

    pci: int
    rsrp_index: int | None = None
    rsrq_index: int | None = None
    sinr_index: int | None = None


@dataclass(frozen=True, slots=True)
class RrcMeasReport:
    """The fields of an NR MeasurementReport (TS 38.331 MeasResults) Pallas reads.

    ``serving``: measResultServingMOList; ``neighbours``: measResultNeighCells/measResultListNR;
    ``lat``/``lon`` degrees, ``speed_mps`` m/s, ``heading_deg`` degrees clockwise from north
    from locationInfo-r16 (NaN when absent); ``eutra_neighbours``: measResultListEUTRA.
    """

    meas_id: int
    serving: tuple[ServingResult, ...]
    neighbours: tuple[CellResult, ...] = ()
    lat: float = NAN
    lon: float = NAN
    speed_mps: float = NAN
    heading_deg: float = NAN
    eutra_neighbours: tuple[EutraResult, ...] = ()


@functools.lru_cache(maxsize=None)
def ul_dcch() -> Any:
    """pycrate's UL-DCCH-Message type."""
    from pycrate_asn1dir import RRCNR
    return RRCNR.NR_RRC_Definitions.UL_DCCH_Message


@functools.lru_cache(maxsize=None)
def lpp() -> Any:
    """pycrate's LPP-PDU-Definitions module."""
    from pycrate_asn1dir import LPP
    return LPP.LPP_PDU_Definitions


# ------------------------------------------------------------------------------------------------
# reference decoder (pycrate)
# ------------------------------------------------------------------------------------------------

def _q(q: Mapping) -> tuple[float, float, float]:
    return (units.index_to_rsrp(q["rsrp"]) if "rsrp" in q else NAN,
            units.index_to_rsrq(q["rsrq"]) if "rsrq" in q else NAN,
            units.index_to_sinr(q["sinr"]) if "sinr" in q else NAN)


def _cell_from_val(v: Mapping) -> CellResult:
    mr = v["measResult"]
    cr = mr["cellResults"]
    ssb = _q(cr["resultsSSB-Cell"]) if "resultsSSB-Cell" in cr else _NO_Q
    csi = _q(cr["resultsCSI-RS-Cell"]) if "resultsCSI-RS-Cell" in cr else _NO_Q
    beams: list[BeamResult] = []
    ri = mr.get("rsIndexResults", {})
    for b in ri.get("resultsSSB-Indexes", ()):
        beams.append(BeamResult("ssb", b["ssb-Index"], *(_q(b["ssb-Results"]) if "ssb-Results" in b else _NO_Q)))
    for b in ri.get("resultsCSI-RS-Indexes", ()):
        beams.append(BeamResult("csi-rs", b["csi-RS-Index"],
                                *(_q(b["csi-RS-Results"]) if "csi-RS-Results" in b else _NO_Q)))
    return CellResult(v.get("physCellId", -1), *ssb, *csi, tuple(beams))


def decode_location(b: bytes) -> tuple[float, float]:
    """locationCoordinate-r16 contents -> (lat, lon) degrees. E2DecodeError if not an
    ellipsoid point (with or without uncertainty/altitude: the point is taken)."""
    try:
        return decode_ellipsoid_point(b)
    except Unsupported:
        pass
    alt, v = pycrate_decode(lpp().LocationCoordinates, b, "locationCoordinate-r16")
    if not isinstance(v, dict) or "latitudeSign" not in v:  # an extension alternative is bytes
        raise E2DecodeError(f"unsupported LocationCoordinates {alt}")
    return units.lpp_to_lat(v["latitudeSign"], v["degreesLatitude"]), units.lpp_to_lon(v["degreesLongitude"])


def decode_velocity(b: bytes) -> tuple[float, float]:
    """velocityEstimate-r16 contents -> (speed m/s, heading degrees)."""
    try:
        return decode_horizontal_velocity(b)
    except Unsupported:
        pass
    alt, v = pycrate_decode(lpp().Velocity, b, "velocityEstimate-r16")
    if not isinstance(v, dict) or "bearing" not in v or "horizontalSpeed" not in v:
        raise E2DecodeError(f"unsupported Velocity {alt}")  # an extension alternative is bytes
    return units.kmh_to_speed(v["horizontalSpeed"]), float(v["bearing"])


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
    eutra: tuple[EutraResult, ...] = ()
    nc = mr.get("measResultNeighCells")
    if nc is not None and nc[0] == "measResultListNR":
        nbs = tuple(_cell_from_val(n) for n in nc[1])
    elif nc is not None and nc[0] == "measResultListEUTRA":
        eutra = tuple(EutraResult(n["eutra-PhysCellId"], n["measResult"].get("rsrp"), n["measResult"].get("rsrq"),
                                  n["measResult"].get("sinr")) for n in nc[1])
    elif nc is not None:
        raise E2DecodeError(f"unsupported measResultNeighCells {nc[0]}")
    lat = lon = speed = heading = NAN
    common = mr.get("locationInfo-r16", {}).get("commonLocationInfo-r16", {})
    if "locationCoordinate-r16" in common:
        lat, lon = decode_location(common["locationCoordinate-r16"])
    if "velocityEstimate-r16" in common:
        speed, heading = decode_velocity(common["velocityEstimate-r16"])
    return RrcMeasReport(mr["measId"], serving, nbs, lat, lon, speed, heading, eutra)


def decode_rrc_meas_report_pycrate(b: bytes) -> RrcMeasReport:
    """UL-DCCH-Message bytes -> RrcMeasReport with pycrate's RRCNR (the reference decoder)."""
    v = pycrate_decode(ul_dcch(), b, "RRC UL-DCCH")
    try:
        return _rrc_from_val(v)
    except (KeyError, TypeError, IndexError, AttributeError) as e:
        raise E2DecodeError(f"RRC UL-DCCH: unexpected structure ({type(e).__name__}: {e})") from None


# ------------------------------------------------------------------------------------------------
# the walker
# ------------------------------------------------------------------------------------------------

_NO_Q = (NAN, NAN, NAN)


def _quantities(r: Bits) -> tuple[float, float, float]:
    pres = r.read(3)
    if pres == 7:  # the common case: all three, read as one 21-bit field
        x = r.read(21)
        return float((x >> 14) - 156), ((x >> 7) & 0x7F) / 2.0 - 43.0, (x & 0x7F) / 2.0 - 23.0
    rsrp = units.index_to_rsrp(r.read(7)) if pres & 4 else NAN
    rsrq = units.index_to_rsrq(r.read(7)) if pres & 2 else NAN
    sinr = units.index_to_sinr(r.read(7)) if pres & 1 else NAN
    return rsrp, rsrq, sinr


def _beams(r: Bits) -> tuple[BeamResult, ...]:
    p = r.read(2)                    # resultsSSB-Indexes, resultsCSI-RS-Indexes present
    out: list[BeamResult] = []
    if p & 2:
        for _ in range(r.read(6) + 1):
            has = r.read(1)
            idx = r.read(6)
            out.append(BeamResult("ssb", idx, *(_quantities(r) if has else _NO_Q)))
    if p & 1:
        for _ in range(r.read(6) + 1):
            has = r.read(1)
            idx = r.read(7)
            if idx > 95:
                raise Unsupported("CSI-RS-Index range")
            out.append(BeamResult("csi-rs", idx, *(_quantities(r) if has else _NO_Q)))
    return tuple(out)


def _meas_result_nr(r: Bits) -> CellResult:
    head = r.read(2)                 # extension bit, physCellId present
    if head & 2:
        raise Unsupported("MeasResultNR extension")
    pci = -1
    if head:
        pci = r.read(10)
        if pci > 1007:
            raise Unsupported("PCI range")
    flags = r.read(3)                # rsIndexResults, resultsSSB-Cell, resultsCSI-RS-Cell present
    ssb = _quantities(r) if flags & 2 else _NO_Q
    csi = _quantities(r) if flags & 1 else _NO_Q
    beams = _beams(r) if flags & 4 else ()
    return CellResult(pci, ssb[0], ssb[1], ssb[2], csi[0], csi[1], csi[2], beams)


class FastMeasReport(NamedTuple):
    """The walker's result; ``loc``/``vel`` are the raw LPP octets (or None)."""

    meas_id: int
    serving: tuple[ServingResult, ...]
    neighbours: tuple[CellResult, ...]
    loc: bytes | None
    vel: bytes | None


def _location_group(b: bytes) -> tuple[bytes | None, bytes | None]:
    r = Bits(b)
    # group presence bits (only locationInfo-r16), LocationInfo-r16 extension bit and presence
    # bits (only commonLocationInfo-r16): 5 + 1 + 4 bits
    if r.read(10) != 0b0100001000:
        raise Unsupported("extension group 3 content")
    opts = r.read(6)
    vals: list[bytes | None] = []
    for k in range(5, -1, -1):
        vals.append(r.octets(r.length()) if opts >> k & 1 else None)
    if r.n - r.p >= 8:
        raise Unsupported("trailing octets in extension group")
    return vals[2], vals[5]


def decode_meas_report_fast(b: bytes) -> FastMeasReport:
    """The walker: UL-DCCH-Message bytes -> FastMeasReport, or :class:`~.per.Unsupported`."""
    r = Bits(b)
    # c1 (1 bit), measurementReport (4), criticalExtensions (1), MeasurementReport-IEs
    # optional bits (2): all zero
    if r.read(8) != 0:
        raise Unsupported("not c1/measurementReport without extensions")
    x = r.read(8)                    # MeasResults extension bit, neighbour list present, measId - 1
    ext, has_nb, meas_id = x >> 7, (x >> 6) & 1, (x & 0x3F) + 1
    serving = []
    for _ in range(r.read(5) + 1):
        y = r.read(7)                # MeasResultServMO extension bit, best neighbour, servCellId
        if y & 0x60:
            raise Unsupported("MeasResultServMO extension or measResultBestNeighCell")
        serving.append(ServingResult(y & 0x1F, _meas_result_nr(r)))
    nbs: list[CellResult] = []
    if has_nb:
        if r.read(1):
            raise Unsupported("non-NR neighbour list")
        for _ in range(r.read(3) + 1):
            nbs.append(_meas_result_nr(r))
    loc = vel = None
    if ext:
        if r.read(1):
            raise Unsupported("long extension bitmap")
        nbits = r.read(6) + 1
        present = [r.read(1) for _ in range(nbits)]
        for gi, p in enumerate(present):
            if not p:
                continue
            ln = r.length()
            body = r.octets(ln)
            if gi == 2:
                loc, vel = _location_group(body)
    if r.n - r.p >= 8:
        raise Unsupported("trailing octets")
    if r.p < r.n and r.read(r.n - r.p):
        raise Unsupported("non-zero padding")
    return FastMeasReport(meas_id, tuple(serving), tuple(nbs), loc, vel)


def decode_ellipsoid_point(b: bytes) -> tuple[float, float]:
    """TS 37.355 LocationCoordinates UPER -> (lat, lon) for the ellipsoidPoint alternative
    (walker; Unsupported otherwise)."""
    r = Bits(b)
    if r.read(4) != 0:
        raise Unsupported("LocationCoordinates alternative")
    x = r.read(48)                   # latitudeSign (1), degreesLatitude (23), degreesLongitude (24)
    if r.n - r.p >= 8:
        raise Unsupported("trailing octets")
    return (units.lpp_to_lat("south" if x >> 47 else "north", (x >> 24) & 0x7FFFFF),
            units.lpp_to_lon((x & 0xFFFFFF) - (1 << 23)))


def decode_horizontal_velocity(b: bytes) -> tuple[float, float]:
    """TS 37.355 Velocity UPER -> (speed m/s, bearing degrees) for horizontalVelocity (walker)."""
    r = Bits(b)
    x = r.read(23)                   # extension bit, alternative (2), bearing (9), speed (11)
    if x >> 20:
        raise Unsupported("Velocity alternative")
    bearing, kmh = (x >> 11) & 0x1FF, x & 0x7FF
    if bearing > 359 or r.n - r.p >= 8:
        raise Unsupported("Velocity shape")
    return units.kmh_to_speed(kmh), float(bearing)


def decode_rrc_meas_report(b: bytes) -> RrcMeasReport:
    """UL-DCCH-Message bytes -> RrcMeasReport. The walker first, pycrate for anything it does
    not cover (same result; tests check both agree). E2DecodeError on malformed input."""
    try:
        r = decode_meas_report_fast(b)
    except Unsupported:
        return decode_rrc_meas_report_pycrate(b)
    if r.loc is not None or r.vel is not None:
        lat = lon = speed = heading = NAN
        if r.loc is not None:
            lat, lon = decode_location(r.loc)
        if r.vel is not None:
            speed, heading = decode_velocity(r.vel)
        return RrcMeasReport(r.meas_id, r.serving, r.neighbours, lat, lon, speed, heading)
    return RrcMeasReport(r.meas_id, r.serving, r.neighbours)


# ------------------------------------------------------------------------------------------------
# the SSB report walker: the common shape, straight to values (issue 15)
# ------------------------------------------------------------------------------------------------

class SsbMeasReport(NamedTuple):
    """:func:`decode_ssb_meas_report`'s result: the one serving MO's ``serv_cell_index``, PCI
    and SSB cell-level RSRP dBm / RSRQ dB / SINR dB, the NR neighbours as cell codes (the 39
    bits of each MeasResultNR, read by :func:`ssb_cell_values`; a code names its values, so
    callers may memoise what they build from it), and the location (degrees; NaN when absent)
    and velocity (m/s, degrees)."""

    meas_id: int
    serv_cell_index: int
    pci: int
    rsrp_dbm: float
    rsrq_db: float
    sinr_db: float
    neighbour_codes: tuple[int, ...]
    lat: float = NAN
    lon: float = NAN
    speed_mps: float = NAN
    heading_deg: float = NAN


# a MeasResultNR of the common shape: 39 bits = extension 0, physCellId present 1, PCI (10),
# rsIndexResults/resultsSSB-Cell/resultsCSI-RS-Cell present 0 1 0, rsrp/rsrq/sinr present 1 1 1,
# the three 7-bit indices; the fixed bits under _CELL_MASK must equal _CELL_BITS
_CELL_MASK = (0b11 << 37) | (0b111111 << 21)
_CELL_BITS = (0b01 << 37) | (0b010111 << 21)


def ssb_cell_values(code: int) -> tuple[int, float, float, float]:
    """A cell code of :class:`SsbMeasReport` -> (PCI, RSRP dBm, RSRQ dB, SINR dB) (TS 38.133
    reporting ranges, as :func:`decode_rrc_meas_report` converts them)."""
    return ((code >> 27) & 0x3FF, float(((code >> 14) & 0x7F) - 156), ((code >> 7) & 0x7F) / 2.0 - 43.0,
            (code & 0x7F) / 2.0 - 23.0)


def _ulength(v: int, n: int, q: int) -> tuple[int, int]:
    """An unaligned unconstrained length determinant (X.691 clause 11.9.4.2, unfragmented) at bit
    ``q`` of the ``n``-bit integer ``v`` -> (length, next bit): :meth:`Bits.length` off an integer."""
    if q + 8 > n:
        raise Unsupported("truncated")
    x = (v >> (n - q - 8)) & 0xFF
    if not x & 0x80:
        return x, q + 8
    if x & 0x40 or q + 16 > n:
        raise Unsupported("fragmented length or truncated")
    return (v >> (n - q - 16)) & 0x3FFF, q + 16


def decode_ssb_meas_report(b: bytes) -> SsbMeasReport:
    """UL-DCCH-Message bytes -> SsbMeasReport for the shape E2 nodes send most (and the trace
    generator produces): one serving MO; the serving cell and every NR neighbour with a PCI and
    SSB cell-level RSRP, RSRQ and SINR, no CSI-RS or per-beam results and no MeasResultNR
    extension; optionally locationInfo-r16 with an ellipsoid point and a horizontal velocity.
    Anything else is :class:`~.per.Unsupported` (decode with :func:`decode_rrc_meas_report`).

    The same X.691 layout as :func:`decode_meas_report_fast` (module docstring), read with
    fixed-width fields off one integer: a cell is 39 bits. Tests require the values of
    :func:`decode_rrc_meas_report` (walker and pycrate) on generated PDUs.
    """
    n = 8 * len(b)
    if n < 67:                              # header 16 + count 5 + MO 7 + cell 39
        raise Unsupported("short")
    v = int.from_bytes(b, "big")
    x = v >> (n - 28)                        # c1..IEs (8), MeasResults ext/nb/measId (8), MO count (5), MO (7)
    if x & 0xFF00000 or x & 0xF80 or x & 0x60:
        raise Unsupported("not one plain serving MO of a c1/measurementReport")
    ext, has_nb = (x >> 19) & 1, (x >> 18) & 1
    meas_id, sci = ((x >> 12) & 0x3F) + 1, x & 0x1F
    c = (v >> (n - 67)) & 0x7FFFFFFFFF
    if c & _CELL_MASK != _CELL_BITS:
        raise Unsupported("serving cell shape")
    pci = (c >> 27) & 0x3FF
    if pci > 1007:
        raise Unsupported("PCI range")
    p = 67
    nbs = []
    if has_nb:
        if p + 4 > n:
            raise Unsupported("truncated")
        y = (v >> (n - p - 4)) & 0xF
        if y & 8:
            raise Unsupported("non-NR neighbour list")
        p += 4
        k = (y & 7) + 1
        if p + 39 * k > n:
            raise Unsupported("truncated")
        for _ in range(k):
            p += 39
            d = (v >> (n - p)) & 0x7FFFFFFFFF
            if d & _CELL_MASK != _CELL_BITS or (d >> 27) & 0x3FF > 1007:
                raise Unsupported("neighbour shape or PCI range")
            nbs.append(d)
    lat = lon = speed = heading = NAN
    if ext:                                  # the extension bitmap and groups, read off the same integer
        q = p + 7
        if q > n:
            raise Unsupported("truncated")
        x = (v >> (n - q)) & 0x7F
        if x & 0x40:
            raise Unsupported("long extension bitmap")
        nbits = (x & 0x3F) + 1
        q += nbits
        if q > n:
            raise Unsupported("truncated")
        present = (v >> (n - q)) & ((1 << nbits) - 1)
        for gi in range(nbits):
            if not present >> (nbits - 1 - gi) & 1:
                continue
            ln, q = _ulength(v, n, q)
            if gi != 2:
                q += 8 * ln
                if q > n:
                    raise Unsupported("truncated")
                continue
            end = q + 8 * ln
            if end > n or q + 16 > n:
                raise Unsupported("truncated")
            # group 3: presence (5), LocationInfo-r16 ext (1) and presence (4), CommonLocationInfo (6)
            q += 16
            x = (v >> (n - q)) & 0xFFFF
            if x >> 6 != 0b0100001000:
                raise Unsupported("extension group 3 content")
            opts = x & 0x3F
            for kk in range(5, -1, -1):
                if not opts >> kk & 1:
                    continue
                m, q = _ulength(v, n, q)
                if kk == 3:                  # locationCoordinate-r16: ellipsoidPoint, 52 bits in 7 octets
                    q += 56
                    if m != 7 or q > n:
                        raise Unsupported("LocationCoordinates alternative")
                    x = (v >> (n - q)) & ((1 << 56) - 1)
                    if x >> 52:
                        raise Unsupported("LocationCoordinates alternative")
                    z = (x >> 4) & ((1 << 48) - 1)
                    lat = units.lpp_to_lat("south" if z >> 47 else "north", (z >> 24) & 0x7FFFFF)
                    lon = units.lpp_to_lon((z & 0xFFFFFF) - (1 << 23))
                elif kk == 0:                # velocityEstimate-r16: horizontalVelocity, 23 bits in 3 octets
                    q += 24
                    if m != 3 or q > n:
                        raise Unsupported("Velocity shape")
                    z = (v >> (n - q)) & 0xFFFFFF
                    if z >> 21 or ((z >> 12) & 0x1FF) > 359:
                        raise Unsupported("Velocity shape")
                    speed, heading = units.kmh_to_speed((z >> 1) & 0x7FF), float((z >> 12) & 0x1FF)
                else:
                    q += 8 * m
                    if q > n:
                        raise Unsupported("truncated")
            if end - q >= 8 or q > end:
                raise Unsupported("trailing octets in extension group")
            q = end
        p = q
    if n - p >= 8:
        raise Unsupported("trailing octets")
    if p < n and v & ((1 << (n - p)) - 1):
        raise Unsupported("non-zero padding")
    return SsbMeasReport(meas_id, sci, pci, float(((c >> 14) & 0x7F) - 156), ((c >> 7) & 0x7F) / 2.0 - 43.0,
                         (c & 0x7F) / 2.0 - 23.0, tuple(nbs), lat, lon, speed, heading)
