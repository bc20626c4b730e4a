"""Detour's per-hop cost against the paper's Figure 1: the ITL distribution at 0-3 hops.

Draws ``--n`` inter-token latencies per hop count from ``pallas_common.timing.PAPER_HOP_COST``
on each model's decode step on the paper's testbed (``presets.PAPER_ITL_S``: 48 ms Qwen3-32B,
28 ms Llama-3-8B) and prints P50, P90, P99 and the share over the 100 ms SLO beside the figures
the paper gives (section 2.2). No timing: the printed figures are the model's.

    .venv/agent/bin/python benchmarks/detour_calibration.py [--n 200000] [--seed 1]
"""

from __future__ import annotations

import argparse

import numpy as np

from pallas_common import timing
from pallas_eval.experiments.presets import PAPER_ITL_S

#: Figure 1 as the paper's text gives it: (model, hops) -> {figure: value (ms or %)}.
PAPER = {("qwen3-32b", 2): {"slo%": 1.93}, ("qwen3-32b", 3): {"p90": 126.68, "p99": 263.54, "slo%": 12.94},
         ("llama-3-8b", 2): {"slo%": 1.74}, ("llama-3-8b", 3): {"p90": 130.54, "slo%": 12.61}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="draws per hop count")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    c = timing.PAPER_HOP_COST
    print(f"hop cost: {c} (mean {c.mean_s() * 1000:.1f} ms a hop)")
    print(f"{'model':<11} {'hops':>4} {'p50':>7} {'p90':>7} {'p99':>7} {'>100ms':>7}   paper")
    for model in ("qwen3-32b", "llama-3-8b"):
        for h in range(4):
            x = 1000 * timing.detour_itl_samples(rng, PAPER_ITL_S[model], h, a.n)
            paper = PAPER.get((model, h), {})
            ref = ", ".join(f"{k} {v:g}" for k, v in paper.items()) or "-"
            print(f"{model:<11} {h:>4} {np.percentile(x, 50):7.1f} {np.percentile(x, 90):7.1f} "
                  f"{np.percentile(x, 99):7.1f} {100 * np.mean(x > 100):6.2f}%   {ref}")


if __name__ == "__main__":
    main()
