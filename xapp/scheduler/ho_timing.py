"""How early or late the predicted handover time has been, measured online (issue 26 item 4).

Eq. 9's trigger rule fires when T_remain_hat = t_HO_hat - now falls to the chosen window T_w*
(plus the lookahead, docs/model.md §4). It assumes t_HO_hat is right. On real drives it is
not: a dwell-time prediction (``xapp/predict/``) learned from other drives of the same area is
often seconds late on a drive that ping-pongs between two cells, so the handover comes while
the session is still PLANNED and Pallas falls back to ctHO although it had named the right
target seconds ahead.

:class:`HandoverTimingError` keeps the signed error e = t_HO_hat - t_HO of the last ``window``
handovers that had a predicted time (s; e > 0: the handover came *before* the prediction), and
gives the engine a margin M = clip(Q_q(e), 0, M_max), the ``quantile``-th quantile of the
recent errors. The engine then decides on T_remain_hat - M, i.e. it plans for the handover
coming M earlier than predicted: with q = 0.8 the trigger comes before the handover in about
80% of the handovers whose error is like the recent ones. M = 0 until :data:`MIN_SAMPLES`
errors are known, and whenever the predictions have been on time or early (e <= 0). The
margin costs a longer window when the prediction was right (more suffix streaming, the
target's KV memory held longer); it never delays a trigger. The cap M_max (default 30 s) only
bounds that hold: on the UCC drive of docs/real-drives.md "Replay a real drive" the recent errors' 0.8
quantile reached 25 s on a ping-pong stretch, and a cap of 10 s put the trigger of a handover
whose target was named 1.9 s ahead (its prediction 11.75 s late) after the handover.

Clock: both times on one clock (the trace clock or the wall clock), seconds. Cost: O(1) per
handover plus one quantile of at most ``window`` numbers; the margin is cached between
handovers, so the cycle reads a float.
"""

from __future__ import annotations

import math

import numpy as np
from prometheus_client import Gauge, Histogram

__all__ = ["HandoverTimingError", "MIN_SAMPLES", "MAX_ABS_ERROR_S"]

#: Errors needed before the margin is used (fewer: M = 0).
MIN_SAMPLES = 3
#: An error larger than this (s) is a stale or broken prediction, not a timing error: ignored.
MAX_ABS_ERROR_S = 600.0

ERROR_SECONDS = Histogram(
    "pallas_scheduler_ho_timing_error_seconds",
    "Predicted minus actual handover time at each handover with a predicted time (s; > 0: early HO)",
    buckets=(-10, -5, -2, -1, -0.5, -0.2, 0, 0.2, 0.5, 1, 2, 5, 10, 30))
MARGIN_SECONDS = Gauge("pallas_scheduler_ho_timing_margin_seconds",
                       "Margin by which the trigger rule plans for an earlier handover (s)")


class HandoverTimingError:
    """The recent errors of the predicted handover time and the trigger margin they give.

    ``quantile`` q in [0, 1]; ``max_margin_s`` M_max >= 0 (0: no margin, the literal Eq. 9
    rule); ``window``: how many recent handovers are kept (>= 1). Raises ``ValueError`` on
    values out of range.
    """

    def __init__(self, quantile: float = 0.8, max_margin_s: float = 30.0, window: int = 32) -> None:
        self._errors = np.zeros(0)
        self.margin_s = 0.0
        self.configure(quantile, max_margin_s, window)

    def configure(self, quantile: float, max_margin_s: float, window: int) -> None:
        """Set the parameters (a reload or A1 update); the recent errors are kept, trimmed to
        the new ``window``, and the margin recomputed."""
        if not (0.0 <= quantile <= 1.0):
            raise ValueError(f"quantile must be in [0, 1], got {quantile!r}")
        if not (math.isfinite(max_margin_s) and max_margin_s >= 0):
            raise ValueError(f"max_margin_s must be >= 0, got {max_margin_s!r}")
        if int(window) != window or window < 1:
            raise ValueError(f"window must be an integer >= 1, got {window!r}")
        self.quantile, self.max_margin_s, self.window = float(quantile), float(max_margin_s), int(window)
        self._errors = self._errors[-self.window:]
        self._update()

    @property
    def n(self) -> int:
        """Errors held (at most ``window``)."""
        return int(self._errors.size)

    @property
    def errors(self) -> np.ndarray:
        """The errors held, oldest first, shape (n,), s (a copy)."""
        return self._errors.copy()

    def observe(self, predicted_t_ho: float, actual_t_ho: float) -> float | None:
        """A handover at ``actual_t_ho`` whose latest prediction said ``predicted_t_ho`` (s, one
        clock). Returns the error recorded (s), or None where there was no usable prediction
        (NaN, infinite, or off by more than :data:`MAX_ABS_ERROR_S`)."""
        e = float(predicted_t_ho) - float(actual_t_ho)
        if not math.isfinite(e) or abs(e) > MAX_ABS_ERROR_S:
            return None
        ERROR_SECONDS.observe(e)
        self._errors = np.append(self._errors, e)[-self.window:]
        self._update()
        return e

    def _update(self) -> None:
        if self._errors.size < MIN_SAMPLES:
            m = 0.0
        else:
            m = float(np.clip(np.quantile(self._errors, self.quantile), 0.0, self.max_margin_s))
        self.margin_s = m
        MARGIN_SECONDS.set(m)
