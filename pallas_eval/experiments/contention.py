"""``contention``: handover-handover (HH), handover-inference (HI) and both (paper section 6,
contention experiment, Figure 8).

Qwen3-14B, a 2,000-token context per migrating session, 1 Gbit/s aggregate inter-gNB goodput,
ten repetitions per configuration (error bars: the standard deviation over them).

- HH: ``n`` UEs hand over to one target within ``SPREAD_S`` (1 s; offsets drawn per
  repetition). Their prefix prefills share the target GPU and their streams share the link,
  so each migration gets r_p / n and B / n (the effective rates the Scheduler Engine sees,
  section 5 of the paper); ctHO in its multi-user form splits the same aggregate the same way.
- HI: the target serves ``m`` resident decoding requests. With chunked prefill (chunk
  ``CHUNK`` = 512 tokens, an assumption) every engine step carries the decode batch and one
  prefill chunk: step = t_dec(m) + CHUNK / r_p with t_dec(m) = (1 / r_d)(1 + 0.02 m) (batched
  decode nearly free, an assumption), so a migration's prefill runs at CHUNK / step and the
  residents' ITL is the step time while a prefill is in flight.
- Joint: both.

Each repetition draws every UE's prediction lead from the single-handover events (CVH). Mean SIT
is over the migrating UEs, worst SIT their maximum, resident tail ITL the P99 of the residents'
token gaps over the ``OBSERVE_S`` (10 s) around the handovers.
"""

from __future__ import annotations

import numpy as np

from pallas_common.schemes import CTHO, PALLAS
from pallas_eval.experiments import mobility as M
from pallas_eval.experiments import presets as PR
from pallas_eval.experiments import single as S
from pallas_eval.experiments.base import Comparison, ExperimentResult
from pallas_eval.experiments.repeated import weighted_percentile
from pallas_eval.simulate import simulate_arrays

MODEL, CONTEXT, GOODPUT = "qwen3-14b", 2000.0, 1000.0
CHUNK = 512
SPREAD_S = 1.0
OBSERVE_S = 10.0
REPS = 10
#: (kind, migrating UEs n, resident requests m)
CONFIGS = (("HH", 1, 0), ("HH", 2, 0), ("HH", 4, 0), ("HH", 8, 0),
           ("HI", 1, 4), ("HI", 1, 8), ("HI", 1, 16),
           ("HH+HI", 2, 4), ("HH+HI", 4, 8), ("HH+HI", 8, 16))


def decode_step(rates, m: int) -> float:
    """t_dec(m): one decode step with ``m`` requests in the batch, s (module docstring)."""
    return (1.0 / rates.r_d) * (1.0 + 0.02 * m)


def shared_rates(rates, n: int, m: int) -> tuple[float, float, float]:
    """(r_p per migration, B per migration, the step time while a prefill is in flight)."""
    if m > 0:
        step = decode_step(rates, m) + CHUNK / rates.r_p
        r_p = CHUNK / step
    else:
        step, r_p = CHUNK / rates.r_p, rates.r_p
    return r_p / n, rates.bandwidth / n, step


def resident_tail_itl(rates, n: int, m: int, prefill_tokens: float) -> float:
    """P99 of the residents' token gaps over OBSERVE_S: steps with a chunk last longer, s."""
    if m == 0:
        return float("nan")
    t_dec = decode_step(rates, m)
    _, _, step = shared_rates(rates, n, m)
    chunk_steps = np.ceil(prefill_tokens / CHUNK)
    busy = chunk_steps * step
    plain = max(0.0, (OBSERVE_S - busy) / t_dec)
    return weighted_percentile(np.array([t_dec, step]), np.array([plain, chunk_steps]), 99)


def run(out_dir, *, tiny: bool = False, seed: int = 17, gpu: str = "rtx-a6000") -> ExperimentResult:
    """The experiment (module docstring); ``tiny``: three repetitions of four configurations."""
    from pallas_eval.experiments.figures import plot_figure8
    reps = 3 if tiny else REPS
    configs = (CONFIGS[0], CONFIGS[3], CONFIGS[6], CONFIGS[9]) if tiny else CONFIGS
    r = PR.rates(MODEL, gpu, GOODPUT)
    d, p = S.events(seed, 64)
    leads = M.t_avail(d, p)[:, 0]
    rng = np.random.default_rng([seed, 0x8C])
    rows, points = [], []
    for kind, n, m in configs:
        rp_n, b_n, _ = shared_rates(r, n, m)
        per = {"pallas_mean": [], "pallas_worst": [], "ctho_mean": [], "ctho_worst": [], "tail_itl": []}
        for rep in range(reps):
            lead = rng.choice(leads, n) + rng.uniform(0, SPREAD_S, n)
            a = simulate_arrays(np.full(n, CONTEXT), lead, r, (PALLAS, CTHO), bandwidth=b_n, r_p=rp_n)
            pre = float(np.sum(a.prefill_tokens[PALLAS]))
            tail = resident_tail_itl(r, n, m, pre)
            per["pallas_mean"].append(float(a.sit[PALLAS].mean()))
            per["pallas_worst"].append(float(a.sit[PALLAS].max()))
            per["ctho_mean"].append(float(a.sit[CTHO].mean()))
            per["ctho_worst"].append(float(a.sit[CTHO].max()))
            per["tail_itl"].append(tail)
            rows.append({"kind": kind, "migrations": n, "residents": m, "rep": rep,
                         "pallas_sit_mean_s": per["pallas_mean"][-1], "pallas_sit_worst_s": per["pallas_worst"][-1],
                         "ctho_sit_mean_s": per["ctho_mean"][-1], "ctho_sit_worst_s": per["ctho_worst"][-1],
                         "resident_tail_itl_s": tail, "r_p_per_migration": rp_n,
                         "goodput_per_migration_mbps": b_n * 8 / 1e6})
        points.append({"kind": kind, "migrations": n, "residents": m,
                       **{f"{k}_s": float(np.mean(v)) for k, v in per.items()},
                       **{f"{k}_sd_s": float(np.std(v)) for k, v in per.items()},
                       "resident_itl_alone_s": decode_step(r, m) if m else float("nan")})
    out_dir.mkdir(parents=True, exist_ok=True)
    plot = plot_figure8(out_dir / "figure8.png", points)
    worst_mean = max(pt["pallas_mean_s"] for pt in points)
    upto4 = max((pt["pallas_mean_s"] for pt in points if pt["migrations"] <= 4), default=float("nan"))
    comps = [Comparison("contention.pallas_sit_mean.max", 1000 * worst_mean,
                        f"docs/model.md/scale: the paper's text does not list its configurations; ours go to n = 8 "
                        f"concurrent migrations. Up to n = 4 Pallas's mean SIT stays below 300 ms (at most "
                        f"{1000 * upto4:.0f} ms); at n = 8 each migration gets r_p / 8 and B / 8, its 2,000-token prefix "
                        f"needs more than T_max = 5 s, and Eq. 6 puts the rest into SIT")]
    notes = [f"{len(configs)} configurations x {reps} repetitions, {MODEL}, {CONTEXT:.0f} tokens, "
             f"{GOODPUT:.0f} Mbit/s aggregate, chunk {CHUNK} tokens ({gpu} rates)"]
    return ExperimentResult("contention", "simulate", rows, {"points": points}, [plot], comps, notes)
