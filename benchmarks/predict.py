"""Handover predictions per second for 10,000 UEs (issue 7 target: a full cycle < 50 ms, one core).

Builds 10,000 UE tracks from generated drives (``xapp.sim.radio``: 8 neighbours with PCIs every
200 ms, a fix per second), then times

1. the vectorised A3 cycle (``BatchA3.forecast_all``) over all UEs: the per-cycle cost;
2. its ingestion (``BatchA3.observe``) per report;
3. the per-UE facade (``HandoverPredictor.predict`` for a sample of UEs, combined mode with
   knowledge learned from the drives), extrapolated to 10,000 UEs.

Run: ``python benchmarks/predict.py [--ues 10000] [--cycles 20]``. Prints figures; asserts nothing.
Times are CPU time of this process (``time.process_time``), i.e. one core, so that a shared
machine does not inflate them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from xapp.predict import HandoverPredictor, Knowledge, PredictorConfig  # noqa: E402
from xapp.predict.batch import BatchA3  # noqa: E402
from xapp.sim.radio import generate_drives  # noqa: E402
from xapp.tracks import MeasurementReport, TrackStore  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ues", type=int, default=10_000)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--sample", type=int, default=500, help="UEs timed on the per-UE path")
    a = ap.parse_args()
    net, drives = generate_drives(n=4, duration_s=300.0, seed=7)
    cfg = PredictorConfig()
    know = Knowledge.from_drives([d.drive for d in drives])
    W = 16
    rng = np.random.default_rng(0)
    batch = BatchA3(cfg.a3, max_ues=a.ues, window=W, slots=8, nrt=know.nrt)
    store = TrackStore(capacity=cfg.window_reports, max_neighbours=8, max_ues=a.ues)
    # every UE replays the last W reports before a random point of a random drive, shifted to now = 1000 s
    now = 1000.0
    t_ing = 0.0
    n_rep = 0
    for u in range(a.ues):
        d = drives[int(rng.integers(len(drives)))]
        i = int(rng.integers(cfg.window_reports, len(d.reports)))
        reps = d.reports[i - cfg.window_reports:i]
        off = now - reps[-1].time
        ue = f"ue{u}"
        for r in reps:
            rr = MeasurementReport(time=r.time + off, ue_id=ue, serving_cell=r.serving_cell, rsrp_dbm=r.rsrp_dbm,
                                   neighbours=r.neighbours, serving_pci=r.serving_pci, lat=r.lat, lon=r.lon,
                                   speed_mps=r.speed_mps, heading_deg=r.heading_deg)
            store.add(rr)
            t0 = time.process_time()
            batch.observe(rr)
            t_ing += time.process_time() - t0
            n_rep += 1
    # 1. the vectorised A3 cycle
    times = []
    for _ in range(a.cycles):
        t0 = time.process_time()
        f = batch.forecast_all(now)
        times.append(time.process_time() - t0)
    cyc = float(np.median(times))
    n_pred = int(np.sum(~np.isnan(f.t_ho)))
    print(f"BatchA3.forecast_all, {a.ues} UEs x {W} reports x 8 neighbours: median {1e3 * cyc:.1f} ms per cycle "
          f"(p90 {1e3 * float(np.percentile(times, 90)):.1f} ms), {a.ues / cyc:,.0f} UE predictions/s, "
          f"{n_pred} UEs with an A3 forecast")
    print(f"BatchA3.observe: {1e6 * t_ing / n_rep:.1f} us per report ({n_rep} reports)")
    # 3. the per-UE facade
    hp = HandoverPredictor(cfg, know)
    tracks = list(store)[: a.sample]
    t0 = time.process_time()
    got = sum(hp.predict(tr, now) is not None for tr in tracks)
    per = (time.process_time() - t0) / len(tracks)
    print(f"HandoverPredictor.predict (combined, per UE): {1e6 * per:.0f} us per UE -> {1e3 * per * a.ues:.0f} ms "
          f"for {a.ues} UEs ({1 / per:,.0f} UE predictions/s); {got}/{len(tracks)} with a prediction")
    print(f"target: a cycle over {a.ues} UEs < 50 ms on one core: vectorised A3 "
          f"{'meets' if cyc < 0.05 else 'misses'} it; the per-UE combined path "
          f"{'meets' if per * a.ues < 0.05 else 'misses'} it")


if __name__ == "__main__":
    main()
