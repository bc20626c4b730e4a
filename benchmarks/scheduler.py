"""Time the Scheduler Engine: the window decision per UE and one control cycle over many UEs.

Run by hand (not in CI), from the repository root, in the xApp environment:

    .venv/xapp/bin/python benchmarks/scheduler.py [--reps 30] [--sizes 1 100 10000]

For each size n it prints, with 51 candidate windows per UE (dT = 0.1 s, T_max = 5 s):

- ``decide``: :func:`pallas_common.timing.decide` over n UEs (Eqs. 4-9 for every window and
  the trigger rule), microseconds per UE and milliseconds per call;
- ``cycle``: :meth:`xapp.scheduler.SchedulerEngine.cycle` with n PLANNED sessions whose
  predicted HO lies 5.0-5.1 s ahead (every one inside the T_max horizon, so all n are
  evaluated on the full grid; telemetry reads, K extrapolation, decision, trigger checks);
- ``predict``: :meth:`SchedulerEngine.set_predictions` feeding n unchanged predictions (the
  predictor's per-cycle input).

Wall time (perf_counter) and thread CPU time (thread_time) are both shown, min and median
over ``--reps`` runs: on a shared machine the CPU time is the better estimate of the cost on
one free core. Target (issue 3): a 10,000-UE cycle under 20 ms on one core.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "proto"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import numpy as np  # noqa: E402
import structlog  # noqa: E402

from pallas_common import timing  # noqa: E402
from xapp.scheduler import ModelKey, SchedulerConfig, SchedulerEngine, ServerState  # noqa: E402

S_KV = 163_840          # Qwen3-14B, bf16 (Eq. 1)
BLOCK = 16


def measure(fn, reps: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of ``reps`` calls of ``fn`` (after one warm-up)."""
    fn()
    wall, cpu = [], []
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return wall, cpu


def random_inputs(n: int, rng: np.random.Generator) -> timing.WindowInputs:
    return timing.WindowInputs(
        k_curr=rng.uniform(500, 8000, n), t_remain=rng.uniform(5.0, 5.1, n), block_size=BLOCK,
        r_p=rng.uniform(1000, 5000, n), r_d=rng.uniform(10, 60, n),
        bandwidth=rng.uniform(12.5e6, 62.5e6, n), s_kv=S_KV, c_sync=0.05)


def build_engine(n: int, rng: np.random.Generator, now: float) -> tuple[SchedulerEngine, list, list, np.ndarray]:
    cfg = SchedulerConfig(stale_age_s=1e9)
    eng = SchedulerEngine(cfg, capacity=n)
    model = ModelKey("Qwen/Qwen3-14B", "d", "bfloat16", "auto", BLOCK, S_KV, 40, BLOCK * S_KV)
    agents = [f"gnb{i}" for i in range(16)]
    for a in agents:
        eng.telemetry.observe_server(ServerState(a, model, 10**9, 10**9, now))
        eng.telemetry.observe_prefill_rate(a, float(rng.uniform(1000, 5000)), now)
    for i in range(n):
        sid = f"s{i}"
        eng.add_session(sid, agents[i % 16], ue_id=f"ue{i}", s_kv=S_KV, block_size=BLOCK, now=now,
                        tokens=int(rng.integers(500, 8000)), model=model)
        eng.telemetry.observe_decode_rate(sid, float(rng.uniform(10, 60)), now)
    ues = [f"ue{i}" for i in range(n)]
    targets = [agents[(i + 1) % 16] for i in range(n)]
    t_ho = now + rng.uniform(5.0, 5.1, n)
    eng.set_predictions(ues, targets, t_ho)
    return eng, ues, targets, t_ho


def fmt(xs: list[float], scale: float) -> str:
    return f"{min(xs) * scale:9.3f} {statistics.median(xs) * scale:9.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 100, 10_000])
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    # Transition logs at debug level would dominate; production runs at info too.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    rng = np.random.default_rng(0)
    params = SchedulerConfig().decision_params()
    n_w = timing.candidate_windows(params.dt, params.t_max).size
    print(f"# Scheduler Engine benchmark: {n_w} candidate windows per UE; numpy {np.__version__}; "
          f"Python {platform.python_version()}; {platform.processor() or platform.machine()}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'what':8} {'n_ue':>6} | {'wall ms':>9} {'(median)':>9} | {'cpu ms':>9} {'(median)':>9} "
          f"| {'cpu us/UE':>9}")
    now = 1_000.0
    for n in args.sizes:
        inp = random_inputs(n, rng)
        wall, cpu = measure(lambda: timing.decide(inp, params), args.reps)
        print(f"{'decide':8} {n:6d} | {fmt(wall, 1e3)} | {fmt(cpu, 1e3)} | {min(cpu) * 1e6 / n:9.2f}")
        eng, ues, targets, t_ho = build_engine(n, rng, now)
        wall, cpu = measure(lambda: eng.cycle(now), args.reps)
        triggered = len(eng.cycle(now))
        print(f"{'cycle':8} {n:6d} | {fmt(wall, 1e3)} | {fmt(cpu, 1e3)} | {min(cpu) * 1e6 / n:9.2f}"
              f"   ({triggered} triggers)")
        wall, cpu = measure(lambda: eng.set_predictions(ues, targets, t_ho), args.reps)
        print(f"{'predict':8} {n:6d} | {fmt(wall, 1e3)} | {fmt(cpu, 1e3)} | {min(cpu) * 1e6 / n:9.2f}")


if __name__ == "__main__":
    main()
