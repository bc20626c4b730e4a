"""Thin adapter from the migration core (issue 2) to what the agent's entry point needs.

:func:`build_core` starts the parts owned by the migration core (block hub, vLLM server with
the Pallas connector, engine client, session store, Migrator, PeerTransfer service) and
returns an :class:`AgentCore`: one object with the handful of accessors the control service,
telemetry, metrics and UE front read. Keeping this in one place means agent/main.py does not
depend on how the core is laid out inside.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Protocol

from pallas_proto import pallas_pb2

__all__ = ["AgentCore", "build_core"]


class AgentCore(Protocol):
    """What the agent's entry point uses of the migration core.

    Attributes:
        sessions: the agent's :class:`agent.session.SessionStore`.
        engine: the :class:`agent.session.Engine` of the local vLLM server.
        migrator: the :class:`agent.migration.Migrator`.
        vllm_url: base URL of the local vLLM server.
        model_path: the served model's folder (tokenizer lookup), or None.
    """

    sessions: Any
    engine: Any
    migrator: Any
    vllm_url: str
    model_path: str | None

    def identity(self) -> pallas_pb2.ModelIdentity | None:
        """This server's model identity (None until the connector reported its layout)."""

    def peer_goodput(self, target: pallas_pb2.PeerEndpoint) -> float:
        """Measured block-stream goodput to a peer, bytes/s (0 if never measured)."""

    def peer_stats(self) -> Iterable[Any]:
        """Per peer: ``pallas_pb2.PeerTelemetry`` (or :class:`agent.telemetry.PeerStat`)."""

    def bytes_moved(self) -> Iterable[tuple[tuple[str, str], float]]:
        """((peer, "sent"|"received"), bytes) for the ``pallas_bytes_moved_total`` metric."""

    def blocks_held(self) -> int:
        """KV blocks held for incoming migrations."""

    def kv_blocks(self) -> tuple[int, int] | None:
        """(free, total) KV blocks of the local engine, or None if unknown."""

    async def close(self) -> None:
        """Stop everything :func:`build_core` started."""


class _EngineProxy:
    """Forwards to the node's current engine client (the node replaces it when vLLM attaches)."""

    def __init__(self, node: Any) -> None:
        self._node = node

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node.engine, name)


class _NodeCore:
    """:class:`AgentCore` over :class:`agent.node.AgentNode` and an optional launched vLLM."""

    def __init__(self, node: Any, server: Any, vllm_url: str, model_path: str | None) -> None:
        self.node = node
        self.server = server
        self.vllm_url = vllm_url
        self.model_path = model_path
        self.sessions = node.sessions
        self.engine = _EngineProxy(node)
        self.migrator = node.migrator

    def identity(self) -> pallas_pb2.ModelIdentity | None:
        try:
            return self.node.identity()
        except RuntimeError:
            return None

    def peer_goodput(self, target: pallas_pb2.PeerEndpoint) -> float:
        return float(self.migrator.peers.get(target).goodput_bytes_per_s)

    def peer_stats(self) -> list[pallas_pb2.PeerTelemetry]:
        return list(self.migrator.peers.telemetry())

    def bytes_moved(self) -> list[tuple[tuple[str, str], float]]:
        return [((p.agent_id, "sent"), float(p.bytes_sent)) for p in self.migrator.peers.telemetry()]

    def blocks_held(self) -> int:
        return int(self.migrator.held().get("blocks", 0))

    def kv_blocks(self) -> tuple[int, int] | None:
        """(free, total) KV blocks from the connector's latest report, or None."""
        st = self.node.hub.kv_stats()
        if "num_blocks" in st and "free_blocks" in st:
            return int(st["free_blocks"]), int(st["num_blocks"])
        return None

    async def close(self) -> None:
        try:
            await self.node.stop()
        finally:
            if self.server is not None:
                await asyncio.get_running_loop().run_in_executor(None, self.server.stop)


async def build_core(cfg: Any, log: Any) -> AgentCore:
    """Start the migration core for ``cfg`` (an :class:`agent.main.AgentConfig`).

    Order (agent/node.py): the node (block hub, Migrator, PeerTransfer gRPC on
    ``cfg.peer_port``) first, then vLLM with the connector pointed at the hub (unless
    ``cfg.vllm_url`` names a running one), then attach (waits for vLLM health and the
    connector's hello).

    Raises:
        RuntimeError: the launched vLLM exited during start-up (with its log's tail).
        TimeoutError: vLLM or its connector not ready within ``cfg.vllm_ready_timeout_s``.
    """
    from agent.migration import MigrationConfig
    from agent.node import AgentConfig as NodeConfig
    from agent.node import AgentNode
    from agent.server import ServerConfig, VLLMServer

    loop = asyncio.get_running_loop()
    model = cfg.model
    if cfg.model_preset and not model:
        from pallas_eval.models import build_model  # test presets live in the harness

        model = str(await loop.run_in_executor(None, build_model, cfg.model_preset))
    node = AgentNode(NodeConfig(
        agent_id=cfg.agent_id, model=model, peer_listen=f"{cfg.host}:{cfg.peer_port}",
        hub_address=cfg.hub_address,
        migration=MigrationConfig(link_rate_mbps=cfg.peer_rate_mbps or None)))
    await node.start()
    port = node.peer_address.rsplit(":", 1)[1]
    node.peer_address = node.migrator.peer_address = f"{cfg.advertise_host}:{port}"
    server = None
    try:
        if cfg.vllm_url:
            url = cfg.vllm_url.rstrip("/")
        else:
            server = VLLMServer(ServerConfig(
                model=model, port=cfg.vllm_port, agent_address=node.hub.address,
                kv_cache_gib=cfg.kv_cache_gib, omp_threads_bind=cfg.omp_bind,
                block_size=cfg.block_size, max_model_len=cfg.max_model_len,
                max_num_seqs=cfg.max_num_seqs, dtype=cfg.dtype,
                kv_connector_module=cfg.kv_connector_module, kv_connector_class=cfg.kv_connector_class,
                kv_connector_extra=cfg.kv_connector_extra, extra_args=list(cfg.vllm_args),
                log_path=cfg.vllm_log))
            server.start()
            url = server.base_url
            log.info("vllm_launched", vllm_url=url, pid=server.proc.pid, log_path=server.log_path,
                     hub=node.hub.address)
        attach = asyncio.ensure_future(node.attach(url, timeout_s=cfg.vllm_ready_timeout_s))
        while not attach.done():
            if server is not None and server.proc is not None and server.proc.poll() is not None:
                attach.cancel()
                raise RuntimeError(f"vLLM exited with {server.proc.returncode}:\n{server.log_tail()}")
            await asyncio.wait({attach}, timeout=1.0)
        attach.result()
    except BaseException:
        await node.stop()
        if server is not None:
            await loop.run_in_executor(None, server.stop)
        raise
    return _NodeCore(node, server, url, model)
