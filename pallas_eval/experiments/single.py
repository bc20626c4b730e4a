"""``single``: single handovers at fixed goodput and context, five schemes (paper section 6.1,
Figure 5; and section 2.2's Table 1).

Workload (section 6): the 500-4,500-token context range in four equal intervals, 15 contexts
drawn uniformly from each (60 per setting); each context is one single-handover event from the
drive generator (``mobility``), with the CVH predictor's targets and times, and the Scheduler
Engine online. Every setting (model x goodput 100/300/500 Mbit/s) uses the same 60 events, and
every scheme the same event, context and goodput. Tokens at the handover equal the drawn
context.

- Figure 5(a)-(c): mean SIT per scheme per goodput, one panel per model.
- Figure 5(d): mean ITL over the ``ITL_TOKENS`` (256, about a ShareGPT answer; an assumption)
  tokens after the handover: one gap is the SIT, the others the decode step 1 / r_d; Detour adds
  its hop delay to every gap (docs/model.md §6).
- Figure 5(e): a time-varying goodput. The paper replays SNOB-5G 60 GHz traces (normal and
  blockage) that are not available here; :func:`goodput_trace` synthesises the two kinds (see
  there). The goodput a transfer sees is the trace averaged over the time it runs (Full-Copy: the
  time for its bytes to pass, integrated exactly; ctHO, Recomputation: over their own SIT; Pallas:
  from its trigger to the end of its SIT), and the Scheduler Engine decides on the average of the
  2 s before the decision.
- Table 1: Full-Copy, Recomputation and ctHO for Qwen3-32B at 300 Mbit/s, 1K and 4K tokens.
"""

from __future__ import annotations

import numpy as np

from pallas_common import timing
from pallas_common.schemes import COMPARED, CTHO, DETOUR, FULL_COPY, PALLAS, RECOMPUTATION, RECOVERING
from pallas_eval.experiments import mobility as M
from pallas_eval.experiments import presets as PR
from pallas_eval.experiments.base import Comparison, ExperimentResult
from pallas_eval.simulate import simulate_arrays

GOODPUTS = (100.0, 300.0, 500.0)
ITL_TOKENS = 256
CONTEXT_BINS = ((500, 1500), (1500, 2500), (2500, 3500), (3500, 4500))
TRACE_STEP_S = 0.1


def contexts(rng: np.random.Generator, per_bin: int) -> np.ndarray:
    """``per_bin`` contexts drawn uniformly from each of the four intervals of 500-4,500 tokens."""
    return np.concatenate([rng.integers(lo, hi, per_bin) for lo, hi in CONTEXT_BINS]).astype(np.float64)


def events(seed: int, n: int):
    """``n`` single-handover drives with their CVH predictions: (Drives, Predictions)."""
    rng = np.random.default_rng([seed, 0x51])
    d = M.generate_drives(rng, np.ones(n, dtype=np.int64))
    return d, M.cvh_predict(d, rng)


def run_pallas(d, p, rates, k_ho: np.ndarray, bandwidth) -> M.OnlineResult:
    """The Scheduler Engine online over single-handover events, with the tokens at each
    handover equal to ``k_ho`` (the session starts ``r_d * t_HO`` tokens earlier)."""
    t_ho = d.ho_time[:, 0]
    k0 = np.maximum(0.0, k_ho - rates.r_d * t_ho)
    b = np.broadcast_to(np.asarray(bandwidth, dtype=np.float64), (d.n,))[:, None]
    return M.run_online(d, p, rates, k0, b)


def itl_after(sit: np.ndarray, rates, hops: int = 0, tokens: int = ITL_TOKENS) -> np.ndarray:
    """Mean ITL over the ``tokens`` after a handover (module docstring), s."""
    step = 1.0 / rates.r_d + hops * rates.hop_delay_s
    return (np.asarray(sit) + (tokens - 1) * step) / tokens


def goodput_trace(rng: np.random.Generator, kind: str, seconds: float = 900.0, mean_mbps: float = 250.0) -> np.ndarray:
    """A synthetic inter-gNB goodput trace (Mbit/s every 0.1 s), stand-in for SNOB-5G.

    ``normal``: an AR(1) process around ``mean_mbps`` (sd 20% of it, 2 s correlation time),
    floored at 10% of it. ``blockage``: the same with blockage episodes (one every 8 s on average,
    0.5-2 s long) in which the goodput falls to 5-15% of its value. Raises ValueError for another
    kind.
    """
    if kind not in ("normal", "blockage"):
        raise ValueError(f"unknown trace kind {kind!r}")
    n = int(seconds / TRACE_STEP_S)
    a = np.exp(-TRACE_STEP_S / 2.0)
    z = np.empty(n)
    z[0] = 0.0
    e = rng.normal(0, np.sqrt(1 - a * a), n)
    for i in range(1, n):
        z[i] = a * z[i - 1] + e[i]
    g = np.maximum(mean_mbps * (1 + 0.2 * z), 0.1 * mean_mbps)
    if kind == "blockage":
        t = 0.0
        while True:
            t += rng.exponential(8.0)
            if t >= seconds:
                break
            i0, i1 = int(t / TRACE_STEP_S), int((t + rng.uniform(0.5, 2.0)) / TRACE_STEP_S)
            g[i0:i1] *= rng.uniform(0.05, 0.15)
    return g


def _cum_bytes(trace_mbps: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(trace_mbps * 1e6 / 8 * TRACE_STEP_S)])


def _mean_bw(cum: np.ndarray, t0, t1) -> np.ndarray:
    """Mean goodput (bytes/s) over [t0, t1] of a trace given as cumulative bytes."""
    t0, t1 = np.asarray(t0, dtype=np.float64), np.asarray(t1, dtype=np.float64)
    x = np.arange(cum.size) * TRACE_STEP_S
    span = np.maximum(t1 - t0, TRACE_STEP_S)
    return (np.interp(t0 + span, x, cum) - np.interp(t0, x, cum)) / span


def _time_to_send(cum: np.ndarray, t0: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    x = np.arange(cum.size) * TRACE_STEP_S
    return np.interp(np.interp(t0, x, cum) + nbytes, cum, x) - t0


def traces(seed: int, model: str, ctx: np.ndarray, d, p, gpu: str = "rtx-a6000") -> list[dict]:
    """Figure 5(e) for one model: per trace kind, per scheme, mean SIT (s) over the events."""
    rates = PR.rates(model, gpu)
    rng = np.random.default_rng([seed, 0x5E])
    out = []
    for kind in ("normal", "blockage"):
        tr = goodput_trace(rng, kind)
        cum = _cum_bytes(tr)
        t_ho = rng.uniform(10.0, tr.size * TRACE_STEP_S - 80.0, ctx.size)
        lead = M.t_avail(d, p)[:, 0]
        est = _mean_bw(cum, t_ho - np.minimum(lead, 5.0) - 2.0, t_ho - np.minimum(lead, 5.0))
        fc_t = _time_to_send(cum, t_ho, ctx * rates.s_kv)
        b_fc = ctx * rates.s_kv / np.maximum(fc_t, 1e-9)
        a0 = simulate_arrays(ctx, 0.0, rates, (CTHO, RECOMPUTATION), bandwidth=_mean_bw(cum, t_ho, t_ho + 1.0))
        b_ctho = _mean_bw(cum, t_ho, t_ho + a0.sit[CTHO])
        b_pal = _mean_bw(cum, t_ho - np.minimum(lead, 2.0), t_ho + 0.3)
        a_fc = simulate_arrays(ctx, 0.0, rates, (FULL_COPY,), bandwidth=b_fc)
        a_ct = simulate_arrays(ctx, 0.0, rates, (CTHO, RECOMPUTATION), bandwidth=b_ctho)
        a_p = simulate_arrays(ctx, lead, rates, (PALLAS,), bandwidth=b_pal, est_bandwidth=est)
        row = {"model": model, "trace": kind, "trace_mean_mbps": float(tr.mean()),
               PALLAS: float(a_p.sit[PALLAS].mean()), FULL_COPY: float(a_fc.sit[FULL_COPY].mean()),
               RECOMPUTATION: float(a_ct.sit[RECOMPUTATION].mean()), CTHO: float(a_ct.sit[CTHO].mean())}
        out.append(row)
    return out


def table1(gpu: str = "rtx-a6000") -> dict[str, float]:
    """Table 1's cells (Qwen3-32B, 300 Mbit/s) from the model: SIT in s by 'scheme.1k|4k'."""
    r = PR.rates("qwen3-32b", gpu, 300.0)
    a = simulate_arrays([1024.0, 4096.0], 0.0, r, RECOVERING)
    return {f"{s}.{k}": float(a.sit[s][i]) for s in RECOVERING for i, k in enumerate(("1k", "4k"))}


def run(out_dir, *, tiny: bool = False, seed: int = 17, gpu: str = "rtx-a6000",
        models: tuple[str, ...] = PR.MODELS, hop_model: str = timing.DEFAULT_HOP_MODEL) -> ExperimentResult:
    """The experiment (module docstring); ``tiny``: 2 contexts per interval instead of 15;
    ``hop_model``: Detour's hop cost (``timing.HOP_COSTS``; its first hop's mean is the one
    hop's delay). KeyError for an unknown hop model."""
    from pallas_eval.experiments.figures import plot_figure5
    per_bin = 2 if tiny else 15
    ctx = contexts(np.random.default_rng([seed, 0xC7]), per_bin)
    d, p = events(seed, ctx.size)
    rows, per_setting = [], []
    for model in models:
        for g in GOODPUTS:
            rates = PR.rates(model, gpu, g, hop_model=hop_model)
            on = run_pallas(d, p, rates, ctx, rates.bandwidth)
            k_ho = on.k_ho[:, 0]
            base = simulate_arrays(k_ho, 0.0, rates, (DETOUR, *RECOVERING), hops=1)
            sits = {PALLAS: on.sit[:, 0], **base.sit}
            for i in range(ctx.size):
                rows.append({"model": model, "goodput_mbps": g, "event": i, "context": ctx[i], "k_ho": k_ho[i],
                             "t_avail_s": on.t_avail[i, 0], "window_s": on.window[i, 0],
                             "committed": bool(on.committed[i, 0]), "t_early_s": on.t_early[i, 0],
                             **{f"sit_{s}_s": float(sits[s][i]) for s in COMPARED},
                             **{f"itl_{s}_s": float(itl_after(sits[s][i], rates, 1 if s == DETOUR else 0))
                                for s in COMPARED}})
            mean = {s: float(np.mean(sits[s])) for s in COMPARED}
            itl = {s: float(np.mean(itl_after(sits[s], rates, 1 if s == DETOUR else 0))) for s in COMPARED}
            per_setting.append({"model": model, "goodput_mbps": g, "sit_mean_s": mean, "itl_mean_s": itl,
                                "commit_share": float(on.committed[:, 0].mean())})
    tr = [row for m in models for row in traces(seed, m, ctx, d, p, gpu)]
    t1 = table1(gpu)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot = plot_figure5(out_dir / "figure5.png", per_setting, tr, models)
    comps = _comparisons(per_setting, tr, t1, models)
    summary = {"settings": per_setting, "traces": tr, "table1_s": t1,
               "presets": {m: vars(PR.rates(m, gpu, hop_model=hop_model)) for m in models}, "contexts": ctx.tolist()}
    notes = [f"{ctx.size} contexts x {len(GOODPUTS)} goodputs x {len(models)} models, {gpu} rates; "
             f"ITL over the {ITL_TOKENS} tokens after the handover; Figure 5(e) on synthetic goodput traces"]
    return ExperimentResult("single", "simulate", rows, summary, [plot], comps, notes)


def _factor_range(per_setting, scheme):
    f = [s["sit_mean_s"][scheme] / s["sit_mean_s"][PALLAS] for s in per_setting]
    return min(f), max(f)


WHY = {
    "single.factor_full_copy": "docs/model.md: Full-Copy's SIT is K s_kv / B while Pallas's is nearly fixed, so the factor grows "
                               "as 1/B and with s_kv: from about 29x (Llama-3-8B, 500 Mbit/s) to about 170x (Qwen3-32B, "
                               "100 Mbit/s: a 2,500-token cache alone takes 52 s against Pallas's 0.32 s). The paper's "
                               "narrow 70-90x band cannot come from a transfer at the stated goodputs",
    "single.factor_recomputation": "preset: Recomputation is K / r_p with r_p derived from Table 1 and Figure 2 (Llama-3-8B's "
                                   "scaled by the H200 ratio, the paper gives none) and Pallas is nearly the fixed c_sync + "
                                   "1/r_d, so the factor runs from about 2.9x (Llama-3-8B) to 5.2x (Qwen3-32B); the paper's "
                                   "wider 2.35-7.28 needs other prefill rates than we could derive from its text",
    "single.factor_ctho": "preset: as for Recomputation (ctHO is nearly all prefill at these goodputs: shipping a token "
                          "costs 2-21 ms against 0.2-0.45 ms to recompute it)",
    "single.itl_reduction_vs_detour": "model: Detour's one hop adds 12.0 ms on average (the first hop of the fit to "
                                      "Figure 1; 15.9 ms with --hop-model linear) to every gap, so one hop reduces by "
                                      "12.0 / (1/r_d + 12.0) ms = 20-30% (less the SIT's share: 18-28%); the paper's 50% "
                                      "would need a hop as dear as Llama-3-8B's 28 ms decode step",
    "single.trace": "docs/model.md/preset: Figure 5(e)'s SNOB-5G traces are not available; ours are synthetic (mean 250 Mbit/s, "
                    "blockage episodes), so the transfer-bound factors follow our traces, not theirs",
    "single.pallas_itl": "preset: r_d per model is set from this very range (28 and 48 ms); the 256-token ITL window adds the SIT/256",
    "table1": "preset: c_sync (150 ms) and r_p were fitted to Table 1 and Figure 2 together; the linear prefill model cannot "
              "match both Recomputation points exactly",
    "single.pallas_sit": "preset: c_sync fitted to Figure 2's floor",
}


def _why(key: str) -> str:
    for k, v in WHY.items():
        if key.startswith(k):
            return v
    return ""


def _comparisons(per_setting, tr, t1, models) -> list[Comparison]:
    c = []
    add = lambda key, v: c.append(Comparison(key, v, _why(key)))  # noqa: E731
    add("table1.full_copy.1k", t1["full-copy.1k"])
    add("table1.full_copy.4k", t1["full-copy.4k"])
    add("table1.recomputation.1k", t1["recomputation.1k"] * 1000)
    add("table1.recomputation.4k", t1["recomputation.4k"] * 1000)
    add("table1.ctho.4k", t1["ctho.4k"] * 1000)
    hit = [s for s in per_setting if s["model"] == "qwen3-32b" and s["goodput_mbps"] == 100.0]
    if hit:
        add("single.pallas_sit.qwen3-32b.100", hit[0]["sit_mean_s"][PALLAS] * 1000)
    for sch in RECOVERING:
        key = sch.replace("-", "_")
        lo, hi = _factor_range(per_setting, sch)
        add(f"single.factor_{key}.min", lo)
        add(f"single.factor_{key}.max", hi)
    itl = [s["itl_mean_s"][PALLAS] * 1000 for s in per_setting]
    red = [100 * (1 - s["itl_mean_s"][PALLAS] / s["itl_mean_s"][DETOUR]) for s in per_setting]
    add("single.pallas_itl.min", min(itl))
    add("single.pallas_itl.max", max(itl))
    add("single.itl_reduction_vs_detour.min", min(red))
    add("single.itl_reduction_vs_detour.max", max(red))
    ps = [r[PALLAS] * 1000 for r in tr]
    add("single.trace.pallas_sit.min", min(ps))
    add("single.trace.pallas_sit.max", max(ps))
    for sch in RECOVERING:
        key = sch.replace("-", "_")
        f = [r[sch] / r[PALLAS] for r in tr]
        add(f"single.trace.factor_{key}.min", min(f))
        add(f"single.trace.factor_{key}.max", max(f))
    return c


def run_pallas_delayed(d, p, rates, k_ho: np.ndarray, delay_s: np.ndarray) -> M.OnlineResult:
    """:func:`run_pallas` with the correct prediction withheld until ``delay_s`` (n, 1) before
    each handover (the prediction-stress experiment)."""
    k0 = np.maximum(0.0, k_ho - rates.r_d * d.ho_time[:, 0])
    return M.run_online(d, p, rates, k0, np.full((d.n, 1), rates.bandwidth), delay_correct_s=delay_s)
