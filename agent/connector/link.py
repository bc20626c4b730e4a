"""The Pallas connector's side of the local channel to the agent (runs inside vLLM's processes).

:class:`SchedulerLink` (EngineCore process) and :class:`WorkerLink` (Worker process) connect
DEALER sockets to the agent's ROUTER (:class:`agent.ipc.BlockHub`); the framing (:func:`encode`)
and the block checksum (:func:`block_crc`) are shared with the agent, which imports them from
here, so that the code vLLM loads imports nothing of the agent outside ``agent/connector/``.
The channel, its transport and its message table: :mod:`agent.ipc`, :mod:`agent.connector.messages`.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import zmq
from crc32c import crc32c as _crc32c

from agent.connector.messages import (AgentCommand, Avail, Bad, BlockHeader, Drop, Export, Fetch,
                                      Fetched, FetchItem, Message, MessageError, Reset, SchedHello,
                                      Stop, WorkerHello, decode, encode_header)

HELLO_PERIOD_S = 0.25
FETCH_TIMEOUT_S = 10.0
_log = logging.getLogger("vllm.pallas")


def block_crc(data: bytes | memoryview, gil_release_mode: int = -1) -> int:
    """CRC-32C (Castagnoli polynomial, RFC 3720 §B.4) of ``data``: the KVBlock checksum.

    Unsigned 32-bit. Computed by the ``crc32c`` package with the CPU's CRC32 instruction
    (SSE4.2 / ARMv8) where present, which is 2-3x faster than zlib's CRC-32 on a KV block, and
    without holding the GIL on large buffers (``gil_release_mode`` -1, the package's default;
    0 never releases it, 1 always does). Accepts any contiguous buffer (bytes, memoryview).
    """
    return _crc32c(data, gil_release_mode=gil_release_mode)


def encode(msg: Message, *payload: bytes | memoryview) -> list[bytes | memoryview]:
    """Frames of one message: its JSON header then raw payload frames."""
    return [encode_header(msg), *payload]


_AGENT_COMMANDS = (Export, Stop, Avail, Bad, Drop, Reset)


def _dealer(address: str, send_hwm: int | None = None) -> zmq.Socket:
    """A DEALER socket connected to ``address`` that never lingers at close."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if send_hwm is not None:
        sock.setsockopt(zmq.SNDHWM, send_hwm)
    sock.connect(address)
    return sock


class SchedulerLink:
    """The scheduler-side connector's channel to the agent (thread-safe facade).

    A background thread owns a DEALER socket: it sends ``hello`` (with ``stats()``) every
    ``HELLO_PERIOD_S`` and hands every command it receives to ``on_command`` (called in that
    thread: keep it short and lock-protected). :meth:`report` sends from any thread through a
    queue the background thread drains.

    Args:
        address: the agent's BlockHub endpoint.
        stats: returns the :class:`SchedHello` to send (KV-pool figures); its ``pid`` is set here.
        on_command: handles one decoded agent command (:data:`AgentCommand`); a header that
            does not decode to one is logged and dropped before it gets there.
    """

    def __init__(self, address: str, stats: Callable[[], SchedHello],
                 on_command: Callable[[AgentCommand], None]) -> None:
        self.address = address
        self._stats = stats
        self._on_command = on_command
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._report_sock: zmq.Socket | None = None
        self._report_thread: int | None = None
        self._thread = threading.Thread(target=self._run, name="pallas-sched-link", daemon=True)
        self._thread.start()

    def report(self, msg: Message) -> None:
        """Send a message to the agent now (non-blocking, dropped if no agent is there).

        The first calling thread (the engine's scheduler thread) gets its own socket, so a
        report is not delayed by the background thread's poll period; other threads queue.
        """
        tid = threading.get_ident()
        if self._report_thread is None:
            self._report_thread = tid
            self._report_sock = _dealer(self.address)
        if tid != self._report_thread or self._report_sock is None:
            self._out.put(msg)
            return
        try:
            self._report_sock.send_multipart(encode(msg), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def close(self) -> None:
        """Stop the thread (and close the report socket; call from the reporting thread)."""
        self._stop.set()
        self._thread.join(timeout=2.0)
        if self._report_sock is not None:
            self._report_sock.close(linger=0)
            self._report_sock = None

    def _run(self) -> None:
        sock = _dealer(self.address, send_hwm=10000)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        next_hello = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_hello:
                    sock.send_multipart(encode(replace(self._stats(), pid=os.getpid())),
                                        flags=zmq.NOBLOCK)
                    next_hello = now + HELLO_PERIOD_S
                while True:
                    try:
                        msg = self._out.get_nowait()
                    except queue.Empty:
                        break
                    sock.send_multipart(encode(msg), flags=zmq.NOBLOCK)
            except zmq.Again:
                pass  # no agent connected: drop; hellos resume when it is back
            except Exception:  # never take the engine down
                _log.exception("sched link send")
            events = dict(poller.poll(timeout=20))
            if sock in events:
                while True:
                    try:
                        frames = sock.recv_multipart(flags=zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        cmd = decode(frames[0])
                        if not isinstance(cmd, _AGENT_COMMANDS):
                            raise MessageError(f"{cmd.TYPE} is not an agent command")
                        self._on_command(cmd)
                    except MessageError as exc:
                        _log.warning("dropped agent command: %s", exc)
                    except Exception:
                        _log.exception("bad agent command")
        sock.close(linger=0)


class WorkerLink:
    """The worker-side connector's channel to the agent.

    :meth:`send_block` queues a copied-out slab for the background sender thread, which
    computes its CRC-32C and sends it (the engine thread only pays for the copy).
    :meth:`fetch` is a request/response on a socket of the calling thread's own (the worker's
    loader thread, and the engine thread for a small synchronous load:
    :class:`agent.connector.mover.WorkerSide`), so the two never share a ZMQ socket.
    """

    def __init__(self, address: str, hello: WorkerHello) -> None:
        self.address = address
        self._hello = hello
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._local = threading.local()  # .sock: this thread's fetch socket
        self._rids = itertools.count(1)
        self._thread = threading.Thread(target=self._run, name="pallas-worker-link", daemon=True)
        self._thread.start()

    def send_block(self, header: BlockHeader, slab: Any) -> None:
        """Queue one block: ``slab`` is a contiguous CPU tensor the caller no longer touches;
        the sender thread fills in ``header.crc``."""
        self._q.put((header, slab))

    def report(self, msg: Message) -> None:
        """Queue a small message (no payload)."""
        self._q.put((msg, None))

    def close(self) -> None:
        """Stop the sender thread after it drains its queue."""
        self._q.put(None)
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        sock = _dealer(self.address, send_hwm=100000)
        next_hello = 0.0
        while True:
            try:
                item = self._q.get(timeout=HELLO_PERIOD_S * 4)
            except queue.Empty:
                item = ()
            now = time.monotonic()
            try:
                if now >= next_hello:
                    sock.send_multipart(encode(replace(self._hello, pid=os.getpid())),
                                        flags=zmq.NOBLOCK)
                    next_hello = now + HELLO_PERIOD_S * 4
                if item is None:
                    break
                if item == ():
                    continue
                header, slab = item
                if slab is None:
                    sock.send_multipart(encode(header), flags=zmq.NOBLOCK)
                    continue
                buf = memoryview(slab.numpy()).cast("B")
                sock.send_multipart(encode(replace(header, crc=block_crc(buf)), buf),
                                    flags=zmq.NOBLOCK, copy=True)
            except zmq.Again:
                pass  # agent gone: the block is dropped (the target will recompute)
            except Exception:
                _log.exception("worker link send")
        sock.close(linger=0)

    def fetch(self, blocks: list[FetchItem],
              timeout_s: float = FETCH_TIMEOUT_S) -> list[tuple[int, int, bytes] | None]:
        """Fetch blocks from the agent's store.

        Returns one ``(fill, crc, data)`` or None (missing) per requested block; all None if the
        agent does not answer within ``timeout_s`` or answers with a malformed reply (the
        caller then lets vLLM recompute those blocks).
        """
        sock = getattr(self._local, "sock", None)
        if sock is None:
            sock = self._local.sock = _dealer(self.address)
        rid = next(self._rids)
        sock.send_multipart(encode(Fetch(rid, tuple(blocks))))
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(timeout=int(left * 1000)):
                # Reset the socket so a late reply cannot be taken for a later fetch's.
                sock.close(linger=0)
                self._local.sock = None
                return [None] * len(blocks)
            frames = sock.recv_multipart()
            try:
                rep = decode(frames[0])
            except MessageError as exc:
                _log.warning("dropped fetch reply: %s", exc)
                continue
            if not isinstance(rep, Fetched) or rep.rid != rid:
                continue
            got = sum(e is not None for e in rep.blocks)
            if len(rep.blocks) != len(blocks) or got != len(frames) - 1:
                _log.warning("fetch reply with %d entries / %d frames for %d blocks",
                             len(rep.blocks), len(frames) - 1, len(blocks))
                return [None] * len(blocks)
            data = iter(frames[1:])  # one data frame per entry that is not None, in order
            return [None if e is None else (e.fill, e.crc, next(data)) for e in rep.blocks]
