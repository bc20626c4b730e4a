"""The Scheduler Engine's configuration: one typed, validated object.

Field names are those of the descriptor's ``controls.scheduler`` section (``descriptors/
schema.json``), so ``SchedulerConfig.from_dict(controls["scheduler"])`` is the whole loader.
Units are SI inside; goodput is given in Mbit/s at this edge and converted once
(:attr:`SchedulerConfig.default_goodput_bytes_per_s`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from pallas_common.timing import DecisionParams, mbit_per_s

__all__ = ["SchedulerConfigError", "SchedulerConfig", "MIN_DT_S", "MAX_WINDOW_STEPS"]

#: The smallest window step dT, s, and the most steps T_max / dT of the candidate grid: every
#: control cycle evaluates T_max / dT + 1 windows per candidate session (Eq. 9), so the grid is
#: bounded here, in ``descriptors/schema.json`` (dt_s minimum, t_max_s maximum) and in the A1
#: policy type alike (60 s / 10 ms = 6000).
MIN_DT_S = 0.01
MAX_WINDOW_STEPS = 6000


class SchedulerConfigError(ValueError):
    """A scheduler configuration value is missing, unknown, of the wrong type or out of range.

    ``errors`` lists ``(field, message)`` pairs; ``str()`` names every one.
    """

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = list(errors)
        super().__init__("invalid scheduler configuration: "
                         + "; ".join(f"{k}: {m}" for k, m in self.errors))


# (lower bound, lower inclusive, upper bound, upper inclusive) per field; None: unbounded.
_RANGES: dict[str, tuple[float | None, bool, float | None, bool]] = {
    "alpha": (0.0, True, 1.0, True),
    "dt_s": (MIN_DT_S, True, 1.0, True),
    "t_max_s": (0.0, False, 60.0, True),
    "control_period_s": (0.0, False, 10.0, True),
    "ewma_weight": (0.0, False, 1.0, True),
    "stale_age_s": (0.0, False, None, False),
    "default_prefill_rate_tps": (0.0, False, None, False),
    "default_decode_rate_tps": (0.0, False, None, False),
    "default_goodput_mbps": (0.0, False, None, False),
    "kv_headroom_fraction": (0.0, True, 10.0, True),
    "c_sync_s": (0.0, True, 10.0, True),
    "rtt_s": (0.0, True, 10.0, True),
    "tie_tol_s": (0.0, True, 1.0, True),
    "fixed_window_s": (0.0, True, 60.0, True),
    "ho_timing_quantile": (0.0, True, 1.0, True),
    "ho_timing_max_margin_s": (0.0, True, 60.0, True),
    "ho_timing_window": (1.0, True, 4096.0, True),
    "targets_k": (1.0, True, 8.0, True),
    "targets_split": (0.0, True, 1.0, True),
    "targets_p_floor": (0.0, True, 1.0, True),
    "targets_backhaul_share": (0.0, True, 8.0, True),
    "targets_prefill_s": (0.0, True, 60.0, True),
    "targets_return_s": (0.0, True, 60.0, True),
    "warmup_cost_weight": (0.0, True, 100.0, True),
}

#: Fields that may be None (then absent from the descriptor): None means "not in force".
_OPTIONAL = frozenset({"fixed_window_s", "targets_backhaul_share", "targets_prefill_s"})
#: Fields the descriptor may leave out (they have defaults; added after descriptors existed).
_DEFAULTED = frozenset({"ho_timing_quantile", "ho_timing_max_margin_s", "ho_timing_window",
                        "targets_k", "targets_split", "targets_p_floor", "targets_return_s",
                        "warmup_cost_weight"})
#: Fields that must hold whole numbers.
_INTEGRAL = frozenset({"ho_timing_window", "targets_k"})


@dataclass(frozen=True)
class SchedulerConfig:
    """Parameters of the Scheduler Engine (paper §4.2; docs/model.md §2-4).

    - ``alpha``: Eq. 8's weight of T_SIT against T_early, [0, 1].
    - ``dt_s``: window grid step ΔT, s (Eq. 9), >= :data:`MIN_DT_S`. ``t_max_s``: window cap
      T_max, s (Eq. 9); ``t_max_s / dt_s`` <= :data:`MAX_WINDOW_STEPS`.
    - ``control_period_s``: time between decision cycles, s.
    - ``ewma_weight``: weight of the newest sample in the EWMA of r_p, r_d and B (docs/model.md §2).
    - ``stale_age_s``: an estimate older than this falls back to its default, s.
    - ``default_prefill_rate_tps`` (r_p), ``default_decode_rate_tps`` (r_d), tokens/s, and
      ``default_goodput_mbps`` (B), Mbit/s: conservative values used without a fresh estimate.
    - ``kv_headroom_fraction``: admission needs free KV memory >= S_kv(K_HO) (1 + this).
    - ``c_sync_s``: commit cost c_sync of Eq. 6, s (one control round trip plus admission).
    - ``rtt_s``: xApp-to-agent round trip, s. The trigger takes half of it to reach the source,
      so the trigger rule looks ahead by ``control_period_s + rtt_s / 2`` (see
      :meth:`decision_params`). Default 2 ms.
    - ``tie_tol_s``: J values within this tie; ties go to the smaller window (Eq. 9). The only
      field not in the descriptor schema (``controls.scheduler`` cannot set it).
    - ``ho_timing_quantile`` q, ``ho_timing_max_margin_s`` M_max (s) and ``ho_timing_window``
      (handovers): the trigger plans for the handover coming M = clip(Q_q(e), 0, M_max) before
      its predicted time, e the error t_HO_hat - t_HO of the last ``ho_timing_window``
      handovers (:mod:`xapp.scheduler.ho_timing`; issue 26 item 4). M_max = 0 is Eq. 9's
      literal rule.
    - ``targets_k`` K, ``targets_split``, ``targets_p_floor``, ``targets_backhaul_share`` and
      ``targets_prefill_s`` (None: unbounded): the choice of up to K targets per UE
      (docs/model.md §4.1; :meth:`target_choice`, read by
      :func:`xapp.scheduler.targets.choose_targets`). K = 1 is the single target.
    - ``targets_return_s``, s, [0, 60]: with K > 1, for this long after a UE's handover the
      agent it left is due at once when the prediction names it (a ping-pong back; docs/model.md
      §4.1, :meth:`xapp.scheduler.engine.SchedulerEngine.cycle`); 0 turns it off. Default 10 s.
    - ``warmup_cost_weight`` lambda, s of SIT per s of wasted warm-up prefill, [0, 100]: the
      expected-benefit rule (:mod:`xapp.scheduler.benefit`, docs/model.md §4.2) lets a trigger
      fire only where p (SIT_fallback - SIT) >= (1 - p) lambda L_hist / r_p, p the
      prediction's calibrated probability; 0 (default) leaves Eq. 9's rule alone.

    Every other field is in ``descriptors/schema.json`` with the same bounds as here, required
    there except the optional ``fixed_window_s`` and the defaulted ``ho_timing_*``. Raises :class:`SchedulerConfigError` naming every field that is not a finite number
    in its range.
    """

    alpha: float = 0.8
    dt_s: float = 0.1
    t_max_s: float = 5.0
    control_period_s: float = 0.1
    ewma_weight: float = 0.3
    stale_age_s: float = 5.0
    default_prefill_rate_tps: float = 1000.0
    default_decode_rate_tps: float = 20.0
    default_goodput_mbps: float = 100.0
    kv_headroom_fraction: float = 0.1
    c_sync_s: float = 0.05
    rtt_s: float = 0.002
    tie_tol_s: float = 1e-9
    fixed_window_s: float | None = None
    ho_timing_quantile: float = 0.8
    ho_timing_max_margin_s: float = 30.0
    ho_timing_window: int = 32
    targets_k: int = 1
    targets_split: float = 1.0
    targets_p_floor: float = 0.0
    targets_backhaul_share: float | None = None
    targets_prefill_s: float | None = None
    targets_return_s: float = 10.0
    warmup_cost_weight: float = 0.0

    def __post_init__(self) -> None:
        errors = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in _OPTIONAL:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                errors.append((f.name, f"must be a number, got {value!r}"))
                continue
            if not math.isfinite(value):
                errors.append((f.name, f"must be finite, got {value!r}"))
                continue
            lo, lo_inc, hi, hi_inc = _RANGES[f.name]
            if lo is not None and (value < lo or (value == lo and not lo_inc)):
                errors.append((f.name, f"must be {'>=' if lo_inc else '>'} {lo}, got {value!r}"))
            if hi is not None and (value > hi or (value == hi and not hi_inc)):
                errors.append((f.name, f"must be {'<=' if hi_inc else '<'} {hi}, got {value!r}"))
            if f.name in _INTEGRAL:
                if value != int(value):
                    errors.append((f.name, f"must be a whole number, got {value!r}"))
                object.__setattr__(self, f.name, int(value))
            else:
                object.__setattr__(self, f.name, float(value))
        if not errors and self.t_max_s / self.dt_s > MAX_WINDOW_STEPS * (1 + 1e-12):
            errors.append(("t_max_s", f"t_max_s / dt_s must be <= {MAX_WINDOW_STEPS} windows, got "
                                      f"{self.t_max_s!r} / {self.dt_s!r}"))
        if errors:
            raise SchedulerConfigError(errors)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SchedulerConfig":
        """Build from a mapping such as the descriptor's ``controls.scheduler``.

        Missing keys take the defaults above; unknown keys, non-numbers and out-of-range
        values raise :class:`SchedulerConfigError` naming every offending key.
        """
        if not isinstance(data, Mapping):
            raise SchedulerConfigError([("<root>", f"must be a mapping, got {type(data).__name__}")])
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SchedulerConfigError([(k, "unknown key") for k in unknown])
        return cls(**dict(data))

    def to_dict(self) -> dict[str, float]:
        """The configuration as a plain dict (the inverse of :meth:`from_dict`); an optional
        field that is None is left out."""
        return {k: v for k, v in asdict(self).items() if not (v is None and k in _OPTIONAL)}

    @property
    def default_goodput_bytes_per_s(self) -> float:
        """``default_goodput_mbps`` in bytes/s."""
        return mbit_per_s(self.default_goodput_mbps)

    @property
    def trigger_lookahead_s(self) -> float:
        """How far ahead the trigger rule looks: one control period plus the one-way delay."""
        return self.control_period_s + 0.5 * self.rtt_s

    def target_choice(self) -> dict[str, Any]:
        """The keyword arguments of :func:`xapp.scheduler.targets.choose_targets` that this
        configuration sets: ``params``, ``k_max``, ``split``, ``p_floor`` and ``budget``."""
        from xapp.scheduler.targets import PrepBudget
        inf = math.inf
        return dict(params=self.decision_params(), k_max=self.targets_k, split=self.targets_split,
                    p_floor=self.targets_p_floor,
                    budget=PrepBudget(prefill_s=inf if self.targets_prefill_s is None
                                      else self.targets_prefill_s,
                                      backhaul_share=inf if self.targets_backhaul_share is None
                                      else self.targets_backhaul_share))

    def decision_params(self) -> DecisionParams:
        """The parameters of :func:`pallas_common.timing.decide` (Eq. 9 and the trigger rule)."""
        return DecisionParams(alpha=self.alpha, dt=self.dt_s, t_max=self.t_max_s,
                              trigger_lookahead=self.trigger_lookahead_s, tie_tol=self.tie_tol_s)
