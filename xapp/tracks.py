"""Per-UE measurement tracks: a bounded, time-ordered window of radio measurements.

A track is the contract between E2 ingestion (which appends decoded reports) and the handover
predictors (which read windows as numpy arrays, one UE or many at once). All tracks live in one
columnar ``TrackStore`` of preallocated arrays: memory per UE is fixed (``capacity`` reports of
at most ``max_neighbours`` neighbour cells each) and a UE's slot is freed and reused when it
leaves or goes silent (issues 14 and 15).

Units: time in seconds (any monotone clock, usually Unix time); RSRP in dBm, RSRQ and SINR in dB
(TS 38.133 reporting ranges already converted); latitude and longitude in degrees (WGS 84);
speed in m/s; heading in degrees clockwise from north. A missing value is NaN; a missing
integer identity is -1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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
    """Reports as arrays, oldest first. One UE: shapes (n,) and (n, m); a batch of U UEs
    (``TrackStore.window``): (U, w) and (U, w, m), each UE's rows right-aligned (padding rows
    first: time NaN, serving cell -1). ``m`` = max_neighbours; neighbour column j holds the same
    neighbour from row to row (``TrackStore`` aligns them by identity).

    Resolution: RSRP is reported in 1 dB steps and RSRQ/SINR in 0.5 dB (TS 38.133 §10.1), so
    float32 (24-bit mantissa) holds them exactly; time and position stay float64.
    """

    time: np.ndarray          # float64, s
    serving_cell: np.ndarray  # int64, -1 unknown
    serving_pci: np.ndarray   # int16, -1 unknown
    rsrp_dbm: np.ndarray      # float32
    rsrq_db: np.ndarray       # float32
    sinr_db: np.ndarray       # float32
    nb_pci: np.ndarray        # int16 (..., m), -1 where empty or anonymous
    nb_cell: np.ndarray       # int64 (..., m), -1 where unknown or empty
    nb_rsrp_dbm: np.ndarray   # float32 (..., m), NaN where empty
    nb_rsrq_db: np.ndarray    # float32 (..., m)
    nb_sinr_db: np.ndarray    # float32 (..., m)
    lat: np.ndarray           # float64, degrees
    lon: np.ndarray           # float64
    speed_mps: np.ndarray     # float32
    heading_deg: np.ndarray   # float32
    connected: np.ndarray     # bool


# per-report columns: (name, dtype, fill); the neighbour columns have a trailing axis of m
_SCALAR = (
    ("time", np.float64, NAN), ("serving_cell", np.int64, -1), ("serving_pci", np.int16, -1),
    ("rsrp_dbm", np.float32, NAN), ("rsrq_db", np.float32, NAN), ("sinr_db", np.float32, NAN),
    ("nb_pci", np.int16, -1), ("nb_cell", np.int64, -1), ("nb_rsrp_dbm", np.float32, NAN),
    ("nb_rsrq_db", np.float32, NAN), ("nb_sinr_db", np.float32, NAN),
    ("lat", np.float64, NAN), ("lon", np.float64, NAN), ("speed_mps", np.float32, NAN),
    ("heading_deg", np.float32, NAN), ("connected", np.bool_, False),
)
_NEIGHBOUR = frozenset(("nb_pci", "nb_cell", "nb_rsrp_dbm", "nb_rsrq_db", "nb_sinr_db"))
_EMPTY_KEY = -(1 << 62)           # a neighbour column that holds no neighbour yet
_CELL_KEY = 1 << 40               # neighbour identity: PCI, else CELL_KEY + cell id, else -10 - position


def _nb_key(nb: NeighbourMeas, pos: int) -> int:
    if nb.pci >= 0:
        return nb.pci
    if nb.cell_id >= 0:
        return _CELL_KEY + nb.cell_id
    return -10 - pos


def _stronger(nb: NeighbourMeas) -> float:
    return -(nb.rsrp_dbm if nb.rsrp_dbm == nb.rsrp_dbm else -1e9)


class TrackStore:
    """The tracks of every UE the xApp hears of, in one columnar store of preallocated arrays.

    Each UE holds a *slot*: a ring of its newest ``capacity`` reports in arrays of shape
    (slots, capacity) and (slots, capacity, max_neighbours); no per-report Python object is
    kept. Neighbour column j of a slot holds one neighbour (identified by PCI, else cell id,
    else its position in an anonymous report) from report to report, so that a trend is read
    down a column; a neighbour not seen before takes a free column or the one whose neighbour
    was heard least recently. Beyond ``max_neighbours`` in one report the strongest are kept.

    Slots are freed and reused: ``release(ue)`` (a release or handover-out notice), and
    ``expire(now)`` for UEs silent more than ``silence_s`` (trace clock). When ``max_ues`` UEs
    are held, a new UE evicts the one heard from least recently. The arrays grow by a quarter (at
    least 256 slots) up to ``max_ues`` slots and never shrink: after churn the store reuses its slots, so memory
    is flat. Memory: ``bytes_per_ue`` = capacity x (55 + 22 max_neighbours) + 33 + 16
    max_neighbours bytes (capacity 32, 8 neighbours: 7.4 KiB).

    Reports of a UE must arrive in non-decreasing time (else ``ValueError``, nothing changed).
    ``take_changed()`` gives the slots that got reports since its last call (the predictor's
    "inputs changed" set). A report's values are staged by ``add`` and written to the arrays
    in one vectorised pass by the next reader (``window``, a track's view). Not thread-safe:
    the writer and the readers (which write the staged reports) under one lock of the caller.
    """

    def __init__(self, capacity: int = 32, max_neighbours: int = 8, max_ues: int = 100_000,
                 silence_s: float = math.inf, initial_slots: int = 256) -> None:
        if capacity < 2 or max_neighbours < 1 or max_ues < 1:
            raise ValueError("capacity must be >= 2, max_neighbours >= 1, max_ues >= 1")
        if not silence_s > 0:
            raise ValueError("silence_s must be > 0")
        self.capacity = capacity
        self.max_neighbours = max_neighbours
        self.max_ues = max_ues
        self.silence_s = silence_s
        self.index: dict[str, int] = {}           # UE id -> slot
        self._ids: list[str | None] = []          # slot -> UE id (None: free)
        self._free: list[int] = []
        self._seq = 0                             # reports added, all UEs (LRU order)
        self._serial = 0                          # slot occupations so far
        self._a: dict[str, np.ndarray] = {}
        self._pend_i: list[int] = []              # staged reports, flat (see _append/_flush)
        self._pend_f: list[float] = []
        self._pend_n: dict[int, int] = {}        # slot -> staged reports
        m = max_neighbours
        self._pad_i = [(-1,) * (2 * (m - k)) for k in range(m + 1)]     # padding of k neighbours
        self._pad_f = [(NAN,) * (3 * (m - k)) for k in range(m + 1)]
        self._grow(max(1, min(initial_slots, max_ues)))

    # ------------------------------------------------------------------ storage
    def _grow(self, slots: int) -> None:
        if self._pend_i:
            self._flush()
        old = len(self._ids)
        c, m = self.capacity, self.max_neighbours
        per = {"head": (np.int32, 0), "n": (np.int32, 0), "last_t": (np.float64, -math.inf),
               "last_seq": (np.int64, -1), "serial": (np.int64, -1), "changed": (np.bool_, False)}
        a = self._a
        for name, dt, fill in _SCALAR:
            shape = (slots, c, m) if name in _NEIGHBOUR else (slots, c)
            new = np.full(shape, fill, dtype=dt)
            if old:
                new[:old] = a[name]
            a[name] = new
        for name, (dt, fill) in per.items():
            new = np.full(slots, fill, dtype=dt)
            if old:
                new[:old] = a[name]
            a[name] = new
        for name, dt, fill in (("colkey", np.int64, _EMPTY_KEY), ("colseen", np.int64, -1)):
            new = np.full((slots, m), fill, dtype=dt)
            if old:
                new[:old] = a[name]
            a[name] = new
        self._ids.extend([None] * (slots - old))
        self._free.extend(range(slots - 1, old - 1, -1))   # pop() gives the lowest first

    @property
    def slots(self) -> int:
        """Slots allocated (held + free)."""
        return len(self._ids)

    @property
    def nbytes(self) -> int:
        """Bytes held by the store's arrays (all slots)."""
        return sum(v.nbytes for v in self._a.values())

    @property
    def bytes_per_ue(self) -> int:
        """Array bytes per slot."""
        return self.nbytes // max(1, self.slots)

    def _clear(self, s: int) -> None:
        a = self._a
        for name, _, fill in _SCALAR:
            a[name][s] = fill
        a["head"][s] = 0
        a["n"][s] = 0
        a["last_t"][s] = -math.inf
        a["last_seq"][s] = -1
        a["changed"][s] = False
        a["colkey"][s] = _EMPTY_KEY
        a["colseen"][s] = -1

    def _alloc(self, ue: str) -> int:
        if len(self.index) >= self.max_ues:
            held = np.flatnonzero(self._a["last_seq"][: self.slots] >= 0)
            lru = int(held[np.argmin(self._a["last_seq"][held])])
            self._free_slot(lru)
        if not self._free:
            # by a quarter, not double: a store grown to just past a power of two would hold
            # nearly twice the slots it needs (16,384 for 10,000 UEs: 12 KiB per UE, not 7.4)
            self._grow(min(self.max_ues, self.slots + max(256, self.slots // 4)))
        s = self._free.pop()
        self._ids[s] = ue
        self.index[ue] = s
        self._serial += 1
        self._a["serial"][s] = self._serial
        return s

    def _free_slot(self, s: int) -> None:
        self._flush()                             # no staged report may land in a reused slot
        ue = self._ids[s]
        if ue is not None:
            del self.index[ue]
        self._ids[s] = None
        self._clear(s)
        self._a["serial"][s] = -1
        self._free.append(s)

    def _append(self, s: int, r: MeasurementReport) -> None:
        """Check the report and stage it; the ring position, count, times and change mark are
        written at once (the next report of the UE and ``take_changed`` read them), the
        report's values and its neighbours' columns by the next :meth:`_flush`."""
        a = self._a
        t = r.time
        if not math.isfinite(t):
            raise ValueError(f"report for UE {self._ids[s]} has a non-finite time {t!r}")
        last = float(a["last_t"][s])
        if t < last:
            raise ValueError(f"report for UE {self._ids[s]} at t={t} is older than the newest (t={last})")
        i = int(a["head"][s])
        nbs: Sequence[NeighbourMeas] = r.neighbours
        m = self.max_neighbours
        if len(nbs) > m:
            nbs = sorted(nbs, key=_stronger)[:m]
        k = self._pend_n.get(s, 0) + 1              # staged reports of this slot since the flush
        self._pend_n[s] = k
        pi, pf = self._pend_i, self._pend_f        # flat: numpy converts a flat list of numbers fast
        pi += (s, i, r.serving_cell, r.serving_pci, 1 if r.connected else 0, self._seq, k - 1, len(nbs))
        pf += (t, r.rsrp_dbm, r.rsrq_db, r.sinr_db, r.lat, r.lon, r.speed_mps, r.heading_deg)
        for nb in nbs:
            pi += (nb.pci, nb.cell_id)
            pf += (nb.rsrp_dbm, nb.rsrq_db, nb.sinr_db)
        if len(nbs) < m:
            pi += self._pad_i[len(nbs)]
            pf += self._pad_f[len(nbs)]
        a["head"][s] = (i + 1) % self.capacity
        if a["n"][s] < self.capacity:
            a["n"][s] += 1
        a["last_t"][s] = t
        a["last_seq"][s] = self._seq
        a["changed"][s] = True
        self._seq += 1
        if len(self._pend_n) >= self.FLUSH_SLOTS or k >= self.capacity:
            self._flush()                         # staging stays small without a reader

    #: staged reports are written once this many slots hold some (or one slot a ring's worth)
    FLUSH_SLOTS = 4096

    def _flush(self) -> None:
        """Write the staged reports into the arrays: one vectorised assignment per column for
        all of them, and the neighbours' columns chosen for all of them at once (about 1 us per
        report instead of Python per neighbour). Every reader of report values calls it first;
        ``_append`` calls it when a slot has staged a ring's worth (so no ring position is
        staged twice) or ``FLUSH_SLOTS`` slots have staged some.

        The columns follow the rule of the class docstring, report by report in the order
        they were added (:meth:`_columns`)."""
        if not self._pend_i:
            return
        m = self.max_neighbours
        pi, pf = self._pend_i, self._pend_f       # fromiter: a third faster than np.array on a flat list
        ints = np.fromiter(pi, dtype=np.int64, count=len(pi)).reshape(-1, 8 + 2 * m)
        flo = np.fromiter(pf, dtype=np.float64, count=len(pf)).reshape(-1, 8 + 3 * m)
        self._pend_i, self._pend_f, self._pend_n = [], [], {}
        S, R = ints[:, 0], ints[:, 1]             # distinct: a slot stages at most a ring's worth
        a = self._a
        a["serving_cell"][S, R] = ints[:, 2]
        a["serving_pci"][S, R] = ints[:, 3]
        a["connected"][S, R] = ints[:, 4] != 0
        for k, name in enumerate(("time", "rsrp_dbm", "rsrq_db", "sinr_db", "lat", "lon", "speed_mps",
                                  "heading_deg")):
            a[name][S, R] = flo[:, k]
        nb_i = ints[:, 8:].reshape(-1, m, 2)      # report order: (pci, cell id) per neighbour
        nb_f = flo[:, 8:].reshape(-1, m, 3)       # (RSRP, RSRQ, SINR)
        cols = self._columns(S, ints[:, 5], ints[:, 6], ints[:, 7], nb_i[:, :, 0], nb_i[:, :, 1])
        rows, pos = np.nonzero(cols >= 0)
        j = cols[rows, pos]
        for name, src in (("nb_pci", nb_i[:, :, 0]), ("nb_cell", nb_i[:, :, 1]), ("nb_rsrp_dbm", nb_f[:, :, 0]),
                          ("nb_rsrq_db", nb_f[:, :, 1]), ("nb_sinr_db", nb_f[:, :, 2])):
            fill = -1 if name in ("nb_pci", "nb_cell") else NAN
            out = np.full((len(S), m), fill, dtype=a[name].dtype)
            out[rows, j] = src[rows, pos]
            a[name][S, R] = out

    def _columns(self, S: np.ndarray, seq: np.ndarray, rank: np.ndarray, count: np.ndarray, pci: np.ndarray,
                 cell: np.ndarray) -> np.ndarray:
        """The column of each staged neighbour, (reports, m) with -1 where none (padding, or the
        same neighbour twice in one report), updating each slot's column keys and last-heard
        sequence numbers. Report by report (a slot's ``rank``-th staged report after its
        earlier ones), neighbour by neighbour in report order, as one array step over the
        reports of a rank: a known neighbour keeps its column; a new one takes the column heard
        least recently (a free column first: never heard) among those not yet taken by this
        report, lowest index on a tie."""
        m = self.max_neighbours
        n_rep = len(S)
        posn = np.arange(m)
        keys = np.where(pci >= 0, pci, np.where(cell >= 0, _CELL_KEY + cell, -10 - posn[None, :]))
        out = np.full((n_rep, m), -1, dtype=np.int64)
        ck_all, cs_all = self._a["colkey"], self._a["colseen"]
        if np.count_nonzero(rank == 0) < self.COLUMNS_BATCH:     # few slots: in staged order
            self._columns_listed(S.tolist(), seq.tolist(), keys, count.tolist(), out)
            return out
        for r in range(int(rank.max()) + 1):
            rows = np.flatnonzero(rank == r)
            slots = S[rows]
            if len(rows) < self.COLUMNS_BATCH:        # few reports: Python beats the array steps
                self._columns_listed(slots.tolist(), seq[rows].tolist(), keys[rows], count[rows].tolist(), out,
                                     rows.tolist())
                continue
            ck, cs = ck_all[slots], cs_all[slots]           # (U, m) copies, written back below
            sq = seq[rows]
            cnt = count[rows]
            kk = keys[rows]
            live = posn[None, :] < cnt[:, None]
            # the common report: every neighbour known, none twice -> each keeps its column
            hit = ck[:, None, :] == kk[:, :, None]         # (U, position, column)
            jj = hit.argmax(axis=2)
            twice = ((kk[:, :, None] == kk[:, None, :]) & live[:, :, None] & live[:, None, :]).sum(axis=(1, 2)) > cnt
            known = (hit.any(axis=2) | ~live).all(axis=1) & ~twice
            ui, pi = np.nonzero(live & known[:, None])
            cs[ui, jj[ui, pi]] = sq[ui]
            out[rows[ui], pi] = jj[ui, pi]
            rest = np.flatnonzero(~known)                 # the others neighbour by neighbour
            if len(rest) < self.COLUMNS_BATCH:            # in Python when few
                cs_all[slots[known]] = cs[known]
                self._columns_listed(slots[rest].tolist(), sq[rest].tolist(), kk[rest], cnt[rest].tolist(), out,
                                     rows[rest].tolist())
                continue
            ck_r, cs_r = ck[rest], cs[rest]
            cols = self._columns_new(ck_r, cs_r, kk[rest], cnt[rest], sq[rest])
            out[rows[rest]] = cols
            ck[rest], cs[rest] = ck_r, cs_r
            ck_all[slots], cs_all[slots] = ck, cs
        return out

    #: a rank of staged reports at least this large has its columns chosen by array steps
    COLUMNS_BATCH = 64

    @staticmethod
    def _columns_new(ck: np.ndarray, cs: np.ndarray, keys: np.ndarray, count: np.ndarray,
                     seq: np.ndarray) -> np.ndarray:
        """:meth:`_columns` for R reports of distinct slots, some of whose neighbours are new:
        ``ck``, ``cs`` (R, m) their slots' column keys and last-heard numbers (updated in
        place), ``keys`` (R, m) the neighbours' keys in report order, ``count`` (R,) how many
        are live, ``seq`` (R,) the reports' numbers. Returns (R, m) the column of each
        position (-1: padding or a repeat).

        The rule, position by position, needs only a few array steps per position because of
        what it implies: a key is held by at most one column; a repeat of a key earlier in the
        report is skipped (its column is taken); a key found at the start of the report keeps
        its column unless a new key earlier in the report took that column (then it is new
        itself); a new key takes, among the columns not yet taken by the report, the one heard
        least recently at the start of the report (lowest index on a tie), since a column's
        last-heard number changes only when the report takes it."""
        R, m = keys.shape
        out = np.full((R, m), -1, dtype=np.int64)
        P = int(count.max()) if R else 0
        if P == 0:
            return out
        kp = keys[:, :P]
        live = np.arange(P)[None, :] < count[:, None]
        hit = ck[:, None, :] == kp[:, :, None]                      # (R, position, column)
        found = hit.any(axis=2)
        held = hit.argmax(axis=2)
        earlier = np.tri(P, P, -1, dtype=bool)                      # [q, p]: p < q
        repeat = ((kp[:, :, None] == kp[:, None, :]) & earlier[None]).any(axis=2)
        take = live & ~repeat
        free = cs.copy()                                            # last heard; taken: +inf
        big = np.iinfo(np.int64).max
        taken = np.zeros((R, m), dtype=bool)
        U = np.arange(R)
        new = np.zeros((R, P), dtype=bool)
        for p in range(P):
            jp = held[:, p]
            keep = found[:, p] & ~taken[U, jp]
            j = np.where(keep, jp, free.argmin(axis=1))
            t = take[:, p]
            u, jt = U[t], j[t]
            taken[u, jt] = True
            free[u, jt] = big
            out[u, p] = jt
            new[:, p] = t & ~keep
        ri, pi = np.nonzero(out[:, :P] >= 0)
        cs[ri, out[ri, pi]] = seq[ri]
        ni, npi = np.nonzero(new)
        ck[ni, out[ni, npi]] = kp[ni, npi]
        return out

    def _columns_listed(self, slots: list[int], seqs: list[int], keys: np.ndarray, counts: list[int],
                        out: np.ndarray, out_rows: list[int] | None = None) -> None:
        """:meth:`_columns` report by report in Python: report ``i`` of slot ``slots[i]`` with the
        neighbour keys ``keys[i, :counts[i]]``; its columns go to ``out[out_rows[i]]`` (default
        ``out[i]``). A slot's column keys and last-heard numbers are read once and written back
        once, however many of its reports there are."""
        m = self.max_neighbours
        ck_all, cs_all = self._a["colkey"], self._a["colseen"]
        state: dict[int, tuple[list[int], list[int]]] = {}
        klist = keys.tolist()
        for i, s in enumerate(slots):
            st = state.get(s)
            if st is None:
                st = state[s] = (ck_all[s].tolist(), cs_all[s].tolist())
            ck, seen = st
            seq = seqs[i]
            used: list[int] = []
            cols = [-1] * m
            for pos, k in enumerate(klist[i][:counts[i]]):
                try:
                    j = ck.index(k)
                except ValueError:   # a new neighbour: a free column, else the one heard least recently
                    j = min([x for x in range(m) if x not in used], key=seen.__getitem__)
                    ck[j] = k
                if j in used:
                    continue                            # the same neighbour twice in one report
                used.append(j)
                seen[j] = seq
                cols[pos] = j
            out[i if out_rows is None else out_rows[i]] = cols
        for s, (ck, seen) in state.items():
            ck_all[s] = ck
            cs_all[s] = seen

    # ------------------------------------------------------------------ the API
    def add(self, r: MeasurementReport) -> "UETrack":
        """Append a report to its UE's track (a slot is taken on the UE's first report).

        Raises ValueError (and changes nothing) if the report's time is not finite or is older
        than that UE's newest report."""
        s = self.index.get(r.ue_id)
        if s is None:
            if not math.isfinite(r.time):       # a rejected first report takes no slot
                raise ValueError(f"report for UE {r.ue_id} has a non-finite time {r.time!r}")
            s = self._alloc(r.ue_id)
        self._append(s, r)
        return UETrack._bound(self, s)

    def get(self, ue_id: str) -> "UETrack | None":
        """The track of ``ue_id``, or None if the UE holds no slot."""
        s = self.index.get(ue_id)
        return None if s is None else UETrack._bound(self, s)

    def release(self, ue_id: str) -> bool:
        """Free the UE's slot (it left: a release or handover-out notice). True if it held one."""
        s = self.index.get(ue_id)
        if s is None:
            return False
        self._free_slot(s)
        return True

    def expire(self, now: float) -> list[str]:
        """Free the slots of UEs whose newest report is older than ``now - silence_s`` (trace
        clock); returns their ids. O(slots) array work, Python only for the freed ones."""
        if not math.isfinite(self.silence_s):
            return []
        lt = self._a["last_t"][: self.slots]
        gone = np.flatnonzero((lt < now - self.silence_s) & (self._a["serial"][: self.slots] >= 0))
        out = []
        for s in gone.tolist():
            out.append(self._ids[s])
            self._free_slot(s)
        return out

    def take_changed(self) -> np.ndarray:
        """Slots (int64, ascending) that got a report since the last call; clears the marks."""
        ch = self._a["changed"]
        out = np.flatnonzero(ch)
        ch[out] = False
        return out

    def held(self) -> np.ndarray:
        """Slots that hold a UE (int64, ascending)."""
        return np.flatnonzero(self._a["serial"][: self.slots] >= 0)

    def ue_of(self, slots: np.ndarray) -> list[str]:
        """The UE ids of ``slots`` (which must be held)."""
        ids = self._ids
        return [ids[s] for s in slots.tolist()]  # type: ignore[misc]

    def last_time(self, ue_id: str) -> float:
        """Time of the UE's newest report (NaN if it holds no slot)."""
        s = self.index.get(ue_id)
        return NAN if s is None else float(self._a["last_t"][s])

    def last_serving_cell(self, ue_id: str) -> int:
        """Serving cell of the UE's newest report (-1 if unknown or no slot)."""
        s = self.index.get(ue_id)
        if s is None or self._a["n"][s] == 0:
            return -1
        self._flush()
        return int(self._a["serving_cell"][s, (self._a["head"][s] - 1) % self.capacity])

    def window(self, slots: np.ndarray, w: int | None = None, fields: Sequence[str] | None = None) -> TrackView:
        """The newest ``w`` (default ``capacity``) reports of each slot as a batched TrackView of
        copies, shapes (U, w[, m]), oldest first; a slot with fewer reports is padded in front
        (time NaN, cells -1). Only ``fields`` (TrackView names) are read when given, the others
        are None. O(U w m) array work."""
        self._flush()
        c = self.capacity
        w = c if w is None else max(1, min(int(w), c))
        slots = np.asarray(slots, dtype=np.int64)
        a = self._a
        head = a["head"][slots].astype(np.int64)
        flat = slots[:, None] * c + (head[:, None] - w + np.arange(w)[None, :]) % c   # (U, w) into slot x ring
        pad = np.arange(w)[None, :] < (w - a["n"][slots])[:, None]         # rows not yet written
        out: dict[str, np.ndarray | None] = dict.fromkeys(TrackView._fields)
        for name, _, fill in _SCALAR:
            if fields is not None and name not in fields:
                continue
            arr = a[name]
            x = np.take(arr.reshape((-1,) + arr.shape[2:]), flat, axis=0)
            if pad.any():
                x[pad] = fill
            out[name] = x
        return TrackView(**out)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator["UETrack"]:
        return (UETrack._bound(self, s) for s in self.held().tolist())

    def __len__(self) -> int:
        return len(self.index)


class UETrack:
    """One UE's track: a handle on its slot of a ``TrackStore`` (``store.get``/``store.add``),
    or a stand-alone track ``UETrack(ue_id, capacity, max_neighbours)`` with a private store of
    one slot (tools and tests). ``append`` adds a report under this track's UE id; ``view``
    gives its reports as a TrackView of (n,) arrays. See TrackStore for the rules."""

    __slots__ = ("ue_id", "store", "slot")

    def __init__(self, ue_id: str, capacity: int = 32, max_neighbours: int = 8) -> None:
        self.ue_id = ue_id
        self.store = TrackStore(capacity, max_neighbours, max_ues=1, initial_slots=1)
        self.slot = self.store._alloc(ue_id)

    @classmethod
    def _bound(cls, store: TrackStore, slot: int) -> "UETrack":
        t = cls.__new__(cls)
        t.ue_id, t.store, t.slot = store._ids[slot], store, slot
        return t

    @property
    def capacity(self) -> int:
        return self.store.capacity

    @property
    def max_neighbours(self) -> int:
        return self.store.max_neighbours

    @property
    def nbytes(self) -> int:
        """Bytes of this track's share of the store's arrays."""
        return self.store.bytes_per_ue

    def __len__(self) -> int:
        return int(self.store._a["n"][self.slot])

    def append(self, r: MeasurementReport) -> None:
        """Add a report (its ``ue_id`` is not checked). ValueError if its time is not finite or
        older than the newest held (the track is then unchanged)."""
        self.store._append(self.slot, r)

    def view(self, last: int | None = None) -> TrackView:
        """The held reports (or the newest ``last`` of them), oldest first, as (n,) copies."""
        n = len(self)
        k = n if last is None else max(0, min(int(last), n))
        if k == 0:
            return TrackView(*(x[0, :0] for x in self.store.window(np.array([self.slot]), 1)))
        return TrackView(*(x[0] for x in self.store.window(np.array([self.slot]), k)))

    @property
    def last_report(self) -> MeasurementReport | None:
        """The newest report, rebuilt from the arrays (None if empty)."""
        if len(self) == 0:
            return None
        v = self.view(last=1)
        nbs = tuple(NeighbourMeas(int(p), int(c), float(a), float(b), float(d))
                    for p, c, a, b, d in zip(v.nb_pci[0], v.nb_cell[0], v.nb_rsrp_dbm[0], v.nb_rsrq_db[0],
                                             v.nb_sinr_db[0]) if a == a or p >= 0 or c >= 0)
        return MeasurementReport(float(v.time[0]), self.ue_id, int(v.serving_cell[0]), float(v.rsrp_dbm[0]),
                                 float(v.rsrq_db[0]), float(v.sinr_db[0]), nbs, int(v.serving_pci[0]),
                                 float(v.lat[0]), float(v.lon[0]), float(v.speed_mps[0]),
                                 float(v.heading_deg[0]), "", bool(v.connected[0]))


def batch_of_one(view: TrackView) -> TrackView:
    """A one-UE view (n,) as a batch of one, shapes (1, n[, m])."""
    return TrackView(*(x[None] for x in view))
