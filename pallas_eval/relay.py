"""A delaying HTTP proxy: the extra backhaul hop of a relayed token stream, in the harness.

In the paper's regime every token that an agent relays for another (Detour, or the target's
front while the session is not there yet) crosses one more backhaul hop between gNBs. On
loopback that hop costs nothing, so the replay points every peer front URL (and the UE's
``origin``) at a :class:`DelayProxy` in front of the real front: each chunk of the response
pays one draw of the hop's per-token cost (:data:`REPLAY_HOP_COST`: a fixed delay, jitter and
stalls, calibrated to the paper's Figure 1) on top of its gap to the previous chunk, so the
relayed stream's inter-token latencies grow as the timing model's do and a chain of relays
(A -> B -> C) pays two hops. Without a cost the proxy adds one fixed latency per chunk and
keeps the chunks' spacing. Requests and their bodies are forwarded as they are.

The hop cost is a law of the hop's position on the path (``timing.HopCost.stall_prob_at``):
each proxy of a stream draws the cost of its own position, so a stream that crosses k proxies
pays one draw at each of the positions 1..k, the sum ``HopCost.sample`` gives over k hops
(docs/model.md section 6.1). The proxies of a replay share one :class:`ProxyPool`, which gives
each session stream its position (:meth:`ProxyPool.open_stream`): a front relays a session by
``GET /v1/sessions/{id}/stream?relay=<its agent id>`` (agent/frontend.py ``_relay``), so a
stream request at a proxy from agent R continues the stream that the proxy in front of R
carries, for the same session, on to R's own requester; it takes that stream's position plus
one, and position 1 when there is none (R streams to the UE itself). Each carried stream
continues at most one other (a stream that is still open but already continued, a UE's old
path during a handover, is not counted twice). Positions so count from the UE's end, the order
in which the requests arrive; the hops' draws are independent, so the total is the same
whichever end counts first. Nothing in agent/ changes: the pool learns which agent each proxy
fronts from :meth:`ProxyPool.name_agents` (unnamed, every stream is at position 1).

The proxies run on one event loop in a background thread (:class:`ProxyPool`).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

import httpx
import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from pallas_common.timing import PAPER_HOP_COST, HopCost
from pallas_eval.procs import free_port

__all__ = ["Carried", "DelayProxy", "ProxyPool", "REPLAY_HOP_COST", "RelayPaths", "delayed", "hop_draw",
           "relay_due"]

#: The replay's hop cost: the compounding fit to Figure 1 (``timing.PAPER_HOP_COST``, the timing
#: model's default; docs/model.md section 6.1), each proxy drawing the hop of its position on the
#: stream's path (module docstring): 12.0 ms on average at the first position, 14 ms at the second.
REPLAY_HOP_COST = PAPER_HOP_COST

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}
#: A front's session stream route (agent/frontend.py): the one request a relay path is made of.
_STREAM_PATH = re.compile(r"^/v1/sessions/([^/]+)/stream$")


@dataclass(eq=False)
class Carried:
    """One session stream a proxy carries (:class:`RelayPaths`): the agent the proxy fronts
    (``upstream_agent``, None if unnamed), the session, the agent it carries the stream to
    (``requester``, the request's ``relay``), its 1-based position on the stream's relay path
    counted from the UE's end, the stream it continues (one position nearer the UE, or None)
    and whether a stream further from the UE continues this one."""

    upstream_agent: str | None
    session: str
    requester: str | None
    position: int
    continues: "Carried | None" = None
    continued: bool = False


class RelayPaths:
    """The session streams the proxies of one pool carry now, and each one's position on its
    relay path (module docstring). Not thread-safe: the pool's event loop alone calls it."""

    def __init__(self) -> None:
        self._open: dict[str, list[Carried]] = {}

    def open(self, upstream_agent: str | None, session: str, requester: str | None) -> Carried:
        """Register a stream of ``session`` that the proxy in front of ``upstream_agent`` carries
        to ``requester``. It continues the newest open stream of the session, not yet continued,
        that a proxy in front of ``requester`` carries: position that one's plus one; else 1."""
        prev = None
        if requester is not None:
            prev = next((c for c in reversed(self._open.get(session, []))
                         if not c.continued and c.upstream_agent == requester), None)
        c = Carried(upstream_agent, session, requester, prev.position + 1 if prev else 1, prev)
        if prev is not None:
            prev.continued = True
        self._open.setdefault(session, []).append(c)
        return c

    def close(self, c: Carried) -> None:
        """The stream ended: forget it; the one it continued may be continued again."""
        mine = self._open.get(c.session, [])
        if c in mine:
            mine.remove(c)
            if not mine:
                del self._open[c.session]
        if c.continues is not None:
            c.continues.continued = False

    def carried(self, session: str) -> list[Carried]:
        """The open streams of ``session``, oldest first."""
        return list(self._open.get(session, []))


def hop_draw(cost: HopCost, rng: np.random.Generator, position: int = 1, hops: int = 1) -> float:
    """One token's cost over ``hops`` hops at positions ``position`` .. ``position + hops - 1``
    of the path, s (``HopCost.sample_at`` each; ``hops`` 0: 0). ValueError for position < 1."""
    return float(sum(cost.sample_at(rng, k, 1)[0] for k in range(position, position + hops)))


def relay_due(last: tuple[float, float] | None, arrival: float, delay_s: float,
              draw: float) -> tuple[float, float]:
    """``(arrival, leaves)`` of a chunk that pays ``draw`` seconds of hop cost, s: the first one
    (``last`` None) leaves ``delay_s + draw`` after it arrived, every later one ``draw`` after
    the previous one left plus its own gap to the previous arrival (:func:`delayed`)."""
    if last is None:
        return arrival, arrival + delay_s + draw
    return arrival, last[1] + (arrival - last[0]) + draw


async def delayed(chunks, delay_s: float, *, cost: HopCost | None = None, hops: int = 1, position: int = 1,
                  rng: np.random.Generator | None = None, clock=time.monotonic, sleep=asyncio.sleep):
    """Yield every chunk of the async iterator ``chunks`` late.

    Without ``cost``: ``delay_s`` after the chunk arrived (a latency: a slow consumer does not
    add the delay twice, chunks keep their spacing). With ``cost``: chunk ``i`` leaves at
    ``out_{i-1} + (arrival_i - arrival_{i-1}) + D_i`` (``out_0 = arrival_0 + delay_s + D_0``),
    ``D_i`` one draw of ``cost`` over ``hops`` hops from the path's ``position``-th on
    (:func:`hop_draw`), s: each gap grows by the hop's per-token cost, as
    ``pallas_common.timing.detour_itl_samples`` models it."""
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
                last = relay_due(last, t, delay_s, hop_draw(cost, rng, position, hops))
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
    ``delay_s`` and, with ``cost``, by ``hops`` hops' per-token cost (:func:`delayed`), the
    hops at the stream's position on its relay path when a pool's :class:`RelayPaths` gives
    one (``paths``; position 1 without). ``agent_id``: the agent whose front ``upstream`` is
    (:meth:`ProxyPool.name_agents`). ``url`` is where it listens, after :meth:`ProxyPool.add`."""

    def __init__(self, upstream: str, delay_s: float, port: int = 0, *, cost: HopCost | None = None,
                 hops: int = 1, seed: int | None = None) -> None:
        if delay_s < 0 or hops < 0:
            raise ValueError(f"delay_s and hops must be >= 0, got {delay_s}, {hops}")
        self.upstream = upstream.rstrip("/")
        self.delay_s = float(delay_s)
        self.cost, self.hops = cost, int(hops)
        self.rng = np.random.default_rng(seed)
        self.agent_id: str | None = None
        self.paths: RelayPaths | None = None
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
        # Registered before the request goes on: the upstream agent's own relay request, which
        # continues this stream, may reach its proxy before this one's answer has begun.
        m = _STREAM_PATH.match(request.url.path) if request.method == "GET" else None
        carried = (self.paths.open(self.agent_id, m.group(1), request.query_params.get("relay"))
                   if m and self.paths is not None else None)
        position = carried.position if carried is not None else 1
        try:
            up = await self.client.send(req, stream=True)
        except BaseException:
            if carried is not None:
                self.paths.close(carried)
            raise
        out_headers = {k: v for k, v in up.headers.items() if k.lower() not in _HOP_HEADERS}

        async def body():
            try:
                async for c in delayed(up.aiter_raw(), self.delay_s, cost=self.cost, hops=self.hops,
                                       position=position, rng=self.rng):
                    yield c
            finally:
                if carried is not None:
                    self.paths.close(carried)
                await up.aclose()
        return StreamingResponse(body(), status_code=up.status_code, headers=out_headers,
                                 media_type=up.headers.get("content-type"))


class ProxyPool:
    """Delay proxies served from one background thread: ``pool.add(upstream, delay_s)`` returns a
    started :class:`DelayProxy`; :meth:`close` stops them all. Use as a context manager. The
    pool's :class:`RelayPaths` (``paths``) gives every session stream its proxies carry its
    position on the relay path (module docstring), once :meth:`name_agents` has said which
    agent each proxy fronts."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="delay-proxies", daemon=True)
        self._thread.start()
        self._servers: list[tuple[DelayProxy, uvicorn.Server, Any]] = []
        self.paths = RelayPaths()

    def name_agents(self, fronts: Mapping[str, str]) -> None:
        """``fronts``: agent id -> its front URL. Each proxy whose upstream is one of them learns
        the agent's id (call before the first relayed stream; later proxies: call again)."""
        by_url = {u.rstrip("/"): a for a, u in fronts.items()}
        for p, _, _ in self._servers:
            p.agent_id = by_url.get(p.upstream, p.agent_id)

    def add(self, upstream: str, delay_s: float, **kw: Any) -> DelayProxy:
        """Start a proxy to ``upstream`` (``kw``: :class:`DelayProxy`'s ``cost``, ``hops``,
        ``seed``); returns once it accepts connections.

        Raises:
            RuntimeError: it did not start within 10 s.
        """
        p = DelayProxy(upstream, delay_s, **kw)
        p.paths = self.paths
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
