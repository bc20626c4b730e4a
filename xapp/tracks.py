"""Per-UE measurement tracks: a bounded, time-ordered window of radio measurements.

A track is the contract between E2 ingestion (which appends decoded reports) and the handover
predictors (which read whole windows as numpy arrays). Memory per UE is fixed at construction:
``capacity`` reports of at most ``max_neighbours`` neighbour cells each.

Units: time in seconds (any monotone clock, usually Unix time); RSRP in dBm, RSRQ and SINR in dB
(TS 38.133 reporting ranges already converted); latitude and longitude in degrees (WGS 84);
speed in m/s; heading in degrees clockwise from north. A missing value is NaN; a missing
integer identity is -1.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple, Sequence

import numpy as np

NAN = float("nan")


@dataclass(frozen=True, slots=True)
class NeighbourMeas:
    """One neighbour cell's measurement in a report.

    ``pci`` is the NR physical cell id (0..1007) as carried in a MeasurementReport, -1 if the
    source gives none (the UCC drives' single neighbour value has no identity). ``cell_id`` is
    the global cell identity when the E2 node or a neighbour relation table resolves the PCI,
    else -1.
    """

    pci: int = -1
    cell_id: int = -1
    rsrp_dbm: float = NAN
    rsrq_db: float = NAN
    sinr_db: float = NAN


@dataclass(frozen=True, slots=True)
class MeasurementReport:
    """One UE measurement report as the xApp sees it (from E2SM-RC message copy or E2SM-KPM).

    ``serving_cell`` is the serving cell's global identity (NR cell identity, 36 bits, or the
    LTE ECI for drive data); ``e2_node`` is the E2 node that delivered it. ``connected`` is
    False for rows known to be in RRC idle (drive-test "State I").
    """

    time: float
    ue_id: str
    serving_cell: int
    rsrp_dbm: float = NAN
    rsrq_db: float = NAN
    sinr_db: float = NAN
    neighbours: tuple[NeighbourMeas, ...] = ()
    serving_pci: int = -1
    lat: float = NAN
    lon: float = NAN
    speed_mps: float = NAN
    heading_deg: float = NAN
    e2_node: str = ""
    connected: bool = True


class TrackView(NamedTuple):
    """A track's reports as arrays, oldest first. Shapes: (n,) or (n, max_neighbours)."""

    time: np.ndarray          # float64 (n,)
    serving_cell: np.ndarray  # int64 (n,)
    serving_pci: np.ndarray   # int32 (n,)
    rsrp_dbm: np.ndarray      # float32 (n,)
    rsrq_db: np.ndarray       # float32 (n,)
    sinr_db: np.ndarray       # float32 (n,)
    nb_pci: np.ndarray        # int32 (n, m), -1 where empty
    nb_cell: np.ndarray       # int64 (n, m), -1 where unknown or empty
    nb_rsrp_dbm: np.ndarray   # float32 (n, m), NaN where empty
    nb_rsrq_db: np.ndarray    # float32 (n, m)
    nb_sinr_db: np.ndarray    # float32 (n, m)
    lat: np.ndarray           # float64 (n,)
    lon: np.ndarray           # float64 (n,)
    speed_mps: np.ndarray     # float32 (n,)
    heading_deg: np.ndarray   # float32 (n,)
    connected: np.ndarray     # bool (n,)


class UETrack:
    """A ring buffer of one UE's most recent ``capacity`` reports, in time order.

    Reports must arrive in non-decreasing time; an older report than the newest held raises
    ``ValueError`` (the caller logs and drops it). Neighbours beyond ``max_neighbours`` are
    cut, strongest RSRP kept. Memory is about ``capacity * (61 + 25 * max_neighbours)`` bytes.
    """

    __slots__ = ("ue_id", "capacity", "max_neighbours", "_n", "_head", "_a", "last_report")

    _SCALAR = (
        ("time", np.float64, NAN), ("serving_cell", np.int64, -1), ("serving_pci", np.int32, -1),
        ("rsrp_dbm", np.float32, NAN), ("rsrq_db", np.float32, NAN), ("sinr_db", np.float32, NAN),
        ("lat", np.float64, NAN), ("lon", np.float64, NAN), ("speed_mps", np.float32, NAN),
        ("heading_deg", np.float32, NAN), ("connected", np.bool_, False),
    )
    _NEIGHBOUR = (
        ("nb_pci", np.int32, -1), ("nb_cell", np.int64, -1), ("nb_rsrp_dbm", np.float32, NAN),
        ("nb_rsrq_db", np.float32, NAN), ("nb_sinr_db", np.float32, NAN),
    )

    def __init__(self, ue_id: str, capacity: int = 256, max_neighbours: int = 8) -> None:
        if capacity < 2 or max_neighbours < 1:
            raise ValueError("capacity must be >= 2 and max_neighbours >= 1")
        self.ue_id = ue_id
        self.capacity = capacity
        self.max_neighbours = max_neighbours
        self._n = 0
        self._head = 0  # next slot to write
        self._a: dict[str, np.ndarray] = {}
        for name, dt, fill in self._SCALAR:
            self._a[name] = np.full(capacity, fill, dtype=dt)
        for name, dt, fill in self._NEIGHBOUR:
            self._a[name] = np.full((capacity, max_neighbours), fill, dtype=dt)
        self.last_report: MeasurementReport | None = None

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        """Bytes held by the track's arrays."""
        return sum(a.nbytes for a in self._a.values())

    def append(self, r: MeasurementReport) -> None:
        """Add a report. Raises ValueError if its time is not finite or it is older than the
        newest report held (the track is then unchanged)."""
        if not math.isfinite(r.time):
            raise ValueError(f"report for UE {self.ue_id} has a non-finite time {r.time!r}")
        if self.last_report is not None and r.time < self.last_report.time:
            raise ValueError(
                f"report for UE {self.ue_id} at t={r.time} is older than the newest "
                f"(t={self.last_report.time})")
        i = self._head
        a = self._a
        a["time"][i] = r.time
        a["serving_cell"][i] = r.serving_cell
        a["serving_pci"][i] = r.serving_pci
        a["rsrp_dbm"][i] = r.rsrp_dbm
        a["rsrq_db"][i] = r.rsrq_db
        a["sinr_db"][i] = r.sinr_db
        a["lat"][i] = r.lat
        a["lon"][i] = r.lon
        a["speed_mps"][i] = r.speed_mps
        a["heading_deg"][i] = r.heading_deg
        a["connected"][i] = r.connected
        nbs: Sequence[NeighbourMeas] = r.neighbours
        m = self.max_neighbours
        if len(nbs) > m:
            nbs = sorted(nbs, key=lambda n: -(n.rsrp_dbm if n.rsrp_dbm == n.rsrp_dbm else -1e9))[:m]
        for name, _, fill in self._NEIGHBOUR:
            a[name][i, :] = fill
        for j, nb in enumerate(nbs):
            a["nb_pci"][i, j] = nb.pci
            a["nb_cell"][i, j] = nb.cell_id
            a["nb_rsrp_dbm"][i, j] = nb.rsrp_dbm
            a["nb_rsrq_db"][i, j] = nb.rsrq_db
            a["nb_sinr_db"][i, j] = nb.sinr_db
        self._head = (i + 1) % self.capacity
        self._n = min(self._n + 1, self.capacity)
        self.last_report = r

    def _order(self) -> np.ndarray | slice:
        if self._n < self.capacity:
            return slice(0, self._n)
        return np.r_[self._head:self.capacity, 0:self._head]

    def view(self, last: int | None = None) -> TrackView:
        """The held reports (or the newest ``last`` of them) as a TrackView of copies."""
        idx = self._order()
        out = {k: v[idx] for k, v in self._a.items()}
        if last is not None and last < self._n:
            out = {k: v[self._n - last:] for k, v in out.items()}
        return TrackView(**out)


@dataclass
class TrackStore:
    """Tracks of every UE the xApp hears of, created on first report.

    ``max_ues`` bounds memory: when full, the UE heard from least recently is evicted (O(1):
    ``tracks`` is kept in order of each UE's latest report).
    """

    capacity: int = 256
    max_neighbours: int = 8
    max_ues: int = 100_000
    tracks: OrderedDict[str, UETrack] = field(default_factory=OrderedDict)

    def add(self, r: MeasurementReport) -> UETrack:
        """Append a report to its UE's track. Raises ValueError (and changes nothing) if the
        report's time is not finite or is older than that UE's newest report."""
        t = self.tracks.get(r.ue_id)
        if t is None:
            t = UETrack(r.ue_id, self.capacity, self.max_neighbours)
            t.append(r)                    # a rejected first report creates no track
            if len(self.tracks) >= self.max_ues:
                self.tracks.popitem(last=False)
            self.tracks[r.ue_id] = t
            return t
        t.append(r)
        self.tracks.move_to_end(r.ue_id)
        return t

    def __iter__(self) -> Iterator[UETrack]:
        return iter(self.tracks.values())

    def __len__(self) -> int:
        return len(self.tracks)

    def get(self, ue_id: str) -> UETrack | None:
        """The track of ``ue_id``, or None if no report of that UE was added."""
        return self.tracks.get(ue_id)
