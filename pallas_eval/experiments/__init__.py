"""The paper's experiments (section 6), each one command: ``pallas experiment NAME``.

``--simulate`` runs the timing model (``pallas_common.timing``, docs/model.md) at the paper's full
scale with the paper's rates (``presets``) in seconds; the live mode is described in ``live``.
Every experiment writes ``OUT/NAME/NAME.csv``, ``NAME.json`` and its figure, and the runner
prints our value beside the paper's (``paper_values.json``) with the ratio, then a closing note
of every difference beyond 20% and why.

| name | paper | figure written |
|---|---|---|
| single | 6.1, Figure 5(a)-(e); 2.2, Table 1 | figure5.png |
| repeated | 6.2, Table 2 (2,880 handovers per model) | table2.png |
| window | 6.3, Figure 6; 2.3, Figure 2 | figure6.png |
| contention | 6, Figure 8 (HH, HI, both) | figure8.png |
| ablation | 6.4, Figure 9 | figure9.png |
| stress | 6.3, prediction stress (SIT against T_avail) | stress.png |
"""

from __future__ import annotations

import importlib
import inspect
import time
from pathlib import Path
from typing import Sequence

from pallas_eval.experiments.base import ExperimentResult, comparison_table, differences

NAMES = ("single", "repeated", "window", "contention", "ablation", "stress")


def run_simulated(name: str, out_dir: Path, *, tiny: bool = False, gpu: str = "rtx-a6000", seed: int = 17,
                  hop_model: str | None = None) -> ExperimentResult:
    """Run one experiment in simulate mode into ``out_dir / name`` and write its files.

    ``hop_model`` (``pallas_common.timing.HOP_COSTS``; None: the default) goes to the
    experiments whose ``run`` takes one (those relaying over several hops); the others' Detour
    is one hop at the rates' ``hop_delay_s``. Raises KeyError for an unknown name or hop model."""
    if name not in NAMES:
        raise KeyError(f"unknown experiment {name!r}; known: {', '.join(NAMES)}, all")
    mod = importlib.import_module(f"pallas_eval.experiments.{name}")
    kw = {}
    if hop_model is not None:
        from pallas_common.timing import hop_cost
        hop_cost(hop_model)
        if "hop_model" in inspect.signature(mod.run).parameters:
            kw["hop_model"] = hop_model
    t0 = time.perf_counter()
    res = mod.run(out_dir / name, tiny=tiny, gpu=gpu, seed=seed, **kw)
    if gpu != "rtx-a6000":
        # The reasons recorded in the modules are for the paper's GPU; say what changed instead.
        for c in res.comparisons:
            c.why = f"preset: --gpu {gpu} runs that GPU's measured rates, not the paper's RTX A6000"
    res.wall_s = time.perf_counter() - t0
    res.write(out_dir / name)
    return res


def print_results(con, results: Sequence[ExperimentResult], wall_s: float) -> None:
    """The comparison table, the files written, and the closing note (rich Console ``con``)."""
    con.print(comparison_table(results, title="Ours (simulate mode) beside the paper; * = differs by more than 20%"))
    for r in results:
        con.print(f"[bold]{r.name}[/] ({r.wall_s:.1f} s): " + "; ".join(r.notes)
                  + f" -> {', '.join(p.name for p in r.plots)}")
    diff = differences(results)
    con.print(f"\n[bold]Where we differ from the paper by more than 20% ({len(diff)}):[/]")
    for line in diff:
        con.print(f"- {line}")
    con.print(f"\nwall time {wall_s:.1f} s")
