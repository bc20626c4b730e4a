"""Reader of G-NetTrack Pro drive-test CSVs (the UCC 5G dataset layout) into measurement tracks.

Each CSV is one drive of one phone (one UE). Its header, as in every file of
``shared/data/ucc-5g/**``::

    Timestamp,Longitude,Latitude,Speed,Operatorname,CellID,NetworkMode,RSRP,RSRQ,SNR,CQI,RSSI,
    DL_bitrate,UL_bitrate,State,PINGAVG,PINGMIN,PINGMAX,PINGSTDEV,PINGLOSS,CELLHEX,NODEHEX,
    LACHEX,RAWCELLID,NRxRSRP,NRxRSRQ

What the reader makes of it (see ``docs/drive-data.md`` §2 for the data's quirks):

- **Time.** ``Timestamp`` (``YYYY.MM.DD_hh.mm.ss``, read as UTC) has 1 s resolution, ~10% of
  rows repeat the previous second and there is the odd backwards step. Row order is kept; time
  is made monotone by a running maximum, and a run of ``k`` rows sharing one second is spread
  evenly over that second (``t + j * min(1, gap) / k``), which stays inside the 1 s resolution
  and makes the times strictly increasing.
- **Serving cell** = ``RAWCELLID`` (the LTE ECI, NODEHEX*256+CELLHEX, or the UMTS cell id);
  ``e2_node`` = ``NODEHEX`` (the eNB id for LTE rows). The serving PCI is not logged (-1).
- **RSRP/RSRQ/SNR** of the serving cell; out of the TS 36.133/38.133 reporting ranges
  (RSRP -156..-31 dBm, RSRQ -43..20 dB, SINR -23..40 dB) or ``-`` becomes NaN.
- **Neighbour**: the single ``NRxRSRP``/``NRxRSRQ`` value has no cell identity, so it becomes
  one ``NeighbourMeas(pci=-1, cell_id=-1)``; rows without it have no neighbours.
- **Position**: ``Latitude``/``Longitude`` as logged (the app repeats the last fix; a new fix
  arrives about every 100 m, median 9 s). ``Speed`` km/h -> m/s. ``heading_deg`` is the
  bearing from the previous distinct fix to the current one (NaN until the second fix).
  ``fixes_only=True`` keeps position/speed/heading only on rows where a new fix appears
  (NaN elsewhere), which is how a causal consumer sees a GPS that reports per fix.
- **connected** = ``State != 'I'`` (State is D, I, V or VD).
- **Handovers**: every change of RAWCELLID between consecutive rows; ``idle`` is True when
  the last row on the source or the first row on the target is State I (mostly idle-mode
  reselections, not network-commanded handovers).

A malformed row (unparseable time or cell id) is logged and dropped; the rest of the file is
read. A file without the required columns raises ``ValueError``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import structlog

from xapp.tracks import MeasurementReport, NeighbourMeas

log = structlog.get_logger(__name__)

NAN = float("nan")
EARTH_RADIUS_M = 6_371_008.8
REQUIRED_COLUMNS = ("Timestamp", "Longitude", "Latitude", "Speed", "NetworkMode", "RSRP", "RSRQ",
                    "SNR", "State", "NODEHEX", "RAWCELLID", "NRxRSRP", "NRxRSRQ")
_RSRP_RANGE = (-156.0, -31.0)
_RSRQ_RANGE = (-43.0, 20.0)
_SINR_RANGE = (-23.0, 40.0)


@dataclass(frozen=True, slots=True)
class Handover:
    """One change of serving cell in a drive.

    ``time`` (s, same clock as the reports) is the time of the first row on the target;
    ``row`` its index in ``Drive.reports``. ``idle`` is True if the last source row or the
    first target row is State I. ``kind`` is one of ``lte-intra-enb`` (same NODEHEX),
    ``lte-inter-enb``, ``3g`` (both rows 3G), ``lte-3g`` (a change of radio technology).
    ``prev_time`` is the time of the last row on the source (the HO happened in between).
    """

    time: float
    source_cell: int
    target_cell: int
    idle: bool
    row: int
    prev_time: float
    kind: str


@dataclass
class Drive:
    """One drive of one UE: its reports in time order and its handovers.

    ``network_mode`` holds the per-row ``NetworkMode`` (LTE, 5G, UMTS, HSPA+, ...), aligned
    with ``reports``. ``fix_rows`` are the indices of rows where a new GPS fix appears.
    """

    ue_id: str
    path: Path | None
    reports: list[MeasurementReport]
    handovers: list[Handover]
    network_mode: list[str] = field(default_factory=list)
    fix_rows: list[int] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        """Time from the first to the last report (s); 0 for fewer than two reports."""
        if len(self.reports) < 2:
            return 0.0
        return self.reports[-1].time - self.reports[0].time

    @property
    def connected_handovers(self) -> list[Handover]:
        """Handovers where neither adjacent row is idle (scored as connected-mode HOs)."""
        return [h for h in self.handovers if not h.idle]


def _num(s: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """Parse a CSV number; '-', '' or out-of-range values give NaN."""
    s = s.strip()
    if not s or s == "-":
        return NAN
    try:
        v = float(s)
    except ValueError:
        return NAN
    if not (lo <= v <= hi):
        return NAN
    return v


def bearing_deg(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Initial great-circle bearing from point 1 to point 2, degrees clockwise from north [0, 360)."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dl = math.radians(lon2 - lon1)
    y = math.sin(dl) * math.cos(p2)
    x = math.cos(p1) * math.sin(p2) - math.sin(p1) * math.cos(p2) * math.cos(dl)
    return math.degrees(math.atan2(y, x)) % 360.0


def monotone_times(raw: Sequence[float]) -> np.ndarray:
    """Make 1 s-resolution log times strictly increasing, keeping row order.

    Running maximum first (a backwards step is clamped), then each run of ``k`` equal values
    ``t`` is spread as ``t + j * min(1, t_next - t) / k`` for j = 0..k-1. Shape (n,) seconds.
    """
    t = np.maximum.accumulate(np.asarray(raw, dtype=np.float64))
    n = len(t)
    out = t.copy()
    i = 0
    while i < n:
        j = i
        while j + 1 < n and t[j + 1] == t[i]:
            j += 1
        k = j - i + 1
        if k > 1:
            span = min(1.0, t[j + 1] - t[i]) if j + 1 < n else 1.0
            out[i:j + 1] = t[i] + np.arange(k) * (span / k)
        i = j + 1
    return out


def _parse_time(s: str, cache: dict[str, float]) -> float:
    v = cache.get(s)
    if v is None:
        v = datetime.strptime(s.strip(), "%Y.%m.%d_%H.%M.%S").replace(tzinfo=timezone.utc).timestamp()
        cache[s] = v
    return v


def _kind(mode_a: str, mode_b: str, node_a: str, node_b: str) -> str:
    lte = {"LTE", "5G"}
    a_lte, b_lte = mode_a in lte, mode_b in lte
    if a_lte and b_lte:
        return "lte-intra-enb" if node_a == node_b else "lte-inter-enb"
    if not a_lte and not b_lte:
        return "3g"
    return "lte-3g"


def find_handovers(reports: Sequence[MeasurementReport], modes: Sequence[str] | None = None,
                   nodes: Sequence[str] | None = None) -> list[Handover]:
    """Every change of ``serving_cell`` between consecutive reports, as Handover records.

    ``modes``/``nodes`` (per-row NetworkMode and NODEHEX) only set ``Handover.kind``; without
    them the kind is ``unknown``.
    """
    out: list[Handover] = []
    for i in range(1, len(reports)):
        a, b = reports[i - 1], reports[i]
        if a.serving_cell != b.serving_cell:
            kind = "unknown"
            if modes is not None and nodes is not None:
                kind = _kind(modes[i - 1], modes[i], nodes[i - 1], nodes[i])
            out.append(Handover(time=b.time, source_cell=a.serving_cell, target_cell=b.serving_cell,
                                idle=not (a.connected and b.connected), row=i, prev_time=a.time,
                                kind=kind))
    return out


def read_drive(path: str | Path, ue_id: str | None = None, fixes_only: bool = False) -> Drive:
    """Read one G-NetTrack Pro CSV into a Drive.

    ``ue_id`` defaults to the file name without extension (e.g. ``B_2020.02.14_09.38.22``).
    Raises ``ValueError`` if required columns are missing, ``OSError`` if unreadable.
    Malformed rows are logged (structlog, ``drivetest.bad_row``) and dropped.
    """
    path = Path(path)
    ue = ue_id if ue_id is not None else path.stem
    with path.open(newline="", encoding="utf-8", errors="replace") as fh:
        rd = csv.DictReader(fh)
        missing = [c for c in REQUIRED_COLUMNS if c not in (rd.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: not a G-NetTrack drive CSV, missing columns {missing}")
        rows = []
        cache: dict[str, float] = {}
        for lineno, row in enumerate(rd, start=2):
            try:
                t = _parse_time(row["Timestamp"], cache)
                cell = int(float(row["RAWCELLID"]))
            except (ValueError, TypeError, AttributeError) as e:
                log.warning("drivetest.bad_row", file=str(path), line=lineno, error=str(e))
                continue
            rows.append((t, cell, row))
    return _build(ue, path, rows, fixes_only)


def _build(ue: str, path: Path | None, rows: list, fixes_only: bool) -> Drive:
    times = monotone_times([r[0] for r in rows]) if rows else np.zeros(0)
    reports: list[MeasurementReport] = []
    modes: list[str] = []
    nodes: list[str] = []
    fix_rows: list[int] = []
    prev_fix: tuple[float, float] | None = None
    heading = NAN
    for i, (_, cell, row) in enumerate(rows):
        lat = _num(row["Latitude"], -90.0, 90.0)
        lon = _num(row["Longitude"], -180.0, 180.0)
        spd_kmh = _num(row["Speed"], 0.0, 400.0)
        new_fix = False
        if lat == lat and lon == lon:
            if prev_fix is None or (lat, lon) != prev_fix:
                new_fix = True
                if prev_fix is not None:
                    heading = bearing_deg(prev_fix[0], prev_fix[1], lat, lon)
                prev_fix = (lat, lon)
                fix_rows.append(i)
        nrsrp = _num(row["NRxRSRP"], *_RSRP_RANGE)
        nbs: tuple[NeighbourMeas, ...] = ()
        if nrsrp == nrsrp:
            nbs = (NeighbourMeas(pci=-1, cell_id=-1, rsrp_dbm=nrsrp,
                                 rsrq_db=_num(row["NRxRSRQ"], *_RSRQ_RANGE)),)
        keep_pos = new_fix or not fixes_only
        state = row["State"].strip()
        node = row["NODEHEX"].strip()
        reports.append(MeasurementReport(
            time=float(times[i]), ue_id=ue, serving_cell=cell,
            rsrp_dbm=_num(row["RSRP"], *_RSRP_RANGE), rsrq_db=_num(row["RSRQ"], *_RSRQ_RANGE),
            sinr_db=_num(row["SNR"], *_SINR_RANGE), neighbours=nbs,
            lat=lat if keep_pos else NAN, lon=lon if keep_pos else NAN,
            speed_mps=(spd_kmh / 3.6) if keep_pos else NAN,
            heading_deg=heading if keep_pos else NAN,
            e2_node=node, connected=state != "I"))
        modes.append(row["NetworkMode"].strip())
        nodes.append(node)
    return Drive(ue_id=ue, path=path, reports=reports, handovers=find_handovers(reports, modes, nodes),
                 network_mode=modes, fix_rows=fix_rows)


def drive_files(folder: str | Path) -> list[Path]:
    """All ``*.csv`` files under ``folder`` (recursive), sorted by name. A file path is returned as is."""
    p = Path(folder)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FileNotFoundError(f"no such folder: {p}")
    return sorted(p.rglob("*.csv"), key=lambda q: (q.name, str(q)))


def read_drives(folders: str | Path | Iterable[str | Path], fixes_only: bool = False) -> list[Drive]:
    """Read every drive CSV under one or more folders (recursive), sorted by file name.

    A file that is not a drive CSV is logged (``drivetest.skip_file``) and skipped.
    """
    if isinstance(folders, (str, Path)):
        folders = [folders]
    out: list[Drive] = []
    for folder in folders:
        for f in drive_files(folder):
            try:
                out.append(read_drive(f, fixes_only=fixes_only))
            except (ValueError, OSError) as e:
                log.warning("drivetest.skip_file", file=str(f), error=str(e))
    return out


def local_xy_m(lat: np.ndarray, lon: np.ndarray, lat0: float, lon0: float) -> tuple[np.ndarray, np.ndarray]:
    """Equirectangular projection to metres east (x) and north (y) of (lat0, lon0).

    Good to well under 1% over the tens of km of a drive. Shapes as the inputs.
    """
    k = math.pi / 180.0 * EARTH_RADIUS_M
    x = (np.asarray(lon, dtype=np.float64) - lon0) * k * math.cos(math.radians(lat0))
    y = (np.asarray(lat, dtype=np.float64) - lat0) * k
    return x, y
