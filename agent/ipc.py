"""The local channel between the agent and the Pallas connector inside vLLM's processes: the
agent's side (the connector's side, which runs inside vLLM, is :mod:`agent.connector.link`).

ZeroMQ over loopback TCP: the agent binds one ROUTER socket (:class:`BlockHub`), the
connector's scheduler and worker sides connect DEALER sockets. Every message is
``[header, *payload]``: one typed message of :mod:`agent.connector.messages` as JSON, then raw
block bytes (one frame per block); a malformed message is logged and dropped. Threads, sockets
and the message table: docs/vllm.md §3.5.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from agent.connector.link import block_crc, encode
from agent.connector.messages import (AgentCommand, Avail, Bad, BlockHeader, Claim, Drop,
                                      Export, Fetch, Fetched, FetchedItem, Loaded,
                                      Message, MessageError, Reset, SchedHello, Stop, WorkerHello,
                                      decode)
from pallas_common.aio import cancel_and_wait

# =============================================================================================
# Agent side
# =============================================================================================

@dataclass
class StoredBlock:
    """One received, checksum-verified KV block held by the target agent."""

    fill: int
    crc: int
    data: bytes | memoryview  # a memoryview of the received gRPC message (agent.wire)


@dataclass
class _SessionBlocks:
    epoch: int
    blocks: dict[int, StoredBlock] = field(default_factory=dict)
    bad: set[int] = field(default_factory=set)


class BlockStore:
    """Received KV blocks per session (target role), newest epoch only.

    Accounting (``num_blocks``, ``num_bytes``) is what the cancel/kill tests check returns to
    zero. A block whose CRC-32C does not match its checksum is never stored (``bad``).
    """

    def __init__(self) -> None:
        self._by_sid: dict[str, _SessionBlocks] = {}
        self.num_blocks = 0
        self.num_bytes = 0

    def put(self, sid: str, epoch: int, idx: int, fill: int, crc: int, data: bytes,
            crc_ok: bool | None = None) -> str:
        """Store a block. Returns "ok", "stale" (older epoch: dropped) or "bad" (checksum).

        ``crc_ok``: the caller already compared CRC-32C(data) with ``crc`` (off the event
        loop); None makes the store compute it.
        """
        cur = self._by_sid.get(sid)
        if cur is not None and epoch < cur.epoch:
            return "stale"
        if cur is None or epoch > cur.epoch:
            self.drop(sid)
            cur = self._by_sid[sid] = _SessionBlocks(epoch)
        if crc_ok is None:
            crc_ok = block_crc(data) == crc
        if not crc_ok:
            cur.bad.add(idx)
            return "bad"
        old = cur.blocks.get(idx)
        if old is not None:
            if old.fill >= fill:
                return "ok"  # keep the fuller snapshot
            self.num_bytes -= len(old.data)
            self.num_blocks -= 1
        cur.blocks[idx] = StoredBlock(fill, crc, data)
        cur.bad.discard(idx)
        self.num_blocks += 1
        self.num_bytes += len(data)
        return "ok"

    def get(self, sid: str, epoch: int, idx: int) -> StoredBlock | None:
        """The stored block, or None (unknown session, other epoch, missing)."""
        cur = self._by_sid.get(sid)
        if cur is None or cur.epoch != epoch:
            return None
        return cur.blocks.get(idx)

    def epoch(self, sid: str) -> int | None:
        """Newest epoch held for ``sid``."""
        cur = self._by_sid.get(sid)
        return None if cur is None else cur.epoch

    def count(self, sid: str) -> int:
        """Blocks held for ``sid``."""
        cur = self._by_sid.get(sid)
        return 0 if cur is None else len(cur.blocks)

    def bad(self, sid: str) -> set[int]:
        """Indices of blocks of ``sid`` that failed their checksum."""
        cur = self._by_sid.get(sid)
        return set() if cur is None else set(cur.bad)

    def drop(self, sid: str) -> int:
        """Forget every block of ``sid``; returns how many were released."""
        cur = self._by_sid.pop(sid, None)
        if cur is None:
            return 0
        n = len(cur.blocks)
        self.num_blocks -= n
        self.num_bytes -= sum(len(b.data) for b in cur.blocks.values())
        return n

    def sessions(self) -> list[str]:
        """Session ids with anything held."""
        return list(self._by_sid)


@dataclass(frozen=True)
class LocalBlock:
    """One block the local worker copied out (source role): the ``block`` message, typed.

    ``idx`` block index, ``fill`` valid tokens in it, ``crc`` CRC-32C of ``data``, ``tail``
    True for a snapshot of the partial last block, ``computed`` tokens computed when copied.
    """

    sid: str
    epoch: int
    idx: int
    fill: int
    crc: int
    data: bytes
    tail: bool = False
    computed: int = 0

    @classmethod
    def from_message(cls, hdr: BlockHeader, data: bytes) -> "LocalBlock":
        """From a decoded ``block`` header and its data frame."""
        return cls(hdr.sid, hdr.epoch, hdr.idx, hdr.fill, hdr.crc, data, hdr.tail, hdr.computed)


BlockCallback = Callable[[LocalBlock], None]
#: An Export start beyond any block: the connector keeps its position and takes the new flags.
_NO_REWIND = 1 << 31


class BlockHub:
    """The agent's end of the local channel (one per agent, one vLLM server per agent).

    Args:
        address: ZeroMQ endpoint to bind, e.g. ``"tcp://127.0.0.1:5601"``; port 0 picks a free
            port (read :attr:`address` after :meth:`start`).

    Callbacks (set by the migration engine): ``on_block(LocalBlock)`` for blocks the local worker
    copied out (source role), ``on_claim(Claim)`` / ``on_loaded(Loaded)`` for the connector's
    reports at a resume (target role). ``sched_info`` / ``worker_info``: the latest
    :class:`SchedHello` / :class:`WorkerHello` (None before the first).
    """

    def __init__(self, address: str = "tcp://127.0.0.1:0") -> None:
        self._bind = address
        self.address = address
        self.store = BlockStore()
        self.sched_info: SchedHello | None = None
        self.worker_info: WorkerHello | None = None
        self.on_block: BlockCallback | None = None
        self.on_claim: Callable[[Claim], None] | None = None
        self.on_loaded: Callable[[Loaded], None] | None = None
        self._ctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task | None = None
        self._sched_ident: bytes | None = None
        self._ready = asyncio.Event()
        self._exports: dict[str, Export] = {}       # sid -> what the connector is asked
        self._holders: dict[str, dict[str, Export]] = {}  # sid -> key -> what each holder asked
        self._log = logging.getLogger("pallas.agent.ipc")
        self.blocks_in = 0  # blocks received from the local worker (source role)
        self.bytes_in = 0
        self.dropped = 0  # malformed or misdirected messages logged and dropped

    async def start(self) -> None:
        """Bind and start serving."""
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        if self._bind.endswith(":0"):
            port = self._sock.bind_to_random_port(self._bind.rsplit(":", 1)[0])
            self.address = f"{self._bind.rsplit(':', 1)[0]}:{port}"
        else:
            self._sock.bind(self._bind)
            self.address = self._bind
        self._task = asyncio.get_running_loop().create_task(self._serve(), name="block-hub")

    async def close(self) -> None:
        """Stop serving and close the socket (connectors reconnect to the next hub)."""
        await cancel_and_wait(self._task)
        if self._sock is not None:
            self._sock.close(linger=0)
        self._ctx.term()

    async def wait_ready(self, timeout: float = 300.0) -> None:
        """Wait until both connector sides have said hello. Raises asyncio.TimeoutError."""
        await asyncio.wait_for(self._ready.wait(), timeout)

    @property
    def ready(self) -> bool:
        """True once both connector sides have said hello."""
        return self._ready.is_set()

    # ---------------------------------------------------------------- commands to the engine
    def _to_sched(self, cmd: AgentCommand) -> bool:
        if self._sched_ident is None or self._sock is None:
            return False
        try:
            self._sock.send_multipart([self._sched_ident, *encode(cmd)], flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:
            self._log.warning("to_sched failed: %r", exc)
            return False

    def export(self, sid: str, epoch: int, start_block: int, *, stream: bool = True,
               tail: bool = True, key: str = "") -> None:
        """Ask the connector to copy out blocks of ``sid`` from ``start_block`` as they complete.

        ``stream``: full blocks; ``tail``: a snapshot of the partial last block every step.
        ``key``: who asks (the source's attempts use their target's address): one session may
        feed several streams of one epoch (issue 45), each holding the export until its own
        :meth:`stop_export`; the connector copies from the lowest start any of them asked, full
        blocks if any asks for them, the tail if any does. A holder of another epoch replaces
        every holder of the older one. The command is re-sent if the scheduler side reconnects.
        """
        holders = self._holders.setdefault(sid, {})
        if any(h.epoch != int(epoch) for h in holders.values()):
            holders.clear()
        holders[key] = Export(sid, int(epoch), int(start_block), bool(stream), bool(tail))
        merged = self._merged(sid)
        self._exports[sid] = merged
        # The connector lowers its next block to this start (a lower one re-copies blocks some
        # holder already has: they are dropped there); the flags are every holder's.
        self._to_sched(Export(sid, int(epoch), int(start_block), merged.stream, merged.tail))

    def _merged(self, sid: str) -> Export:
        hs = list(self._holders[sid].values())
        return Export(sid, hs[0].epoch, min(h.start_block for h in hs),
                      any(h.stream for h in hs), any(h.tail for h in hs))

    def stop_export(self, sid: str, key: str | None = None) -> None:
        """Stop copying out blocks of ``sid`` for ``key`` (None: for every holder). The export
        ends when no holder is left; until then the others' flags stay in force."""
        holders = self._holders.get(sid, {})
        if key is not None:
            holders.pop(key, None)
        if key is None or not holders:
            self._holders.pop(sid, None)
            self._exports.pop(sid, None)
            self._to_sched(Stop(sid))
            return
        merged = self._exports[sid] = self._merged(sid)
        # Only the flags change: a start past any block leaves the connector's position alone.
        self._to_sched(Export(sid, merged.epoch, _NO_REWIND, merged.stream, merged.tail))

    def put_block(self, sid: str, epoch: int, idx: int, fill: int, crc: int, data: bytes,
                  crc_ok: bool | None = None) -> str:
        """Store a received block (target role) and advertise it to the connector.

        Returns the store's verdict: "ok", "stale" or "bad" (a bad block is advertised as bad,
        so a waiting resume stops waiting for it and recomputes instead).
        """
        verdict = self.store.put(sid, epoch, idx, fill, crc, data, crc_ok)
        if verdict == "ok":
            self._to_sched(Avail(sid, int(epoch), int(idx), int(fill)))
        elif verdict == "bad":
            self._to_sched(Bad(sid, int(epoch), int(idx)))
        return verdict

    def drop(self, sid: str) -> int:
        """Release every block held for ``sid`` here and in the connector's view; returns count."""
        n = self.store.drop(sid)
        self._to_sched(Drop(sid))
        return n

    def kv_blocks(self) -> tuple[int, int] | None:
        """(free, total) KV blocks from the connector's latest report, or None."""
        st = self.sched_info
        if st is None or st.num_blocks is None or st.free_blocks is None:
            return None
        return st.free_blocks, st.num_blocks

    def kv_stats(self) -> dict[str, Any]:
        """Latest KV-pool stats from the scheduler side (the :class:`SchedHello`'s fields:
        num_blocks, free_blocks, ...); empty before the first hello."""
        return {} if self.sched_info is None else asdict(self.sched_info)

    # ---------------------------------------------------------------- serving loop
    async def _serve(self) -> None:
        assert self._sock is not None
        while True:
            frames = await self._sock.recv_multipart(copy=True)
            if len(frames) < 2:
                continue
            ident, hdr_frame, payload = frames[0], frames[1], frames[2:]
            try:
                await self._handle(ident, decode(hdr_frame), payload)
            except Exception as exc:  # a malformed message is dropped; the hub runs on
                self.dropped += 1
                self._log.warning("dropped ipc message: %r", exc)

    async def _handle(self, ident: bytes, msg: Message, payload: list[bytes]) -> None:
        if isinstance(msg, BlockHeader):
            if len(payload) != 1:
                raise MessageError(f"block: {len(payload)} data frames, expected 1")
            self.blocks_in += 1
            self.bytes_in += len(payload[0])
            if self.on_block is not None:
                self.on_block(LocalBlock.from_message(msg, payload[0]))
        elif isinstance(msg, Fetch):
            entries: list[FetchedItem | None] = []
            frames: list[bytes | memoryview] = []
            for it in msg.blocks:
                blk = self.store.get(it.sid, it.epoch, it.idx)
                if blk is None or blk.fill < it.need:
                    entries.append(None)
                else:
                    entries.append(FetchedItem(blk.fill, blk.crc))
                    frames.append(blk.data)
            await self._sock.send_multipart(
                [ident, *encode(Fetched(msg.rid, tuple(entries)), *frames)])
        elif isinstance(msg, SchedHello):
            first = self._sched_ident is None or self._sched_ident != ident
            self._sched_ident = ident
            self.sched_info = msg
            if first:
                # A (re)connected scheduler side: forget what a previous hub told it,
                # then re-send what this hub holds.
                self._to_sched(Reset())
                for cmd in self._exports.values():
                    self._to_sched(cmd)
                for sid in self.store.sessions():
                    ep = self.store.epoch(sid)
                    for idx, blk in self.store._by_sid[sid].blocks.items():
                        self._to_sched(Avail(sid, ep, idx, blk.fill))
        elif isinstance(msg, WorkerHello):
            self.worker_info = msg
        elif isinstance(msg, Claim):
            if self.on_claim is not None:
                self.on_claim(msg)
        elif isinstance(msg, Loaded):
            if self.on_loaded is not None:
                self.on_loaded(msg)
        else:
            raise MessageError(f"{msg.TYPE} is not a message for the agent")
        if self.sched_info is not None and self.worker_info is not None:
            self._ready.set()
