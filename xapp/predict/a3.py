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

Raw score (0..1): exp(-(t_HO - now) / 3 s) scaled by the fit's support (points / 2 min_points,
capped at 1) and by how clearly the condition leads (margin); ``Calibrator`` maps it to the
observed accuracy.
"""

from __future__ import annotations

import math

import numpy as np

from xapp.predict.base import Calibrator, Prediction, theil_sen
from xapp.predict.config import A3Config
from xapp.predict.maps import NeighbourRelations
from xapp.tracks import TrackView


def _nanmedian(x: np.ndarray) -> np.ndarray:
    """Median over axis 0 ignoring NaN (NaN where a column is all NaN), without warnings."""
    if not np.isnan(x).any():
        return np.median(x, axis=0)
    with np.errstate(invalid="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmedian(x, axis=0)


class A3Forecaster:
    """See the module doc. ``predict(view, now)`` -> Prediction | None; O(window * neighbours)."""

    name = "a3"

    def __init__(self, cfg: A3Config | None = None, nrt: NeighbourRelations | None = None,
                 calibrator: Calibrator | None = None) -> None:
        self.cfg = cfg or A3Config()
        self.nrt = nrt
        self.calibrator = calibrator or Calibrator()

    def forecast(self, view: TrackView, now: float) -> tuple[int, int, float, float] | None:
        """(neighbour PCI, neighbour cell id or -1, t_HO, raw score) of the earliest A3, or None."""
        c = self.cfg
        t = view.time
        n = len(t)
        if n == 0:
            return None
        sc = view.serving_cell[-1]
        lo = int(np.searchsorted(t, now - c.window_s, side="left"))
        other = np.nonzero(view.serving_cell[:n] != sc)[0]
        if other.size:
            lo = max(lo, int(other[-1]) + 1)
        if n - lo < c.min_points:
            return None
        tw = t[lo:]
        w = n - lo
        srv = view.rsrp_dbm[lo:].astype(np.float64)
        pci = view.nb_pci[lo:]
        cell = view.nb_cell[lo:]
        rs = view.nb_rsrp_dbm[lo:].astype(np.float64)
        lp, lc, lr = view.nb_pci[-1], view.nb_cell[-1], view.nb_rsrp_dbm[-1]
        cand = np.nonzero(~np.isnan(lr))[0]
        if cand.size == 0:
            return None
        lp, lc = lp[cand], lc[cand]
        # match each candidate across the window rows: by PCI, else by cell id, else same slot
        by_pci = (pci[:, None, :] == lp[None, :, None]) & (lp >= 0)[None, :, None]
        by_cell = (cell[:, None, :] == lc[None, :, None]) & ((lp < 0) & (lc >= 0))[None, :, None]
        anon = np.zeros_like(by_pci)
        anon_c = np.nonzero((lp < 0) & (lc < 0))[0]
        if anon_c.size:
            anon[:, anon_c, cand[anon_c]] = ((pci[:, cand[anon_c]] < 0) & (cell[:, cand[anon_c]] < 0))
        m = (by_pci | by_cell | anon) & ~np.isnan(rs)[:, None, :]
        mx = np.where(m, rs[:, None, :], -np.inf).max(axis=2)           # (w, k)
        y = mx - srv[:, None]
        y[~np.isfinite(y)] = np.nan
        ok = ~np.isnan(y)
        npts = ok.sum(axis=0)
        thr = c.offset_db + c.hysteresis_db
        with np.errstate(invalid="ignore"):
            above = y > thr
        # start of the trailing run where the condition holds (missing rows do not break it)
        brk = ok & ~above
        start = np.where(brk, np.arange(w)[:, None], -1).max(axis=0) + 1
        holding = ok[-1] & above[-1]
        # Theil-Sen over all candidates at once
        i, j = np.triu_indices(w, 1)
        dt = tw[j] - tw[i]
        good = dt > 1e-6
        if good.any():
            with np.errstate(invalid="ignore", divide="ignore"):
                sl = (y[j[good]] - y[i[good]]) / dt[good, None]
                b = _nanmedian(sl)
                a = _nanmedian(y - b[None, :] * (tw - now)[:, None])
        else:
            b = np.full(y.shape[1], np.nan)
            a = _nanmedian(y)
        best: tuple[int, int, float, float] | None = None
        for q in range(len(cand)):
            if npts[q] < c.min_points:
                continue
            if holding[q]:
                k = int(start[q])
                t_enter = tw[k]
                if k > 0 and ok[k - 1, q] and y[k, q] > y[k - 1, q]:
                    # the UE evaluates more often than it reports: interpolate the entry time
                    t_enter = tw[k - 1] + (thr - y[k - 1, q]) / (y[k, q] - y[k - 1, q]) * (tw[k] - tw[k - 1])
                t_ho = max(now, t_enter + c.ttt_s + c.ho_delay_s)
                margin = float(y[-1, q] - thr)
            else:
                if not (b[q] == b[q]) or b[q] < c.min_slope_db_s:
                    continue
                dtc = max(0.0, (thr - a[q]) / b[q])
                if dtc > c.horizon_s:
                    continue
                t_ho = now + dtc + c.ttt_s + c.ho_delay_s
                margin = float(a[q] - thr)
            support = min(1.0, npts[q] / (2.0 * c.min_points))
            score = math.exp(-(t_ho - now) / 3.0) * support / (1.0 + math.exp(-margin))
            if best is None or t_ho < best[2]:
                best = (int(lp[q]), int(lc[q]), float(t_ho), score)
        return best

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
