"""Admission at a prospective target (paper §4.2 "Admission decision"; docs/model.md §4).

A target is admitted for a session only if it serves a compatible model (same model id,
weights digest, activation dtype, KV-cache dtype and block size, and where both sides report
them, the same KV layout) and has free KV memory for the cache expected at the handover,
S_kv(K_HO), plus headroom. Otherwise the fallback policy applies at the handover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["ModelKey", "ServerState", "AdmissionResult", "incompatibility", "admit"]


@dataclass(frozen=True)
class ModelKey:
    """What must match for two servers to exchange KV blocks (the .proto's ModelIdentity).

    ``kv_bytes_per_token`` (s_kv, Eq. 1), ``num_layers`` and ``block_bytes`` describe the
    engine's KV layout; 0 means not reported, and such a field is not compared.
    """

    model: str
    weights_digest: str = ""
    dtype: str = ""
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    kv_bytes_per_token: int = 0
    num_layers: int = 0
    block_bytes: int = 0

    @classmethod
    def from_proto(cls, identity: Any) -> "ModelKey":
        """From a ``pallas_pb2.ModelIdentity`` (or any object with its field names)."""
        return cls(model=identity.model, weights_digest=identity.weights_digest,
                   dtype=identity.dtype, kv_cache_dtype=identity.kv_cache_dtype or "auto",
                   block_size=int(identity.block_size),
                   kv_bytes_per_token=int(identity.kv_bytes_per_token),
                   num_layers=int(identity.num_layers), block_bytes=int(identity.block_bytes))

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one KV block: ``block_bytes`` if reported, else P * s_kv (0 if unknown)."""
        return self.block_bytes or self.block_size * self.kv_bytes_per_token


def incompatibility(source: ModelKey, target: ModelKey) -> str | None:
    """Why ``target`` cannot take over ``source``'s KV blocks, or None if it can."""
    for name in ("model", "weights_digest", "dtype", "kv_cache_dtype", "block_size"):
        a, b = getattr(source, name), getattr(target, name)
        if a != b:
            return f"{name} differs: {a!r} != {b!r}"
    for name in ("kv_bytes_per_token", "num_layers", "block_bytes"):
        a, b = getattr(source, name), getattr(target, name)
        if a and b and a != b:
            return f"KV layout differs: {name} {a} != {b}"
    return None


@dataclass(frozen=True)
class ServerState:
    """A target server as its agent last reported it (``pallas_pb2.ServerTelemetry``).

    ``time``: when it was reported, s. ``free_kv_blocks`` / ``total_kv_blocks``: KV blocks.
    """

    agent_id: str
    model: ModelKey | None
    free_kv_blocks: int
    total_kv_blocks: int
    time: float

    @property
    def free_kv_bytes(self) -> int:
        """Free KV memory, bytes (0 if the block size in bytes is unknown)."""
        return self.free_kv_blocks * (self.model.bytes_per_block if self.model else 0)


@dataclass(frozen=True)
class AdmissionResult:
    """The outcome of :func:`admit`: ``admitted``, a human ``reason`` when refused, and the
    bytes needed (S_kv(K_HO) rounded up to whole blocks, times 1 + headroom) and free."""

    admitted: bool
    reason: str
    need_bytes: int
    free_bytes: int


def admit(source: ModelKey | None, target: ServerState | None, k_ho: float, s_kv: int,
          headroom_fraction: float, reserved_bytes: int = 0, *, check_memory: bool = True) -> AdmissionResult:
    """Admission of one session at one target (paper §4.2; docs/model.md §4).

    ``source``: the session's model at its source; ``target``: the target's last fresh report
    (None: no fresh telemetry, refused); ``k_ho``: predicted tokens at the handover;
    ``s_kv``: bytes per token (Eq. 1); ``headroom_fraction``: extra share of S_kv(K_HO) that
    must be free; ``reserved_bytes``: memory already promised at this target to migrations
    its report does not show yet. ``check_memory=False`` checks the model only (used to ask
    whether a target "can serve the model" for the fallback).

    Need = ceil(K_HO / P) P s_kv (1 + headroom); admitted iff the model is compatible and
    need <= free - reserved. A non-finite ``k_ho`` is refused (need unknown) unless
    ``check_memory`` is False. Never raises for such input; the reason says why.
    """
    if source is None:
        return AdmissionResult(False, "source model unknown", 0, 0)
    if target is None or target.model is None:
        return AdmissionResult(False, "no fresh telemetry from the target", 0, 0)
    why = incompatibility(source, target.model)
    if why is not None:
        return AdmissionResult(False, f"incompatible model: {why}", 0, 0)
    p = max(1, source.block_size)
    if not math.isfinite(float(k_ho)):
        # NaN would read as 0 tokens (admitted with no memory), infinity would overflow.
        free = target.free_kv_bytes - int(reserved_bytes)
        if not check_memory:
            return AdmissionResult(True, "", 0, free)
        return AdmissionResult(False, f"predicted tokens at the handover are not finite ({k_ho!r})",
                               0, free)
    blocks = math.ceil(max(0.0, float(k_ho)) / p - 1e-9)
    need = int(math.ceil(blocks * p * s_kv * (1.0 + headroom_fraction)))
    free = target.free_kv_bytes - int(reserved_bytes)
    if not check_memory:
        return AdmissionResult(True, "", need, free)
    if target.model.bytes_per_block <= 0:
        return AdmissionResult(False, "target reports no KV block size in bytes", need, free)
    if need > free:
        return AdmissionResult(False, f"not enough free KV memory: need {need} B, free {free} B",
                               need, free)
    return AdmissionResult(True, "", need, free)
