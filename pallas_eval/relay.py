"""A delaying HTTP proxy: the extra forwarding hop of a relayed token stream, in the harness.

In the paper's regime every token that an agent relays for another (Detour, or the target's
front while the session is not there yet) crosses one more hop between gNBs, which the paper
measures at about 30 ms (its Figure 1; pallas_eval.emulation.PAPER_HOP_DELAY_S). On loopback
that hop costs nothing, so the replay points the UE's ``origin`` (the old agent's front, which
the new agent relays) at a :class:`DelayProxy` in front of it: every chunk of the response
reaches the relaying agent ``delay_s`` after the old front sent it (a latency, not a rate
limit: chunks keep their spacing). Requests and their bodies are forwarded as they are.

The proxies run on one event loop in a background thread (:class:`ProxyPool`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from pallas_eval.procs import free_port

__all__ = ["DelayProxy", "ProxyPool", "delayed"]

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


async def delayed(chunks, delay_s: float, *, clock=time.monotonic, sleep=asyncio.sleep):
    """Yield every chunk of the async iterator ``chunks`` ``delay_s`` seconds after it arrived
    (each chunk's own arrival; a slow consumer does not add the delay twice)."""
    q: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump():
        try:
            async for c in chunks:
                await q.put((clock(), c))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, in order
            await q.put((clock(), e))
        await q.put((clock(), done))

    task = asyncio.create_task(pump())
    try:
        while True:
            t, c = await q.get()
            wait = t + delay_s - clock()
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
    """A reverse proxy to ``upstream`` (``http://host:port``) adding ``delay_s`` to every
    response chunk (module docstring). ``url`` is where it listens, after :meth:`ProxyPool.add`."""

    def __init__(self, upstream: str, delay_s: float, port: int = 0) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        self.upstream = upstream.rstrip("/")
        self.delay_s = float(delay_s)
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
                async for c in delayed(up.aiter_raw(), self.delay_s):
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

    def add(self, upstream: str, delay_s: float) -> DelayProxy:
        """Start a proxy to ``upstream``; returns once it accepts connections.

        Raises:
            RuntimeError: it did not start within 10 s.
        """
        p = DelayProxy(upstream, delay_s)
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
