"""``--simulate``: the replay's handovers through the timing model only (no engines).

Each handover of the trace with a session in flight becomes one evaluation of model.md's
equations (through ``pallas_common.timing``, the same code the xApp's Scheduler Engine uses):

- Pallas: Eq. 9's decision with T_limit = min(T_max, lead), where ``lead`` is how long before
  the handover the prediction named the right target (T_avail, from the xApp's own events in a
  live run, or a given constant); T_SIT (Eq. 6) and T_early (Eq. 7) at the chosen window. With
  no usable prediction (lead 0 or a wrong target) Pallas falls back to ctHO, as it does live.
- w/o RC, w/o SM: the ablations' SIT at the same window (``sit_no_rc``, ``sit_no_sm``).
- Full-Copy, Recomputation, ctHO: model.md section 6 with K = tokens at the handover.
- Detour: hops * hop delay, the hops of a session growing by one at each of its handovers.

Every target-side scheme's SIT includes c_sync and the first decode step at the target
(1 / r_d), as Eq. 6 does for Pallas, so the schemes compare like with like.

Rates come from the live run's own measurements (``Rates.from_measurements``) or a preset such
as the paper's GPU setting (``PAPER_QWEN3_32B``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np

from pallas_common import timing


@dataclass(frozen=True)
class Rates:
    """The model's inputs that are rates or sizes (model.md sections 1-3; SI units).

    ``r_p`` prefill tokens/s at the target, ``r_d`` decode tokens/s per request, ``bandwidth``
    inter-gNB goodput bytes/s, ``s_kv`` KV bytes per token, ``block_size`` tokens per block,
    ``c_sync`` seconds per commit, ``hop_delay_s`` Detour's extra delay per forwarding hop.
    """

    name: str
    r_p: float
    r_d: float
    bandwidth: float
    s_kv: float
    block_size: int
    c_sync: float
    hop_delay_s: float

    def describe(self) -> str:
        return (f"{self.name}: r_p {self.r_p:,.0f} tok/s, r_d {self.r_d:.1f} tok/s, "
                f"B {self.bandwidth * 8 / 1e6:,.0f} Mbit/s, s_kv {self.s_kv:,.0f} B/token, "
                f"block {self.block_size}, c_sync {self.c_sync * 1000:.0f} ms, hop {self.hop_delay_s * 1000:.0f} ms")


PAPER_QWEN3_32B = Rates(
    name="paper (Qwen3-32B, RTX A6000, 300 Mbit/s)",
    # r_p implied by Table 1's Recomputation row (581 ms at 1K, 2,103 ms at 4K; model.md section 6).
    r_p=1850.0,
    # Pallas's average ITL is 28-48 ms in the paper's Figure 5(d): about 25 tokens/s per request.
    r_d=25.0,
    bandwidth=timing.mbit_per_s(300.0),
    s_kv=262_144.0,        # Eq. 1: 2 * 64 layers * 8 KV heads * 128 * 2 bytes
    block_size=16,         # vLLM's GPU default
    c_sync=0.02,           # assumption: one control round trip plus admission
    # Figure 1: P90 ITL at three hops is about 130 ms against about 40 ms without: ~30 ms/hop.
    hop_delay_s=0.03,
)

PRESETS = {"paper": PAPER_QWEN3_32B}


@dataclass(frozen=True)
class SimHandover:
    """A handover with a session in flight: tokens at the handover K, the prediction lead
    (T_avail, s; 0 if the target was never predicted right) and the session's earlier
    handovers (Detour's hop count grows with them)."""

    ue_id: str
    time: float
    from_cell: int
    to_cell: int
    k_ho: int
    lead_s: float
    hops_before: int = 0


@dataclass
class SimResult:
    """One handover under one scheme in the model: SIT and T_early (s), window (s, NaN if
    none), bytes over the link and tokens prefilled at the target."""

    scheme: str
    handover: SimHandover
    sit_s: float
    t_early_s: float = float("nan")
    window_s: float = float("nan")
    bytes_moved: float = 0.0
    prefill_tokens: float = 0.0
    outcome: str = ""


SCHEMES = ("pallas", "detour", "full-copy", "recomputation", "ctho")
ABLATIONS = ("no-rc", "no-sm")


def simulate(handovers: Sequence[SimHandover], rates: Rates, schemes: Iterable[str] = SCHEMES, *,
             alpha: float = 0.8, dt: float = 0.1, t_max: float = 5.0) -> list[SimResult]:
    """Every handover under every scheme (see the module docstring). Raises ValueError for an
    unknown scheme."""
    params = timing.DecisionParams(alpha=alpha, dt=dt, t_max=t_max)
    first_step = 1.0 / rates.r_d
    out: list[SimResult] = []
    for ho in handovers:
        k = float(ho.k_ho)
        P = rates.block_size
        window = None
        if ho.lead_s > 0:
            t_remain = min(ho.lead_s, t_max)
            k_curr = max(0.0, k - rates.r_d * t_remain)
            x = timing.WindowInputs(k_curr=k_curr, t_remain=t_remain, block_size=P, r_p=rates.r_p,
                                    r_d=rates.r_d, bandwidth=rates.bandwidth, s_kv=rates.s_kv,
                                    c_sync=rates.c_sync)
            d = timing.decide(x, params)
            window = float(d.window[0])
            costs = timing.evaluate_windows(x, np.array([window]), alpha)
        split, ctho_s = timing.ctho_split(k, P, rates.r_p, rates.s_kv, rates.bandwidth)
        for sch in schemes:
            if sch in ("pallas", "no-rc", "no-sm") and window is not None:
                if sch == "pallas":
                    n_full = float(costs.n_full[0, 0])
                    out.append(SimResult(sch, ho, float(costs.t_sit[0, 0]), float(costs.t_early[0, 0]), window,
                                         n_full * P * rates.s_kv, float(costs.l_hist[0, 0] + costs.n_tail[0, 0]),
                                         "commit"))
                elif sch == "no-rc":
                    out.append(SimResult(sch, ho, float(timing.sit_no_rc(x, [window])[0, 0]), float("nan"), window,
                                         k * rates.s_kv, 0.0, "commit"))
                else:
                    out.append(SimResult(sch, ho, float(timing.sit_no_sm(x, [window])[0, 0]), float("nan"), window,
                                         0.0, k, "commit"))
            elif sch in ("pallas", "no-rc", "no-sm", "ctho"):
                out.append(SimResult(sch, ho, rates.c_sync + ctho_s + first_step, bytes_moved=(k - split) * rates.s_kv,
                                     prefill_tokens=float(split), outcome="commit" if sch == "ctho" else "fallback:ctho"))
            elif sch == "full-copy":
                out.append(SimResult(sch, ho, float(timing.sit_full_copy(k, rates.s_kv, rates.bandwidth, rates.c_sync))
                                     + first_step, bytes_moved=k * rates.s_kv, outcome="recovered"))
            elif sch == "recomputation":
                out.append(SimResult(sch, ho, float(timing.sit_recomputation(k, rates.r_p, rates.c_sync)) + first_step,
                                     prefill_tokens=k, outcome="recovered"))
            elif sch == "detour":
                out.append(SimResult(sch, ho, float(timing.sit_detour(ho.hops_before + 1, rates.hop_delay_s)),
                                     outcome="relay"))
            else:
                raise ValueError(f"unknown scheme {sch!r}")
    return out


def summarize_sim(results: Sequence[SimResult]) -> dict[str, dict]:
    """Per scheme: SIT mean/p50/p99 and T_early mean (s), handovers counted."""
    by: dict[str, list[SimResult]] = {}
    for r in results:
        by.setdefault(r.scheme, []).append(r)
    out = {}
    for sch, rs in by.items():
        sit = np.array([r.sit_s for r in rs])
        te = np.array([r.t_early_s for r in rs])
        te = te[np.isfinite(te)]
        out[sch] = {"handovers": len(rs), "sit_mean": float(sit.mean()), "sit_p50": float(np.percentile(sit, 50)),
                    "sit_p99": float(np.percentile(sit, 99)),
                    "t_early_mean": float(te.mean()) if te.size else float("nan")}
    return out


def measured_rates(*, r_p: float | None, r_d: float | None, bandwidth: float | None, s_kv: float,
                   block_size: int, c_sync: float | None, hop_delay_s: float | None,
                   base: Rates | None = None) -> Rates:
    """Rates from a live run's measurements; a missing (None or non-finite) one is taken from
    ``base`` (default: 5,000 tok/s prefill, 50 tok/s decode, 1 Gbit/s, 20 ms sync, 5 ms hop).
    """
    b = base or Rates("defaults", 5000.0, 50.0, timing.mbit_per_s(1000.0), s_kv, block_size, 0.02, 0.005)

    def pick(v, d):
        return d if v is None or not math.isfinite(v) or v <= 0 else float(v)

    return replace(b, name="measured (this run)", r_p=pick(r_p, b.r_p), r_d=pick(r_d, b.r_d),
                   bandwidth=pick(bandwidth, b.bandwidth), s_kv=s_kv, block_size=block_size,
                   c_sync=pick(c_sync, b.c_sync), hop_delay_s=pick(hop_delay_s, b.hop_delay_s))
