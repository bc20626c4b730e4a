"""What the predictors learn from association history: cell areas, successors, neighbour relations.

- ``AssociationMap``: square tiles (metres, on a local equirectangular frame around a fixed
  origin) -> how often each cell served there. The cell areas of the CVH predictor.
- ``TransitionModel``: handover counts A -> B and (C, A) -> B (C the cell served before A);
  gives P(target | serving, previous serving) with back-off, the "most frequent successor"
  and the ping-pong return (C -> A -> C).
- ``NeighbourRelations``: the neighbour relation table (NRT) (serving cell, neighbour PCI) ->
  neighbour cell id. A MeasurementReport names neighbours by PCI only (TS 38.331 MeasResultNR
  carries physCellId); the global identity needs an NRT, as the gNB keeps one (TS 38.300
  §15.3 ANR). Learned from (a) reports whose neighbours already carry a cell id (E2 node
  resolved them), (b) handovers: after A -> B the first report on B gives B's PCI, so
  (A, pci_B) -> B; (c) any report's serving (PCI, cell) pair, as a PCI -> cell fallback when
  PCIs are unique in the area. It can also be given whole (``NeighbourRelations.from_table``,
  e.g. ``pallas_tools.radio.Network.neighbour_relations()`` or an operator's configuration).

- ``HandoverPlaces``: where each cell's handovers happened (position, heading, target).
- ``DwellModel``: how long UEs stayed on a cell before handing over to each neighbour.
- ``ReturnModel``: how often the next handover goes back to the previous cell, by the time
  spent on the current one (the ping-pong return over every cell pair).

``Knowledge`` bundles them, learns offline from whole drives (positions interpolated
between GPS fixes, which is fine offline) and online from each new report (causal: only the
newest fix is used). Counts add and subtract, so leave-one-drive-out folds are cheap.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from xapp.drivetest import EARTH_RADIUS_M, Drive, read_drive
from xapp.predict.base import nanmedian_last
from xapp.tracks import MeasurementReport

_K = math.pi / 180.0 * EARTH_RADIUS_M


class LocalFrame:
    """Equirectangular metres east/north of a fixed origin (good to <1% over tens of km)."""

    __slots__ = ("lat0", "lon0", "kx", "ky")

    def __init__(self, lat0: float, lon0: float) -> None:
        self.lat0, self.lon0 = lat0, lon0
        self.kx = _K * math.cos(math.radians(lat0))
        self.ky = _K

    def xy(self, lat, lon):
        """(lat, lon) degrees -> (x, y) metres; scalars or arrays."""
        return (np.asarray(lon) - self.lon0) * self.kx, (np.asarray(lat) - self.lat0) * self.ky


class AssociationMap:
    """Tile -> serving-cell counts. ``tile_m`` square tiles on ``frame`` (set on first use).

    ``lookup(x, y)`` gives (majority cell, its count, purity = its share) of the tile at a point;
    (-1, 0, 0) for an unknown tile. Counts can be added (``add``) and removed (``remove``).
    """

    def __init__(self, tile_m: float = 35.0, frame: LocalFrame | None = None) -> None:
        self.tile_m = tile_m
        self.frame = frame
        self.tiles: dict[tuple[int, int], Counter] = {}
        self._maj: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._grid: tuple[int, int, np.ndarray, np.ndarray, np.ndarray] | None = None   # ox, oy, cell, n, tot

    def _key(self, x: float, y: float) -> tuple[int, int]:
        return (int(math.floor(x / self.tile_m)), int(math.floor(y / self.tile_m)))

    def ensure_frame(self, lat: float, lon: float) -> LocalFrame:
        if self.frame is None:
            self.frame = LocalFrame(lat, lon)
        return self.frame

    def add_xy(self, x: float, y: float, cell: int, n: int = 1) -> None:
        k = self._key(x, y)
        c = self.tiles.get(k)
        if c is None:
            c = self.tiles[k] = Counter()
        c[cell] += n
        m = self._maj.get(k)
        tot = (m[2] if m else 0) + n
        if m is None or m[0] == cell or c[cell] > m[1]:
            self._maj[k] = (cell, c[cell], tot)
        else:
            self._maj[k] = (m[0], m[1], tot)
        g = self._grid
        if g is not None:
            ix, iy = k[0] - g[0], k[1] - g[1]
            if 0 <= ix < g[2].shape[0] and 0 <= iy < g[2].shape[1]:
                mk = self._maj[k]
                g[2][ix, iy], g[3][ix, iy], g[4][ix, iy] = mk
            else:
                self._grid = None                   # outside: rebuilt, larger, on the next lookup

    def add_latlon(self, lat: float, lon: float, cell: int, n: int = 1) -> None:
        f = self.ensure_frame(lat, lon)       # LocalFrame.xy's arithmetic on scalars, without arrays
        self.add_xy(float((lon - f.lon0) * f.kx), float((lat - f.lat0) * f.ky), cell, n)

    def merge(self, other: "AssociationMap", sign: int = 1) -> None:
        """Add (sign=1) or remove (sign=-1) another map's counts (same tile size and frame)."""
        if other.tile_m != self.tile_m:
            raise ValueError("tile sizes differ")
        if self.frame is None:
            self.frame = other.frame
        for k, cnt in other.tiles.items():
            c = self.tiles.setdefault(k, Counter())
            for cell, n in cnt.items():
                c[cell] += sign * n
                if c[cell] <= 0:
                    del c[cell]
            if not c:
                del self.tiles[k]
                self._maj.pop(k, None)
            else:
                best, bn = c.most_common(1)[0]
                self._maj[k] = (best, bn, sum(c.values()))
        self._grid = None

    _GRID_MAX_TILES = 16_000_000     # a map spread wider than this (4,000 km^2 at 16 m) is looked up tile by tile

    def _build_grid(self) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray] | None:
        if not self._maj:
            return None
        ks = np.array(list(self._maj.keys()), dtype=np.int64)
        lo, hi = ks.min(axis=0) - 32, ks.max(axis=0) + 33          # a margin for the map to grow
        nx, ny = int(hi[0] - lo[0]), int(hi[1] - lo[1])
        if nx * ny > self._GRID_MAX_TILES:
            return None
        cell = np.full((nx, ny), -1, dtype=np.int64)
        cnt = np.zeros((nx, ny), dtype=np.int64)
        tot = np.ones((nx, ny), dtype=np.int64)
        v = np.array(list(self._maj.values()), dtype=np.int64)
        ix, iy = ks[:, 0] - lo[0], ks[:, 1] - lo[1]
        cell[ix, iy], cnt[ix, iy], tot[ix, iy] = v[:, 0], v[:, 1], v[:, 2]
        self._grid = (int(lo[0]), int(lo[1]), cell, cnt, tot)
        return self._grid

    def lookup_many(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``lookup`` of every point of arrays ``x``, ``y`` (m, any shape): (majority cell, its
        count, purity) arrays; unknown tiles give (-1, 0, 0). Array work on a dense mirror of
        the tiles, kept up to date by ``add_xy``."""
        kx = np.floor(x / self.tile_m)
        ky = np.floor(y / self.tile_m)
        g = self._grid or self._build_grid()
        if g is None:
            if not self._maj:
                return np.full(x.shape, -1, np.int64), np.zeros(x.shape, np.int64), np.zeros(x.shape)
            out = [self.lookup(a, b) for a, b in zip(x.ravel().tolist(), y.ravel().tolist())]
            return (np.array([o[0] for o in out], np.int64).reshape(x.shape),
                    np.array([o[1] for o in out], np.int64).reshape(x.shape),
                    np.array([o[2] for o in out], np.float64).reshape(x.shape))
        ox, oy, cell, cnt, tot = g
        fin = np.isfinite(kx) & np.isfinite(ky)
        ix = np.where(fin, kx, 0).astype(np.int64) - ox
        iy = np.where(fin, ky, 0).astype(np.int64) - oy
        inside = fin & (ix >= 0) & (ix < cell.shape[0]) & (iy >= 0) & (iy < cell.shape[1])
        ix, iy = np.where(inside, ix, 0), np.where(inside, iy, 0)
        c = np.where(inside, cell[ix, iy], -1)
        n = np.where(inside, cnt[ix, iy], 0)
        return c, n, np.where(c >= 0, n / tot[ix, iy], 0.0)

    def lookup(self, x: float, y: float) -> tuple[int, int, float]:
        m = self._maj.get(self._key(x, y))
        if m is None:
            return -1, 0, 0.0
        return m[0], m[1], m[1] / m[2]

    def share(self, x: float, y: float, cell: int) -> float:
        """Share of ``cell`` among the observations of the tile at (x, y); 0 if unknown."""
        c = self.tiles.get(self._key(x, y))
        if not c:
            return 0.0
        return c.get(cell, 0) / max(1, sum(c.values()))

    def copy(self) -> "AssociationMap":
        m = AssociationMap(self.tile_m, self.frame)
        m.tiles = {k: Counter(v) for k, v in self.tiles.items()}
        m._maj = dict(self._maj)
        return m

    def __len__(self) -> int:
        return len(self.tiles)


class TransitionModel:
    """Handover counts: first order A -> B, second order (C, A) -> B, and the longer routes
    (..., D, C, A) -> B up to ``MAX_ORDER`` cells.

    ``probs(serving, previous)`` returns {B: P(B | A=serving, C=previous)}, the second-order
    estimate smoothed towards the first-order one: P = (n2(C,A,B) + beta * P1(B|A)) / (N2 + beta),
    P1 = (n1(A,B) + s) / (N1(A) + s |B seen from A|).
    ``probs_route(route)`` conditions on the route (the cells served, oldest first, ending with
    the serving cell) the same way, one cell further back at a time: P_k = (n_k(route[-k:], B) +
    beta * P_{k-1}(B)) / (N_k + beta), as long as that longer route was seen. The route tells the
    way the UE is driving where one previous cell does not (the same cell pair is crossed on
    different roads); on the UCC drives the successor alone names 46.2% of the connected
    handovers with two cells and 47.9% with four (leave-one-drive-out, learning online).
    """

    #: the longest route (cells, the serving one included) whose successors are counted
    MAX_ORDER = 4

    def __init__(self, smoothing: float = 0.5, backoff_weight: float = 1.0) -> None:
        self.s = smoothing
        self.beta = backoff_weight
        self.n1: dict[int, Counter] = defaultdict(Counter)
        self.n2: dict[tuple[int, int], Counter] = defaultdict(Counter)
        #: route (3 to MAX_ORDER cells, oldest first, the source last) -> successor counts
        self.nk: dict[tuple[int, ...], Counter] = defaultdict(Counter)
        self._memo: dict[tuple[int, ...], dict[int, float]] = {}   # probs, cleared on any change

    def add(self, prev: int, src: int, dst: int, n: int = 1, earlier: Sequence[int] = ()) -> None:
        """``n`` handovers src -> dst after ``prev`` (-1 unknown); ``earlier``: the cells served
        before ``prev``, oldest first (the longer routes, up to ``MAX_ORDER`` cells)."""
        self.n1[src][dst] += n
        if prev >= 0:
            self.n2[(prev, src)][dst] += n
            back = tuple(earlier)[-(self.MAX_ORDER - 2):] if self.MAX_ORDER > 2 else ()
            for q in range(1, len(back) + 1):
                self.nk[back[-q:] + (prev, src)][dst] += n
        self._memo.clear()

    def probs_cached(self, serving: int, previous: int = -1) -> dict[int, float]:
        """``probs`` memoised until the counts change (do not modify the dict returned)."""
        k = (serving, previous if previous >= 0 else -1)
        p = self._memo.get(k)
        if p is None:
            if len(self._memo) > 100_000:
                self._memo.clear()
            p = self._memo[k] = self.probs(serving, previous)
        return p

    def probs_route(self, route: tuple[int, ...]) -> dict[int, float]:
        """{B: P(B | route)} (class doc), memoised until the counts change (do not modify the
        dict returned). ``route``: the cells served, oldest first, the serving cell last; a
        route of one or two cells is ``probs(serving, previous)``."""
        if len(route) <= 2:
            return self.probs_cached(route[-1], route[0] if len(route) == 2 else -1)
        key = (-2,) + route               # apart from the (serving, previous) keys
        p = self._memo.get(key)
        if p is not None:
            return p
        p = self.probs_cached(route[-1], route[-2])
        for q in range(3, len(route) + 1):
            c = self.nk.get(route[-q:])
            if not c:
                break
            pos = {b: m for b, m in c.items() if m > 0}
            if not pos:
                break
            tot = sum(pos.values())
            p = {b: (pos.get(b, 0) + self.beta * p.get(b, 0.0)) / (tot + self.beta) for b in {**p, **pos}}
        if len(self._memo) > 100_000:
            self._memo.clear()
        self._memo[key] = p
        return p

    def merge(self, other: "TransitionModel", sign: int = 1) -> None:
        self._memo.clear()
        for a, c in other.n1.items():
            for b, n in c.items():
                self.n1[a][b] += sign * n
        for k, c in other.n2.items():
            for b, n in c.items():
                self.n2[k][b] += sign * n
        for k, c in other.nk.items():
            for b, n in c.items():
                self.nk[k][b] += sign * n

    def probs(self, serving: int, previous: int = -1) -> dict[int, float]:
        c1 = self.n1.get(serving)
        cands = {b: n for b, n in c1.items() if n > 0} if c1 else {}
        c2 = self.n2.get((previous, serving)) if previous >= 0 else None
        if c2:
            for b, n in c2.items():
                if n > 0:
                    cands.setdefault(b, 0)
        if not cands:
            return {}
        n1tot = sum(cands.values())
        k = len(cands)
        p1 = {b: (n + self.s) / (n1tot + self.s * k) for b, n in cands.items()}
        if not c2:
            return p1
        n2tot = sum(max(n, 0) for n in c2.values())
        return {b: (max(c2.get(b, 0), 0) + self.beta * p1[b]) / (n2tot + self.beta) for b in cands}

    def copy(self) -> "TransitionModel":
        t = TransitionModel(self.s, self.beta)
        for a, c in self.n1.items():
            t.n1[a] = Counter(c)
        for k, c in self.n2.items():
            t.n2[k] = Counter(c)
        for k, c in self.nk.items():
            t.nk[k] = Counter(c)
        return t


class HandoverPlaces:
    """Where handovers happened: per source cell, the positions (metres on the map's frame),
    headings (degrees) and targets of observed handovers (the "HO-event map").

    ``ahead(source, x, y, heading, ...)`` finds the handovers of the serving cell that lie
    ahead on the straight (constant heading) path: within ``lateral_m`` of it, driven in a
    heading within ``max_dheading`` degrees. It returns the along-path distance to the nearest
    such place (median over the events within ``cluster_m`` of it), the majority target there
    and its vote share and count.
    """

    def __init__(self) -> None:
        self.events: dict[int, Counter] = defaultdict(Counter)   # source -> {(x, y, hd, target): n}
        self._arr: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}

    def add(self, source: int, target: int, x: float, y: float, heading: float, n: int = 1) -> None:
        if not (x == x and y == y and heading == heading):
            return
        self.events[source][(round(x, 1), round(y, 1), round(heading, 1), target)] += n
        self._arr.pop(source, None)

    def merge(self, other: "HandoverPlaces", sign: int = 1) -> None:
        for src, c in other.events.items():
            mine = self.events[src]
            for k, n in c.items():
                mine[k] += sign * n
                if mine[k] <= 0:
                    del mine[k]
            self._arr.pop(src, None)

    def _arrays(self, source: int):
        a = self._arr.get(source)
        if a is None:
            ev = [(k, n) for k, n in self.events.get(source, {}).items() if n > 0]
            if ev:
                xs = np.array([k[0] for k, n in ev for _ in range(n)])
                ys = np.array([k[1] for k, n in ev for _ in range(n)])
                hs = np.array([k[2] for k, n in ev for _ in range(n)])
                ts = np.array([k[3] for k, n in ev for _ in range(n)], dtype=np.int64)
            else:
                xs = ys = hs = np.zeros(0)
                ts = np.zeros(0, dtype=np.int64)
            a = self._arr[source] = (xs, ys, hs, ts)
        return a

    def ahead(self, source: int, x: float, y: float, heading: float, lateral_m: float = 20.0,
              max_dheading: float = 45.0, behind_m: float = 10.0, reach_m: float = 300.0,
              cluster_m: float = 30.0) -> tuple[float, int, float, int] | None:
        """(distance ahead in m, target, vote share, events) of the nearest handover place ahead."""
        xs, ys, hs, ts = self._arrays(source)
        if xs.size == 0:
            return None
        ux, uy = math.sin(math.radians(heading)), math.cos(math.radians(heading))
        dx, dy = xs - x, ys - y
        along = dx * ux + dy * uy
        lat = np.abs(dx * uy - dy * ux)
        dh = np.abs((hs - heading + 180.0) % 360.0 - 180.0)
        ok = (lat <= lateral_m) & (dh <= max_dheading) & (along >= -behind_m) & (along <= reach_m)
        if not ok.any():
            return None
        al = along[ok]
        tg = ts[ok]
        near = al <= al.min() + cluster_m
        cnt = Counter(tg[near].tolist())
        target, votes = cnt.most_common(1)[0]
        d = float(np.median(al[near & (tg == target)]))
        return max(d, 0.0), int(target), votes / int(near.sum()), int(near.sum())

    def ahead_many(self, source: np.ndarray, x: np.ndarray, y: np.ndarray, heading: np.ndarray,
                   lateral_m: float, max_dheading: float, behind_m: float, reach_m: np.ndarray,
                   cluster_m: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``ahead`` for U UEs at once (arrays of shape (U,)): (found, distance m, target, vote
        share, events). Array work per distinct source cell over (UEs of it, its places); ties
        of the vote go to the target met first among the places, as ``ahead``."""
        U = len(source)
        found = np.zeros(U, bool)
        dist, share = np.zeros(U), np.zeros(U)
        target, nev = np.full(U, -1, np.int64), np.zeros(U, np.int64)
        if U == 0:
            return found, dist, target, share, nev
        order = np.argsort(source, kind="stable")
        cells, starts = np.unique(source[order], return_index=True)
        bounds = list(starts[1:]) + [U]
        for cell, a, b in zip(cells.tolist(), starts.tolist(), bounds):
            xs, ys, hs, ts = self._arrays(cell)
            if xs.size == 0:
                continue
            u = order[a:b]
            hr = np.radians(heading[u])[:, None]
            ux, uy = np.sin(hr), np.cos(hr)
            dx, dy = xs[None, :] - x[u, None], ys[None, :] - y[u, None]
            along = dx * ux + dy * uy
            lat = np.abs(dx * uy - dy * ux)
            dh = np.abs((hs[None, :] - heading[u, None] + 180.0) % 360.0 - 180.0)
            ok = (lat <= lateral_m) & (dh <= max_dheading) & (along >= -behind_m) & (along <= reach_m[u, None])
            any_ok = ok.any(axis=1)
            if not any_ok.any():
                continue
            u, ok, along = u[any_ok], ok[any_ok], along[any_ok]
            amin = np.where(ok, along, np.inf).min(axis=1)
            near = ok & (along <= amin[:, None] + cluster_m)
            tcell, tinv = np.unique(ts, return_inverse=True)
            E = len(ts)
            onehot = tinv[None, :] == np.arange(len(tcell))[:, None]                   # (T, E)
            hit = near[:, None, :] & onehot[None, :, :]                                # (G, T, E)
            votes = hit.sum(axis=2)
            first = np.where(hit, np.arange(E), E).min(axis=2)
            best = np.argmax(votes * (E + 1) - first, axis=1)                          # most votes, then first met
            g = np.arange(len(u))
            sel = near & (ts[None, :] == tcell[best][:, None])
            d = nanmedian_last(np.where(sel, along, np.nan))
            nn = near.sum(axis=1)
            found[u] = True
            dist[u] = np.maximum(d, 0.0)
            target[u] = tcell[best]
            share[u] = votes[g, best] / nn
            nev[u] = nn
        return found, dist, target, share, nev

    def copy(self) -> "HandoverPlaces":
        p = HandoverPlaces()
        for k, c in self.events.items():
            p.events[k] = Counter(c)
        return p


class NeighbourRelations:
    """The neighbour relation table: (serving cell, PCI) -> neighbour cell id, with a
    PCI -> cell fallback for PCIs seen with one cell only. See the module doc for how it is
    learned."""

    def __init__(self) -> None:
        self.pair: dict[tuple[int, int], Counter] = defaultdict(Counter)
        self.by_pci: dict[int, Counter] = defaultdict(Counter)

    @classmethod
    def from_table(cls, table: dict[tuple[int, int], int]) -> "NeighbourRelations":
        """A given NRT: {(serving cell, neighbour PCI): neighbour cell}."""
        n = cls()
        for (s, p), c in table.items():
            n.pair[(s, p)][c] += 1000
        return n

    def add(self, serving: int, pci: int, cell: int, n: int = 1) -> None:
        if pci < 0 or cell < 0:
            return
        if serving >= 0:
            self.pair[(serving, pci)][cell] += n
        self.by_pci[pci][cell] += n

    def add_serving(self, pci: int, cell: int) -> None:
        if pci >= 0 and cell >= 0:
            self.by_pci[pci][cell] += 1

    def resolve(self, serving: int, pci: int) -> int:
        """The neighbour cell id, or -1 when unknown or ambiguous."""
        if pci < 0:
            return -1
        c = self.pair.get((serving, pci))
        if c:
            return c.most_common(1)[0][0]
        c = self.by_pci.get(pci)
        if c and len(c) == 1:
            return next(iter(c))
        return -1

    def merge(self, other: "NeighbourRelations", sign: int = 1) -> None:
        for k, c in other.pair.items():
            for b, n in c.items():
                self.pair[k][b] += sign * n
                if self.pair[k][b] <= 0:
                    del self.pair[k][b]
        for k, c in other.by_pci.items():
            for b, n in c.items():
                self.by_pci[k][b] += sign * n
                if self.by_pci[k][b] <= 0:
                    del self.by_pci[k][b]

    def copy(self) -> "NeighbourRelations":
        n = NeighbourRelations()
        for k, c in self.pair.items():
            n.pair[k] = Counter(c)
        for k, c in self.by_pci.items():
            n.by_pci[k] = Counter(c)
        return n


class DwellModel:
    """How long UEs stayed on a cell before handing over to a given neighbour: per (A, B) a
    histogram of dwell times on A, s, in ``bin_s`` bins up to ``max_s`` (longer dwells in the
    last bin), plus one histogram over every pair. Counts, so that ``merge`` with a sign
    subtracts a drive (the leave-one-drive-out scoring of ``pallas_tools.evaluate``).

    ``median(a, b)`` is the median dwell of the pair (the all-pairs median with fewer than
    ``min_count`` samples; NaN with none at all). The UCC drives: median 14 s, p10 2 s
    (``docs/drive-data.md`` §1).
    """

    def __init__(self, bin_s: float = 0.5, max_s: float = 300.0, min_count: int = 3) -> None:
        if bin_s <= 0 or max_s <= bin_s:
            raise ValueError(f"need 0 < bin_s < max_s, got {bin_s}, {max_s}")
        self.bin_s, self.max_s, self.min_count = float(bin_s), float(max_s), int(min_count)
        self.pairs: dict[tuple[int, int], Counter] = defaultdict(Counter)
        self.all: Counter = Counter()

    def add(self, a: int, b: int, dwell_s: float, n: int = 1) -> None:
        """One dwell of ``dwell_s`` seconds on ``a`` that ended in a handover to ``b`` (NaN or
        negative dwells are ignored)."""
        if not (dwell_s == dwell_s) or dwell_s < 0:
            return
        k = int(min(dwell_s, self.max_s) // self.bin_s)
        self.pairs[(a, b)][k] += n
        self.all[k] += n

    def _median(self, c: Counter) -> float:
        tot = sum(max(v, 0) for v in c.values())
        if tot <= 0:
            return float("nan")
        acc = 0
        for k in sorted(c):
            acc += max(c[k], 0)
            if acc * 2 >= tot:
                return (k + 0.5) * self.bin_s
        return float("nan")

    def median(self, a: int, b: int) -> float:
        """Median dwell on ``a`` before a handover to ``b``, s (class doc)."""
        c = self.pairs.get((a, b))
        if c is not None and sum(max(v, 0) for v in c.values()) >= self.min_count:
            return self._median(c)
        return self._median(self.all)

    def residual_median(self, a: int, b: int, elapsed_s: np.ndarray) -> np.ndarray:
        """Median dwell on ``a`` before a handover to ``b`` among the dwells longer than
        ``elapsed_s`` (s, any shape): the median remaining life given that the UE has already
        stayed ``elapsed_s``, plus ``elapsed_s``; s, same shape. Dwells on this data are
        heavy-tailed (median 14 s, p90 96 s), so once the unconditional median has passed the
        handover is not imminent: the conditional median moves out with the elapsed time.
        The pair's histogram where it holds ``min_count`` dwells longer than the elapsed time,
        else the all-pairs one; where neither holds any longer dwell, NaN."""
        e = np.asarray(elapsed_s, dtype=np.float64)
        out = np.full(e.shape, np.nan)
        pair = self._cum(self.pairs.get((a, b)))
        whole = self._cum(self.all)
        for cum in (whole, pair):              # the pair's answer overrides where it has support
            if cum is None:
                continue
            ends, cnt = cum
            # dwells longer than e: the bins whose upper end exceeds e (a bin holds [k, k+1) bin_s)
            k0 = np.searchsorted(ends, e, side="right")
            before = np.where(k0 > 0, cnt[np.maximum(k0 - 1, 0)], 0.0)
            left = cnt[-1] - before
            need = (cum is whole) | (left >= self.min_count)
            half = before + 0.5 * left
            km = np.minimum(np.searchsorted(cnt, half, side="left"), len(cnt) - 1)
            med = np.maximum(ends[km] - 0.5 * self.bin_s, e)
            out = np.where(need & (left > 0), med, out)
        return out

    def _cum(self, c: Counter | None) -> tuple[np.ndarray, np.ndarray] | None:
        """(upper bin ends, s; cumulative counts) of a histogram, or None if it is empty."""
        if not c:
            return None
        ks = sorted(k for k, v in c.items() if v > 0)
        if not ks:
            return None
        ends = (np.asarray(ks, dtype=np.float64) + 1.0) * self.bin_s
        return ends, np.cumsum([float(c[k]) for k in ks])

    def merge(self, other: "DwellModel", sign: int = 1) -> None:
        for k, c in other.pairs.items():
            mine = self.pairs[k]
            for b, n in c.items():
                mine[b] += sign * n
        for b, n in other.all.items():
            self.all[b] += sign * n

    def copy(self) -> "DwellModel":
        d = DwellModel(self.bin_s, self.max_s, self.min_count)
        d.pairs = defaultdict(Counter, {k: Counter(v) for k, v in self.pairs.items()})
        d.all = Counter(self.all)
        return d


class ReturnModel:
    """How often a UE hands back to the cell it came from, by the time it has spent on the
    current one: the ping-pong return C -> A -> C as one pattern over every cell, not per
    (C, A) pair (the ``TransitionModel`` knows a return only where that pair's return was seen).
    Two histograms of dwell times on A, s (``bin_s`` bins up to ``max_s``), of the handovers
    out of A that had a known previous cell C: those that went back to C and those that went
    elsewhere. Counts, so ``merge`` with a sign subtracts a drive.

    ``p_return(elapsed)``: P(next target = C | still on A after ``elapsed`` s), the share of
    returns among the dwells longer than ``elapsed``, smoothed towards the overall share with
    ``prior`` pseudo-counts. The UCC drives (leave-one-drive-out, 2 s before the handover): 0.60
    in the first 3 s on a cell, 0.44 after 12 s, 0.17 after 30 s (``docs/drive-data.md`` §5)."""

    def __init__(self, bin_s: float = 0.5, max_s: float = 300.0, prior: float = 5.0) -> None:
        if bin_s <= 0 or max_s <= bin_s:
            raise ValueError(f"need 0 < bin_s < max_s, got {bin_s}, {max_s}")
        self.bin_s, self.max_s, self.prior = float(bin_s), float(max_s), float(prior)
        self.back: Counter = Counter()      # bin -> returns to the previous cell
        self.on: Counter = Counter()        # bin -> handovers elsewhere
        self._cum: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def add(self, dwell_s: float, returned: bool, n: int = 1) -> None:
        """One dwell of ``dwell_s`` s that ended in a return (``returned``) or a handover
        elsewhere (NaN or negative dwells are ignored)."""
        if not (dwell_s == dwell_s) or dwell_s < 0:
            return
        k = int(min(dwell_s, self.max_s) // self.bin_s)
        (self.back if returned else self.on)[k] += n
        self._cum = None

    def _tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bin upper ends, s; returns longer than each bin's start; all longer), cached."""
        if self._cum is None:
            nb = int(self.max_s // self.bin_s) + 1
            back = np.zeros(nb)
            on = np.zeros(nb)
            for c, arr in ((self.back, back), (self.on, on)):
                for k, v in c.items():
                    if 0 <= k < nb:
                        arr[k] += max(v, 0)
            # counts of dwells in bins >= k (reversed cumulative sum)
            rb = np.cumsum(back[::-1])[::-1]
            ra = rb + np.cumsum(on[::-1])[::-1]
            self._cum = (np.arange(nb) * self.bin_s, rb, ra)
        return self._cum

    def p_return(self, elapsed_s: np.ndarray) -> np.ndarray:
        """P(the next handover returns to the previous cell | ``elapsed_s`` s spent on the
        current one), any shape; the overall share past every learned dwell (with no prior);
        NaN elapsed gives NaN; 0 with no data."""
        e = np.asarray(elapsed_s, dtype=np.float64)
        starts, rb, ra = self._tables()
        if ra[0] <= 0:
            return np.where(np.isnan(e), np.nan, 0.0)
        overall = rb[0] / ra[0]
        # dwells longer than e: the bins from the one holding e on (a dwell in e's own bin may
        # be shorter than e; counting it keeps the estimate smooth at 1 s resolution)
        k = np.clip(np.floor(np.nan_to_num(e, nan=0.0) / self.bin_s), 0, len(ra) - 1).astype(np.int64)
        den = ra[k] + self.prior
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.where(den > 0, (rb[k] + self.prior * overall) / np.where(den > 0, den, 1.0), overall)
        return np.where(np.isnan(e), np.nan, p)

    def merge(self, other: "ReturnModel", sign: int = 1) -> None:
        for mine, theirs in ((self.back, other.back), (self.on, other.on)):
            for k, n in theirs.items():
                mine[k] += sign * n
        self._cum = None

    def copy(self) -> "ReturnModel":
        r = ReturnModel(self.bin_s, self.max_s, self.prior)
        r.back, r.on = Counter(self.back), Counter(self.on)
        return r


@dataclass
class Knowledge:
    """Association map, transition model and NRT together; learn offline and online."""

    assoc: AssociationMap = field(default_factory=AssociationMap)
    trans: TransitionModel = field(default_factory=TransitionModel)
    nrt: NeighbourRelations = field(default_factory=NeighbourRelations)
    places: HandoverPlaces = field(default_factory=HandoverPlaces)
    max_dr_m: float = 200.0
    dwell: DwellModel = field(default_factory=DwellModel)
    returns: ReturnModel = field(default_factory=ReturnModel)
    # online: when each UE's current serving cell began serving it (s; freed by ``forget``)
    _entered: dict[str, float] = field(default_factory=dict, repr=False)
    # online state per UE: (previous report's time, its serving cell, the cell before the
    # current serving, last fix (t, lat, lon, speed, heading) or None); freed by ``forget``
    _ue: dict[str, tuple[float, int, int, tuple | None]] = field(default_factory=dict, repr=False)
    # online: each UE's last TransitionModel.MAX_ORDER serving cells, oldest first, the current
    # one last (freed by ``forget``)
    _route: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)

    @classmethod
    def create(cls, tile_m: float = 35.0, smoothing: float = 0.5, backoff_weight: float = 1.0) -> "Knowledge":
        return cls(AssociationMap(tile_m), TransitionModel(smoothing, backoff_weight), NeighbourRelations(),
                   HandoverPlaces())

    def learn_drive(self, drive: Drive) -> None:
        """Learn from a whole recorded drive (offline: positions interpolated between fixes)."""
        reps = drive.reports
        if not reps:
            return
        t = np.array([r.time for r in reps])
        lat = np.array([r.lat for r in reps])
        lon = np.array([r.lon for r in reps])
        fixes = drive.fix_rows or list(np.nonzero(~np.isnan(lat))[0])
        if len(fixes) >= 2:
            fx = np.asarray(fixes)
            # only interpolate rows between the first and last fix
            sel = (t >= t[fx[0]]) & (t <= t[fx[-1]])
            ilat = np.interp(t[sel], t[fx], lat[fx])
            ilon = np.interp(t[sel], t[fx], lon[fx])
            cells = [reps[i].serving_cell for i in np.nonzero(sel)[0]]
            f = self.assoc.ensure_frame(float(ilat[0]), float(ilon[0]))
            xs, ys = f.xy(ilat, ilon)
            for x, y, c in zip(xs.tolist(), ys.tolist(), cells):
                self.assoc.add_xy(x, y, c)
            # handover places: position interpolated at the HO time, heading of the fix before it
            hd = np.array([r.heading_deg for r in reps])
            for h in drive.handovers:
                th = 0.5 * (h.time + h.prev_time)
                if not (t[fx[0]] <= th <= t[fx[-1]]):
                    continue
                la = float(np.interp(th, t[fx], lat[fx]))
                lo = float(np.interp(th, t[fx], lon[fx]))
                k = int(np.searchsorted(t[fx], th, side="right"))
                k = min(k, len(fx) - 1)
                hk = hd[fx[k]] if hd[fx[k]] == hd[fx[k]] else hd[fx[max(k - 1, 0)]]
                hx, hy = f.xy(la, lo)
                self.places.add(h.source_cell, h.target_cell, float(hx), float(hy), float(hk))
        prev_cell = -1
        since = float(reps[0].time)
        route: list[int] = []                  # the cells served before prev_cell, oldest first
        for h in drive.handovers:
            self.trans.add(prev_cell, h.source_cell, h.target_cell, earlier=route)
            if prev_cell >= 0:                 # the first dwell began before the log did
                route = (route + [prev_cell])[-TransitionModel.MAX_ORDER:]
                self.dwell.add(h.source_cell, h.target_cell, 0.5 * (h.time + h.prev_time) - since)
                self.returns.add(0.5 * (h.time + h.prev_time) - since, h.target_cell == prev_cell)
            since = 0.5 * (h.time + h.prev_time)
            prev_cell = h.source_cell
        for i, r in enumerate(reps):
            self._learn_ids(r, reps[i - 1].serving_cell if i else None)

    def _learn_ids(self, r: MeasurementReport, prev_cell: int | None) -> None:
        if r.serving_pci >= 0:
            self.nrt.add_serving(r.serving_pci, r.serving_cell)
            if prev_cell is not None and prev_cell != r.serving_cell:
                self.nrt.add(prev_cell, r.serving_pci, r.serving_cell)
        for nb in r.neighbours:
            if nb.cell_id >= 0 and nb.pci >= 0:
                self.nrt.add(r.serving_cell, nb.pci, nb.cell_id)

    def observe(self, r: MeasurementReport) -> None:
        """Online learning from one new report of a UE (causal). Call for every report."""
        st = self._ue.get(r.ue_id)
        prev_t, prev_cell, before, fix = (st if st is not None else (math.nan, None, -1, None))
        if r.lat == r.lat and r.lon == r.lon and (fix is None or (r.lat, r.lon) != (fix[1], fix[2])):
            self.assoc.add_latlon(r.lat, r.lon, r.serving_cell)
            fix = (r.time, r.lat, r.lon, r.speed_mps, r.heading_deg)
        route = self._route.get(r.ue_id, ())
        if not route or route[-1] != r.serving_cell:
            self._route[r.ue_id] = (route + (r.serving_cell,))[-TransitionModel.MAX_ORDER:]
        if prev_cell is not None and prev_cell != r.serving_cell:
            self.trans.add(before, prev_cell, r.serving_cell, earlier=route[:-2])
            t_ho = 0.5 * (r.time + prev_t)
            entered = self._entered.get(r.ue_id)
            if entered is not None:
                self.dwell.add(prev_cell, r.serving_cell, t_ho - entered)
                if before >= 0:
                    self.returns.add(t_ho - entered, r.serving_cell == before)
            self._entered[r.ue_id] = t_ho
            before = prev_cell
            if fix is not None and self.assoc.frame is not None and fix[3] == fix[3] and fix[4] == fix[4]:
                # dead-reckon from the last fix to the handover (causal)
                x0, y0 = self.assoc.frame.xy(fix[1], fix[2])
                d = min(fix[3] * max(0.0, 0.5 * (r.time + prev_t) - fix[0]), self.max_dr_m)
                hr = math.radians(fix[4])
                self.places.add(prev_cell, r.serving_cell, float(x0) + d * math.sin(hr),
                                float(y0) + d * math.cos(hr), float(fix[4]))
        self._learn_ids(r, prev_cell)
        self._ue[r.ue_id] = (r.time, r.serving_cell, before, fix)

    def previous_cell(self, ue_id: str) -> int:
        """The cell that served ``ue_id`` before the current one, as seen online (-1 unknown)."""
        st = self._ue.get(ue_id)
        return st[2] if st else -1

    def route(self, ue_id: str) -> tuple[int, ...]:
        """The last cells that served ``ue_id``, oldest first, the current one last, as seen
        online (up to ``TransitionModel.MAX_ORDER``; empty if none)."""
        return self._route.get(ue_id, ())

    def entered(self, ue_id: str) -> float:
        """When the current serving cell began serving ``ue_id``, as seen online (the midpoint
        of the two reports around the change), s; NaN before its first handover here."""
        return self._entered.get(ue_id, float("nan"))

    def forget(self, ue_id: str) -> None:
        """Drop the online state of a UE that left (what it taught the maps stays)."""
        self._ue.pop(ue_id, None)
        self._entered.pop(ue_id, None)
        self._route.pop(ue_id, None)

    @property
    def ues(self) -> int:
        """UEs with online state."""
        return len(self._ue)

    def merge(self, other: "Knowledge", sign: int = 1) -> None:
        self.assoc.merge(other.assoc, sign)
        self.trans.merge(other.trans, sign)
        self.nrt.merge(other.nrt, sign)
        self.places.merge(other.places, sign)
        self.dwell.merge(other.dwell, sign)
        self.returns.merge(other.returns, sign)

    def copy(self) -> "Knowledge":
        return Knowledge(self.assoc.copy(), self.trans.copy(), self.nrt.copy(), self.places.copy(), self.max_dr_m,
                         self.dwell.copy(), self.returns.copy())

    @classmethod
    def from_drives(cls, drives: Iterable[Drive], tile_m: float = 35.0, smoothing: float = 0.5,
                    backoff_weight: float = 1.0) -> "Knowledge":
        k = cls.create(tile_m, smoothing, backoff_weight)
        for d in drives:
            k.learn_drive(d)
        return k


def knowledge_from_trace(path: str | Path, tile_m: float = 35.0, smoothing: float = 0.5,
                         backoff_weight: float = 1.0) -> Knowledge:
    """Learn a Knowledge from an E2 trace of earlier traffic in this network (``xapp.e2.trace``
    format, as ``pallas-xapp --mode test`` replays): every RIC_INDICATION through the xApp's
    ingest, each report learned as online learning would have learned it live (``observe``, in
    time order), then the UEs' online state dropped (what they taught the maps stays).

    Raises ``ValueError`` when the trace holds no decodable report, ``TraceFormatError`` where
    the file breaks the format.
    """
    from xapp.e2.ingest import decode_trace

    reports, stats = decode_trace(str(path))
    if not reports:
        raise ValueError(f"association map: {path}: no decodable RIC_INDICATION (ingest stats {stats})")
    k = Knowledge.create(tile_m, smoothing, backoff_weight)
    for _, r in sorted(reports, key=lambda x: x[1].time):
        k.observe(r)
    for ue in list(k._ue):
        k.forget(ue)
    return k


def knowledge_from_drives_at(path: str | Path, tile_m: float = 35.0, smoothing: float = 0.5,
                             backoff_weight: float = 1.0) -> Knowledge:
    """Learn a Knowledge (association map, handover places, successors, neighbour relations)
    from earlier drives at ``path``: an E2 trace (``*.e2trace``, see ``knowledge_from_trace``),
    one G-NetTrack Pro CSV, or every ``*.csv`` under a folder (recursively, in name order).

    Raises:
        ValueError: ``path`` does not exist, or holds no CSV, or a CSV is not a drive log, or a
        trace holds no decodable report.
    """
    p = Path(path)
    if p.is_file() and p.suffix == ".e2trace":
        return knowledge_from_trace(p, tile_m, smoothing, backoff_weight)
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(p.rglob("*.csv"))
    else:
        raise ValueError(f"association map: {p} does not exist")
    if not files:
        raise ValueError(f"association map: no drive-test CSV under {p}")
    return Knowledge.from_drives((read_drive(f) for f in files), tile_m, smoothing, backoff_weight)
