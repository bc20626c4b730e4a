"""How early the xApp's predictor names each handover's target on the replay's generated drive.

For each seed: the replay's own input (``pallas_eval.prepare.generate``: the drive of ``--ues``
UEs and, with ``--history-drives``, the earlier traffic of other UEs in the same network),
decoded with the xApp's ingest; a ``HandoverPredictor`` configured as the shipped descriptor's
``controls.predictor`` with the E2 node's neighbour relation table, starting from what it learns
from the history trace (``association_map.path``) or empty; every report of the drive observed
and predicted in time order across the UEs, as the xApp's control loop does (each UE as of its
newest report). Per handover (source A, target B at time T):

- lead (T_avail, docs/model.md §5): T minus the start of the final run of reports on A whose
  reported target is B (0 if the last one before T is not B);
- at T - 1 s: whether the reported target is B and the predicted time is within 0.5 s of T.

Prints, per setting, the share of handovers with lead > 0, >= 0.5, >= 1, >= 2 s, the median
lead and the timed share. Run in the xApp's environment:
``.venv/xapp/bin/python benchmarks/replay_predictions.py --seeds 1,2,3``. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def leads(seed: int, history_drives: int, ues: int, duration_s: float) -> list[tuple[float, bool]]:
    """(lead s, timed at T - 1 s) per handover of the seed's replayed drive."""
    from pallas_eval.prepare import generate
    from xapp.config import from_descriptor
    from xapp.e2.ingest import decode_trace
    from xapp.predict import HandoverPredictor, PredictorConfig, knowledge_from_drives_at
    from xapp.tracks import UETrack

    desc = json.loads((REPO / "descriptors" / "config-file.json").read_text())
    cfg = from_descriptor(desc).predictor
    if not isinstance(cfg, PredictorConfig):
        cfg = PredictorConfig.from_dict(dict(cfg))
    with tempfile.TemporaryDirectory() as d:
        trace, nrt, hist = generate(Path(d), seed=seed, ues=ues, duration_s=duration_s, speed_mps=16.0,
                                    rows=2, cols=2, history_drives=history_drives)
        reports, _ = decode_trace(str(trace))
        know = knowledge_from_drives_at(hist, cfg.cvh.tile_m, cfg.history.smoothing,
                                        cfg.history.backoff_weight) if hist else None
    p = HandoverPredictor(cfg, knowledge=know)
    for pci, cell in nrt.items():
        p.knowledge.nrt.add_serving(pci, cell)
    tracks: dict[str, UETrack] = {}
    seen: dict[str, list[tuple[float, int, int, float]]] = {}
    for _, r in sorted(reports, key=lambda x: (x[1].time, x[1].ue_id)):
        tr = tracks.setdefault(r.ue_id, UETrack(r.ue_id, capacity=cfg.window_reports, max_neighbours=16))
        tr.append(r)
        p.observe(r)
        pr = p.predict(tr, r.time)
        seen.setdefault(r.ue_id, []).append((r.time, r.serving_cell, pr.target_cell if pr else -1,
                                             pr.t_ho if pr else math.nan))
    out = []
    for rows in seen.values():
        for i in range(1, len(rows)):
            t, cell, _, _ = rows[i]
            src = rows[i - 1][1]
            if cell == src or cell < 0:
                continue
            j, lead = i - 1, 0.0
            if rows[j][2] == cell:
                while j > 0 and rows[j - 1][2] == cell and rows[j - 1][1] == src:
                    j -= 1
                lead = t - rows[j][0]
            before = [x for x in rows[:i] if x[0] <= t - 1.0]
            timed = bool(before) and before[-1][1] == src and before[-1][2] == cell \
                and abs(before[-1][3] - t) <= 0.5
            out.append((lead, timed))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--history-drives", default="0,16", help="comma-separated settings to compare")
    ap.add_argument("--ues", type=int, default=6)
    ap.add_argument("--duration-s", type=float, default=90.0)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    for h in (int(x) for x in a.history_drives.split(",")):
        rec = [x for s in seeds for x in leads(s, h, a.ues, a.duration_s)]
        lead = np.array([x[0] for x in rec])
        timed = np.mean([x[1] for x in rec])
        print(f"history drives {h:>3}: {len(rec)} handovers (seeds {a.seeds}); target named with lead > 0: "
              f"{np.mean(lead > 0):.0%}, >= 0.5 s: {np.mean(lead >= 0.5):.0%}, >= 1 s: {np.mean(lead >= 1):.0%}, "
              f">= 2 s: {np.mean(lead >= 2):.0%}; median lead {np.median(lead):.2f} s; at T - 1 s right target "
              f"and time within 0.5 s: {timed:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
