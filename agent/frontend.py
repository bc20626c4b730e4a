"""The UE-facing session front of an agent: an HTTP API modelled on vLLM's OpenAI completions.

A UE opens a session at the agent of its serving gNB and receives its tokens as a stream of
server-sent events (``data: {json}\\n\\n`` lines ending with ``data: [DONE]``, as OpenAI
streaming does), one event per token with the token's output index. The session lives on at
the agent when the UE's stream closes (a handover cuts it): the UE resumes it, at whichever
agent it reaches, from the first output index it has not received. After a commit the new
agent serves the session from its own vLLM; under Detour (or while a commit is still in
flight) the new agent relays the old agent's stream, one extra hop per token (paper section
2.2, "Source-side retention").

Routes (JSON bodies; every field of the open request except the prompt is optional):

``POST /v1/sessions`` open a session. Body::

    {"ue_id": "ue-7", "session_id": "optional-own-id",
     "prompt": "text" | [token ids],  "prompt_token_ids": [token ids]   (either one),
     "max_tokens": 128, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_tokens": 0,
     "stop_token_ids": [], "ignore_eos": false, "seed": null,
     "scheme": "pallas" | "full-copy" | "recomputation" | "ctho" | "detour" | "no-rc" | "no-sm",
     "stream": true}

  With ``"stream": true`` (default) the answer is the event stream below, starting at index 0;
  with ``false`` it is the session object (``GET /v1/sessions/{id}``) and the UE streams with
  the resume route. Errors: 400 (bad body; a text prompt without a tokenizer), 409 (the
  session id exists), 503 (the engine refused).

``GET /v1/sessions/{id}/stream?from_index=N&origin=URL`` resume (or first stream) from output
  index N (default 0). ``origin``: the front URL of the agent the UE streamed from before the
  handover; if this agent does not (yet) serve the session it relays ``origin``'s stream until
  the session arrives here. 404 if neither this agent nor ``origin`` knows the session within
  ``resume_wait_s``.

``GET /v1/sessions/{id}`` the session object::

    {"session_id", "ue_id", "agent_id", "state", "prompt_tokens", "output_tokens",
     "max_tokens", "finish_reason", "epoch", "scheme", "resumed_from", "decode_rate",
     "moved_to"}

  With ``?include_tokens=true`` it also carries ``output_token_ids`` and ``token_times`` (when
  each output token reached this agent; tokens copied in at a resume carry the resume time).

``GET /v1/sessions`` ``{"sessions": [session objects]}``. ``DELETE /v1/sessions/{id}`` stops
the session here (``{"session_id", "state"}``). ``GET /health`` ``{"status": "ok",
"agent_id"}``. ``GET /metrics`` Prometheus text.

Event stream (each line ``data: <json>``, then a blank line)::

    {"object": "session", "session_id", "ue_id", "agent_id", "prompt_tokens", "max_tokens",
     "from_index", "scheme"}                                   first event
    {"object": "session.token", "session_id", "index", "token_id", "text"?, "time",
     "agent_id", "relayed_by"?}                                one per token
    {"object": "session.end", "session_id", "next_index", "state", "finish_reason",
     "moved_to"?, "moved_to_url"?, "agent_id"}                 last event
    [DONE]

``index`` is the output index (0 = first generated token); ``time`` is when the token reached
the serving agent (Unix seconds); ``text`` appears when the agent has a tokenizer;
``agent_id`` is the agent that served the token (the origin, when relayed) and ``relayed_by``
the agent that relayed it. When the session is handed over from an agent while a UE streams it
there, that agent's stream goes on by relaying the new holder (whose front it knows from its
directory, ``--peer-front``): the UE keeps receiving in its old cell and moves when its own
handover comes. A stream ends with ``state`` ``"handed_over"`` and ``moved_to`` (the new
holder's agent id; ``moved_to_url`` when known) only where the new holder's front is unknown, or
when the stream is itself relayed by another agent: resume there from ``next_index``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agent.obs import RELAYED_TOKENS, SESSIONS, get_logger
from pallas_common.schemes import scheme_name, scheme_value
from agent.session import SamplingSpec, Session, SessionState, new_session_id
from pallas_common.aio import cancel_and_wait

__all__ = ["SessionFront", "sse", "SAMPLING_FIELDS"]

_log = get_logger("pallas.agent.front")

SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_tokens",
                   "stop_token_ids", "ignore_eos", "seed")
# States in which a session at this agent produces (or has produced) its own tokens.
_LOCAL_STATES = {SessionState.SERVING, SessionState.MIGRATING, SessionState.COMMITTING,
                 SessionState.RESUMED, SessionState.FINISHED, SessionState.FAILED,
                 SessionState.HANDED_OVER}


def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as JSON (or the literal ``[DONE]``)."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _state(s: Session) -> str:
    return getattr(s.state, "value", str(s.state))


def _moved_to(s: Session) -> str | None:
    """The agent a handed-over session went to (agent id, else the target's peer address)."""
    ho = s.handover
    return (ho.agent_id or ho.target) if ho is not None else None


class SessionFront:
    """The UE front of one agent (a FastAPI app; serve it with uvicorn).

    Args:
        store: the agent's :class:`agent.session.SessionStore` (or anything with
            ``get``/``add``/``__iter__``).
        engine: starts a session's generation: ``engine.start(session)`` and stops it with
            ``await engine.abort(session)`` (:class:`agent.session.Engine`).
        agent_id: this agent's id.
        tokenizer: optional, with ``encode(text) -> list[int]`` and ``decode(ids) -> str``.
        on_open: ``on_open(session, scheme_value_or_None)`` after a session opens (the agent
            pins the session's scheme in its scheme runner).
        directory: agent id -> front URL of other agents (fills ``moved_to_url``).
        resume_wait_s: how long a resume waits for a session that is not here yet.
        model: model name reported in the session object.
    """

    def __init__(
        self,
        store: Any,
        engine: Any,
        *,
        agent_id: str,
        tokenizer: Any = None,
        on_open: Callable[[Session, int | None], None] | None = None,
        directory: dict[str, str] | None = None,
        resume_wait_s: float = 30.0,
        scheme_of: Callable[[str], int] | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.store = store
        self.engine = engine
        self.agent_id = agent_id
        self.tokenizer = tokenizer
        self.on_open = on_open
        self.directory = dict(directory or {})
        self.resume_wait_s = resume_wait_s
        self.scheme_of = scheme_of
        # Created now, not at the first relay: building its TLS context blocks for ~0.3 s.
        self._http = http or httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))
        self.app = self._build_app()

    # ------------------------------------------------------------------ helpers
    @property
    def http(self) -> httpx.AsyncClient:
        """HTTP client for relaying other agents' streams."""
        return self._http

    async def aclose(self) -> None:
        """Close the relay HTTP client."""
        if self._http is not None:
            await self._http.aclose()

    def session_json(self, s: Session) -> dict[str, Any]:
        """The session object of ``GET /v1/sessions/{id}``."""
        moved = _moved_to(s) if s.state == SessionState.HANDED_OVER else None
        scheme = self.scheme_of(s.session_id) if self.scheme_of else 0
        return {
            "session_id": s.session_id, "ue_id": s.ue_id, "agent_id": self.agent_id,
            "state": _state(s), "prompt_tokens": len(s.prompt_token_ids),
            "output_tokens": len(s.output_token_ids), "max_tokens": s.sampling.max_tokens,
            "finish_reason": s.finish_reason, "epoch": s.epoch,
            "scheme": scheme_name(scheme) if scheme else None, "resumed_from": s.resumed_from,
            "decode_rate": s.decode_rate(), "moved_to": moved,
        }

    def _text(self, tok: int) -> str | None:
        if self.tokenizer is None:
            return None
        try:
            return self.tokenizer.decode([tok])
        except Exception:  # noqa: BLE001 - a token without text still streams
            return None

    def _update_gauge(self) -> None:
        counts: dict[str, int] = {}
        for s in self.store:
            counts[_state(s)] = counts.get(_state(s), 0) + 1
        for st in SessionState:
            SESSIONS.labels(st.value).set(counts.get(st.value, 0))

    def _local(self, sid: str, *, handed_over: bool = True) -> Session | None:
        """The session if this agent serves (or served) it; ``handed_over=False`` skips a record
        left behind by an earlier handover (the session may be on its way back here)."""
        s = self.store.get(sid)
        if s is None or s.state not in _LOCAL_STATES:
            return None
        if not handed_over and s.state == SessionState.HANDED_OVER:
            return None
        return s

    async def _wait_local(self, sid: str, timeout: float, *, handed_over: bool = True) -> Session | None:
        """Wait until this agent serves ``sid`` (e.g. a commit in flight) or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            s = self._local(sid, handed_over=handed_over)
            if s is not None:
                return s
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.005)

    # ------------------------------------------------------------------ event streams
    def _token_event(self, sid: str, i: int, tok: int, t: float, agent: str, relayed_by: str | None) -> dict[str, Any]:
        ev = {"object": "session.token", "session_id": sid, "index": i, "token_id": tok, "time": t,
              "agent_id": agent}
        text = self._text(tok)
        if text is not None:
            ev["text"] = text
        if relayed_by:
            ev["relayed_by"] = relayed_by
        return ev

    async def events(self, sid: str, start: int, origin: str | None, header: dict[str, Any] | None,
                     relay: str | None = None) -> AsyncIterator[bytes]:
        """The event stream of session ``sid`` from output index ``start`` (see module doc).

        Serves local tokens while this agent holds the session; relays ``origin`` while it
        does not; switches from relaying to local serving when the origin reports the session
        handed over and it has arrived here. When the session is handed over from here while
        a UE streams it (the UE is still in this cell, or came back before the commit ended),
        the stream goes on by relaying the new holder, whose front URL comes from the
        directory; the stream ends only where that is unknown. ``relay``: the id of the agent
        this stream is for, if it relays it; such a stream ends at a handover (with
        ``moved_to``/``moved_to_url``) and the relaying agent follows, so relays never chain.
        """
        i = start
        if header is not None:
            yield sse(header)
        relayed_from: set[str] = set()
        # With an origin, a handed-over record here is stale (A -> B -> A): prefer the origin.
        allow_ho = not origin
        while True:
            s = self._local(sid, handed_over=allow_ho)
            if s is not None:
                async for idx, tok, t in s.stream(i):
                    yield sse(self._token_event(sid, idx, tok, t, self.agent_id, None))
                    i = idx + 1
                end = {"object": "session.end", "session_id": sid, "next_index": i, "state": _state(s),
                       "finish_reason": s.finish_reason, "agent_id": self.agent_id}
                if s.state == SessionState.HANDED_OVER:
                    moved = _moved_to(s)
                    end["moved_to"] = moved
                    nxt = self.directory.get(moved) if moved and moved != self.agent_id else None
                    if nxt:
                        end["moved_to_url"] = nxt
                        if not relay:
                            # The UE streams from here: relay the session's new holder.
                            origin = nxt
                            relayed_from.discard(nxt)
                            allow_ho = False
                            continue
                yield sse(end)
                break
            if origin and origin not in relayed_from:
                # Relay (Detour, or a commit still in flight): one extra hop per token.
                end = None
                arrived = False
                async for kind, payload in self._relay_until_local(sid, i, origin):
                    if kind == "token":
                        i = payload["index"] + 1
                        RELAYED_TOKENS.inc()
                        yield sse(payload)
                    elif kind == "local":
                        arrived = True
                    else:
                        end = payload
                if arrived:  # the session was handed over to this agent: serve it from here
                    relayed_from.add(origin)
                    allow_ho = False
                    continue
                if end is not None and end.get("state") == "handed_over":
                    relayed_from.add(origin)  # the session left the origin: look here (or follow)
                    moved = end.get("moved_to")
                    if moved and moved != self.agent_id:
                        nxt = end.get("moved_to_url") or self.directory.get(moved)
                        if nxt:
                            origin = nxt
                            continue
                    if await self._wait_local(sid, self.resume_wait_s, handed_over=False) is None:
                        end = dict(end, agent_id=self.agent_id, relayed_by=self.agent_id)
                        yield sse(end)
                        break
                    continue
                if end is None:
                    end = {"object": "session.end", "session_id": sid, "next_index": i, "state": "failed",
                           "finish_reason": None, "agent_id": self.agent_id,
                           "error": f"relay from {origin} ended without an end event"}
                yield sse(dict(end, relayed_by=self.agent_id))
                break
            if await self._wait_local(sid, self.resume_wait_s, handed_over=allow_ho) is None:
                yield sse({"object": "session.end", "session_id": sid, "next_index": i, "state": "unknown",
                           "finish_reason": None, "agent_id": self.agent_id,
                           "error": f"session {sid} is not served here"})
                break
        yield sse("[DONE]")

    async def _relay_until_local(self, sid: str, start: int, origin: str) -> AsyncIterator[tuple[str, Any]]:
        """:meth:`_relay`, cut short with ("local", None) as soon as the session arrives here
        (a commit to this agent completed while the origin's stream was still open)."""
        q: asyncio.Queue = asyncio.Queue()

        async def pump() -> None:
            async for item in self._relay(sid, start, origin):
                await q.put(item)
            await q.put(("closed", None))

        async def watch() -> None:
            while self._local(sid, handed_over=False) is None:
                await asyncio.sleep(0.01)
            await q.put(("local", None))

        tasks = [asyncio.create_task(pump()), asyncio.create_task(watch())]
        try:
            while True:
                kind, ev = await q.get()
                if kind == "closed":
                    return
                yield kind, ev
                if kind in ("end", "local"):
                    return
        finally:
            await cancel_and_wait(*tasks)

    async def _relay(self, sid: str, start: int, origin: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Read ``origin``'s event stream of ``sid`` from ``start``; yield ("token"|"end", event)."""
        url = f"{origin.rstrip('/')}/v1/sessions/{sid}/stream"
        log = _log.bind(session=sid, peer=origin)
        try:
            async with self.http.stream("GET", url, params={"from_index": start, "relay": self.agent_id}) as r:
                if r.status_code != 200:
                    body = (await r.aread()).decode(errors="replace")[:300]
                    log.warning("relay_refused", status=r.status_code, body=body)
                    yield "end", {"object": "session.end", "session_id": sid, "next_index": start,
                                  "state": "unknown", "finish_reason": None, "agent_id": self.agent_id,
                                  "error": f"origin answered {r.status_code}: {body}"}
                    return
                log.info("relay_start", from_index=start)
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data.strip() == "[DONE]":
                        return
                    try:
                        ev = json.loads(data)
                    except json.JSONDecodeError:
                        log.warning("relay_bad_event", data=data[:200])
                        continue
                    obj = ev.get("object")
                    if obj == "session.token":
                        ev["relayed_by"] = self.agent_id
                        yield "token", ev
                    elif obj == "session.end":
                        yield "end", ev
                        return
        except httpx.HTTPError as e:
            log.warning("relay_failed", error=repr(e))
            yield "end", {"object": "session.end", "session_id": sid, "next_index": start, "state": "unknown",
                          "finish_reason": None, "agent_id": self.agent_id, "error": f"relay failed: {e!r}"}

    # ------------------------------------------------------------------ app
    def _parse_open(self, body: dict[str, Any]) -> tuple[list[int], SamplingSpec, int | None]:
        if not isinstance(body, dict):
            raise HTTPException(400, "body must be a JSON object")
        prompt = body.get("prompt_token_ids", body.get("prompt"))
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise HTTPException(400, "text prompts need a tokenizer; send prompt_token_ids")
            ids = list(self.tokenizer.encode(prompt))
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and t >= 0 for t in prompt):
            ids = prompt
        else:
            raise HTTPException(400, "prompt must be a non-empty list of token ids or a string")
        kw = {k: body[k] for k in SAMPLING_FIELDS if body.get(k) is not None}
        try:
            sampling = SamplingSpec(**kw)
            if int(sampling.max_tokens) < 1:
                raise ValueError("max_tokens must be >= 1")
            scheme = scheme_value(body["scheme"]) if body.get("scheme") else None
        except (TypeError, ValueError) as e:
            raise HTTPException(400, f"bad request: {e}") from e
        return ids, sampling, scheme

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="Pallas agent UE front", version="1")
        front = self

        @app.get("/health")
        async def health():
            return {"status": "ok", "agent_id": front.agent_id}

        @app.get("/metrics")
        async def metrics():
            front._update_gauge()
            return PlainTextResponse(generate_latest(), media_type=CONTENT_TYPE_LATEST)

        @app.post("/v1/sessions")
        async def open_session(request: Request):
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise HTTPException(400, "body is not JSON")
            ids, sampling, scheme = front._parse_open(body)
            sid = str(body.get("session_id") or new_session_id())
            if front.store.get(sid) is not None:
                raise HTTPException(409, f"session {sid} exists")
            s = Session(session_id=sid, ue_id=str(body.get("ue_id") or ""), prompt_token_ids=ids, sampling=sampling)
            front.store.add(s)
            if front.on_open is not None:
                front.on_open(s, scheme)
            try:
                front.engine.start(s)
            except Exception as e:  # noqa: BLE001
                front.store.pop(sid) if hasattr(front.store, "pop") else None
                raise HTTPException(503, f"engine refused the session: {e!r}") from e
            _log.info("session_open", session=sid, ue=s.ue_id, prompt_tokens=len(ids),
                      max_tokens=sampling.max_tokens, scheme=scheme_name(scheme) if scheme else None)
            if body.get("stream", True) is False:
                return front.session_json(s)
            header = {"object": "session", "session_id": sid, "ue_id": s.ue_id, "agent_id": front.agent_id,
                      "prompt_tokens": len(ids), "max_tokens": sampling.max_tokens, "from_index": 0,
                      "scheme": scheme_name(scheme) if scheme else None}
            return StreamingResponse(front.events(sid, 0, None, header), media_type="text/event-stream")

        @app.get("/v1/sessions")
        async def list_sessions():
            return {"sessions": [front.session_json(s) for s in front.store]}

        @app.get("/v1/sessions/{sid}")
        async def get_session(sid: str, include_tokens: bool = False):
            s = front.store.get(sid)
            if s is None:
                raise HTTPException(404, f"session {sid} is not known here")
            out = front.session_json(s)
            if include_tokens:
                out["output_token_ids"] = list(s.output_token_ids)
                out["token_times"] = list(s.token_times)
            return out

        @app.delete("/v1/sessions/{sid}")
        async def delete_session(sid: str):
            s = front.store.get(sid)
            if s is None:
                raise HTTPException(404, f"session {sid} is not known here")
            await front.engine.abort(s)
            if not s.done:
                s.set_state(SessionState.FINISHED, finish_reason="abort")
            return {"session_id": sid, "state": _state(s)}

        @app.get("/v1/sessions/{sid}/stream")
        async def stream_session(sid: str, from_index: int = 0, origin: str | None = None,
                                 relay: str | None = None):
            if from_index < 0:
                raise HTTPException(400, "from_index must be >= 0")
            s = front.store.get(sid)
            if s is None and not origin:
                s = await front._wait_local(sid, front.resume_wait_s)
                if s is None:
                    raise HTTPException(404, f"session {sid} is not known here and no origin was given")
            if relay:
                _log.info("relay_serving", session=sid, peer=relay, from_index=from_index)
            local = front._local(sid)
            header = {"object": "session", "session_id": sid, "ue_id": local.ue_id if local else None,
                      "agent_id": front.agent_id,
                      "prompt_tokens": len(local.prompt_token_ids) if local else None,
                      "max_tokens": local.sampling.max_tokens if local else None,
                      "from_index": from_index, "scheme": None}
            if relay:
                header = None  # a relaying agent sends its own header
            return StreamingResponse(front.events(sid, from_index, origin, header, relay),
                                     media_type="text/event-stream")

        @app.exception_handler(HTTPException)
        async def http_error(request: Request, exc: HTTPException):
            return JSONResponse({"error": {"message": exc.detail, "code": exc.status_code}}, status_code=exc.status_code)

        return app
