"""The peer data plane between agents (PeerTransfer gRPC service, paper §4.3).

- :class:`PeerTransferService`: the target side, a grpc.aio servicer that hands each call to a
  handler (the agent's :class:`agent.migration.target.Target`): Prepare (admission: ModelIdentity and
  free KV memory; starts the prefix warm-up), StreamBlocks (suffix KV blocks, each with its
  CRC-32C; blocks of an old epoch are dropped), Sync (token ids, tail block, remaining sampling
  parameters; the target resumes the request) and Release.
- :class:`PeerClient`: the source side for one peer, with a per-peer token-bucket link-rate
  limit on the block stream (it emulates an inter-gNB backhaul in tests and caps migration
  bandwidth in production) and the measured goodput (PeerTelemetry).
- :class:`TokenBucket`, :func:`identity_mismatch`: pure helpers.

Rates are given in Mbit/s at the edges and converted once to bytes/s (docs/model.md conventions).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import structlog

from pallas_proto import pallas_pb2, pallas_pb2_grpc

from agent.connector.link import block_crc
from agent.wire import Block, decode_block, encode_block
from pallas_common.msglimits import (DEFAULT_MAX_BLOCK_BYTES, DEFAULT_MAX_TOKENS, RpcLimits,
                                     peer_limits)
from pallas_common.tls import peer_identities

log = structlog.get_logger("pallas.agent.transfer")

DEFAULT_LIMITS = peer_limits(DEFAULT_MAX_BLOCK_BYTES, DEFAULT_MAX_TOKENS)
"""PeerTransfer's per-RPC limits before an engine reported its KV geometry (and for tests and
benchmarks): 64 MiB blocks, 131,072-token contexts (pallas_common.msglimits)."""

GRPC_OPTIONS = [("grpc.max_send_message_length", DEFAULT_LIMITS.max_request),
                ("grpc.max_receive_message_length", DEFAULT_LIMITS.max_request)]
"""One flat transport bound at the largest default message, for tests and benchmarks that
open raw channels; the agent's own channels and servers are sized per RPC."""

_PEER_SERVICE = pallas_pb2.DESCRIPTOR.services_by_name["PeerTransfer"].full_name
STREAM_BLOCKS_METHOD = f"/{_PEER_SERVICE}/StreamBlocks"


@dataclass(frozen=True)
class Oversize:
    """A request message larger than its method's limit, in place of the decoded request (it
    is never parsed); the service refuses the call with RESOURCE_EXHAUSTED."""

    method: str
    size: int
    limit: int

    def __str__(self) -> str:
        return f"{self.method} message of {self.size} bytes is over its limit of {self.limit}"


def _bounded(method: str, decode: Callable[[bytes], Any],
             limits: Callable[[], RpcLimits] | None) -> Callable[[bytes], Any]:
    """``decode`` preceded by the method's size check against ``limits()`` (None: no check
    beyond the transport's)."""
    if limits is None:
        return decode

    def decode_bounded(buf: bytes) -> Any:
        limit = limits().request[method]
        if len(buf) > limit:
            return Oversize(method, len(buf), limit)
        return decode(buf)
    return decode_bounded


async def _refuse_oversize(request: Any, context: Any) -> None:
    """Abort the call with RESOURCE_EXHAUSTED if ``request`` is an :class:`Oversize`."""
    if isinstance(request, Oversize):
        log.warning("message_over_limit", method=request.method, size=request.size,
                    limit=request.limit)
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(request))


CALLER: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar(
    "pallas_peer_caller", default=None)
"""The verified identities (certificate CN and SANs) of the peer whose PeerTransfer call is being
handled, set by :class:`PeerTransferService` for the handler's call (None: plaintext, no
identity). The target binds an attempt to the peer that prepared it with it (issue 16)."""


CALL_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "pallas_peer_call_deadline", default=None)
"""The gRPC deadline of the PeerTransfer call being handled, as a ``time.monotonic()`` instant
(None: the caller set none). The target's Sync tells a caller that gave up at its deadline (it
serves on) from one that went away before it (its agent died) with it."""


def _set_deadline(context: Any) -> None:
    """Set :data:`CALL_DEADLINE` for the current call from ``context.time_remaining()``, s."""
    try:
        left = context.time_remaining() if context is not None else None
    except Exception:  # noqa: BLE001 - tests' fakes
        left = None
    CALL_DEADLINE.set(None if left is None else time.monotonic() + float(left))


def _set_caller(context: Any) -> None:
    """Set :data:`CALLER` for the current call from its gRPC auth context (None if none)."""
    try:
        ids = peer_identities(context.auth_context()) if context is not None else frozenset()
    except Exception:  # noqa: BLE001 - a context without auth data (tests' fakes)
        ids = frozenset()
    CALLER.set(ids or None)


def add_peer_transfer_to_server(servicer: pallas_pb2_grpc.PeerTransferServicer,
                                server: grpc.aio.Server,
                                limits: Callable[[], RpcLimits] | None = None) -> None:
    """Register the PeerTransfer service with StreamBlocks read by :func:`agent.wire.decode_block`.

    The servicer's StreamBlocks gets :class:`agent.wire.Block` items (payload as a memoryview of
    the received message) instead of parsed ``KVBlock`` messages; the wire format is the same.
    ``limits``: the per-RPC message limits in force (called at each message, so they follow
    the engine's KV geometry once it is known); a larger request is handed to the servicer as
    an :class:`Oversize`, which refuses it, and is never parsed.
    """
    m = pallas_pb2
    handlers = {
        "StreamBlocks": grpc.stream_unary_rpc_method_handler(
            servicer.StreamBlocks, request_deserializer=_bounded("StreamBlocks", decode_block, limits),
            response_serializer=m.StreamAck.SerializeToString)}
    for name, req, rep in (("Prepare", m.PrepareRequest, m.PrepareReply),
                           ("Sync", m.SyncRequest, m.SyncReply),
                           ("Release", m.ReleaseRequest, m.ReleaseReply),
                           ("Progress", m.ProgressRequest, m.ProgressReply),
                           ("Renew", m.RenewRequest, m.RenewReply)):
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name), request_deserializer=_bounded(name, req.FromString, limits),
            response_serializer=rep.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_PEER_SERVICE,
                                                                          handlers),))


def mbit_to_bytes_per_s(mbit_per_s: float) -> float:
    """Mbit/s (10^6 bit/s) -> bytes/s."""
    return float(mbit_per_s) * 1e6 / 8.0


class TokenBucket:
    """Token-bucket rate limiter in bytes.

    Args:
        rate: sustained rate, bytes/s; None or <= 0 means unlimited.
        burst: bucket depth, bytes (default: 50 ms at ``rate``). A message is released when
            the link would have carried its last byte: it takes its size from the bucket, and
            a bucket driven negative (debt) is waited out before it goes, so an isolated block
            pays its serialization time (size / rate beyond the burst) as on a real link, and
            the long-run rate holds for any message size.
        clock: monotonic clock in seconds.
    """

    def __init__(self, rate: float | None, burst: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = float(rate) if rate and rate > 0 else None
        self.burst = float(burst) if burst else (self.rate * 0.05 if self.rate else 0.0)
        self._clock = clock
        self._level = self.burst
        self._t = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        if self.rate is not None:
            self._level = min(self.burst, self._level + (now - self._t) * self.rate)
        self._t = now

    def reserve(self, nbytes: int) -> float:
        """Take ``nbytes`` now and return how long (s) the caller must wait before sending."""
        if self.rate is None:
            return 0.0
        self._refill()
        self._level -= float(nbytes)
        return 0.0 if self._level >= 0 else -self._level / self.rate

    async def acquire(self, nbytes: int) -> None:
        """Wait until ``nbytes`` may be sent under the rate limit."""
        if self.rate is None:
            return
        async with self._lock:
            wait = self.reserve(nbytes)
            if wait > 0:
                await asyncio.sleep(wait)


IDENTITY_FIELDS = ("model", "weights_digest", "dtype", "kv_cache_dtype", "block_size", "backend",
                   "kv_bytes_per_token", "num_layers", "block_bytes")


def identity_mismatch(a: pallas_pb2.ModelIdentity, b: pallas_pb2.ModelIdentity) -> str | None:
    """None if KV blocks may move between servers ``a`` and ``b``, else the first differing field.

    Every field must be equal: the same weights (digest), activation and KV dtype, block size,
    attention backend/ISA (the block layout is backend-specific, docs/vllm.md §6.2) and
    block geometry.
    """
    for f in IDENTITY_FIELDS:
        va, vb = getattr(a, f), getattr(b, f)
        if va != vb:
            return f"{f}: {va!r} != {vb!r}"
    return None


class PeerHandler(Protocol):
    """What the PeerTransfer service delegates to (implemented by the migration engine)."""

    async def on_prepare(self, req: pallas_pb2.PrepareRequest) -> pallas_pb2.PrepareReply: ...
    def on_block(self, blk: Block | pallas_pb2.KVBlock, crc_ok: bool | None = None) -> str: ...
    async def on_sync(self, req: pallas_pb2.SyncRequest) -> pallas_pb2.SyncReply: ...
    async def on_release(self, req: pallas_pb2.ReleaseRequest) -> pallas_pb2.ReleaseReply: ...
    async def on_progress(self, req: pallas_pb2.ProgressRequest) -> pallas_pb2.ProgressReply: ...
    async def on_renew(self, req: pallas_pb2.RenewRequest) -> pallas_pb2.RenewReply: ...


class PeerTransferService(pallas_pb2_grpc.PeerTransferServicer):
    """Target side of the peer data plane; every call is delegated to ``handler``.

    Each block's CRC-32C is checked as it arrives, on the event loop (a thread pool cost more
    CPU than the checksum: receiver CPU per 786 KB block on the 2-core dev host +230 us inline,
    +660 us through a pool). The handler gets each block in order with the verdict; a handler
    exception becomes STATUS_ERROR (logged), the service runs on.
    """

    def __init__(self, handler: PeerHandler) -> None:
        self.handler = handler

    async def _unary(self, name: str, request: Any, context: Any, reply: Any) -> Any:
        """One unary call: caller identity (and for Sync the deadline) set, an :class:`Oversize`
        refused, then ``handler.on_<name>``; its exception becomes ``reply`` with STATUS_ERROR."""
        _set_caller(context)
        if name == "sync":
            _set_deadline(context)
        await _refuse_oversize(request, context)
        try:
            return await getattr(self.handler, f"on_{name}")(request)
        except Exception as exc:
            log.exception(f"{name}_failed", session=request.session_id, epoch=request.epoch)
            if reply is pallas_pb2.ProgressReply:  # it has no message field
                return reply(status=pallas_pb2.STATUS_ERROR)
            return reply(status=pallas_pb2.STATUS_ERROR, message=repr(exc))

    async def Prepare(self, request, context):  # noqa: N802 (gRPC names)
        return await self._unary("prepare", request, context, pallas_pb2.PrepareReply)

    async def StreamBlocks(self, request_iterator, context):  # noqa: N802
        ok = bad = nbytes = 0
        sid, epoch = "", 0
        _set_caller(context)
        async for blk in request_iterator:
            await _refuse_oversize(blk, context)
            sid, epoch = blk.session_id, blk.epoch
            try:
                verdict = self.handler.on_block(blk, block_crc(blk.data) == blk.checksum)
            except Exception:
                log.exception("block_failed", session=sid, epoch=epoch, block=blk.block_index)
                verdict = "error"
            if verdict == "ok":
                ok, nbytes = ok + 1, nbytes + len(blk.data)
            else:
                bad += 1
        return pallas_pb2.StreamAck(session_id=sid, epoch=epoch, blocks_received=ok,
                                    bytes_received=nbytes, blocks_rejected=bad)

    async def Sync(self, request, context):  # noqa: N802
        return await self._unary("sync", request, context, pallas_pb2.SyncReply)

    async def Release(self, request, context):  # noqa: N802
        return await self._unary("release", request, context, pallas_pb2.ReleaseReply)

    async def Progress(self, request, context):  # noqa: N802
        return await self._unary("progress", request, context, pallas_pb2.ProgressReply)

    async def Renew(self, request, context):  # noqa: N802
        return await self._unary("renew", request, context, pallas_pb2.RenewReply)


class BlockStream:
    """One StreamBlocks call (one session, one epoch), fed from a queue, rate-limited.

    :meth:`send` never blocks the caller (the queue is unbounded; KV blocks of one session are
    bounded by its length). :meth:`finish` ends the stream and returns the target's StreamAck;
    :meth:`abort` cancels it. ``task`` ends with the call; ``error`` holds a failure.
    """

    def __init__(self, client: "PeerClient", session_id: str, epoch: int) -> None:
        self.client = client
        self.session_id = session_id
        self.epoch = epoch
        self._q: asyncio.Queue = asyncio.Queue()
        self.sent_indices: list[int] = []
        self.error: BaseException | None = None
        self.ack: pallas_pb2.StreamAck | None = None
        self._closed = False
        self._call = client.stream_blocks(self._gen())
        self.task = asyncio.get_running_loop().create_task(self._run(),
                                                           name=f"stream-{session_id}-{epoch}")

    async def _gen(self) -> AsyncIterator[Block | pallas_pb2.KVBlock]:
        while True:
            blk = await self._q.get()
            if blk is None:
                return
            # B counts the time spent sending (the link limit's wait included), never the
            # wait for the next block to exist: it starts once a block is here.
            t0 = time.monotonic()
            await self.client.bucket.acquire(len(blk.data))
            yield blk
            self.sent_indices.append(blk.block_index)
            self.client._account(len(blk.data), t0)

    async def _run(self) -> pallas_pb2.StreamAck | None:
        try:
            self.ack = await self._call
            return self.ack
        except asyncio.CancelledError:
            self._call.cancel()
            raise
        except Exception as exc:  # peer gone, deadline, ...
            self.error = exc
            log.warning("stream_failed", session=self.session_id, epoch=self.epoch,
                        peer=self.client.address, error=repr(exc))
            return None
        finally:
            # End the request generator too (dropping what a failed call can no longer send):
            # gRPC's task that drains it would otherwise wait on the queue until the event loop
            # closes ("Task was destroyed but it is pending").
            self._closed = True
            if self.ack is None:
                while not self._q.empty():
                    self._q.get_nowait()
            self._q.put_nowait(None)

    def send(self, blk: Block | pallas_pb2.KVBlock) -> bool:
        """Queue a block; False if the stream is closed or failed.

        A :class:`agent.wire.Block` goes out with one copy of its payload (see agent/wire.py).
        """
        if self._closed or self.task.done():
            return False
        self._q.put_nowait(blk)
        return True

    @property
    def queued(self) -> int:
        """Blocks queued and not yet handed to gRPC."""
        return self._q.qsize()

    async def finish(self, timeout_s: float | None = None) -> pallas_pb2.StreamAck | None:
        """Close the stream after the queued blocks and await the ack (None on failure)."""
        if not self._closed:
            self._closed = True
            self._q.put_nowait(None)
        try:
            return await asyncio.wait_for(asyncio.shield(self.task), timeout_s)
        except asyncio.TimeoutError:
            return None

    def abort(self) -> None:
        """Cancel the stream now; queued blocks are dropped."""
        self._closed = True
        while not self._q.empty():
            self._q.get_nowait()
        self._q.put_nowait(None)
        if not self.task.done():
            self._call.cancel()
            self.task.cancel()


def _plaintext(address: str, options: list) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=options)


class PeerClient:
    """Source-side client of one peer's PeerTransfer service.

    Args:
        address: ``host:port`` of the peer's PeerTransfer service.
        link_rate_mbps: token-bucket limit on this peer's block streams, Mbit/s (None =
            unlimited); shared by every stream to this peer.
        timeout_s: deadline of unary calls, seconds.
        channel_factory: ``(address, options) -> grpc.aio channel`` (default plaintext); mutual
            TLS: ``pallas_common.tls.open_channel(address, watcher, aio=True, options=options)``.
        limits: the per-RPC message limits of the channel (default :data:`DEFAULT_LIMITS`);
            gRPC refuses a larger request before it is sent, and a larger reply.
    """

    def __init__(self, address: str, *, link_rate_mbps: float | None = None,
                 timeout_s: float = 30.0, channel_factory: Callable | None = None,
                 limits: RpcLimits | None = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.limits = limits or DEFAULT_LIMITS
        self.bucket = TokenBucket(mbit_to_bytes_per_s(link_rate_mbps) if link_rate_mbps else None)
        self.channel = (channel_factory or _plaintext)(address, self.limits.channel_options())
        self.stub = pallas_pb2_grpc.PeerTransferStub(self.channel)
        # StreamBlocks through agent.wire: the same KVBlock bytes without protobuf's copies.
        self.stream_blocks = self.channel.stream_unary(
            STREAM_BLOCKS_METHOD, request_serializer=encode_block,
            response_deserializer=pallas_pb2.StreamAck.FromString)
        self.bytes_sent = 0  # KV bytes handed to gRPC for this peer so far
        # EWMA (weight 0.3 newest) of the block-stream goodput to this peer, bytes/s, and the
        # time.time() of its last real measurement
        self.goodput_bytes_per_s = 0.0
        self.measured_at = 0.0

    def _account(self, nbytes: int, t0: float) -> None:
        """One block of ``nbytes`` handed to gRPC, its sending started at ``t0`` (monotonic):
        it was sent at nbytes / (now - t0); gRPC pulls the next block only when the transport
        took this one, so the interval covers sending and excludes waiting for blocks."""
        now = time.monotonic()
        self.bytes_sent += nbytes
        if now > t0:
            rate, ewma = nbytes / (now - t0), self.goodput_bytes_per_s
            self.goodput_bytes_per_s = rate if ewma == 0 else 0.7 * ewma + 0.3 * rate
            self.measured_at = time.time()

    def telemetry(self, agent_id: str = "") -> pallas_pb2.PeerTelemetry:
        """PeerTelemetry for the Telemetry stream."""
        return pallas_pb2.PeerTelemetry(agent_id=agent_id, goodput_bytes_per_s=self.goodput_bytes_per_s,
                                        bytes_sent=self.bytes_sent, measured_at=self.measured_at)

    async def prepare(self, req: pallas_pb2.PrepareRequest) -> pallas_pb2.PrepareReply:
        """Prepare (admission + prefix warm-up start). Raises grpc.aio.AioRpcError."""
        return await self.stub.Prepare(req, timeout=self.timeout_s)

    async def sync(self, req: pallas_pb2.SyncRequest,
                   timeout_s: float | None = None) -> pallas_pb2.SyncReply:
        """Sync (the target resumes the request). Raises grpc.aio.AioRpcError."""
        return await self.stub.Sync(req, timeout=timeout_s or self.timeout_s)

    async def progress(self, req: pallas_pb2.ProgressRequest,
                       timeout_s: float | None = None) -> pallas_pb2.ProgressReply:
        """Progress of a prepared attempt at the peer. Raises grpc.aio.AioRpcError."""
        return await self.stub.Progress(req, timeout=timeout_s or self.timeout_s)

    async def renew(self, req: pallas_pb2.RenewRequest,
                    timeout_s: float | None = None) -> pallas_pb2.RenewReply:
        """Renew the lease of a prepared attempt at the peer. Raises grpc.aio.AioRpcError."""
        return await self.stub.Renew(req, timeout=timeout_s or self.timeout_s)

    async def release(self, req: pallas_pb2.ReleaseRequest,
                      timeout_s: float | None = None) -> pallas_pb2.ReleaseReply:
        """Release everything the peer holds for (session, epoch). Raises grpc.aio.AioRpcError."""
        return await self.stub.Release(req, timeout=timeout_s or self.timeout_s)

    def open_stream(self, session_id: str, epoch: int) -> BlockStream:
        """Start a StreamBlocks call for (session, epoch)."""
        return BlockStream(self, session_id, epoch)

    async def close(self) -> None:
        """Close the channel (open streams fail)."""
        await self.channel.close()


class PeerPool:
    """One :class:`PeerClient` per peer (address and agent id, so the link-rate limit is per
    peer, and an address named with another id gets its own channel); ``channel_factory`` as
    :class:`PeerClient`'s; ``limits()``: the message limits of a new client's channel (the
    agent's, from its engine's KV geometry; default :data:`DEFAULT_LIMITS`)."""

    def __init__(self, *, link_rate_mbps: float | None = None, timeout_s: float = 30.0,
                 channel_factory: Callable | None = None,
                 limits: Callable[[], RpcLimits] | None = None) -> None:
        self.channel_factory = channel_factory
        self.limits = limits or (lambda: DEFAULT_LIMITS)
        self.link_rate_mbps = link_rate_mbps
        self.timeout_s = timeout_s
        self._clients: dict[tuple[str, str], PeerClient] = {}

    def get(self, endpoint: pallas_pb2.PeerEndpoint) -> PeerClient:
        """The client for ``endpoint`` (created on first use)."""
        key = (endpoint.address, endpoint.agent_id)
        c = self._clients.get(key)
        if c is None:
            c = self._clients[key] = PeerClient(
                endpoint.address, link_rate_mbps=self.link_rate_mbps, timeout_s=self.timeout_s,
                channel_factory=self._factory(endpoint), limits=self.limits())
        return c

    def _factory(self, endpoint: pallas_pb2.PeerEndpoint) -> Callable | None:
        """The channel factory of a new client for ``endpoint``."""
        return self.channel_factory

    def telemetry(self) -> list[pallas_pb2.PeerTelemetry]:
        """PeerTelemetry of every peer contacted so far (named by its id, else its address)."""
        return [c.telemetry(aid or addr) for (addr, aid), c in self._clients.items()]

    async def close(self) -> None:
        """Close every channel."""
        for c in self._clients.values():
            await c.close()
        self._clients.clear()


async def serve_peer_transfer(handler: PeerHandler, address: str = "127.0.0.1:0",
                              credentials: grpc.ServerCredentials | None = None,
                              interceptors: tuple = (),
                              limits: Callable[[], RpcLimits] | None = None,
                              transport: RpcLimits | None = None) -> tuple[grpc.aio.Server, str]:
    """Start a grpc.aio server with the PeerTransfer service.

    ``credentials``: TLS server credentials
    (``pallas_common.tls.server_credentials``; None: plaintext); ``interceptors``: grpc.aio
    server interceptors (``pallas_common.tls.AuthorizationInterceptor``). ``limits()``: the
    per-RPC request limits in force (default :data:`DEFAULT_LIMITS`); ``transport``: the limits
    the server's fixed transport bounds are set from (default: ``limits()`` now), at least as
    large as any ``limits()`` will return. Returns the started server and its bound
    ``host:port``.
    """
    limits = limits or (lambda: DEFAULT_LIMITS)
    server = grpc.aio.server(options=(transport or limits()).server_options(),
                             interceptors=list(interceptors))
    add_peer_transfer_to_server(PeerTransferService(handler), server, limits)
    host = address.rsplit(":", 1)[0]
    port = (server.add_secure_port(address, credentials) if credentials is not None
            else server.add_insecure_port(address))
    await server.start()
    return server, f"{host}:{port}"
