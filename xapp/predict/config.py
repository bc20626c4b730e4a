"""Typed configuration of the handover predictors.

``PredictorConfig.from_dict`` takes the mapping the xApp config loader finds under the
descriptor's ``controls`` (e.g. ``controls["predictor"]``); unknown keys and wrong types raise
``ValueError`` naming the key, so a typo in a descriptor fails at start-up, not silently.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, get_type_hints


def _from_dict(cls: type, d: Mapping[str, Any], where: str) -> Any:
    if not isinstance(d, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(d).__name__}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown} (known: {sorted(names)})")
    kw: dict[str, Any] = {}
    for k, v in d.items():
        t = hints[k]
        if dataclasses.is_dataclass(t):
            kw[k] = _from_dict(t, v, f"{where}.{k}")
        elif t is float:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{where}.{k}: expected a number, got {v!r}")
            kw[k] = float(v)
        elif t is int:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{where}.{k}: expected an integer, got {v!r}")
            kw[k] = v
        elif t is bool:
            if not isinstance(v, bool):
                raise ValueError(f"{where}.{k}: expected true/false, got {v!r}")
            kw[k] = v
        elif t is str:
            if not isinstance(v, str):
                raise ValueError(f"{where}.{k}: expected a string, got {v!r}")
            kw[k] = v
        else:
            kw[k] = v
    obj = cls(**kw)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(where)
    return obj


@dataclass(frozen=True)
class A3Config:
    """A3 forecasting (TS 38.331 §5.5.4.4 entry: Mn + Ofn + Ocn - Hys > Mp + Ofp + Ocp + Off).

    ``offset_db`` is Off (a3-Offset) plus any cell offsets, ``hysteresis_db`` Hys, ``ttt_s``
    timeToTrigger, ``ho_delay_s`` the report-to-handover latency added to the TTT expiry.
    ``window_s``: the sliding window of the robust (Theil-Sen) trend; ``min_points`` the fewest
    reports to fit; ``horizon_s`` the furthest crossing forecast; ``min_slope_db_s`` the
    smallest closing rate of (neighbour - serving) that counts as approaching.
    ``trend``: the Theil-Sen pairs, ``"all_pairs"`` (every pair of reports in the window, exact,
    O(w^2): the drive-log profile) or ``"lagged_pairs"`` (the pairs n // 2 reports apart of the
    n in the window, O(w):
    the default, which keeps a 10,000-UE cycle within 50 ms at 5 reports/s per UE).
    """

    offset_db: float = 3.0
    hysteresis_db: float = 1.0
    ttt_s: float = 0.32
    ho_delay_s: float = 0.05
    window_s: float = 3.0
    min_points: int = 4
    horizon_s: float = 8.0
    min_slope_db_s: float = 0.3
    trend: str = "lagged_pairs"

    def validate(self, where: str = "a3") -> None:
        if self.ttt_s < 0 or self.window_s <= 0 or self.horizon_s <= 0 or self.min_points < 2:
            raise ValueError(f"{where}: ttt_s >= 0, window_s > 0, horizon_s > 0, min_points >= 2 required")
        if self.trend not in ("all_pairs", "lagged_pairs"):
            raise ValueError(f"{where}.trend: {self.trend!r} not 'all_pairs' or 'lagged_pairs'")


@dataclass(frozen=True)
class CVHConfig:
    """Constant velocity and heading over a learned association map (paper §5, CVH).

    ``tile_m``: map tile size; ``step_s``/``horizon_s``: extrapolation step and reach;
    ``max_dr_m``: the furthest dead reckoning from the last fix (sparse GPS); ``min_count``:
    observations a tile needs to be trusted; ``min_purity``: share of its majority cell;
    ``min_speed_mps``: below it the UE is treated as standing (no prediction).
    The handover-places variant (``places``) matches learned handover positions of the serving
    cell within ``lateral_m`` of the path, driven within ``max_dheading_deg``, from ``behind_m``
    behind; places within ``cluster_m`` of the nearest one vote on the target.
    """

    tile_m: float = 35.0
    step_s: float = 0.5
    horizon_s: float = 10.0
    max_dr_m: float = 200.0
    min_count: int = 3
    min_purity: float = 0.5
    min_speed_mps: float = 1.0
    lateral_m: float = 20.0
    max_dheading_deg: float = 45.0
    behind_m: float = 10.0
    cluster_m: float = 30.0

    def validate(self, where: str = "cvh") -> None:
        if self.tile_m <= 0 or self.step_s <= 0 or self.horizon_s <= 0:
            raise ValueError(f"{where}: tile_m, step_s, horizon_s must be > 0")


@dataclass(frozen=True)
class HistoryConfig:
    """Successor model: P(target | serving, previous serving) learned from observed handovers.

    ``smoothing``: additive smoothing of the first-order table; ``backoff_weight``: weight of
    the first-order estimate against the second-order counts (the ping-pong return C -> A -> C
    is a second-order transition), and of each shorter route's estimate against a longer
    route's counts. ``order``: how many cells of the UE's route, the serving one included,
    condition the table (2, the least: previous and serving; up to ``maps.TransitionModel.MAX_ORDER``, 4,
    from the UE's online route in the knowledge, one Python step per UE and cycle). The drive-log
    profile takes 4 (issue 43: docs/drive-data.md §5).
    """

    smoothing: float = 0.5
    backoff_weight: float = 1.0
    order: int = 2

    def validate(self, where: str = "history") -> None:
        if not 2 <= self.order <= 4:
            raise ValueError(f"{where}.order must be 2 to 4 (maps.TransitionModel.MAX_ORDER)")


@dataclass(frozen=True)
class StabilityConfig:
    """Hysteresis on the reported target: a new target replaces the reported one only after it
    has led for ``hold_s`` seconds, or at once if its confidence exceeds the reported one's by
    ``switch_margin``. ``drop_after_s``: a reported prediction survives this long without
    support before it is withdrawn."""

    hold_s: float = 1.0
    switch_margin: float = 0.3
    drop_after_s: float = 1.0


@dataclass(frozen=True)
class PredictorConfig:
    """All predictor settings. ``mode``: which predictor the xApp runs (``combined``, ``a3``,
    ``cvh``, ``history``). ``window_reports``: the track tail read per prediction.
    ``alarm_horizon_s``: a prediction due within this is an alarm (for metrics and the window
    decision). ``w_cvh``/``w_places``: weights of the location votes against the successor
    probabilities in the combination; ``time_from_anonymous_a3``/``time_from_cvh``: whether the
    combination may take the time from A3 on an unidentified neighbour or from CVH, and
    ``places_time_min_score`` the handover-places score below which it gives no time (these
    trade timed predictions against false alarms). ``time_from_dwell``: a target no source times
    gets the time its serving cell's learned dwell before that target ends (``maps.DwellModel``),
    never sooner than ``dwell_min_lead_s`` from now: a deployed xApp on a real drive, where GPS
    fixes come every 100 m and neighbours carry no identity, otherwise names the target and no
    time, and nothing is prepared (issue 26). ``dwell_residual``: that dwell is the median of
    the learned dwells longer than the time already spent on the cell
    (``DwellModel.residual_median``; without it a UE past the median got "now + dwell_min_lead_s"
    on every report, one stuck alarm per long dwell: 52 of 62 false alarms/h on the UCC drives).
    ``dwell_edge``: the dwell gives a time only with evidence that the UE is near the serving
    cell's edge (``combined.edge_evidence``: an A3 forecast on any neighbour, a neighbour within
    ``dwell_edge_margin_db`` of the A3 entry, or the serving RSRP falling at least
    ``dwell_edge_slope_db_s`` dB/s); ``places_edge``: the same for the handover-place time.
    All three are on in the drive-log profile (``pallas_tools.evaluate.drive_log_config``) and
    off by default: on the replay's generated drives they cost the timed share at T - 1 s
    (``benchmarks/replay_predictions.py``: 29% -> 23% without history, 82% -> 81% with 16 drives).
    ``w_return``: weight of the return vote, a vote for the cell served before the current one
    of ``w_return`` times the learned odds that the next handover goes back there given the
    time spent on the current cell (``maps.ReturnModel``, over every cell pair: the successor
    table knows a ping-pong return only where that (previous, serving) pair's return was
    seen), cast only in the first ``return_max_s`` seconds on the cell (later the odds fall
    to the table's own share; 0 turns the vote off, the default). The drive-log profile sets it
    (UCC drives, issue 43: docs/drive-data.md §5).
    ``min_confidence``: predictions below it are not reported.
    ``ue_silence_s``: a UE with no report for this long (trace clock) has gone: its track and
    predictor state are freed (issue 14, bounded memory under churn)."""

    mode: str = "combined"
    window_reports: int = 32
    alarm_horizon_s: float = 3.0
    min_confidence: float = 0.0
    w_cvh: float = 0.5
    w_places: float = 3.0
    time_from_anonymous_a3: bool = True
    time_from_cvh: bool = False
    places_time_min_score: float = 0.0
    time_from_dwell: bool = True
    dwell_min_lead_s: float = 0.5
    dwell_residual: bool = False
    dwell_edge: bool = False
    dwell_edge_margin_db: float = 3.0
    dwell_edge_slope_db_s: float = 0.5
    places_edge: bool = False
    w_return: float = 0.0
    return_max_s: float = 6.0
    ue_silence_s: float = 30.0
    a3: A3Config = field(default_factory=A3Config)
    cvh: CVHConfig = field(default_factory=CVHConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    stability: StabilityConfig = field(default_factory=StabilityConfig)

    MODES = ("combined", "a3", "cvh", "places", "history")

    def validate(self, where: str = "predictor") -> None:
        if self.mode not in self.MODES:
            raise ValueError(f"{where}.mode: {self.mode!r} not one of {self.MODES}")
        if self.window_reports < 2:
            raise ValueError(f"{where}.window_reports must be >= 2")
        if not self.ue_silence_s > 0:
            raise ValueError(f"{where}.ue_silence_s must be > 0")
        if self.w_return < 0 or self.return_max_s < 0:
            raise ValueError(f"{where}: w_return and return_max_s must be >= 0")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, where: str = "predictor") -> "PredictorConfig":
        """Build from a (possibly partial) mapping; missing keys keep their defaults.

        Raises ValueError on unknown keys, wrong types or invalid values.
        """
        return _from_dict(cls, d or {}, where)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (round-trips through ``from_dict``)."""
        return dataclasses.asdict(self)
