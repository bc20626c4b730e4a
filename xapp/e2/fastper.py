"""Fast paths for the two hot decodes: the E2AP RICindication envelope (aligned PER) and the
fields Pallas reads from an NR MeasurementReport (unaligned PER).

pycrate decodes the whole PDU through its generic object tree (about 0.5 ms for a RICindication,
0.2-0.6 ms for a MeasurementReport on this machine), too slow for 5,000 indications a second on
one core. These walkers read exactly the common shapes, field by field as X.691 lays them out,
and raise :class:`Unsupported` on anything else: a set extension bit they do not know, a
fragmented length, an unknown IE, an alternative other than the one expected, trailing or
missing bits. The caller (:mod:`xapp.e2.codec`) then runs pycrate on the same bytes, so the
result is always pycrate's, only faster when the walker covers the PDU; the tests decode
thousands of generated PDUs both ways and require equal results.

Layouts read (X.691 clauses 10.9 lengths, 12 integers, 19 sequences, 23 choices):

- E2AP-PDU ::= CHOICE {initiatingMessage, ...}; InitiatingMessage {procedureCode (0..255),
  criticality ENUMERATED(3), value open type}; RICindication ::= SEQUENCE {protocolIEs
  ProtocolIE-Container (SIZE(0..65535)), ...}; ProtocolIE-Field {id (0..65535), criticality,
  value open type}; IE values RICrequestID {INTEGER (0..65535) x2, ...}, RANfunctionID
  (0..4095), RICactionID (0..255), RICindicationSN (0..65535), RICindicationType
  ENUMERATED {report, insert, ...}, OCTET STRINGs.
- UL-DCCH-Message (TS 38.331): c1/measurementReport/criticalExtensions measurementReport;
  MeasResults {measId (1..64), measResultServingMOList (1..32), measResultNeighCells
  measResultListNR (1..8) OPTIONAL, ...}; MeasResultNR {physCellId (0..1007) OPTIONAL,
  measResult {cellResults {resultsSSB-Cell, resultsCSI-RS-Cell}, rsIndexResults OPTIONAL}, ...};
  MeasQuantityResults {rsrp, rsrq, sinr (0..127) all OPTIONAL}; extension group 3 of MeasResults
  holding only locationInfo-r16 {commonLocationInfo-r16 {six OCTET STRINGs OPTIONAL}}; other
  MeasResults extension groups are skipped as the open types they are.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import units
from .codec import CellResult, ServingResult

NAN = float("nan")


class Unsupported(Exception):
    """The walker does not cover this PDU; decode it with pycrate instead."""


# ------------------------------------------------------------------------------------------------
# aligned PER: E2AP RICindication envelope
# ------------------------------------------------------------------------------------------------

def _alen(b: bytes, i: int) -> tuple[int, int]:
    """Aligned length determinant at octet i -> (length, next octet)."""
    if i >= len(b):
        raise Unsupported("truncated length")
    x = b[i]
    if x < 0x80:
        return x, i + 1
    if x < 0xC0:
        if i + 1 >= len(b):
            raise Unsupported("truncated length")
        return ((x & 0x3F) << 8) | b[i + 1], i + 2
    raise Unsupported("fragmented length")


def _octs_value(v: bytes) -> bytes:
    n, j = _alen(v, 0)
    if j + n != len(v):
        raise Unsupported("OCTET STRING length mismatch")
    return v[j:]


def _ie_value(ie: int, v: bytes) -> Any:
    if ie == 29:  # RICrequestID
        if len(v) != 5 or v[0] != 0:
            raise Unsupported("RICrequestID shape")
        return {"ricRequestorID": (v[1] << 8) | v[2], "ricInstanceID": (v[3] << 8) | v[4]}
    if ie == 5:  # RANfunctionID (0..4095)
        if len(v) != 2:
            raise Unsupported("RANfunctionID shape")
        x = (v[0] << 8) | v[1]
        if x > 4095:
            raise Unsupported("RANfunctionID range")
        return x
    if ie == 15:  # RICactionID (0..255)
        if len(v) != 1:
            raise Unsupported("RICactionID shape")
        return v[0]
    if ie == 27:  # RICindicationSN (0..65535)
        if len(v) != 2:
            raise Unsupported("RICindicationSN shape")
        return (v[0] << 8) | v[1]
    if ie == 28:  # RICindicationType
        if len(v) != 1 or v[0] & 0x80 or v[0] & 0x3F:
            raise Unsupported("RICindicationType shape")
        return "insert" if v[0] & 0x40 else "report"
    if ie in (25, 26, 20):
        return _octs_value(v)
    raise Unsupported(f"IE {ie}")


def decode_ric_indication_ies(b: bytes) -> dict[int, Any]:
    """E2AP-PDU bytes -> {IE id: value} for a RICindication, as pycrate's get_val gives them."""
    if len(b) < 4 or b[0] != 0x00 or b[1] != 5:
        raise Unsupported("not an initiatingMessage RICindication")
    if b[2] & 0x3F or (b[2] >> 6) > 2:
        raise Unsupported("criticality")
    n, i = _alen(b, 3)
    if i + n != len(b):
        raise Unsupported("open type length mismatch")
    if n < 3 or b[i] != 0:  # RICindication extension bit and padding
        raise Unsupported("RICindication extension")
    count = (b[i + 1] << 8) | b[i + 2]
    i += 3
    out: dict[int, Any] = {}
    for _ in range(count):
        if i + 3 > len(b):
            raise Unsupported("truncated IE")
        ie = (b[i] << 8) | b[i + 1]
        c = b[i + 2]
        if c & 0x3F or (c >> 6) > 2:
            raise Unsupported("IE criticality")
        ln, j = _alen(b, i + 3)
        if j + ln > len(b):
            raise Unsupported("truncated IE value")
        if ie in out:
            raise Unsupported("repeated IE")
        out[ie] = _ie_value(ie, b[j:j + ln])
        i = j + ln
    if i != len(b):
        raise Unsupported("trailing octets")
    return out


def decode_rc_octs_params(b: bytes) -> dict[int, bytes]:
    """E2SM-RC-IndicationMessage Format 1 whose every RAN parameter is an ELEMENT holding an
    OCTET STRING (the message-copy shape) -> {RAN parameter ID: octets}.

    Layout (aligned PER): message and CHOICE extension bits, Format 1 index (3 bits of 5 root
    alternatives), Format 1 extension bit, then the list count - 1 in two octets; each item:
    item and RANParameter-ID extension bits, octet count - 1 (2 bits), the ID - 1 in that many
    octets; then one octet 0x04 (ElementTrue, valueOctS) and an aligned length with the octets.
    """
    n = len(b)
    if n < 3 or b[0] != 0:
        raise Unsupported("E2SM-RC indication message shape")
    count = ((b[1] << 8) | b[2]) + 1
    i = 3
    out: dict[int, bytes] = {}
    for _ in range(count):
        if i >= n:
            raise Unsupported("truncated RAN parameter")
        x = b[i]
        if x & 0xCF:
            raise Unsupported("RAN parameter item shape")
        k = ((x >> 4) & 3) + 1
        if i + 1 + k + 1 > n:
            raise Unsupported("truncated RAN parameter")
        pid = int.from_bytes(b[i + 1:i + 1 + k], "big") + 1
        if b[i + 1 + k] != 0x04:
            raise Unsupported("RAN parameter value is not an ELEMENT OCTET STRING")
        ln, j = _alen(b, i + 2 + k)
        if j + ln > n or pid in out:
            raise Unsupported("RAN parameter length or repetition")
        out[pid] = b[j:j + ln]
        i = j + ln
    if i != n:
        raise Unsupported("trailing octets")
    return out


# ------------------------------------------------------------------------------------------------
# unaligned PER: NR MeasurementReport
# ------------------------------------------------------------------------------------------------

class _Bits:
    __slots__ = ("v", "n", "p")

    def __init__(self, b: bytes) -> None:
        self.v = int.from_bytes(b, "big")
        self.n = 8 * len(b)
        self.p = 0

    def read(self, k: int) -> int:
        p = self.p + k
        if p > self.n:
            raise Unsupported("truncated")
        self.p = p
        return (self.v >> (self.n - p)) & ((1 << k) - 1)

    def length(self) -> int:
        if self.read(1) == 0:
            return self.read(7)
        if self.read(1) == 0:
            return self.read(14)
        raise Unsupported("fragmented length")

    def octets(self, k: int) -> bytes:
        return self.read(8 * k).to_bytes(k, "big") if k else b""


_NO_Q = (NAN, NAN, NAN)


def _quantities(r: _Bits) -> tuple[float, float, float]:
    pres = r.read(3)
    if pres == 7:  # the common case: all three, read as one 21-bit field
        x = r.read(21)
        return float((x >> 14) - 156), ((x >> 7) & 0x7F) / 2.0 - 43.0, (x & 0x7F) / 2.0 - 23.0
    rsrp = units.index_to_rsrp(r.read(7)) if pres & 4 else NAN
    rsrq = units.index_to_rsrq(r.read(7)) if pres & 2 else NAN
    sinr = units.index_to_sinr(r.read(7)) if pres & 1 else NAN
    return rsrp, rsrq, sinr


def _meas_result_nr(r: _Bits) -> CellResult:
    head = r.read(2)                 # extension bit, physCellId present
    if head & 2:
        raise Unsupported("MeasResultNR extension")
    pci = -1
    if head:
        pci = r.read(10)
        if pci > 1007:
            raise Unsupported("PCI range")
    flags = r.read(3)                # rsIndexResults, resultsSSB-Cell, resultsCSI-RS-Cell present
    if flags & 4:
        raise Unsupported("rsIndexResults")
    q = _quantities(r) if flags & 2 else _NO_Q
    if flags & 1:
        _quantities(r)  # CSI-RS cell results: read past, Pallas uses SSB results
    return CellResult(pci, q[0], q[1], q[2])


class FastMeasReport(NamedTuple):
    """The walker's result; ``loc``/``vel`` are the raw LPP octets (or None)."""

    meas_id: int
    serving: tuple[ServingResult, ...]
    neighbours: tuple[CellResult, ...]
    loc: bytes | None
    vel: bytes | None


def _location_group(b: bytes) -> tuple[bytes | None, bytes | None]:
    r = _Bits(b)
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


def decode_meas_report(b: bytes) -> FastMeasReport:
    """UL-DCCH-Message bytes -> FastMeasReport, or Unsupported."""
    r = _Bits(b)
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
    """TS 37.355 LocationCoordinates UPER -> (lat, lon) for the ellipsoidPoint alternative."""
    r = _Bits(b)
    if r.read(4) != 0:
        raise Unsupported("LocationCoordinates alternative")
    x = r.read(48)                   # latitudeSign (1), degreesLatitude (23), degreesLongitude (24)
    if r.n - r.p >= 8:
        raise Unsupported("trailing octets")
    return (units.lpp_to_lat("south" if x >> 47 else "north", (x >> 24) & 0x7FFFFF),
            units.lpp_to_lon((x & 0xFFFFFF) - (1 << 23)))


def decode_horizontal_velocity(b: bytes) -> tuple[float, float]:
    """TS 37.355 Velocity UPER -> (speed m/s, bearing degrees) for horizontalVelocity."""
    r = _Bits(b)
    x = r.read(23)                   # extension bit, alternative (2), bearing (9), speed (11)
    if x >> 20:
        raise Unsupported("Velocity alternative")
    bearing, kmh = (x >> 11) & 0x1FF, x & 0x7FF
    if bearing > 359 or r.n - r.p >= 8:
        raise Unsupported("Velocity shape")
    return units.kmh_to_speed(kmh), float(bearing)


# ------------------------------------------------------------------------------------------------
# encoders for the same shapes (the converter writes tens of thousands of PDUs); the tests
# check them byte for byte against pycrate's encoders
# ------------------------------------------------------------------------------------------------

def _alen_bytes(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    if n < 0x4000:
        return bytes([0x80 | (n >> 8), n & 0xFF])
    raise Unsupported("fragmented length")


def encode_ric_indication_ies(ies: list[tuple[int, Any]]) -> bytes:
    """[(IE id, value)] in order -> E2AP-PDU octets of a RICindication (all IEs criticality
    reject, the message criticality ignore), values as :func:`decode_ric_indication_ies` gives."""
    body = bytearray(b"\x00" + len(ies).to_bytes(2, "big"))
    for ie, v in ies:
        if ie == 29:
            val = b"\x00" + v["ricRequestorID"].to_bytes(2, "big") + v["ricInstanceID"].to_bytes(2, "big")
        elif ie in (5, 27):
            val = int(v).to_bytes(2, "big")
        elif ie == 15:
            val = bytes([v])
        elif ie == 28:
            val = b"\x40" if v == "insert" else b"\x00"
        elif ie in (25, 26, 20):
            val = _alen_bytes(len(v)) + bytes(v)
        else:
            raise Unsupported(f"IE {ie}")
        body += ie.to_bytes(2, "big") + b"\x00" + _alen_bytes(len(val)) + val
    return b"\x00\x05\x40" + _alen_bytes(len(body)) + bytes(body)


def encode_rc_octs_params(params: list[tuple[int, bytes]]) -> bytes:
    """Inverse of :func:`decode_rc_octs_params`: [(RAN parameter ID, octets)] -> E2SM-RC
    IndicationMessage Format 1 of ELEMENT OCTET STRING parameters (aligned PER)."""
    if not 1 <= len(params) <= 65535:
        raise Unsupported("RAN parameter count")
    out = bytearray(b"\x00" + (len(params) - 1).to_bytes(2, "big"))
    for pid, val in params:
        if not 1 <= pid <= 4294967296:
            raise Unsupported("RAN parameter ID range")
        x = pid - 1
        k = max(1, (x.bit_length() + 7) // 8)
        out += bytes([(k - 1) << 4]) + x.to_bytes(k, "big") + b"\x04" + _alen_bytes(len(val)) + val
    return bytes(out)


class _BitWriter:
    __slots__ = ("v", "n")

    def __init__(self) -> None:
        self.v = 0
        self.n = 0

    def put(self, x: int, k: int) -> None:
        self.v = (self.v << k) | x
        self.n += k

    def length(self, n: int) -> None:
        if n < 0x80:
            self.put(n, 8)
        elif n < 0x4000:
            self.put(0x8000 | n, 16)
        else:
            raise Unsupported("fragmented length")

    def octets(self, b: bytes) -> None:
        self.put(int.from_bytes(b, "big"), 8 * len(b))

    def tobytes(self) -> bytes:
        pad = -self.n % 8
        n = self.n + pad
        return (self.v << pad).to_bytes(n // 8, "big") if n else b"\x00"


def _put_quantities(w: _BitWriter, q: tuple[int | None, int | None, int | None]) -> None:
    for x in q:
        w.put(x is not None, 1)
    for x in q:
        if x is not None:
            w.put(x, 7)


def _put_meas_result_nr(w: _BitWriter, pci: int, q: tuple[int | None, int | None, int | None]) -> None:
    w.put(0, 1)                      # MeasResultNR extension
    w.put(pci >= 0, 1)               # physCellId present
    if pci >= 0:
        w.put(pci, 10)
    w.put(0, 1)                      # rsIndexResults absent
    has = any(x is not None for x in q)
    w.put(has, 1)                    # resultsSSB-Cell
    w.put(0, 1)                      # resultsCSI-RS-Cell
    if has:
        _put_quantities(w, q)


def encode_meas_report(meas_id: int, serving: list[tuple[int, int, tuple]], neighbours: list[tuple[int, tuple]],
                       loc: bytes | None, vel: bytes | None) -> bytes:
    """UL-DCCH-Message MeasurementReport, UPER. ``serving``: [(servCellId, pci, (rsrp, rsrq,
    sinr) indices or None)]; ``neighbours``: [(pci, indices)]; ``loc``/``vel``: LPP octets."""
    if not 1 <= len(serving) <= 32 or len(neighbours) > 8 or not 1 <= meas_id <= 64:
        raise Unsupported("sizes")
    w = _BitWriter()
    w.put(0, 1 + 4 + 1 + 2)          # c1, measurementReport, criticalExtensions, no IEs extensions
    ext = loc is not None or vel is not None
    w.put(ext, 1)
    w.put(bool(neighbours), 1)
    w.put(meas_id - 1, 6)
    w.put(len(serving) - 1, 5)
    for idx, pci, q in serving:
        w.put(0, 2)                  # MeasResultServMO extension, no best neighbour
        w.put(idx, 5)
        _put_meas_result_nr(w, pci, q)
    if neighbours:
        w.put(0, 1)                  # measResultListNR
        w.put(len(neighbours) - 1, 3)
        for pci, q in neighbours:
            _put_meas_result_nr(w, pci, q)
    if ext:
        g = _BitWriter()
        g.put(0b01000, 5)            # group 3: only locationInfo-r16
        g.put(0, 1)                  # LocationInfo-r16 extension
        g.put(0b1000, 4)             # only commonLocationInfo-r16
        for b in (None, None, loc, None, None, vel):
            g.put(b is not None, 1)
        for b in (loc, vel):
            if b is not None:
                g.length(len(b))
                g.octets(b)
        # X.691 19.8: the bitmap covers every extension addition of MeasResults known to the
        # encoder: the 5 groups of TS 38.331 Rel-18 (pycrate's RRCNR), group 3 present
        w.put(0, 1)                  # normally small bitmap length
        w.put(5 - 1, 6)
        w.put(0b00100, 5)
        gb = g.tobytes()
        w.length(len(gb))
        w.octets(gb)
    return w.tobytes()


def encode_ellipsoid_point(sign: str, nlat: int, nlon: int) -> bytes:
    """TS 37.355 LocationCoordinates ellipsoidPoint, UPER."""
    w = _BitWriter()
    w.put(0, 4)
    w.put(sign == "south", 1)
    w.put(nlat, 23)
    w.put(nlon + (1 << 23), 24)
    return w.tobytes()


def encode_horizontal_velocity(bearing: int, kmh: int) -> bytes:
    """TS 37.355 Velocity horizontalVelocity, UPER."""
    w = _BitWriter()
    w.put(0, 3)
    w.put(bearing, 9)
    w.put(kmh, 11)
    return w.tobytes()
