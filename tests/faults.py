"""Fault-injecting test doubles for the agent (kept out of the product).

- :class:`UncheckedStore`: a block store that skips the CRC-32C check (the negative control of
  the end-to-end checksum tests: what a path without checksums would accept).
- :class:`CorruptingPeers`: a migration engine's peer pool whose streams zero the data of chosen
  blocks after their checksum was taken (the target must catch them).
- :func:`hold_back`: makes an agent's connector channel handle one session's messages of one
  kind late (a Sync that waits past its deadline, a load that waits for its blocks).
- :func:`engine_core`, :func:`kill_engine_core`: find and SIGKILL a vLLM server's EngineCore.

Shared by the e2e tests (tests/e2e) and ``benchmarks/soak.py --faults``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import psutil

from agent.ipc import BlockStore, block_crc
from agent.wire import Block


class UncheckedStore(BlockStore):
    """Stores every block as received, its checksum recomputed from the data."""

    def put(self, sid, epoch, idx, fill, crc, data, crc_ok=None):
        return super().put(sid, epoch, idx, fill, block_crc(data), data, True)


class _Proxy:
    """Stands in for ``inner``: every attribute not defined here is the inner object's."""

    def __init__(self, inner, blocks: set[tuple[str, int]]) -> None:
        self.inner, self.blocks = inner, blocks

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _CorruptingStream(_Proxy):
    def send(self, blk) -> bool:
        if (blk.session_id, blk.block_index) in self.blocks:
            blk = Block(blk.session_id, blk.epoch, blk.block_index, blk.fill, blk.checksum,
                        bytes(len(blk.data)))
        return self.inner.send(blk)


class _CorruptingClient(_Proxy):
    def open_stream(self, session_id: str, epoch: int) -> _CorruptingStream:
        return _CorruptingStream(self.inner.open_stream(session_id, epoch), self.blocks)


class CorruptingPeers(_Proxy):
    """A peer pool (``agent.transfer.PeerPool``) whose block streams send zeroed data, with the
    original checksum, for each (session_id, block_index) in ``blocks`` (a live set: add or
    clear entries while it runs). Install it in an engine's context:
    ``engine.ctx.peers = CorruptingPeers(engine.ctx.peers, blocks)``."""

    def get(self, endpoint) -> _CorruptingClient:
        return _CorruptingClient(self.inner.get(endpoint), self.blocks)


def hold_back(a, kind: type, sid: str, delay_s: float, seen: asyncio.Event):
    """Make agent ``a``'s connector channel handle messages of ``kind`` about ``sid``
    ``delay_s`` late (the rest of the channel runs on); ``seen`` is set when the first one
    arrives. Returns the function that undoes it (one hold-back per agent at a time)."""
    orig = a.hub._handle

    def about(msg) -> bool:
        return getattr(msg, "sid", None) == sid or any(
            getattr(it, "sid", None) == sid for it in getattr(msg, "blocks", ()) or ())

    async def handle(ident, msg, payload):
        if isinstance(msg, kind) and about(msg):
            seen.set()

            async def later():
                await asyncio.sleep(delay_s)
                await orig(ident, msg, payload)
            asyncio.get_running_loop().create_task(later())
            return
        await orig(ident, msg, payload)

    a.hub._handle = handle
    return lambda: a.hub.__dict__.pop("_handle", None)


def engine_core(srv) -> psutil.Process:
    """The EngineCore process of a vLLM server (``agent.server.VLLMServer``; a child of its API
    server). Raises LookupError when it has none (not started, or already gone)."""
    for p in psutil.Process(srv.proc.pid).children(recursive=True):
        try:
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                return p
        except psutil.Error:
            continue
    raise LookupError(f"no EngineCore under pid {srv.proc.pid}")


async def kill_engine_core(srv, s, bound_s: float) -> float:
    """SIGKILL ``srv``'s EngineCore, wait (at most ``bound_s``) until session ``s`` ends at its
    agent; returns the seconds from the kill to then (printed with the state and reason)."""
    core = engine_core(srv)
    t_kill = time.monotonic()
    os.kill(core.pid, signal.SIGKILL)
    while not s.done and time.monotonic() - t_kill < bound_s:
        await asyncio.sleep(0.05)
    took = time.monotonic() - t_kill
    print(f"engine core of {srv.base_url} killed -> session {s.state.value} after {took:.2f} s:"
          f" {s.error}")
    return took
