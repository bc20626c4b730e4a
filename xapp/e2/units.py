"""Unit conversions between reported indices and physical values.

- TS 38.133 clause 10.1: the L3 reporting ranges of an NR MeasurementReport (TS 38.331
  RSRP-Range, RSRQ-Range, SINR-Range, all INTEGER (0..127)):
  - SS-RSRP, Table 10.1.6.1-1: -156 dBm to -31 dBm, 1 dB steps; index n covers
    [n-157, n-156) dBm and is read as its upper edge, ``n - 156`` dBm.
  - SS-RSRQ, Table 10.1.11.1-1: -43 dB to 20 dB, 0.5 dB steps; index n is read as ``n/2 - 43`` dB.
  - SS-SINR, Table 10.1.16.1-1: -23 dB to 40 dB, 0.5 dB steps; index n is read as ``n/2 - 23`` dB.
  Encoding rounds to the nearest step and clamps to 0..127, so a value on the grid (whole dBm
  for RSRP, half dB for RSRQ/SINR) inside the range round-trips exactly; values outside the
  range come back as the range's edge.
- TS 23.032 clause 6.1 / TS 37.355 Ellipsoid-Point: latitude N = floor(2^23 * |lat| / 90) with a
  sign, longitude N = floor(2^24 * lon / 360); decoded to the centre of the coded interval
  (error at most 0.54e-5 deg latitude, 1.07e-5 deg longitude, about 1 m).
- TS 23.032 clause 8 / TS 37.355 HorizontalVelocity: bearing in whole degrees clockwise from
  north (0..359), horizontal speed in whole km/h (0..2047), rounded down.
"""

from __future__ import annotations

import math

NAN = float("nan")


def _clamp(n: int, lo: int = 0, hi: int = 127) -> int:
    return lo if n < lo else hi if n > hi else n


def rsrp_to_index(dbm: float) -> int:
    """SS-RSRP in dBm -> RSRP-Range index 0..127 (TS 38.133 Table 10.1.6.1-1)."""
    return _clamp(int(math.floor(dbm + 0.5)) + 156)


def index_to_rsrp(n: int) -> float:
    """RSRP-Range index -> dBm (upper edge of the reported interval)."""
    return float(n - 156)


def rsrq_to_index(db: float) -> int:
    """SS-RSRQ in dB -> RSRQ-Range index 0..127 (TS 38.133 Table 10.1.11.1-1)."""
    return _clamp(int(math.floor(2.0 * (db + 43.0) + 0.5)))


def index_to_rsrq(n: int) -> float:
    """RSRQ-Range index -> dB."""
    return n / 2.0 - 43.0


def sinr_to_index(db: float) -> int:
    """SS-SINR in dB -> SINR-Range index 0..127 (TS 38.133 Table 10.1.16.1-1)."""
    return _clamp(int(math.floor(2.0 * (db + 23.0) + 0.5)))


def index_to_sinr(n: int) -> float:
    """SINR-Range index -> dB."""
    return n / 2.0 - 23.0


def quantise_rsrp(dbm: float) -> float:
    """The value an RSRP survives an encode/decode as (NaN stays NaN)."""
    return dbm if dbm != dbm else index_to_rsrp(rsrp_to_index(dbm))


def quantise_rsrq(db: float) -> float:
    """The value an RSRQ survives an encode/decode as (NaN stays NaN)."""
    return db if db != db else index_to_rsrq(rsrq_to_index(db))


def quantise_sinr(db: float) -> float:
    """The value an SINR survives an encode/decode as (NaN stays NaN)."""
    return db if db != db else index_to_sinr(sinr_to_index(db))


_LAT_SCALE = (1 << 23) / 90.0
_LON_SCALE = (1 << 24) / 360.0


def lat_to_lpp(lat: float) -> tuple[str, int]:
    """Latitude in degrees -> (latitudeSign 'north'|'south', degreesLatitude 0..2^23-1)."""
    if not -90.0 <= lat <= 90.0:
        raise ValueError(f"latitude {lat} out of range")
    n = min(int(math.floor(abs(lat) * _LAT_SCALE)), (1 << 23) - 1)
    return ("south" if lat < 0 else "north"), n


def lpp_to_lat(sign: str, n: int) -> float:
    """(latitudeSign, degreesLatitude) -> degrees, centre of the coded interval."""
    v = (n + 0.5) / _LAT_SCALE
    return -v if sign == "south" else v


def lon_to_lpp(lon: float) -> int:
    """Longitude in degrees -> degreesLongitude -2^23..2^23-1."""
    if not -180.0 <= lon <= 180.0:
        raise ValueError(f"longitude {lon} out of range")
    return max(-(1 << 23), min(int(math.floor(lon * _LON_SCALE)), (1 << 23) - 1))


def lpp_to_lon(n: int) -> float:
    """degreesLongitude -> degrees, centre of the coded interval."""
    return (n + 0.5) / _LON_SCALE


def speed_to_kmh(mps: float) -> int:
    """Speed in m/s -> horizontalSpeed in whole km/h (0..2047), rounded down."""
    return max(0, min(int(math.floor(mps * 3.6 + 1e-6)), 2047))


def kmh_to_speed(kmh: int) -> float:
    """horizontalSpeed km/h -> m/s."""
    return kmh / 3.6


def heading_to_bearing(deg: float) -> int:
    """Heading in degrees clockwise from north -> bearing 0..359 (whole degrees, rounded)."""
    return int(math.floor(deg % 360.0 + 0.5)) % 360
