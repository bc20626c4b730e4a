"""The xApp in live mode over the real RMR library under load: one core for the xApp, one for the sender.

    LD_LIBRARY_PATH=/path/to/rmr/lib .venv/xapp/bin/python benchmarks/rmr_load.py \\
        [--rates 1000 5000 10000] [--phase-s 10] [--flat-s 10] [--ues 2000] [--xapp-cpu 0] [--sender-cpu 1]

Needs OSC's ``librmr_si.so`` (ric-plt-lib-rmr, SI95). RMR is on no package registry reachable
here: build it by hand from OSC's public source (``docs/osc.md`` §7,
building RMR by hand) and put the directory holding ``librmr_si.so`` on
``LD_LIBRARY_PATH``. Without it the benchmark says so and exits with status 2.

Three processes on loopback, routed by a static RMR route table (``RMR_SEED_RT``,
``RMR_ASYNC_CONN=0``):

- the **xApp** (pinned to ``--xapp-cpu``): ``xapp.app.PallasXapp`` on ``xapp.e2.transport.RmrTransport``
  (its own bounded receive loop, ``xapp.e2.rmrloop``) with the shipped descriptor's controls,
  fake SDL, its HTTP endpoints, the control cycle every ``--period`` s (0.05 s: half the
  descriptor's, as ``benchmarks/xapp_load.py``), agent telemetry for 10 % of the UEs handed in
  every second, the agents' Control calls over gRPC to fakes in the driver;
- the **sender** (pinned to ``--sender-cpu``), standing in for the E2 termination: RIC_INDICATION
  messages (E2AP + E2SM-RC message copy of NR MeasurementReports of generated drives,
  ``xapp_load.build_trace``; ``--ues`` UEs round robin, each with ``--distinct`` encoded reports
  repeated) at each phase's rate, or as fast as it can (flat out), and a RIC_HEALTH_CHECK_REQ
  every 0.25 s whose answer time it measures (as ``rmr_probe`` would);
- the **driver** (this process, on the sender's core): fake agents, the phases, the figures.

When the xApp's core is saturated, RMR's own receive thread in the xApp reads its socket late
and the sender's sends come back RMR_ERR_RETRY (TCP backpressure; counted as ``send_retries``):
the offered rate then falls below the phase's (``sent/s``), which is the xApp's capacity
showing, not the sender's.

Per phase (after each phase the driver waits ``--drain-s`` for the queue to empty):
offered rate (sent/s), handled rate (indications handed to the xApp's ingest per second of the
phase), lag from an indication's receipt to the end of the control cycle whose prediction used
it (p50, p99; ``xapp_load``'s definition, from the receipt time instead of the schedule), lost
(sent by the sender and never received by the xApp: RMR's ring overflow or the transport),
dropped (received, the xApp's queue full) and shed (older than ``shed_after_s`` when their turn
came), CPU of the xApp per indication received (all threads; and of the receive thread, which
also decodes and ingests, and of the control cycle), the share of a core the xApp got, its RSS
at the phase's end, and the answer time
of the RMR health checks (max; and of ``GET /ric/v1/health/ready``, max).

Last line: ``rmr_load: sustained <N>/s, p99 lag <X> ms at 5000/s, lost <L>, shed <S>, health <H> ms``
where N is the highest handled rate of a phase with nothing lost, dropped or shed and p99 lag
under 100 ms, X the 5,000/s phase's p99 lag, L and S the totals of every phase (flat out
included), H the slowest RMR health-check answer of every phase.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent import futures
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "proto", ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

XAPP_PORT, SENDER_PORT = 4560, 4562
RIC_INDICATION, HEALTH_REQ, HEALTH_RESP = 12050, 100, 101
MISSING = ("rmr_load: librmr_si.so not found: RMR is on no package registry here; build OSC's "
           "ric-plt-lib-rmr by hand (docs/osc.md §7, 'Building RMR by "
           "hand') and put its directory on LD_LIBRARY_PATH")


def have_rmr() -> bool:
    try:
        ctypes.CDLL("librmr_si.so")
        return True
    except OSError:
        return False


def _quiet_logs() -> None:
    import logging
    import structlog
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


def thread_cpu(native_id: int | None) -> float:
    """CPU seconds (user + system) of one thread of this process, from /proc; 0 if unknown."""
    if not native_id:
        return 0.0
    try:
        with open(f"/proc/self/task/{native_id}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q / 100.0 * len(s)))]


# ------------------------------------------------------------------------------------- the xApp
def run_xapp(a: argparse.Namespace) -> None:
    """The xApp role: commands on stdin ('mark', 'quit'), one JSON line per 'mark' on stdout."""
    _quiet_logs()
    from prometheus_client import CollectorRegistry
    from xapp.app import EventLog, PallasXapp
    from xapp.config import load_controls
    from xapp.e2.transport import RmrTransport
    from xapp.httpd import serve_http
    from xapp_load import build_trace, rss_bytes
    from pallas_proto import pallas_pb2 as pb

    trace = build_trace(a.ues, a.distinct, seed=11)
    controls = copy.deepcopy(json.loads((ROOT / "descriptors" / "config-file.json").read_text())["controls"])
    addrs = a.agents.split(",")
    controls["agents"] = {f"edge-{k}": {"e2_node_id": f"gnb_001_01_0000000{k}", "control_address": addrs[k],
                                        "peer_address": f"127.0.0.1:{1000 + k}"} for k in range(2)}
    cells = sorted({c for _, c, _ in trace})
    controls["cells"] = {str(c): f"edge-{i % 2}" for i, c in enumerate(cells)}
    controls["predictor"] = {"ue_silence_s": 3600.0}
    controls["scheduler"]["control_period_s"] = a.period
    reg = CollectorRegistry()
    transport = RmrTransport(rmr_port=XAPP_PORT, use_fake_sdl=True, registry=reg)
    app = PallasXapp(load_controls(controls), transport, telemetry=False, events=EventLog(None, keep=100),
                     registry=reg)
    app.warm_up(trace[0][2][0])
    agent_of = {c: f"edge-{i % 2}" for i, c in enumerate(cells)}
    sessions = [(f"s{u}", key, agent_of[cell]) for u, (key, cell, _) in enumerate(trace) if u % 10 == 0]

    lock = threading.Lock()
    pending: dict[str, float] = {}      # UE -> receipt time of its oldest report no cycle used yet
    lags: list[float] = []              # receipt -> end of the cycle that used it (s)
    ingest_lags: list[float] = []       # receipt -> ingest (s)
    ing = app.ingest.on_indication

    def on_indication(payload, e2_node="", t=None, sub_id=-1):
        out = ing(payload, e2_node, t, sub_id)
        now = time.time()
        with lock:
            ingest_lags.append(now - t)
            for r in out:
                pending.setdefault(r.ue_id, t)
        return out
    app.ingest.on_indication = on_indication
    upd = app.predictor.update
    last = [None]

    def update(store, now=None):
        res = last[0] = upd(store, now)
        return res
    app.predictor.update = update
    cyc = app.control.control_cycle

    def control_cycle():
        last[0] = None
        out = cyc()
        t = time.time()
        res = last[0]
        if res is not None:
            with lock:
                for ue in res.ue_ids:
                    r = pending.pop(ue, None)
                    if r is not None:
                        lags.append(t - r)
        return out
    app.control.control_cycle = control_cycle

    profiles: dict = {}
    if a.profile:                       # cProfile of the receive thread and of the control cycle
        import cProfile
        for name, owner, attr in (("rx", transport_rx_class(), "_run_rx"), ("cycle", PallasXapp, "_cycle_loop")):
            def wrap(fn, name=name):
                def run(self):
                    profiles[name] = cProfile.Profile(time.thread_time)   # CPU time of this thread, not wall
                    profiles[name].runcall(fn, self)
                return run
            setattr(owner, attr, wrap(getattr(owner, attr)))
    started = threading.Event()
    http = serve_http("127.0.0.1", a.http_port, lambda: started.is_set() and transport.healthy(), registry=reg)
    app.start()
    started.set()
    stop = threading.Event()

    def telemetry() -> None:
        while not stop.wait(1.0):
            for k in range(2):
                rep = pb.TelemetryReport(agent_id=f"edge-{k}", time=time.time())
                rep.server.model.CopyFrom(pb.ModelIdentity(model="m", block_size=16, kv_bytes_per_token=163840))
                rep.server.prefill_rate, rep.server.free_kv_blocks = 4000.0, 100000
                for sid, ue, ag in sessions:
                    if ag == f"edge-{k}":
                        rep.sessions.add(session_id=sid, ue_id=ue, tokens=2000, decode_rate=30.0,
                                         state="serving", remaining_tokens=500)
                app._on_telemetry(f"edge-{k}", rep)
    threading.Thread(target=telemetry, daemon=True).start()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        if cmd == "mark":
            st = dict(transport.receiver.stats)
            with lock:
                lg, il = lags[:], ingest_lags[:]
                lags.clear()
                ingest_lags.clear()
            rx = getattr(transport.receiver, "_rx", None)
            cy = getattr(app, "_cycle_thread", None)
            print(json.dumps({"cpu": time.process_time(), "wall": time.time(), "rss": rss_bytes(),
                              "cpu_rx": thread_cpu(getattr(rx, "native_id", None)),
                              "cpu_cycle": thread_cpu(getattr(cy, "native_id", None)),
                              "received": st.get("received:indication", 0), "handled": st.get("handled", 0),
                              "shed": st.get("shed", 0), "dropped": sum(v for k, v in st.items()
                                                                        if k.startswith("dropped:")),
                              "health_answered": st.get("health_answered", 0),
                              "reports": app.ingest.stats["reports"], "cycles": app.cycles,
                              "lag_p50": _pct(lg, 50), "lag_p99": _pct(lg, 99), "lags": len(lg),
                              "ingest_p50": _pct(il, 50), "ingest_p99": _pct(il, 99),
                              "queued": len(transport.receiver.indications)}), flush=True)
    stop.set()
    http.shutdown()
    app.stop()
    for name, prof in profiles.items():
        prof.dump_stats(str(Path(a.profile) / f"{name}.prof"))


def transport_rx_class():
    from xapp.e2.rmrloop import RmrReceiver
    return RmrReceiver


# ----------------------------------------------------------------------------------- the sender
def run_sender(a: argparse.Namespace) -> None:
    """The sender role: 'phase RATE SECONDS' on stdin (RATE 0: flat out) -> one JSON line."""
    _quiet_logs()
    from ricxappframe.rmr import rmr
    from xapp_load import build_trace

    trace = build_trace(a.ues, a.distinct, seed=11)
    pays = [[p for p in pp] for _, _, pp in trace]
    mrc = rmr.rmr_init(str(SENDER_PORT).encode(), rmr.RMR_MAX_RCV_BYTES, rmr.RMRFL_MTCALL)
    while rmr.rmr_ready(mrc) == 0:
        time.sleep(0.1)
    P = ctypes.POINTER(rmr.rmr_mbuf_t)
    lib = ctypes.CDLL("librmr_si.so")
    send = ctypes.PYFUNCTYPE(P, ctypes.c_void_p, P)(("rmr_send_msg", lib))
    poll = ctypes.PYFUNCTYPE(P, ctypes.c_void_p, P, ctypes.c_int)(("rmr_torcv_msg", lib))
    sbuf = rmr.rmr_alloc_msg(mrc, 4096)
    rbuf = rmr.rmr_alloc_msg(mrc, 4096)
    hbuf = rmr.rmr_alloc_msg(mrc, 64)
    meid = b"gnb_001_01_00000000"
    print(json.dumps({"ready": True}), flush=True)
    n_ue = len(pays)
    k = 0
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] == "quit":
            break
        rate, seconds = float(parts[1]), float(parts[2])
        sent = failed = retries = 0
        health_sent: dict[bytes, float] = {}
        health_rtt: list[float] = []
        t0 = time.time()
        end = t0 + seconds
        next_health = t0 + 0.05
        hseq = 0
        while True:
            now = time.time()
            if now >= end:
                break
            if now >= next_health:                       # a health check, as rmr_probe sends it
                next_health += 0.25
                hseq += 1
                xid = f"hc{hseq:030d}".encode()
                rmr.set_payload_and_length(b"ping", hbuf)
                rmr.set_transaction_id(hbuf, xid)
                hbuf.contents.mtype = HEALTH_REQ
                hbuf = send(mrc, hbuf)
                health_sent[xid] = time.time()
            while True:                                  # answers waiting for us
                rbuf = poll(mrc, rbuf, 0)
                if rbuf.contents.state != 0:
                    break
                if rbuf.contents.mtype == HEALTH_RESP:
                    xid = rmr.get_xaction(rbuf)
                    t = health_sent.pop(xid, None)
                    if t is not None:
                        health_rtt.append(time.time() - t)
            due = seconds * 1e9 if rate <= 0 else int((now - t0) * rate) + 1 - sent
            for _ in range(min(due, 256)):
                u = k % n_ue
                p = pays[u][(k // n_ue) % len(pays[u])]
                k += 1
                ctypes.memmove(sbuf.contents.payload, p, len(p))
                c = sbuf.contents
                c.len, c.mtype, c.sub_id = len(p), RIC_INDICATION, 1
                rmr.rmr_set_meid(sbuf, meid)
                for _ in range(100):
                    sbuf = send(mrc, sbuf)
                    if sbuf.contents.state != 10:        # RMR_ERR_RETRY: the socket is full
                        break
                    retries += 1
                if sbuf.contents.state == 0:
                    sent += 1
                else:
                    failed += 1
            if rate > 0 and due <= 0:
                time.sleep(0.0002)
        t_end = time.time()
        deadline = t_end + 1.0                           # the last answers
        while health_sent and time.time() < deadline:
            rbuf = poll(mrc, rbuf, 0)
            if rbuf.contents.state == 0 and rbuf.contents.mtype == HEALTH_RESP:
                t = health_sent.pop(rmr.get_xaction(rbuf), None)
                if t is not None:
                    health_rtt.append(time.time() - t)
            else:
                time.sleep(0.001)
        print(json.dumps({"sent": sent, "failed": failed, "retries": retries, "seconds": t_end - t0,
                          "health_sent": hseq, "health_unanswered": len(health_sent),
                          "health_max": max(health_rtt) if health_rtt else float("nan"),
                          "health_p50": _pct(health_rtt, 50)}), flush=True)
    rmr.rmr_close(mrc)


# ----------------------------------------------------------------------------------- the driver
def _spawn(role: str, cpu: int, a: argparse.Namespace, env: dict, extra: list[str]) -> subprocess.Popen:
    cmd = ["taskset", "-c", str(cpu), sys.executable, str(Path(__file__).resolve()), "--role", role,
           "--ues", str(a.ues), "--distinct", str(a.distinct), "--period", str(a.period), *extra]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _ask(p: subprocess.Popen, line: str, timeout: float = 120.0) -> dict:
    if line:
        p.stdin.write(line + "\n")
        p.stdin.flush()
    out: list[str] = []
    th = threading.Thread(target=lambda: out.append(p.stdout.readline()), daemon=True)
    th.start()
    th.join(timeout)
    if not out or not out[0]:
        raise RuntimeError(f"no answer from {p.args[5:7]} (exit {p.poll()})")
    return json.loads(out[0])


def run_driver(a: argparse.Namespace) -> int:
    if not have_rmr():
        print(MISSING, file=sys.stderr)
        return 2
    import grpc
    from pallas_proto import pallas_pb2_grpc as pbg
    from xapp_load import FakeAgent

    servers, addrs = [], []
    for _ in range(2):
        s = grpc.server(futures.ThreadPoolExecutor(2))
        pbg.add_ControlServicer_to_server(FakeAgent(), s)
        addrs.append(f"127.0.0.1:{s.add_insecure_port('127.0.0.1:0')}")
        s.start()
        servers.append(s)
    tmp = tempfile.mkdtemp(prefix="rmr_load-")
    rt = Path(tmp) / "route.rt"
    rt.write_text("newrt|start\n"
                  f"mse|{RIC_INDICATION}|-1|127.0.0.1:{XAPP_PORT}\n"
                  f"mse|{HEALTH_REQ}|-1|127.0.0.1:{XAPP_PORT}\n"
                  f"mse|20011|-1|127.0.0.1:{SENDER_PORT}\n"
                  f"mse|20012|-1|127.0.0.1:{SENDER_PORT}\n"
                  "newrt|end\n")
    env = {**os.environ, "RMR_SEED_RT": str(rt), "RMR_ASYNC_CONN": "0", "RMR_RTG_SVC": "-1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "proto"), os.environ.get("PYTHONPATH", "")])}
    env.pop("CONFIG_FILE", None)
    os.sched_setaffinity(0, {a.sender_cpu})
    xp = _spawn("xapp", a.xapp_cpu, a, {**env, "RMR_SRC_ID": "127.0.0.1"},
                ["--agents", ",".join(addrs), "--http-port", str(a.http_port)]
                + (["--profile", str(Path(a.profile).resolve())] if a.profile else []))
    sp = _spawn("sender", a.sender_cpu, a, {**env, "RMR_SRC_ID": "127.0.0.1"}, [])
    try:
        _ask(xp, "", 300)
        _ask(sp, "", 300)
        print(f"# rmr_load: xApp on CPU {a.xapp_cpu}, sender and driver on CPU {a.sender_cpu}; {a.ues} UEs "
              f"({a.distinct} reports each, repeated); control period {a.period:g} s; phases {a.phase_s:g} s, "
              f"flat out {a.flat_s:g} s, drain {a.drain_s:g} s; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs", flush=True)
        _ask(sp, f"phase 1000 {a.warmup_s}")           # warm-up: codecs, learning, route table
        time.sleep(a.drain_s)
        print(f"{'phase':>9} | {'sent/s':>7} {'handled/s':>9} | {'lag p50':>7} {'p99 ms':>7} | {'ingest p99':>10} | "
              f"{'lost':>6} {'dropped':>7} {'shed':>6} | {'CPU us/ind':>10} {'rx':>5} {'cycle':>5} {'core':>4} | "
              f"{'RSS MB':>6} | "
              f"{'health max ms':>13} {'ready max ms':>12}", flush=True)
        rows = []
        for rate, secs in [(r, a.phase_s) for r in a.rates] + [(0, a.flat_s)]:
            ready_ms: list[float] = []
            done = threading.Event()

            def probe() -> None:
                while not done.wait(0.25):
                    t = time.time()
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{a.http_port}/ric/v1/health/ready",
                                               timeout=5).read()
                        ready_ms.append(1e3 * (time.time() - t))
                    except Exception:  # noqa: BLE001 - no answer within 5 s
                        ready_ms.append(5000.0)
            m0 = _ask(xp, "mark")
            th = threading.Thread(target=probe, daemon=True)
            th.start()
            s = _ask(sp, f"phase {rate} {secs}", secs + 120)
            time.sleep(a.drain_s)
            done.set()
            th.join(6)
            m1 = _ask(xp, "mark")
            rec = m1["received"] - m0["received"]
            row = {"phase": f"{rate}/s" if rate else "flat out", "rate": rate, "sent_s": s["sent"] / s["seconds"],
                   "handled_s": (m1["handled"] - m0["handled"]) / s["seconds"],
                   "lag_p50_ms": 1e3 * m1["lag_p50"], "lag_p99_ms": 1e3 * m1["lag_p99"],
                   "ingest_p99_ms": 1e3 * m1["ingest_p99"], "lost": s["sent"] - rec,
                   "dropped": m1["dropped"] - m0["dropped"], "shed": m1["shed"] - m0["shed"],
                   "cpu_us": 1e6 * (m1["cpu"] - m0["cpu"]) / max(1, rec), "rss_mb": m1["rss"] / 2 ** 20,
                   "cpu_rx_us": 1e6 * (m1["cpu_rx"] - m0["cpu_rx"]) / max(1, rec),
                   "cpu_cycle_us": 1e6 * (m1["cpu_cycle"] - m0["cpu_cycle"]) / max(1, rec),
                   "cpu_share": (m1["cpu"] - m0["cpu"]) / max(1e-9, m1["wall"] - m0["wall"]),
                   "health_max_ms": 1e3 * s["health_max"], "health_unanswered": s["health_unanswered"],
                   "ready_max_ms": max(ready_ms) if ready_ms else float("nan"), "send_failed": s["failed"],
                   "send_retries": s["retries"]}
            rows.append(row)
            print(f"{row['phase']:>9} | {row['sent_s']:7.0f} {row['handled_s']:9.0f} | {row['lag_p50_ms']:7.1f} "
                  f"{row['lag_p99_ms']:7.1f} | {row['ingest_p99_ms']:10.1f} | {row['lost']:6d} {row['dropped']:7d} "
                  f"{row['shed']:6d} | {row['cpu_us']:10.1f} {row['cpu_rx_us']:5.0f} {row['cpu_cycle_us']:5.0f} "
                  f"{row['cpu_share']:4.2f} | {row['rss_mb']:6.0f} | "
                  f"{row['health_max_ms']:13.1f} {row['ready_max_ms']:12.1f}", flush=True)
            print("#   " + json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}),
                  flush=True)
        ok = [r["handled_s"] for r in rows if r["lost"] == r["dropped"] == r["shed"] == 0 and r["lag_p99_ms"] < 100
              and r["health_unanswered"] == 0]
        at5 = next((r["lag_p99_ms"] for r in rows if r["rate"] == 5000), float("nan"))
        print(f"rmr_load: sustained {max(ok) if ok else 0:.0f}/s, p99 lag {at5:.1f} ms at 5000/s, "
              f"lost {sum(r['lost'] for r in rows)}, shed {sum(r['shed'] for r in rows)}, "
              f"health {max(r['health_max_ms'] for r in rows):.1f} ms", flush=True)
        return 0
    finally:
        for p in (sp, xp):
            try:
                p.stdin.write("quit\n")
                p.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
        for p in (sp, xp):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        for s in servers:
            s.stop(0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=["driver", "xapp", "sender"], default="driver", help=argparse.SUPPRESS)
    ap.add_argument("--rates", type=int, nargs="+", default=[1000, 5000, 10000], help="fixed-rate phases (ind/s)")
    ap.add_argument("--phase-s", type=float, default=10.0)
    ap.add_argument("--flat-s", type=float, default=10.0, help="flat-out phase (s)")
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--drain-s", type=float, default=2.0, help="wait after each phase before reading figures")
    ap.add_argument("--ues", type=int, default=2000)
    ap.add_argument("--distinct", type=int, default=5, help="distinct encoded reports per UE")
    ap.add_argument("--period", type=float, default=0.05, help="control period (s)")
    ap.add_argument("--xapp-cpu", type=int, default=0)
    ap.add_argument("--sender-cpu", type=int, default=1)
    ap.add_argument("--http-port", type=int, default=18080)
    ap.add_argument("--agents", default="", help=argparse.SUPPRESS)
    ap.add_argument("--profile", default="", help="write cProfile stats (each thread's CPU time) of the xApp's "
                                                  "receive thread and control cycle to DIR/rx.prof and DIR/cycle.prof")
    a = ap.parse_args()
    if a.role == "xapp":
        run_xapp(a)
        return 0
    if a.role == "sender":
        run_sender(a)
        return 0
    return run_driver(a)


if __name__ == "__main__":
    sys.exit(main())
