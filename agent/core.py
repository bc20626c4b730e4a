"""Thin adapter from the migration core (issue 2) to what the agent's entry point needs.

:func:`build_core` starts the parts owned by the migration core (block hub, vLLM server with
the Pallas connector, engine client, session store, Migrator, PeerTransfer service) and
returns an :class:`AgentCore`: one object with the handful of accessors the control service,
telemetry, metrics and UE front read. Keeping this in one place means agent/main.py does not
depend on how the core is laid out inside.
"""

from __future__ import annotations

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

    def peer_goodput(self, agent_id: str) -> float:
        """Measured block-stream goodput to a peer, bytes/s (0 if never measured)."""

    def peer_stats(self) -> Iterable[Any]:
        """:class:`agent.telemetry.PeerStat` per peer."""

    def bytes_moved(self) -> Iterable[tuple[tuple[str, str], float]]:
        """((peer, "sent"|"received"), bytes) for the ``pallas_bytes_moved_total`` metric."""

    def blocks_held(self) -> int:
        """KV blocks held for incoming migrations."""

    async def close(self) -> None:
        """Stop everything :func:`build_core` started."""


async def build_core(cfg: Any, log: Any) -> AgentCore:
    """Start the migration core for ``cfg`` (an :class:`agent.main.AgentConfig`)."""
    raise NotImplementedError("the migration core (agent.node) has not landed yet")
