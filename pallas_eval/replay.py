"""``pallas replay``: a whole handover story with every real part in the loop, on one machine.

1. Prepare (in the xApp's environment): the E2 trace (generated, or a converted real drive cut
   to a segment) and the plan decoded from it with the xApp's own ingest (pallas_eval.prepare).
2. Map the drive's cells onto ``servers`` edge servers so that no two cells between which a UE
   hands over share one (pallas_eval.cellmap): every handover is a real migration.
3. Start one ``pallas-agent`` per server, each launching its vLLM server with the Pallas KV
   connector (tiny random-weight Llama built on first use), each its own process group.
4. For each scheme (same trace, same seeds, same session lengths): start the xApp in test mode
   (``python -m xapp.main --mode test`` in the xApp's environment) replaying the trace from a
   common wall-clock start; run one UE client per UE (pallas_eval.ues) that streams sessions
   from its serving cell's agent and follows its handovers at the trace's times; stop the xApp;
   reset the servers' prefix caches so no scheme inherits another's.
5. Compute the no-handover reference of every session (a direct greedy request to one vLLM
   server) and check the UEs' token sequences against it.
6. Report: per-handover table, per-scheme summary (SIT, ITL, SLO share, T_early), CSV, JSON,
   plots, and the timing model's figures for the same handovers (``--simulate``).

Everything started is stopped on exit, on an error and on Ctrl-C (pallas_eval.procs).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import structlog

from pallas_common.controls import merge_controls
from pallas_common.schemes import PALLAS, PROACTIVE_NAMES, REPLAYED, SessionState, spec_for
from pallas_eval.cellmap import map_cells_to_servers, shared_pairs
from pallas_eval.experiments.presets import REPLAY_ANCHOR_MODEL
from pallas_eval.lengths import LengthSampler, SessionSpec, ue_session_stream
from pallas_eval.metrics import Handover, HandoverSIT, SchemeSummary, SessionRecord, sit_for_handover, summarize
from pallas_eval.procs import Supervisor, free_port, tail_hint
from pallas_eval.report import HandoverRow

log = structlog.get_logger("pallas.eval.replay")

REPO = Path(__file__).resolve().parent.parent


@dataclass
class ReplayOptions:
    """Everything ``pallas replay`` takes (see ``pallas replay --help`` for the meaning)."""

    out_dir: Path
    trace: str | tuple[str, ...] | None = None   # one converted drive, or several replayed together
    segment: str = "auto"
    min_handovers: int = 5
    servers: int = 3
    schemes: tuple[str, ...] = REPLAYED
    seed: int = 2
    ues: int = 6
    duration_s: float = 90.0
    history_drives: int = 16
    history: str = ""
    azure: str | None = None
    model_preset: str = "tiny"
    max_model_len: int = 2048
    max_output: int = 512
    regime: str = "paper"
    emulate: str = REPLAY_ANCHOR_MODEL
    peer_rate_mbps: float | None = None
    hop_delay_s: float | None = None
    engine_multiprocessing: bool = False
    start_delay_s: float = 10.0
    first_session_spread_s: float = 5.0
    #: several generated drives pooled in one run (one engine start); () = just ``seed``
    seeds: tuple[int, ...] = ()
    verify: bool = True
    simulate: bool = True
    simulate_only: bool = False
    rates: str = "measured"
    lead_s: float = 3.0
    xapp_python: str = ""
    agent_ready_timeout_s: float = 600.0
    # Mutual TLS on every gRPC link (issue 16): a local CA made at start, each agent's
    # certificate by PALLAS_TLS_*, the xApp's in its descriptor's controls.tls. False: every
    # process runs plaintext with an explicit --insecure.
    tls: bool = True
    progress: bool = True
    # Experiment hooks (issue 17, pallas_eval.experiments.live): extra arguments of the xApp's
    # test-mode command line, and values merged into its descriptor's controls, object by
    # object (pallas_common.controls.merge_controls; e.g. {"scheduler": {"fixed_window_s": 1.0}},
    # or pallas replay --xapp-profile / --xapp-set).
    xapp_args: tuple[str, ...] = ()
    xapp_controls: dict = field(default_factory=dict)
    #: xApp replicas (issue 46, pallas_eval.replicas): 1 = one xApp as ever; N > 1 = N test-mode
    #: processes with controls.cluster enabled on a private redis-server
    xapp_replicas: int = 1
    #: with several replicas, replica ``kill_replica.replica`` is SIGKILLed ``kill_replica.at_s``
    #: seconds of trace time after the replay's start (pallas_eval.failover.KillSpec); None: none
    kill_replica: Any = None
    # ... and extra options of the generated drive (python -m pallas_eval.prepare --generate ...,
    # e.g. ("--isd-m", "100") or ("--convoy",)).
    generate_args: tuple[str, ...] = ()


@dataclass
class SchemeRun:
    """One scheme's raw results: the UEs' sessions, the xApp's events, wall start."""

    scheme: str
    start_at: float
    sessions: list[SessionRecord]
    specs: dict[str, SessionSpec]
    events: list[dict]
    errors: list[str]
    offset: float
    cpu: dict[str, float] = field(default_factory=dict)
    #: the replica killed mid-run (``--kill-replica``): {"replica", "t" (wall time of the
    #: SIGKILL), "lease_s", "heartbeat_s"}; {} when none was
    kill: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Regime:
    """How the replay's engines and links behave (issue 13 item 1, docs/model.md §9).

    ``paper``: engines paced to the emulated model's r_p / r_d (pallas_eval.emulated_connector),
    the agents' peer link at the paper's 300 Mbit/s scaled by s_kv(tiny) / s_kv(emulated), and
    every relayed stream ``hop_delay_s`` later (pallas_eval.relay). ``native``: the tiny model's
    own speed, an unlimited link, no hop delay (unless given).
    """

    name: str
    model: Any                     # pallas_eval.emulation.EmulatedModel, or None (native)
    peer_rate_mbps: float          # 0 = unlimited
    hop_delay_s: float
    s_kv_tiny: float

    def describe(self) -> str:
        link = f"{self.peer_rate_mbps:.3g} Mbit/s" if self.peer_rate_mbps else "unlimited"
        if self.model is None:
            return f"regime native: the tiny model's own speed, peer link {link}, hop delay {self.hop_delay_s * 1000:.0f} ms"
        m = self.model
        return (f"regime paper: emulating {m.name} (r_p {m.r_p:,.0f} tok/s, r_d {m.r_d:g} tok/s; {m.source}), "
                f"peer link {link} (= 300 Mbit/s x {self.s_kv_tiny:,.0f} / {m.s_kv:,.0f} B/token), "
                f"relay hop delay {self.hop_delay_s * 1000:.0f} ms")


def regime_of(opts: ReplayOptions, s_kv_tiny: float) -> Regime:
    """The :class:`Regime` of ``opts`` for a model of ``s_kv_tiny`` KV bytes per token.

    Raises:
        ValueError: an unknown regime or emulated model.
    """
    from pallas_eval.emulation import PAPER_HOP_DELAY_S, emulated_model, emulated_peer_rate_mbps
    if opts.regime == "native":
        return Regime("native", None, float(opts.peer_rate_mbps or 0.0), float(opts.hop_delay_s or 0.0), s_kv_tiny)
    if opts.regime != "paper":
        raise ValueError(f"unknown regime {opts.regime!r}: 'paper' or 'native'")
    m = emulated_model(opts.emulate)
    rate = opts.peer_rate_mbps if opts.peer_rate_mbps is not None else emulated_peer_rate_mbps(s_kv_tiny, m)
    hop = opts.hop_delay_s if opts.hop_delay_s is not None else PAPER_HOP_DELAY_S
    return Regime("paper", m, float(rate), float(hop), s_kv_tiny)


def tiny_kv_bytes_per_token(preset: str) -> float:
    """s_kv of the served model preset (docs/model.md Eq. 1), bytes per token."""
    from pallas_common.timing import kv_bytes_per_token
    from pallas_eval.models import build_model, model_config
    return float(kv_bytes_per_token(model_config(build_model(preset))))


def pace_stats_path(opts: ReplayOptions, index: int) -> Path:
    """Where server ``index``'s paced connector writes its step statistics."""
    return (opts.out_dir / "logs" / f"pace-edge-{index}.json").resolve()


# ---------------------------------------------------------------------------------------------
# Preparation and the servers
# ---------------------------------------------------------------------------------------------

def xapp_python(opts: ReplayOptions) -> str:
    """The xApp environment's interpreter (``.venv/xapp/bin/python`` of the repository)."""
    if opts.xapp_python:
        return opts.xapp_python
    for cand in (REPO / ".venv" / "xapp" / "bin" / "python",):
        if cand.exists():
            return str(cand)
    raise FileNotFoundError("the xApp environment is missing: run `make envs` (it makes .venv/xapp)")


# The operator credential of the replay's agents' fronts (lists and stops sessions at the end).
OPERATOR_TOKEN = os.environ.get("PALLAS_FRONT_OPERATOR_TOKEN") or secrets.token_urlsafe(32)


#: The error a scheme's run records when its xApp wrote no events (it did not run: a refused
#: descriptor, a crash); ``pallas replay`` then exits 1 (pallas_eval.cli.replay_status).
XAPP_SILENT = "the xApp wrote no events"


def _env_with_repo() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "proto")] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def prepare(opts: ReplayOptions) -> dict:
    """Run pallas_eval.prepare in the xApp's environment; returns the plan."""
    out = opts.out_dir / "input"
    if opts.history and not opts.trace:
        raise ValueError("--history is for a real drive (--trace); a generated drive has --history-drives")
    cmd = [xapp_python(opts), "-m", "pallas_eval.prepare", str(out)]
    if opts.trace:
        for t in ([opts.trace] if isinstance(opts.trace, str) else opts.trace):
            cmd += ["--trace", str(t)]
        if opts.segment:
            cmd += ["--segment", opts.segment, "--min-handovers", str(opts.min_handovers)]
        if opts.history:
            cmd += ["--history", str(Path(opts.history).resolve())]
    else:
        cmd += ["--generate", "--seed", str(opts.seed), "--ues", str(opts.ues), "--duration-s", str(opts.duration_s),
                "--history-drives", str(opts.history_drives), *opts.generate_args]
    r = subprocess.run(cmd, cwd=str(REPO), env=_env_with_repo(), capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"preparing the trace failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")
    return json.loads((out / "plan.json").read_text())


def server_map(plan: dict, n_servers: int) -> dict[int, int]:
    """Cells -> server index with no handover pair (and as few neighbour pairs as possible)
    on one server."""
    hos = [(h[2], h[3]) for h in plan["handovers"]]
    nbs = [(a, b) for a, b, n in plan["neighbour_pairs"] for _ in range(min(int(n), 5))]
    return map_cells_to_servers(plan["cells"], hos, nbs, n_servers=n_servers)


@dataclass
class Server:
    """One edge server of the replay: its agent (which launched its vLLM server)."""

    index: int
    agent: Any            # pallas_eval.cluster.LocalAgent (ports, readiness, metrics)
    child: Any            # pallas_eval.procs.Child
    vllm_port: int

    @property
    def agent_id(self) -> str:
        return self.agent.agent_id

    @property
    def vllm_url(self) -> str:
        return f"http://127.0.0.1:{self.vllm_port}"


def start_servers(sup: Supervisor, opts: ReplayOptions, n: int, regime: Regime | None = None,
                  peer_url: Callable[[str], str] | None = None) -> list[Server]:
    """Start ``n`` agents (each with its vLLM server) under the supervisor and wait until all
    are ready. vLLM threads: one torch thread per engine, not pinned (see below). ``regime`` (default: that
    of ``opts``) sets the connector's pacing and the peer link's rate. ``peer_url(front)``: the
    URL the other agents know a front by (``--peer-front``; the paper regime's delaying relay
    proxy, so that a relayed stream crosses the hop and the front accepts it as a peer's)."""
    from pallas_eval.cluster import LocalAgent, provision_tls
    from pallas_eval.emulation import agent_flags, vllm_step_args
    from pallas_eval.models import build_model

    model = str(build_model(opts.model_preset))
    regime = regime or regime_of(opts, tiny_kv_bytes_per_token(opts.model_preset))
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if not opts.engine_multiprocessing:
        # EngineCore and its worker in one process: no shared-memory queue that busy-polls for
        # a second after every step (benchmarks/idle_cpu.py measures both).
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # One torch thread per engine and no pinning: vLLM's "auto" binding pins every engine's
    # worker to the first core it does not reserve, and pinning engine i to core i mod cores
    # put two of three engines on one core; either way the paced steps overran (13-40% of
    # them in the paper regime on 2 cores). Unpinned, the OS spreads the engines.
    # (the agent sets VLLM_CPU_OMP_THREADS_BIND from --omp-bind, "nobind" below)
    env["OMP_NUM_THREADS"] = "1"
    servers = []
    agents = []
    for i in range(n):
        vport = free_port()
        extra = ["--vllm-port", str(vport), "--max-model-len", str(opts.max_model_len), "--log-level", "INFO",
                 "--scheme", PALLAS]
        if regime.peer_rate_mbps:
            extra += ["--peer-rate-mbps", f"{regime.peer_rate_mbps:.6g}"]
        if regime.model is not None:
            extra += agent_flags(regime.model.r_p, regime.model.r_d, pace_stats_path(opts, i))
            extra += ["--vllm-args", vllm_step_args()]
        a = LocalAgent(f"edge-{i}", model, omp_bind="nobind", extra=extra, log_dir=str(opts.out_dir / "logs"),
                       env=env, insecure=not opts.tls)
        agents.append((a, vport))
    if opts.tls:
        provision_tls([a for a, _ in agents], opts.out_dir / "tls")
    fronts = {a.agent_id: peer_url(a.front_url) if peer_url else a.front_url for a, _ in agents}
    for i, (a, vport) in enumerate(agents):
        child = sup.start(f"agent-{a.agent_id}", a.command({k: v for k, v in fronts.items() if k != a.agent_id}),
                          env={**_env_with_repo(), **a.env, **a.tls_env,
                               "PALLAS_FRONT_OPERATOR_TOKEN": OPERATOR_TOKEN}, cwd=REPO)
        a.proc = child.popen
        servers.append(Server(i, a, child, vport))
    for s in servers:
        try:
            s.agent.wait_ready(opts.agent_ready_timeout_s)
        except (RuntimeError, TimeoutError) as e:
            raise RuntimeError(f"agent {s.agent_id} did not start: {e}{tail_hint(s.child)}") from None
    sup.refresh()
    return servers


def end_sessions(servers: Sequence[Server], timeout_s: float = 20.0) -> int:
    """Stop every session still running at any agent (a UE left mid-session at the end of a
    scheme's replay), so the next scheme's xApp and engines start clean; returns how many were
    stopped. Waits until no agent reports a live session (or ``timeout_s``)."""
    import httpx
    live_states = {SessionState.NEW, SessionState.SERVING, SessionState.MIGRATING, SessionState.COMMITTING,
                   SessionState.PREPARING, SessionState.RESUMED}
    stopped = 0
    deadline = time.time() + timeout_s
    with httpx.Client(timeout=10.0, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}) as http:
        while True:
            live = []
            for s in servers:
                try:
                    for x in http.get(s.agent.front_url + "/v1/sessions").json().get("sessions", []):
                        if SessionState.of(x.get("state") or "") in live_states:
                            live.append((s, x["session_id"]))
                except (httpx.HTTPError, ValueError) as e:
                    log.warning("sessions unavailable", server=s.agent_id, error=repr(e))
            if not live or time.time() > deadline:
                if live:
                    log.warning("sessions still live", n=len(live))
                return stopped
            for s, sid in live:
                try:
                    http.delete(f"{s.agent.front_url}/v1/sessions/{sid}")
                    stopped += 1
                except httpx.HTTPError as e:
                    log.warning("session stop failed", server=s.agent_id, session=sid, error=repr(e))
            time.sleep(0.5)


def reset_prefix_caches(servers: Sequence[Server]) -> None:
    """Empty every server's prefix cache (vLLM's dev endpoint), so a scheme's run never reuses
    KV computed in another scheme's run. A failure is logged (the comparison is then biased)."""
    import httpx
    for s in servers:
        try:
            r = httpx.post(s.vllm_url + "/reset_prefix_cache", timeout=10.0)
            if r.status_code >= 300:
                log.warning("prefix cache reset refused", server=s.agent_id, status=r.status_code)
        except httpx.HTTPError as e:
            log.warning("prefix cache reset failed", server=s.agent_id, error=repr(e))


# ---------------------------------------------------------------------------------------------
# The xApp's configuration and one scheme's run
# ---------------------------------------------------------------------------------------------

def xapp_descriptor(plan: dict, mapping: dict[int, int], servers: Sequence[Server], scheme: str,
                    overlay: dict | None = None) -> dict:
    """The repository's descriptor with the replay's agents, cell map and scheme in ``controls``,
    then ``overlay`` (``ReplayOptions.xapp_controls``) merged in by
    :func:`pallas_common.controls.merge_controls`."""
    desc = json.loads((REPO / "descriptors" / "config-file.json").read_text())
    c = desc["controls"]
    c["scheme"] = scheme            # the one spelling (pallas_common.schemes.NAMES), as the schema's enum
    nodes = plan.get("e2_nodes", {})
    agents = {}
    for s in servers:
        cells = [cell for cell, i in mapping.items() if i == s.index]
        node = next((nodes.get(str(cell)) for cell in cells if nodes.get(str(cell))), f"replay-{s.agent_id}")
        agents[s.agent_id] = {"e2_node_id": node, "control_address": s.agent.control_address,
                              "peer_address": f"127.0.0.1:{s.agent.peer_port}"}
    c["agents"] = agents
    c["cells"] = {str(cell): servers[i].agent_id for cell, i in sorted(mapping.items())}
    # what the xApp learned in this network before (prepare --history-drives); "" starts empty
    c["association_map"] = {"path": plan.get("history", "")}
    xapp_tls = servers[0].agent.client_tls if servers else None
    if xapp_tls is not None:  # the agents serve mutual TLS: the xApp's certificate (issue 16)
        c["tls"] = {"enabled": True, "cert_file": str(xapp_tls.cert), "key_file": str(xapp_tls.key),
                    "ca_file": str(xapp_tls.ca)}
    else:  # plaintext agents: the shipped descriptor's certificate paths do not apply here
        c.pop("tls", None)
    if overlay:
        desc["controls"] = merge_controls(c, overlay)
    return desc


def scheme_overlay(opts: ReplayOptions, scheme: str) -> dict:
    """The controls merged into ``scheme``'s xApp descriptor: ``opts.xapp_controls``, and with
    several xApp replicas the cluster and SDL namespace of pallas_eval.replicas under them (so
    ``--xapp-set cluster.lease_s=...`` still wins). Raises ValueError for fewer than 1 replica."""
    n = int(opts.xapp_replicas)
    if n < 1:
        raise ValueError(f"xapp_replicas {n}: at least 1")
    if n == 1:
        return opts.xapp_controls
    from pallas_eval.replicas import replica_controls
    return merge_controls(replica_controls(scheme), opts.xapp_controls or {})


def run_scheme(sup: Supervisor, opts: ReplayOptions, plan: dict, mapping: dict[int, int], servers: Sequence[Server],
               scheme: str, sampler: LengthSampler, vocab_size: int, progress: Any = None,
               cpu: Any = None, origin_of: Any = None) -> SchemeRun:
    """Replay the trace once under ``scheme``: xApp in test mode + every UE; returns raw results.

    ``cpu``: a pallas_eval.cpu.CpuSampler following the servers; the xApp is added to it for
    this run, and the run's CPU share per process (from the UEs' start to their end) is
    returned in ``SchemeRun.cpu``. ``origin_of(front)``: what a UE names as the relay origin at
    a handover (pallas_eval.ues.run_ue)."""
    from pallas_eval.ues import UEPlan, first_session_delay, run_ues

    d = opts.out_dir / scheme
    d.mkdir(parents=True, exist_ok=True)
    cfg = d / "xapp-config.json"
    n_xapps = int(opts.xapp_replicas)
    desc = xapp_descriptor(plan, mapping, servers, scheme, scheme_overlay(opts, scheme))
    cfg.write_text(json.dumps(desc, indent=1))
    events = d / "xapp-events.jsonl"
    if events.exists():
        events.unlink()
    t_first = float(plan["t_first"])
    start_at = time.time() + opts.start_delay_s   # the xApp's start-up (imports, config) fits before
    offset = start_at - t_first
    cmd = [xapp_python(opts), "-m", "xapp.main", "--mode", "test", "--config", str(cfg), "--trace", plan["trace"],
           "--start-at", f"{start_at:.6f}", "--events", str(events), "--nrt", str(opts.out_dir / "input" / "nrt.json"),
           "--linger-s", "5"] + (["--tls"] if opts.tls else ["--insecure"]) + list(opts.xapp_args)
    xapps = _start_xapps(sup, scheme, cmd, events, n_xapps)
    kill: dict[str, Any] = {}
    timer = _kill_timer(opts, xapps, start_at, desc, kill)
    if cpu is not None:
        for name, child, _ in xapps:
            cpu.add(name, child.popen.pid)
    by_agent = {s.index: s.agent.front_url for s in servers}

    def front_of_cell(cell: int) -> str:
        return by_agent[mapping.get(int(cell), 0)]

    plans = [UEPlan(u["ue_id"], float(u["start"]) + offset
                    + first_session_delay(opts.seed, u["ue_id"], opts.first_session_spread_s),
                    float(u["end"]) + offset,
                    [(float(t) + offset, int(c)) for t, c in u["cells"]]) for u in plan["ues"]]
    streams = {u["ue_id"]: ue_session_stream(opts.seed, u["ue_id"], sampler, vocab_size) for u in plan["ues"]}
    total = float(plan["t_last"]) - t_first
    task = progress.add_task(f"{scheme:>13}", total=total) if progress else None
    tokens = [0]

    async def main() -> list:
        async def tick():
            while True:
                if progress:
                    progress.update(task, completed=min(total, max(0.0, time.time() - start_at)),
                                    description=f"{scheme:>13} {tokens[0]:>6} tok")
                await asyncio.sleep(0.5)
        t = asyncio.create_task(tick())
        try:
            return await run_ues(plans, front_of_cell, streams, scheme=scheme,
                                 on_token=lambda: tokens.__setitem__(0, tokens[0] + 1), origin_of=origin_of)
        finally:
            t.cancel()

    snap0 = cpu.snapshot() if cpu is not None else None
    try:
        outcomes = asyncio.run(main())
    finally:
        if timer is not None:
            timer.cancel()
    cpu_share = {}
    if cpu is not None:
        from pallas_eval.cpu import cpu_share as share
        cpu_share = share(snap0, cpu.snapshot())
        for name, _, _ in xapps:
            cpu.roots.pop(name, None)
    if progress:
        progress.update(task, completed=total)
    # The xApp ends by itself after the trace (+ linger) once its policy calls are answered
    # (a Full-Copy commit can take long); stop it if it has not within a minute.
    deadline = time.time() + 60
    while any(c.alive() for _, c, _ in xapps if c is not None) and time.time() < deadline:
        time.sleep(0.2)
    for _, child, _ in reversed(xapps):       # the replicas, then their redis-server
        sup.stop(child)
    sessions = [s for o in outcomes for s in o.sessions]
    specs = {k: v for o in outcomes for k, v in o.specs.items()}
    errors = [e for o in outcomes for e in o.errors]
    if n_xapps == 1:
        evs = [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
        if not evs:
            errors.append(XAPP_SILENT + tail_hint(xapps[0][1]))
    else:
        from pallas_eval.replicas import epochs_of_two_replicas, merge_events
        evs = merge_events([(name, path) for name, _, path in xapps if path is not None])
        said = {e["replica"] for e in evs}
        errors += [f"{XAPP_SILENT} ({name})" + tail_hint(child)
                   for name, child, path in xapps if path is not None and name not in said]
        mixed = epochs_of_two_replicas(evs)
        if mixed:
            errors.append(f"{len(mixed)} (session, epoch) pairs got orders from two replicas: "
                          + ", ".join(f"{s} epoch {ep} from {'+'.join(r)}"
                                      for (s, ep), r in list(mixed.items())[:5]))
    for e in evs:
        if e.get("kind") == "late_start":
            errors.append(f"the xApp started {e.get('late_s', 0):.2f} s after the replay's start (raise start_delay_s)")
    if opts.kill_replica is not None and not kill:
        errors.append(f"--kill-replica {opts.kill_replica}: the replica was not killed (it had ended)")
    return SchemeRun(scheme, start_at, sessions, specs, evs, errors, offset, cpu_share, kill)


def _kill_timer(opts: ReplayOptions, xapps: Sequence[tuple[str, Any, Path | None]], start_at: float,
                desc: dict, kill: dict[str, Any]) -> threading.Timer | None:
    """With ``opts.kill_replica`` (pallas_eval.failover.KillSpec), a started timer that
    SIGKILLs that replica's process group at ``start_at + at_s`` (wall time) and fills ``kill``
    (module pallas_eval.failover's inputs: replica, wall time, the lease time and heartbeat of
    the replicas' descriptor ``desc``). Its leases are left to expire; a replica that already
    ended is not killed (``kill`` stays empty). None without a kill."""
    k = opts.kill_replica
    if k is None:
        return None
    from pallas_eval.replicas import replica_id
    rid = replica_id(k.replica)
    child = next(c for name, c, _ in xapps if name == rid)
    cluster = desc["controls"].get("cluster") or {}

    def fire() -> None:
        if not child.alive():
            return
        t = time.time()
        try:
            os.killpg(child.pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        kill.update(replica=rid, t=t, lease_s=float(cluster.get("lease_s", 0.0)),
                    heartbeat_s=float(cluster.get("heartbeat_s", 0.0)))
        log.info("replica killed", replica=rid, at_s=round(t - start_at, 3))

    timer = threading.Timer(max(0.0, start_at + float(k.at_s) - time.time()), fire)
    timer.daemon = True
    timer.start()
    return timer


def trace_indications(path: str | Path, offset: float) -> dict[str, list[float]]:
    """E2 node -> wall times (the record's time + ``offset``) of the trace's RIC indications
    (RMR type 12050), in order: what every test-mode replica is fed (xapp.e2.trace)."""
    from xapp.e2.trace import read_trace
    out: dict[str, list[float]] = {}
    for r in read_trace(path):
        if r.mtype == 12050:
            out.setdefault(r.e2_node, []).append(r.time + offset)
    return out


def failover_of(run: SchemeRun, plan: dict, rows: Sequence[HandoverRow]) -> dict | None:
    """The fail-over report (pallas_eval.failover.failover_report) of a run in which a replica
    was killed, from its events, the trace's indications and its per-handover ``rows``; None
    for a run without a kill."""
    if not run.kill:
        return None
    from pallas_eval.failover import failover_report
    t_kill = float(run.kill["t"])
    seen = {s.session_id: {"error": s.error,
                           "finished": not s.error and len(s.times) >= s.max_tokens,
                           "agents_after_kill": sorted({a for t, a in zip(s.times, s.agents) if t >= t_kill})}
            for s in run.sessions}
    return failover_report(run.events, killed=run.kill["replica"], t_kill=t_kill, start_at=run.start_at,
                           lease_s=run.kill["lease_s"], heartbeat_s=run.kill["heartbeat_s"],
                           indications=trace_indications(plan["trace"], run.offset),
                           rows=[(r.ue_id, r.time_s + run.start_at, r.session_id, r.outcome) for r in rows
                                 if r.scheme == run.scheme],
                           sessions=seen)


def _start_xapps(sup: Supervisor, scheme: str, cmd: list[str], events: Path,
                 n: int) -> list[tuple[str, Any, Path | None]]:
    """Start the scheme's xApp: one process (``n`` = 1), or ``n`` replicas on a private
    redis-server (pallas_eval.replicas). Returns ``[(name, Child, events file)]``: the
    redis-server first (no events file), then the xApp processes."""
    if n == 1:
        return [("xapp", sup.start(f"xapp-{scheme}", cmd, env=_env_with_repo(), cwd=REPO), events)]
    from pallas_eval.replicas import replica_commands, start_dbaas
    dbaas, port = start_dbaas(sup, f"dbaas-{scheme}")
    env = dict(_env_with_repo(), DBAAS_SERVICE_HOST="127.0.0.1", DBAAS_SERVICE_PORT=str(port))
    out: list[tuple[str, Any, Path | None]] = [("dbaas", dbaas, None)]
    for rid, argv, path in replica_commands(cmd, n):
        if path.exists():
            path.unlink()
        out.append((rid, sup.start(f"{rid}-{scheme}", argv, env=env, cwd=REPO), path))
    return out


# ---------------------------------------------------------------------------------------------
# References, per-handover rows and summaries
# ---------------------------------------------------------------------------------------------

def references(servers: Sequence[Server], specs: dict[SessionSpec, None] | Sequence[SessionSpec],
               per_server: int = 8) -> dict[SessionSpec, list[int]]:
    """The no-handover greedy continuation of every distinct session (vLLM's OpenAI completions
    API with a token-id prompt, prefix caches reset first by the caller), spread over the
    servers, ``per_server`` at a time each (paced engines decode a batch in one step)."""
    import httpx
    models = httpx.get(servers[0].vllm_url + "/v1/models", timeout=30).json()
    model = models["data"][0]["id"]
    todo = list(dict.fromkeys(specs))
    out: dict[SessionSpec, list[int]] = {}

    async def run() -> None:
        async with httpx.AsyncClient(timeout=1800) as http:
            sems = [asyncio.Semaphore(per_server) for _ in servers]

            async def one(k: int, spec: SessionSpec) -> None:
                i = k % len(servers)
                async with sems[i]:
                    body = {"model": model, "prompt": list(spec.prompt_ids), "max_tokens": spec.max_tokens,
                            "temperature": 0.0, "ignore_eos": True, "return_token_ids": True, "stream": False}
                    r = await http.post(servers[i].vllm_url + "/v1/completions", json=body)
                    r.raise_for_status()
                    out[spec] = list(r.json()["choices"][0].get("token_ids") or [])
            await asyncio.gather(*(one(k, sp) for k, sp in enumerate(todo)))
    asyncio.run(run())
    return out


def _lead(events: list[dict], ue: str, t_ho: float, to_cell: int) -> float:
    """T_avail: how long before ``t_ho`` (trace clock) the UE's reported prediction named
    ``to_cell`` and kept naming it until the handover (docs/model.md §5); NaN if never."""
    since = float("nan")
    for e in events:
        if e.get("kind") != "prediction" or e.get("ue") != ue:
            continue
        t = e.get("trace_t")
        if t is None or t > t_ho:
            break
        since = t if e.get("target_cell") == to_cell else float("nan")
    return t_ho - since if math.isfinite(since) else float("nan")


def _t_ho_error(events: list[dict], ue: str, t_ho: float) -> float:
    """The xApp's predicted minus actual handover time for the handover of ``ue`` at ``t_ho``
    (trace clock), from its ``handover`` event (xapp/control.py); NaN without a prediction."""
    for e in events:
        if (e.get("kind") == "handover" and e.get("ue") == ue
                and abs(float(e.get("trace_t", -1e18)) - t_ho) < 1e-6):
            v = e.get("timing_error_s")
            return float(v) if v is not None else float("nan")
    return float("nan")


def handover_rows(run: SchemeRun, plan: dict, mapping: dict[int, int], servers: Sequence[Server]
                  ) -> tuple[list[HandoverRow], list[HandoverSIT]]:
    """One row per handover of the trace under this scheme (see report.HandoverRow)."""
    rows, sits = [], []
    names = {s.index: s.agent_id for s in servers}
    hos = sorted(plan["handovers"], key=lambda h: h[1])
    seen_gaps: dict[tuple[str, float], int] = {}
    for k, (ue, t, a, b) in enumerate(hos):
        nxt = min([h[1] for h in hos[k + 1:] if h[0] == ue] or [float("inf")])
        ho = Handover(ue, float(t) + run.offset, int(a), int(b))
        new_agent = names.get(mapping.get(int(b), -1))
        sit = sit_for_handover(ho, run.sessions, new_agent=new_agent, next_handover=nxt + run.offset)
        # One interruption spanning several handovers (no token in between) is split at them:
        # the earlier handover's SIT ends at the later one, the later one's runs from its own
        # time to the first token after it. Every handover with a session gets a SIT, and the
        # parts add up to the interruption the UE saw.
        gap_key = (sit.session_id, sit.last_before)
        shared = math.isfinite(sit.sit) and gap_key in seen_gaps
        if shared:
            k_prev = seen_gaps[gap_key]
            prev = sits[k_prev]
            cut = max(prev.last_before, ho.time)
            sits[k_prev] = HandoverSIT(prev.handover, prev.session_id, cut - prev.last_before, prev.last_before, cut,
                                       prev.tokens_at_ho)
            rows[k_prev].sit_s = sits[k_prev].sit
            sit = HandoverSIT(ho, sit.session_id, sit.first_after - cut, cut, sit.first_after, sit.tokens_at_ho)
        if math.isfinite(sit.sit):
            seen_gaps[gap_key] = len(sits)
        sits.append(sit)
        commit = next((e for e in run.events if e.get("kind") == "commit" and e.get("ue") == ue
                       and abs(float(e.get("trace_t", -1e18)) - float(t)) < 1e-6), None)
        reply = None
        if commit is not None:
            reply = next((e for e in run.events if e.get("kind") == "reply" and e.get("call") == "commit"
                          and e.get("session") == commit.get("session") and e.get("epoch") == commit.get("epoch")), None)
        skipped = next((e for e in run.events if e.get("kind") == "commit_skipped" and e.get("ue") == ue
                        and abs(float(e.get("trace_t", -1e18)) - float(t)) < 1e-6), None)
        if not math.isfinite(sit.sit):
            outcome = "no-session"
        elif commit is None:
            outcome = f"no-commit ({skipped.get('reason')})" if skipped else "no-commit"
        elif reply is None:
            outcome = "commit (no reply)"
        elif not reply.get("ok"):
            outcome = f"error:{reply.get('status')}"
        else:
            used = reply.get("scheme") or run.scheme
            if commit.get("prepared") and used == run.scheme:
                outcome = "commit"
            elif used == run.scheme:
                outcome = ("recovered" if run.scheme not in PROACTIVE_NAMES else
                           "bridged" if spec_for(used).bridge else f"fallback:{used}")
            else:
                outcome = f"fallback:{used}"
        row = HandoverRow(
            scheme=run.scheme, ue_id=ue, time_s=float(t) - float(plan["t_first"]), from_cell=int(a), to_cell=int(b),
            from_server=names.get(mapping.get(int(a), -1), "?"), to_server=new_agent or "?",
            session_id=sit.session_id, tokens_at_ho=sit.tokens_at_ho,
            lead_s=_lead(run.events, ue, float(t), int(b)), t_ho_error_s=_t_ho_error(run.events, ue, float(t)),
            window_s=float(commit["window_s"]) if commit and commit.get("window_s") is not None else float("nan"),
            t_early_s=float(commit["t_early_s"]) if commit and commit.get("t_early_s") is not None else float("nan"),
            sit_s=sit.sit, outcome=outcome)
        rows.append(row)
    return rows, sits


def migration_figures(runs: Sequence[SchemeRun]) -> dict[tuple[str, int], dict]:
    """What each handover moved, by (session, epoch), from the source agents' Commit replies in
    the xApp's event log: the prefix the target prefilled (``split_tokens``), the tokens it
    recomputed at the resume (``recomputed_tokens``) and the KV bytes it accepted
    (``kv_bytes_moved``), and the Commit call's latency at the xApp (``latency_s``). Only
    successful commits; a Detour commit moves nothing (zeros)."""
    out: dict[tuple[str, int], dict] = {}
    for r in runs:
        for e in r.events:
            if (e.get("kind") != "reply" or e.get("call") != "commit" or e.get("status") != "STATUS_OK"
                    or "session" not in e or "epoch" not in e):
                continue
            out[(e["session"], int(e["epoch"]))] = {
                "prefix": int(e.get("split_tokens") or 0),
                "recomputed": int(e.get("recomputed_tokens") or 0),
                "bytes": int(e.get("kv_bytes_moved") or 0),
                "latency": float(e.get("latency_s") or "nan")}
    return out


def fill_migration_figures(rows: Sequence[HandoverRow], runs: Sequence[SchemeRun], migrations: dict) -> None:
    """Bytes moved and prefill tokens per handover (``migrations``: :func:`migration_figures`):
    bytes = KV bytes the target accepted; prefill = the prefix the target prefilled + the tokens
    it recomputed at the resume."""
    commits = {}
    for r in runs:
        for e in r.events:
            if e.get("kind") == "commit":
                commits[(r.scheme, e.get("ue"), round(float(e.get("trace_t", 0.0)), 3))] = e
    t_first = None
    for r in runs:
        t_first = r.start_at - r.offset
        break
    for row in rows:
        e = commits.get((row.scheme, row.ue_id, round(row.time_s + (t_first or 0.0), 3)))
        if e is None:
            continue
        m = migrations.get((e.get("session"), int(e.get("epoch") or 0)))
        if not m:
            continue
        row.bytes_moved = int(m["bytes"])
        row.prefill_tokens = int(m["prefix"] + m["recomputed"])
        row.commit_s = float(m.get("latency", float("nan")))


def save_sessions(path: Path, run: SchemeRun) -> None:
    """Every session the UEs ran under one scheme, with every token's id, arrival time, serving
    agent and relay, as JSON lines."""
    with open(path, "w") as f:
        for s in run.sessions:
            f.write(json.dumps({"ue": s.ue_id, "session": s.session_id, "prompt_tokens": s.prompt_tokens,
                                "max_tokens": s.max_tokens, "start": s.start, "times": s.times,
                                "token_ids": s.token_ids, "agents": s.agents, "relayed": s.relayed,
                                "error": s.error, "token_exact": s.matches_reference()}) + "\n")


def agent_counters(servers: Sequence[Server]) -> dict[str, float]:
    """Sum of the agents' Prometheus counters that size a migration (bytes moved, prefill
    tokens), by sample name; used as before/after differences per scheme."""
    out: dict[str, float] = {}
    for s in servers:
        try:
            for k, v in s.agent.metrics().items():
                if k.startswith(("pallas_bytes_moved_total", "pallas_prefill_tokens_total",
                                 "pallas_migrations_total")):
                    out[k] = out.get(k, 0.0) + v
        except Exception as e:  # noqa: BLE001 - metrics are optional figures
            log.warning("metrics unavailable", server=s.agent_id, error=repr(e))
    return out


def measured_rates(runs: Sequence[SchemeRun]) -> dict[str, float]:
    """r_p, r_d, B, c_sync as the xApp saw them at its triggers and commits (medians), and the
    decode rate the UEs saw (median over sessions of tokens per second from first to last
    token); None where nothing was measured."""
    trig = [e for r in runs for e in r.events if e.get("kind") in ("trigger", "commit")]
    def med(key):
        v = [float(e[key]) for e in trig if e.get(key) is not None]
        return float(np.median(v)) if v else None
    rates = [(len(s.times) - 1) / (s.times[-1] - s.times[0]) for r in runs for s in r.sessions
             if len(s.times) > 8 and s.times[-1] > s.times[0]]
    lat = [float(e["latency_s"]) for r in runs for e in r.events if e.get("kind") == "reply" and e.get("latency_s")]
    return {"r_p": med("r_p"), "r_d_xapp": med("r_d"), "bandwidth": med("bandwidth"), "s_kv": med("s_kv"),
            "block_size": med("block_size"),
            "r_d_ue": float(np.median(rates)) if rates else None,
            "c_sync": float(np.median(lat)) if lat else None}


def load_pace(opts: ReplayOptions, index: int) -> dict | None:
    """The paced connector's last statistics of server ``index`` (None if it wrote none)."""
    from pallas_eval.emulation import load_pace_stats
    return load_pace_stats(pace_stats_path(opts, index))


def ue_decode_rate(runs: Sequence[SchemeRun]) -> float | None:
    """The decode rate the UEs saw: 1 / the median gap between consecutive tokens of a session
    (handover gaps are few against thousands of steps), tokens/s; None without tokens."""
    itl = np.concatenate([s.itls() for r in runs for s in r.sessions] or [np.zeros(0)])
    itl = itl[itl > 0]
    return float(1.0 / np.median(itl)) if itl.size else None


def pacing_check(regime: Regime, stats: Sequence[dict | None], runs: Sequence[SchemeRun],
                 tolerance: float = 0.10) -> dict:
    """Whether the engines kept the emulated rates (issue 13 item 1): the prefill and decode
    rates the paced connectors measured over their steps (all servers together), and the decode
    rate the UEs saw, each within ``tolerance`` of the emulated model's. Returns the figures,
    ``held`` and a one-line ``verdict`` for the summary."""
    m = regime.model
    tot = {k: sum(float((s or {}).get(k) or 0.0) for s in stats)
           for k in ("prefill_tokens", "prefill_s", "decode_steps", "decode_s", "steps", "overruns", "overrun_s")}
    r_p = tot["prefill_tokens"] / tot["prefill_s"] if tot["prefill_s"] > 0 else None
    r_d = tot["decode_steps"] / tot["decode_s"] if tot["decode_s"] > 0 else None
    r_d_ue = ue_decode_rate(runs)
    checks = {"prefill (engine)": (r_p, m.r_p), "decode (engine)": (r_d, m.r_d), "decode (UE)": (r_d_ue, m.r_d)}
    bad = [f"{k} {'unmeasured' if v is None else f'{v:,.1f} tok/s'} vs {want:,.1f}" for k, (v, want) in checks.items()
           if v is None or abs(v - want) > tolerance * want]
    held = not bad
    figures = ", ".join(f"{k} {'-' if v is None else f'{v:,.1f}'}" for k, (v, _) in checks.items())
    over = f"; {int(tot['overruns'])} of {int(tot['steps'])} steps overran ({tot['overrun_s']:.1f} s in all)"
    if held:
        verdict = f"pacing held (within {tolerance:.0%} of {m.name}'s rates): {figures}{over}"
    else:
        verdict = (f"THE MACHINE COULD NOT KEEP UP with {m.name}'s rates (more than {tolerance:.0%} off: "
                   f"{'; '.join(bad)}){over}: live SITs are not in the paper's units")
    return {"held": held, "verdict": verdict, "r_p": r_p, "r_d": r_d, "r_d_ue": r_d_ue, **tot}
