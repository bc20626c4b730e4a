"""Worker-side block mover of the Pallas connector: whole-block slab copies out and in.

A *slab* is one KV block of every attention layer, stacked: ``[num_layers, *block_shape]``
where ``block_shape`` is the per-layer cache tensor with its block dimension removed. Whole
blocks are copied without interpreting the layout inside a block, because on vLLM CPU the
entries of a block are not indexed by token position (K and V rows are packed; docs/vllm.md
§6.2), and other backends use other layouts. The block dimension of a layer's cache is
found as the dimension whose size equals the number of KV blocks, so the same code serves the
CPU layout ``[num_blocks, H, N, C]`` and GPU layouts such as ``[2, num_blocks, bs, H, D]``.
Blocks move only between engines whose ModelIdentity matches (same dtype, block size, head
size, backend/ISA, KV dtype), which the agents check at Prepare.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

from agent.connector.messages import BlockHeader, FetchItem, Loaded, WorkerHello
from agent.connector.policy import LoadOp, SaveOp
from agent.connector.link import WorkerLink, block_crc

log = logging.getLogger("vllm.pallas.mover")


def find_block_dim(shape: tuple[int, ...], num_blocks: int) -> int:
    """Index of the block dimension of a per-layer KV cache tensor.

    Raises:
        ValueError: no dimension has ``num_blocks`` entries.
    """
    for d, size in enumerate(shape):
        if size == num_blocks:
            return d
    raise ValueError(f"no dimension of size num_blocks={num_blocks} in KV cache shape {shape}")


class BlockMover:
    """Copies whole KV blocks between vLLM's paged cache and byte buffers.

    Args:
        kv_caches: layer name -> paged KV tensor, as given to ``register_kv_caches``.
        num_blocks: KV blocks per layer (to find the block dimension).
    """

    def __init__(self, kv_caches: dict[str, torch.Tensor], num_blocks: int) -> None:
        if not kv_caches:
            raise ValueError("no KV caches registered")
        self.layer_names = list(kv_caches)
        self.tensors = [kv_caches[n] for n in self.layer_names]
        t0 = self.tensors[0]
        self.block_dim = find_block_dim(tuple(t0.shape), num_blocks)
        for n, t in zip(self.layer_names, self.tensors):
            if t.shape != t0.shape or t.dtype != t0.dtype:
                raise ValueError(f"layer {n} has shape {tuple(t.shape)}/{t.dtype}, "
                                 f"expected {tuple(t0.shape)}/{t0.dtype} (one KV group only)")
        self.dtype = t0.dtype
        self.block_shape = tuple(s for d, s in enumerate(t0.shape) if d != self.block_dim)
        self.slab_shape = (len(self.tensors), *self.block_shape)
        self.block_bytes = t0.element_size() * len(self.tensors) * int(
            torch.Size(self.block_shape).numel())

    def _layer_block(self, t: torch.Tensor, block_id: int) -> torch.Tensor:
        return t.select(self.block_dim, block_id)

    def copy_out(self, block_id: int) -> torch.Tensor:
        """A contiguous copy of one whole block, all layers: ``[L, *block_shape]``."""
        return torch.stack([self._layer_block(t, block_id) for t in self.tensors])

    def copy_in(self, block_id: int, data: bytes | memoryview) -> None:
        """Write a slab's bytes into block ``block_id`` of every layer.

        Raises:
            ValueError: ``data`` has the wrong size for a slab.
        """
        if len(data) != self.block_bytes:
            raise ValueError(f"slab has {len(data)} bytes, expected {self.block_bytes}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only buffer: we only read from it
            flat = torch.frombuffer(data, dtype=torch.uint8)
        slab = flat.view(self.dtype).view(self.slab_shape)
        for li, t in enumerate(self.tensors):
            self._layer_block(t, block_id).copy_(slab[li])

    def describe(self) -> dict[str, Any]:
        """Layout facts for the agent's ModelIdentity."""
        return {"block_bytes": self.block_bytes, "num_layers": len(self.tensors),
                "dtype": str(self.dtype).replace("torch.", ""),
                "block_shape": list(self.block_shape), "block_dim": self.block_dim}


class WorkerSide:
    """The worker half of the connector: runs the step's saves and loads.

    Saves: ``wait_for_save`` copies each block (the only work on the engine thread) and hands
    it to :class:`agent.connector.link.WorkerLink`'s sender thread, which checksums and sends it.
    Loads: ``start_load_kv`` fetches the step's blocks from the agent, verifies each CRC-32C
    and size, and copies them in before the forward. A block that is missing or fails its
    check is not written; its block id is reported through
    ``get_block_ids_with_load_errors`` so vLLM recomputes it (never a wrong block).
    """

    def __init__(self, address: str, extra_hello: dict[str, Any] | None = None) -> None:
        """``extra_hello``: model facts for the :class:`WorkerHello` (backend, model,
        model_dtype, kv_cache_dtype, block_size, tp_size), beside the layout the mover finds."""
        self.address = address
        self._extra = dict(extra_hello or {})
        self.mover: BlockMover | None = None
        self.link: WorkerLink | None = None
        self._errors: set[int] = set()
        self.blocks_saved = 0
        self.blocks_loaded = 0

    def register(self, kv_caches: dict[str, torch.Tensor], num_blocks: int) -> None:
        """Bind to vLLM's KV caches and connect to the agent."""
        self.mover = BlockMover(kv_caches, num_blocks)
        layout = self.mover.describe()
        self.link = WorkerLink(self.address, WorkerHello(
            block_bytes=layout["block_bytes"], num_layers=layout["num_layers"],
            dtype=layout["dtype"], block_shape=tuple(layout["block_shape"]),
            block_dim=layout["block_dim"], **self._extra))
        log.info("pallas worker: %d layers, block %s, %d bytes/block, agent %s",
                 len(self.mover.tensors), self.mover.block_shape, self.mover.block_bytes,
                 self.address)

    def save(self, saves: list[SaveOp]) -> None:
        """Copy out this step's blocks (called in wait_for_save, after every layer wrote)."""
        if self.mover is None or self.link is None:
            return
        for sid, epoch, idx, block_id, fill, tail, computed in saves:
            slab = self.mover.copy_out(block_id)
            self.link.send_block(BlockHeader(sid, epoch, idx, fill, 0, tail, computed), slab)
            self.blocks_saved += 1

    def load(self, loads: list[LoadOp]) -> None:
        """Fetch, verify and copy in this step's blocks (called in start_load_kv)."""
        if not loads or self.mover is None or self.link is None:
            return
        got = self.link.fetch([FetchItem(sid, epoch, idx, need)
                               for sid, epoch, idx, _, need in loads])
        done: dict[tuple[str, int], list[int]] = {}
        failed: dict[tuple[str, int], list[int]] = {}
        for (sid, epoch, idx, block_id, need), ent in zip(loads, got):
            ok = False
            if ent is not None:
                fill, crc, data = ent
                if fill >= need and block_crc(data) == crc and len(data) == self.mover.block_bytes:
                    self.mover.copy_in(block_id, data)
                    ok = True
            if ok:
                done.setdefault((sid, epoch), []).append(idx)
                self.blocks_loaded += 1
            else:
                self._errors.add(block_id)
                failed.setdefault((sid, epoch), []).append(idx)
        for key in set(done) | set(failed):
            self.link.report(Loaded(key[0], key[1], tuple(done.get(key, [])),
                                    tuple(failed.get(key, []))))
        if failed:
            log.warning("pallas: %d blocks failed to load; vLLM recomputes them",
                        sum(len(v) for v in failed.values()))

    def take_errors(self) -> set[int]:
        """Block ids whose load failed since the last call."""
        out, self._errors = self._errors, set()
        return out

    def close(self) -> None:
        """Drain the sender thread."""
        if self.link is not None:
            self.link.close()
