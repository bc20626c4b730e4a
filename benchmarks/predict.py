"""The handover predictor over 10,000 UEs per control cycle (issue 15: < 50 ms on one core).

Builds N UE tracks in one ``TrackStore`` from generated drives (``pallas_tools.radio``: 8
neighbours with PCIs every 200 ms, a fix per second), each UE replaying the 32 reports before a
random point of a random drive, with the knowledge (association map, handover places,
successors, NRT) learned from the drives. Then times, as CPU time of this process
(``time.process_time``: one core, so that a shared machine does not inflate it), median of
``--cycles``:

1. ``store.window``: gathering the changed UEs' newest ``window_reports`` reports;
2. each source alone over all N UEs (A3 forecast, CVH, handover places, successor history);
3. the whole cycle the xApp runs, ``HandoverPredictor.update`` with every UE changed
   (combined mode: all sources, the combination, the stabiliser and calibration);
4. ingestion: ``TrackStore.add`` + ``HandoverPredictor.observe`` per report.

Run: ``python benchmarks/predict.py [--ues 10000] [--cycles 7] [--trend lagged_pairs]``.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from xapp.predict import HandoverPredictor, Knowledge, PredictorConfig  # noqa: E402
from xapp.predict.a3 import forecast_batch  # noqa: E402
from xapp.predict.cvh import cvh_batch, motion_batch, places_batch  # noqa: E402
from pallas_tools.radio import generate_drives  # noqa: E402
from xapp.tracks import MeasurementReport, TrackStore  # noqa: E402


def cpu(fn, n: int) -> tuple[float, object]:
    """Median CPU seconds of n calls of fn (after one warm-up) and the last result."""
    out = fn()
    ts = []
    for _ in range(n):
        t0 = time.process_time()
        out = fn()
        ts.append(time.process_time() - t0)
    return statistics.median(ts), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ues", type=int, default=10_000)
    ap.add_argument("--cycles", type=int, default=7)
    ap.add_argument("--trend", default=None, help="A3 trend: lagged_pairs (default) or all_pairs")
    a = ap.parse_args()
    _, drives = generate_drives(n=4, duration_s=300.0, seed=7)
    cfg = PredictorConfig()
    if a.trend:
        cfg = dataclasses.replace(cfg, a3=dataclasses.replace(cfg.a3, trend=a.trend))
    know = Knowledge.from_drives([d.drive for d in drives])
    W = cfg.window_reports
    rng = np.random.default_rng(0)
    store = TrackStore(capacity=W, max_neighbours=8, max_ues=a.ues, initial_slots=a.ues)
    hp = HandoverPredictor(cfg, know, learn_online=False)
    now = 1000.0
    t_add = t_obs = 0.0
    n_rep = 0
    for u in range(a.ues):
        d = drives[int(rng.integers(len(drives)))]
        i = int(rng.integers(W, len(d.reports)))
        off = now - d.reports[i - 1].time
        for r in d.reports[i - W:i]:
            rr = dataclasses.replace(r, time=r.time + off, ue_id=f"ue{u}")
            t0 = time.process_time()
            store.add(rr)
            t1 = time.process_time()
            hp.observe(rr)
            t_obs += time.process_time() - t1
            t_add += t1 - t0
            n_rep += 1
    slots = store.held()
    ues = store.ue_of(slots)
    nows = np.full(len(slots), now)
    print(f"# {a.ues} UEs x {W} reports x 8 neighbours; A3 trend {cfg.a3.trend}; CPU ms per cycle (median of "
          f"{a.cycles}); load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    t_win, v = cpu(lambda: store.window(slots, W), a.cycles)
    print(f"store.window (gather)        {1e3 * t_win:8.1f} ms")
    t_a3, f = cpu(lambda: forecast_batch(v, nows, cfg.a3), a.cycles)
    print(f"A3 forecast                  {1e3 * t_a3:8.1f} ms   ({int(f.has.sum())} UEs with one)")
    t_mo, mo = cpu(lambda: motion_batch(v, know.assoc, cfg.cvh), a.cycles)
    t_cv, cv = cpu(lambda: cvh_batch(v, nows, know.assoc, cfg.cvh, mo), a.cycles)
    print(f"CVH (+ motion {1e3 * t_mo:.1f} ms)         {1e3 * t_cv:8.1f} ms   ({int(cv.has.sum())} UEs with one)")
    t_pl, pl = cpu(lambda: places_batch(v, nows, know.assoc, know.places, cfg.cvh, mo), a.cycles)
    print(f"handover places              {1e3 * t_pl:8.1f} ms   ({int(pl.has.sum())} UEs with one)")
    t_hi, _ = cpu(lambda: hp.history.batch(v, nows, ues), a.cycles)
    print(f"successor history            {1e3 * t_hi:8.1f} ms")

    def cycle():
        store._a["changed"][slots] = True          # every UE has new inputs
        return hp.update(store, now)

    t_cy, res = cpu(cycle, a.cycles)
    print(f"HandoverPredictor.update     {1e3 * t_cy:8.1f} ms   combined, all {a.ues} UEs changed: "
          f"{a.ues / t_cy:,.0f} UE predictions/s; {int(res.has.sum())} UEs with a prediction")
    print(f"ingest per report: TrackStore.add {1e6 * t_add / n_rep:.1f} us, observe {1e6 * t_obs / n_rep:.1f} us")
    print(f"store: {store.bytes_per_ue} bytes per UE ({store.nbytes / 2**20:.1f} MiB for {len(store)} UEs)")
    print(f"target: a cycle over {a.ues} changed UEs < 50 ms on one core: {'meets' if t_cy < 0.05 else 'misses'} it")


if __name__ == "__main__":
    main()
