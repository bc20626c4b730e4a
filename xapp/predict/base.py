"""The predictor interface, the prediction record, target hysteresis and confidence calibration.

A predictor maps a UE's measurement track (``xapp.tracks.TrackView``) and ``now`` to a
``Prediction`` (target cell, handover time, confidence, which predictor spoke) or None. It is
the input of the window decision (paper §4.2; docs/model.md §4-5): T_remain_hat = t_ho - now, and a
change of target after the trigger cancels (a new migration epoch), which is why the reported
target is held with hysteresis (``Stabiliser``) and every prediction carries a calibrated
confidence (``Calibrator``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
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
    within one serving cell so far (set by the Stabiliser). ``candidates``: the ranked
    candidate targets ((cell, calibrated probability), ...), best first, the first being
    ``target_cell`` with ``confidence``; empty when the predictor ranks none (only the
    combination does).
    """

    target_cell: int
    t_ho: float
    confidence: float
    source: str
    target_pci: int = -1
    serving_cell: int = -1
    flips: int = 0
    candidates: tuple[tuple[int, float], ...] = ()

    def remaining_s(self, now: float) -> float:
        """T_remain_hat = t_ho - now (docs/model.md §4), inf when no time is predicted."""
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


@functools.lru_cache(maxsize=64)
def sorting_network(p: int) -> tuple[tuple[int, int], ...]:
    """Batcher's odd-even merge sort comparators (i < j) for ``p`` inputs (Knuth, TAOCP vol. 3,
    5.3.4): applying each as (min -> i, max -> j) sorts any p values. Built for the next power
    of two and pruned of the comparators that touch a padding position (they are no-ops when
    the padding holds +inf, the largest value)."""
    size = 1 << max(0, (p - 1).bit_length())
    pairs: list[tuple[int, int]] = []

    def merge(lo: int, hi: int, r: int) -> None:
        step = 2 * r
        if step < hi - lo:
            merge(lo, hi, step)
            merge(lo + r, hi, step)
            pairs.extend((i, i + r) for i in range(lo + r, hi - r, step))
        else:
            pairs.append((lo, lo + r))

    def sort(lo: int, hi: int) -> None:
        if hi - lo >= 1:
            mid = lo + (hi - lo) // 2
            sort(lo, mid)
            sort(mid + 1, hi)
            merge(lo, hi, 1)

    sort(0, size - 1)
    return tuple((i, j) for i, j in pairs if j < p)


#: rows of at most this many values are sorted by the network (19 comparators for 8 values,
#: two whole-array passes each); longer ones by ``np.sort`` (measured: the network halves the
#: time for 8 values, the transposed copy makes it slower from 16)
_NETWORK_MAX = 10


def nanmedian_last(x: np.ndarray) -> np.ndarray:
    """Median over the last axis ignoring NaN (NaN where all are NaN), for any leading shape.

    The same value as ``np.nanmedian`` (mean of the two middle values of an even count),
    without warnings. NaN sorts last as +inf. Short rows (the A3 lagged-pairs slopes: about 8
    values) are sorted as columns of a (p, rows) array by :func:`sorting_network`, each
    comparator two contiguous whole-array passes (half the time of ``np.sort`` of many short
    rows, same values: sorting only moves them); longer rows by one ``np.sort``.
    """
    p = x.shape[-1]
    if 1 < p <= _NETWORK_MAX and x.size >= 64 * p:
        lead = x.shape[:-1]
        s = x.reshape(-1, p).T.copy()                                  # (p, rows), contiguous rows
        nan = np.isnan(s)
        n = (p - nan.sum(axis=0)).reshape(lead)
        lo = np.maximum((n - 1) // 2, 0)
        hi = np.minimum(n // 2, p - 1)
        np.putmask(s, nan, np.inf)
        for i, j in sorting_network(p):
            a, b = s[i], s[j]
            m = np.minimum(a, b)
            np.maximum(a, b, out=b)
            s[i] = m
        cols = np.arange(s.shape[1])
        with np.errstate(invalid="ignore"):
            out = 0.5 * (s[lo.reshape(-1), cols] + s[hi.reshape(-1), cols])
        out = np.asarray(out, dtype=np.float64).reshape(lead)
    else:
        nan = np.isnan(x)
        n = p - nan.sum(axis=-1)
        lo = np.maximum((n - 1) // 2, 0)
        hi = np.minimum(n // 2, p - 1)
        s = np.sort(np.where(nan, np.inf, x), axis=-1)
        with np.errstate(invalid="ignore"):
            out = 0.5 * (np.take_along_axis(s, lo[..., None], axis=-1)[..., 0]
                         + np.take_along_axis(s, hi[..., None], axis=-1)[..., 0])
        out = np.asarray(out, dtype=np.float64)
    out[n == 0] = np.nan
    return out


_NONE = np.iinfo(np.int64).min      # "no target" in the stabiliser's key arrays


class StabiliserBank:
    """Per-UE hysteresis on the reported target and a flip counter (issue 7 "Stability"), for
    many UEs at once: the state of UE ``i`` lives in row ``i`` of preallocated arrays.

    The raw prediction of each update goes in; what comes out is the reported one. A different
    target replaces the reported target only once it has been the raw target for ``hold_s``
    seconds, or at once when its confidence beats the reported one's by ``switch_margin``. A
    serving-cell change (a handover) clears the state. ``flips`` counts changes of the reported
    target within one serving cell. ``update`` is array work over the UEs given (each at most
    once per call); ``reset(i)`` clears a row for reuse.
    """

    _F = (("serving", np.int64, -1), ("rep_key", np.int64, _NONE), ("rep_cell", np.int64, -1),
          ("rep_pci", np.int64, -1), ("rep_sc", np.int64, -1), ("rep_tho", np.float64, np.nan),
          ("rep_conf", np.float64, 0.0), ("rep_src", np.int16, -1), ("cand", np.int64, _NONE),
          ("cand_since", np.float64, 0.0), ("last_support", np.float64, -np.inf), ("flips", np.int64, 0))

    def __init__(self, cfg: StabilityConfig | None = None, size: int = 16) -> None:
        self.cfg = cfg or StabilityConfig()
        self.a: dict[str, np.ndarray] = {k: np.full(size, f, dtype=dt) for k, dt, f in self._F}

    @property
    def size(self) -> int:
        return len(self.a["serving"])

    def grow(self, size: int) -> None:
        """Make room for rows 0..size-1 (the state of existing rows is kept)."""
        old = self.size
        if size <= old:
            return
        for k, dt, f in self._F:
            x = np.full(size, f, dtype=dt)
            x[:old] = self.a[k]
            self.a[k] = x

    def reset(self, i: int) -> None:
        for k, _, f in self._F:
            self.a[k][i] = f

    def update(self, idx: np.ndarray, has: np.ndarray, cell: np.ndarray, pci: np.ndarray, t_ho: np.ndarray,
               conf: np.ndarray, src: np.ndarray, now: np.ndarray, serving: np.ndarray) -> np.ndarray:
        """Feed raw predictions (arrays of shape (U,); ``has`` False: no raw prediction) of the
        UEs in rows ``idx`` at times ``now`` (s) on ``serving`` cells. Returns a bool (U,) mask
        of the UEs that report a prediction now (read it with ``reported``). One UE (the
        per-UE API, ``evaluate``) takes the same rules on Python scalars."""
        if len(idx) == 1:
            return np.array([self._update_one(int(idx[0]), bool(has[0]), int(cell[0]), int(pci[0]), float(t_ho[0]),
                                              float(conf[0]), int(src[0]), float(now[0]), int(serving[0]))])
        a, c = self.a, self.cfg
        reset = serving != a["serving"][idx]
        a["serving"][idx] = serving
        rk = a["rep_key"][idx]
        cand = a["cand"][idx]
        rk[reset] = _NONE
        cand[reset] = _NONE
        last = a["last_support"][idx]
        since = a["cand_since"][idx]
        flips = a["flips"][idx]
        has = has & ((cell >= 0) | (pci >= 0))
        key = np.where(cell >= 0, cell, -2 - pci)
        stale = now - last > c.drop_after_s
        # no raw prediction: the reported one survives drop_after_s without support
        rk[~has & stale] = _NONE
        cand[~has] = _NONE
        take = has & ((rk == _NONE) | (key == rk))
        diff = has & ~take
        newc = diff & (cand != key)
        cand[newc] = key[newc]
        since[newc] = now[newc]
        with np.errstate(invalid="ignore"):
            switch = diff & ((now - since >= c.hold_s) | (conf >= a["rep_conf"][idx] + c.switch_margin))
        flips[switch] += 1
        take |= switch
        rk[diff & ~switch & stale] = _NONE
        cand[take] = _NONE
        last[take] = now[take]
        rk[take] = key[take]
        sel = idx[take]
        a["rep_cell"][sel] = cell[take]
        a["rep_pci"][sel] = pci[take]
        a["rep_sc"][sel] = serving[take]
        a["rep_tho"][sel] = t_ho[take]
        a["rep_conf"][sel] = conf[take]
        a["rep_src"][sel] = src[take]
        a["rep_key"][idx] = rk
        a["cand"][idx] = cand
        a["last_support"][idx] = last
        a["cand_since"][idx] = since
        a["flips"][idx] = flips
        return rk != _NONE


    def _update_one(self, i: int, has: bool, cell: int, pci: int, t_ho: float, conf: float, src: int, now: float,
                    serving: int) -> bool:
        """``update`` for the one UE in row ``i``: the same steps on scalars (a test holds
        both to the same results)."""
        a, c = self.a, self.cfg
        rk, cand = int(a["rep_key"][i]), int(a["cand"][i])
        if serving != a["serving"][i]:
            rk = cand = _NONE
        a["serving"][i] = serving
        last, since, flips = float(a["last_support"][i]), float(a["cand_since"][i]), int(a["flips"][i])
        has = has and (cell >= 0 or pci >= 0)
        key = cell if cell >= 0 else -2 - pci
        stale = now - last > c.drop_after_s
        if not has:
            cand = _NONE
            if stale:
                rk = _NONE
        take = has and (rk == _NONE or key == rk)
        diff = has and not take
        if diff and cand != key:
            cand, since = key, now
        switch = diff and (now - since >= c.hold_s or conf >= float(a["rep_conf"][i]) + c.switch_margin)
        if switch:
            flips += 1
            take = True
        elif diff and stale:
            rk = _NONE
        if take:
            cand, last, rk = _NONE, now, key
            a["rep_cell"][i], a["rep_pci"][i], a["rep_sc"][i] = cell, pci, serving
            a["rep_tho"][i], a["rep_conf"][i], a["rep_src"][i] = t_ho, conf, src
        a["rep_key"][i], a["cand"][i], a["last_support"][i] = rk, cand, last
        a["cand_since"][i], a["flips"][i] = since, flips
        return rk != _NONE


class Stabiliser:
    """The ``StabiliserBank`` rules for one UE with ``Prediction`` objects in and out."""

    __slots__ = ("cfg", "_bank", "_src")

    def __init__(self, cfg: StabilityConfig | None = None) -> None:
        self.cfg = cfg or StabilityConfig()
        self._bank = StabiliserBank(self.cfg, 1)
        self._src: list[str] = []

    @property
    def flips(self) -> int:
        return int(self._bank.a["flips"][0])

    def update(self, raw: Prediction | None, now: float, serving_cell: int) -> Prediction | None:
        """Feed this cycle's raw prediction; returns the prediction to report (or None)."""
        one = lambda v, dt: np.array([v], dtype=dt)  # noqa: E731
        if raw is not None and raw.source not in self._src:
            self._src.append(raw.source)
        r = raw or Prediction(-1, np.nan, 0.0, "")
        ok = self._bank.update(np.zeros(1, dtype=np.int64), one(raw is not None, bool), one(r.target_cell, np.int64),
                               one(r.target_pci, np.int64), one(r.t_ho, np.float64), one(r.confidence, np.float64),
                               one(self._src.index(r.source) if raw is not None else -1, np.int16),
                               one(now, np.float64), one(serving_cell, np.int64))
        if not ok[0]:
            return None
        a = self._bank.a
        return Prediction(int(a["rep_cell"][0]), float(a["rep_tho"][0]), float(a["rep_conf"][0]),
                          self._src[int(a["rep_src"][0])], int(a["rep_pci"][0]), int(a["rep_sc"][0]),
                          int(a["flips"][0]))


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

    def to_dict(self) -> dict:
        """JSON-able form: {"edges": [...], "values": [...]} (inf edges as null)."""
        return {"edges": [None if not np.isfinite(e) else float(e) for e in self.edges],
                "values": [None if v != v else float(v) for v in self.values]}

    @classmethod
    def from_dict(cls, d: dict) -> "Calibrator":
        """Inverse of ``to_dict``. Raises ValueError on a malformed table."""
        try:
            e = [(-math.inf if i == 0 else math.inf) if x is None else float(x) for i, x in enumerate(d["edges"])]
            v = [math.nan if x is None else float(x) for x in d["values"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bad calibration table: {exc}") from exc
        if len(e) != len(v) + 1:
            raise ValueError("bad calibration table: len(edges) must be len(values) + 1")
        return cls(np.array(e), np.array(v))

    def __call__(self, score):
        """The calibrated confidence of a raw score (float), or of an array of them (array)."""
        if isinstance(score, np.ndarray):
            if not self.fitted:
                return np.clip(score, 0.0, 1.0)
            i = np.searchsorted(self.edges, score, side="right") - 1
            return self.values[np.clip(i, 0, len(self.values) - 1)]
        if not self.fitted:
            return float(min(max(score, 0.0), 1.0))
        i = int(np.searchsorted(self.edges, score, side="right")) - 1
        return float(self.values[min(max(i, 0), len(self.values) - 1)])


def load_calibrators(path: str) -> dict[str, "Calibrator"]:
    """The calibration tables at ``path``, as ``python -m pallas_tools.evaluate --save-calibration``
    writes them: a JSON object {mode name (``combined``, ``combined@2``, ...): {"edges", "values"}}.
    Returns {mode: Calibrator} for ``HandoverPredictor(calibrators=...)``.

    Raises:
        ValueError: the file cannot be read, is not JSON, is larger than 1 MiB, is not an object
        of tables, or a table is malformed (``Calibrator.from_dict``).
    """
    import json
    from pathlib import Path

    f = Path(path)
    try:
        if f.stat().st_size > 1 << 20:
            raise ValueError(f"calibration: {f} is larger than 1 MiB")
        raw = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"calibration: cannot read {f}: {e}") from e
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"calibration: {f} must be a non-empty JSON object of tables")
    out: dict[str, Calibrator] = {}
    for mode, tab in raw.items():
        if not isinstance(tab, dict):
            raise ValueError(f"calibration: {f}: table {mode!r} is not an object")
        try:
            out[str(mode)] = Calibrator.from_dict(tab)
        except ValueError as e:
            raise ValueError(f"calibration: {f}: table {mode!r}: {e}") from e
    return out


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
