"""``window``: fixed prefetching windows against the one Pallas selects (paper section 6.3,
Figure 6; and section 2.3's Figure 2).

Nine configurations from the three-level orthogonal array L9(3^3) over goodput (100, 300,
500 Mbit/s), model (Llama-3-8B, Qwen3-14B, Qwen3-32B) and context at the handover (1,000,
2,000, 3,000 tokens). In each, one handover event: the right target predicted ``LEAD_S``
(5 s, T_max) ahead with the right time, so every fixed window is available. Fixed windows
0-5 s in 0.2 s steps are evaluated with Eqs. 4-8 (``timing.evaluate_windows``: SIT, T_early,
J); Pallas's window is Eq. 9's choice (``timing.decide``, dT = 0.1 s, alpha = 0.8).
"""

from __future__ import annotations

import numpy as np

from pallas_common import timing
from pallas_eval.experiments import presets as PR
from pallas_eval.experiments.base import Comparison, ExperimentResult

GOODPUTS = (100.0, 300.0, 500.0)
CONTEXTS = (1000, 2000, 3000)
#: L9(3^3): level indices (goodput, model, context) of the nine runs.
L9 = ((0, 0, 0), (0, 1, 1), (0, 2, 2), (1, 0, 1), (1, 1, 2), (1, 2, 0), (2, 0, 2), (2, 1, 0), (2, 2, 1))
LEAD_S = 5.0
ALPHA = 0.8


def fixed_windows(step: float = 0.2, t_max: float = 5.0) -> np.ndarray:
    """0, step, ..., t_max (s)."""
    return np.round(np.arange(0.0, t_max + step / 2, step), 10)


def configuration(model: str, goodput: float, context: float, gpu: str = "rtx-a6000", windows=None):
    """One configuration: (fixed windows, their WindowCosts, Pallas's Decision)."""
    r = PR.rates(model, gpu, goodput)
    x = timing.WindowInputs(k_curr=context - r.r_d * LEAD_S, t_remain=LEAD_S, block_size=r.block_size, r_p=r.r_p,
                            r_d=r.r_d, bandwidth=r.bandwidth, s_kv=r.s_kv, c_sync=r.c_sync)
    w = fixed_windows() if windows is None else np.asarray(windows, dtype=np.float64)
    return w, timing.evaluate_windows(x, w, ALPHA), timing.decide(x, timing.DecisionParams(alpha=ALPHA))


def run(out_dir, *, tiny: bool = False, seed: int = 17, gpu: str = "rtx-a6000") -> ExperimentResult:
    """The experiment (module docstring); ``tiny`` evaluates the first three configurations."""
    from pallas_eval.experiments.figures import plot_figure6
    rows, configs = [], []
    for gi, mi, ci in (L9[:3] if tiny else L9):
        g, m, k = GOODPUTS[gi], PR.MODELS[mi], CONTEXTS[ci]
        w, c, dsn = configuration(m, g, k, gpu)
        for i, tw in enumerate(w):
            rows.append({"goodput_mbps": g, "model": m, "context": k, "window_s": tw, "sit_s": c.t_sit[0, i],
                         "t_early_s": c.t_early[0, i], "j_s": c.j[0, i], "selected": False})
        rows.append({"goodput_mbps": g, "model": m, "context": k, "window_s": float(dsn.window[0]),
                     "sit_s": float(dsn.t_sit[0]), "t_early_s": float(dsn.t_early[0]), "j_s": float(dsn.j[0]),
                     "selected": True})
        configs.append({"goodput_mbps": g, "model": m, "context": k, "windows_s": w.tolist(),
                        "sit_s": c.t_sit[0].tolist(), "t_early_s": c.t_early[0].tolist(), "j_s": c.j[0].tolist(),
                        "selected_s": float(dsn.window[0]), "selected_sit_s": float(dsn.t_sit[0]),
                        "selected_t_early_s": float(dsn.t_early[0]), "selected_j_s": float(dsn.j[0]),
                        "min_fixed_j_s": float(c.j[0].min())})
    out_dir.mkdir(parents=True, exist_ok=True)
    plot = plot_figure6(out_dir / "figure6.png", configs)
    comps = []
    if not tiny:
        _, f2, _ = configuration("qwen3-14b", 300.0, 3000, gpu, windows=[0.0, 1.0, 4.0])
        sel = next(c for c in configs if c["model"] == "qwen3-14b" and c["goodput_mbps"] == 300.0
                   and c["context"] == 3000)
        comps = [Comparison("window.fig2.sit_at_0", float(f2.t_sit[0, 0]), _why("window.fig2.sit_at_0")),
                 Comparison("window.fig2.sit_at_1s", float(f2.t_sit[0, 1]), _why("window.fig2.sit_at_1s")),
                 Comparison("window.fig2.idle_at_4s", float(f2.t_early[0, 2]), _why("window.fig2.idle_at_4s")),
                 Comparison("window.selected", sel["selected_s"], _why("window.selected")),
                 Comparison("window.selected_sit", 1000 * sel["selected_sit_s"], _why("window.selected_sit")),
                 Comparison("window.selected_t_early", sel["selected_t_early_s"], _why("window.selected_t_early"))]
    notes = [f"{len(configs)} configuration(s) of L9 over goodput x model x context; fixed windows 0-5 s step 0.2 s; "
             f"lead {LEAD_S:.0f} s; {gpu} rates"]
    return ExperimentResult("window", "simulate", rows, {"configs": configs}, [plot], comps, notes)


WHY = {
    "window.selected_t_early": "docs/model.md: with dT = 0.1 s the selected window overshoots the time the state is ready by "
                               "up to one step (ours 35 ms, the paper's 17 ms): tens of ms either way, so the ratio of "
                               "two near-zero values is large",
    "window.selected": "preset: Eq. 9 picks about the first window at which the prefix is ready; with the r_p that fits "
                       "Figure 2's 1.1 s at T_w = 0 that is 0.95 s. The paper's 1.64 s and its 2.4 s of idle time at "
                       "4 s both say its prefix took about 1.6 s, slower than the rate its own T_w = 0 point implies",
    "window.fig2.idle_at_4s": "preset: T_early = T_w - T_ready with our prefix ready at 0.95 s gives 3.05 s at 4 s; the "
                              "paper's 2.4 s (60% of the window) means ready at about 1.6 s (see window.selected)",
    "window.fig2.sit_at_1s": "docs/model.md: at exactly 1.0 s the model's prefix is done and the last block already sent, "
                             "leaving c_sync + 1/r_d = 0.19 s; the paper's 0.25 s there still holds some residue "
                             "(its prefix ran slower, see window.selected)",
}


def _why(key: str) -> str:
    return next((v for k, v in WHY.items() if key.startswith(k)), "")
