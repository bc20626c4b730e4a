"""The whole xApp under load: N UEs at one E2 report per UE per second, in real time, one core.

    .venv/xapp/bin/python benchmarks/xapp_load.py [--ues 1000 10000] [--seconds 20] [--runs 3]

The xApp runs in test mode (``xapp.app.PallasXapp``, no RMR): a feeder thread hands it E2
RIC_INDICATION payloads (E2AP + E2SM-RC REPORT Style 1 message copy of an NR RRC
MeasurementReport: serving cell, up to 8 neighbours, position and velocity) at their scheduled
times, N per second spread evenly over each second, through its real ingest
(``on_indication``: E2 decode, TrackStore, online learning, handover detection); its control
cycle thread runs every ``--period`` s (predictor ``update`` over the UEs with new reports,
Scheduler Engine decision; default 0.05 s, half the descriptor's ``control_period_s``: an
indication waits up to one period for the cycle that uses it, so a 100 ms period alone would
spend the whole 100 ms lag budget); 10 % of the UEs have an LLM session, reported by agent
telemetry every second; the agents are faked at the gRPC boundary (in-process gRPC Control
servers answering OK), reached through the xApp's real PolicyClient.

The radio comes from generated drives (``pallas_tools.radio``): each UE follows a stretch of one
drive without a handover, sampled at 1 Hz; each UE's ``--distinct`` reports are encoded once and
repeated in a loop with advancing times (encoding every report of 10,000 UEs would take minutes).

Printed per N (median of ``--runs``; the process is pinned to one CPU unless ``--no-pin``):
indications per second sustained; lag from an indication's scheduled arrival to the end of the
control cycle whose prediction used it (p50, p99); CPU per UE per second of load (CPU time per
indication handled, all threads: decode, tracks, learning, cycles, telemetry, gRPC);
resident memory per tracked UE (RSS growth from before the first report to the end, over N;
the first run's, as later runs reuse memory the first one freed);
whether it kept up (the feeder ends less than 0.5 s behind schedule and p99 lag < 1 s). A run
stops at its duration however far behind it is. The share of a core the process got is printed
("CPU"): on a shared machine, a process that gets less than it needs falls behind.
Targets (issue 15): 10,000 UEs keep up, p99 lag < 100 ms, < 16 KiB per tracked UE.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "proto"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import structlog  # noqa: E402

from pallas_proto import pallas_pb2 as pb  # noqa: E402
from pallas_proto import pallas_pb2_grpc as pbg  # noqa: E402
from pallas_tools.tracegen import encode_rc_message_copy, encode_ric_indication  # noqa: E402
from pallas_tools.tracegen import encode_rrc_meas_report  # noqa: E402
from xapp.e2.e2ap import RicIndication  # noqa: E402
from xapp.e2.ie import Cgi, Guami, UeId  # noqa: E402
from xapp.e2.rrc import CellResult, RrcMeasReport, ServingResult  # noqa: E402
from xapp.e2.sm_rc import RcMessageCopy  # noqa: E402


class FakeAgent(pbg.ControlServicer):
    """An agent's Control service answering every call OK (the gRPC boundary of the load test)."""

    def __init__(self) -> None:
        self.calls = 0

    def _ok(self, request, context):
        self.calls += 1
        return pb.ControlReply(status=pb.STATUS_OK, session_id=request.session_id, epoch=request.epoch)

    Trigger = Cancel = Commit = _ok


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def build_trace(n: int, distinct: int, seed: int):
    """Per UE: its E2 UE key, its serving cell and ``distinct`` encoded RIC_INDICATIONs."""
    from pallas_tools.radio import generate_drives

    _, drives = generate_drives(n=16, duration_s=240.0, seed=seed)
    rng = np.random.default_rng(seed)
    ues = []
    for u in range(n):
        d = drives[int(rng.integers(len(drives)))].drive
        reps = d.reports[::5]                                   # 5 Hz -> 1 Hz
        cells = np.array([r.serving_cell for r in reps])
        ok = [i for i in range(len(reps) - distinct) if (cells[i:i + distinct] == cells[i]).all()]
        i0 = ok[int(rng.integers(len(ok)))] if ok else 0
        ue = UeId(kind="gNB", amf_ue_ngap_id=1 + u, guami=Guami())
        pays = []
        for r in reps[i0:i0 + distinct]:
            nbs = tuple(CellResult(nb.pci, nb.rsrp_dbm, -10.5, 10.0) for nb in r.neighbours[:8])
            rrc = RrcMeasReport(1, (ServingResult(0, CellResult(max(r.serving_pci, 0), r.rsrp_dbm, -10.5, 10.0)),),
                                nbs, r.lat if r.lat == r.lat else 51.9, r.lon if r.lon == r.lon else -8.4,
                                r.speed_mps if r.speed_mps == r.speed_mps else 10.0,
                                r.heading_deg if r.heading_deg == r.heading_deg else 0.0)
            h, m = encode_rc_message_copy(RcMessageCopy(encode_rrc_meas_report(rrc), ue,
                                                        Cgi("00101", int(r.serving_cell))))
            pays.append(encode_ric_indication(RicIndication(1, 1, 3, 1, h, m, sn=u % 65536)))
        ues.append((ue.key, int(reps[i0].serving_cell), pays))
    return ues


def run_once(trace, seconds: float, warmup: float, period: float | None = None) -> dict:
    from xapp.app import EventLog, PallasXapp
    from xapp.config import load_controls

    n = len(trace)
    servers, addrs = [], []
    agents = [FakeAgent(), FakeAgent()]
    for a in agents:
        s = grpc.server(futures.ThreadPoolExecutor(2))
        pbg.add_ControlServicer_to_server(a, s)
        port = s.add_insecure_port("127.0.0.1:0")
        s.start()
        servers.append(s)
        addrs.append(f"127.0.0.1:{port}")
    controls = copy.deepcopy(json.loads((ROOT / "descriptors" / "config-file.json").read_text())["controls"])
    controls["agents"] = {f"edge-{k}": {"e2_node_id": f"gnb_001_01_0000000{k}", "control_address": addrs[k],
                                        "peer_address": f"127.0.0.1:{1000 + k}"} for k in range(2)}
    cells = sorted({c for _, c, _ in trace})
    controls["cells"] = {str(c): f"edge-{i % 2}" for i, c in enumerate(cells)}
    controls["predictor"] = {"ue_silence_s": 3600.0}   # a late feeder must not expire the UEs measured
    if period is not None:
        controls["scheduler"]["control_period_s"] = period
    app = PallasXapp(load_controls(controls), transport=None, telemetry=False, events=EventLog(None, keep=False),
                     offset=0.0)
    agent_of = {c: f"edge-{i % 2}" for i, c in enumerate(cells)}
    sessions = [(f"s{u}", key, agent_of[cell]) for u, (key, cell, _) in enumerate(trace) if u % 10 == 0]
    app.warm_up(trace[0][2][0])
    # lag bookkeeping: the oldest unused report of each UE -> its scheduled time
    pending: dict[str, float] = {}
    lags: list[float] = []
    upd = app.predictor.update

    def update(store, now=None):
        res = upd(store, now)
        app._last_update = res
        return res
    app.predictor.update = update
    cyc = app.control.control_cycle            # what the cycle thread (app._cycle_loop) calls

    def control_cycle():
        app._last_update = None
        out = cyc()
        t = time.time()
        res = app._last_update
        if res is not None and t > t_meas:
            for ue in res.ue_ids:
                a = pending.pop(ue, None)
                if a is not None:
                    lags.append(t - a)
        elif res is not None:
            for ue in res.ue_ids:
                pending.pop(ue, None)
        return out
    app.control.control_cycle = control_cycle

    def telemetry(now: float) -> None:
        for k in range(2):
            rep = pb.TelemetryReport(agent_id=f"edge-{k}", time=now)
            rep.server.model.CopyFrom(pb.ModelIdentity(model="m", block_size=16, kv_bytes_per_token=163840))
            rep.server.prefill_rate, rep.server.free_kv_blocks = 4000.0, 100000
            for sid, ue, ag in sessions:
                if ag == f"edge-{k}":
                    rep.sessions.add(session_id=sid, ue_id=ue, tokens=2000, decode_rate=30.0, state="serving",
                                     remaining_tokens=500)
            app._on_telemetry(f"edge-{k}", rep)

    rss0 = rss_bytes()
    t0 = time.time() + 0.2
    t_meas = t0 + warmup
    app.offset = t0 - 1000.0                    # trace clock 1000 s at the start
    stop = threading.Event()
    cycle_thread = threading.Thread(target=app._cycle_loop, daemon=True)
    behind = [0.0]
    last_ts = [t0]
    sent = [0, 0]

    def feed() -> None:
        k = 0
        while not stop.is_set():
            base = t0 + k
            if base >= t0 + seconds:
                break
            telemetry(time.time())
            u = 0
            while u < n:                          # every indication due by now, then sleep to the next
                now = time.time()
                due = min(n, max(u + 1, int((now - base) * n) + 1))
                if base + u / n > now:
                    time.sleep(min(0.005, base + u / n - now))
                    continue
                if now > t0 + seconds + 1.0:      # time is up: stop, however far behind
                    return
                for v in range(u, due):
                    key, _, pays = trace[v]
                    ts = base + v / n
                    if key not in pending:
                        pending[key] = ts
                    app.on_indication(pays[k % len(pays)], "gnb", ts - app.offset)
                    last_ts[0] = ts
                    sent[0] += 1
                    if now >= t_meas:             # handled within the measured (wall) interval
                        sent[1] += 1
                u = due
            k += 1

    def feed_and_note() -> None:
        feed()                                    # behind: the schedule not yet met when it stopped
        behind[0] = max(0.0, min(time.time(), t0 + seconds) - last_ts[0] - 1.0 / n)

    feeder = threading.Thread(target=feed_and_note, daemon=True)
    time.sleep(max(0.0, t0 - time.time()))
    cycle_thread.start()
    feeder.start()
    time.sleep(max(0.0, t_meas - time.time()))
    c0, w0 = time.process_time(), time.time()
    feeder.join(seconds + 30.0)
    c1, w1 = time.process_time(), time.time()
    rss1 = rss_bytes()
    stop.set()
    app._stop.set()
    cycle_thread.join(2.0)
    app.policy.close()
    for s in servers:
        s.stop(0)
    wall = w1 - w0
    lag = np.array(lags) if lags else np.array([np.nan])
    res = {"ues": n, "tracked": len(app.tracks), "ind_per_s": sent[1] / wall, "lag_p50_ms": 1e3 * np.median(lag),
           "lag_p99_ms": 1e3 * np.percentile(lag, 99), "cpu_us_per_ue_s": 1e6 * (c1 - c0) / max(1, sent[1]),
           "cpu_share": (c1 - c0) / wall, "rss_per_ue_kib": (rss1 - rss0) / max(1, len(app.tracks)) / 1024,
           "behind_s": behind[0], "cycles": app.cycles, "agent_calls": sum(a.calls for a in agents)}
    res["kept_up"] = bool(res["behind_s"] < 0.5 and res["lag_p99_ms"] < 1000.0)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ues", type=int, nargs="+", default=[1000, 10_000])
    ap.add_argument("--seconds", type=float, default=20.0, help="load duration per run (s)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--distinct", type=int, default=5, help="distinct encoded reports per UE")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU")
    ap.add_argument("--period", type=float, default=0.05,
                    help="control period (s; the descriptor's is 0.1): a decision cycle over the UEs with new "
                         "reports every PERIOD, so an indication waits at most PERIOD for the one that uses it")
    a = ap.parse_args()
    import logging
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if not a.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    print(f"# xApp load: {a.seconds:g} s per run ({a.warmup:g} s warm-up), median of {a.runs}; control period "
          f"{a.period:g} s; pinned to "
          f"{len(os.sched_getaffinity(0))} CPU; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'UEs':>6} | {'ind/s':>7} | {'lag p50 ms':>10} {'p99 ms':>8} | {'CPU us/UE/s':>11} {'CPU':>5} | "
          f"{'KiB/UE':>6} | {'behind s':>8} | kept up")
    for n in a.ues:
        t_b = time.process_time()
        trace = build_trace(n, a.distinct, seed=11)
        print(f"#   trace for {n} UEs encoded in {time.process_time() - t_b:.1f} s CPU", flush=True)
        runs = [run_once(trace, a.seconds, a.warmup, a.period) for _ in range(a.runs)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "kept_up"}
        # RSS growth: the first run's (later runs of the process reuse its freed memory)
        med["rss_per_ue_kib"] = runs[0]["rss_per_ue_kib"]
        kept = sum(r["kept_up"] for r in runs)
        print(f"{n:6d} | {med['ind_per_s']:7.0f} | {med['lag_p50_ms']:10.1f} {med['lag_p99_ms']:8.1f} | "
              f"{med['cpu_us_per_ue_s']:11.1f} {med['cpu_share']:5.2f} | {med['rss_per_ue_kib']:6.1f} | "
              f"{med['behind_s']:8.2f} | {kept}/{a.runs} runs", flush=True)
        for r in runs:
            print("#   run: " + json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}))


if __name__ == "__main__":
    main()
