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
"""

from __future__ import annotations

import math

import numpy as np

from xapp.predict.base import Calibrator, Prediction
from xapp.predict.config import CVHConfig
from xapp.predict.maps import AssociationMap, HandoverPlaces
from xapp.tracks import TrackView


def latest_fix(view: TrackView) -> tuple[int, float] | None:
    """(row of the newest fix, time the fix first appeared) or None if the view has no position."""
    lat = view.lat
    ok = np.nonzero(~np.isnan(lat))[0]
    if ok.size == 0:
        return None
    i = int(ok[-1])
    j = i
    while j > 0 and view.lat[j - 1] == view.lat[i] and view.lon[j - 1] == view.lon[i]:
        j -= 1
    return i, float(view.time[j])


def _motion(view: TrackView, assoc: AssociationMap, c: CVHConfig):
    """(t_fix s, speed m/s, heading deg, x m, y m) of the newest GPS fix in the map's local frame,
    or None without a frame, a fix, a speed and heading, or below ``c.min_speed_mps``."""
    if assoc.frame is None or len(view.time) == 0:
        return None
    fx = latest_fix(view)
    if fx is None:
        return None
    i, t_fix = fx
    v = float(view.speed_mps[i])
    hd = float(view.heading_deg[i])
    if not (v == v) or not (hd == hd) or v < c.min_speed_mps:
        return None
    x0, y0 = assoc.frame.xy(float(view.lat[i]), float(view.lon[i]))
    return t_fix, v, hd, float(x0), float(y0)


class CVHPredictor:
    """See the module doc. Needs an ``AssociationMap`` with a frame (learned from drives)."""

    name = "cvh"

    def __init__(self, cfg: CVHConfig | None, assoc: AssociationMap, calibrator: Calibrator | None = None) -> None:
        self.cfg = cfg or CVHConfig()
        self.assoc = assoc
        self.calibrator = calibrator or Calibrator()

    def crossing(self, view: TrackView, now: float) -> tuple[int, float, float] | None:
        """(target cell, t_HO, raw score) of the first area change ahead, or None."""
        c = self.cfg
        m = _motion(view, self.assoc, c)
        if m is None:
            return None
        t_fix, v, hd, x0, y0 = m
        sc = int(view.serving_cell[-1])
        ux, uy = math.sin(math.radians(hd)), math.cos(math.radians(hd))
        nsteps = int(c.horizon_s / c.step_s) + 1
        taus = now + np.arange(nsteps) * c.step_s
        dist = np.minimum(v * np.maximum(taus - t_fix, 0.0), c.max_dr_m)
        xs = float(x0) + dist * ux
        ys = float(y0) + dist * uy
        last_key = None
        for k in range(nsteps):
            key = (int(math.floor(xs[k] / self.assoc.tile_m)), int(math.floor(ys[k] / self.assoc.tile_m)))
            if key == last_key:
                continue
            last_key = key
            cell, cnt, pur = self.assoc.lookup(xs[k], ys[k])
            if cell < 0 or cnt < c.min_count or pur < c.min_purity or cell == sc:
                continue
            score = pur * min(1.0, cnt / 10.0) * math.exp(-(taus[k] - now) / 5.0)
            return cell, float(taus[k]), score
        return None

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
        c = self.cfg
        m = _motion(view, self.assoc, c)
        if m is None:
            return None
        t_fix, v, hd, x0, y0 = m
        d = min(v * max(0.0, now - t_fix), c.max_dr_m)
        hr = math.radians(hd)
        x, y = float(x0) + d * math.sin(hr), float(y0) + d * math.cos(hr)
        res = self.places.ahead(int(view.serving_cell[-1]), x, y, hd, c.lateral_m, c.max_dheading_deg,
                                c.behind_m, v * c.horizon_s, c.cluster_m)
        if res is None:
            return None
        dist, target, share, n = res
        t_ho = now + dist / v
        return target, t_ho, share * min(1.0, n / 3.0) * math.exp(-(t_ho - now) / 5.0)

    def predict(self, view: TrackView, now: float, ue_id: str = "") -> Prediction | None:
        cr = self.crossing(view, now)
        if cr is None:
            return None
        cell, t_ho, score = cr
        return Prediction(target_cell=cell, t_ho=t_ho, confidence=self.calibrator(score), source=self.name,
                          serving_cell=int(view.serving_cell[-1]))
