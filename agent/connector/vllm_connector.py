"""The Pallas KV connector class: vLLM's KV connector API (KVConnectorBase_V1), loaded by an
unmodified vLLM server through ``--kv-transfer-config`` (docs/vllm.md §3).

The scheduler side (EngineCore process) runs :class:`agent.connector.block_policy.SchedulerPolicy`;
the worker side (Worker process) runs :class:`agent.connector.mover.WorkerSide`. Both talk to
the agent over :mod:`agent.connector.link`. ``agent_address`` may also come from the
environment variable ``PALLAS_AGENT_ADDRESS``. ``agent`` and ``proto`` must be on ``PYTHONPATH`` of every vLLM
process (workers are spawned).

Emulation (pacing a tiny model like a real one) is not here: the harness subclasses this class
(pallas_eval/emulated_connector.py) and the agent loads it with ``--kv-connector-module``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger

from agent.connector.messages import Message, SchedHello
from agent.connector.mover import WorkerSide
from agent.connector.block_policy import (SYNC_LOAD_MAX_BLOCKS, LoadOp, SaveOp, ScheduledReq,
                                    SchedulerPolicy, pallas_params)
from agent.connector.link import SchedulerLink

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger("vllm.pallas.connector")

__all__ = ["PallasConnector", "PallasConnectorMetadata"]


@dataclass
class PallasConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> worker for one step: blocks to copy out (saves) and in (loads)."""

    saves: list[SaveOp] = field(default_factory=list)
    loads: list[LoadOp] = field(default_factory=list)


def _agent_address(vllm_config: "VllmConfig") -> str:
    extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
    addr = extra.get("agent_address") or os.environ.get("PALLAS_AGENT_ADDRESS")
    if not addr:
        raise ValueError("PallasConnector needs kv_connector_extra_config.agent_address "
                         "or PALLAS_AGENT_ADDRESS")
    return str(addr)


def _sync_max_blocks(vllm_config: "VllmConfig") -> int:
    """``kv_connector_extra_config.sync_load_max_blocks``: claims of at most this many blocks
    load before the step's forward (``policy.SYNC_LOAD_MAX_BLOCKS`` if absent; 0: none).

    Raises:
        ValueError: not a non-negative integer.
    """
    extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
    v = extra.get("sync_load_max_blocks", SYNC_LOAD_MAX_BLOCKS)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"sync_load_max_blocks must be an integer >= 0, got {v!r}")
    return v


def _backend_name(vllm_config: "VllmConfig") -> str:
    """Attention backend and ISA as far as the KV layout is concerned, e.g. ``CPU_ATTN/vec``."""
    try:
        from vllm.platforms import current_platform
        device = current_platform.device_type
    except Exception:  # pragma: no cover - defensive
        device = "unknown"
    name, isa = "", ""
    try:
        ctx = vllm_config.compilation_config.static_forward_context
        for layer in ctx.values():
            backend = getattr(layer, "attn_backend", None)
            if backend is not None:
                name = backend.get_name()
                isa = getattr(layer, "isa", "") or ""
                break
    except Exception:  # pragma: no cover - defensive
        pass
    if device == "cpu" and not isa:
        try:
            from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
            cc = vllm_config.cache_config
            isa = _get_attn_isa(vllm_config.model_config.dtype, cc.block_size,
                                vllm_config.model_config.get_head_size(), cc.cache_dtype)
        except Exception:
            isa = ""
    return "/".join(x for x in (device, name, isa) if x)


class PallasConnector(KVConnectorBase_V1):
    """KV connector for proactive KV-cache migration (paper §4.3).

    Source: copies out every completed suffix block (and, at the commit, the tail block) of a
    session the agent exports. Target: claims received blocks for a resumed request on top of
    its local prefix-cache hit, defers admission while expected blocks are in flight (until a
    deadline), loads the claimed blocks asynchronously (vLLM holds the request in
    WAITING_FOR_REMOTE_KVS until ``get_finished`` reports it) and lets vLLM recompute whatever
    is missing or failed its checksum.
    """

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig | None" = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._address = _agent_address(vllm_config)
        self._bs = vllm_config.cache_config.block_size
        self._num_blocks = getattr(kv_cache_config, "num_blocks", None)
        # What vLLM does with a block this connector reports failed (get_block_ids_with_load_
        # errors): "recompute" it, or "fail" the request; the agent checks it at attach.
        self._load_failure_policy = str(getattr(vllm_config.kv_transfer_config,
                                                "kv_load_failure_policy", "") or "")
        self._pool = None
        self._requests: dict[str, "Request"] = {}
        self.policy: SchedulerPolicy | None = None
        self.link: SchedulerLink | None = None
        self.worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.policy = SchedulerPolicy(self._bs, report=self._report,
                                          sync_max_blocks=_sync_max_blocks(vllm_config))
            self.link = SchedulerLink(self._address, self._stats, self.policy.on_command)
        else:
            mc = vllm_config.model_config
            self.worker = WorkerSide(self._address, {
                "backend": _backend_name(vllm_config),
                "model": mc.model, "model_dtype": str(mc.dtype).replace("torch.", ""),
                "kv_cache_dtype": str(vllm_config.cache_config.cache_dtype),
                "block_size": self._bs,
                "tp_size": int(vllm_config.parallel_config.tensor_parallel_size)})
        logger.info("PallasConnector %s role, agent at %s", role.name, self._address)

    @property
    def requires_kv_delivery(self) -> bool:
        """Nothing is handed off at request end, so preemption needs no special care."""
        return False

    # ------------------------------------------------------------------ scheduler side
    def _report(self, msg: Message) -> None:
        if self.link is not None:
            self.link.report(msg)

    def _stats(self) -> SchedHello:
        pool: dict[str, int] = {}
        if self._pool is not None:
            try:
                pool = {"free_blocks": int(self._pool.get_num_free_blocks()),
                        "num_blocks": int(self._pool.num_gpu_blocks)}
            except Exception:
                pool = {}
        counters = self.policy.stats() if self.policy is not None else {}
        return SchedHello(block_size=self._bs, load_failure_policy=self._load_failure_policy,
                          **pool, **counters)

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        self._pool = gpu_block_pool

    def on_new_request(self, request: "Request") -> None:
        if self.policy is not None and pallas_params(request.kv_transfer_params) is not None:
            self._requests[request.request_id] = request
            self.policy.on_new_request(request.request_id, request.kv_transfer_params)

    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self.policy is not None
        n = self.policy.match(request.request_id, request.kv_transfer_params,
                              request.num_tokens, num_computed_tokens)
        # a small claim loads before this step's forward, a larger one asynchronously
        if n is None:
            return None, False
        return n, n > 0 and self.policy.loads_async(request.request_id)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        assert self.policy is not None
        self.policy.after_alloc(request.request_id, num_external_tokens,
                                list(blocks.get_block_ids()[0]) if num_external_tokens else [])

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        assert self.policy is not None
        kvm = self._kv_cache_manager
        scheduled: list[ScheduledReq] = []
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            req = self._requests.get(rid)
            if req is None:
                continue
            scheduled.append(ScheduledReq(
                rid, req.num_computed_tokens, n,
                (lambda rid=rid: list(kvm.get_block_ids(rid)[0])) if kvm is not None
                else (lambda: [])))
        saves, loads = self.policy.build(
            scheduled, engine_idle=not scheduler_output.num_scheduled_tokens)
        return PallasConnectorMetadata(saves=saves, loads=loads)

    def request_finished(self, request: "Request",
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if self.policy is not None:
            self.policy.finished(request.request_id)
        self._requests.pop(request.request_id, None)
        return False, None

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self.worker is not None
        num_blocks = self._num_blocks
        if num_blocks is None:
            num_blocks = int(next(iter(kv_caches.values())).shape[0])
        self.worker.register(kv_caches, int(num_blocks))

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        if self.worker is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if isinstance(meta, PallasConnectorMetadata) and meta.loads:
            self.worker.load(meta.loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, (self.worker.take_finished() if self.worker is not None else None)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: "AttentionMetadata", **kwargs: Any) -> None:
        return  # whole blocks of every layer are copied once per step in wait_for_save

    def wait_for_save(self) -> None:
        if self.worker is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if isinstance(meta, PallasConnectorMetadata) and meta.saves:
            self.worker.save(meta.saves)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.take_errors() if self.worker is not None else set()

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.close()
        if self.link is not None:
            self.link.close()
