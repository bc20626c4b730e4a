"""The xApp in live mode over the real RMR library under load: one core for the xApp, one for the sender.

    LD_LIBRARY_PATH=/path/to/rmr/lib .venv/xapp/bin/python benchmarks/rmr_load.py \\
        [--rates 1000 5000 10000] [--phase-s 10] [--flat-s 10] [--ues 2000] [--xapp-cpu 0] [--sender-cpu 1] \\
        [--replicas 1] [--e2-nodes K] [--cluster]

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
- the **driver** (this process, on the sender's core): fake agents, the phases, the figures,
  and a fake subscription manager (``benchmarks/fake_submgr.py``) the xApp subscribes through
  (one E2SM-RC subscription per E2 node, ``SubscriptionManager`` as shipped). The sender's
  route table is what OSC's routing manager derives from the subscriptions:
  ``mse|12050|<E2 instance id>|host:port`` per subscription, written once every E2 node's
  subscription is its owner's alone; the sender sends each UE's reports with its serving
  cell's E2 node as MEID and that node's E2 instance id as RMR sub id.

**Replicas** (issue 46, docs/scale-out.md). ``--replicas N`` runs N xApp processes
(``--replica-id xapp-0`` ...; replica i pinned to ``--xapp-cpu``'s i-th CPU, in turn), each with
``controls.cluster`` enabled (the descriptor's lease and heartbeat), all on a private
``redis-server`` (SDL), each on its own RMR and HTTP port. Each claims its share of the
``--e2-nodes`` E2 nodes (rendezvous hashing) and subscribes to those alone, so the routes send
each replica only its own nodes' indications; a health check goes to every replica. The
cells are laid out on the E2 nodes so that the replicas' shares of UEs are as even as whole
cells allow (:func:`layout`, from the rendezvous assignment computed in advance). With one
replica (the default) the xApp runs with ``controls.cluster`` disabled, as one instance ships
(``--cluster``: enabled, to see what the leases alone cost). After each phase every
indication sent is accounted for: handled (for a node its replica owns), dropped as not owned
(the replica's admission; ``!owned``), dropped (queue full), shed, still queued, or lost
(never received); ``unacc`` is what no counter holds.

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

With several replicas each phase's row is the aggregate (handled: the sum; CPU per
indication: all replicas' CPU over all indications received; lag: the slower replica's) and
a row per replica follows (its handled rate, lag, CPU per indication it received, core share,
the E2 nodes it owns).

Last line: ``rmr_load: sustained <N>/s, p99 lag <X> ms at 5000/s, lost <L>, shed <S>, health <H> ms,
replicas <R>, not owned <O>, unaccounted <U>, load <1 5 15 min>``
where N is the highest aggregate handled rate of a phase with nothing lost, dropped, shed,
dropped as not owned or unaccounted and p99 lag under 100 ms, X the 5,000/s phase's p99 lag,
L, S, O and U the totals of every phase (flat out included), H the slowest RMR health-check
answer of every phase, and the machine's load average at the end.
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


# ------------------------------------------------------------------------ the layout (pure)
def e2_node_names(k: int) -> list[str]:
    """``k`` E2 node names (RMR MEIDs) ``gnb_001_01_<8 digits>``: 0-based, as the single-node
    benchmark named its two. Raises ValueError for k < 1."""
    if k < 1:
        raise ValueError(f"--e2-nodes {k}: at least one E2 node")
    return [f"gnb_001_01_{i:08d}" for i in range(k)]


def replica_ids(n: int) -> list[str]:
    """The replicas' identities (``--replica-id``): ``xapp-0`` ... ``xapp-<n-1>``."""
    if n < 1:
        raise ValueError(f"--replicas {n}: at least one replica")
    return [f"xapp-{i}" for i in range(n)]


def expected_owners(nodes: list[str], replicas: list[str]) -> dict[str, str]:
    """E2 node -> the replica that owns it once the leases settle: the rendezvous assignment
    over every replica (``xapp.cluster.ownership.assignment``, docs/scale-out.md §2); with one
    replica, that one."""
    if len(replicas) == 1:
        return {n: replicas[0] for n in nodes}
    from xapp.cluster.ownership import assignment
    return {n: str(r) for n, r in assignment(nodes, replicas).items()}


def layout(cell_ues: dict[int, int], nodes: list[str], owners: dict[str, str]) -> dict[int, str]:
    """Cell -> the E2 node that serves it, so that the replicas' shares of UEs (of the load:
    every UE reports at the same rate) are as even as whole cells allow: cells by UE count,
    largest first (ties: lower cell id), each to the replica with the fewest UEs so far among
    those owning a node (ties: lower id), on its node with the fewest UEs (ties: node order).
    ``cell_ues``: {cell: UEs served}; ``owners``: {node: replica} (:func:`expected_owners`).
    Raises ValueError when a node has no owner."""
    if set(owners) != set(nodes):
        raise ValueError("every E2 node needs an owner")
    node_ues = {n: 0 for n in nodes}
    rep_ues = {r: 0 for r in owners.values()}
    out: dict[int, str] = {}
    for c in sorted(cell_ues, key=lambda c: (-cell_ues[c], c)):
        r = min(rep_ues, key=lambda r: (rep_ues[r], r))
        n = min((n for n in nodes if owners[n] == r), key=lambda n: (node_ues[n], nodes.index(n)))
        out[c] = n
        node_ues[n] += cell_ues[c]
        rep_ues[r] += cell_ues[c]
    return out


def settled(routes: dict[str, tuple[int, tuple[str, ...]]], owners: dict[str, str],
            endpoint: dict[str, str]) -> bool:
    """Whether the subscriptions route every E2 node's indications to its expected owner alone:
    ``routes`` as ``fake_submgr.routes_by_node`` gives them, ``owners`` {node: replica},
    ``endpoint`` {replica: "host:rmr port"}."""
    return (set(routes) == set(owners)
            and all(routes[n][1] == (endpoint[r],) for n, r in owners.items()))


# ------------------------------------------------------------------------------------- the xApp
def run_xapp(a: argparse.Namespace) -> None:
    """The xApp role: commands on stdin ('mark', 'quit'), one JSON line per 'mark' on stdout."""
    _quiet_logs()
    from prometheus_client import CollectorRegistry
    from xapp.app import EventLog, PallasXapp
    from xapp.config import load_controls
    from xapp.e2.subscription import SubmgrClient, SubscriptionManager
    from xapp.e2.transport import RmrTransport
    from xapp.httpd import serve_http
    from xapp.main import open_cluster
    from xapp_load import build_trace, rss_bytes
    from pallas_proto import pallas_pb2 as pb

    trace = build_trace(a.ues, a.distinct, seed=11)
    controls = copy.deepcopy(json.loads((ROOT / "descriptors" / "config-file.json").read_text())["controls"])
    addrs = a.agents.split(",")
    lay = json.loads(Path(a.layout).read_text())           # the driver's: {"nodes": [...], "cells": {cell: node}}
    cell_node = {int(c): n for c, n in lay["cells"].items()}
    nodes = lay["nodes"]
    agent_of_node = {n: f"edge-{k}" for k, n in enumerate(nodes)}
    controls["agents"] = {agent_of_node[n]: {"e2_node_id": n, "control_address": addrs[k % len(addrs)],
                                             "peer_address": f"127.0.0.1:{1000 + k}"}
                          for k, n in enumerate(nodes)}
    agent_of = {c: agent_of_node[n] for c, n in cell_node.items()}
    controls["cells"] = {str(c): ag for c, ag in agent_of.items()}
    controls["predictor"] = {"ue_silence_s": 3600.0}
    controls["scheduler"]["control_period_s"] = a.period
    controls["e2"]["submgr_url"] = a.submgr_url            # the fake subscription manager
    controls["e2"]["client_endpoint"] = {"host": "127.0.0.1", "http_port": a.http_port, "rmr_port": a.rmr_port}
    if a.cluster:                                           # leases and records on the driver's redis-server
        controls["cluster"] = {**controls.get("cluster", {}), "enabled": True}
        controls["sdl"] = {**controls.get("sdl", {}), "namespace": "pallas-rmr-load"}
    cfg = load_controls(controls)
    reg = CollectorRegistry()
    cluster = open_cluster(cfg, a.replica_id, reg)        # None unless --cluster
    subscriptions = SubscriptionManager(SubmgrClient(cfg.e2.submgr_url))
    transport = RmrTransport(rmr_port=a.rmr_port, use_fake_sdl=True, registry=reg)
    app = PallasXapp(cfg, transport, telemetry=False, events=EventLog(None, keep=100),
                     registry=reg, subscriptions=subscriptions, cluster=cluster)
    app.warm_up(trace[0][2][0])
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
    http = serve_http("127.0.0.1", a.http_port, lambda: started.is_set() and transport.healthy(), registry=reg,
                      on_subscription_response=app.on_subscription_response)
    app.start()
    started.set()
    stop = threading.Event()

    def telemetry() -> None:
        while not stop.wait(1.0):
            for k in range(len(nodes)):
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
                              "queued": len(transport.receiver.indications),
                              "not_owned": sum(cluster.dropped.values()) if cluster else 0,
                              "owned": len(cluster.leases.owned()) if cluster else len(nodes),
                              "lease_changes": (cluster.leases.counters.claims + cluster.leases.counters.releases
                                                + cluster.leases.counters.losses) if cluster else 0}),
                  flush=True)
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
    route = {int(c): (m.encode(), int(sub)) for c, (m, sub) in json.loads(Path(a.routes).read_text()).items()}
    meids = [route[cell][0] for _, cell, _ in trace]       # per UE: its serving cell's E2 node
    subs = [route[cell][1] for _, cell, _ in trace]        # and that node's E2 instance (RMR sub id)
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
    answers = a.replicas                                 # a health check goes to every replica
    print(json.dumps({"ready": True}), flush=True)
    n_ue = len(pays)
    k = 0
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] == "quit":
            break
        rate, seconds = float(parts[1]), float(parts[2])
        sent = failed = retries = 0
        health_sent: dict[bytes, list] = {}             # xid -> [sent at, answers still due]
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
                health_sent[xid] = [time.time(), answers]
            while True:                                  # answers waiting for us
                rbuf = poll(mrc, rbuf, 0)
                if rbuf.contents.state != 0:
                    break
                if rbuf.contents.mtype == HEALTH_RESP:
                    _health_answer(health_sent, rmr.get_xaction(rbuf), health_rtt)
            due = seconds * 1e9 if rate <= 0 else int((now - t0) * rate) + 1 - sent
            for _ in range(min(due, 256)):
                u = k % n_ue
                p = pays[u][(k // n_ue) % len(pays[u])]
                k += 1
                ctypes.memmove(sbuf.contents.payload, p, len(p))
                c = sbuf.contents
                c.len, c.mtype, c.sub_id = len(p), RIC_INDICATION, subs[u]
                rmr.rmr_set_meid(sbuf, meids[u])
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
                _health_answer(health_sent, rmr.get_xaction(rbuf), health_rtt)
            else:
                time.sleep(0.001)
        print(json.dumps({"sent": sent, "failed": failed, "retries": retries, "seconds": t_end - t0,
                          "health_sent": hseq, "health_unanswered": sum(n for _, n in health_sent.values()),
                          "health_max": max(health_rtt) if health_rtt else float("nan"),
                          "health_p50": _pct(health_rtt, 50)}), flush=True)
    rmr.rmr_close(mrc)


def _health_answer(sent: dict[bytes, list], xid: bytes, rtt: list[float]) -> None:
    """One RIC_HEALTH_CHECK_RESP: its answer time into ``rtt``; the check is done when every
    replica answered."""
    due = sent.get(xid)
    if due is None:
        return
    rtt.append(time.time() - due[0])
    due[1] -= 1
    if due[1] <= 0:
        del sent[xid]


# ----------------------------------------------------------------------------------- the driver
def _spawn(role: str, cpu: int, a: argparse.Namespace, env: dict, extra: list[str]) -> subprocess.Popen:
    """Start this script as ``role`` pinned to ``cpu``; it talks JSON lines over stdin/stdout."""
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


def phase_figures(sent: dict, m0: list[dict], m1: list[dict]) -> tuple[dict, list[dict]]:
    """One phase's figures from the sender's answer and each replica's marks before (``m0``)
    and after (``m1``) it (same order). Returns (the aggregate row, one row per replica).

    Per replica: ``received`` (indications RMR delivered), ``handled_s`` (handed to the xApp
    for an E2 node it owns, per second of the phase), ``not_owned`` (dropped by the replica's
    admission: its node's lease is not held; counted), ``dropped`` (queue full), ``shed``,
    CPU per indication received (us: all threads, receive thread, control cycle), the core
    share, lag p50/p99 (ms). Aggregate: sums, ``lag_*_ms`` the slowest replica's,
    ``lost`` = sent - received over every replica (RMR or the transport lost them),
    ``unaccounted`` = received - (handed to the handler + shed + dropped + change of the
    queue): what no counter holds (0 unless the accounting is broken)."""
    secs = max(1e-9, sent["seconds"])
    reps = []
    for a, b in zip(m0, m1):
        d = {k: b[k] - a[k] for k in ("cpu", "cpu_rx", "cpu_cycle", "received", "handled", "shed",
                                      "dropped", "queued", "not_owned", "wall")}
        rec = d["received"]
        reps.append({"received": rec, "handled_s": (d["handled"] - d["not_owned"]) / secs,
                     "not_owned": d["not_owned"], "dropped": d["dropped"], "shed": d["shed"],
                     "unaccounted": rec - d["handled"] - d["shed"] - d["dropped"] - d["queued"],
                     "cpu": d["cpu"], "cpu_rx": d["cpu_rx"], "cpu_cycle": d["cpu_cycle"],
                     "cpu_us": 1e6 * d["cpu"] / max(1, rec), "cpu_share": d["cpu"] / max(1e-9, d["wall"]),
                     "lag_p50_ms": 1e3 * b["lag_p50"], "lag_p99_ms": 1e3 * b["lag_p99"],
                     "ingest_p99_ms": 1e3 * b["ingest_p99"], "rss_mb": b["rss"] / 2 ** 20,
                     "owned": b["owned"], "lease_changes": b["lease_changes"] - a["lease_changes"]})
    rec = sum(r["received"] for r in reps)

    def worst(key: str) -> float:
        xs = [r[key] for r in reps if r[key] == r[key]]
        return max(xs) if xs else float("nan")
    row = {"sent_s": sent["sent"] / secs, "handled_s": sum(r["handled_s"] for r in reps),
           "lag_p50_ms": worst("lag_p50_ms"), "lag_p99_ms": worst("lag_p99_ms"),
           "ingest_p99_ms": worst("ingest_p99_ms"), "lost": sent["sent"] - rec,
           **{k: sum(r[k] for r in reps) for k in ("dropped", "shed", "not_owned", "unaccounted",
                                                     "lease_changes")},
           "cpu_us": 1e6 * sum(r["cpu"] for r in reps) / max(1, rec),
           "cpu_rx_us": 1e6 * sum(r["cpu_rx"] for r in reps) / max(1, rec),
           "cpu_cycle_us": 1e6 * sum(r["cpu_cycle"] for r in reps) / max(1, rec),
           "cpu_share": sum(r["cpu_share"] for r in reps), "rss_mb": worst("rss_mb"),
           "health_max_ms": 1e3 * sent["health_max"], "health_unanswered": sent["health_unanswered"],
           "send_failed": sent["failed"], "send_retries": sent["retries"]}
    return row, reps


def run_driver(a: argparse.Namespace) -> int:
    if not have_rmr():
        print(MISSING, file=sys.stderr)
        return 2
    import contextlib
    from collections import Counter

    import grpc
    from fake_submgr import FakeSubmgr, route_table, routes_by_node
    from pallas_proto import pallas_pb2_grpc as pbg
    from xapp_load import FakeAgent, build_trace

    rids = replica_ids(a.replicas)
    nodes = e2_node_names(a.e2_nodes or (2 if a.replicas == 1 else 4 * a.replicas))
    if len(nodes) < a.replicas:
        print(f"rmr_load: --e2-nodes {len(nodes)} < --replicas {a.replicas}", file=sys.stderr)
        return 2
    clustered = a.replicas > 1 or a.cluster
    owners = expected_owners(nodes, rids)
    cell_ues = Counter(cell for _, cell, _ in build_trace(a.ues, a.distinct, seed=11))
    cell_node = layout(dict(cell_ues), nodes, owners)
    rmr_port = {r: XAPP_PORT + 10 * i for i, r in enumerate(rids)}
    endpoint = {r: f"127.0.0.1:{p}" for r, p in rmr_port.items()}
    servers, addrs = [], []
    for _ in range(2):
        s = grpc.server(futures.ThreadPoolExecutor(2))
        pbg.add_ControlServicer_to_server(FakeAgent(), s)
        addrs.append(f"127.0.0.1:{s.add_insecure_port('127.0.0.1:0')}")
        s.start()
        servers.append(s)
    tmp = Path(tempfile.mkdtemp(prefix="rmr_load-"))
    (tmp / "layout.json").write_text(json.dumps({"nodes": nodes, "cells": {str(c): n for c, n in cell_node.items()}}))
    static = [f"mse|20011|-1|127.0.0.1:{SENDER_PORT}", f"mse|20012|-1|127.0.0.1:{SENDER_PORT}"]
    (tmp / "xapp.rt").write_text(route_table([], static))      # the xApps send nothing by route
    env = {**os.environ, "RMR_ASYNC_CONN": "0", "RMR_RTG_SVC": "-1", "RMR_SRC_ID": "127.0.0.1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "proto"), os.environ.get("PYTHONPATH", "")])}
    env.pop("CONFIG_FILE", None)
    os.sched_setaffinity(0, {a.sender_cpu})
    procs: list[subprocess.Popen] = []
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: [s.stop(0) for s in servers])
        if clustered:                    # SDL for the leases: a private redis-server
            sys.path.insert(0, str(ROOT / "tests" / "xapp"))
            from redis_server import redis_server
            env["DBAAS_SERVICE_HOST"], env["DBAAS_SERVICE_PORT"] = "127.0.0.1", str(
                stack.enter_context(redis_server()))
        submgr = FakeSubmgr()
        stack.callback(submgr.close)     # after the xApps: they delete their subscriptions at quit
        stack.callback(_quit, procs)
        xps = []
        for i, r in enumerate(rids):
            xps.append(_spawn("xapp", a.xapp_cpu[i % len(a.xapp_cpu)], a, {**env, "RMR_SEED_RT": str(tmp / "xapp.rt")},
                              ["--agents", ",".join(addrs), "--http-port", str(a.http_port + i),
                               "--rmr-port", str(rmr_port[r]), "--replica-id", r, "--layout", str(tmp / "layout.json"),
                               "--submgr-url", submgr.url] + (["--cluster"] if clustered else [])
                              + (["--profile", str(Path(a.profile).resolve())] if a.profile and i == 0 else [])))
            procs.append(xps[-1])
        for xp in xps:
            _ask(xp, "", 300)
        t0 = time.time()
        while not settled(routes := routes_by_node(submgr.ledger.snapshot()), owners, endpoint):
            if time.time() - t0 > a.settle_s:
                raise RuntimeError(f"subscriptions not settled after {a.settle_s:g} s: {routes}")
            time.sleep(0.2)
        settle_s, changes0 = time.time() - t0, submgr.ledger.changes
        # the E2 termination's routes, as rtmgr derives them from submgr's subscriptions
        (tmp / "sender.rt").write_text(route_table(submgr.ledger.snapshot(), [
            f"mse|{HEALTH_REQ}|-1|{';'.join(endpoint[r] for r in rids)}", *static]))
        (tmp / "routes.json").write_text(json.dumps({str(c): [n, routes[n][0]] for c, n in cell_node.items()}))
        sp = _spawn("sender", a.sender_cpu, a, {**env, "RMR_SEED_RT": str(tmp / "sender.rt")},
                    ["--routes", str(tmp / "routes.json"), "--replicas", str(a.replicas)])
        procs.insert(0, sp)
        _ask(sp, "", 300)
        split = "; ".join(f"{r} on CPU {a.xapp_cpu[i % len(a.xapp_cpu)]}: "
                          f"{sum(o == r for o in owners.values())} E2 nodes, "
                          f"{sum(u for c, u in cell_ues.items() if owners[cell_node[c]] == r)} UEs"
                          for i, r in enumerate(rids))
        print(f"# rmr_load: {a.replicas} xApp replica(s){' sharing E2 nodes through SDL leases' if clustered else ''}"
              f" ({split}); sender and driver on CPU {a.sender_cpu}; {a.ues} UEs "
              f"({a.distinct} reports each, repeated) on {len(cell_ues)} cells, {len(nodes)} E2 nodes, one "
              f"subscription each (fake submgr, routes per subscription; settled {settle_s:.1f} s after the "
              f"replicas were ready); control period {a.period:g} s; phases {a.phase_s:g} s, "
              f"flat out {a.flat_s:g} s, drain {a.drain_s:g} s; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs", flush=True)
        _ask(sp, f"phase 1000 {a.warmup_s}")           # warm-up: codecs, learning, route table
        time.sleep(a.drain_s)
        print(f"{'phase':>9} | {'sent/s':>7} {'handled/s':>9} | {'lag p50':>7} {'p99 ms':>7} | {'ingest p99':>10} | "
              f"{'lost':>6} {'dropped':>7} {'shed':>6} {'!owned':>6} {'unacc':>5} | {'CPU us/ind':>10} {'rx':>5} "
              f"{'cycle':>5} {'core':>4} | {'RSS MB':>6} | {'health max ms':>13} {'ready max ms':>12}", flush=True)
        rows = []
        for rate, secs in [(r, a.phase_s) for r in a.rates] + [(0, a.flat_s)]:
            ready_ms: list[float] = []
            done = threading.Event()

            def probe() -> None:
                while not done.wait(0.25):
                    for i in range(a.replicas):
                        t = time.time()
                        try:
                            urllib.request.urlopen(f"http://127.0.0.1:{a.http_port + i}/ric/v1/health/ready",
                                                   timeout=5).read()
                            ready_ms.append(1e3 * (time.time() - t))
                        except Exception:  # noqa: BLE001 - no answer within 5 s
                            ready_ms.append(5000.0)
            m0 = [_ask(xp, "mark") for xp in xps]
            th = threading.Thread(target=probe, daemon=True)
            th.start()
            s = _ask(sp, f"phase {rate} {secs}", secs + 120)
            time.sleep(a.drain_s)
            done.set()
            th.join(6)
            m1 = [_ask(xp, "mark") for xp in xps]
            row, reps = phase_figures(s, m0, m1)
            row = {"phase": f"{rate}/s" if rate else "flat out", "rate": rate, **row,
                   "ready_max_ms": max(ready_ms) if ready_ms else float("nan"),
                   "subscription_changes": submgr.ledger.changes - changes0}
            rows.append(row)
            print(f"{row['phase']:>9} | {row['sent_s']:7.0f} {row['handled_s']:9.0f} | {row['lag_p50_ms']:7.1f} "
                  f"{row['lag_p99_ms']:7.1f} | {row['ingest_p99_ms']:10.1f} | {row['lost']:6d} {row['dropped']:7d} "
                  f"{row['shed']:6d} {row['not_owned']:6d} {row['unaccounted']:5d} | {row['cpu_us']:10.1f} "
                  f"{row['cpu_rx_us']:5.0f} {row['cpu_cycle_us']:5.0f} {row['cpu_share']:4.2f} | "
                  f"{row['rss_mb']:6.0f} | {row['health_max_ms']:13.1f} {row['ready_max_ms']:12.1f}", flush=True)
            if a.replicas > 1:
                for r, rp in zip(rids, reps):
                    print(f"{'  ' + r:>9} | {'':>7} {rp['handled_s']:9.0f} | {rp['lag_p50_ms']:7.1f} "
                          f"{rp['lag_p99_ms']:7.1f} | {rp['ingest_p99_ms']:10.1f} | {'':>6} {rp['dropped']:7d} "
                          f"{rp['shed']:6d} {rp['not_owned']:6d} {rp['unaccounted']:5d} | {rp['cpu_us']:10.1f} "
                          f"{1e6 * rp['cpu_rx'] / max(1, rp['received']):5.0f} "
                          f"{1e6 * rp['cpu_cycle'] / max(1, rp['received']):5.0f} {rp['cpu_share']:4.2f} | "
                          f"{rp['rss_mb']:6.0f} | nodes owned {rp['owned']}", flush=True)
            print("#   " + json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}),
                  flush=True)
        ok = [r["handled_s"] for r in rows if r["lost"] == r["dropped"] == r["shed"] == 0 and r["lag_p99_ms"] < 100
              and r["health_unanswered"] == 0 and r["not_owned"] == r["unaccounted"] == 0]
        at5 = next((r["lag_p99_ms"] for r in rows if r["rate"] == 5000), float("nan"))
        print(f"rmr_load: sustained {max(ok) if ok else 0:.0f}/s, p99 lag {at5:.1f} ms at 5000/s, "
              f"lost {sum(r['lost'] for r in rows)}, shed {sum(r['shed'] for r in rows)}, "
              f"health {max(r['health_max_ms'] for r in rows):.1f} ms, replicas {a.replicas}, "
              f"not owned {sum(r['not_owned'] for r in rows)}, unaccounted {sum(r['unaccounted'] for r in rows)}, "
              f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        return 0


def _quit(procs: list[subprocess.Popen]) -> None:
    """Tell the roles to quit (the sender first), wait 15 s each, kill what is left."""
    for p in procs:
        try:
            p.stdin.write("quit\n")
            p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()


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
    ap.add_argument("--replicas", type=int, default=1,
                    help="xApp replicas; 2 or more share the E2 nodes through SDL leases (docs/scale-out.md) on a "
                         "private redis-server, each subscribed to its own nodes at a fake subscription manager "
                         "that routes per subscription")
    ap.add_argument("--e2-nodes", type=int, default=0, help="E2 nodes, one subscription each (default: 2 with one "
                                                             "replica, else 4 per replica)")
    ap.add_argument("--cluster", action="store_true",
                    help="controls.cluster enabled even with one replica (the cost of the leases alone)")
    ap.add_argument("--settle-s", type=float, default=60.0,
                    help="longest wait for every E2 node's subscription to be its owner's alone")
    ap.add_argument("--xapp-cpu", type=int, nargs="+", default=[0], help="CPUs for the replicas, in turn")
    ap.add_argument("--sender-cpu", type=int, default=1)
    ap.add_argument("--http-port", type=int, default=18080)
    ap.add_argument("--agents", default="", help=argparse.SUPPRESS)
    for hidden in ("--replica-id", "--layout", "--submgr-url", "--routes"):
        ap.add_argument(hidden, default="", help=argparse.SUPPRESS)
    ap.add_argument("--rmr-port", type=int, default=XAPP_PORT, help=argparse.SUPPRESS)
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
