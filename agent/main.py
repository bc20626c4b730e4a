"""``pallas-agent``: the sidecar beside one vLLM server (architecture.md, "Deployment picture").

One process serves three endpoints:

- the xApp-facing Control service (gRPC ``pallas.v1.Control``) and gRPC health checking
  (``grpc.health.v1.Health``; service names "" and "pallas.v1.Control") on ``--control-port``;
- the peer data plane (gRPC ``pallas.v1.PeerTransfer``, issue 2) on ``--peer-port``;
- the UE session front (HTTP, agent/frontend.py) with ``/metrics`` (Prometheus) on
  ``--front-port`` (and on ``--metrics-port`` too when it is set).

vLLM either runs already (``--vllm-url``; it must load the Pallas connector pointed at this
agent's hub, ``--hub-address``) or the agent launches it (default) with the connector
configured. Every flag has an environment variable ``PALLAS_<FLAG>`` (upper case, dashes as
underscores); the flag wins. Logs are JSON lines on stderr (structlog).

Example (two agents on one host, tiny random model)::

    pallas-agent --agent-id a --model-preset tiny --front-port 8081 --control-port 50061 \\
        --peer-port 50071 --omp-bind 0
    pallas-agent --agent-id b --model-preset tiny --front-port 8082 --control-port 50062 \\
        --peer-port 50072 --omp-bind 1 --peer-rate-mbps 300
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from agent.obs import BYTES_MOVED, KV_BLOCKS_HELD, configure_logging, get_logger, observe_resumed
from agent.schemes import Rates, SchemeRunner, scheme_name, scheme_value
from agent.wire import tune_malloc_for_blocks

__all__ = ["AgentConfig", "parse_args", "AgentApp", "main"]

CONTROL_SERVICE = "pallas.v1.Control"


@dataclass
class AgentConfig:
    """The agent's one configuration object (flags and ``PALLAS_*`` environment).

    Rates at the edge are Mbit/s (``peer_rate_mbps``), converted once to bytes/s.
    """

    agent_id: str = field(default_factory=socket.gethostname)
    host: str = "0.0.0.0"
    advertise_host: str = "127.0.0.1"
    control_port: int = 50051
    peer_port: int = 50052
    front_port: int = 8080
    metrics_port: int = 0
    vllm_url: str | None = None
    hub_address: str = "tcp://127.0.0.1:0"
    model: str | None = None
    model_preset: str | None = None
    vllm_port: int = 0
    kv_cache_gib: int = 1
    omp_bind: str = "auto"
    block_size: int = 32
    max_model_len: int = 4096
    max_num_seqs: int = 8
    dtype: str = "float32"
    min_step_ms: float = 0.0
    vllm_ready_timeout_s: float = 600.0
    vllm_log: str | None = None
    peer_rate_mbps: float = 0.0
    scheme: str = "pallas"
    peer_fronts: dict[str, str] = field(default_factory=dict)
    front_operator_token_file: str | None = None
    front_max_body_bytes: int = 1 << 20
    telemetry_period_ms: int = 100
    probe_prefill_tokens: int = 256
    resume_wait_s: float = 30.0
    session_ttl_s: float = 600.0
    tokenizer: str | None = None
    log_level: str = "INFO"
    log_format: str = "json"

    @property
    def peer_rate_bytes_per_s(self) -> float:
        """The peer link limit in bytes/s (0 = unlimited)."""
        return self.peer_rate_mbps * 1e6 / 8.0

    @property
    def peer_address(self) -> str:
        """host:port other agents use for this agent's PeerTransfer service."""
        return f"{self.advertise_host}:{self.peer_port}"

    @property
    def front_url(self) -> str:
        """URL other agents and UEs use for this agent's session front."""
        return f"http://{self.advertise_host}:{self.front_port}"


def _env(name: str, default: Any) -> Any:
    return os.environ.get("PALLAS_" + name.upper().replace("-", "_"), default)


def _parse_fronts(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        for part in filter(None, (p.strip() for p in item.split(","))):
            if "=" not in part:
                raise argparse.ArgumentTypeError(f"--peer-front wants AGENT_ID=URL, got {part!r}")
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip().rstrip("/")
    return out


def build_parser() -> argparse.ArgumentParser:
    """The ``pallas-agent`` argument parser (defaults read ``PALLAS_*`` variables)."""
    d = AgentConfig()
    p = argparse.ArgumentParser(prog="pallas-agent", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("identity and endpoints")
    g.add_argument("--agent-id", default=_env("agent_id", d.agent_id), help="this agent's id (gNB / edge server)")
    g.add_argument("--host", default=_env("host", d.host), help="bind address of every endpoint")
    g.add_argument("--advertise-host", default=_env("advertise_host", d.advertise_host),
                   help="host other agents and UEs use to reach this agent")
    g.add_argument("--control-port", type=int, default=int(_env("control_port", d.control_port)),
                   help="xApp-facing Control gRPC + health")
    g.add_argument("--peer-port", type=int, default=int(_env("peer_port", d.peer_port)),
                   help="PeerTransfer gRPC (agent to agent)")
    g.add_argument("--front-port", type=int, default=int(_env("front_port", d.front_port)),
                   help="UE session front (HTTP) and /metrics")
    g.add_argument("--metrics-port", type=int, default=int(_env("metrics_port", d.metrics_port)),
                   help="extra Prometheus port (0 = only the front's /metrics)")
    g.add_argument("--peer-front", action="append", default=[_env("peer_fronts", "")] if _env("peer_fronts", "") else [],
                   metavar="ID=URL", help="another agent's front URL (repeatable or comma-separated)")
    g.add_argument("--front-operator-token-file", default=_env("front_operator_token_file", None),
                   help="file holding the operator credential that lists sessions at the front (also "
                        "PALLAS_FRONT_OPERATOR_TOKEN); unset: listing refused")
    g.add_argument("--front-max-body-bytes", type=int,
                   default=int(_env("front_max_body_bytes", d.front_max_body_bytes)),
                   help="cap on an HTTP request body at the front (413 past it)")
    v = p.add_argument_group("vLLM")
    v.add_argument("--vllm-url", default=_env("vllm_url", None),
                   help="use this running vLLM server (started with the Pallas connector) instead of launching one")
    v.add_argument("--hub-address", default=_env("hub_address", d.hub_address),
                   help="ZeroMQ endpoint of the agent's block hub (the connector connects to it)")
    v.add_argument("--model", default=_env("model", None), help="model folder or served model name")
    v.add_argument("--model-preset", default=_env("model_preset", None), choices=["tiny", "m152"],
                   help="build (or reuse) a random-weight Llama preset and serve it")
    v.add_argument("--vllm-port", type=int, default=int(_env("vllm_port", d.vllm_port)), help="0 = any free port")
    v.add_argument("--kv-cache-gib", type=int, default=int(_env("kv_cache_gib", d.kv_cache_gib)))
    v.add_argument("--omp-bind", default=_env("omp_bind", d.omp_bind), help="VLLM_CPU_OMP_THREADS_BIND")
    v.add_argument("--block-size", type=int, default=int(_env("block_size", d.block_size)))
    v.add_argument("--max-model-len", type=int, default=int(_env("max_model_len", d.max_model_len)))
    v.add_argument("--max-num-seqs", type=int, default=int(_env("max_num_seqs", d.max_num_seqs)))
    v.add_argument("--dtype", default=_env("dtype", d.dtype))
    v.add_argument("--min-step-ms", type=float, default=float(_env("min_step_ms", d.min_step_ms)),
                   help="emulated minimum engine step of the launched vLLM (0 = off): paces a tiny "
                        "test model like a real one (e.g. 28 ms: Qwen3-32B on one H200)")
    v.add_argument("--vllm-ready-timeout-s", type=float, default=float(_env("vllm_ready_timeout_s", d.vllm_ready_timeout_s)))
    v.add_argument("--vllm-log", default=_env("vllm_log", None),
                   help="file for the launched vLLM's stdout/stderr (default: .cache/logs/vllm-PORT.log)")
    v.add_argument("--tokenizer", default=_env("tokenizer", None),
                   help="tokenizer folder for text prompts/outputs (default: the model's, if it has one)")
    m = p.add_argument_group("migration")
    m.add_argument("--peer-rate-mbps", type=float, default=float(_env("peer_rate_mbps", d.peer_rate_mbps)),
                   help="token-bucket limit on the outgoing block stream, Mbit/s (0 = unlimited)")
    m.add_argument("--scheme", default=_env("scheme", d.scheme),
                   help="default recovery scheme: pallas, full-copy, recomputation, ctho, detour, no-rc, no-sm")
    m.add_argument("--telemetry-period-ms", type=int, default=int(_env("telemetry_period_ms", d.telemetry_period_ms)))
    m.add_argument("--probe-prefill-tokens", type=int, default=int(_env("probe_prefill_tokens", d.probe_prefill_tokens)),
                   help="measure r_p at start with one prefill of this many tokens (0 = off)")
    m.add_argument("--resume-wait-s", type=float, default=float(_env("resume_wait_s", d.resume_wait_s)))
    m.add_argument("--session-ttl-s", type=float, default=float(_env("session_ttl_s", d.session_ttl_s)),
                   help="forget finished / handed-over sessions after this long")
    o = p.add_argument_group("logging")
    o.add_argument("--log-level", default=_env("log_level", d.log_level))
    o.add_argument("--log-format", default=_env("log_format", d.log_format), choices=["json", "console"])
    return p


def parse_args(argv: list[str] | None = None) -> AgentConfig:
    """Parse flags (and ``PALLAS_*`` environment) into an :class:`AgentConfig`.

    Raises:
        SystemExit: bad flags (argparse prints why).
    """
    p = build_parser()
    a = p.parse_args(argv)
    try:
        scheme_value(a.scheme)
        fronts = _parse_fronts(a.peer_front)
    except (ValueError, argparse.ArgumentTypeError) as e:
        p.error(str(e))
    if not a.vllm_url and not (a.model or a.model_preset):
        p.error("give --model or --model-preset (to launch vLLM), or --vllm-url")
    if a.peer_rate_mbps < 0:
        p.error("--peer-rate-mbps must be >= 0")
    if a.min_step_ms < 0:
        p.error("--min-step-ms must be >= 0")
    return AgentConfig(
        agent_id=a.agent_id, host=a.host, advertise_host=a.advertise_host, control_port=a.control_port,
        peer_port=a.peer_port, front_port=a.front_port, metrics_port=a.metrics_port, vllm_url=a.vllm_url,
        hub_address=a.hub_address, model=a.model, model_preset=a.model_preset, vllm_port=a.vllm_port,
        kv_cache_gib=a.kv_cache_gib, omp_bind=a.omp_bind, block_size=a.block_size,
        max_model_len=a.max_model_len, max_num_seqs=a.max_num_seqs, dtype=a.dtype,
        min_step_ms=a.min_step_ms,
        vllm_ready_timeout_s=a.vllm_ready_timeout_s, vllm_log=a.vllm_log, peer_rate_mbps=a.peer_rate_mbps,
        scheme=a.scheme, peer_fronts=fronts, front_operator_token_file=a.front_operator_token_file,
        front_max_body_bytes=a.front_max_body_bytes, telemetry_period_ms=a.telemetry_period_ms,
        probe_prefill_tokens=a.probe_prefill_tokens, resume_wait_s=a.resume_wait_s,
        session_ttl_s=a.session_ttl_s, tokenizer=a.tokenizer, log_level=a.log_level,
        log_format=a.log_format)


def load_tokenizer(path: str | None):
    """A transformers tokenizer from ``path`` if it has one, else None (token ids only)."""
    if not path or not os.path.isdir(path):
        return None
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not any(os.path.exists(os.path.join(path, n)) for n in names):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class AgentApp:
    """Composition root of one agent: builds, starts and stops every part.

    Usage: ``app = AgentApp(cfg); await app.start(); ...; await app.stop()``, or
    ``await app.run()`` until SIGINT/SIGTERM.
    """

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.log = get_logger("pallas.agent.main", agent=cfg.agent_id)
        self.core: Any = None
        self.control: Any = None
        self.runner: SchemeRunner | None = None
        self.front: Any = None
        self.scraper: Any = None
        self.grpc_control: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
        self._uvicorn: list[Any] = []
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ parts
    def _rates(self, session_id: str, target: Any) -> Rates:
        """Rates for the ctHO split at a commit (model.md section 6)."""
        core = self.core
        s = core.sessions.get(session_id)
        ident = core.identity()
        if s is None or ident is None or not ident.kv_bytes_per_token:
            raise LookupError("session or model identity unknown")
        r_p = (self.scraper.prefill_rate.value if self.scraper else None) or 0.0
        if r_p <= 0:
            raise LookupError("prefill rate not measured yet")
        goodput = core.peer_goodput(target) or self.cfg.peer_rate_bytes_per_s or float("inf")
        return Rates(k_tokens=s.num_tokens, r_p=r_p, s_kv=float(ident.kv_bytes_per_token),
                     goodput=goodput, block_size=int(ident.block_size or self.cfg.block_size))

    async def _probe_prefill(self) -> None:
        """Measure r_p once at start: a prefill of ``probe_prefill_tokens`` distinct tokens."""
        n = self.cfg.probe_prefill_tokens
        if n <= 0 or self.scraper is None:
            return
        ids = [3 + (i * 7919 + int(time.time())) % 997 for i in range(n)]  # fresh ids: no cache hit
        t0 = time.perf_counter()
        try:
            await self.core.engine.prefill(ids)
        except Exception as e:  # noqa: BLE001 - a failed probe leaves r_p unmeasured
            self.log.warning("prefill_probe_failed", error=repr(e))
            return
        dt = time.perf_counter() - t0
        self.scraper.observe_prefill(n, dt)
        self.log.info("prefill_probe", tokens=n, seconds=round(dt, 4), prefill_rate=round(n / dt, 1))

    async def _janitor(self) -> None:
        """Forget sessions that ended here more than ``session_ttl_s`` ago."""
        ttl = self.cfg.session_ttl_s
        while True:
            await asyncio.sleep(min(30.0, max(1.0, ttl / 4)))
            now = time.time()
            for s in list(self.core.sessions):
                if not s.done:
                    continue
                last = s.token_times[-1] if s.token_times else s.info.get("ended_at", now)
                s.info.setdefault("ended_at", now)
                if now - max(last, s.info["ended_at"]) > ttl:
                    self.core.sessions.pop(s.session_id)
                    self.runner.forget(s.session_id)
                    if self.control is not None:
                        self.control.ledger.forget(s.session_id)

    async def _observe(self) -> None:
        """Record the target-side handover gap of resumed sessions (``pallas_sit_seconds``)."""
        while True:
            await asyncio.sleep(0.1)
            observe_resumed(list(self.core.sessions))

    async def start(self) -> None:
        """Start vLLM (if launching), the core, the gRPC services, the front and telemetry."""
        import uvicorn

        from agent.control import ControlService, add_control_service
        from agent.core import build_core
        from agent.frontend import SessionFront, model_limits
        from agent.telemetry import TelemetryCollector, VllmScraper

        cfg = self.cfg
        self.core = await build_core(cfg, self.log)
        core = self.core
        def carried(sid: str):
            s = core.sessions.get(sid)
            return s.info.get("scheme") if s is not None else None

        self.runner = SchemeRunner(core.migrator, default_scheme=cfg.scheme, rates=self._rates,
                                   carried_scheme=carried,
                                   detour=lambda sid, tgt: self.log.info(
                                       "detour", session=sid, peer=getattr(tgt, "agent_id", str(tgt))))
        self.scraper = VllmScraper(core.vllm_url, period_s=1.0)
        self.scraper.start()
        BYTES_MOVED.fn = core.bytes_moved
        KV_BLOCKS_HELD.fn = lambda: [((), core.blocks_held())]

        collector = TelemetryCollector(cfg.agent_id, lambda: list(core.sessions), scraper=self.scraper,
                                       identity=core.identity, peers=core.peer_stats,
                                       kv_blocks=getattr(core, "kv_blocks", None))
        self.control = ControlService(
            self.runner, agent_id=cfg.agent_id,
            has_session=lambda sid: core.sessions.get(sid) is not None,
            session_state=lambda sid: getattr(getattr(core.sessions.get(sid), "state", ""), "value", ""),
            telemetry=collector.report, default_period_s=cfg.telemetry_period_ms / 1000.0)

        self.grpc_control = grpc.aio.server()
        add_control_service(self.grpc_control, self.control)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc_control)
        self.grpc_control.add_insecure_port(f"{cfg.host}:{cfg.control_port}")
        await self.grpc_control.start()

        tok = load_tokenizer(cfg.tokenizer or core.model_path)
        vocab, max_len = await asyncio.to_thread(model_limits, core.model_path, core.vllm_url)
        operator = os.environ.get("PALLAS_FRONT_OPERATOR_TOKEN")
        if cfg.front_operator_token_file:
            with open(cfg.front_operator_token_file) as fh:
                operator = fh.read().strip()
        self.front = SessionFront(core.sessions, core.engine, agent_id=cfg.agent_id, tokenizer=tok,
                                  on_open=lambda s, sch: self.runner.set_session_scheme(s.session_id, sch),
                                  directory=cfg.peer_fronts, resume_wait_s=cfg.resume_wait_s,
                                  scheme_of=lambda sid: self.runner.scheme_for(sid), vocab_size=vocab,
                                  max_model_len=max_len, operator_token=operator,
                                  max_body_bytes=cfg.front_max_body_bytes)
        ports = [cfg.front_port] + ([cfg.metrics_port] if cfg.metrics_port else [])
        for port in ports:
            srv = uvicorn.Server(uvicorn.Config(self.front.app, host=cfg.host, port=port, log_level="warning",
                                                access_log=False, lifespan="off"))
            self._uvicorn.append(srv)
            self._tasks.append(asyncio.create_task(srv.serve(), name=f"http-{port}"))
        while not all(s.started for s in self._uvicorn):
            for t in self._tasks:
                if t.done():
                    t.result()  # raises the bind error
            await asyncio.sleep(0.02)
        await self._probe_prefill()
        self._tasks.append(asyncio.create_task(self._janitor(), name="janitor"))
        self._tasks.append(asyncio.create_task(self._observe(), name="observe-resumes"))
        for svc in ("", CONTROL_SERVICE):
            await _set_health(self.health, svc, True)
        self.log.info("agent_ready", control_port=cfg.control_port, peer_port=cfg.peer_port,
                      front_port=cfg.front_port, vllm_url=core.vllm_url, scheme=scheme_name(scheme_value(cfg.scheme)),
                      peer_rate_mbps=cfg.peer_rate_mbps)

    async def stop(self) -> None:
        """Stop everything this agent started (vLLM too, if it launched it)."""
        for svc in ("", CONTROL_SERVICE):
            with contextlib.suppress(Exception):
                await _set_health(self.health, svc, False)
        for srv in self._uvicorn:
            srv.should_exit = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(t, 5)
        if self.grpc_control is not None:
            await self.grpc_control.stop(1.0)
        if self.scraper is not None:
            await self.scraper.stop()
        if self.front is not None:
            await self.front.aclose()
        if self.core is not None:
            await self.core.close()
        self.log.info("agent_stopped")

    async def run(self) -> None:
        """Start, serve until SIGINT/SIGTERM, stop."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        try:
            await self.start()
            await stop.wait()
        finally:
            await self.stop()


async def _set_health(h: Any, service: str, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    r = h.set(service, status)
    if asyncio.iscoroutine(r):
        await r


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``pallas-agent``; returns the exit status."""
    cfg = parse_args(argv)
    configure_logging(cfg.log_level, json=cfg.log_format == "json")
    # Block-sized buffers stay in the heap (halves the sender's CPU per block, agent/wire.py).
    get_logger("pallas.agent.main").info("malloc_tuned", ok=tune_malloc_for_blocks())
    try:
        asyncio.run(AgentApp(cfg).run())
    except KeyboardInterrupt:
        pass
    except Exception as e:  # noqa: BLE001 - report and exit non-zero
        get_logger("pallas.agent.main").exception("agent_failed", error=repr(e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

