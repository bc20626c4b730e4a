"""UE client library for the Pallas session front (agent/frontend.py).

A :class:`UESession` opens a session at one agent, reads its token stream and records when
every token arrived; :meth:`UESession.handover` moves the UE to another agent (the UE's new
serving gNB) and resumes from the first output index not yet received, naming the old agent
as ``origin`` so the new agent can relay it (Detour, or while the commit is in flight).
The record gives SIT and ITL as docs/model.md §7 defines them: measured at the UE side of
the token stream.

Typical use (asyncio)::

    ue = UESession("http://agent-a:8080", ue_id="ue-1")
    await ue.open(prompt_token_ids=ids, max_tokens=200)
    async for rec in ue.tokens():
        if rec.index == 49:
            await ue.handover("http://agent-b:8080")
    print(ue.token_ids, ue.handover_gaps())

Times: ``t`` is ``time.time()`` (Unix seconds, comparable across processes on one host);
``t_mono`` is ``time.perf_counter()`` (for gaps within this process).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from pallas_common.aio import cancel_and_wait
from pallas_common.schemes import SessionState

__all__ = ["TokenRecord", "HandoverRecord", "UESession", "SessionError"]


class SessionError(RuntimeError):
    """The front refused the session or the stream broke in a way that cannot be resumed."""


@dataclass
class TokenRecord:
    """One token as the UE received it.

    Attributes:
        index: output index (0 = first generated token).
        token_id: the token id.
        text: its text, if the agent has a tokenizer.
        t: arrival time at the UE, ``time.time()`` seconds.
        t_mono: arrival time at the UE, ``time.perf_counter()`` seconds.
        agent_id: the agent that served it.
        relayed_by: the agent that relayed it (Detour), or None.
        url: the front URL the UE read it from.
        t_agent: when the token reached the serving agent (the event's ``time``), or None.
    """

    index: int
    token_id: int
    text: str | None
    t: float
    t_mono: float
    agent_id: str | None
    relayed_by: str | None
    url: str
    t_agent: float | None = None


@dataclass
class HandoverRecord:
    """A UE-side handover: when the UE switched fronts and from which index it resumed."""

    from_url: str
    to_url: str
    next_index: int
    t: float
    t_mono: float


@dataclass
class UESession:
    """One UE session, across any number of handovers.

    Args:
        base_url: front URL of the agent the UE starts at, e.g. ``"http://127.0.0.1:8080"``.
        ue_id: the UE's id.
        session_id: resume this session (with its ``token``); at :meth:`open`, a label the
            front puts before the id it assigns.
        token: the session token (the front returns it at :meth:`open`; sent with every later
            call as ``Authorization: Bearer``, at every agent).
        http: an httpx.AsyncClient to share (one per UE is created otherwise).
        follow_moves: when an agent reports the session moved and gives the new agent's URL,
            resume there by itself.
    """

    base_url: str
    ue_id: str = ""
    session_id: str | None = None
    token: str | None = None
    http: httpx.AsyncClient | None = None
    follow_moves: bool = True
    records: list[TokenRecord] = field(default_factory=list)
    handovers: list[HandoverRecord] = field(default_factory=list)
    header: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    finished: bool = False

    def __post_init__(self) -> None:
        self.url = self.base_url.rstrip("/")
        self._own_http = self.http is None
        if self.http is None:
            self.http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
        self._queue: asyncio.Queue = asyncio.Queue()
        self._reader: asyncio.Task | None = None
        self._origin: str | None = None

    # ------------------------------------------------------------------ results
    @property
    def token_ids(self) -> list[int]:
        """Every output token id received, in index order."""
        return [r.token_id for r in self.records]

    @property
    def next_index(self) -> int:
        """The first output index not yet received."""
        return len(self.records)

    def itls(self) -> list[float]:
        """Inter-token latencies at the UE, seconds (len = tokens - 1)."""
        t = [r.t_mono for r in self.records]
        return [b - a for a, b in zip(t, t[1:])]

    def handover_gaps(self) -> list[float]:
        """SIT of each handover (docs/model.md §7): arrival of the first token after the
        switch minus arrival of the last token before it, seconds. A handover after which no
        token arrived is left out."""
        out = []
        for h in self.handovers:
            i = h.next_index
            if 0 < i < len(self.records):
                out.append(self.records[i].t_mono - self.records[i - 1].t_mono)
        return out

    # ------------------------------------------------------------------ streaming
    async def open(self, prompt_token_ids: list[int] | None = None, *, prompt: str | None = None,
                   scheme: str | None = None, **sampling: Any) -> dict[str, Any]:
        """Open the session at ``base_url`` and start receiving its tokens.

        ``sampling``: the front's sampling fields (max_tokens, temperature, top_p, top_k,
        min_tokens, stop_token_ids, ignore_eos, seed). Returns the front's first event (the
        session header). Raises :class:`SessionError` if the front refuses.
        """
        body: dict[str, Any] = {"ue_id": self.ue_id, "stream": True, **sampling}
        if prompt_token_ids is not None:
            body["prompt_token_ids"] = list(prompt_token_ids)
        elif prompt is not None:
            body["prompt"] = prompt
        else:
            raise ValueError("give prompt_token_ids or prompt")
        if self.session_id:
            body["session_id"] = self.session_id
        if scheme:
            body["scheme"] = scheme
        first: asyncio.Future = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read("POST", f"{self.url}/v1/sessions", body, None, first))
        self.header = await first
        self.session_id = self.header["session_id"]
        self.token = self.header.get("session_token")
        return self.header

    async def resume(self, base_url: str | None = None, *, origin: str | None = None) -> None:
        """(Re)connect to ``base_url`` (default: the current front) from :attr:`next_index`."""
        if self.session_id is None:
            raise SessionError("no session to resume: open one first")
        await self._stop_reader()
        if base_url is not None:
            self.url = base_url.rstrip("/")
        params: dict[str, Any] = {"from_index": self.next_index}
        if origin:
            params["origin"] = origin
        self.finished = False
        self.end = None
        self._reader = asyncio.create_task(self._read(
            "GET", f"{self.url}/v1/sessions/{self.session_id}/stream", None, params, None))

    async def handover(self, new_url: str, *, relay: bool = True, origin: str | None = None) -> HandoverRecord:
        """Move the UE to the front at ``new_url``: drop the old stream and resume there.

        With ``relay`` the old front's URL (or ``origin``, e.g. a delaying proxy in front of
        it) is passed as ``origin``: the new agent relays it while it does not hold the
        session. Returns the record of this handover."""
        old = self.url
        rec = HandoverRecord(old, new_url.rstrip("/"), self.next_index, time.time(), time.perf_counter())
        await self._stop_reader()
        rec.next_index = self.next_index  # tokens that arrived while stopping still count
        self.handovers.append(rec)
        await self.resume(new_url, origin=(origin or old) if relay else None)
        return rec

    async def tokens(self) -> AsyncIterator[TokenRecord]:
        """Yield each new token as it arrives until the session ends (across handovers)."""
        while True:
            item = await self._queue.get()
            if item is None:
                if self.finished:
                    return
                continue  # a reader was replaced (handover); keep going
            if isinstance(item, Exception):
                raise item
            yield item

    async def run(self) -> list[int]:
        """Receive until the session ends; returns every token id."""
        async for _ in self.tokens():
            pass
        return self.token_ids

    async def close(self) -> None:
        """Stop reading (the session lives on at the agent) and close an own HTTP client."""
        await self._stop_reader()
        if self._own_http and self.http is not None:
            await self.http.aclose()

    async def _stop_reader(self) -> None:
        task, self._reader = self._reader, None
        await cancel_and_wait(task)

    async def _read(self, method: str, url: str, body: dict | None, params: dict | None,
                    first: asyncio.Future | None) -> None:
        """Read one event stream into :attr:`records`; push tokens to the queue."""
        try:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token and body is None else None
            async with self.http.stream(method, url, json=body, params=params, headers=headers) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")[:500]
                    raise SessionError(f"{method} {url}: {r.status_code} {text}")
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data.strip() == "[DONE]":
                        break
                    ev = json.loads(data)
                    obj = ev.get("object")
                    if obj == "session":
                        if first is not None and not first.done():
                            first.set_result(ev)
                    elif obj == "session.token":
                        self._on_token(ev)
                    elif obj == "session.end":
                        self.end = ev
            end = self.end or {}
            moved_url = end.get("moved_to_url")
            if (SessionState.of(end.get("state") or "") is SessionState.HANDED_OVER and self.follow_moves
                    and moved_url):
                # The agent handed the session over: follow it (the UE's own handover is
                # :meth:`handover`; this covers a UE that stayed on the old front).
                self.handovers.append(HandoverRecord(self.url, moved_url, self.next_index, time.time(),
                                                     time.perf_counter()))
                asyncio.get_running_loop().call_soon(
                    lambda: asyncio.ensure_future(self.resume(moved_url, origin=None)))
                self._queue.put_nowait(None)
                return
            self.finished = True
            self._queue.put_nowait(None)
        except asyncio.CancelledError:
            self._queue.put_nowait(None)
            raise
        except Exception as e:  # noqa: BLE001 - handed to the consumer
            if first is not None and not first.done():
                first.set_exception(e)
            self.finished = True
            self._queue.put_nowait(e if isinstance(e, SessionError) else SessionError(repr(e)))

    def _on_token(self, ev: dict[str, Any]) -> None:
        i = int(ev["index"])
        if i < len(self.records):
            if self.records[i].token_id != ev["token_id"]:
                raise SessionError(f"token {i} differs after resume: {self.records[i].token_id} != {ev['token_id']}")
            return  # duplicate from an overlapping stream
        if i > len(self.records):
            raise SessionError(f"gap in the stream: expected index {len(self.records)}, got {i}")
        rec = TokenRecord(i, int(ev["token_id"]), ev.get("text"), time.time(), time.perf_counter(),
                          ev.get("agent_id"), ev.get("relayed_by"), self.url, ev.get("time"))
        self.records.append(rec)
        self._queue.put_nowait(rec)
