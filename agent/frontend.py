"""The UE-facing session front of an agent: an HTTP API modelled on vLLM's OpenAI completions.

A UE opens a session at the agent of its serving gNB and receives its tokens as server-sent
events, one per token with its output index; it resumes the session, at whichever agent it
reaches, from the first index it has not received, and a front that does not (yet) serve the
session relays the one that does (paper section 2.2, "Source-side retention"). Routes, bodies,
status codes and the events' fields: docs/front.md (§1 sessions and resumes, §2 routes, §3 the
event stream).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import httpx
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from agent.obs import RELAYED_TOKENS, SESSIONS, get_logger
from pallas_common.schemes import scheme_name, scheme_value
from agent.session import SamplingSpec, Session, SessionState, sse_json
from pallas_common.aio import cancel_and_wait

__all__ = ["SessionFront", "OpenRequest", "RequestError", "new_session_credentials", "token_matches", "model_limits",
           "sse", "SAMPLING_FIELDS", "MAX_BODY_BYTES"]

_log = get_logger("pallas.agent.front")

SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_tokens",
                   "stop_token_ids", "ignore_eos", "seed")
# ---------------------------------------------------------------------------------- session tokens
_TOKEN_BYTES = 32          # 256 random bits per session token
_DIGEST_HEX = 32           # the session id carries 128 bits of the token's SHA-256
SESSION_LABEL_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
SESSION_LABEL_RULE = "1-64 characters from A-Z a-z 0-9 . _ -"


def _token_digest(token: str) -> str:
    return hashlib.sha256(b"pallas-session-token/v1\0" + token.encode()).hexdigest()[:_DIGEST_HEX]


def new_session_credentials(label: str | None = None) -> tuple[str, str]:
    """A fresh ``(session_id, session_token)`` pair.

    The token is 256 random bits (``secrets.token_urlsafe``, 43 characters). The session id is
    the first 128 bits of the token's SHA-256 in hex, after ``label + "."`` when the client
    named one: ``"ue-7.chat.3f9c..."``. Whoever holds the token can show it belongs to the id
    (:func:`token_matches`) at *any* agent, with no key and no state: a session resumed after
    a handover at another agent accepts the same token, and no proto field carries it.

    What it protects and what it does not: docs/front.md §4.
    """
    token = secrets.token_urlsafe(_TOKEN_BYTES)
    digest = _token_digest(token)
    return (f"{label}.{digest}" if label else digest), token


def token_matches(session_id: str, token: str | None) -> bool:
    """True when ``token`` is the session token of ``session_id`` (constant-time compare)."""
    if not token or len(token) > 128:
        return False
    return hmac.compare_digest(session_id.rsplit(".", 1)[-1].encode(), _token_digest(token).encode())


# ---------------------------------------------------------------------------------- open request
MAX_BODY_BYTES = 1 << 20   # default cap on an HTTP request body (a 4096-token prompt is ~30 kB)
MAX_RELAY_ORIGINS = 65536  # sessions whose relay origin a front remembers (Detour chains)
_INT64 = (-(2**63), 2**63 - 1)
_TokenId = Annotated[int, Field(strict=True, ge=0)]
_Int = Annotated[int, Field(strict=True)]


class RequestError(ValueError):
    """A refused request: ``param`` names the field (None for the body as a whole)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class OpenRequest(BaseModel):
    """The body of ``POST /v1/sessions``, validated as vLLM's OpenAI server validates a
    completions request (vllm/entrypoints/openai/completion/protocol.py, the checks of
    ``SamplingParams._verify_args`` and the renderer's vocabulary check), with stricter types:
    JSON numbers only for numbers (no ``"8"`` for 8), booleans only for flags, unknown fields
    refused (a typo is not silently dropped).

    Validation context (``OpenRequest.model_validate(body, context=...)``): ``vocab_size`` and
    ``max_model_len``, each optional. Each field's rule: docs/front.md §2.

    Raises:
        pydantic.ValidationError: on any bad field (:meth:`SessionFront.parse_open` turns it
            into a :class:`RequestError` naming the field).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    prompt_token_ids: list[_TokenId] | None = Field(None, min_length=1)
    prompt: str | list[_TokenId] | None = Field(None, min_length=1)
    max_tokens: _Int = Field(128, ge=1, le=2**31 - 1)
    min_tokens: _Int = Field(0, ge=0)
    temperature: float = Field(0.0, ge=0.0, le=2.0, strict=True)
    top_p: float = Field(1.0, gt=0.0, le=1.0, strict=True)
    top_k: _Int = Field(-1, ge=-1)
    stop_token_ids: list[_TokenId] = Field(default_factory=list, max_length=1024)
    ignore_eos: bool = Field(False, strict=True)
    seed: _Int | None = Field(None, ge=_INT64[0], le=_INT64[1])
    scheme: str | None = Field(None, strict=True)
    stream: bool = Field(True, strict=True)
    session_id: str | None = Field(None, strict=True)
    ue_id: str = Field("", strict=True, max_length=128)

    @field_validator("scheme")
    @classmethod
    def _known_scheme(cls, v: str | None) -> str | None:
        if v:
            scheme_value(v)  # ValueError names the known schemes
        return v or None

    @field_validator("session_id")
    @classmethod
    def _session_label(cls, v: str | None) -> str | None:
        if v is not None and not SESSION_LABEL_RE.fullmatch(v):
            raise ValueError(f"must be {SESSION_LABEL_RULE} (the front appends its own suffix), got {v[:80]!r}")
        return v

    @model_validator(mode="after")
    def _across_fields(self, info: ValidationInfo) -> "OpenRequest":
        ctx = info.context or {}
        if (self.prompt_token_ids is None) == (self.prompt is None):
            raise RequestError("give exactly one of prompt_token_ids or prompt", "prompt_token_ids")
        if self.min_tokens > self.max_tokens:
            raise RequestError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})",
                               "min_tokens")
        vocab = ctx.get("vocab_size")
        ids_field = "prompt_token_ids" if self.prompt_token_ids is not None else "prompt"
        for name, ids in ((ids_field, self.token_ids), ("stop_token_ids", self.stop_token_ids)):
            if vocab and ids and max(ids) >= vocab:
                bad = max(ids)
                raise RequestError(f"{name}: token id {bad} at index {ids.index(bad)} is out of vocabulary "
                                   f"(vocab_size {vocab})", name)
        limit = ctx.get("max_model_len")
        if limit and self.token_ids is not None and len(self.token_ids) + self.max_tokens > limit:
            raise RequestError(f"max_tokens: this model's maximum context length is {limit} tokens; the "
                               f"request asks for {len(self.token_ids) + self.max_tokens} "
                               f"({len(self.token_ids)} in the prompt, {self.max_tokens} in the output)",
                               "max_tokens")
        return self

    @property
    def token_ids(self) -> list[int] | None:
        """The prompt's token ids (None for a text prompt)."""
        if self.prompt_token_ids is not None:
            return self.prompt_token_ids
        return self.prompt if isinstance(self.prompt, list) else None

    def sampling(self) -> SamplingSpec:
        """The session's :class:`agent.session.SamplingSpec`."""
        return SamplingSpec(**{k: getattr(self, k) for k in SAMPLING_FIELDS})


_UNION_TAG = re.compile(r"(str|int|float|bool|list\[.*\]|constrained-.*)")


def _request_error(e: ValidationError) -> RequestError:
    """A pydantic ValidationError as one RequestError naming its field: a cross-field
    RequestError as raised, else the most specific error (for ``prompt: str | list[int]``, the
    member that got deepest, e.g. ``prompt.1: Input should be a valid integer``)."""
    errors = e.errors(include_url=False)
    for err in errors:
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, RequestError):
            return cause
    if not errors:
        return RequestError(str(e))
    err = max(errors, key=lambda x: len(x.get("loc", ())))
    loc = [str(x) for x in err.get("loc", ())]
    where = ".".join(loc[:1] + [x for x in loc[1:] if not _UNION_TAG.fullmatch(x)])
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ValueError):
        msg = str(cause)
    elif err.get("type") == "extra_forbidden":
        msg = "unknown field"
    else:
        msg = err.get("msg", "invalid")
    return RequestError(f"{where or 'body'}: {msg}", loc[0] if loc else None)


def model_limits(model_path: str | None, vllm_url: str | None = None,
                 timeout_s: float = 5.0) -> tuple[int | None, int | None]:
    """``(vocab_size, max_model_len)`` of the served model for :class:`OpenRequest`'s checks.

    ``vocab_size`` from ``config.json`` in ``model_path`` (or its ``text_config``, as
    transformers nests it for multimodal models); ``max_model_len`` from vLLM's
    ``GET /v1/models`` at ``vllm_url``. Either is None when it cannot be read (that check is
    then left to vLLM, which refuses the request later).
    """
    vocab = None
    try:
        with open(f"{model_path}/config.json") as fh:
            cfg = json.load(fh)
        vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    except (OSError, TypeError, ValueError, AttributeError):
        pass
    max_len = None
    if vllm_url:
        try:
            models = httpx.get(f"{vllm_url.rstrip('/')}/v1/models", timeout=timeout_s).json()
            max_len = models["data"][0].get("max_model_len")
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            pass
    return (int(vocab) if isinstance(vocab, int) and vocab > 0 else None,
            int(max_len) if isinstance(max_len, int) and max_len > 0 else None)


# States in which a session at this agent produces (or has produced) its own tokens.
_LOCAL_STATES = {SessionState.SERVING, SessionState.MIGRATING, SessionState.COMMITTING,
                 SessionState.RESUMED, SessionState.FINISHED, SessionState.FAILED,
                 SessionState.HANDED_OVER}


def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as JSON (or the literal ``[DONE]``)."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _bearer(request: Request) -> str | None:
    """The bearer token of ``Authorization: Bearer <token>``, or None."""
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


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
        vllm_client: starts a session's generation: ``vllm_client.start(session)`` and stops it
            with ``await vllm_client.abort(session)`` (:class:`agent.session.VllmClient`).
        agent_id: this agent's id.
        tokenizer: optional, with ``encode(text) -> list[int]`` and ``decode(ids) -> str``.
        on_open: ``on_open(session, scheme_value_or_None)`` after a session opens (the agent
            pins the session's scheme in its scheme runner).
        directory: agent id -> front URL of other agents (fills ``moved_to_url``).
        resume_wait_s: how long a resume waits for a session that is not here yet.
        vocab_size: the model's vocabulary size; prompt token ids must lie below it (None: not
            checked here, vLLM refuses them later).
        max_model_len: the engine's context length; prompt + max_tokens must fit (None: not
            checked here).
        operator_token: the operator credential (``Authorization: Bearer ...``) that lists
            sessions (``GET /v1/sessions``) and reads or deletes any session; None: listing is
            refused to everyone.
        max_body_bytes: cap on a request body; a larger one is refused with 413.

    Access (issue 16): every call for a session after its open needs its ``session_token``
    (401 without, 403 with a wrong one); ``origin`` is followed only to fronts of ``directory``
    (docs/front.md §4).
    """

    def __init__(
        self,
        store: Any,
        vllm_client: Any,
        *,
        agent_id: str,
        tokenizer: Any = None,
        on_open: Callable[[Session, int | None], None] | None = None,
        directory: dict[str, str] | None = None,
        resume_wait_s: float = 30.0,
        scheme_of: Callable[[str], int] | None = None,
        http: httpx.AsyncClient | None = None,
        vocab_size: int | None = None,
        max_model_len: int | None = None,
        operator_token: str | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.store = store
        self.vllm_client = vllm_client
        self.agent_id = agent_id
        self.tokenizer = tokenizer
        self.on_open = on_open
        self.directory = dict(directory or {})
        self.resume_wait_s = resume_wait_s
        self.scheme_of = scheme_of
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.operator_token = operator_token or None
        self.max_body_bytes = int(max_body_bytes)
        # The client that relays other agents' streams, created now, not at the first relay:
        # building its TLS context blocks for ~0.3 s.
        self._http = http or httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))
        # Where this front last relayed each session from (bounded, oldest forgotten first):
        # a later hop asking here for a session it never held is relayed on from there.
        self._relay_origins: OrderedDict[str, str] = OrderedDict()
        self.app = self._build_app()

    def relay_origin(self, sid: str, requester: str | None = None) -> str | None:
        """Where this agent would relay ``sid`` from when asked for it without an origin: the
        front of the agent that decoded the tokens it last relayed (the session's holder, when
        the directory names it), else the front it relayed them from; None if it never
        relayed ``sid``, or if that is the front of ``requester`` (the agent asking: relaying
        back to it would loop). Why: docs/front.md §3 (relays of relays).
        """
        url = self._relay_origins.get(sid)
        if url is not None and requester is not None:
            mine = self.directory.get(requester)
            if mine is not None and mine.rstrip("/") == url.rstrip("/"):
                return None
        return url

    def _remember_origin(self, sid: str, origin: str) -> None:
        self._relay_origins[sid] = origin
        self._relay_origins.move_to_end(sid)
        while len(self._relay_origins) > MAX_RELAY_ORIGINS:
            self._relay_origins.popitem(last=False)

    # ------------------------------------------------------------------ helpers
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
            "error": s.error or None,
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

    def _header(self, sid: str, s: Session | None, start: int, scheme: str | None) -> dict[str, Any]:
        """The ``session`` event that opens a stream of ``sid`` from output index ``start``."""
        return {"object": "session", "session_id": sid, "ue_id": s.ue_id if s else None,
                "agent_id": self.agent_id, "prompt_tokens": len(s.prompt_token_ids) if s else None,
                "max_tokens": s.sampling.max_tokens if s else None, "from_index": start,
                "scheme": scheme}

    def _end(self, sid: str, next_index: int, state: str, error: str | None,
             finish_reason: str | None = None) -> dict[str, Any]:
        """A ``session.end`` event (``error`` None: none to report)."""
        end = {"object": "session.end", "session_id": sid, "next_index": next_index, "state": state,
               "finish_reason": finish_reason, "agent_id": self.agent_id}
        return end if error is None else dict(end, error=error)

    async def events(self, sid: str, start: int, origin: str | None, header: dict[str, Any] | None,
                     relay: str | None = None, token: str | None = None) -> AsyncIterator[bytes]:
        """The event stream of session ``sid`` from output index ``start`` (docs/front.md §3).

        Serves local tokens while this agent holds the session; relays ``origin`` while it
        does not; switches from relaying to local serving when the origin reports the session
        handed over and it has arrived here. When the session is handed over from here while
        a UE streams it (the UE is still in this cell, or came back before the commit ended),
        the stream goes on by relaying the new holder, whose front URL comes from the
        directory; the stream ends only where that is unknown. ``relay``: the id of the agent
        this stream is for, if it relays it; such a stream ends at a handover (with
        ``moved_to``/``moved_to_url``) and the relaying agent follows, so relays never chain.
        ``token``: the session token, passed on to every agent relayed.
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
                    yield sse(self._token_event(sid, idx, tok, t, s.decoded_by(idx, self.agent_id), None))
                    i = idx + 1
                end = self._end(sid, i, _state(s), (s.error or "the session failed at this agent")
                                if s.state == SessionState.FAILED else None, s.finish_reason)
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
                if sid not in self._relay_origins:
                    self._remember_origin(sid, origin)
                end = None
                arrived = False
                async for kind, payload in self._relay_until_local(sid, i, origin, token):
                    if kind == "token":
                        i = payload["index"] + 1
                        holder = self.directory.get(str(payload.get("agent_id")))
                        if holder and payload.get("agent_id") != self.agent_id \
                                and self._relay_origins.get(sid) != holder:
                            self._remember_origin(sid, holder)
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
                        nxt = self.directory.get(moved) or self.peer_front(end.get("moved_to_url"))
                        if nxt:
                            origin = nxt
                            continue
                    if await self._wait_local(sid, self.resume_wait_s, handed_over=False) is None:
                        end = dict(end, agent_id=self.agent_id, relayed_by=self.agent_id)
                        yield sse(end)
                        break
                    continue
                if end is None:
                    end = self._end(sid, i, "failed", f"relay from {origin} ended without an end event")
                yield sse(dict(end, relayed_by=self.agent_id))
                break
            if await self._wait_local(sid, self.resume_wait_s, handed_over=allow_ho) is None:
                yield sse(self._end(sid, i, "unknown", f"session {sid} is not served here"))
                break
        yield sse("[DONE]")

    async def _relay_until_local(self, sid: str, start: int, origin: str,
                                 token: str | None) -> AsyncIterator[tuple[str, Any]]:
        """:meth:`_relay`, cut short with ("local", None) as soon as the session arrives here
        (a commit to this agent completed while the origin's stream was still open)."""
        q: asyncio.Queue = asyncio.Queue()

        async def pump() -> None:
            async for item in self._relay(sid, start, origin, token):
                await q.put(item)
            await q.put(("closed", None))

        async def watch() -> None:
            while self._local(sid, handed_over=False) is None:
                await asyncio.sleep(0.005)
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

    async def _relay(self, sid: str, start: int, origin: str,
                     token: str | None) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Read ``origin``'s event stream of ``sid`` from ``start``; yield ("token"|"end", event)."""
        url = f"{origin.rstrip('/')}/v1/sessions/{sid}/stream"
        log = _log.bind(session=sid, peer=origin)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with self._http.stream("GET", url, params={"from_index": start, "relay": self.agent_id},
                                        headers=headers) as r:
                if r.status_code != 200:
                    body = (await r.aread()).decode(errors="replace")[:300]
                    log.warning("relay_refused", status=r.status_code, body=body)
                    yield "end", self._end(sid, start, "unknown", f"origin answered {r.status_code}: {body}")
                    return
                log.info("relay_start", from_index=start)
                async for ev in sse_json(r.aiter_lines(), lambda d: log.warning("relay_bad_event", data=d)):
                    obj = ev.get("object") if isinstance(ev, dict) else None
                    if obj == "session.token":
                        ev["relayed_by"] = self.agent_id
                        yield "token", ev
                    elif obj == "session.end":
                        yield "end", ev
                        return
        except httpx.HTTPError as e:
            log.warning("relay_failed", error=repr(e))
            yield "end", self._end(sid, start, "unknown", f"relay failed: {e!r}")

    # ------------------------------------------------------------------ app
    def peer_front(self, url: str | None) -> str | None:
        """``url`` if it is the front of an agent in the directory (``--peer-front``), else None."""
        if not url or not isinstance(url, str):
            return None
        url = url.rstrip("/")
        return url if url in {u.rstrip("/") for u in self.directory.values()} else None

    def parse_open(self, raw: bytes) -> OpenRequest:
        """Parse and validate an open-request body (:class:`OpenRequest` with this agent's
        ``vocab_size`` and ``max_model_len``).

        Raises:
            RequestError: not JSON, not an object, or a bad field (``param`` names it).
        """
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, deep nesting
            raise RequestError(f"body is not JSON: {str(e)[:200]}") from None
        if not isinstance(body, dict):
            raise RequestError("body must be a JSON object")
        ctx = {"vocab_size": self.vocab_size, "max_model_len": self.max_model_len}
        try:
            req = OpenRequest.model_validate(body, context=ctx)
        except ValidationError as e:
            raise _request_error(e) from None
        if isinstance(req.prompt, str):
            if self.tokenizer is None:
                raise RequestError("text prompts need a tokenizer; send prompt_token_ids", "prompt")
            ids = list(self.tokenizer.encode(req.prompt))
            try:  # the same rules on the tokenizer's ids (vocabulary, context length)
                req = OpenRequest.model_validate(dict(body, prompt=None, prompt_token_ids=ids or None),
                                                 context=ctx)
            except ValidationError as e:
                err = _request_error(e)
                if err.param == "prompt_token_ids":  # the tokenizer's ids of the text prompt
                    err = RequestError(f"prompt (as tokenized) {str(err).split(': ', 1)[-1]}", "prompt")
                raise err from None
        return req

    async def read_body(self, request: Request) -> bytes:
        """The request body, refused with 413 past ``max_body_bytes`` (read no further)."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise HTTPException(413, f"body larger than {self.max_body_bytes} bytes")
        chunks, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > self.max_body_bytes:
                raise HTTPException(413, f"body larger than {self.max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def authorize(self, request: Request, sid: str) -> None:
        """Require the session token of ``sid`` (or the operator credential).

        Raises:
            HTTPException: 401 without a bearer token, 403 with a wrong one.
        """
        token = _bearer(request)
        if token is None:
            raise HTTPException(401, "this session needs its session_token: send Authorization: Bearer <token>")
        if not token_matches(sid, token) and not self.is_operator(token):
            raise HTTPException(403, f"the token is not session {sid[:100]}'s")

    def is_operator(self, token: str | None) -> bool:
        """True when ``token`` is the operator credential."""
        return bool(self.operator_token and token
                    and hmac.compare_digest(token.encode(), self.operator_token.encode()))

    async def open_session(self, request: Request) -> Any:
        """``POST /v1/sessions``: validate the body, start the session's request here, answer
        its event stream (or, with ``"stream": false``, its session object).

        Raises:
            RequestError: a bad body (400). HTTPException: 413 (body too large), 503 (the
                engine refused the session).
        """
        req = self.parse_open(await self.read_body(request))
        ids, sampling = list(req.token_ids or ()), req.sampling()
        scheme = scheme_value(req.scheme) if req.scheme else None
        sid, token = new_session_credentials(req.session_id)
        if self.store.get(sid) is not None:  # 128 random bits: never in practice
            raise HTTPException(409, f"session {sid} exists")
        s = Session(session_id=sid, ue_id=req.ue_id, prompt_token_ids=ids, sampling=sampling)
        self.store.add(s)
        if self.on_open is not None:
            self.on_open(s, scheme)
        try:
            self.vllm_client.start(s)
        except Exception as e:  # noqa: BLE001
            self.store.pop(sid) if hasattr(self.store, "pop") else None
            raise HTTPException(503, f"engine refused the session: {e!r}") from e
        _log.info("session_open", session=sid, ue=s.ue_id, prompt_tokens=len(ids),
                  max_tokens=sampling.max_tokens, scheme=scheme_name(scheme) if scheme else None)
        if not req.stream:
            return dict(self.session_json(s), session_token=token)
        header = dict(self._header(sid, s, 0, scheme_name(scheme) if scheme else None),
                      session_token=token)
        return StreamingResponse(self.events(sid, 0, None, header, token=token),
                                 media_type="text/event-stream")

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
            return await front.open_session(request)

        @app.get("/v1/sessions")
        async def list_sessions(request: Request):
            if not front.is_operator(_bearer(request)):
                raise HTTPException(403, "listing sessions needs the operator credential"
                                         if front.operator_token else "listing sessions is disabled at this agent")
            return {"sessions": [front.session_json(s) for s in front.store]}

        def known(request: Request, sid: str) -> Session:
            front.authorize(request, sid)
            s = front.store.get(sid)
            if s is None:
                raise HTTPException(404, f"session {sid} is not known here")
            return s

        @app.get("/v1/sessions/{sid}")
        async def get_session(request: Request, sid: str, include_tokens: bool = False):
            s = known(request, sid)
            out = front.session_json(s)
            if include_tokens:
                out["output_token_ids"] = list(s.output_token_ids)
                out["token_times"] = list(s.token_times)
            return out

        @app.delete("/v1/sessions/{sid}")
        async def delete_session(request: Request, sid: str):
            s = known(request, sid)
            await front.vllm_client.abort(s)
            if not s.done:
                s.set_state(SessionState.FINISHED, finish_reason="abort")
            return {"session_id": sid, "state": _state(s)}

        @app.get("/v1/sessions/{sid}/stream")
        async def stream_session(request: Request, sid: str, from_index: int = 0, origin: str | None = None,
                                 relay: str | None = None):
            front.authorize(request, sid)
            if from_index < 0:
                raise HTTPException(400, "from_index must be >= 0")
            if origin is not None and front.peer_front(origin) is None:
                raise HTTPException(400, f"origin {origin[:200]!r} is not the front of a peer agent of this one "
                                         "(--peer-front)")
            s = front.store.get(sid)
            if s is None:   # a session this front relayed (Detour): go to its holder
                origin = front.relay_origin(sid, relay) or origin
            if s is None and not origin:
                s = await front._wait_local(sid, front.resume_wait_s)
                if s is None:
                    raise HTTPException(404, f"session {sid} is not known here and no origin was given")
            if relay:
                _log.info("relay_serving", session=sid, peer=relay, from_index=from_index)
            # a relaying agent sends its own header
            header = None if relay else front._header(sid, front._local(sid), from_index, None)
            return StreamingResponse(front.events(sid, from_index, origin, header, relay, token=_bearer(request)),
                                     media_type="text/event-stream")

        _add_error_handlers(app)
        return app


def _add_error_handlers(app: FastAPI) -> None:
    """Errors as ``{"error": {"message", "code", "param"?, "type"?}}``: an HTTPException with its
    status (401 also with ``WWW-Authenticate: Bearer``), a :class:`RequestError` or a bad query
    parameter as 400 naming the field."""

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse({"error": {"message": exc.detail, "code": exc.status_code}},
                            status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError):
        return JSONResponse({"error": {"message": str(exc), "code": 400, "param": exc.param,
                                       "type": "BadRequestError"}}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def query_error(request: Request, exc: RequestValidationError):
        err = (exc.errors() or [{}])[0]
        where = ".".join(str(x) for x in err.get("loc", ())[1:]) or "request"
        return JSONResponse({"error": {"message": f"{where}: {err.get('msg', 'invalid')}", "code": 400,
                                       "param": where, "type": "BadRequestError"}}, status_code=400)
