"""Worker-side block mover of the Pallas connector: whole-block slab copies out and in.

A *slab* is one KV block of every attention layer, stacked: ``[num_layers, *block_shape]``
(``block_shape``: a layer's cache tensor without its block dimension, found as the dimension of
size num_blocks, so CPU ``[num_blocks, H, N, C]`` and GPU ``[2, num_blocks, bs, H, D]`` layouts
both work). Blocks are copied whole, never read inside, and only between engines whose
ModelIdentity matches (docs/vllm.md §6.2).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from agent.connector.messages import BlockHeader, FetchItem, Loaded, WorkerHello
from agent.connector.block_policy import LoadOp, SaveOp
from agent.connector.link import WorkerLink, block_crc

log = logging.getLogger("vllm.pallas.mover")

LOAD_DEADLINE_S = 10.0  # a load not in this long after start_load_kv is reported failed
SYNC_LOAD_DEADLINE_S = 0.5  # the most a synchronous load may hold the engine thread


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

    def copy_in(self, block_ids: list[int], data: list[bytes]) -> None:
        """Write slabs' bytes into blocks ``block_ids`` of every layer: one copy per layer for
        all of them (few GIL hand-offs: the loader thread shares the GIL with the engine).

        Raises:
            ValueError: a slab has the wrong size.
        """
        if any(len(d) != self.block_bytes for d in data):
            raise ValueError(f"slab sizes {[len(d) for d in data]}, expected {self.block_bytes}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only buffer: we only read from it
            flat = torch.frombuffer(b"".join(data), dtype=torch.uint8)
        slabs = flat.view(self.dtype).view(len(data), *self.slab_shape)
        idx = torch.tensor(block_ids, dtype=torch.long)
        for li, t in enumerate(self.tensors):
            t.index_copy_(self.block_dim, idx, slabs[:, li].movedim(0, self.block_dim))

    def describe(self) -> dict[str, Any]:
        """Layout facts for the agent's ModelIdentity."""
        return {"block_bytes": self.block_bytes, "num_layers": len(self.tensors),
                "dtype": str(self.dtype).replace("torch.", ""),
                "block_shape": list(self.block_shape), "block_dim": self.block_dim}


@dataclass
class _Load:
    """One request's load: deadline (``clock`` s), engine block ids copied in so far, whether
    the thread is done (``ended``), whether vLLM was told (``over``: write nothing more)."""

    ops: list[LoadOp]
    deadline: float
    done: set[int] = field(default_factory=set)
    ended: bool = False
    over: bool = False


class WorkerSide:
    """The worker half of the connector: runs the step's saves and loads (docs/vllm.md §3.2).

    ``wait_for_save`` copies each block out (the only work on the engine thread) for
    :class:`agent.connector.link.WorkerLink`'s sender thread. A synchronous load (``LoadOp.sync``)
    is fetched, checked and copied in by ``start_load_kv`` within ``SYNC_LOAD_DEADLINE_S``; an
    asynchronous one by the loader thread, reported by ``get_finished`` when it ended or at
    ``LOAD_DEADLINE_S``. Blocks missing, bad or late go to :meth:`take_errors` (vLLM recomputes).
    """

    def __init__(self, address: str, extra_hello: dict[str, Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``extra_hello``: model facts for the :class:`WorkerHello` (backend, model,
        model_dtype, kv_cache_dtype, block_size, tp_size), beside the layout the mover finds;
        ``clock``: seconds, for the loads' deadlines."""
        self.address = address
        self._extra = dict(extra_hello or {})
        self._clock = clock
        self.mover: BlockMover | None = None
        self.link: WorkerLink | None = None
        self._errors: set[int] = set()
        self._lock = threading.Lock()
        self._loads: dict[str, _Load] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="pallas-loader", daemon=True)
        self._thread.start()
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
        """This step's loads (start_load_kv): the synchronous ones copied in now, one fetch per
        request; the others queued for the loader thread, one job per request."""
        now = self._clock()
        sync: dict[str, _Load] = {}
        for op in loads:
            if op.sync:
                sync.setdefault(op.req_id, _Load([], now + SYNC_LOAD_DEADLINE_S)).ops.append(op)
        for job in sync.values():
            try:
                self._fetch_in(job)
            except Exception:  # never take the engine down: the blocks are recomputed
                log.exception("pallas: synchronous load failed")
            with self._lock:
                job.over = True
                self._errors.update(op.block_id for op in job.ops if op.block_id not in job.done)
        deadline = now + LOAD_DEADLINE_S
        with self._lock:
            for op in loads:
                if op.sync:
                    continue
                job = self._loads.get(op.req_id)
                if job is None:
                    job = self._loads[op.req_id] = _Load([], deadline)
                    self._queue.put(job)
                job.ops.append(op)

    def take_finished(self) -> set[str]:
        """Requests whose load ended, or passed its deadline, since the last call (reported
        once each); their blocks not copied in go to :meth:`take_errors`."""
        now = self._clock()
        with self._lock:
            out = {rid for rid, job in self._loads.items() if job.ended or now >= job.deadline}
            for job in map(self._loads.pop, out):
                job.over = True
                self._errors.update(op.block_id for op in job.ops if op.block_id not in job.done)
        return out

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                self._fetch_in(job)
            except Exception:  # never take the engine down: the blocks are recomputed
                log.exception("pallas: load failed")
            finally:
                job.ended = True

    def _fetch_in(self, job: _Load) -> None:
        assert self.mover is not None and self.link is not None
        left = job.deadline - self._clock()
        got = self.link.fetch([FetchItem(op.sid, op.epoch, op.idx, op.need) for op in job.ops],
                              left) if left > 0 else [None] * len(job.ops)
        good = [(op.block_id, d) for op, ent in zip(job.ops, got)
                if (d := self._verified(op, ent)) is not None]
        with self._lock:
            if good and not job.over:
                self.mover.copy_in([b for b, _ in good], [d for _, d in good])
                job.done.update(b for b, _ in good)
                self.blocks_loaded += len(good)
        ok = [o.block_id in job.done for o in job.ops]
        self.link.report(Loaded(job.ops[0].sid, job.ops[0].epoch,
                                tuple(o.idx for o, y in zip(job.ops, ok) if y),
                                tuple(o.idx for o, y in zip(job.ops, ok) if not y)))

    def _verified(self, op: LoadOp, ent: tuple[int, int, bytes] | None) -> bytes | None:
        """A fetched block's bytes if it may be copied in: present, at least ``op.need``
        tokens, one slab long, CRC-32C matching (computed holding the GIL: cheaper than a
        hand-off per block); else None."""
        ok = ent is not None and self.mover is not None and ent[0] >= op.need \
            and len(ent[2]) == self.mover.block_bytes and block_crc(ent[2], 0) == ent[1]
        return ent[2] if ok else None

    def take_errors(self) -> set[int]:
        """Block ids whose load failed since the last call (engine thread, as take_finished)."""
        out, self._errors = self._errors, set()
        return out

    def close(self) -> None:
        """Stop the loader thread and drain the sender thread."""
        self._queue.put(None)
        self._thread.join(timeout=5.0)
        if self.link is not None:
            self.link.close()
