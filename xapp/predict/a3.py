"""A3 forecasting: when will the TS 38.331 A3 entry condition have held for time-to-trigger?

TS 38.331 §5.5.4.4, event A3 (neighbour becomes offset better than SpCell), entering condition

    Mn + Ofn + Ocn - Hys > Mp + Ofp + Ocp + Off

with Mn, Mp the L3-filtered neighbour and serving RSRP (dBm). With the cell offsets folded into
``offset_db`` the condition is D = Mn - Mp > Off + Hys; the UE sends the report once it has held
for timeToTrigger (TTT) and the handover follows ``ho_delay_s`` later.

For each neighbour in the newest report (matched across the window by PCI, or by cell id, or,
for the drive data's single anonymous neighbour, by position in the report) the predictor fits
a robust line to D(t) over the last ``window_s`` seconds on the current serving cell (Theil-Sen,
``xapp.predict.base.theil_sen``) and takes

- condition already holding since t_enter:  t_HO = max(now, t_enter + TTT + delay), t_enter
  interpolated between the last report below and the first above the threshold
- closing at slope b > min_slope:           t_HO = now + (Off + Hys - D_fit(now)) / b + TTT + delay

if within ``horizon_s``; the neighbour with the earliest t_HO is the target. Its PCI resolves
to a cell id through the neighbour relation table (``maps.NeighbourRelations``); if it cannot,
the prediction carries the PCI and target_cell -1.

All of it is array work over a batch of UEs (``forecast_batch``: (U, w, m) windows from
``TrackStore.window``); the per-UE ``A3Forecaster`` is the batch of one. The trend is
Theil-Sen over all pairs of reports in the window (``trend="all_pairs"``, exact, O(w^2)) or
over the pairs half the window apart (``"lagged_pairs"``, O(w): the median of pairwise slopes
with the same breakdown point, the default at RIC scale; see ``A3Config``).

Raw score (0..1): exp(-(t_HO - now) / 3 s) scaled by the fit's support (points / 2 min_points,
capped at 1) and by how clearly the condition leads (margin); ``Calibrator`` maps it to the
observed accuracy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from xapp.predict.base import Calibrator, Prediction, nanmedian_last
from xapp.predict.config import A3Config
from xapp.predict.maps import NeighbourRelations
from xapp.tracks import TrackView, batch_of_one


@lru_cache(maxsize=64)
def _pairs(w: int) -> tuple[np.ndarray, np.ndarray]:
    """All row pairs i < j of a window of w rows (Theil-Sen), cached."""
    return np.triu_indices(w, 1)


@dataclass
class A3Batch:
    """Per UE (shape (U,)): whether an A3 forecast exists, the neighbour's PCI (-1 anonymous)
    and cell id (-1 unknown, as reported), t_HO (s, NaN none) and the raw score."""

    has: np.ndarray
    pci: np.ndarray
    cell: np.ndarray
    t_ho: np.ndarray
    score: np.ndarray


def forecast_batch(v: TrackView, now: np.ndarray, c: A3Config) -> A3Batch:
    """The earliest A3 handover of each UE of a batched view (U, w, m) at times ``now`` (U,).

    Window: the rows with time >= now - window_s after the last row on another serving cell
    (a suffix of each UE's rows). Candidates: the neighbours of the newest row with an RSRP;
    neighbour column q is read down the window where it holds the same neighbour (by PCI, else
    cell id, else both anonymous). Array work only; see the module doc for the rules.
    """
    U, W = v.time.shape
    if U == 0:
        z = np.zeros(0)
        return A3Batch(z.astype(bool), z.astype(np.int64), z.astype(np.int64), z, z)
    now = np.asarray(now, dtype=np.float64)
    t = v.time
    sc = v.serving_cell[:, -1]
    ar = np.arange(W)
    last_other = np.where(v.serving_cell != sc[:, None], ar, -1).max(axis=1)
    with np.errstate(invalid="ignore"):
        valid = (t >= (now - c.window_s)[:, None]) & (ar[None, :] > last_other[:, None])
    nval = valid.sum(axis=1)
    w = int(nval.max())
    if w < c.min_points:
        z = np.zeros(U)
        return A3Batch(np.zeros(U, bool), np.full(U, -1, np.int64), np.full(U, -1, np.int64), np.full(U, np.nan), z)
    sl = slice(W - w, W)
    t, valid = t[:, sl], valid[:, sl]
    # (U, m, w) layout: the medians run over the last, contiguous axis. float32 for the
    # lagged-pairs trend (RSRP holds 1 dB steps exactly), float64 for the exact all-pairs one.
    ft = np.float64 if c.trend == "all_pairs" else np.float32
    # the neighbour arrays may hold only the newest rows (HandoverPredictor.update reads no more)
    tr = lambda x: np.ascontiguousarray(np.swapaxes(x[:, -w:], 1, 2))  # noqa: E731
    pci, rs = tr(v.nb_pci), tr(v.nb_rsrp_dbm).astype(ft)
    srv = v.rsrp_dbm[:, sl].astype(ft)
    lp, lc = pci[:, :, -1, None], v.nb_cell[:, -1, :, None]             # (U, m, 1) identities, newest row
    cand = ~np.isnan(rs[:, :, -1])
    if (lp[cand] >= 0).all():            # every candidate named by PCI (E2 reports): one comparison
        same = pci == lp                 # (a non-candidate column is never read further)
    else:
        cell = tr(v.nb_cell)
        same = np.where(lp >= 0, pci == lp, np.where(lc >= 0, cell == lc, (pci < 0) & (cell < 0)))
    with np.errstate(invalid="ignore"):
        d = rs - srv[:, None, :]
        y = np.where(same & valid[:, None, :] & np.isfinite(d), d, np.nan)  # (U, m, w) D = Mn - Mp
    ok = ~np.isnan(y)
    npts = ok.sum(axis=2)                                               # (U, m)
    thr = c.offset_db + c.hysteresis_db
    with np.errstate(invalid="ignore"):
        above = y > thr
    first = w - nval                                                    # first window row per UE
    # start of the trailing run where the condition holds (missing rows do not break it)
    below = ok & ~above                                                 # the last such row, by argmax
    lastb = (w - 1) - np.argmax(below[:, :, ::-1], axis=2)             # of the reversed rows
    lastb = np.where(np.take_along_axis(below, lastb[:, :, None], axis=2)[:, :, 0], lastb, -1)
    start = np.maximum(lastb + 1, first[:, None])
    holding = ok[:, :, -1] & above[:, :, -1]
    ks = np.minimum(start, w - 1)
    km = np.maximum(ks - 1, 0)
    tk = np.take_along_axis(t, ks, axis=1)
    tkm = np.take_along_axis(t, km, axis=1)
    yk = np.take_along_axis(y, ks[:, :, None], axis=2)[:, :, 0].astype(np.float64)
    ykm = np.take_along_axis(y, km[:, :, None], axis=2)[:, :, 0].astype(np.float64)
    okm = np.take_along_axis(ok, km[:, :, None], axis=2)[:, :, 0]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        interp = (ks > first[:, None]) & okm & (yk > ykm)
        # the UE evaluates more often than it reports: interpolate the entry time
        t_enter = np.where(interp, tkm + (thr - ykm) / (yk - ykm) * (tk - tkm), tk)
        t_hold = np.maximum(now[:, None], t_enter + c.ttt_s + c.ho_delay_s)
        # Theil-Sen: median of pairwise slopes, intercept at now
        trel = (t - now[:, None]).astype(ft)                            # (U, w) s, <= 0
        if c.trend == "lagged_pairs":                                   # each UE's own half window apart
            h = np.maximum(nval // 2, 1)
            K = max(int((nval - h).max()), 1)
            i = np.minimum(first[:, None] + np.arange(K), w - 1)        # (U, K)
            j = np.minimum(i + h[:, None], w - 1)
            dt = np.where(np.arange(K) < (nval - h)[:, None], np.take_along_axis(trel, j, 1)
                          - np.take_along_axis(trel, i, 1), np.nan)
            # per UE rows i, j of every neighbour: one gather of whole (m, ) rows of the (U w, m) layout
            yr = np.swapaxes(y, 1, 2).reshape(U * w, -1)
            base = (np.arange(U) * w)[:, None]
            dy = np.swapaxes(yr[base + j] - yr[base + i], 1, 2)
        else:
            i, j = _pairs(w)
            dt = trel[:, j] - trel[:, i]                                # (U, P)
            dy = y[:, :, j] - y[:, :, i]
        b = nanmedian_last(dy / np.where(dt > 1e-6, dt, np.nan)[:, None, :])   # (U, m)
        a = nanmedian_last(y - b[:, :, None].astype(ft) * trel[:, None, :])
        dtc = np.maximum(0.0, (thr - a) / b)
        fore = (b >= c.min_slope_db_s) & (dtc <= c.horizon_s)
        t_fore = now[:, None] + dtc + c.ttt_s + c.ho_delay_s
    elig = cand & (npts >= c.min_points) & (nval >= c.min_points)[:, None] & (holding | fore)
    t_ho = np.where(holding, t_hold, t_fore)
    best = np.argmin(np.where(elig, t_ho, np.inf), axis=1)             # first of equal times
    rows = np.arange(U)
    has = elig[rows, best]
    tb = t_ho[rows, best]
    margin = np.where(holding[rows, best], y[rows, best, -1].astype(np.float64) - thr, a[rows, best] - thr)
    support = np.minimum(1.0, npts[rows, best] / (2.0 * c.min_points))
    with np.errstate(invalid="ignore", over="ignore"):
        score = np.exp(-(tb - now) / 3.0) * support / (1.0 + np.exp(-margin))
    lp, lc = lp[:, :, 0].astype(np.int64), lc[:, :, 0]
    return A3Batch(has, np.where(has, lp[rows, best], -1), np.where(has, lc[rows, best], -1),
                   np.where(has, tb, np.nan), np.where(has, score, 0.0))


def resolve_cells(nrt: NeighbourRelations | None, serving: np.ndarray, pci: np.ndarray, cell: np.ndarray,
                  has: np.ndarray) -> np.ndarray:
    """Cell ids of forecast neighbours: as reported, else the NRT's (serving, PCI) -> cell
    (-1 unknown). Python only for the UEs to resolve, one NRT lookup per distinct pair."""
    out = np.where(has, cell, -1)
    if nrt is None:
        return out
    todo = np.flatnonzero(has & (cell < 0) & (pci >= 0))
    memo: dict[tuple[int, int], int] = {}
    for u, s, p in zip(todo.tolist(), serving[todo].tolist(), pci[todo].tolist()):
        k = (s, p)
        r = memo.get(k)
        if r is None:
            r = memo[k] = nrt.resolve(s, p)
        out[u] = r
    return out


class A3Forecaster:
    """See the module doc. ``predict(view, now)`` -> Prediction | None (a batch of one UE)."""

    name = "a3"

    def __init__(self, cfg: A3Config | None = None, nrt: NeighbourRelations | None = None,
                 calibrator: Calibrator | None = None) -> None:
        self.cfg = cfg or A3Config()
        self.nrt = nrt
        self.calibrator = calibrator or Calibrator()

    def forecast(self, view: TrackView, now: float) -> tuple[int, int, float, float] | None:
        """(neighbour PCI, neighbour cell id or -1, t_HO, raw score) of the earliest A3, or None."""
        if len(view.time) == 0:
            return None
        f = forecast_batch(batch_of_one(view), np.array([now], dtype=np.float64), self.cfg)
        if not f.has[0]:
            return None
        return int(f.pci[0]), int(f.cell[0]), float(f.t_ho[0]), float(f.score[0])

    def predict(self, view: TrackView, now: float, ue_id: str = "") -> Prediction | None:
        f = self.forecast(view, now)
        if f is None:
            return None
        p, cid, t_ho, score = f
        sc = int(view.serving_cell[-1])
        if cid < 0 and self.nrt is not None:
            cid = self.nrt.resolve(sc, p)
        return Prediction(target_cell=cid, t_ho=t_ho, confidence=self.calibrator(score), source=self.name,
                          target_pci=p, serving_cell=sc)
