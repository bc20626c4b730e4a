"""``pallas-agent``: the sidecar beside one vLLM server, and its one composition root.

:class:`AgentConfig` holds every setting; each field is one flag ``--<field-with-dashes>`` and
one environment variable ``PALLAS_<FIELD>`` (the flag wins), both derived from the field's name
in :func:`build_parser`. :class:`Agent` builds and owns every part of one process: what they are,
the links' security (issue 16) and an example: docs/architecture.md §6. Logs are JSON lines on
stderr (structlog).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shlex
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from pallas_proto import pallas_pb2

from agent.ipc import BlockHub
from agent.migration import MigrationConfig, MigrationEngine
from agent.obs import BYTES_MOVED, KV_BLOCKS_HELD, configure_logging, get_logger, observe_resumed
from agent.session import SessionStore, VllmClient
from agent.transfer import PeerClient, PeerPool, serve_peer_transfer
from agent.wire import tune_malloc_for_blocks
from pallas_common.msglimits import (DEFAULT_MAX_BLOCK_BYTES, DEFAULT_MAX_TOKENS, RpcLimits,
                                     control_limits, peer_limits)
from pallas_common.schemes import scheme_name, scheme_value
from pallas_common.tls import ANY_IDENTITY, LinkSecurity, TlsError, open_channel

__all__ = ["AgentConfig", "build_parser", "parse_args", "Agent", "link_security", "model_path_error", "main"]

CONTROL_SERVICE = "pallas.v1.Control"
PEER_SERVICE = pallas_pb2.DESCRIPTOR.services_by_name["PeerTransfer"].full_name
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


def _f(default: Any, help: str, group: str = "migration", **kw: Any) -> Any:
    """A config field with its flag's help text and group (see :func:`build_parser`)."""
    meta = {"help": help, "group": group, **kw}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class AgentConfig:
    """Every setting of one agent (flags and ``PALLAS_*`` environment).

    Units: seconds (``*_s``), milliseconds (``*_ms``), Mbit/s (``peer_rate_mbps``, converted
    once to bytes/s), GiB (``kv_cache_gib``, fractions allowed), bytes (``*_bytes``).
    """

    agent_id: str = _f(socket.gethostname(), "this agent's id (gNB / edge server)", "endpoints")
    host: str = _f("0.0.0.0", "bind address of every endpoint", "endpoints")
    advertise_host: str = _f("127.0.0.1", "host other agents and UEs use to reach this agent",
                             "endpoints")
    control_port: int = _f(50051, "xApp-facing Control gRPC + health", "endpoints")
    peer_port: int = _f(50052, "PeerTransfer gRPC (agent to agent)", "endpoints")
    front_port: int = _f(8080, "UE session front (HTTP) and /metrics", "endpoints")
    metrics_port: int = _f(0, "extra Prometheus port (0 = only the front's /metrics)", "endpoints")
    peer_front: dict[str, str] = _f({}, "another agent's front URL, ID=URL (repeatable or "
                                    "comma-separated)", "endpoints", metavar="ID=URL")
    vllm_url: str = _f("", "use this running vLLM server (started with the Pallas connector) "
                       "instead of launching one", "vLLM")
    hub_address: str = _f("tcp://127.0.0.1:0", "ZeroMQ endpoint of the agent's block hub (the "
                          "connector connects to it)", "vLLM")
    model: str = _f("", "model folder (or a hub-style name vLLM resolves); also the served model "
                    "name unless --served-model-name", "vLLM")
    served_model_name: str = _f("", "the name vLLM serves the model under (its "
                                "--served-model-name; default: --model)", "vLLM")
    vllm_port: int = _f(0, "port of the launched vLLM (0 = any free port)", "vLLM")
    kv_cache_gib: float = _f(1.0, "KV cache of the launched vLLM, GiB (fractions allowed)", "vLLM")
    omp_bind: str = _f("auto", "VLLM_CPU_OMP_THREADS_BIND of the launched vLLM", "vLLM")
    block_size: int = _f(32, "tokens per KV block", "vLLM")
    max_model_len: int = _f(4096, "vLLM --max-model-len", "vLLM")
    max_num_seqs: int = _f(8, "vLLM --max-num-seqs", "vLLM")
    dtype: str = _f("float32", "vLLM --dtype", "vLLM")
    kv_connector_module: str = _f("agent.connector", "module vLLM loads the KV connector from "
                                  "(kv_connector_module_path)", "vLLM")
    kv_connector_class: str = _f("PallasConnector", "KV connector class name", "vLLM")
    kv_connector_extra: dict[str, Any] = _f({}, "JSON object merged into the connector's "
                                            "kv_connector_extra_config", "vLLM")
    vllm_args: str = _f("", "more `vllm serve` arguments (one string, shell-split), e.g. "
                        "'--num-gpu-blocks-override 64'", "vLLM")
    vllm_ready_timeout_s: float = _f(600.0, "how long vLLM and its connector may take to start",
                                     "vLLM")
    vllm_log: str = _f("", "file for the launched vLLM's output (default .cache/logs/vllm-PORT.log)",
                       "vLLM")
    tokenizer: str = _f("", "tokenizer folder for text prompts/outputs (default: the model's)",
                        "vLLM")
    peer_rate_mbps: float = _f(0.0, "token-bucket limit on the outgoing block stream, Mbit/s "
                               "(0 = unlimited)")
    scheme: str = _f("pallas", "default recovery scheme: pallas, pallas-bridge, full-copy, "
                     "recomputation, ctho, detour, no-rc, no-sm (full_copy etc. accepted too)")
    front_operator_token_file: str = _f("", "file holding the operator credential that lists "
                                        "sessions at the front (also PALLAS_FRONT_OPERATOR_TOKEN); "
                                        "unset: listing refused", "endpoints")
    front_max_body_bytes: int = _f(1 << 20, "cap on an HTTP request body at the front (413 past it)",
                                   "endpoints")
    telemetry_period_ms: int = _f(100, "default Telemetry period")
    probe_prefill_tokens: int = _f(256, "measure r_p at start with one prefill of this many "
                                   "tokens (0 = off)")
    resume_wait_s: float = _f(30.0, "how long the front waits for a session to resume here")
    session_ttl_s: float = _f(600.0, "forget finished / handed-over sessions after this long")
    rpc_timeout_s: float = _f(10.0, "deadline of Prepare/Release calls to a peer")
    commit_deadline_s: float = _f(10.0, "the longest a commit may freeze the session at the "
                                  "source (block wait + Sync); past it the source serves on")
    bridge_max_s: float = _f(8.0, "pallas-bridge: the longest the source decodes on through the "
                             "new agent's front before it hands over whatever the target holds")
    warmup_timeout_s: float = _f(60.0, "target: longest Sync waits for the prefix warm-up "
                                 "(the source's commit-time choice usually bounds it first)")
    resume_deadline_s: float = _f(5.0, "target: how long a resumed request waits for blocks "
                                  "still in flight before vLLM recomputes what is missing")
    lease_s: float = _f(10.0, "target: the KV lease of a prepared migration; released when its "
                        "source renews nothing for this long (the source renews every third)")
    max_inbound_session_bytes: int = _f(1 << 30, "target: KV bytes one incoming migration may "
                                        "buffer")
    max_inbound_bytes: int = _f(4 << 30, "target: KV bytes all incoming migrations may buffer")
    max_block_bytes: int = _f(DEFAULT_MAX_BLOCK_BYTES, "largest KV block (all layers) the peer "
                              "server's transport takes; each PeerTransfer RPC is then bounded by "
                              "the engine's own block size (pallas_common.msglimits)")
    relay_hop_s: float = _f(0.005, "expected one-way relay delay of Detour (commit-time choice)")
    insecure: bool = _f(False, "plaintext gRPC on every link, no authorisation (tests, the local "
                        "replay); without it the agent needs PALLAS_TLS_CERT/KEY/CA", "security")
    xapp_identity: str = _f("pallas-xapp", "the identity (certificate CN or SAN) allowed to call "
                            "Control", "security")
    peer_identity: list[str] = _f([], "another directory agent's identity allowed on PeerTransfer "
                                  "and as a migration target, besides the ids of --peer-front "
                                  "(repeatable or comma-separated)", "security", metavar="ID")
    log_level: str = _f("INFO", "log level", "logging")
    log_format: str = _f("json", "log format", "logging", choices=["json", "console"])

    @property
    def directory(self) -> frozenset[str]:
        """The directory's agents (ids of ``peer_front`` and ``peer_identity``): who may call
        PeerTransfer here and whom a Trigger or Commit may name as target."""
        return frozenset(self.peer_front) | frozenset(self.peer_identity)

    def migration(self) -> MigrationConfig:
        """The migration engine's knobs: every :class:`MigrationConfig` field of the same name,
        the link limit (``peer_rate_mbps``, 0 = None) and the default scheme."""
        same = {f.name for f in dataclasses.fields(MigrationConfig)} & set(vars(self))
        return MigrationConfig(**{k: getattr(self, k) for k in same},
                               link_rate_mbps=self.peer_rate_mbps or None,
                               default_scheme=scheme_value(self.scheme))


def _split(items: list[str]) -> list[str]:
    """The parts of repeated, comma-separated flag values, stripped, empty ones left out."""
    return [p.strip() for item in items for p in item.split(",") if p.strip()]


def _parse_fronts(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in _split(items):
        if "=" not in part:
            raise argparse.ArgumentTypeError(f"--peer-front wants AGENT_ID=URL, got {part!r}")
        k, v = part.split("=", 1)
        out[k.strip()] = v.strip().rstrip("/")
    return out


def _truthy(text: str) -> bool:
    v = text.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _json_object(text: str) -> dict[str, Any]:
    obj = json.loads(text) if text else {}
    if not isinstance(obj, dict):
        raise ValueError("--kv-connector-extra must be a JSON object")
    return obj


def build_parser() -> argparse.ArgumentParser:
    """The ``pallas-agent`` parser: one flag per :class:`AgentConfig` field, its default read
    from ``PALLAS_<FIELD>`` when set."""
    p = argparse.ArgumentParser(prog="pallas-agent", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    groups: dict[str, Any] = {}
    for f in dataclasses.fields(AgentConfig):
        m = f.metadata
        g = groups.get(m["group"]) or groups.setdefault(m["group"], p.add_argument_group(m["group"]))
        env = os.environ.get("PALLAS_" + f.name.upper())
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if f.name in ("peer_front", "peer_identity"):
            g.add_argument(flag, action="append", default=[env] if env else [],
                           metavar=m.get("metavar"), help=m["help"])
            continue
        if isinstance(default, bool):
            try:
                on = _truthy(env) if env is not None else default
            except ValueError as e:
                p.error(f"PALLAS_{f.name.upper()}: {e}")
            g.add_argument(flag, action="store_true", default=on, help=m["help"])
            continue
        typ = {int: int, float: float}.get(type(default), str)
        if isinstance(default, dict):
            default = env if env is not None else ""
        elif env is not None:
            default = env
        g.add_argument(flag, type=typ, default=default, choices=m.get("choices"), help=m["help"])
    return p


def parse_args(argv: list[str] | None = None) -> AgentConfig:
    """Parse flags (and ``PALLAS_*`` environment) into an :class:`AgentConfig`.

    Raises:
        SystemExit: bad flags (argparse prints why).
    """
    p = build_parser()
    a = vars(p.parse_args(argv))
    try:
        scheme_value(a["scheme"])
        a["peer_front"] = _parse_fronts(a["peer_front"])
        a["peer_identity"] = list(dict.fromkeys(_split(a["peer_identity"])))  # once each
        a["kv_connector_extra"] = _json_object(a["kv_connector_extra"])
        vargs = shlex.split(a["vllm_args"])
    except (ValueError, argparse.ArgumentTypeError) as e:
        p.error(str(e))
    if not a["vllm_url"] and not a["model"]:
        p.error("give --model (to launch vLLM) or --vllm-url")
    for k in ("peer_rate_mbps", "kv_cache_gib"):
        if a[k] < 0:
            p.error(f"--{k.replace('_', '-')} must be >= 0")
    for k in ("rpc_timeout_s", "commit_deadline_s", "warmup_timeout_s", "resume_deadline_s",
              "lease_s", "bridge_max_s"):
        if a[k] <= 0:
            p.error(f"--{k.replace('_', '-')} must be > 0")
    tp = tp_size_of(vargs)
    if tp > 1:
        p.error(f"--vllm-args asks for tensor parallelism {tp}: Pallas moves one KV copy per "
                "block and cannot migrate a sharded cache; run vLLM with TP = 1")
    return AgentConfig(**a)


def tp_size_of(vllm_args: list[str]) -> int:
    """The tensor-parallel size a ``vllm serve`` argument list asks for (1 if none)."""
    for i, x in enumerate(vllm_args):
        for flag in ("--tensor-parallel-size", "-tp"):
            if x == flag and i + 1 < len(vllm_args):
                return int(vllm_args[i + 1])
            if x.startswith(flag + "="):
                return int(x.split("=", 1)[1])
    return 1


def link_security(cfg: AgentConfig, environ: dict[str, str] | None = None) -> LinkSecurity:
    """The agent's choice for its gRPC links (issue 16): mutual TLS from ``PALLAS_TLS_CERT``,
    ``PALLAS_TLS_KEY``, ``PALLAS_TLS_CA`` (files read and checked now), or plaintext with
    ``cfg.insecure``.

    Raises:
        TlsError: neither (the message names both options), both, only some of the three
            variables, or files that cannot be used. The agent never falls back to plaintext.
    """
    try:
        return LinkSecurity.from_env(insecure=cfg.insecure, environ=environ)
    except TlsError as e:
        raise TlsError(f"{e}. The agent serves mutual TLS from PALLAS_TLS_CERT, PALLAS_TLS_KEY and "
                       "PALLAS_TLS_CA (the chart's tls.* values set them); plaintext only with "
                       "--insecure (PALLAS_INSECURE=1)") from None


class PinnedPeerPool(PeerPool):
    """A :class:`agent.transfer.PeerPool` whose TLS channels check that the peer's server
    certificate names the endpoint's agent id (``grpc.ssl_target_name_override``), not the
    dialled host: the address in a Trigger/Commit comes from the caller, so a directory agent's id
    with another address reaches nobody without that agent's certificate (issue 16).
    """

    def __init__(self, security: LinkSecurity, **kw: Any) -> None:
        super().__init__(**kw)
        self.security = security

    def _factory(self, endpoint: pallas_pb2.PeerEndpoint) -> Any:
        watcher, name = self.security.watcher, endpoint.agent_id or None
        return lambda address, options: open_channel(address, watcher, aio=True, options=options,
                                                     server_name=name)


def check_load_failure_policy(hello: Any, vllm_url: str) -> None:
    """Refuse a vLLM whose connector reports a KV load-failure policy other than "recompute"
    (under vLLM's default ``"fail"`` a block that fails to load at a resume fails the request;
    docs/vllm.md §5, issue 25).

    Raises:
        RuntimeError: the policy is "fail" or not reported (a connector older than this check),
            naming the fix.
    """
    policy = getattr(hello, "load_failure_policy", "") if hello is not None else ""
    if policy == "recompute":
        return
    said = f"kv_load_failure_policy={policy!r}" if policy else "no kv_load_failure_policy report"
    raise RuntimeError(
        f"vLLM at {vllm_url} runs with {said}: a KV block that fails to load at a resume "
        "would fail the user's request instead of being recomputed. Start it with "
        "\"kv_load_failure_policy\": \"recompute\" in --kv-transfer-config (the agent does "
        "when it launches vLLM itself)")


def model_path_error(model: str) -> str | None:
    """Why ``--model`` cannot be what vLLM loads, or None; checked at start so that a typo is
    named at once instead of after ``--vllm-ready-timeout-s`` of waiting for vLLM.

    An existing folder must hold ``config.json`` (a Hugging Face model folder); an existing file
    (e.g. GGUF) passes. A name that does not exist passes only when it reads as a hub id
    (``name`` or ``org/name``, which vLLM resolves itself); anything path-like (absolute,
    ``./``, ``../``, ``~``, or more than one ``/``) that does not exist is refused.
    """
    if not model:
        return None
    p = os.path.expanduser(model)
    if os.path.isdir(p):
        if os.path.exists(os.path.join(p, "config.json")):
            return None
        return f"model folder {model!r} has no config.json (not a Hugging Face model folder)"
    if os.path.exists(p):
        return None
    if model.startswith(("/", "./", "../", "~", ".")) or model.count("/") > 1:
        return f"model path {model!r} does not exist"
    return None


def load_tokenizer(path: str | None):
    """A transformers tokenizer from ``path`` if it has one, else None (token ids only)."""
    if not path or not os.path.isdir(path):
        return None
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not any(os.path.exists(os.path.join(path, n)) for n in names):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class Agent:
    """One agent process: builds, starts and stops every part (the composition root).

    Usage: ``agent = Agent(cfg); await agent.start(); ...; await agent.stop()`` or
    ``await agent.run()`` until SIGINT/SIGTERM. Tests and benchmarks that run vLLM themselves
    use the parts: ``await agent.start_core()`` (hub, engine, peer gRPC), start vLLM with
    ``agent_address=agent.hub.address``, then ``await agent.attach(url)``.

    ``security``: the links' TLS choice (default :func:`link_security` of ``cfg``, from the
    environment; raises TlsError as it does). With TLS the directory is enforced even when empty
    (every peer and target refused: fail closed); with ``--insecure`` only when it is not empty.
    """

    def __init__(self, cfg: AgentConfig, security: LinkSecurity | None = None) -> None:
        self.cfg = cfg
        self.security = security or link_security(cfg)
        tls = self.security.watcher is not None
        self.directory: frozenset[str] | None = (cfg.directory if tls or cfg.directory
                                                 else None)
        self.log = get_logger("pallas.agent", agent=cfg.agent_id)
        self.hub = BlockHub(cfg.hub_address)
        self.sessions = SessionStore()
        self.vllm_client = VllmClient("http://127.0.0.1:1", cfg.model)  # pointed at vLLM by attach()
        self.migration: MigrationEngine | None = None
        self.peer_server: grpc.aio.Server | None = None
        self.peer_address = ""
        self.vllm: Any = None
        self.vllm_url = ""
        self.control: Any = None
        self.front: Any = None
        self.scraper: Any = None
        self.grpc_control: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()
        self._identity: pallas_pb2.ModelIdentity | None = None
        self._digest = ""
        self._uvicorn: list[Any] = []
        self._tasks: list[asyncio.Task] = []
        self._stopped = False
        self.max_tokens = cfg.max_model_len   # the engine's context length, once it is known
        self._cap_tokens = max(cfg.max_model_len, DEFAULT_MAX_TOKENS)
        self._peer_cap = peer_limits(cfg.max_block_bytes, self._cap_tokens)

    @property
    def endpoint(self) -> pallas_pb2.PeerEndpoint:
        """Where peers reach this agent."""
        return pallas_pb2.PeerEndpoint(agent_id=self.cfg.agent_id, address=self.peer_address)

    def peer_limits(self) -> RpcLimits:
        """PeerTransfer's per-RPC message limits (pallas_common.msglimits): from the engine's
        block bytes and the context length once the connector reported them, else from
        ``--max-block-bytes`` (the peer server's transport bound, which they never exceed)."""
        ident = self._identity_or_none()
        if ident is None or not ident.block_bytes:
            return self._peer_cap
        if ident.block_bytes > self.cfg.max_block_bytes:
            self.log.error("block_over_max_block_bytes", block_bytes=ident.block_bytes,
                           max_block_bytes=self.cfg.max_block_bytes)
        return peer_limits(min(int(ident.block_bytes), self.cfg.max_block_bytes), self.max_tokens)

    def identity(self) -> pallas_pb2.ModelIdentity:
        """This server's ModelIdentity (from the connector's hello and the weights digest).

        Raises:
            RuntimeError: the connector has not said hello yet.
        """
        if self._identity is not None:
            return self._identity
        w, sch = self.hub.worker_info, self.hub.sched_info
        if w is None or sch is None:
            raise RuntimeError("the vLLM connector has not connected yet")
        bs = sch.block_size or w.block_size
        self._identity = pallas_pb2.ModelIdentity(
            model=os.path.basename(os.path.normpath(self.cfg.model)),
            weights_digest=self._digest, dtype=w.model_dtype or w.dtype,
            kv_cache_dtype=w.kv_cache_dtype, block_size=bs, backend=w.backend,
            kv_bytes_per_token=w.block_bytes // bs, num_layers=w.num_layers,
            block_bytes=w.block_bytes)
        return self._identity

    # ------------------------------------------------------------------ parts
    async def start_core(self, peer_listen: str | None = None) -> None:
        """Bind the connector channel and start the migration engine's peer gRPC server."""
        from agent.weights import weights_digest

        cfg = self.cfg
        loop = asyncio.get_running_loop()
        await self.hub.start()
        self._digest = await loop.run_in_executor(None, weights_digest, cfg.model)
        mcfg, sec = cfg.migration(), self.security
        pool_kw = {"link_rate_mbps": mcfg.link_rate_mbps, "timeout_s": mcfg.rpc_timeout_s,
                   "limits": self.peer_limits}
        peers = PinnedPeerPool(sec, **pool_kw) if sec.watcher is not None else PeerPool(**pool_kw)
        self.migration = MigrationEngine(agent_id=cfg.agent_id, peer_address="",
                                         sessions=self.sessions, vllm_client=self.vllm_client, hub=self.hub,
                                         identity=self.identity, config=mcfg, peers=peers)
        listen = peer_listen or f"{cfg.host}:{cfg.peer_port}"
        self.peer_server, bound = await serve_peer_transfer(
            self.migration.target, listen, credentials=sec.server_credentials(),
            interceptors=tuple(sec.interceptors({PEER_SERVICE: self.directory or ()})),
            limits=self.peer_limits, transport=self._peer_cap)
        self.peer_address = f"{cfg.advertise_host}:{bound.rsplit(':', 1)[1]}"
        self.migration.ctx.peer_address = self.peer_address

    async def attach(self, vllm_url: str, timeout_s: float | None = None) -> None:
        """Point the engine client at the local vLLM and wait for it and its connector.

        Raises:
            TimeoutError: not ready within ``timeout_s`` (default ``vllm_ready_timeout_s``).
            RuntimeError: the launched vLLM exited, it runs with tensor parallelism > 1, or
                without ``kv_load_failure_policy=recompute`` (:func:`check_load_failure_policy`).
        """
        assert self.migration is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout_s or self.cfg.vllm_ready_timeout_s)
        self.vllm_url = vllm_url.rstrip("/")
        await self.vllm_client.close()
        self.vllm_client = self.migration.ctx.vllm_client = VllmClient(
            self.vllm_url, self.cfg.served_model_name or self.cfg.model)
        while not (await self.vllm_client.health() and self.hub.ready):
            proc = getattr(self.vllm, "proc", None)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode}:\n{self.vllm.log_tail()}")
            if loop.time() > deadline:
                raise TimeoutError(f"vLLM at {vllm_url} or its connector not ready")
            await asyncio.sleep(0.5)
        tp = self.hub.worker_info.tp_size if self.hub.worker_info is not None else 1
        if tp > 1:
            raise RuntimeError(f"vLLM runs with tensor parallelism {tp}: Pallas moves one KV copy "
                               "per block and cannot migrate a sharded cache; run it with TP = 1")
        check_load_failure_policy(self.hub.sched_info, vllm_url)
        self.vllm_client.on_failed = self.migration.session_failed

    def _launch_vllm(self) -> str:
        """Launch vLLM with every :class:`agent.server.ServerConfig` field of the same name."""
        from agent.server import ServerConfig, VLLMServer

        cfg = self.cfg
        same = {f.name for f in dataclasses.fields(ServerConfig)} & set(vars(cfg))
        self.vllm = VLLMServer(ServerConfig(
            **{k: getattr(cfg, k) for k in same}, port=cfg.vllm_port,
            agent_address=self.hub.address, omp_threads_bind=cfg.omp_bind,
            extra_args=shlex.split(cfg.vllm_args) + (
                ["--served-model-name", cfg.served_model_name] if cfg.served_model_name else []),
            log_path=cfg.vllm_log or None))
        self.vllm.start()
        self.log.info("vllm_launched", vllm_url=self.vllm.base_url, pid=self.vllm.proc.pid,
                      log_path=self.vllm.log_path, hub=self.hub.address)
        return self.vllm.base_url

    async def _probe_prefill(self) -> None:
        """Measure r_p once at start: a prefill of ``probe_prefill_tokens`` distinct tokens."""
        n = self.cfg.probe_prefill_tokens
        if n <= 0 or self.scraper is None:
            return
        ids = [3 + (i * 7919 + int(time.time())) % 997 for i in range(n)]  # fresh ids: no cache hit
        t0 = time.perf_counter()
        try:
            await self.vllm_client.prefill(ids)
        except Exception as e:  # noqa: BLE001 - a failed probe leaves r_p unmeasured
            self.log.warning("prefill_probe_failed", error=repr(e))
            return
        dt = time.perf_counter() - t0
        self.scraper.observe_prefill(n, dt)
        self.log.info("prefill_probe", tokens=n, seconds=round(dt, 4), prefill_rate=round(n / dt, 1))

    async def _housekeeping(self) -> None:
        """Every 0.1 s: record resumed sessions' SIT and expire inbound migrations whose lease
        ran out; every few s: forget old sessions."""
        ttl, last = self.cfg.session_ttl_s, 0.0
        while True:
            await asyncio.sleep(0.1)
            observe_resumed(list(self.sessions))
            await self.migration.target.expire()
            now = time.time()
            if now - last < min(5.0, max(0.5, ttl / 4)):
                continue
            last = now
            for s in list(self.sessions):
                if s.done:
                    s.ended_at = s.ended_at or now
                    if now - max(s.token_times[-1] if s.token_times else 0.0, s.ended_at) > ttl:
                        self.sessions.pop(s.session_id)
                        self.migration.forget(s.session_id)

    async def start(self) -> None:
        """Start the core, vLLM (unless ``--vllm-url``), the gRPC services, front, telemetry."""
        from agent.control_service import ControlService, add_control_service
        from agent.meter import TelemetryCollector, VllmScraper

        cfg = self.cfg
        await self.start_core()
        try:
            await self.attach(cfg.vllm_url or self._launch_vllm())
        except BaseException:
            await self.stop()
            raise
        mig = self.migration
        self.scraper = VllmScraper(self.vllm_url, period_s=1.0)
        self.scraper.start()
        mig.ctx.prefill_rate = lambda: self.scraper.prefill_rate.value or 0.0
        mig.ctx.observe_prefill = lambda tokens, seconds: self.scraper.observe_prefill(tokens, seconds, warmup=True)
        BYTES_MOVED.fn = lambda: [((p.agent_id, "sent"), float(p.bytes_sent))
                                  for p in mig.ctx.peers.telemetry()]
        KV_BLOCKS_HELD.fn = lambda: [((), mig.held()["blocks"])]
        collector = TelemetryCollector(cfg.agent_id, lambda: list(self.sessions),
                                       scraper=self.scraper, identity=self._identity_or_none,
                                       peers=lambda: list(mig.ctx.peers.telemetry()),
                                       kv_blocks=self.hub.kv_blocks)
        self.control = ControlService(mig, agent_id=cfg.agent_id, telemetry=collector.report,
                                      default_period_s=cfg.telemetry_period_ms / 1000.0,
                                      directory=self.directory)
        sec = self.security
        self.grpc_control = grpc.aio.server(
            options=control_limits().server_options(), interceptors=sec.interceptors(
                {CONTROL_SERVICE: [cfg.xapp_identity], HEALTH_SERVICE: [ANY_IDENTITY]}))
        add_control_service(self.grpc_control, self.control)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc_control)
        sec.add_port(self.grpc_control, f"{cfg.host}:{cfg.control_port}")
        await self.grpc_control.start()
        await self._start_front()
        await self._probe_prefill()
        self._tasks.append(asyncio.create_task(self._housekeeping(), name="housekeeping"))
        for svc in ("", CONTROL_SERVICE):
            await self.health.set(svc, health_pb2.HealthCheckResponse.SERVING)
        self.log.info("agent_ready", control_port=cfg.control_port, peer=self.peer_address,
                      front_port=cfg.front_port, vllm_url=self.vllm_url,
                      tls=self.security.watcher is not None,
                      directory=sorted(self.directory) if self.directory is not None else None,
                      scheme=scheme_name(scheme_value(cfg.scheme)),
                      peer_rate_mbps=cfg.peer_rate_mbps)

    async def _start_front(self) -> None:
        """The UE session front (and ``--metrics-port``) on uvicorn, returning once they listen.

        Raises:
            RuntimeError: a port could not be bound (:func:`_serve_http`).
        """
        import uvicorn

        from agent.frontend import SessionFront, model_limits

        cfg, mig = self.cfg, self.migration
        tok = load_tokenizer(cfg.tokenizer or cfg.model)
        vocab, max_len = await asyncio.to_thread(model_limits, cfg.model, self.vllm_url)
        if max_len:   # token ids in Prepare/Sync: the context the engine really serves
            self.max_tokens = min(int(max_len), self._cap_tokens)
        operator = os.environ.get("PALLAS_FRONT_OPERATOR_TOKEN")
        if cfg.front_operator_token_file:
            with open(cfg.front_operator_token_file) as fh:
                operator = fh.read().strip()
        self.front = SessionFront(self.sessions, self.vllm_client, agent_id=cfg.agent_id, tokenizer=tok,
                                  on_open=lambda s, sch: mig.set_session_scheme(s.session_id, sch),
                                  directory=cfg.peer_front, resume_wait_s=cfg.resume_wait_s,
                                  scheme_of=mig.scheme_for, vocab_size=vocab, max_model_len=max_len,
                                  operator_token=operator, max_body_bytes=cfg.front_max_body_bytes)
        for port in [cfg.front_port] + ([cfg.metrics_port] if cfg.metrics_port else []):
            srv = uvicorn.Server(uvicorn.Config(self.front.app, host=cfg.host, port=port,
                                                log_level="warning", access_log=False,
                                                lifespan="off"))
            self._uvicorn.append(srv)
            self._tasks.append(asyncio.create_task(_serve_http(srv, port), name=f"http-{port}"))
        while not all(s.started for s in self._uvicorn):
            for t in self._tasks:
                if t.done():
                    t.result()  # raises the bind error
            await asyncio.sleep(0.02)

    def _identity_or_none(self) -> pallas_pb2.ModelIdentity | None:
        try:
            return self.identity()
        except RuntimeError:
            return None

    async def stop(self) -> None:
        """Stop everything this agent started (vLLM too, if it launched it); idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for svc in ("", CONTROL_SERVICE):
            with contextlib.suppress(Exception):
                await self.health.set(svc, health_pb2.HealthCheckResponse.NOT_SERVING)
        for srv in self._uvicorn:
            srv.should_exit = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(t, 5)
        if self.grpc_control is not None:
            await self.grpc_control.stop(1.0)
        if self.control is not None:
            await self.control.close()
        if self.scraper is not None:
            await self.scraper.stop()
        if self.front is not None:
            await self.front.aclose()
        if self.migration is not None:
            await self.migration.close()
        for s in list(self.sessions):
            if s._task is not None and not s._task.done():
                s._task.cancel()
        if self.peer_server is not None:
            await self.peer_server.stop(1.0)
        await self.vllm_client.close()
        await self.hub.close()
        if self.vllm is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.vllm.stop)
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


async def _serve_http(srv: Any, port: int) -> None:
    """``srv.serve()`` with uvicorn's startup failure (it calls ``sys.exit(3)`` when it cannot
    bind) turned into a RuntimeError: a SystemExit inside a task leaves the event loop at once,
    past the agent's clean-up, and the vLLM server it had launched was left running."""
    try:
        await srv.serve()
    except SystemExit as e:
        raise RuntimeError(f"the HTTP server on port {port} did not start (uvicorn exit {e.code}; "
                           "the port is probably in use)") from None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``pallas-agent``; returns the exit status."""
    cfg = parse_args(argv)
    configure_logging(cfg.log_level, json=cfg.log_format == "json")
    # Block-sized buffers stay in the heap (halves the sender's CPU per block, agent/wire.py).
    get_logger("pallas.agent").info("malloc_tuned", ok=tune_malloc_for_blocks())
    try:
        security = link_security(cfg)
    except TlsError as e:
        print(f"pallas-agent: error: {e}", file=sys.stderr)
        return 2
    bad_model = model_path_error(cfg.model)
    if bad_model:
        print(f"pallas-agent: error: --model: {bad_model}", file=sys.stderr)
        return 2
    agent = Agent(cfg, security)
    try:
        asyncio.run(agent.run())
    except KeyboardInterrupt:
        pass
    except Exception as e:  # noqa: BLE001 - report and exit non-zero
        get_logger("pallas.agent").exception("agent_failed", error=repr(e))
        return 1
    finally:
        if agent.vllm is not None:  # whatever ended the loop, never leave the launched vLLM behind
            agent.vllm.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
