"""The predictor interface, the prediction record, target hysteresis and confidence calibration.

A predictor maps a UE's measurement track (``xapp.tracks.TrackView``) and ``now`` to a
``Prediction`` (target cell, handover time, confidence, which predictor spoke) or None. It is
the input of the window decision (paper §4.2; model.md §4-5): T_remain_hat = t_ho - now, and a
change of target after the trigger cancels (a new migration epoch), which is why the reported
target is held with hysteresis (``Stabiliser``) and every prediction carries a calibrated
confidence (``Calibrator``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from xapp.predict.config import StabilityConfig
from xapp.tracks import TrackView


@dataclass(frozen=True, slots=True)
class Prediction:
    """One handover prediction for one UE.

    ``target_cell``: global cell identity of the predicted target (-1 if only the PCI is known,
    see ``target_pci``). ``t_ho``: predicted handover time (s, the track's clock); NaN when the
    predictor names a target without a time. ``confidence``: calibrated probability that the
    target is right (0..1). ``source``: the predictor that spoke (``a3``, ``cvh``, ``history``,
    or ``combined:<which>``). ``flips``: how many times this UE's reported target changed
    within one serving cell so far (set by the Stabiliser).
    """

    target_cell: int
    t_ho: float
    confidence: float
    source: str
    target_pci: int = -1
    serving_cell: int = -1
    flips: int = 0

    def remaining_s(self, now: float) -> float:
        """T_remain_hat = t_ho - now (model.md §4), inf when no time is predicted."""
        return self.t_ho - now if self.t_ho == self.t_ho else math.inf


@runtime_checkable
class Predictor(Protocol):
    """What every predictor offers. ``predict`` must be cheap (tens of microseconds) and pure
    with respect to the view; learning happens in ``learn``."""

    name: str

    def predict(self, view: TrackView, now: float) -> Prediction | None:
        """The prediction for the UE whose track tail is ``view`` at time ``now`` (s)."""
        ...


def theil_sen(t: np.ndarray, y: np.ndarray, t_ref: float) -> tuple[float, float, int]:
    """Robust line through (t, y): Theil-Sen slope (median of pairwise slopes), intercept at
    ``t_ref`` (median of y - slope (t - t_ref)). NaNs are ignored. Returns (value at t_ref,
    slope per second, points used); (nan, nan, n) with fewer than 2 points or equal times.

    Breakdown point 29%: a few outlying reports do not move the trend (Sen 1968).
    """
    ok = ~np.isnan(y)
    t = t[ok]
    y = y[ok]
    n = len(t)
    if n < 2:
        return (float(y[-1]) if n else math.nan), math.nan, n
    i, j = np.triu_indices(n, 1)
    dt = t[j] - t[i]
    good = dt > 1e-6
    if not good.any():
        return float(np.median(y)), math.nan, n
    b = float(np.median((y[j] - y[i])[good] / dt[good]))
    a = float(np.median(y - b * (t - t_ref)))
    return a, b, n


class Stabiliser:
    """Per-UE hysteresis on the reported target and a flip counter (issue 7 "Stability").

    The raw prediction of each cycle goes in; what comes out is the reported one. A different
    target replaces the reported target only once it has been the raw target for
    ``hold_s`` seconds, or at once when its confidence beats the reported one's by
    ``switch_margin``. A serving-cell change (a handover) clears the state. ``flips`` counts
    changes of the reported target within one serving cell.
    """

    __slots__ = ("cfg", "reported", "cand", "cand_since", "last_support", "serving", "flips")

    def __init__(self, cfg: StabilityConfig | None = None) -> None:
        self.cfg = cfg or StabilityConfig()
        self.reported: Prediction | None = None
        self.cand: int | None = None
        self.cand_since = 0.0
        self.last_support = -math.inf
        self.serving = -1
        self.flips = 0

    def update(self, raw: Prediction | None, now: float, serving_cell: int) -> Prediction | None:
        """Feed this cycle's raw prediction; returns the prediction to report (or None)."""
        c = self.cfg
        if serving_cell != self.serving:
            self.serving = serving_cell
            self.reported = None
            self.cand = None
        if raw is None or raw.target_cell < 0 and raw.target_pci < 0:
            if self.reported is not None and now - self.last_support > c.drop_after_s:
                self.reported = None
            self.cand = None
            return self._out()
        key = raw.target_cell if raw.target_cell >= 0 else -2 - raw.target_pci
        cur = self.reported
        cur_key = None if cur is None else (cur.target_cell if cur.target_cell >= 0 else -2 - cur.target_pci)
        if cur is None or key == cur_key:
            self.reported = raw
            self.last_support = now
            self.cand = None
            return self._out()
        # a different target: switch only with enough evidence
        if self.cand != key:
            self.cand = key
            self.cand_since = now
        if now - self.cand_since >= c.hold_s or raw.confidence >= cur.confidence + c.switch_margin:
            self.reported = raw
            self.last_support = now
            self.cand = None
            self.flips += 1
            return self._out()
        if now - self.last_support > c.drop_after_s:
            self.reported = None
        return self._out()

    def _out(self) -> Prediction | None:
        if self.reported is None:
            return None
        return replace(self.reported, flips=self.flips)


@dataclass
class Calibrator:
    """Maps a predictor's raw score (0..1) to the observed probability that the target is right.

    Fitted by binning (``n_bins`` equal-count bins, pooled adjacent violators so the map is
    monotone, i.e. isotonic regression) on (score, correct) pairs from training drives; an
    unfitted Calibrator is the identity. ``reliability`` gives the table to report.
    """

    edges: np.ndarray = field(default_factory=lambda: np.array([0.0, 1.0]))
    values: np.ndarray = field(default_factory=lambda: np.array([math.nan]))

    @property
    def fitted(self) -> bool:
        return not np.isnan(self.values).all()

    def fit(self, scores: Sequence[float], correct: Sequence[bool], n_bins: int = 10) -> "Calibrator":
        s = np.asarray(scores, dtype=np.float64)
        y = np.asarray(correct, dtype=np.float64)
        if len(s) < n_bins * 5:
            return self
        order = np.argsort(s, kind="stable")
        s, y = s[order], y[order]
        chunks = np.array_split(np.arange(len(s)), n_bins)
        means = [y[c].mean() for c in chunks]
        weights = [len(c) for c in chunks]
        lo = [s[c[0]] for c in chunks]
        # pool adjacent violators
        blocks = [[m, w, l] for m, w, l in zip(means, weights, lo)]
        i = 0
        while i < len(blocks) - 1:
            if blocks[i][0] > blocks[i + 1][0]:
                m = (blocks[i][0] * blocks[i][1] + blocks[i + 1][0] * blocks[i + 1][1]) / (blocks[i][1] + blocks[i + 1][1])
                blocks[i] = [m, blocks[i][1] + blocks[i + 1][1], blocks[i][2]]
                del blocks[i + 1]
                i = max(i - 1, 0)
            else:
                i += 1
        self.edges = np.array([b[2] for b in blocks] + [math.inf])
        self.edges[0] = -math.inf
        self.values = np.array([b[0] for b in blocks])
        return self

    def __call__(self, score: float) -> float:
        if not self.fitted:
            return float(min(max(score, 0.0), 1.0))
        i = int(np.searchsorted(self.edges, score, side="right")) - 1
        return float(self.values[min(max(i, 0), len(self.values) - 1)])


def reliability(conf: Sequence[float], correct: Sequence[bool], n_bins: int = 5) -> list[dict]:
    """Reliability table: per confidence bin (equal width), mean confidence, observed accuracy, count."""
    c = np.asarray(conf, dtype=np.float64)
    y = np.asarray(correct, dtype=np.float64)
    out = []
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    for k in range(n_bins):
        m = (c >= edges[k]) & ((c < edges[k + 1]) if k < n_bins - 1 else (c <= 1.0))
        if m.any():
            out.append({"bin": f"{edges[k]:.1f}-{edges[k + 1]:.1f}", "mean_conf": round(float(c[m].mean()), 3),
                        "accuracy": round(float(y[m].mean()), 3), "n": int(m.sum())})
    return out
