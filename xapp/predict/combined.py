"""The history predictor, the combination, and the per-UE facade the xApp calls.

- ``HistoryPredictor``: names the most likely successor of the serving cell given the cell
  before it, P(B | A, C) from ``maps.TransitionModel`` (learned from earlier drives, updated
  online). It gives no time (t_ho NaN).
- ``CombinedPredictor``: weighs history, location (CVH, handover places) and A3 for the
  target, takes the time from the most exact predictor that agrees, and says which spoke.
- ``HandoverPredictor``: the facade. Holds the config, the learned ``Knowledge`` (updated
  online by ``observe``), one ``Stabiliser`` per UE (hysteresis and flips) and runs the
  configured predictor for one UE (``predict``) or every UE of a ``TrackStore``
  (``predict_all``).
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from xapp.predict.a3 import A3Forecaster
from xapp.predict.base import Calibrator, Prediction, Stabiliser
from xapp.predict.config import PredictorConfig
from xapp.predict.cvh import CVHPredictor, PlacesPredictor
from xapp.predict.maps import Knowledge, TransitionModel
from xapp.tracks import MeasurementReport, TrackStore, TrackView, UETrack


def previous_cell_in_view(view: TrackView) -> int:
    """The cell served before the current one, if the view contains the change; else -1."""
    s = view.serving_cell
    ch = np.nonzero(s[1:] != s[:-1])[0]
    return int(s[ch[-1]]) if ch.size else -1


class HistoryPredictor:
    """Most likely successor P(B | serving A, previous C); t_ho NaN. See the module doc."""

    name = "history"

    def __init__(self, trans: TransitionModel, knowledge: Knowledge | None = None,
                 calibrator: Calibrator | None = None) -> None:
        self.trans = trans
        self.knowledge = knowledge
        self.calibrator = calibrator or Calibrator()

    def probs(self, view: TrackView, ue_id: str = "") -> dict[int, float]:
        sc = int(view.serving_cell[-1])
        prev = previous_cell_in_view(view)
        if prev < 0 and self.knowledge is not None and ue_id:
            prev = self.knowledge.previous_cell(ue_id)
        return self.trans.probs(sc, prev)

    def predict(self, view: TrackView, now: float, ue_id: str = "") -> Prediction | None:
        if len(view.time) == 0:
            return None
        p = self.probs(view, ue_id)
        if not p:
            return None
        b, pb = max(p.items(), key=lambda kv: kv[1])
        return Prediction(target_cell=b, t_ho=math.nan, confidence=self.calibrator(pb), source=self.name,
                          serving_cell=int(view.serving_cell[-1]))


class CombinedPredictor:
    """Fuses the predictors and says which one spoke (``Prediction.source``).

    Target: argmax over cells B of P_hist(B | A, C) + w_cvh s_cvh [B = CVH target]
    + w_places s_places [B = places target] + w_a3 s_a3 [B = A3 target], the s being the
    predictors' raw scores (A3 only when its neighbour resolves to a cell id).
    Time, first that applies: A3 for that target when due within ``a3_trust_s`` (the
    condition is holding or about to: the most exact clock); the handover place ahead for that
    target; A3 for that target or for an anonymous neighbour (drive data); CVH for that target;
    else no time (the target alone, from history). ``source`` = ``combined:<time source>``.
    """

    name = "combined"

    def __init__(self, a3: A3Forecaster, cvh: CVHPredictor, places: PlacesPredictor, hist: HistoryPredictor,
                 w_cvh: float = 0.5, w_places: float = 3.0, w_a3: float = 2.0, a3_trust_s: float = 1.0,
                 calibrator: Calibrator | None = None) -> None:
        self.a3, self.cvh, self.places, self.hist = a3, cvh, places, hist
        self.w_cvh, self.w_places, self.w_a3, self.a3_trust_s = w_cvh, w_places, w_a3, a3_trust_s
        self.calibrator = calibrator or Calibrator()

    def predict(self, view: TrackView, now: float, ue_id: str = "") -> Prediction | None:
        if len(view.time) == 0:
            return None
        sc = int(view.serving_cell[-1])
        a3f = self.a3.forecast(view, now)
        a3_cell = -1
        if a3f is not None:
            a3_cell = a3f[1]
            if a3_cell < 0 and self.a3.nrt is not None:
                a3_cell = self.a3.nrt.resolve(sc, a3f[0])
        pl = self.places.crossing(view, now)
        cv = self.cvh.crossing(view, now)
        score = dict(self.hist.probs(view, ue_id))
        if cv is not None:
            score[cv[0]] = score.get(cv[0], 0.0) + self.w_cvh * cv[2]
        if pl is not None:
            score[pl[0]] = score.get(pl[0], 0.0) + self.w_places * pl[2]
        if a3f is not None and a3_cell >= 0:
            score[a3_cell] = score.get(a3_cell, 0.0) + self.w_a3 * a3f[3]
        if not score:
            return None
        target, sc_t = max(score.items(), key=lambda kv: kv[1])
        total = sum(score.values())
        conf = self.calibrator(sc_t / total if total > 0 else 0.0)
        pci = a3f[0] if (a3f is not None and a3_cell == target) else -1
        if a3f is not None and a3_cell == target and a3f[2] - now <= self.a3_trust_s:
            t_ho, src = a3f[2], "a3"
        elif pl is not None and pl[0] == target:
            t_ho, src = pl[1], "places"
        elif a3f is not None and (a3_cell == target or (a3_cell < 0 and a3f[0] < 0)):
            t_ho, src = a3f[2], "a3"
        elif cv is not None and cv[0] == target:
            t_ho, src = cv[1], "cvh"
        else:
            t_ho, src = math.nan, "history"
        return Prediction(target, t_ho, conf, f"combined:{src}", pci, sc)


class HandoverPredictor:
    """What the xApp calls: learned knowledge + configured predictor + per-UE hysteresis.

    ``observe(report)`` for every report that enters the TrackStore (online learning of the
    association map, successor counts and the NRT); ``predict(track, now)`` for one UE;
    ``predict_all(store, now)`` for all. Predictions below ``cfg.min_confidence`` are dropped.
    """

    def __init__(self, cfg: PredictorConfig | None = None, knowledge: Knowledge | None = None,
                 calibrators: dict[str, Calibrator] | None = None, learn_online: bool = True) -> None:
        self.cfg = cfg = cfg or PredictorConfig()
        self.knowledge = knowledge or Knowledge.create(cfg.cvh.tile_m, cfg.history.smoothing,
                                                       cfg.history.backoff_weight)
        self.learn_online = learn_online
        cal = calibrators or {}
        k = self.knowledge
        self.a3 = A3Forecaster(cfg.a3, k.nrt, cal.get("a3"))
        self.cvh = CVHPredictor(cfg.cvh, k.assoc, cal.get("cvh"))
        self.places = PlacesPredictor(cfg.cvh, k.places, k.assoc, cal.get("places"))
        self.history = HistoryPredictor(k.trans, k, cal.get("history"))
        self.combined = CombinedPredictor(self.a3, self.cvh, self.places, self.history, cfg.w_cvh, cfg.w_places,
                                          calibrator=cal.get("combined"))
        self.active = {"a3": self.a3, "cvh": self.cvh, "places": self.places, "history": self.history,
                       "combined": self.combined}[cfg.mode]
        self._stab: dict[str, Stabiliser] = {}

    def observe(self, r: MeasurementReport) -> None:
        """Online learning from a report (call once per report, in time order per UE)."""
        if self.learn_online:
            self.knowledge.observe(r)

    def raw(self, view: TrackView, now: float, ue_id: str = "") -> Prediction | None:
        """The configured predictor's output before hysteresis."""
        return self.active.predict(view, now, ue_id)

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
        p = self.active.predict(view, now, ue)
        if p is not None and p.confidence < self.cfg.min_confidence:
            p = None
        st = self._stab.get(ue)
        if st is None:
            st = self._stab[ue] = Stabiliser(self.cfg.stability)
        return st.update(p, now, int(view.serving_cell[-1]))

    def predict_all(self, store: TrackStore | Iterable[UETrack], now: float) -> dict[str, Prediction]:
        """Predictions for every UE with a track; UEs without a prediction are left out."""
        out = {}
        for tr in store:
            if len(tr):
                p = self.predict(tr, now)
                if p is not None:
                    out[tr.ue_id] = p
        return out

    def flips(self, ue_id: str) -> int:
        """How many times this UE's reported target changed within a serving cell."""
        st = self._stab.get(ue_id)
        return st.flips if st else 0

    def forget(self, ue_id: str) -> None:
        """Drop a UE's hysteresis state (the UE left)."""
        self._stab.pop(ue_id, None)
