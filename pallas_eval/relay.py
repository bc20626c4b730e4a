"""A delaying HTTP proxy: the extra backhaul hop of a relayed token stream, in the harness.

In the paper's regime every token that an agent relays for another (Detour, or the target's
front while the session is not there yet) crosses one more backhaul hop between gNBs. On
loopback that hop costs nothing, so the replay points every peer front URL (and the UE's
``origin``) at a :class:`DelayProxy` in front of the real front: each chunk of the response
pays one draw of the hop's per-token cost (:data:`REPLAY_HOP_COST`: a fixed delay, jitter and
rare stalls, calibrated to the paper's Figure 1) on top of its gap to the previous chunk, so the relayed stream's inter-token latencies grow as the timing model's do and a chain
of relays (A -> B -> C) pays two hops. Without a cost the proxy adds one fixed latency per
chunk and keeps the chunks' spacing. Requests and their bodies are forwarded as they are.

The proxies run on one event loop in a background thread (:class:`ProxyPool`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from pallas_common.timing import PAPER_HOP_COST_LINEAR, HopCost
from pallas_eval.procs import free_port

__all__ = ["DelayProxy", "ProxyPool", "REPLAY_HOP_COST", "delayed", "relay_due"]

#: The replay's per-proxy hop cost: the linear fit to Figure 1 (``timing.PAPER_HOP_COST_LINEAR``,
#: 15.9 ms a hop; docs/model.md section 6.1). A proxy does not know how many relays the stream
#: already crossed, so every proxy draws the same hop and a chain of two pays two such draws: the
#: linear law, whose two draws give 1.3-2.0% of gaps over 100 ms at 28-48 ms decode steps against
#: Figure 1's 1.74-1.93% at two hops. The compounding fit (``timing.PAPER_HOP_COST``) is a law of
#: the hop's position on the path; two draws of its first hop would give 0.5-0.65%.
REPLAY_HOP_COST = PAPER_HOP_COST_LINEAR

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


def relay_due(last: tuple[float, float] | None, arrival: float, delay_s: float,
              draw: float) -> tuple[float, float]:
    """``(arrival, leaves)`` of a chunk that pays ``draw`` seconds of hop cost, s: the first one
    (``last`` None) leaves ``delay_s + draw`` after it arrived, every later one ``draw`` after
    the previous one left plus its own gap to the previous arrival (:func:`delayed`)."""
    if last is None:
        return arrival, arrival + delay_s + draw
    return arrival, last[1] + (arrival - last[0]) + draw


async def delayed(chunks, delay_s: float, *, cost: HopCost | None = None, hops: int = 1,
                  rng: np.random.Generator | None = None, clock=time.monotonic, sleep=asyncio.sleep):
    """Yield every chunk of the async iterator ``chunks`` late.

    Without ``cost``: ``delay_s`` after the chunk arrived (a latency: a slow consumer does not
    add the delay twice, chunks keep their spacing). With ``cost``: chunk ``i`` leaves at
    ``out_{i-1} + (arrival_i - arrival_{i-1}) + D_i`` (``out_0 = arrival_0 + delay_s + D_0``),
    ``D_i`` one draw of ``cost`` over ``hops`` hops, s: each gap grows by the hop's per-token
    cost, as ``pallas_common.timing.detour_itl_samples`` models it."""
    q: asyncio.Queue = asyncio.Queue()
    done = object()
    rng = rng if rng is not None else np.random.default_rng()

    async def pump():
        try:
            async for c in chunks:
                await q.put((clock(), c))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, in order
            await q.put((clock(), e))
        await q.put((clock(), done))

    task = asyncio.create_task(pump())
    last: tuple[float, float] | None = None
    try:
        while True:
            t, c = await q.get()
            if cost is None or c is done or isinstance(c, Exception):
                due = t + delay_s
            else:
                last = relay_due(last, t, delay_s, float(cost.sample(rng, hops)))
                due = last[1]
            wait = due - clock()
            if wait > 0:
                await sleep(wait)
            if c is done:
                return
            if isinstance(c, Exception):
                raise c
            yield c
    finally:
        task.cancel()


class DelayProxy:
    """A reverse proxy to ``upstream`` (``http://host:port``) delaying every response chunk by
    ``delay_s`` and, with ``cost``, by ``hops`` hops' per-token cost (:func:`delayed`). ``url`` is where it listens, after :meth:`ProxyPool.add`."""

    def __init__(self, upstream: str, delay_s: float, port: int = 0, *, cost: HopCost | None = None,
                 hops: int = 1, seed: int | None = None) -> None:
        if delay_s < 0 or hops < 0:
            raise ValueError(f"delay_s and hops must be >= 0, got {delay_s}, {hops}")
        self.upstream = upstream.rstrip("/")
        self.delay_s = float(delay_s)
        self.cost, self.hops = cost, int(hops)
        self.rng = np.random.default_rng(seed)
        self.port = port or free_port()
        self.client: httpx.AsyncClient | None = None
        self.app = Starlette(routes=[Route("/{path:path}", self._forward,
                                           methods=["GET", "POST", "DELETE", "PUT", "PATCH"])])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _forward(self, request: Request) -> Response:
        if self.client is None:
            self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        req = self.client.build_request(request.method, self.upstream + request.url.path,
                                        params=request.url.query or None, headers=headers,
                                        content=await request.body())
        up = await self.client.send(req, stream=True)
        out_headers = {k: v for k, v in up.headers.items() if k.lower() not in _HOP_HEADERS}

        async def body():
            try:
                async for c in delayed(up.aiter_raw(), self.delay_s, cost=self.cost, hops=self.hops,
                                         rng=self.rng):
                    yield c
            finally:
                await up.aclose()
        return StreamingResponse(body(), status_code=up.status_code, headers=out_headers,
                                 media_type=up.headers.get("content-type"))


class ProxyPool:
    """Delay proxies served from one background thread: ``pool.add(upstream, delay_s)`` returns a
    started :class:`DelayProxy`; :meth:`close` stops them all. Use as a context manager."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="delay-proxies", daemon=True)
        self._thread.start()
        self._servers: list[tuple[DelayProxy, uvicorn.Server, Any]] = []

    def add(self, upstream: str, delay_s: float, **kw: Any) -> DelayProxy:
        """Start a proxy to ``upstream`` (``kw``: :class:`DelayProxy`'s ``cost``, ``hops``,
        ``seed``); returns once it accepts connections.

        Raises:
            RuntimeError: it did not start within 10 s.
        """
        p = DelayProxy(upstream, delay_s, **kw)
        srv = uvicorn.Server(uvicorn.Config(p.app, host="127.0.0.1", port=p.port, log_level="warning",
                                            access_log=False, lifespan="off"))
        fut = asyncio.run_coroutine_threadsafe(srv.serve(), self.loop)
        deadline = time.monotonic() + 10
        while not srv.started:
            if fut.done():
                fut.result()
            if time.monotonic() > deadline:
                raise RuntimeError(f"delay proxy to {upstream} did not start")
            time.sleep(0.02)
        self._servers.append((p, srv, fut))
        return p

    def close(self) -> None:
        """Stop every proxy and the thread."""
        for _, srv, _ in self._servers:
            srv.should_exit = True
        for p, _, fut in self._servers:
            try:
                fut.result(timeout=5)
            except Exception:  # noqa: BLE001 - shutting down
                pass
            if p.client is not None:
                asyncio.run_coroutine_threadsafe(p.client.aclose(), self.loop).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self._servers.clear()

    def __enter__(self) -> "ProxyPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
