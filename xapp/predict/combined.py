"""The history predictor, the combination, and the facade the xApp calls, over many UEs at once.

- ``HistoryPredictor``: names the most likely successor of the serving cell given the cell
  before it, P(B | A, C) from ``maps.TransitionModel`` (learned from earlier drives, updated
  online). It gives no time (t_ho NaN).
- ``CombinedPredictor``: weighs history, location (CVH, handover places) and A3 for the
  target, takes the time from the most exact predictor that agrees, and says which spoke.
- ``HandoverPredictor``: the facade. Holds the config, the learned ``Knowledge`` (updated
  online by ``observe``), the hysteresis state of every UE (``base.StabiliserBank``) and runs
  the configured predictor for the UEs whose tracks changed (``update(store)``: one batch,
  array work over the UEs), for one UE (``predict``) or for every UE (``predict_all``).

Every predictor has ``batch(view, now, ues) -> Raw`` over a batched view (U, w[, m]) and
``predict(view, now, ue_id)``, the batch of one. Python runs per distinct (serving, previous)
cell pair, per distinct serving cell with handover places and per UE that needs an NRT lookup;
the rest is array work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from xapp.predict.a3 import A3Forecaster, forecast_batch, resolve_cells
from xapp.predict.base import Calibrator, Prediction, StabiliserBank
from xapp.predict.config import PredictorConfig
from xapp.predict.cvh import CVHPredictor, PlacesPredictor, cvh_batch, motion_batch, places_batch
from xapp.predict.maps import Knowledge, TransitionModel
from xapp.tracks import MeasurementReport, TrackStore, TrackView, UETrack, batch_of_one

#: ``Raw.source`` / ``Predictions.source`` codes
SOURCES = ("a3", "cvh", "places", "history", "combined:a3", "combined:places", "combined:cvh", "combined:history",
           "combined:dwell")
_SRC = {s: i for i, s in enumerate(SOURCES)}
#: how many ranked candidate targets the combination hands on per UE
TOP_K = 3


@dataclass
class Raw:
    """Raw predictions of U UEs (arrays of shape (U,)): whether there is one, target cell (-1
    unresolved), target PCI (-1), t_HO (s, NaN none), calibrated confidence, source code
    (index into ``SOURCES``) and serving cell."""

    has: np.ndarray
    cell: np.ndarray
    pci: np.ndarray
    t_ho: np.ndarray
    conf: np.ndarray
    src: np.ndarray
    serving: np.ndarray
    #: ranked candidate targets (U, TOP_K), -1 padding, the first the target above; their
    #: probabilities (U, TOP_K), 0 padding. None: the predictor ranks no candidates.
    cand_cell: np.ndarray | None = field(default=None, kw_only=True)
    cand_p: np.ndarray | None = field(default=None, kw_only=True)
    #: the candidates' raw shares (U, TOP_K) before calibration (what a calibration is fitted on)
    cand_raw: np.ndarray | None = field(default=None, kw_only=True)

    @classmethod
    def of(cls, has, cell, t_ho, conf, src: int | np.ndarray, serving, pci=None) -> "Raw":
        U = len(has)
        return cls(has, np.where(has, cell, -1), np.full(U, -1, np.int64) if pci is None else np.where(has, pci, -1),
                   np.where(has, t_ho, np.nan), np.where(has, conf, 0.0),
                   np.broadcast_to(np.asarray(src, np.int16), (U,)).copy(), serving)

    def one(self, i: int = 0) -> Prediction | None:
        if not self.has[i]:
            return None
        return Prediction(int(self.cell[i]), float(self.t_ho[i]), float(self.conf[i]), SOURCES[int(self.src[i])],
                          int(self.pci[i]), int(self.serving[i]), candidates=_cands(self, i))


@dataclass
class Predictions(Raw):
    """Reported (stabilised) predictions of U UEs: the arrays of ``Raw`` (``has`` False: no
    prediction reported for that UE) plus ``ue_ids`` and ``flips`` (U,)."""

    ue_ids: list[str]
    flips: np.ndarray

    def __len__(self) -> int:
        return len(self.ue_ids)

    def get(self, i: int) -> Prediction | None:
        """UE ``i``'s prediction as a ``Prediction`` (None if none is reported)."""
        if not self.has[i]:
            return None
        return Prediction(int(self.cell[i]), float(self.t_ho[i]), float(self.conf[i]), SOURCES[int(self.src[i])],
                          int(self.pci[i]), int(self.serving[i]), int(self.flips[i]), candidates=_cands(self, i))

    def to_dict(self) -> dict[str, Prediction]:
        """{UE id: Prediction} of the UEs with one."""
        return {self.ue_ids[i]: self.get(i) for i in np.flatnonzero(self.has).tolist()}  # type: ignore[misc]


def _cands(r: Raw, i: int) -> tuple[tuple[int, float], ...]:
    """UE ``i``'s ranked (cell, probability) candidates of ``r`` (empty if none ranked)."""
    if r.cand_cell is None:
        return ()
    return tuple((int(c), float(p)) for c, p in zip(r.cand_cell[i].tolist(), r.cand_p[i].tolist()) if c >= 0)


def rank_candidates(cells: np.ndarray, ok: np.ndarray, score: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best distinct cells per row. ``cells`` (U, n) int, ``ok`` (U, n) bool (the
    column holds a candidate), ``score`` (U, n) float (a cell repeated across columns carries
    the same score in each). Returns (cells (U, k), -1 padding; scores (U, k), 0 padding), best
    first, equal scores in column order."""
    U, n = cells.shape
    dup = np.zeros((U, n), bool)
    for j in range(1, n):
        dup[:, j] = (ok[:, :j] & (cells[:, :j] == cells[:, j:j + 1])).any(axis=1)
    use = ok & ~dup & (cells >= 0)
    key = np.where(use, score, -np.inf)
    order = np.argsort(-key, axis=1, kind="stable")[:, :k]
    rows = np.arange(U)[:, None]
    got = use[rows, order]
    out_c = np.where(got, cells[rows, order], -1)
    out_s = np.where(got, score[rows, order], 0.0)
    if out_c.shape[1] < k:
        pad = k - out_c.shape[1]
        out_c = np.concatenate([out_c, np.full((U, pad), -1, np.int64)], 1)
        out_s = np.concatenate([out_s, np.zeros((U, pad))], 1)
    return out_c, out_s


def put_first(cells: np.ndarray, probs: np.ndarray, first: np.ndarray, first_p: np.ndarray,
              has: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranked lists (U, k) with ``first`` (U,) made rank 1 where ``has`` (U,): moved up if it
    is in the list (its probability becomes ``first_p``), else put in front (the last one
    drops). Rows without ``has`` are returned empty (-1, 0). The reported target (hysteresis
    may hold one that is not the best this instant) leads the candidates the scheduler gets."""
    U, k = cells.shape
    at = cells == first[:, None]
    inlist = at.any(axis=1)
    # rank of every other entry: shift right by one up to where ``first`` was (or to the end)
    pos = np.where(inlist, np.argmax(at, axis=1), k - 1)
    j = np.arange(k)[None, :]
    src = np.where(j == 0, 0, np.where(j <= pos[:, None], j - 1, j))
    rows = np.arange(U)[:, None]
    oc = np.where(j == 0, first[:, None], cells[rows, src])
    op = np.where(j == 0, first_p[:, None], probs[rows, src])
    oc = np.where(has[:, None], oc, -1)
    op = np.where(has[:, None] & (oc >= 0), op, 0.0)
    return oc, op


def unique_pairs(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of an integer array of pairs (P, 2), sorted (by the first column, then
    the second), and each row's index into them (P,): what ``np.unique(pairs, axis=0,
    return_inverse=True)`` gives, by one lexsort (np.unique over rows views them as structured
    records: about 0.1 ms for 10 rows and 0.5 ms for 250, every control cycle)."""
    pairs = np.asarray(pairs)
    if len(pairs) == 0:
        return pairs.reshape(0, 2), np.zeros(0, np.int64)
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    sp = pairs[order]
    new = np.empty(len(sp), dtype=bool)
    new[0] = True
    new[1:] = (sp[1:, 0] != sp[:-1, 0]) | (sp[1:, 1] != sp[:-1, 1])
    inv = np.empty(len(sp), dtype=np.int64)
    inv[order] = np.cumsum(new) - 1
    return sp[new], inv


def last_change(v: TrackView) -> np.ndarray:
    """Per UE of a batched view (U, w): the column k of the last serving-cell change in the
    window (reports k and k + 1, both valid, name different cells), else -1."""
    s = v.serving_cell
    valid = ~np.isnan(v.time)
    ch = (s[:, 1:] != s[:, :-1]) & valid[:, :-1] & valid[:, 1:]
    return np.where(ch, np.arange(s.shape[1] - 1), -1).max(axis=1, initial=-1)


def previous_cells(v: TrackView) -> np.ndarray:
    """Per UE of a batched view (U, w): the cell served before the current one if the window
    contains the change, else -1."""
    k = last_change(v)
    return np.where(k >= 0, v.serving_cell[np.arange(len(k)), np.maximum(k, 0)], -1)


def previous_cell_in_view(view: TrackView) -> int:
    """The cell served before the current one, if the (one-UE) view contains the change; else -1."""
    return int(previous_cells(batch_of_one(view))[0]) if len(view.time) else -1


def _now(now: float | np.ndarray, U: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(now, dtype=np.float64), (U,)).copy()


class HistoryPredictor:
    """Most likely successor P(B | serving A, previous C); t_ho NaN. See the module doc."""

    name = "history"

    def __init__(self, trans: TransitionModel, knowledge: Knowledge | None = None,
                 calibrator: Calibrator | None = None, order: int = 2) -> None:
        self.trans = trans
        self.knowledge = knowledge
        self.calibrator = calibrator or Calibrator()
        #: how many cells of the UE's route (the serving one included) condition the successor
        #: table: 2 = (previous, serving); more take the knowledge's online route of the UE
        #: (``TransitionModel.probs_route``), Python per UE
        self.order = order

    def previous(self, v: TrackView, ues: Sequence[str]) -> np.ndarray:
        """Per UE (U,): the cell served before the current one, from the view's window, else the
        knowledge's online record; -1 unknown."""
        prev = previous_cells(v)
        if self.knowledge is not None and ues:
            miss = np.flatnonzero(prev < 0)
            if miss.size:
                pc = self.knowledge.previous_cell
                prev[miss] = [pc(ues[i]) if ues[i] else -1 for i in miss.tolist()]
        return prev

    def pairs(self, v: TrackView, ues: Sequence[str], prev: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The distinct (serving A, previous C) pairs of the batch (P, 2) and each UE's pair (U,)
        (``prev``: the UEs' previous cells if already known, ``previous``)."""
        if prev is None:
            prev = self.previous(v, ues)
        pairs = np.stack([v.serving_cell[:, -1], prev], 1)
        if len(pairs) <= 1:                      # one UE (the per-UE API): nothing to merge
            return pairs, np.zeros(len(pairs), np.int64)
        return unique_pairs(pairs)

    def routes(self, v: TrackView, ues: Sequence[str], prev: np.ndarray | None = None
               ) -> tuple[list[tuple[int, ...]], np.ndarray]:
        """The distinct routes of the batch that condition the successor tables (oldest cell
        first, the serving one last: (C, A), or (A,) with no previous cell, or up to ``order``
        cells from the knowledge's online route where it ends with the serving and previous
        cells) and each UE's index into them (U,)."""
        if prev is None:
            prev = self.previous(v, ues)
        sc = v.serving_cell[:, -1]
        if self.order <= 2 or self.knowledge is None or not ues:
            uniq, inv = self.pairs(v, ues, prev)
            return [(c, a) if c >= 0 else (a,) for a, c in uniq.tolist()], inv
        kr = self.knowledge.route
        ids: dict[tuple[int, ...], int] = {}
        inv = np.empty(len(sc), np.int64)
        for i, (a, c) in enumerate(zip(sc.tolist(), prev.tolist())):
            r = kr(ues[i]) if ues[i] else ()
            if len(r) >= 3 and r[-1] == a and r[-2] == c:
                key = r[-self.order:]
            else:
                key = (c, a) if c >= 0 else (a,)
            inv[i] = ids.setdefault(key, len(ids))
        return list(ids), inv

    def _tables(self, v: TrackView, ues: Sequence[str], prev: np.ndarray | None = None
                ) -> tuple[list[dict[int, float]], np.ndarray]:
        keys, inv = self.routes(v, ues, prev)
        pr = self.trans.probs_route
        return [pr(k) for k in keys], inv

    def tables(self, v: TrackView, ues: Sequence[str]) -> list[dict[int, float]]:
        """Per UE, {B: P(B | A, C[, the cells before])} (shared, read-only dicts; one
        computation per distinct route)."""
        tabs, inv = self._tables(v, ues)
        return [tabs[k] for k in inv.tolist()]

    def summary(self, v: TrackView, ues: Sequence[str], prev: np.ndarray | None = None) -> "_Summary":
        """The successor tables of the batch summarised (``_Summary``), Python per distinct
        route only."""
        tabs, inv = self._tables(v, ues, prev)
        return _Summary.of(tabs, inv)

    def probs(self, view: TrackView, ue_id: str = "") -> dict[int, float]:
        return dict(self.tables(batch_of_one(view), [ue_id])[0])

    def batch(self, v: TrackView, now: np.ndarray, ues: Sequence[str]) -> Raw:
        best = self.summary(v, ues)
        U = len(best.n)
        has = best.n > 0
        return Raw.of(has, best.cell, np.full(U, np.nan), self.calibrator(best.p), _SRC["history"],
                      v.serving_cell[:, -1])

    def predict(self, view: TrackView, now: float, ue_id: str = "") -> Prediction | None:
        if len(view.time) == 0:
            return None
        return self.batch(batch_of_one(view), _now(now, 1), [ue_id]).one()


@dataclass
class _Summary:
    """Per UE, of its successor table: the first most likely cell, its probability, the sum
    of the probabilities and the count; plus a lookup of (table, cell) -> (probability,
    position in the table's order) for the combination."""

    cell: np.ndarray
    p: np.ndarray
    total: np.ndarray
    n: np.ndarray
    tid: np.ndarray
    codes: np.ndarray
    probs: np.ndarray
    pos: np.ndarray
    top_cell: np.ndarray = None       # (U, TOP_K) the table's most likely cells, -1 padding
    top_p: np.ndarray = None          # (U, TOP_K) their probabilities, 0 padding

    @classmethod
    def of(cls, tabs: list[dict[int, float]], inv: np.ndarray | None = None) -> "_Summary":
        """Of per-UE tables, or (``inv`` given) of distinct tables and each UE's index into them."""
        if inv is not None:
            base = cls.of(tabs)
            return cls(base.cell[inv], base.p[inv], base.total[inv], base.n[inv], base.tid[inv], base.codes,
                       base.probs, base.pos, base.top_cell[inv], base.top_p[inv])
        ids: dict[int, int] = {}
        rows: list[tuple[int, float, float, int]] = []
        codes: list[int] = []
        probs: list[float] = []
        pos: list[int] = []
        tid = np.empty(len(tabs), np.int64)
        tops: list[list[tuple[int, float]]] = []
        for u, t in enumerate(tabs):
            k = ids.get(id(t))
            if k is None:
                k = ids[id(t)] = len(rows)
                # the TOP_K most likely, ties in the table's order (sorted is stable)
                tops.append(sorted(t.items(), key=lambda kv: -kv[1])[:TOP_K] if t else [])
                if t:
                    b, pb = max(t.items(), key=lambda kv: kv[1])
                    rows.append((b, pb, sum(t.values()), len(t)))
                    for q, (c, p) in enumerate(t.items()):
                        codes.append((k << 37) + c)
                        probs.append(p)
                        pos.append(q)
                else:
                    rows.append((-1, 0.0, 0.0, 0))
            tid[u] = k
        r = np.array(rows, dtype=np.float64).reshape(-1, 4)
        order = np.argsort(np.array(codes, np.int64), kind="stable")
        tc = np.full((len(tops), TOP_K), -1, np.int64)
        tp = np.zeros((len(tops), TOP_K))
        for k, top in enumerate(tops):
            for j, (c, p) in enumerate(top):
                tc[k, j], tp[k, j] = c, p
        return cls(r[tid, 0].astype(np.int64), r[tid, 1], r[tid, 2], r[tid, 3].astype(np.int64), tid,
                   np.array(codes, np.int64)[order], np.array(probs)[order], np.array(pos, np.int64)[order],
                   tc[tid], tp[tid])

    def lookup(self, cell: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(in the UE's table, probability, position) of ``cell`` (U,) in each UE's table."""
        code = (self.tid << 37) + np.maximum(cell, 0)
        i = np.minimum(np.searchsorted(self.codes, code), max(len(self.codes) - 1, 0))
        if len(self.codes) == 0:
            return np.zeros(len(cell), bool), np.zeros(len(cell)), np.zeros(len(cell), np.int64)
        hit = (self.codes[i] == code) & (cell >= 0)
        return hit, np.where(hit, self.probs[i], 0.0), np.where(hit, self.pos[i], 0)


class CombinedPredictor:
    """Fuses the predictors and says which one spoke (``Prediction.source``).

    Target: argmax over cells B of P_hist(B | A, C[, the cells before: ``HistoryPredictor.order``])
    + w_cvh s_cvh [B = CVH target] + w_places s_places [B = places target] + w_a3 s_a3 [B = A3
    target] + w_return p_return(elapsed) [B = C], the s being the predictors' raw scores (A3 only
    when its neighbour resolves to a cell id, and, unless nothing else votes, only when its
    handover is due within ``a3_trust_s``: further ahead its forecasts flip between neighbours;
    the return vote only in the first ``return_max_s`` seconds on A, p_return the learned odds of
    going back to the previous cell C after that long on a cell, ``maps.ReturnModel``); ties go
    to the cell named first (successor table order, then CVH, places, A3, the return).
    Time, first that applies: A3 for that target when due within ``a3_trust_s`` (0.4 s, about
    TTT + HO delay: the entry condition already holds, the most exact clock); the handover place ahead for that
    target (if its score reaches ``places_time_min_score``); A3 for that target, or for an
    anonymous neighbour if ``time_from_anonymous_a3``; CVH for that target if ``time_from_cvh``
    (off by default: its area-exit times raised many false alarms on both data sets); the
    learned dwell on the serving cell before that target if ``time_from_dwell`` (the time the
    cell began serving the UE plus the median dwell of that pair, ``maps.DwellModel``, at least
    ``dwell_min_lead_s`` ahead); else no time (the target alone, from history).
    ``source`` = ``combined:<time source>``.
    """

    name = "combined"

    def __init__(self, a3: A3Forecaster, cvh: CVHPredictor, places: PlacesPredictor, hist: HistoryPredictor,
                 w_cvh: float = 0.5, w_places: float = 3.0, w_a3: float = 2.0, a3_trust_s: float = 0.4,
                 calibrator: Calibrator | None = None, time_from_anonymous_a3: bool = True,
                 time_from_cvh: bool = False, places_time_min_score: float = 0.0,
                 time_from_dwell: bool = False, dwell_min_lead_s: float = 0.5, dwell_residual: bool = False,
                 dwell_edge: bool = False, dwell_edge_margin_db: float = 3.0,
                 dwell_edge_slope_db_s: float = 0.5, places_edge: bool = False, w_return: float = 0.0,
                 return_max_s: float = 6.0) -> None:
        self.places_edge = places_edge
        self.w_return, self.return_max_s = w_return, return_max_s
        self.a3, self.cvh, self.places, self.hist = a3, cvh, places, hist
        self.time_from_dwell, self.dwell_min_lead_s = time_from_dwell, dwell_min_lead_s
        self.dwell_residual, self.dwell_edge = dwell_residual, dwell_edge
        self.dwell_edge_margin_db, self.dwell_edge_slope_db_s = dwell_edge_margin_db, dwell_edge_slope_db_s
        self.w_cvh, self.w_places, self.w_a3, self.a3_trust_s = w_cvh, w_places, w_a3, a3_trust_s
        self.time_from_anonymous_a3 = time_from_anonymous_a3
        self.time_from_cvh = time_from_cvh
        self.places_time_min_score = places_time_min_score
        self.calibrator = calibrator or Calibrator()
        #: calibrators of the candidates' shares at ranks 2..TOP_K (rank 1 takes ``calibrator``)
        self.rank_calibrators = [self.calibrator] + [Calibrator() for _ in range(TOP_K - 1)]

    def sources(self, v: TrackView, now: np.ndarray, ues: Sequence[str]) -> "_Sources":
        """Every source over the batch, computed once: the A3 forecast (with its resolved
        cells), CVH, the handover places (one dead-reckoning shared by both) and the successor
        tables."""
        sc = v.serving_cell[:, -1]
        f = forecast_batch(v, now, self.a3.cfg)
        a3_cell = resolve_cells(self.a3.nrt, sc, f.pci, f.cell, f.has)
        mo = motion_batch(v, self.cvh.assoc, self.cvh.cfg)
        pl = places_batch(v, now, self.places.assoc, self.places.places, self.places.cfg, mo)
        cv = cvh_batch(v, now, self.cvh.assoc, self.cvh.cfg, mo)
        edge = f.has | edge_evidence(v, now, self.a3.cfg.window_s, self.a3.cfg.offset_db + self.a3.cfg.hysteresis_db
                                     - self.dwell_edge_margin_db, self.dwell_edge_slope_db_s)
        prev = self.hist.previous(v, ues)
        entered = self._entered(v, ues)
        return _Sources(sc, f, a3_cell, pl, cv, self.hist.summary(v, ues, prev), entered, edge, prev,
                        self._p_return(prev, now - entered))

    def _p_return(self, prev: np.ndarray, elapsed: np.ndarray) -> np.ndarray:
        """Per UE (U,): the learned odds that the next handover returns to the previous cell
        (``maps.ReturnModel``) while the time spent on the serving cell is under
        ``return_max_s``; 0 where the return vote is off, the previous cell or the entry time is
        unknown, or there is no knowledge."""
        kn = self.hist.knowledge
        U = len(prev)
        if self.w_return <= 0 or kn is None or U == 0:
            return np.zeros(U)
        use = (prev >= 0) & np.isfinite(elapsed) & (elapsed < self.return_max_s)
        if not use.any():
            return np.zeros(U)
        p = kn.returns.p_return(np.where(use, elapsed, 0.0))
        return np.where(use, np.nan_to_num(p, nan=0.0), 0.0)

    def _entered(self, v: TrackView, ues: Sequence[str]) -> np.ndarray:
        """Per UE (U,): when its serving cell began serving it, s (trace clock): the last change
        of the view's window (midpoint of the two reports), else the knowledge's online record,
        else NaN."""
        t = v.time
        k = last_change(v)
        rows = np.arange(len(k))
        kk = np.maximum(k, 0)
        out = np.where(k >= 0, 0.5 * (t[rows, kk] + t[rows, np.minimum(kk + 1, t.shape[1] - 1)]), np.nan)
        kn = self.hist.knowledge
        if kn is not None and ues:
            for i in np.flatnonzero(k < 0).tolist():
                if ues[i]:
                    out[i] = kn.entered(ues[i])
        return out

    def modes(self, v: TrackView, now: np.ndarray, ues: Sequence[str], modes: Sequence[str]) -> dict[str, Raw]:
        """The raw output of each of ``modes`` ('a3', 'cvh', 'places', 'history', 'combined')
        from one computation of the sources: the values each mode's own ``batch`` gives (each
        source with its predictor's calibrator), at the cost of one combined batch."""
        src = self.sources(v, now, ues)
        out: dict[str, Raw] = {}
        for m in modes:
            if m == "a3":
                f = src.f
                out[m] = Raw.of(f.has, src.a3_cell, f.t_ho, self.a3.calibrator(f.score), _SRC["a3"], src.sc, f.pci)
            elif m in ("cvh", "places"):
                cr, p = (src.cv, self.cvh) if m == "cvh" else (src.pl, self.places)
                out[m] = Raw.of(cr.has, cr.cell, cr.t_ho, p.calibrator(cr.score), _SRC[m], src.sc)
            elif m == "history":
                h = src.h
                out[m] = Raw.of(h.n > 0, h.cell, np.full(len(h.n), np.nan), self.hist.calibrator(h.p),
                                _SRC["history"], src.sc)
            elif m == "combined":
                out[m] = self.combine(src, now)
            else:
                raise ValueError(f"unknown predictor mode {m!r}")
        return out

    def batch(self, v: TrackView, now: np.ndarray, ues: Sequence[str]) -> Raw:
        return self.combine(self.sources(v, now, ues), now)

    def combine(self, src: "_Sources", now: np.ndarray) -> Raw:
        """The combination (class doc) of the sources of a batch."""
        sc, f, a3_cell, pl, cv, h = src.sc, src.f, src.a3_cell, src.pl, src.cv, src.h
        U = len(sc)
        empty = (h.n == 0) & ~cv.has & ~pl.has
        a3v = f.has & (a3_cell >= 0) & ((f.t_ho - now <= self.a3_trust_s) | empty)
        # the candidates: the table's first best cell, then the voted cells (CVH, places, A3, the
        # previous cell's return vote)
        vcell = [cv.cell, pl.cell, a3_cell, src.prev]
        vok = [cv.has, pl.has, a3v, src.p_ret > 0]
        vval = [self.w_cvh * cv.score, self.w_places * pl.score, self.w_a3 * f.score, self.w_return * src.p_ret]
        nv = len(vcell)
        cells, ok, base, pos = [h.cell], [h.n > 0], [h.p], [np.zeros(U, np.int64)]
        for j in range(nv):
            hit, p, q = h.lookup(vcell[j])
            first_new = np.full(U, j)
            for k in range(j - 1, -1, -1):
                first_new = np.where(vok[k] & (vcell[k] == vcell[j]), k, first_new)
            cells.append(vcell[j])
            ok.append(vok[j])
            base.append(p)
            pos.append(np.where(hit, q, h.n + first_new))
        # the best cell's position in the table is that of its first best entry
        hit0, _, q0 = h.lookup(h.cell)
        pos[0] = np.where(hit0, q0, 0)
        C = np.stack(cells, 1)
        S = np.stack(base, 1)
        for j in range(nv):
            S = S + np.where(vok[j][:, None] & (C == vcell[j][:, None]), vval[j][:, None], 0.0)
        OK = np.stack(ok, 1)
        S = np.where(OK, S, -np.inf)
        mx = S.max(axis=1)
        k = np.argmin(np.where(S == mx[:, None], np.stack(pos, 1), np.iinfo(np.int64).max), axis=1)
        rows = np.arange(U)
        has = OK.any(axis=1)
        target = np.where(has, C[rows, k], -1)
        total = h.total + sum(np.where(vok[j], vval[j], 0.0) for j in range(nv))
        with np.errstate(invalid="ignore", divide="ignore"):
            conf = self.calibrator(np.where(total > 0, mx / np.where(total > 0, total, 1.0), 0.0))
        a3_is = f.has & (a3_cell == target)
        t1 = a3_is & (f.t_ho - now <= self.a3_trust_s)
        t2 = ~t1 & pl.has & (pl.cell == target) & (pl.score >= self.places_time_min_score)
        if self.places_edge:
            t2 &= src.edge
        anon = self.time_from_anonymous_a3 & f.has & (a3_cell < 0) & (f.pci < 0)
        t3 = ~t1 & ~t2 & (a3_is | anon)
        t4 = ~t1 & ~t2 & ~t3 & self.time_from_cvh & cv.has & (cv.cell == target)
        t5 = ~t1 & ~t2 & ~t3 & ~t4 & has & self.time_from_dwell
        if self.dwell_edge:
            t5 &= src.edge
        t_dw = self._dwell_t_ho(src, target, now, t5)
        t5 &= np.isfinite(t_dw)
        t_ho = np.select([t1, t2, t3, t4, t5], [f.t_ho, pl.t_ho, f.t_ho, cv.t_ho, t_dw], np.nan)
        src = np.select([t1 | t3, t2, t4, t5], [_SRC["combined:a3"], _SRC["combined:places"], _SRC["combined:cvh"],
                                                _SRC["combined:dwell"]], _SRC["combined:history"])
        out = Raw.of(has, target, t_ho, conf, src, sc, np.where(a3_is, f.pci, -1))
        # ranked candidates: the table's TOP_K cells and the voted cells, each scored as the
        # target is (successor probability + the votes it gets), as a share of the total
        tc, tp = h.top_cell, h.top_p
        cols_c = [tc[:, j] for j in range(TOP_K)] + vcell
        cols_ok = [tc[:, j] >= 0 for j in range(TOP_K)] + vok
        cols_b = [tp[:, j] for j in range(TOP_K)] + base[1:]
        Cc = np.stack(cols_c, 1)
        Sc = np.stack(cols_b, 1)
        for j in range(nv):
            Sc = Sc + np.where(vok[j][:, None] & (Cc == vcell[j][:, None]), vval[j][:, None], 0.0)
        rc, rs = rank_candidates(Cc, np.stack(cols_ok, 1), Sc, TOP_K)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(total[:, None] > 0, rs / np.where(total > 0, total, 1.0)[:, None], 0.0)
        cp = np.stack([self.rank_calibrators[j](share[:, j]) for j in range(TOP_K)], 1)
        out.cand_cell, out.cand_p = put_first(rc, np.where(rc >= 0, cp, 0.0), target, conf, has)
        out.cand_raw = np.where(out.cand_cell >= 0, put_first(rc, share, target,
                                                              np.where(total > 0, mx / np.where(total > 0, total, 1.0), 0.0),
                                                              has)[1], 0.0)
        return out

    def _dwell_t_ho(self, src: "_Sources", target: np.ndarray, now: np.ndarray,
                    want: np.ndarray) -> np.ndarray:
        """Per UE (U,): entry time + median learned dwell of (serving, target), at least
        ``dwell_min_lead_s`` after ``now``, s; NaN where ``want`` (U,) bool is False, the target
        is -1, or the entry or every dwell is unknown. The dwell model is asked once per distinct
        (serving, target) pair among the wanted rows (this runs in every batched cycle)."""
        U = len(target)
        out = np.full(U, np.nan)
        kn = self.hist.knowledge
        rows = np.flatnonzero(want & (target >= 0) & np.isfinite(src.entered))
        if kn is None or not len(rows):
            return out
        pairs, inv = unique_pairs(np.stack([src.sc[rows], target[rows]], 1))
        if self.dwell_residual:
            med = np.full(len(rows), np.nan)
            elapsed = now[rows] - src.entered[rows]
            for q, (a, b) in enumerate(pairs.tolist()):
                sel = inv == q
                med[sel] = kn.dwell.residual_median(int(a), int(b), elapsed[sel])
        else:
            med = np.array([kn.dwell.median(int(a), int(b)) for a, b in pairs.tolist()], dtype=np.float64)[inv]
        out[rows] = np.maximum(src.entered[rows] + med, now[rows] + self.dwell_min_lead_s)
        return out

    def predict(self, view: TrackView, now: float, ue_id: str = "") -> Prediction | None:
        if len(view.time) == 0:
            return None
        return self.batch(batch_of_one(view), _now(now, 1), [ue_id]).one()


@dataclass
class _Sources:
    """What ``CombinedPredictor.sources`` computed for a batch of U UEs: serving cells, A3
    forecast and its resolved cells, handover places, CVH crossings, successor summary."""

    sc: np.ndarray
    f: object
    a3_cell: np.ndarray
    pl: object
    cv: object
    h: _Summary
    entered: np.ndarray
    edge: np.ndarray
    prev: np.ndarray             # (U,) the cell served before the current one, -1 unknown
    p_ret: np.ndarray            # (U,) the return vote's odds (0: no vote), ``_p_return``


def edge_evidence(v: TrackView, now: np.ndarray, window_s: float, min_gap_db: float,
                  min_fall_db_s: float) -> np.ndarray:
    """Per UE of a batched view (U, w[, m]) at ``now`` (U,): whether its radio says it is near
    the serving cell's edge (bool (U,)): a neighbour of the newest report within reach of the
    A3 entry (Mn - Mp >= ``min_gap_db``, dB: the entry threshold Off + Hys less a margin), or
    the serving RSRP falling at least ``min_fall_db_s`` dB/s (least-squares slope over the
    reports of the last ``window_s`` s on the current serving cell, at least 3 of them). NaN
    RSRPs count as no evidence. The dwell-time source gives a time only with it (a learned
    dwell alone does not say the UE is about to leave)."""
    U = len(now)
    if U == 0:
        return np.zeros(0, bool)
    srv = v.rsrp_dbm.astype(np.float64)
    with np.errstate(invalid="ignore"):
        near = np.zeros(U, bool)
        if v.nb_rsrp_dbm.ndim == 3 and v.nb_rsrp_dbm.shape[2]:
            gap = v.nb_rsrp_dbm[:, -1, :].astype(np.float64) - srv[:, -1, None]
            near = (gap >= min_gap_db).any(axis=1)
        sc = v.serving_cell[:, -1]
        t = v.time
        ok = (t >= (now - window_s)[:, None]) & (v.serving_cell == sc[:, None]) & np.isfinite(srv) & np.isfinite(t)
        # rows after the last other serving cell only
        ar = np.arange(t.shape[1])
        last_other = np.where(v.serving_cell != sc[:, None], ar, -1).max(axis=1)
        ok &= ar[None, :] > last_other[:, None]
        n = ok.sum(axis=1)
        tt = np.where(ok, t - now[:, None], 0.0)
        yy = np.where(ok, srv, 0.0)
        nn = np.maximum(n, 1)
        mt, my = tt.sum(axis=1) / nn, yy.sum(axis=1) / nn
        dt = np.where(ok, tt - mt[:, None], 0.0)
        sxx = (dt * dt).sum(axis=1)
        slope = np.where(sxx > 1e-9, (dt * (yy - my[:, None])).sum(axis=1) / np.where(sxx > 1e-9, sxx, 1.0), 0.0)
        falling = (n >= 3) & (slope <= -min_fall_db_s)
    return near | falling


def _a3_batch(a3: A3Forecaster, v: TrackView, now: np.ndarray, ues: Sequence[str]) -> Raw:
    sc = v.serving_cell[:, -1]
    f = forecast_batch(v, now, a3.cfg)
    cell = resolve_cells(a3.nrt, sc, f.pci, f.cell, f.has)
    return Raw.of(f.has, cell, f.t_ho, a3.calibrator(f.score), _SRC["a3"], sc, f.pci)


def _crossing_batch(p: CVHPredictor | PlacesPredictor, v: TrackView, now: np.ndarray, ues: Sequence[str]) -> Raw:
    if isinstance(p, PlacesPredictor):
        cr = places_batch(v, now, p.assoc, p.places, p.cfg)
    else:
        cr = cvh_batch(v, now, p.assoc, p.cfg)
    return Raw.of(cr.has, cr.cell, cr.t_ho, p.calibrator(cr.score), _SRC[p.name], v.serving_cell[:, -1])


class HandoverPredictor:
    """What the xApp calls: learned knowledge + configured predictor + per-UE hysteresis.

    ``observe(report)`` for every report that enters the TrackStore (online learning of the
    association map, successor counts and the NRT); ``update(store)`` once per control cycle:
    the predictions of the UEs whose tracks got reports since the last call, each made as of
    its newest report (``now`` = that report's time, as ``evaluate`` scores it), in one batch;
    ``predict(track, now)`` for one UE; ``predict_all(store, now)`` for all.
    ``forget(ue)`` frees a UE's state (it left). Predictions below ``cfg.min_confidence`` are
    dropped. ``calibrators`` maps a mode name to a ``Calibrator`` (or its ``to_dict`` form, as
    saved by ``python -m pallas_tools.evaluate --save-calibration``) so that confidences are
    calibrated; ``combined@2`` and ``combined@3`` calibrate the combination's second and third
    candidates (``Prediction.candidates``; ``combined`` the first).
    """

    def __init__(self, cfg: PredictorConfig | None = None, knowledge: Knowledge | None = None,
                 calibrators: dict[str, Calibrator | dict] | None = None, learn_online: bool = True) -> None:
        self.cfg = cfg = cfg or PredictorConfig()
        self.knowledge = knowledge or Knowledge.create(cfg.cvh.tile_m, cfg.history.smoothing,
                                                       cfg.history.backoff_weight)
        self.learn_online = learn_online
        cal = {m: (c if isinstance(c, Calibrator) else Calibrator.from_dict(c)) for m, c in (calibrators or {}).items()}
        k = self.knowledge
        self.a3 = A3Forecaster(cfg.a3, k.nrt, cal.get("a3"))
        self.cvh = CVHPredictor(cfg.cvh, k.assoc, cal.get("cvh"))
        self.places = PlacesPredictor(cfg.cvh, k.places, k.assoc, cal.get("places"))
        self.history = HistoryPredictor(k.trans, k, cal.get("history"), cfg.history.order)
        self.combined = CombinedPredictor(self.a3, self.cvh, self.places, self.history, cfg.w_cvh, cfg.w_places,
                                          calibrator=cal.get("combined"),
                                          time_from_anonymous_a3=cfg.time_from_anonymous_a3,
                                          time_from_cvh=cfg.time_from_cvh,
                                          places_time_min_score=cfg.places_time_min_score,
                                          time_from_dwell=cfg.time_from_dwell,
                                          dwell_min_lead_s=cfg.dwell_min_lead_s,
                                          dwell_residual=cfg.dwell_residual, dwell_edge=cfg.dwell_edge,
                                          dwell_edge_margin_db=cfg.dwell_edge_margin_db,
                                          dwell_edge_slope_db_s=cfg.dwell_edge_slope_db_s,
                                          places_edge=cfg.places_edge, w_return=cfg.w_return,
                                          return_max_s=cfg.return_max_s)
        self.combined.rank_calibrators[1:] = [cal.get(f"combined@{j + 1}", Calibrator()) for j in range(1, TOP_K)]
        self.active = {"a3": self.a3, "cvh": self.cvh, "places": self.places, "history": self.history,
                       "combined": self.combined}[cfg.mode]
        self._rows: dict[str, int] = {}          # UE id -> row of the stabiliser bank
        self._free: list[int] = []
        self._bank = StabiliserBank(cfg.stability, 64)

    # ------------------------------------------------------------------ per-UE state
    def _row_of(self, ues: Sequence[str]) -> np.ndarray:
        rows = self._rows
        out = np.empty(len(ues), np.int64)
        for i, u in enumerate(ues):
            r = rows.get(u)
            if r is None:
                if self._free:
                    r = self._free.pop()
                else:
                    r = len(rows)
                    if r >= self._bank.size:
                        self._bank.grow(2 * self._bank.size)
                rows[u] = r
            out[i] = r
        return out

    def forget(self, ue_id: str) -> None:
        """Free a UE's hysteresis and online-learning state (the UE left or went silent)."""
        r = self._rows.pop(ue_id, None)
        if r is not None:
            self._bank.reset(r)
            self._free.append(r)
        self.knowledge.forget(ue_id)

    @property
    def ues(self) -> int:
        """UEs with hysteresis state."""
        return len(self._rows)

    def observe(self, r: MeasurementReport) -> None:
        """Online learning from a report (call once per report, in time order per UE)."""
        if self.learn_online:
            self.knowledge.observe(r)

    # ------------------------------------------------------------------ prediction
    def raw_batch(self, v: TrackView, now: np.ndarray, ues: Sequence[str]) -> Raw:
        """The configured predictor's output before hysteresis for a batched view (U, w[, m])."""
        p = self.active
        if isinstance(p, A3Forecaster):
            return _a3_batch(p, v, now, ues)
        if isinstance(p, (CVHPredictor, PlacesPredictor)):
            return _crossing_batch(p, v, now, ues)
        return p.batch(v, now, ues)

    def raw(self, view: TrackView, now: float, ue_id: str = "") -> Prediction | None:
        """The configured predictor's output before hysteresis (one UE)."""
        if len(view.time) == 0:
            return None
        return self.raw_batch(batch_of_one(view), _now(now, 1), [ue_id]).one()

    def predict_views(self, v: TrackView, now: float | np.ndarray, ues: Sequence[str]) -> Predictions:
        """The reported (stabilised) predictions of the UEs ``ues`` (each once) whose windows
        are the batched view ``v`` (U, w[, m]), at ``now`` (s, one time or one per UE)."""
        now = _now(now, len(ues))
        return self.report(self.raw_batch(v, now, ues), now, ues)

    def report(self, raw: Raw, now: np.ndarray, ues: Sequence[str]) -> Predictions:
        """Raw predictions of ``ues`` (each once) at ``now`` (U,) through the confidence floor
        and each UE's hysteresis: what is reported (``predict_views`` is raw_batch + this)."""
        has = raw.has & (raw.conf >= self.cfg.min_confidence)
        idx = self._row_of(ues)
        rep = self._bank.update(idx, has, raw.cell, raw.pci, raw.t_ho, raw.conf, raw.src, now, raw.serving)
        a = self._bank.a
        out = Predictions(rep, a["rep_cell"][idx], a["rep_pci"][idx], a["rep_tho"][idx], a["rep_conf"][idx],
                          a["rep_src"][idx], a["rep_sc"][idx], ue_ids=list(ues), flips=a["flips"][idx])
        if raw.cand_cell is not None:
            # the reported (held) target leads the candidates, with its reported probability
            ok = rep & (out.cell >= 0)
            out.cand_cell, out.cand_p = put_first(raw.cand_cell, raw.cand_p, out.cell, out.conf, ok)
            if raw.cand_raw is not None:
                out.cand_raw = put_first(raw.cand_cell, raw.cand_raw, out.cell, np.full(len(ok), np.nan), ok)[1]
        return out

    _SCALARS = ("time", "serving_cell", "rsrp_dbm", "lat", "lon", "speed_mps", "heading_deg")
    _NEIGHBOURS = ("nb_pci", "nb_cell", "nb_rsrp_dbm")

    def _gather(self, store: TrackStore, slots: np.ndarray, now: float | None) -> tuple[TrackView, np.ndarray]:
        """The batched view the predictors read, and ``now`` per UE: the fields they use, the
        neighbours only over the rows within the A3 window (the rest is never read)."""
        v = store.window(slots, self.cfg.window_reports, self._SCALARS)
        nows = v.time[:, -1].copy() if now is None else _now(now, len(slots))
        if self.cfg.mode in ("a3", "combined") and len(slots):
            with np.errstate(invalid="ignore"):
                w = int((v.time >= (nows - self.cfg.a3.window_s)[:, None]).sum(axis=1).max())
            nb = store.window(slots, max(w, 1), self._NEIGHBOURS)
            v = v._replace(nb_pci=nb.nb_pci, nb_cell=nb.nb_cell, nb_rsrp_dbm=nb.nb_rsrp_dbm)
        return v, nows

    def update(self, store: TrackStore, now: float | None = None) -> Predictions:
        """Predictions of the UEs whose tracks got reports since the last call (one batch over
        their newest ``cfg.window_reports`` reports), each as of its newest report unless
        ``now`` is given."""
        slots = store.take_changed()
        v, nows = self._gather(store, slots, now)
        return self.predict_views(v, nows, store.ue_of(slots))

    def predict(self, track: UETrack | TrackView, now: float, ue_id: str | None = None) -> Prediction | None:
        """The reported (stabilised) prediction for one UE, or None.

        ``track`` is a UETrack (its newest ``cfg.window_reports`` reports are read) or a
        TrackView (then pass ``ue_id``).
        """
        if isinstance(track, UETrack):
            ue = track.ue_id
            view = track.view(last=self.cfg.window_reports)
        else:
            ue = ue_id or ""
            view = track
        if len(view.time) == 0:
            return None
        return self.predict_views(batch_of_one(view), now, [ue]).get(0)

    def predict_all(self, store: TrackStore | Iterable[UETrack], now: float) -> dict[str, Prediction]:
        """Predictions for every UE with a track at ``now``; UEs without a prediction are left out."""
        if isinstance(store, TrackStore):
            slots = store.held()
            slots = slots[store._a["n"][slots] > 0]
            v, nows = self._gather(store, slots, now)
            return self.predict_views(v, nows, store.ue_of(slots)).to_dict()
        out = {}
        for tr in store:
            if len(tr):
                p = self.predict(tr, now)
                if p is not None:
                    out[tr.ue_id] = p
        return out

    def flips(self, ue_id: str) -> int:
        """How many times this UE's reported target changed within a serving cell."""
        r = self._rows.get(ue_id)
        return int(self._bank.a["flips"][r]) if r is not None else 0
