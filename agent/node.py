"""One Pallas agent's runtime: the pieces of issue 2 wired together.

:class:`AgentNode` owns the local channel to the connector (:class:`agent.ipc.BlockHub`), the
engine client (:class:`agent.session.Engine`), the sessions, the :class:`agent.migration.Migrator`
and the gRPC server that carries the PeerTransfer service (and, through ``register``, any other
service such as the xApp-facing Control service). The vLLM server is started separately
(:mod:`agent.server`) with ``agent_address = node.hub.address``; start the node first::

    node = AgentNode(AgentConfig(agent_id="gnb-a", model=str(model_dir)))
    await node.start()
    srv = VLLMServer(ServerConfig(model=str(model_dir), agent_address=node.hub.address)); srv.start()
    await node.attach(srv.base_url)          # waits for vLLM health and the connector's hello
    ... node.migrator.trigger(...), node.engine.start(session), ...
    await node.stop(); srv.stop()
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from pallas_proto import pallas_pb2

from agent.ipc import BlockHub
from agent.migration import MigrationConfig, Migrator
from agent.weights import weights_digest
from agent.session import Engine, SessionStore
from agent.transfer import serve_peer_transfer


@dataclass
class AgentConfig:
    """Configuration of one agent.

    Attributes:
        agent_id: this agent's id (edge server / gNB name).
        model: the model folder the local vLLM serves (its path is also the served name).
        peer_listen: ``host:port`` for the gRPC server (PeerTransfer, and Control if
            registered); port 0 picks one.
        hub_address: ZeroMQ endpoint for the connector channel; port 0 picks one.
        migration: :class:`agent.migration.MigrationConfig`.
    """

    agent_id: str
    model: str
    peer_listen: str = "127.0.0.1:0"
    hub_address: str = "tcp://127.0.0.1:0"
    migration: MigrationConfig = field(default_factory=MigrationConfig)


class AgentNode:
    """The agent process's core objects (see the module docstring for the order of start-up)."""

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.hub = BlockHub(cfg.hub_address)
        self.sessions = SessionStore()
        self.engine: Engine | None = None
        self.migrator: Migrator | None = None
        self.server: grpc.aio.Server | None = None
        self.peer_address = ""
        self._identity: pallas_pb2.ModelIdentity | None = None
        self._digest = ""

    @property
    def endpoint(self) -> pallas_pb2.PeerEndpoint:
        """Where peers reach this agent."""
        return pallas_pb2.PeerEndpoint(agent_id=self.cfg.agent_id, address=self.peer_address)

    async def start(self, register: Callable[[grpc.aio.Server], Any] | None = None) -> None:
        """Bind the connector channel and start the gRPC server (PeerTransfer + ``register``)."""
        await self.hub.start()
        loop = asyncio.get_running_loop()
        self._digest = await loop.run_in_executor(None, weights_digest, self.cfg.model)
        # The Migrator needs the engine; create a placeholder client now, pointed later.
        self.engine = Engine("http://127.0.0.1:1", self.cfg.model)
        self.migrator = Migrator(agent_id=self.cfg.agent_id, peer_address="",
                                 sessions=self.sessions, engine=self.engine, hub=self.hub,
                                 identity=self.identity, config=self.cfg.migration)
        self.server, self.peer_address = await serve_peer_transfer(
            self.migrator, self.cfg.peer_listen, register)
        self.migrator.peer_address = self.peer_address

    async def attach(self, vllm_url: str, timeout_s: float = 600.0) -> None:
        """Point the engine client at the local vLLM and wait for it and its connector."""
        assert self.engine is not None and self.migrator is not None
        await self.engine.close()
        self.engine = Engine(vllm_url, self.cfg.model)
        self.migrator.engine = self.engine
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not await self.engine.health():
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"vLLM at {vllm_url} not healthy")
            await asyncio.sleep(1.0)
        await self.hub.wait_ready(timeout=max(1.0, deadline - asyncio.get_running_loop().time()))

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
        bs = int(sch.get("block_size") or w.get("block_size"))
        block_bytes = int(w["block_bytes"])
        self._identity = pallas_pb2.ModelIdentity(
            model=os.path.basename(os.path.normpath(self.cfg.model)),
            weights_digest=self._digest, dtype=str(w.get("model_dtype", w.get("dtype"))),
            kv_cache_dtype=str(w.get("kv_cache_dtype", "auto")), block_size=bs,
            backend=str(w.get("backend", "")), kv_bytes_per_token=block_bytes // bs,
            num_layers=int(w["num_layers"]), block_bytes=block_bytes)
        return self._identity

    async def stop(self, grace_s: float | None = 1.0) -> None:
        """Stop serving: abandon migrations, stop gRPC, close the channel and the engine client."""
        if self.migrator is not None:
            await self.migrator.close()
        for s in list(self.sessions):
            if s._task is not None and not s._task.done():
                s._task.cancel()
        if self.server is not None:
            await self.server.stop(grace_s)
        if self.engine is not None:
            await self.engine.close()
        await self.hub.close()
