"""CVH: constant velocity and heading over a learned association map (paper §5, predictor (10)).

From the newest GPS fix (position, speed, heading) the UE is dead-reckoned forward,
p(tau) = p_fix + v (tau - t_fix) u(heading), with the distance capped at ``max_dr_m`` (the UCC
drives log a fix only every ~100 m, so far-reaching dead reckoning is mostly wrong). Stepping
``step_s`` from now up to ``horizon_s``, the first trusted tile of the association map
(``min_count`` observations, majority share >= ``min_purity``) whose majority cell is not the
serving cell is where the trajectory leaves the serving cell's area: t_HO = tau, target = that
cell. ``t_fix`` is the time the current fix first appeared in the track (a logger that repeats
the last fix on every row, as G-NetTrack does, is handled).

Raw score: purity of the entered tile x min(1, count / 10) x exp(-(t_HO - now) / 5 s).

Both predictors run as array work over a batch of UEs (``motion_batch``, ``cvh_batch``,
``places_batch`` on (U, w) windows from ``TrackStore.window``); the per-UE classes are the
batch of one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xapp.predict.base import Calibrator, Prediction
from xapp.predict.config import CVHConfig
from xapp.predict.maps import AssociationMap, HandoverPlaces
from xapp.tracks import TrackView, batch_of_one


@dataclass
class Crossing:
    """Per UE (shape (U,)): found, target cell (-1 none), t_HO (s, NaN none), raw score."""

    has: np.ndarray
    cell: np.ndarray
    t_ho: np.ndarray
    score: np.ndarray

    @classmethod
    def none(cls, U: int) -> "Crossing":
        return cls(np.zeros(U, bool), np.full(U, -1, np.int64), np.full(U, np.nan), np.zeros(U))

    def one(self) -> tuple[int, float, float] | None:
        """The batch of one as (target cell, t_HO, raw score), or None."""
        return (int(self.cell[0]), float(self.t_ho[0]), float(self.score[0])) if self.has[0] else None


@dataclass
class Motion:
    """Per UE (U,): whether usable, and t_fix (s), speed (m/s), heading (deg), x, y (m) of the
    newest GPS fix on the association map's local frame."""

    ok: np.ndarray
    t_fix: np.ndarray
    v: np.ndarray
    hd: np.ndarray
    x0: np.ndarray
    y0: np.ndarray


def motion_batch(v: TrackView, assoc: AssociationMap, c: CVHConfig) -> Motion:
    """The newest fix of each UE of a batched view (U, w): its row, the time it first appeared
    (a logger that repeats the last fix on every row is handled), speed and heading. Not ok
    without a frame, a fix, a speed and heading, or below ``c.min_speed_mps``."""
    U, W = v.time.shape
    lat, lon = v.lat, v.lon
    okf = ~np.isnan(lat)
    has = okf.any(axis=1)
    ar = np.arange(W)
    i = np.where(okf, ar, -1).max(axis=1)
    ii = np.maximum(i, 0)
    rows = np.arange(U)
    la, lo = lat[rows, ii], lon[rows, ii]
    same = (lat == la[:, None]) & (lon == lo[:, None])
    j = np.where(~same & (ar[None, :] < ii[:, None]), ar, -1).max(axis=1, initial=-1) + 1
    t_fix = v.time[rows, j]
    sp = v.speed_mps[rows, ii].astype(np.float64)
    hd = v.heading_deg[rows, ii].astype(np.float64)
    with np.errstate(invalid="ignore"):
        ok = has & ~np.isnan(sp) & ~np.isnan(hd) & (sp >= c.min_speed_mps)
    if assoc.frame is None:
        ok[:] = False
        x0 = y0 = np.full(U, np.nan)
    else:
        x0, y0 = assoc.frame.xy(la, lo)
    return Motion(ok, t_fix, sp, hd, np.asarray(x0, np.float64), np.asarray(y0, np.float64))


def _moving(v: TrackView, assoc: AssociationMap, c: CVHConfig, motion: Motion | None):
    """(motion, an empty Crossing, the rows of the UEs with a usable motion)."""
    m = motion or motion_batch(v, assoc, c)
    return m, Crossing.none(v.time.shape[0]), np.flatnonzero(m.ok)


def cvh_batch(v: TrackView, now: np.ndarray, assoc: AssociationMap, c: CVHConfig,
              motion: Motion | None = None) -> Crossing:
    """The first area change ahead of each UE (module doc), array work over (U, steps)."""
    m, out, u = _moving(v, assoc, c, motion)
    if u.size == 0:
        return out
    sc = v.serving_cell[u, -1]
    hr = np.radians(m.hd[u])[:, None]
    nsteps = int(c.horizon_s / c.step_s) + 1
    taus = now[u, None] + np.arange(nsteps) * c.step_s
    dist = np.minimum(m.v[u, None] * np.maximum(taus - m.t_fix[u, None], 0.0), c.max_dr_m)
    xs = m.x0[u, None] + dist * np.sin(hr)
    ys = m.y0[u, None] + dist * np.cos(hr)
    cell, cnt, pur = assoc.lookup_many(xs, ys)
    good = (cell >= 0) & (cnt >= c.min_count) & (pur >= c.min_purity) & (cell != sc[:, None])
    k = np.argmax(good, axis=1)
    g = np.arange(u.size)
    hit = good[g, k]
    u, k, g = u[hit], k[hit], g[hit]
    tau = taus[g, k]
    out.has[u] = True
    out.cell[u] = cell[g, k]
    out.t_ho[u] = tau
    out.score[u] = pur[g, k] * np.minimum(1.0, cnt[g, k] / 10.0) * np.exp(-(tau - now[u]) / 5.0)
    return out


def places_batch(v: TrackView, now: np.ndarray, assoc: AssociationMap, places: HandoverPlaces, c: CVHConfig,
                 motion: Motion | None = None) -> Crossing:
    """The nearest learned handover place ahead of each UE (``PlacesPredictor``), as arrays."""
    m, out, u = _moving(v, assoc, c, motion)
    if u.size == 0:
        return out
    sp = m.v[u]
    d = np.minimum(sp * np.maximum(0.0, now[u] - m.t_fix[u]), c.max_dr_m)
    hr = np.radians(m.hd[u])
    x, y = m.x0[u] + d * np.sin(hr), m.y0[u] + d * np.cos(hr)
    found, dist, target, share, n = places.ahead_many(v.serving_cell[u, -1], x, y, m.hd[u], c.lateral_m,
                                                      c.max_dheading_deg, c.behind_m, sp * c.horizon_s, c.cluster_m)
    u, sp = u[found], sp[found]
    t_ho = now[u] + dist[found] / sp
    out.has[u] = True
    out.cell[u] = target[found]
    out.t_ho[u] = t_ho
    out.score[u] = share[found] * np.minimum(1.0, n[found] / 3.0) * np.exp(-(t_ho - now[u]) / 5.0)
    return out


class CVHPredictor:
    """See the module doc. Needs an ``AssociationMap`` with a frame (learned from drives)."""

    name = "cvh"

    def __init__(self, cfg: CVHConfig | None, assoc: AssociationMap, calibrator: Calibrator | None = None) -> None:
        self.cfg = cfg or CVHConfig()
        self.assoc = assoc
        self.calibrator = calibrator or Calibrator()

    def crossing(self, view: TrackView, now: float) -> tuple[int, float, float] | None:
        """(target cell, t_HO, raw score) of the first area change ahead, or None."""
        if len(view.time) == 0:
            return None
        return cvh_batch(batch_of_one(view), np.array([now], np.float64), self.assoc, self.cfg).one()

    def predict(self, view: TrackView, now: float, ue_id: str = "") -> Prediction | None:
        cr = self.crossing(view, now)
        if cr is None:
            return None
        cell, t_ho, score = cr
        return Prediction(target_cell=cell, t_ho=t_ho, confidence=self.calibrator(score), source=self.name,
                          serving_cell=int(view.serving_cell[-1]))


class PlacesPredictor:
    """CVH over the handover-places map: the UE is dead-reckoned to now from its newest fix
    (distance capped at ``max_dr_m``); the nearest learned handover of the serving cell ahead
    on the constant-heading path gives t_HO = now + distance / speed and the target (majority
    of the places there). Raw score: vote share x min(1, events / 3) x exp(-(t_HO - now) / 5 s).
    """

    name = "places"

    def __init__(self, cfg: CVHConfig | None, places: HandoverPlaces, assoc: AssociationMap,
                 calibrator: Calibrator | None = None) -> None:
        self.cfg = cfg or CVHConfig()
        self.places = places
        self.assoc = assoc  # for its frame
        self.calibrator = calibrator or Calibrator()

    def crossing(self, view: TrackView, now: float) -> tuple[int, float, float] | None:
        """(target cell, t_HO, raw score) of the nearest handover place ahead, or None."""
        if len(view.time) == 0:
            return None
        return places_batch(batch_of_one(view), np.array([now], np.float64), self.assoc, self.places,
                            self.cfg).one()

    def predict(self, view: TrackView, now: float, ue_id: str = "") -> Prediction | None:
        cr = self.crossing(view, now)
        if cr is None:
            return None
        cell, t_ho, score = cr
        return Prediction(target_cell=cell, t_ho=t_ho, confidence=self.calibrator(score), source=self.name,
                          serving_cell=int(view.serving_cell[-1]))
