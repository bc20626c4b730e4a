"""Whether a preparation is worth its risk: the expected-benefit trigger rule (docs/model.md §4.2).

A prediction names its target with a calibrated probability p (``Prediction.confidence``;
the combination's candidates, ``xapp.predict.combined``). Preparing at that target saves, if the
UE does hand over there, the fallback's SIT less Pallas's (Eq. 6 at T_w*); if it does not, the
warm-up was wasted: the target's engine spent T_pre = L_hist / r_p (Eq. 4) prefilling a prefix
nobody uses, GPU time other sessions wait behind. With ``lam`` (lambda, s of SIT per second of
wasted prefill, the descriptor's ``controls.scheduler.warmup_cost_weight``) the trigger fires
only where

    p (T_SIT_fb - T_SIT(T_w*))  >=  (1 - p) lambda L_hist / r_p

lambda = 0 leaves Eq. 9's trigger rule as it was (every prediction may trigger).
"""

from __future__ import annotations

import numpy as np

from pallas_common.timing import sit_ctho, sit_recomputation

__all__ = ["expected_benefit", "worth_preparing", "fallback_sit"]


def fallback_sit(k_ho: np.ndarray, block_size: np.ndarray, r_p: np.ndarray, s_kv: np.ndarray,
                 bandwidth: np.ndarray, c_sync: float, recompute: bool = False) -> np.ndarray:
    """SIT of the unprepared handover, s, shape of the broadcast inputs: ctHO at the target
    (docs/model.md §6), or Recomputation where ``recompute``, without the target's first
    decode step (add 1 / r_d to compare with Eq. 6's T_SIT, which has it). ``k_ho`` tokens, ``block_size`` P tokens, ``r_p`` tokens/s, ``s_kv`` bytes/token,
    ``bandwidth`` bytes/s, ``c_sync`` s."""
    if recompute:
        return np.asarray(sit_recomputation(k_ho, r_p, c_sync), dtype=np.float64)
    return np.asarray(sit_ctho(k_ho, block_size, r_p, s_kv, bandwidth, c_sync), dtype=np.float64)


def expected_benefit(p: np.ndarray, sit_fallback_s: np.ndarray, sit_pallas_s: np.ndarray,
                     l_hist: np.ndarray, r_p: np.ndarray, lam: float) -> np.ndarray:
    """p (T_SIT_fb - T_SIT) - (1 - p) lambda L_hist / r_p, s (module doc), broadcast shape.

    ``p``: calibrated probability that the target is right, clipped to [0, 1] (NaN counts as
    0); ``sit_fallback_s``, ``sit_pallas_s``: s; ``l_hist``: tokens the warm-up prefills;
    ``r_p``: the target's prefill rate, tokens/s (> 0); ``lam`` >= 0. Raises ValueError for a
    negative or non-finite ``lam``."""
    lam = float(lam)
    if not np.isfinite(lam) or lam < 0:
        raise ValueError(f"warmup_cost_weight must be a finite number >= 0, got {lam!r}")
    p = np.clip(np.nan_to_num(np.asarray(p, dtype=np.float64), nan=0.0), 0.0, 1.0)
    saved = np.asarray(sit_fallback_s, dtype=np.float64) - np.asarray(sit_pallas_s, dtype=np.float64)
    waste = np.asarray(l_hist, dtype=np.float64) / np.asarray(r_p, dtype=np.float64)
    return p * saved - (1.0 - p) * lam * waste


def worth_preparing(p: np.ndarray, sit_fallback_s: np.ndarray, sit_pallas_s: np.ndarray,
                    l_hist: np.ndarray, r_p: np.ndarray, lam: float) -> np.ndarray:
    """Bool array: the trigger may fire (module doc). ``lam`` = 0: always True (Eq. 9's rule
    alone); otherwise where ``expected_benefit`` >= 0."""
    if float(lam) == 0.0:
        shape = np.broadcast(np.asarray(p), np.asarray(sit_fallback_s), np.asarray(sit_pallas_s),
                             np.asarray(l_hist), np.asarray(r_p)).shape
        return np.ones(shape, bool)
    return expected_benefit(p, sit_fallback_s, sit_pallas_s, l_hist, r_p, lam) >= 0.0
