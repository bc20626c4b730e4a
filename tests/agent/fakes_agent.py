"""Fakes of the local vLLM for the agent's unit tests, a fake handover, and a tiny HTTP server runner.

FakeVllmClient produces a deterministic token sequence per prompt (token i of a session is a
function of the prompt and i only), so a session moved between two fake agents continues
with exactly the tokens it would have produced without the move: the property the real e2e
tests check with vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn

from agent.connector.messages import SchedHello, WorkerHello
from agent.session import Handover, Session, SessionState, SessionStore


def expected_token(prompt: list[int], i: int) -> int:
    """Token at output index i of a session with this prompt (FakeVllmClient's rule)."""
    return (sum(prompt) * 31 + i * 7 + len(prompt)) % 997


class FakeVllmClient:
    """Appends ``expected_token`` every ``step_s`` until max_tokens; ``abort`` stops it."""

    def __init__(self, step_s: float = 0.005) -> None:
        self.step_s = step_s
        self.started: list[str] = []

    def start(self, s: Session, **_kw) -> asyncio.Task:
        self.started.append(s.session_id)
        if s.state == SessionState.NEW:
            s.set_state(SessionState.SERVING)

        async def run():
            while len(s.output_token_ids) < s.sampling.max_tokens:
                if s.frozen_at is not None and len(s.output_token_ids) >= s.frozen_at:
                    return
                await asyncio.sleep(self.step_s)
                s.append_tokens([expected_token(s.prompt_token_ids, len(s.output_token_ids))])
            if s.frozen_at is None and not s.done:
                s.set_state(SessionState.FINISHED, finish_reason="length")

        s._task = asyncio.get_running_loop().create_task(run())
        return s._task

    async def close(self) -> None:
        pass

    async def abort(self, s: Session) -> None:
        t = s._task
        if t is not None and not t.done():
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


def handover(src_store: SessionStore, sid: str, target_id: str, dst_store: SessionStore,
             dst_client: FakeVllmClient, source_id: str = "") -> Session:
    """Move a session the way the real core does: freeze at the source, resume at the target
    (``source_id``: the source's agent id, which decoded the outputs carried over)."""
    s = src_store.get(sid)
    s.frozen_at = len(s.output_token_ids)
    t = Session(session_id=sid, ue_id=s.ue_id, prompt_token_ids=list(s.prompt_token_ids), sampling=s.sampling,
                output_token_ids=list(s.output_token_ids), token_times=list(s.token_times), epoch=s.epoch,
                resumed_from=len(s.output_token_ids), resumed_agent=source_id)
    t.state = SessionState.RESUMED
    dst_store.add(t)
    dst_client.start(t)
    s.handover = Handover(target=target_id, agent_id=target_id)
    s.set_state(SessionState.HANDED_OVER)
    return t


class ServedApp:
    """Run an ASGI app with uvicorn on an ephemeral loopback port inside the current loop."""

    def __init__(self, app) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.task: asyncio.Task | None = None

    async def __aenter__(self) -> "ServedApp":
        self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        while not self.server.started:
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.should_exit = True
        self.server.force_exit = True
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(self.task, 5)
        self.sock.close()


async def fake_attach(self, url: str, timeout_s: float | None = None) -> None:
    """Stand-in for ``agent.app.Agent.attach`` (monkeypatched onto the class): no vLLM; a
    FakeVllmClient and a connector hello of 32-token, 64 KiB blocks, 2 layers."""
    self.vllm_url = url
    self.vllm_client = self.migration.ctx.vllm_client = FakeVllmClient()
    self.hub.sched_info = SchedHello(block_size=32, free_blocks=100, num_blocks=120)
    self.hub.worker_info = WorkerHello(block_bytes=65536, num_layers=2, dtype="float32",
                                       model_dtype="float32")
