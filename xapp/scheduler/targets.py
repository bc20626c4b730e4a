"""Which of a UE's candidate targets to prepare, and how far (docs/model.md §4.1; issue 45).

Pure, like the rest of the Scheduler Engine: no I/O, numpy and :mod:`pallas_common.timing`
only. :func:`choose_targets` takes the predictor's ranked candidates with calibrated
probabilities, the per-target rates, a budget and K, and returns up to K targets to prepare,
each at a :class:`Level`:

- ``FULL``: prefix warm-up and suffix stream (Pallas; its SIT is Eq. 6 at the target's Eq. 9
  window, :func:`pallas_common.timing.decide`);
- ``PREFIX``: the prefix warm-up only, no suffix stream (the window's tokens are recomputed at
  the handover: :func:`pallas_common.timing.sit_no_sm` at the same window);
- ``NONE``: not prepared (a handover there is recovered by the fallback, ctHO:
  :func:`pallas_common.timing.sit_ctho`, plus the target's first decode step as Eq. 6 counts it).

The choice minimises the expected SIT, sum_i p_i SIT_i(level_i) + (1 - sum_i p_i) SIT_else,
within the budget (target prefill seconds, backhaul share of the suffix streams, KV bytes
held); candidates below a probability floor are never prepared, and a second target is
considered only while the top candidate's probability is below ``split``. With K = 1, an
unbounded budget and floor 0 the choice is today's: the most likely target, fully prepared.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pallas_common import timing

__all__ = ["Candidate", "Level", "PrepBudget", "PrepCosts", "TargetChoice", "TargetPlan",
           "choose_targets", "MAX_CANDIDATES"]

#: The most candidates weighed (3GPP conditional handover names at most 8 cells).
MAX_CANDIDATES = 8
#: Expected SITs within this (s) tie; ties go to the cheaper, then the higher-ranked, choice.
_TIE_S = 1e-9


class Level(enum.IntEnum):
    """How far a target is prepared."""

    NONE = 0      # not prepared: the fallback at the handover
    PREFIX = 1    # prefix warm-up only, no suffix stream
    FULL = 2      # prefix warm-up and suffix stream (Pallas)


@dataclass(frozen=True)
class Candidate:
    """One candidate target of a UE's handover.

    - ``target``: its id (the agent or cell id; opaque here).
    - ``p``: calibrated probability that the UE hands over to it, [0, 1].
    - ``r_p``: the prefill rate it gives a migration, tokens/s (> 0).
    - ``bandwidth``: B, goodput of the source's block stream to it, bytes/s (> 0).
    - ``r_d_target``: its decode rate, tokens/s (None: the source's r_d).
    """

    target: str
    p: float
    r_p: float
    bandwidth: float
    r_d_target: float | None = None


@dataclass(frozen=True)
class PrepBudget:
    """What one UE's preparations may cost together (``math.inf``: unbounded).

    - ``prefill_s``: target prefill time of the prefixes, sum of L_hist / r_p_i, s.
    - ``backhaul_share``: the suffix streams' share of their links, sum over fully prepared
      targets of r_d s_kv / B_i (1.0 = one link's whole goodput).
    - ``kv_bytes``: KV memory held at the targets, bytes (S_kv(K_HO) for a full preparation,
      S_kv(L_hist) for a prefix-only one).
    """

    prefill_s: float = math.inf
    backhaul_share: float = math.inf
    kv_bytes: float = math.inf

    def __post_init__(self) -> None:
        for name in ("prefill_s", "backhaul_share", "kv_bytes"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 0) or math.isnan(v):
                raise ValueError(f"PrepBudget.{name} must be a number >= 0, got {v!r}")


@dataclass(frozen=True)
class PrepCosts:
    """The cost of one preparation (see :class:`PrepBudget` for the units)."""

    prefill_s: float = 0.0
    backhaul_share: float = 0.0
    kv_bytes: float = 0.0

    def __add__(self, o: "PrepCosts") -> "PrepCosts":
        return PrepCosts(self.prefill_s + o.prefill_s, self.backhaul_share + o.backhaul_share,
                         self.kv_bytes + o.kv_bytes)

    def within(self, b: PrepBudget) -> bool:
        """Whether these costs fit ``b`` (a relative 1e-9 slack for rounding)."""
        return all(v <= lim * (1 + 1e-9) + 1e-12 for v, lim in
                   ((self.prefill_s, b.prefill_s), (self.backhaul_share, b.backhaul_share),
                    (self.kv_bytes, b.kv_bytes)))

    def key(self) -> tuple[float, float, float]:
        """An order of cheapness (for ties): backhaul, then prefill, then KV."""
        return (self.backhaul_share, self.prefill_s, self.kv_bytes)


@dataclass(frozen=True)
class TargetPlan:
    """One candidate's outcome: its ``rank`` (0 = most likely), ``level``, the Eq. 9
    ``window`` T_w* (s) and prefix ``l_hist`` (tokens) of its preparation, its SIT at each
    level (s) and the ``costs`` of the chosen level."""

    target: str
    rank: int
    p: float
    level: Level
    window: float
    l_hist: float
    sit_full: float
    sit_prefix: float
    sit_none: float
    costs: PrepCosts

    @property
    def sit(self) -> float:
        """SIT if the UE hands over to this target, at the chosen level, s."""
        return {Level.FULL: self.sit_full, Level.PREFIX: self.sit_prefix}.get(self.level, self.sit_none)


@dataclass(frozen=True)
class TargetChoice:
    """The outcome of :func:`choose_targets`: ``plans`` (every candidate weighed, by rank),
    ``expected_sit`` (s) of the choice and ``expected_sit_none`` (s) with nothing prepared,
    and ``costs``, the chosen preparations' total."""

    plans: tuple[TargetPlan, ...]
    expected_sit: float
    expected_sit_none: float
    costs: PrepCosts

    @property
    def prepared(self) -> tuple[TargetPlan, ...]:
        """The targets to prepare (level above NONE), by rank."""
        return tuple(t for t in self.plans if t.level != Level.NONE)


def _check(name: str, v: float, lo: float, lo_inc: bool = True) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {v!r}") from None
    if not math.isfinite(f) or f < lo or (f == lo and not lo_inc):
        raise ValueError(f"{name} must be a finite number {'>=' if lo_inc else '>'} {lo}, got {v!r}")
    return f


def choose_targets(candidates: Sequence[Candidate], *, k_curr: float, t_remain: float,
                   block_size: int, r_d: float, s_kv: float, c_sync: float,
                   params: timing.DecisionParams = timing.DecisionParams(), k_max: int = 1,
                   budget: PrepBudget = PrepBudget(), p_floor: float = 0.0, split: float = 1.0,
                   sit_elsewhere: float | None = None) -> TargetChoice:
    """Up to ``k_max`` targets to prepare and the level of each (docs/model.md §4.1).

    ``candidates``: the predictor's candidates (:class:`Candidate`), any order; they are ranked
    by p (ties keep the given order), and at most :data:`MAX_CANDIDATES` are weighed.
    ``k_curr`` (tokens so far), ``t_remain`` (T_remain_hat, s), ``block_size`` (P), ``r_d``
    (tokens/s), ``s_kv`` (bytes/token), ``c_sync`` (s) and ``params`` (Eq. 9's grid and
    alpha) are the session's, as in :func:`pallas_common.timing.decide`.
    ``k_max``: K, the most targets prepared (>= 1). ``budget``: :class:`PrepBudget`.
    ``p_floor``: a candidate with p below it is never prepared. ``split``: a target other than
    the most likely one is prepared only when the most likely one's p is below this.
    ``sit_elsewhere``: SIT of a handover to a cell not among the candidates, s (None: the
    largest of the candidates' unprepared SITs); it weighs 1 - sum p and moves no choice.

    Minimises E[SIT] = sum_i p_i SIT_i(level_i) + (1 - sum_i p_i) sit_elsewhere over every
    assignment of levels with at most ``k_max`` prepared and costs within ``budget``; exact
    (enumeration: at most sum_{k <= K} C(8, k) 2^k assignments). Ties (within 1 ns) go to the
    cheaper assignment, then to the one preparing higher-ranked targets.

    Raises ValueError for a probability outside [0, 1], probabilities summing above 1 (by more
    than 1e-6), a non-positive rate, block size, s_kv or K, or a negative k_curr or c_sync.
    """
    k_max = int(_check("k_max", k_max, 1))
    p_floor = _check("p_floor", p_floor, 0.0)
    split = _check("split", split, 0.0)
    for name, v in (("block_size", block_size), ("r_d", r_d), ("s_kv", s_kv)):
        _check(name, v, 0.0, lo_inc=False)
    _check("k_curr", k_curr, 0.0)
    _check("c_sync", c_sync, 0.0)
    _check("t_remain", t_remain, -math.inf)
    for c in candidates:
        _check(f"candidate {c.target!r} p", c.p, 0.0)
        if c.p > 1.0:
            raise ValueError(f"candidate {c.target!r} p must be <= 1, got {c.p!r}")
        _check(f"candidate {c.target!r} r_p", c.r_p, 0.0, lo_inc=False)
        _check(f"candidate {c.target!r} bandwidth", c.bandwidth, 0.0, lo_inc=False)
    total_p = sum(float(c.p) for c in candidates)
    if total_p > 1.0 + 1e-6:
        raise ValueError(f"candidate probabilities sum to {total_p:.6f} > 1")
    ranked = sorted(candidates, key=lambda c: -float(c.p))[:MAX_CANDIDATES]
    if not ranked:
        s_else = 0.0 if sit_elsewhere is None else float(sit_elsewhere)
        return TargetChoice((), s_else, s_else, PrepCosts())
    n = len(ranked)
    rd_t = [c.r_d_target if c.r_d_target is not None else r_d for c in ranked]
    x = timing.WindowInputs(k_curr=k_curr, t_remain=t_remain, block_size=block_size,
                            r_p=[c.r_p for c in ranked], r_d=r_d,
                            bandwidth=[c.bandwidth for c in ranked], s_kv=s_kv, c_sync=c_sync,
                            r_d_target=rd_t)
    d = timing.decide(x, params)                                # Eq. 9 per target
    sit_full = d.t_sit                                          # Eq. 6 at T_w*
    sit_prefix = timing.sit_no_sm(x, d.window[:, None])[:, 0]   # no suffix stream, same T_w*
    sit_none = (np.asarray(timing.sit_ctho(d.k_ho, block_size, x.r_p, s_kv, x.bandwidth, c_sync))
                + 1.0 / x.r_d_target)                           # the fallback, first step included
    s_else = float(np.max(sit_none)) if sit_elsewhere is None else float(sit_elsewhere)
    p_rest = max(0.0, 1.0 - sum(float(c.p) for c in ranked))

    def costs(i: int, level: Level) -> PrepCosts:
        if level == Level.NONE:
            return PrepCosts()
        pre = float(d.l_hist[i]) / ranked[i].r_p
        if level == Level.PREFIX:
            return PrepCosts(prefill_s=pre, kv_bytes=float(d.l_hist[i]) * s_kv)
        return PrepCosts(prefill_s=pre, backhaul_share=r_d * s_kv / ranked[i].bandwidth,
                         kv_bytes=float(d.k_ho[i]) * s_kv)

    sits = {Level.NONE: sit_none, Level.PREFIX: sit_prefix, Level.FULL: sit_full}
    eligible = [i for i in range(n) if ranked[i].p >= p_floor and ranked[i].p > 0]
    k_eff = k_max if ranked[0].p < split else 1
    if ranked[0].p >= split:
        eligible = [i for i in eligible if i == 0]
    base = sum(float(ranked[i].p) * float(sit_none[i]) for i in range(n)) + p_rest * s_else
    best: tuple | None = None
    best_levels: dict[int, Level] = {}
    best_cost = PrepCosts()
    for k in range(0, min(k_eff, len(eligible)) + 1):
        for chosen in itertools.combinations(eligible, k):
            for levels in itertools.product((Level.FULL, Level.PREFIX), repeat=k):
                cost = PrepCosts()
                for i, lv in zip(chosen, levels):
                    cost = cost + costs(i, lv)
                if not cost.within(budget):
                    continue
                e = base + sum(float(ranked[i].p) * (float(sits[lv][i]) - float(sit_none[i]))
                               for i, lv in zip(chosen, levels))
                key = (e, cost.key(), tuple(chosen))
                if best is None or e < best[0] - _TIE_S or (
                        abs(e - best[0]) <= _TIE_S and key[1:] < best[1:]):
                    best, best_levels, best_cost = key, dict(zip(chosen, levels)), cost
    plans = tuple(TargetPlan(target=c.target, rank=i, p=float(c.p),
                             level=best_levels.get(i, Level.NONE), window=float(d.window[i]),
                             l_hist=float(d.l_hist[i]), sit_full=float(sit_full[i]),
                             sit_prefix=float(sit_prefix[i]), sit_none=float(sit_none[i]),
                             costs=costs(i, best_levels.get(i, Level.NONE)))
                  for i, c in enumerate(ranked))
    return TargetChoice(plans=plans, expected_sit=float(best[0]), expected_sit_none=float(base),
                        costs=best_cost)
