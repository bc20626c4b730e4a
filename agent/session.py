"""UE sessions and the client of one local vLLM OpenAI server.

A *session* is one UE's LLM request as the agent sees it (:class:`Session`). The UE front
(agent/frontend.py) reads its tokens with :meth:`Session.wait_tokens` / :meth:`Session.stream`;
the :class:`VllmClient` appends them as vLLM produces them. After a handover the target holds a
session with the same id, its output so far copied from the source, so a UE can continue there
from any output index (docs/architecture.md §2, step 3).

Token indices used by readers are *output* indices: index 0 is the first generated token.
Times are seconds since the Unix epoch (``time.time()``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import httpx
import structlog

from agent.obs import SESSION_FAILURES
from agent.states import check_session
from pallas_common.aio import cancel_and_wait
from pallas_common.schemes import SessionState

if TYPE_CHECKING:
    from agent.connector.messages import Claim, Loaded

log = structlog.get_logger("pallas.agent.session")


@dataclasses.dataclass(frozen=True)
class Handover:
    """Where and how a session left this agent (source side of a commit).

    ``target`` the target's peer address, ``agent_id`` its id, ``n_tokens`` tokens at the
    commit point, ``t_commit`` time.time() at the commit's start, ``streamed_blocks`` blocks
    streamed, ``tail`` whether the partial last block was shipped, ``reused_tokens`` tokens the
    target did not recompute.
    """

    target: str
    agent_id: str = ""
    n_tokens: int = 0
    t_commit: float = 0.0
    streamed_blocks: int = 0
    tail: bool = False
    reused_tokens: int = 0


@dataclasses.dataclass
class SamplingSpec:
    """Sampling parameters of a session, as the OpenAI completions API takes them.

    ``max_tokens`` / ``min_tokens`` count *output* tokens of the whole session; at a resume
    the target asks only for what is left (:meth:`Session.remaining_tokens`), because the
    source's outputs become part of the target's prompt (docs/vllm.md §6.6). Seeded
    sampling cannot be continued exactly across engines; greedy (temperature 0) can.
    """

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    min_tokens: int = 0
    stop_token_ids: list[int] = dataclasses.field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None

    def request_fields(self, *, max_tokens: int, min_tokens: int) -> dict[str, Any]:
        """Fields of a ``/v1/completions`` body for this spec with the given remaining counts."""
        body: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_tokens": min_tokens,
            "ignore_eos": self.ignore_eos,
        }
        if self.stop_token_ids:
            body["stop_token_ids"] = list(self.stop_token_ids)
        if self.seed is not None:
            body["seed"] = self.seed
        return body


@dataclasses.dataclass(eq=False)
class Session:
    """One UE's LLM request at this agent.

    Attributes:
        session_id: globally unique id (the UE front assigns it; it survives handovers).
        ue_id: the UE this session belongs to.
        prompt_token_ids: the original prompt, token ids.
        output_token_ids: generated token ids so far, in order (source's and, after a resume,
            the target's own).
        token_times: ``time.time()`` at which each output token reached this agent (same length
            as ``output_token_ids``; tokens copied from a source at Sync carry the Sync time).
        sampling: the sampling parameters of the whole session.
        epoch: the newest migration epoch seen for this session (docs/model.md §5).
        state: a :class:`SessionState`.
        finish_reason: vLLM's finish reason once the request completed here ("length", "stop").
        resumed_from: output index at which this agent took the session over (0 if it started
            here).
        resumed_agent: the agent that decoded the outputs before ``resumed_from`` (the source
            of the resume; "" if the session started here).
        reused_tokens: at a resume, tokens whose KV the target did not recompute (local prefix
            cache hit + blocks loaded by the connector); None before a resume.
        scheme: the scheme pinned for the session, carried from the agent it came from (0: none).
        claim: the connector's :class:`~agent.connector.messages.Claim` at a resume here;
            loaded: its :class:`~agent.connector.messages.Loaded` report of the blocks it loaded.
        handover: where and how the session left this agent (:class:`Handover`), source side.
        error: why the session failed here ("" if it did not): set with the state ``FAILED``
            (:meth:`fail`), the reason the UE's stream and the xApp's replies name.
        failure_cause: the failure's kind (:attr:`VllmError.cause`), "" if none.
        sit_observed: the target-side handover gap was recorded (agent.obs).
    """

    session_id: str
    ue_id: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec = dataclasses.field(default_factory=SamplingSpec)
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    token_times: list[float] = dataclasses.field(default_factory=list)
    epoch: int = 0
    state: SessionState = SessionState.NEW
    finish_reason: str | None = None
    resumed_from: int = 0
    resumed_agent: str = ""
    reused_tokens: int | None = None
    ended_at: float = 0.0  # time.time() when the agent first saw it done (the janitor's clock)
    scheme: int = 0
    claim: "Claim | None" = None
    loaded: "Loaded | None" = None
    handover: "Handover | None" = None
    error: str = ""
    sit_observed: bool = False
    held_finish: str | None = None  # vLLM's finish reason held back while frozen
    held_error: tuple[str, str] | None = None  # (reason, cause) of a failure while frozen
    failure_cause: str = ""
    # Engine bookkeeping (not part of the session's identity).
    frozen_at: int | None = None  # output length at which appends pause (commit point)
    held_token_ids: list[int] = dataclasses.field(default_factory=list)  # produced past it
    _task: asyncio.Task | None = dataclasses.field(default=None, repr=False)
    _changed: asyncio.Event | None = dataclasses.field(default=None, repr=False)

    # ---- token access -------------------------------------------------------------------
    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then output: the token sequence whose KV the engine holds (K_curr tokens)."""
        return list(self.prompt_token_ids) + list(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """K_curr: prompt tokens + output tokens so far."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def remaining_tokens(self) -> int:
        """Output tokens still to generate under ``sampling.max_tokens`` (>= 0)."""
        return max(0, self.sampling.max_tokens - len(self.output_token_ids))

    @property
    def remaining_min_tokens(self) -> int:
        """``min_tokens`` still owed (>= 0)."""
        return max(0, self.sampling.min_tokens - len(self.output_token_ids))

    @property
    def request_done(self) -> bool:
        """True when this agent's request for the session has ended (or never started)."""
        return self._task is not None and self._task.done()

    @property
    def done(self) -> bool:
        """True when this agent will append no more tokens to this session."""
        return self.state in (SessionState.FINISHED, SessionState.FAILED,
                              SessionState.HANDED_OVER)

    def decode_rate(self, window: int = 16) -> float:
        """Recent decode rate r_d in tokens/s over the last ``window`` output tokens (0 if < 2)."""
        times = self.token_times[-window:]
        if len(times) < 2 or times[-1] <= times[0]:
            return 0.0
        return (len(times) - 1) / (times[-1] - times[0])

    # ---- producer side (Engine, migration engine)-------------------------------------------
    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def notify(self) -> None:
        """Wake every reader waiting in :meth:`wait_tokens` (call after any change)."""
        ev = self._event()
        ev.set()
        self._changed = asyncio.Event()

    def append_tokens(self, token_ids: list[int], now: float | None = None) -> int:
        """Append generated tokens; returns how many became visible.

        While the session is frozen (:meth:`freeze`, during a commit), tokens past
        ``frozen_at`` are held back instead: :meth:`unfreeze` publishes them if the
        handover fails, so the source serves on without losing a token.
        """
        now = time.time() if now is None else now
        kept = 0
        for tok in token_ids:
            if self.frozen_at is not None and len(self.output_token_ids) >= self.frozen_at:
                self.held_token_ids.append(int(tok))
                continue
            self.output_token_ids.append(int(tok))
            self.token_times.append(now)
            kept += 1
        if kept:
            self.notify()
        return kept

    def freeze(self, at: int | None = None) -> int:
        """Stop publishing new tokens at the commit point and return it (output tokens).

        ``at``: the number of output tokens the UE has received (default: all so far). Tokens
        past it are taken back into the held list: the session continues from ``at`` at the
        target, which produces the same tokens (token-exact continuation).
        """
        if at is not None:
            if at < 0:
                raise ValueError(f"at must be >= 0, got {at}")
            at = min(at, len(self.output_token_ids))
            if at < len(self.output_token_ids):
                self.held_token_ids[:0] = self.output_token_ids[at:]
                del self.output_token_ids[at:]
                del self.token_times[at:]
            self.frozen_at = at
        elif self.frozen_at is None:
            self.frozen_at = len(self.output_token_ids)
        return self.frozen_at

    def unfreeze(self) -> None:
        """Publish tokens held back since :meth:`freeze` and keep appending normally."""
        held, self.held_token_ids = self.held_token_ids, []
        self.frozen_at = None
        if held:
            self.append_tokens(held)
        fin, self.held_finish = self.held_finish, None
        if fin is not None and not self.done:
            self.set_state(SessionState.FINISHED, finish_reason=fin)
        err, self.held_error = self.held_error, None
        if err is not None and not self.done:
            self.fail(*err)

    def fail(self, reason: str, cause: str = "internal") -> bool:
        """The session's request failed here: terminal state ``FAILED`` with ``reason``.

        While the session is frozen (a commit in flight) the failure is held instead, as a
        finish is: the commit decides (a target that takes over continues the session from the
        commit point; otherwise :meth:`unfreeze` publishes the failure). A session already done
        stays as it is. Counts ``pallas_session_failures_total``. Returns True when the state
        became ``FAILED`` now.
        """
        if self.done:
            return False
        if self.frozen_at is not None:
            self.held_error = (reason, cause)
            return False
        self.error, self.failure_cause = reason, cause
        SESSION_FAILURES.labels("target" if self.resumed_agent else "source", cause).inc()
        self.set_state(SessionState.FAILED)
        return True

    def set_state(self, state: SessionState, *, finish_reason: str | None = None) -> None:
        """Change the state and wake readers.

        Raises:
            agent.states.IllegalTransition: the move is not in
                :data:`agent.states.SESSION_TRANSITIONS` (e.g. out of ``FAILED``).
        """
        self.state = check_session(self.state, state)
        if finish_reason is not None:
            self.finish_reason = finish_reason
        self.notify()

    # ---- consumer side (UE front) -------------------------------------------------------
    async def wait_tokens(self, start: int, timeout: float | None = None) -> list[int]:
        """Output tokens from index ``start`` on, waiting until at least one exists.

        Returns an empty list if the session ends here with no token at ``start`` (then
        :attr:`done` is True: finished, failed, or handed over to another agent) or on
        timeout. ``start`` is an output index (0 = first generated token).
        """
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if len(self.output_token_ids) > start:
                return self.output_token_ids[start:]
            if self.done:
                return []
            ev = self._event()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return []
            try:
                await asyncio.wait_for(ev.wait(), remaining)
            except asyncio.TimeoutError:
                return []

    def decoded_by(self, index: int, here: str) -> str:
        """The agent that decoded output ``index``: ``here`` (this agent's id) from
        ``resumed_from`` on, the resume's source before it (tokens carried over at the Sync)."""
        return self.resumed_agent if index < self.resumed_from and self.resumed_agent else here

    async def stream(self, start: int = 0) -> AsyncIterator[tuple[int, int, float]]:
        """Yield ``(output_index, token_id, arrival_time)`` from ``start`` until the session ends here."""
        i = start
        while True:
            toks = await self.wait_tokens(i)
            if not toks:
                return
            for tok in toks:
                yield i, tok, self.token_times[i]
                i += 1


class SessionStore:
    """The sessions one agent holds, by session id (source and target roles alike)."""

    def __init__(self) -> None:
        self._by_id: dict[str, Session] = {}

    def add(self, session: Session) -> Session:
        """Register (or replace) a session; returns it."""
        self._by_id[session.session_id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        """The session with this id, or None."""
        return self._by_id.get(session_id)

    def pop(self, session_id: str) -> Session | None:
        """Forget a session; returns it or None."""
        return self._by_id.pop(session_id, None)

    def __iter__(self):
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._by_id


class VllmError(RuntimeError):
    """The local vLLM server refused or failed a request.

    ``cause`` (the label of ``pallas_session_failures_total``): ``http_status`` (vLLM answered
    with an error status), ``stream_error`` (an ``{"error": ...}`` chunk in the completion
    stream, e.g. a KV load failure under ``kv_load_failure_policy=fail`` or a dead engine
    core), ``request_error`` (a choice finished with ``finish_reason`` "error"),
    ``no_finish_reason`` (the stream ended without one), ``unreachable`` (no connection:
    the server is gone), ``connection_lost`` (the connection broke mid-stream),
    ``kv_load`` (a failure after the connector reported blocks that failed to load).
    """

    def __init__(self, message: str, cause: str = "internal") -> None:
        super().__init__(message)
        self.cause = cause


def _error_text(err: Any) -> str:
    """The message of vLLM's error object (``{"message", "type", "code"}``) or its repr."""
    if isinstance(err, dict):
        msg = err.get("message") or err.get("type") or json.dumps(err)[:300]
        code = err.get("code")
        return f"{msg} (code {code})" if code is not None else str(msg)
    return str(err)[:300]


async def sse_json(lines: AsyncIterator[str], on_bad: Callable[[str], None]
                   ) -> AsyncIterator[Any]:
    """The JSON payloads of a server-sent event stream's ``data: <json>`` lines, up to
    ``data: [DONE]``; a payload that is not JSON goes to ``on_bad`` and is skipped."""
    async for line in lines:
        if not line.startswith("data: "):
            continue
        data = line[6:].strip()
        if data == "[DONE]":
            return
        try:
            yield json.loads(data)
        except json.JSONDecodeError:
            on_bad(data[:200])


async def _chunks(resp: httpx.Response, sid: str) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a completion's event stream up to ``[DONE]`` (a line that is not
    JSON is logged and skipped).

    Raises:
        VllmError: an ``{"error": ...}`` chunk (cause ``stream_error``).
    """
    async for chunk in sse_json(resp.aiter_lines(),
                                lambda data: log.warning("bad_stream_chunk", session=sid, chunk=data)):
        if isinstance(chunk, dict) and chunk.get("error") is not None:
            raise VllmError(f"vLLM failed the request: {_error_text(chunk['error'])}", "stream_error")
        if isinstance(chunk, dict):
            yield chunk


class VllmClient:
    """Async client of one local vLLM OpenAI-compatible server (``/v1/completions``).

    Prompts are token ids (the server runs with ``--skip-tokenizer-init``); responses stream
    token ids (``return_token_ids``). Per-request connector parameters travel in the body's
    ``kv_transfer_params`` (docs/vllm.md §3.3) and reach ``request.kv_transfer_params`` in the
    Pallas connector.

    Args:
        base_url: e.g. ``"http://127.0.0.1:8001"``.
        model: the served model name (the ``--model`` path unless ``--served-model-name``).
        timeout_s: per-request timeout for non-streaming calls, seconds.
        transport: the HTTP transport (tests give a fake vLLM; default: the network).
    """

    def __init__(self, base_url: str, model: str, *, timeout_s: float = 600.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._client = httpx.AsyncClient(base_url=self.base_url, transport=transport,
                                         timeout=httpx.Timeout(timeout_s, connect=10.0))
        # Called with a session right after its request failed here (the migration engine
        # abandons the session's attempt); None: nothing.
        self.on_failed: Callable[[Session], None] | None = None

    async def close(self) -> None:
        """Close the HTTP client (running generations are aborted)."""
        await self._client.aclose()

    async def health(self) -> bool:
        """True if the server answers ``/health`` with 200."""
        try:
            r = await self._client.get("/health", timeout=5.0)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    def _body(self, prompt: list[int], sampling: SamplingSpec, *, max_tokens: int,
              min_tokens: int, stream: bool,
              kv_transfer_params: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt),
            "stream": stream,
            "return_token_ids": True,
            "detokenize": False,
            **sampling.request_fields(max_tokens=max_tokens, min_tokens=min_tokens),
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if kv_transfer_params:
            body["kv_transfer_params"] = kv_transfer_params
        return body

    async def generate(self, session: Session, *,
                       kv_transfer_params: dict[str, Any] | None = None) -> str | None:
        """Drive ``session`` to completion on this server, appending tokens as they stream.

        The prompt is ``session.all_token_ids`` (a resumed session's outputs so far become
        prompt tokens), ``max_tokens`` is ``session.remaining_tokens``. Sets the state to
        ``FINISHED`` when vLLM finishes the request with a ``finish_reason`` (unless the
        session was handed over or frozen meanwhile) and returns it. Cancelling the task closes
        the HTTP stream, which aborts the request inside vLLM.

        Raises:
            VllmError: the server answered with an error status, sent an error chunk,
                finished the request with "error", ended the stream without a
                ``finish_reason``, or could not be reached (:attr:`VllmError.cause`).
        """
        remaining = session.remaining_tokens
        if remaining <= 0:
            session.set_state(SessionState.FINISHED, finish_reason="length")
            return "length"
        body = self._body(session.all_token_ids, session.sampling, max_tokens=remaining,
                          min_tokens=session.remaining_min_tokens, stream=True,
                          kv_transfer_params=kv_transfer_params)
        finish = None
        try:
            async with self._client.stream("POST", "/v1/completions", json=body,
                                           timeout=httpx.Timeout(None, connect=10.0)) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")[:500]
                    raise VllmError(f"vLLM answered HTTP {resp.status_code}: {text}",
                                    "http_status")
                async for chunk in _chunks(resp, session.session_id):
                    for choice in chunk.get("choices") or []:
                        if choice.get("token_ids"):
                            session.append_tokens(choice["token_ids"])
                        if choice.get("finish_reason"):
                            finish = choice["finish_reason"]
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise VllmError(f"vLLM at {self.base_url} is unreachable: {exc!r}",
                            "unreachable") from exc
        except httpx.HTTPError as exc:
            raise VllmError(f"the connection to vLLM at {self.base_url} broke mid-stream: "
                            f"{exc!r}", "connection_lost") from exc
        if finish == "error":
            raise VllmError("vLLM finished the request with an error", "request_error")
        if finish is None:
            raise VllmError(f"vLLM's stream ended after {len(session.output_token_ids)} "
                            "output tokens without a finish_reason (the request did not "
                            "complete)", "no_finish_reason")
        if not session.done:
            if session.frozen_at is not None:
                session.held_finish = finish  # published by unfreeze() if it stays here
            else:
                session.set_state(SessionState.FINISHED, finish_reason=finish)
        return finish

    def start(self, session: Session, *,
              kv_transfer_params: dict[str, Any] | None = None) -> asyncio.Task:
        """Start :meth:`generate` as a task tied to the session; a failure marks it ``FAILED``
        with the reason (:meth:`Session.fail`) and calls :attr:`on_failed` with it.

        The request always carries ``kv_transfer_params["pallas"]["sid"] = session_id`` so the
        Pallas connector can export its blocks later (a trigger may come at any time).
        """
        if session.state == SessionState.NEW:
            session.set_state(SessionState.SERVING)
        params = {"pallas": {"sid": session.session_id}}
        if kv_transfer_params:
            params = {**kv_transfer_params,
                      "pallas": {"sid": session.session_id,
                                 **(kv_transfer_params.get("pallas") or {})}}

        async def run() -> str | None:
            try:
                return await self.generate(session, kv_transfer_params=params)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the session fails; the agent runs on
                reason = str(exc) if isinstance(exc, VllmError) else repr(exc)
                cause = getattr(exc, "cause", "internal")
                loaded = session.loaded
                if loaded is not None and loaded.failed:
                    reason += (f" (KV load failure: blocks {list(loaded.failed)} failed to load "
                               "at this agent)")
                    cause = "kv_load"
                log.error("generate_failed", session=session.session_id, error=reason,
                          cause=cause, n_tokens=len(session.output_token_ids))
                if session.fail(reason, cause) and self.on_failed is not None:
                    try:
                        self.on_failed(session)
                    except Exception:  # noqa: BLE001 - the hook must not hide the failure
                        log.exception("on_failed_hook_failed", session=session.session_id)
                return None

        task = asyncio.get_running_loop().create_task(run(), name=f"gen-{session.session_id}")
        session._task = task
        return task

    async def abort(self, session: Session) -> None:
        """Stop the session's running request here (closes its stream; vLLM aborts it)."""
        await cancel_and_wait(session._task)

    async def prefill(self, token_ids: list[int]) -> dict[str, Any]:
        """Run one prefill of exactly ``token_ids`` (``max_tokens=1``) to warm the prefix cache.

        With a block-aligned prompt of P tokens, vLLM computes and caches all P/block_size
        blocks (docs/vllm.md §6.3). Returns the response's ``usage`` dict.

        Raises:
            VllmError: the server answered with an error status.
        """
        body = self._body(token_ids, SamplingSpec(max_tokens=1), max_tokens=1, min_tokens=0,
                          stream=False)
        return (await self._post(body)).get("usage") or {}

    async def complete(self, token_ids: list[int], sampling: SamplingSpec) -> list[int]:
        """Non-streaming generation of ``sampling.max_tokens`` tokens after ``token_ids`` (references in tests)."""
        body = self._body(token_ids, sampling, max_tokens=sampling.max_tokens,
                          min_tokens=sampling.min_tokens, stream=False)
        return list((await self._post(body))["choices"][0]["token_ids"])

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST a non-streaming completion; its JSON answer. Raises VllmError on an error status."""
        r = await self._client.post("/v1/completions", json=body)
        if r.status_code != 200:
            raise VllmError(f"vLLM {r.status_code}: {r.text[:500]}")
        return r.json()
