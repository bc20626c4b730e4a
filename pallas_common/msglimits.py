"""Per-RPC gRPC message size limits (issue 16: "message sizes per RPC sized to the block size").

gRPC's own limit is one number per channel or server (4 MiB received by default). Pallas sizes
each RPC of its two services instead:

- ``pallas.v1.PeerTransfer`` (agent <-> agent), from the engine's KV geometry: a ``KVBlock``
  carries one block, so its message is at most ``block_bytes`` (block size x the KV bytes per
  token the engine reports, all layers: ``ModelIdentity.block_bytes``) plus
  :data:`HEADER_SLACK` for its other fields; ``Prepare`` carries at most a context of token ids
  (``max_tokens`` x :data:`TOKEN_ID_BYTES`, a uint32 varint); ``Sync`` the token ids and one
  tail block; ``Release``, ``Progress``, ``Renew`` and every reply are small.
- ``pallas.v1.Control`` (xApp -> agent): every request is small (:data:`CONTROL_REQUEST_MAX`),
  so is every reply but the Telemetry stream's reports (:data:`TELEMETRY_REPORT_MAX`).

:class:`RpcLimits` holds one service's limits per method and turns them into gRPC options:
clients get a service config with ``maxRequestMessageBytes``/``maxResponseMessageBytes`` per
method (gRPC refuses a larger message with RESOURCE_EXHAUSTED, on either side of the call) and
transport limits at the largest; servers get transport limits at the largest request and reply
(a server cannot set them per method: the agent checks each PeerTransfer request against its
method's limit as it is decoded, agent/transfer.py).

Sizes are bytes. Importable from both environments (standard library only).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["HEADER_SLACK", "TOKEN_ID_BYTES", "CONTROL_REQUEST_MAX", "CONTROL_REPLY_MAX",
           "TELEMETRY_REPORT_MAX", "DEFAULT_MAX_BLOCK_BYTES", "DEFAULT_MAX_TOKENS", "RpcLimits",
           "control_limits", "peer_limits"]

HEADER_SLACK = 4096
"""Bytes allowed for a message's fields besides its KV payload and token ids (session id, epoch,
indices, an endpoint, a model identity, a status message)."""

TOKEN_ID_BYTES = 5
"""The most one token id takes on the wire (a uint32 as a varint)."""

CONTROL_REQUEST_MAX = 16 << 10
"""Largest Control request (Trigger, Cancel, Commit, Telemetry; also gRPC health checks on the
same server): ids, one endpoint, a reason."""

CONTROL_REPLY_MAX = 64 << 10
"""Largest ControlReply and PeerTransfer reply (a status message may quote an error)."""

TELEMETRY_REPORT_MAX = 4 << 20
"""Largest TelemetryReport: about 40,000 sessions' entries."""

DEFAULT_MAX_BLOCK_BYTES = 64 << 20
"""Largest KV block assumed before an engine reported its own (the agent's ``--max-block-bytes``
default): 32 tokens of a model with 2 MiB of KV per token."""

DEFAULT_MAX_TOKENS = 1 << 17
"""Largest context assumed when none is configured (token ids in Prepare and Sync)."""

CONTROL_SERVICE = "pallas.v1.Control"
PEER_SERVICE = "pallas.v1.PeerTransfer"


@dataclass(frozen=True)
class RpcLimits:
    """One gRPC service's message limits, bytes, per method name (``Trigger``, ``Sync``, ...).

    ``request``: largest request message of each method; ``response``: largest reply (each
    message of a stream counts alone).
    """

    service: str
    request: Mapping[str, int] = field(default_factory=dict)
    response: Mapping[str, int] = field(default_factory=dict)

    @property
    def max_request(self) -> int:
        """The largest request of any method."""
        return max(self.request.values())

    @property
    def max_response(self) -> int:
        """The largest reply of any method."""
        return max(self.response.values())

    def service_config(self) -> str:
        """A gRPC service config (JSON) with each method's limits (``methodConfig``)."""
        methods = [{"name": [{"service": self.service, "method": m}],
                    "maxRequestMessageBytes": self.request[m],
                    "maxResponseMessageBytes": self.response[m]} for m in sorted(self.request)]
        return json.dumps({"methodConfig": methods})

    def channel_options(self) -> list[tuple[str, object]]:
        """Client channel options: per-method limits (service config), transport at the
        largest."""
        return [("grpc.service_config", self.service_config()),
                ("grpc.max_send_message_length", self.max_request),
                ("grpc.max_receive_message_length", self.max_response)]

    def server_options(self) -> list[tuple[str, object]]:
        """Server options: receive at most the largest request, send at most the largest
        reply."""
        return [("grpc.max_receive_message_length", self.max_request),
                ("grpc.max_send_message_length", self.max_response)]


def control_limits() -> RpcLimits:
    """``pallas.v1.Control``'s limits (module docstring)."""
    small = dict.fromkeys(("Trigger", "Cancel", "Commit", "Telemetry"), CONTROL_REQUEST_MAX)
    reply = dict.fromkeys(("Trigger", "Cancel", "Commit"), CONTROL_REPLY_MAX)
    reply["Telemetry"] = TELEMETRY_REPORT_MAX
    return RpcLimits(CONTROL_SERVICE, small, reply)


def peer_limits(block_bytes: int, max_tokens: int) -> RpcLimits:
    """``pallas.v1.PeerTransfer``'s limits for blocks of ``block_bytes`` (all layers) and
    contexts of at most ``max_tokens`` tokens (module docstring). Raises ValueError for a
    non-positive size."""
    if block_bytes <= 0 or max_tokens <= 0:
        raise ValueError(f"block_bytes {block_bytes} and max_tokens {max_tokens} must be > 0")
    block = int(block_bytes) + HEADER_SLACK
    ids = int(max_tokens) * TOKEN_ID_BYTES + HEADER_SLACK
    request = {"Prepare": ids, "StreamBlocks": block, "Sync": ids + block,
               "Release": HEADER_SLACK, "Progress": HEADER_SLACK, "Renew": HEADER_SLACK}
    return RpcLimits(PEER_SERVICE, request, dict.fromkeys(request, CONTROL_REPLY_MAX))
