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

It needs the replay's emulated regime; this checkout's replay lacks it, so the live mode stops
with :func:`missing` naming what is absent rather than printing any figure it did not measure.
"""

from __future__ import annotations

import dataclasses

LIVE_SCALE = {
    "single": "Qwen3-32B emulated, 300 Mbit/s, 8 handovers (2 contexts per interval)",
    "repeated": "one round, one drive per handover count 1-4 (10 handovers), Qwen3-32B emulated",
    "window": "300 Mbit/s, Qwen3-14B emulated, 3,000 tokens: fixed windows 0, 0.4, 0.8, 1.6, 3.2, 5 s and Pallas",
    "contention": "Qwen3-14B emulated, 2,000 tokens: HH n=2, HI m=4, 3 repetitions",
    "ablation": "Pallas, w/o RC, w/o SM on 8 single handovers, Qwen3-14B emulated, 300 Mbit/s",
    "stress": "Qwen3-14B emulated, 300 Mbit/s, 2,000 tokens, T_avail 0.3, 1, 3 s",
}
REQUIRED_FIELDS = ("regime", "emulate")


def missing() -> list[str]:
    """What the live mode needs and this checkout lacks (empty when it can run)."""
    from pallas_eval import replay as rp
    have = {f.name for f in dataclasses.fields(rp.ReplayOptions)}
    return [f"pallas_eval.replay.ReplayOptions.{f} (pallas replay --regime paper --emulate MODEL)"
            for f in REQUIRED_FIELDS if f not in have]


def message(name: str) -> str:
    """The live mode's refusal for experiment ``name``: what is missing and what to run instead."""
    miss = missing()
    what = "; ".join(miss) if miss else "a live driver for this experiment (only the simulate mode is implemented)"
    return (f"pallas experiment {name}: the live mode would run the real xApp, agents and vLLM at this scale: "
            f"{LIVE_SCALE.get(name, 'per experiment, see pallas_eval/experiments/live.py')}. "
            f"It needs {what}, which this checkout lacks. Nothing was run and no live figure is printed; "
            f"use --simulate for the timing model's figures.")
