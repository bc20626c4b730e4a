"""The live mode of ``pallas experiment``: the real xApp, agents and vLLM servers.

Each experiment's live mode runs the replay (``pallas_eval.replay``: tiny-model vLLM servers with
an agent each, the xApp in test mode, the UE harness) in the regime-faithful emulation of
model.md section 9 (``pallas replay --regime paper --emulate MODEL``: engines paced to the
emulated model's r_p and r_d, the link scaled by the KV-size ratio, so every timing is the
emulated model's), at a scale this 2-core machine carries:

| name | live scale |
|---|---|
| single | one model (Qwen3-32B emulated), 300 Mbit/s, 8 handovers (2 contexts per interval) |
| repeated | one round of one drive per handover count 1-4 (10 handovers), one model |
| window | the (300 Mbit/s, Qwen3-14B, 3,000 tokens) configuration, 6 fixed windows + Pallas |
| contention | HH with 2 migrations, HI with 4 residents, 3 repetitions |
| ablation | Pallas, w/o RC, w/o SM on the single-handover workload's 8 handovers |
| stress | T_avail in {0.3, 1, 3} s, one context |

``single`` has a live driver (:func:`run_single`): one replay of a generated drive in the paper
regime (``LIVE_UES`` UEs for ``LIVE_DURATION_S`` s, five schemes), whose handovers are single
handovers at the emulated model's rates and the scaled 300 Mbit/s link; it reports each scheme's
live SIT and ITL beside the timing model's for the same handovers (tokens at the handover,
prediction lead) and the SIT factors of Full-Copy, Recomputation and ctHO over Pallas, the
figures Figure 5 compares. The other experiments' live drivers are not written yet. Where the
replay lacks the emulated regime, or the experiment has no driver, the live mode stops with
:func:`message` naming what is missing rather than printing any figure it did not measure.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from pallas_common.schemes import COMPARED, PALLAS, RECOVERING
from pallas_eval.experiments.base import ExperimentResult

LIVE_SCALE = {
    "single": "Qwen3-32B emulated (--emulate), 300 Mbit/s scaled link, a generated drive of 2 UEs x 45 s (its handovers with a session in flight)",
    "repeated": "one round, one drive per handover count 1-4 (10 handovers), Qwen3-32B emulated",
    "window": "300 Mbit/s, Qwen3-14B emulated, 3,000 tokens: fixed windows 0, 0.4, 0.8, 1.6, 3.2, 5 s and Pallas",
    "contention": "Qwen3-14B emulated, 2,000 tokens: HH n=2, HI m=4, 3 repetitions",
    "ablation": "Pallas, w/o RC, w/o SM on 8 single handovers, Qwen3-14B emulated, 300 Mbit/s",
    "stress": "Qwen3-14B emulated, 300 Mbit/s, 2,000 tokens, T_avail 0.3, 1, 3 s",
}
REQUIRED_FIELDS = ("regime", "emulate")
LIVE_DRIVERS = ("single",)
LIVE_UES = 2
LIVE_DURATION_S = 45.0


def missing() -> list[str]:
    """What the live mode needs and this checkout lacks (empty when it can run)."""
    from pallas_eval import replay as rp
    have = {f.name for f in dataclasses.fields(rp.ReplayOptions)}
    return [f"pallas_eval.replay.ReplayOptions.{f} (pallas replay --regime paper --emulate MODEL)"
            for f in REQUIRED_FIELDS if f not in have]


def message(name: str) -> str:
    """The live mode's refusal for experiment ``name``: what is missing and what to run instead."""
    miss = missing()
    if name not in LIVE_DRIVERS:
        miss = miss + [f"a live driver for {name!r} (only {', '.join(LIVE_DRIVERS)} has one)"]
    what = "; ".join(miss)
    return (f"pallas experiment {name}: the live mode would run the real xApp, agents and vLLM at this scale: "
            f"{LIVE_SCALE.get(name, 'per experiment, see pallas_eval/experiments/live.py')}. "
            f"It needs {what}, which this checkout lacks. Nothing was run and no live figure is printed; "
            f"use --simulate for the timing model's figures.")


class LiveUnavailable(RuntimeError):
    """The live mode cannot run here; the message says what is missing."""


def run_single(out_dir: Path, con, *, emulate: str = "qwen3-32b", ues: int = LIVE_UES,
               duration_s: float = LIVE_DURATION_S, seed: int = 2) -> ExperimentResult:
    """``single`` live (module docstring): replay in the paper regime, then each scheme's live
    SIT/ITL beside the timing model's for the same handovers. Writes the replay's own outputs
    under ``out_dir / "replay"``. Raises :class:`LiveUnavailable` where :func:`missing` is not
    empty, RuntimeError if the replay left processes running."""
    if missing():
        raise LiveUnavailable(message("single"))
    from pallas_eval import replay as rp
    from pallas_eval.cli import run_replay
    from pallas_eval.experiments.figures import plot_live_single
    opts = rp.ReplayOptions(out_dir=out_dir / "replay", regime="paper", emulate=emulate, ues=ues,  # type: ignore[call-arg]
                            duration_s=duration_s, seed=seed, schemes=COMPARED)
    res = run_replay(opts, con)
    if res.get("leftover_pids"):
        raise RuntimeError(f"the replay left processes running: {res['leftover_pids']}")
    summ = json.loads((opts.out_dir / "summary.json").read_text())
    live = {s["scheme"]: s for s in summ["summary"]}
    model = summ.get("simulated", {}) or {}
    rows = []
    for sch, s in live.items():
        m = model.get(sch, {})
        rows.append({"scheme": sch, "handovers_with_session": s["handovers_with_session"],
                     "sit_mean_live_s": s["sit_mean"], "sit_p99_live_s": s["sit_p99"],
                     "itl_mean_live_s": s["itl_mean"], "itl_p99_live_s": s["itl_p99"],
                     "sit_mean_model_s": m.get("sit_mean", float("nan")),
                     "sit_p99_model_s": m.get("sit_p99", float("nan"))})

    def factor(col: str, sch: str) -> float:
        a = next((r[col] for r in rows if r["scheme"] == sch), float("nan"))
        b = next((r[col] for r in rows if r["scheme"] == PALLAS), float("nan"))
        return a / b if b and math.isfinite(a) and math.isfinite(b) else float("nan")

    factors = {sch: {"live": factor("sit_mean_live_s", sch), "model": factor("sit_mean_model_s", sch)}
               for sch in RECOVERING}
    pacing = summ.get("pacing") or {}
    held = bool(pacing.get("held", True))
    out_dir.mkdir(parents=True, exist_ok=True)
    plot = plot_live_single(out_dir / "figure5_live.png", rows, emulate if held else
                            f"{emulate} (NOT held: the machine did not keep the emulated rates)")
    notes = [f"live: {LIVE_SCALE['single']}; replay {ues} UE(s) x {duration_s:.0f} s in the paper regime emulating "
             f"{emulate}; the model's columns are the timing model at the emulated rates for the same handovers"]
    if not held:
        notes.append(f"the replay's pacing check failed, so the live SITs are not in the emulated model's units: "
                     f"{pacing.get('verdict', '')}")
    return ExperimentResult("single", "live", rows, {"factors_over_pallas": factors, "replay": str(opts.out_dir),
                                                     "regime": summ.get("regime"), "pacing": pacing}, [plot], [], notes)
