"""``stress``: SIT against the prediction lead T_avail (paper section 6.3, the prediction-stress
experiment).

The single-handover events (``single``) with Qwen3-14B at 300 Mbit/s and contexts of 1,000,
2,000 and 3,000 tokens (section 6's workloads for this experiment). T_avail is imposed by
delaying the stable correct prediction: a CVH prediction naming the right target is withheld
until T_avail before the handover (wrong ones are kept, so preparation may start at a wrong
target and be discarded: Eq. 10's T_discard, reported beside its bound with E_early = 0).
Each event's context is the nominal one plus a uniform part of a block (0-16 tokens), so that
handovers do not all fall on a block edge.
The Scheduler Engine runs online; the reactive schemes do not depend on T_avail.
"""

from __future__ import annotations

import numpy as np

from pallas_common import timing
from pallas_common.schemes import PALLAS, RECOVERING
from pallas_eval.experiments import presets as PR
from pallas_eval.experiments import single as S
from pallas_eval.experiments.base import ExperimentResult
from pallas_eval.simulate import simulate_arrays

T_AVAIL = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0)
CONTEXTS = (1000, 2000, 3000)
MODEL, GOODPUT = "qwen3-14b", 300.0


def run(out_dir, *, tiny: bool = False, seed: int = 17, gpu: str = "rtx-a6000") -> ExperimentResult:
    """The experiment (module docstring); ``tiny``: 8 events and five leads."""
    from pallas_eval.experiments.figures import plot_stress
    n = 8 if tiny else 60
    leads = (0.0, 0.3, 1.0, 2.0, 5.0) if tiny else T_AVAIL
    d, p = S.events(seed, n)
    r = PR.rates(MODEL, gpu, GOODPUT)
    rows, curves = [], []
    for k in CONTEXTS:
        # the context plus a uniform part-block, so the handover does not always fall on a block edge
        ctx = float(k) + np.random.default_rng([seed, k]).uniform(0, r.block_size, n)
        base = simulate_arrays(ctx, 0.0, r, RECOVERING)
        for lead in leads:
            delay = np.full(d.ho_time.shape, lead)
            on = S.run_pallas_delayed(d, p, r, ctx, delay)
            sit = on.sit[:, 0]
            ta = on.t_avail[:, 0]
            disc = on.discarded[:, 0]
            bound = timing.discard_bound(5.0, 0.0, ta)
            for i in range(n):
                rows.append({"context": k, "t_avail_imposed_s": lead, "event": i, "t_avail_s": ta[i],
                             "committed": bool(on.committed[i, 0]), "window_s": on.window[i, 0],
                             "sit_pallas_s": sit[i], "discarded_s": disc[i], "discard_bound_s": bound[i],
                             **{f"sit_{s}_s": float(base.sit[s][i]) for s in RECOVERING}})
            curves.append({"context": k, "t_avail_s": lead, PALLAS: float(sit.mean()),
                           "commit_share": float(on.committed[:, 0].mean()), "discarded_s": float(disc.mean()),
                           **{s: float(base.sit[s].mean()) for s in RECOVERING}})
    out_dir.mkdir(parents=True, exist_ok=True)
    plot = plot_stress(out_dir / "stress.png", curves)
    notes = [f"{n} events x {len(leads)} leads x {len(CONTEXTS)} contexts, {MODEL} at {GOODPUT:.0f} Mbit/s ({gpu}); "
             "the paper's text states no value for this figure, so nothing is compared"]
    return ExperimentResult("stress", "simulate", rows, {"curves": curves}, [plot], [], notes)
