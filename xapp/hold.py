"""Test mode's prediction-lead knob: hold back the correct prediction until T_avail before the handover.

The paper's prediction-stress experiment (section 6.3; ``pallas experiment stress``) varies the
prediction lead T_avail by delaying the stable correct prediction. In test mode the handovers
of the replayed trace are known in advance (the harness's plan, decoded from the same trace with
the xApp's own ingest), so :class:`HoldCorrect` wraps the xApp's predictor and, for every UE,
replaces a prediction that names the UE's true next target cell by "no prediction" while that
handover is more than ``hold_s`` seconds away (trace clock). Wrong predictions pass unchanged
(preparation may start at a wrong target and be discarded, docs/model.md Eq. 10), as does everything
after the UE's last known handover. The lead the xApp then has is at most ``hold_s`` plus one
report period (a held UE's prediction is re-reported with its next measurement report).

``pallas-xapp --mode test --hold-correct-s T --handovers plan.json`` (xapp.main) installs it.
"""

from __future__ import annotations

import bisect
import json
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

__all__ = ["HoldCorrect", "load_handovers"]


def load_handovers(path: str | Path) -> list[tuple[str, float, int, int]]:
    """The handovers of a replay plan (``pallas_eval.prepare``'s ``plan.json``: ``handovers`` =
    [[ue, trace time s, from cell, to cell], ...]). Raises ValueError when the file holds none
    in that form, OSError when it cannot be read."""
    doc = json.loads(Path(path).read_text())
    hos = doc.get("handovers") if isinstance(doc, dict) else None
    if not isinstance(hos, list):
        raise ValueError(f"{path}: no 'handovers' list")
    try:
        return [(str(h[0]), float(h[1]), int(h[2]), int(h[3])) for h in hos]
    except (TypeError, ValueError, IndexError) as e:
        raise ValueError(f"{path}: a handover is not [ue, time, from_cell, to_cell]: {e}") from None


class _HeldPredictions:
    """A batch result (``len``, ``ue_ids``, ``get(i)``) with the held predictions removed."""

    def __init__(self, inner: Any, hold: "HoldCorrect", now: float) -> None:
        self._inner, self._hold, self._now = inner, hold, now
        self.ue_ids = inner.ue_ids

    def __len__(self) -> int:
        return len(self._inner)

    def get(self, i: int) -> Any:
        return self._hold.filter(self.ue_ids[i], self._inner.get(i), self._now)


class HoldCorrect:
    """Wraps a predictor (module docstring).

    Args:
        inner: the xApp's predictor: ``observe(report)`` and ``predict(track, now)``, or a batch
            one with ``update(store)`` returning ``len``/``ue_ids``/``get(i)`` (then this has
            ``update`` too, so the control loop keeps its batch path).
        handovers: (ue, trace time s, from cell, to cell) of the replayed trace.
        hold_s: T_avail, s (>= 0): the correct prediction is released ``hold_s`` s before its
            handover.
        clock: the trace clock now, s (for the batch path, whose ``update`` is given no time).

    ``held`` counts the predictions withheld. Raises ValueError for a negative or non-finite
    ``hold_s``.
    """

    def __init__(self, inner: Any, handovers: Iterable[Sequence], hold_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        hold_s = float(hold_s)
        if not hold_s >= 0 or hold_s == float("inf"):
            raise ValueError(f"hold_s must be a finite number >= 0, got {hold_s!r}")
        self.inner, self.hold_s, self.clock = inner, hold_s, clock
        self.held = 0
        by_ue: dict[str, list[tuple[float, int]]] = {}
        for ue, t, _a, b in handovers:
            by_ue.setdefault(str(ue), []).append((float(t), int(b)))
        self._times = {ue: [t for t, _ in sorted(v)] for ue, v in by_ue.items()}
        self._cells = {ue: [c for _, c in sorted(v)] for ue, v in by_ue.items()}
        if hasattr(inner, "update"):
            self.update = self._update

    def __getattr__(self, name: str) -> Any:      # observe, forget, cfg, ... of the inner one
        return getattr(self.inner, name)

    def next_handover(self, ue_id: str, now: float) -> tuple[float, int] | None:
        """(time, target cell) of the UE's first handover after ``now`` (trace clock), or None."""
        ts = self._times.get(ue_id)
        if not ts:
            return None
        k = bisect.bisect_right(ts, now)
        return (ts[k], self._cells[ue_id][k]) if k < len(ts) else None

    def filter(self, ue_id: str, pred: Any, now: float) -> Any:
        """``pred``, or None when it names the UE's next true target more than ``hold_s`` before
        that handover."""
        if pred is None:
            return None
        nxt = self.next_handover(ue_id, now)
        if nxt is not None and int(pred.target_cell) == nxt[1] and now < nxt[0] - self.hold_s:
            self.held += 1
            return None
        return pred

    def predict(self, track: Any, now: float, *args: Any, **kw: Any) -> Any:
        """The inner prediction for one UE's track, filtered (the UE is ``track.ue_id``)."""
        return self.filter(str(getattr(track, "ue_id", "")), self.inner.predict(track, now, *args, **kw), now)

    def _update(self, store: Any, *args: Any, **kw: Any) -> _HeldPredictions:
        return _HeldPredictions(self.inner.update(store, *args, **kw), self, self.clock())
