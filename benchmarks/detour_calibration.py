"""Detour's per-hop cost against the paper's Figure 1: the ITL distribution at 0-3 hops, and the fit.

Draws ``--n`` inter-token latencies per hop count from each hop-cost model of
``pallas_common.timing.HOP_COSTS`` on each model's decode step on the paper's testbed
(``presets.PAPER_ITL_S``: 48 ms Qwen3-32B, 28 ms Llama-3-8B) and prints P50, P90, P99 and the
share over the 100 ms SLO beside the figures the paper's text gives for Figure 1 (section 2.2,
``presets.FIGURE1_ITL``), then each model's fit error (the sum of the squared log ratios over
those seven points, :func:`fit_error`) and its mean cost per token at 1-8 hops. No timing: the
printed figures are the model's.

``--fit compounding`` (or ``linear``) refits that family to the seven points by Nelder-Mead over
common random numbers (``--n`` draws per hop, four starts) and prints the parameters: how
``timing.PAPER_HOP_COST`` (``--fit compounding``) was obtained (docs/model.md section 6.1).
``PAPER_HOP_COST_LINEAR`` is the earlier fit of the linear family to Qwen3-32B's four points alone.

    .venv/agent/bin/python benchmarks/detour_calibration.py [--n 200000] [--seed 1] [--fit compounding]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from pallas_common import timing
from pallas_eval.experiments.presets import FIGURE1_ITL, PAPER_ITL_S

SLO_S = 0.100


def figures(itl_s: np.ndarray) -> dict[str, float]:
    """P50/P90/P99 (ms) and share over the SLO (%) of ITL draws ``itl_s`` (s, shape (n,))."""
    x = 1000 * np.asarray(itl_s)
    return {"p50": float(np.percentile(x, 50)), "p90": float(np.percentile(x, 90)),
            "p99": float(np.percentile(x, 99)), "slo%": 100 * float(np.mean(x > 1000 * SLO_S))}


def fit_error(model_figures: dict[tuple[str, int], dict[str, float]]) -> float:
    """Sum over Figure 1's points (``FIGURE1_ITL``) of log(model / paper) squared."""
    return sum(math.log(max(model_figures[key][k], 1e-3) / v) ** 2
               for key, pts in FIGURE1_ITL.items() for k, v in pts.items())


class _CommonDraws:
    """Fixed normal, uniform and unit-exponential draws, shape (3, n): every candidate of the
    fit is evaluated on the same randomness, so the error is a deterministic function."""

    def __init__(self, n: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.z, self.u, self.e = rng.standard_normal((3, n)), rng.random((3, n)), rng.exponential(1.0, (3, n))

    def added(self, c: timing.HopCost, hops: int) -> np.ndarray:
        out = np.zeros(self.z.shape[1])
        for k in range(hops):
            stall = np.where(self.u[k] < c.stall_prob_at(k + 1), c.stall_mean_s * self.e[k], 0.0)
            out += c.fixed_s + c.jitter_median_s * np.exp(c.jitter_sigma * self.z[k]) + stall
        return out

    def figures(self, c: timing.HopCost) -> dict[tuple[str, int], dict[str, float]]:
        return {(m, h): figures(PAPER_ITL_S[m] + self.added(c, h)) for m, h in FIGURE1_ITL}


def _cost(theta: np.ndarray, compounding: bool) -> timing.HopCost:
    f, jm, js, sm = np.exp(theta[[0, 1, 2, 4]])
    return timing.HopCost(float(f), float(jm), float(js), float(1 / (1 + np.exp(-theta[3]))), float(sm),
                          float(np.exp(theta[5])) if compounding else 1.0)


def _nelder_mead(fun, x0: np.ndarray, step: float, iters: int = 1500) -> tuple[np.ndarray, float]:
    n = len(x0)
    pts = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    val = [fun(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(val)
        pts, val = [pts[i] for i in order], [val[i] for i in order]
        if val[-1] - val[0] < 1e-7:
            break
        c = np.mean(pts[:-1], axis=0)
        xr = c + (c - pts[-1])
        fr = fun(xr)
        if fr < val[0]:
            xe = c + 2 * (c - pts[-1])
            fe = fun(xe)
            pts[-1], val[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < val[-2]:
            pts[-1], val[-1] = xr, fr
        else:
            xc = c + 0.5 * (pts[-1] - c)
            fc = fun(xc)
            if fc < val[-1]:
                pts[-1], val[-1] = xc, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                val = [val[0]] + [fun(p) for p in pts[1:]]
    i = int(np.argmin(val))
    return pts[i], val[i]


def fit(family: str, n: int, seed: int) -> tuple[timing.HopCost, float]:
    """The ``family`` (``compounding``: growth free; ``linear``: growth 1) fitted to Figure 1."""
    draws = _CommonDraws(n, seed)
    comp = family == "compounding"

    def err(theta):
        return fit_error(draws.figures(_cost(theta, comp)))

    best = None
    for s in ((8.2, 5.2, 0.6, 0.008, 188, 1.0), (5, 5, 0.5, 0.003, 150, 5.0), (2, 10, 0.3, 0.002, 120, 6.0),
              (10, 3, 0.8, 0.01, 100, 3.0)):
        th = np.array([math.log(s[0] / 1000), math.log(s[1] / 1000), math.log(s[2]), math.log(s[3] / (1 - s[3])),
                       math.log(s[4] / 1000), math.log(s[5])])
        th, e = _nelder_mead(err, th, 0.3)
        th, e = _nelder_mead(err, th, 0.1)
        print(f"  start {s}: error {e:.4f}", flush=True)
        if best is None or e < best[1]:
            best = (th, e)
    return _cost(best[0], comp), best[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="draws per hop count")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fit", choices=("compounding", "linear"), help="refit this family to Figure 1 and print it")
    a = ap.parse_args(argv)
    if a.fit:
        c, e = fit(a.fit, a.n, a.seed)
        print(f"fitted {a.fit}: {c} (error {e:.4f})")
        return
    for name, c in timing.HOP_COSTS.items():
        rng = np.random.default_rng(a.seed)
        print(f"\n{name}: {c}")
        print(f"{'model':<11} {'hops':>4} {'p50':>7} {'p90':>7} {'p99':>7} {'>100ms':>7}   paper")
        got = {}
        for model in ("qwen3-32b", "llama-3-8b"):
            for h in range(4):
                got[(model, h)] = f = figures(timing.detour_itl_samples(rng, PAPER_ITL_S[model], h, a.n, c))
                ref = ", ".join(f"{k} {v:g}" for k, v in FIGURE1_ITL.get((model, h), {}).items()) or "-"
                print(f"{model:<11} {h:>4} {f['p50']:7.1f} {f['p90']:7.1f} {f['p99']:7.1f} {f['slo%']:6.2f}%   {ref}")
        print(f"fit error over Figure 1's seven points: {fit_error(got):.3f}")
        print("mean cost a token, ms, at 1-8 hops: "
              + " ".join(f"{1000 * c.mean_s(h):.0f}" for h in range(1, 9)))


if __name__ == "__main__":
    main()
