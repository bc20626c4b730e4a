"""Issue 25 item 1: every vLLM failure the agent can see is a failed session, never a finished
one. A fake vLLM (an httpx transport that answers ``/v1/completions`` as vLLM's OpenAI server
does, or fails as it does) drives the real :class:`agent.session.VllmClient`; the migration engine
runs with fake peers over real gRPC (tests/agent/migration/fakes.py).

Paths: an ``{"error": ...}`` chunk (vLLM's GenerationError, e.g. a KV load failure under
``kv_load_failure_policy=fail`` or a dead engine core), a stream that ends without a
``finish_reason``, ``finish_reason`` "error", an HTTP error status, no connection (the server
gone), a connection that breaks mid-stream; then what follows at the source (Control replies,
the attempt abandoned, a failure during the commit) and at the target (a resume that fails
before its claim, blocks reported failed), and the UE's end event.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from pallas_proto import pallas_pb2 as pb

from agent.connector.messages import Loaded
from agent.frontend import SessionFront
from agent.states import (SESSION_TERMINAL, SESSION_TRANSITIONS, IllegalTransition,
                                    check_session)
from agent.obs import SESSION_FAILURES
from agent.session import SamplingSpec, Session, SessionState, SessionStore, VllmClient

from migration.fakes import Target, _blk, _engine, _prep, _served, _serving, walk_table

PROMPT = [5, 9, 11, 300, 2]


def _chunk(tokens, finish=None) -> bytes:
    c = {"id": "cmpl-1", "object": "text_completion", "choices": [
        {"index": 0, "text": "", "token_ids": list(tokens), "finish_reason": finish}]}
    return b"data: " + json.dumps(c).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
ERROR = (b'data: {"error": {"message": "Internal server error", "type": "InternalServerError",'
         b' "param": null, "code": 500}}\n\n')


class FakeVLLM:
    """``/v1/completions`` of a fake vLLM OpenAI server.

    ``script``: what one streamed completion sends, a list of byte chunks, where an exception
    instance is raised at that point (the connection breaks); ``status`` / ``body``: an error
    answer instead; ``refuse``: no connection at all (the server is gone). Every request body
    is recorded in ``requests``; a request that does not stream (a warm-up) gets one token.
    """

    def __init__(self, script=(), status=200, body=b"", refuse=False, gap_s=0.0):
        self.script, self.status, self.body, self.refuse = list(script), status, body, refuse
        self.gap_s = gap_s
        self.requests: list[dict] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.refuse:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        self.requests.append(json.loads(request.content))
        if self.status != 200:
            return httpx.Response(self.status, content=self.body)
        body = self.requests[-1]
        if not body.get("stream"):   # a warm-up prefill
            return httpx.Response(200, json={"choices": [{"token_ids": [1]}], "usage": {
                "prompt_tokens": len(body["prompt"]), "prompt_tokens_details": None}})
        script, gap = self.script, self.gap_s

        async def stream():
            for item in script:
                if isinstance(item, Exception):
                    raise item
                await asyncio.sleep(gap)
                yield item
        return httpx.Response(200, content=stream(),
                              headers={"content-type": "text/event-stream"})

    def client(self) -> VllmClient:
        return VllmClient("http://vllm.test", "tiny", transport=httpx.MockTransport(self))


def _failures(role: str, cause: str) -> float:
    return SESSION_FAILURES.labels(role, cause)._value.get()


async def _generate(fake: FakeVLLM, session: Session | None = None) -> Session:
    eng = fake.client()
    s = session or Session("s", "ue", list(PROMPT), SamplingSpec(max_tokens=8))
    failed: list[Session] = []
    eng.on_failed = failed.append
    task = eng.start(s)
    await asyncio.wait_for(task, 5)
    await eng.close()
    assert failed == ([s] if s.state == SessionState.FAILED else [])
    return s


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


# ------------------------------------------------------------------ the vLLM client

def test_a_finish_reason_finishes_the_session():
    s = run(_generate(FakeVLLM([_chunk([7, 8]), _chunk([9], "length"), DONE])))
    assert s.state == SessionState.FINISHED and s.finish_reason == "length"
    assert s.output_token_ids == [7, 8, 9] and s.error == ""


@pytest.mark.parametrize("script,cause,words", [
    # vLLM's GenerationError (a KV load failure under failure_policy=fail, an engine core that
    # died): the error object in the stream, then [DONE]. The client dropped it: the session
    # stayed serving/resumed for ever (the UE hung) or was read as finished at the commit.
    ([_chunk([7, 8]), ERROR, DONE], "stream_error", "Internal server error (code 500)"),
    # [DONE] without a finish_reason: the request did not complete.
    ([_chunk([7, 8]), DONE], "no_finish_reason", "without a finish_reason"),
    # the stream just stops (the server shut down) without [DONE] or a finish_reason
    ([_chunk([7, 8])], "no_finish_reason", "after 2 output tokens"),
    ([_chunk([7, 8]), _chunk([], "error"), DONE], "request_error", "finished the request with an error"),
    ([_chunk([7, 8]), httpx.RemoteProtocolError("peer closed connection")], "connection_lost",
     "broke mid-stream"),
])
def test_every_failure_in_the_stream_fails_the_session_with_its_reason(script, cause, words):
    before = _failures("source", cause)
    s = run(_generate(FakeVLLM(script)))
    assert s.state == SessionState.FAILED and s.finish_reason is None, s.state
    assert words in s.error and s.failure_cause == cause, s.error
    assert s.output_token_ids == [7, 8]          # what the UE got before the failure stays
    assert _failures("source", cause) == before + 1


def test_an_http_error_and_a_server_that_is_gone_fail_the_session():
    s = run(_generate(FakeVLLM(status=500, body=b'{"error": {"message": "EngineDeadError"}}')))
    assert s.state == SessionState.FAILED and s.failure_cause == "http_status"
    assert "HTTP 500" in s.error and "EngineDeadError" in s.error
    s = run(_generate(FakeVLLM(refuse=True)))
    assert s.state == SessionState.FAILED and s.failure_cause == "unreachable"
    assert "unreachable" in s.error and "Connection refused" in s.error


def test_a_kv_load_failure_at_a_resume_names_the_blocks():
    before = _failures("target", "kv_load")
    s = Session("s", "ue", list(PROMPT), SamplingSpec(max_tokens=8), resumed_agent="a",
                resumed_from=0, state=SessionState.RESUMED)
    s.loaded = Loaded("s", 1, blocks=(2,), failed=(3,))
    s = run(_generate(FakeVLLM([ERROR, DONE]), s))
    assert s.state == SessionState.FAILED and s.failure_cause == "kv_load"
    assert "blocks [3] failed to load" in s.error and "Internal server error" in s.error
    assert _failures("target", "kv_load") == before + 1


def test_a_failure_while_frozen_is_held_until_the_commit_decides():
    async def go():
        fake = FakeVLLM([_chunk([7, 8, 9]), ERROR, DONE], gap_s=0.01)
        s = Session("s", "ue", list(PROMPT), SamplingSpec(max_tokens=8))
        eng = fake.client()
        task = eng.start(s)
        s.freeze(0)                                 # a commit at output 0
        await task
        held = (s.state, list(s.output_token_ids), s.held_error)
        s.unfreeze()                                # the commit failed: the failure shows
        await eng.close()
        return held, s
    (state, out, err), s = run(go())
    assert state == SessionState.SERVING and out == [] and err[1] == "stream_error"
    assert s.state == SessionState.FAILED and s.output_token_ids == [7, 8, 9]
    assert "Internal server error" in s.error and s.held_error is None


# ------------------------------------------------------------------ the session state table

def test_session_transition_table_is_walked_and_enforced():
    """Every move listed is allowed and every other refused; FAILED and HANDED_OVER are
    terminal; FINISHED is left only by handing the finished record over."""
    walk_table(list(SessionState), SESSION_TRANSITIONS, SESSION_TERMINAL, check_session,
               allowed=lambda a, b: a == b)
    assert SESSION_TERMINAL == {SessionState.FAILED, SessionState.HANDED_OVER}
    assert SESSION_TRANSITIONS[SessionState.FINISHED] == {SessionState.HANDED_OVER}
    for live in (SessionState.SERVING, SessionState.MIGRATING, SessionState.COMMITTING,
                 SessionState.RESUMED):
        assert SessionState.FAILED in SESSION_TRANSITIONS[live]
    s = Session("s", "ue", [1])
    assert s.fail("vLLM is gone", "unreachable") and s.state == SessionState.FAILED
    assert not s.fail("again") and s.error == "vLLM is gone"    # the first reason stays
    with pytest.raises(IllegalTransition):
        s.set_state(SessionState.SERVING)
    with pytest.raises(IllegalTransition):
        s.set_state(SessionState.FINISHED, finish_reason="length")


# ------------------------------------------------------------------ the UE's stream

def test_the_ues_stream_ends_with_an_error_event_naming_the_failure():
    async def go():
        fake = FakeVLLM([_chunk([7, 8]), ERROR, DONE])
        store, eng = SessionStore(), fake.client()
        front = SessionFront(store, eng, agent_id="a")
        transport = httpx.ASGITransport(app=front.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://front") as c:
            r = await c.post("/v1/sessions", json={"prompt_token_ids": PROMPT, "max_tokens": 8})
            events = [json.loads(line[6:]) for line in r.text.splitlines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
            sid = events[0]["session_id"]
            info = (await c.get(f"/v1/sessions/{sid}", headers={
                "Authorization": f"Bearer {events[0]['session_token']}"})).json()
        await front.aclose()
        await eng.close()
        return events, info
    events, info = run(go())
    assert [e["token_id"] for e in events if e["object"] == "session.token"] == [7, 8]
    end = events[-1]
    assert end["object"] == "session.end" and end["state"] == "failed"
    assert end["finish_reason"] is None and end["next_index"] == 2
    assert "vLLM failed the request: Internal server error" in end["error"]
    assert info["state"] == "failed" and info["error"] == end["error"]


# ------------------------------------------------------------------ source side

def test_control_calls_about_a_failed_session_are_not_ok_and_name_the_reason():
    async def run_():
        m, hub, eng = _engine()
        target = Target()
        server, tgt = await _served(target)
        s = _serving(m, n_prompt=100)
        try:
            assert (await m.trigger("s", 1, tgt, split_tokens=96)).status == pb.STATUS_OK
            # the source engine dies between Trigger and Commit
            assert s.fail("vLLM at http://x is unreachable: ConnectError", "unreachable")
            m.session_failed(s)
            await asyncio.sleep(0.2)                 # the attempt is abandoned at once
            released = target.ops().count("release")
            held = m.held()["outbound"]
            c = await m.commit("s", 1, tgt, pb.SCHEME_PALLAS)
            t = await m.trigger("s", 2, tgt)
            d = await m.commit("s", 3, tgt, "detour")
        finally:
            await m.close()
            await server.stop(0)
        return s, released, held, c, t, d, target
    s, released, held, c, t, d, target = asyncio.run(run_())
    assert released == 1 and held == 0
    for rep in (c, t, d):
        assert rep.status == pb.STATUS_ERROR and rep.state == pb.SESSION_FAILED, rep
        assert "session failed at agent b: vLLM at http://x is unreachable" in rep.message
    assert "sync" not in target.ops() and s.state == SessionState.FAILED


async def _commit_while_the_source_dies(target: Target):
    """Commit session "s" (3 of 2,000 tokens out) to ``target`` by Recomputation while the
    source's request fails 50 ms in (as the commit freezes it); returns (reply, session)."""
    m, hub, eng = _engine()
    server, tgt = await _served(target)
    s = _serving(m, n_prompt=40, outputs=(5, 6, 7), max_tokens=2000)

    async def dies():
        await asyncio.sleep(0.05)
        s.fail("vLLM failed the request: EngineDeadError", "stream_error")
    s._task = asyncio.ensure_future(dies())
    try:
        await asyncio.sleep(0)
        return await m.commit("s", 1, tgt, pb.SCHEME_RECOMPUTATION), s
    finally:
        await m.close()
        await server.stop(0)


def test_a_source_request_that_fails_during_the_commit_is_continued_by_the_target():
    """The commit point's tokens are all known: the target takes over and generates every
    token still owed (the issue's "finished" after 44 of 2,000 tokens asked max_tokens=0)."""
    target = Target()
    r, s = asyncio.run(_commit_while_the_source_dies(target))
    assert r.status == pb.STATUS_OK, r
    (sync,) = [c[1] for c in target.calls if c[0] == "sync"]
    assert sync.sampling.max_tokens == 2000 - 3 and len(sync.token_ids) == 43
    assert s.state == SessionState.HANDED_OVER and s.held_error is None


def test_a_failed_commit_after_a_source_failure_leaves_the_session_failed_with_its_reason():
    r, s = asyncio.run(_commit_while_the_source_dies(Target(sync_status=pb.STATUS_ERROR,
                                                            sync_delay_s=0.3)))
    assert r.status == pb.STATUS_ERROR and r.state == pb.SESSION_FAILED
    assert "the session failed at the source meanwhile: vLLM failed the request" in r.message
    assert s.state == SessionState.FAILED and s.frozen_at is None


# ------------------------------------------------------------------ target side

def test_a_resume_that_vllm_fails_before_its_claim_fails_the_sync_and_holds_nothing():
    """The target's vLLM refuses (or is gone): the Sync is answered non-OK with the reason, the
    session is not kept there (the source serves on: one holder) and the blocks are freed."""
    async def run_(fake):
        m, hub, eng = _engine(claim_wait_s=5.0, resume_deadline_s=5.0)
        m.ctx.vllm_client = fake.client()
        assert (await m.target.on_prepare(_prep(prefix=64))).status == pb.STATUS_OK
        assert m.target.on_block(_blk(2)) == "ok"
        t0 = asyncio.get_running_loop().time()
        rep = await m.target.on_sync(pb.SyncRequest(
            session_id="s", epoch=1, token_ids=list(range(100)), prompt_tokens=70,
            streamed_blocks=1, split_tokens=64, ue_id="ue",
            sampling=pb.SamplingParams(max_tokens=20), deadline_s=8.0))
        took = asyncio.get_running_loop().time() - t0
        await asyncio.sleep(0.05)
        held = m.held()
        await m.ctx.vllm_client.close()
        await m.close()
        return rep, took, held, m.ctx.sessions.get("s")
    for fake, words in ((FakeVLLM([ERROR, DONE]), "Internal server error"),
                        (FakeVLLM(refuse=True), "unreachable")):
        rep, took, held, s = asyncio.run(run_(fake))
        assert rep.status == pb.STATUS_ERROR and words in rep.message, rep
        assert "the resume failed at the target" in rep.message
        assert took < 2.0, took                      # not the claim wait of 10 s
        assert s is None and held["inbound"] == 0 and held["blocks"] == 0, held


def test_blocks_vllm_reports_failed_to_load_are_released():
    async def run_():
        m, hub, eng = _engine()
        assert (await m.target.on_prepare(_prep(prefix=64))).status == pb.STATUS_OK
        assert m.target.on_block(_blk(2)) == "ok" and m.target.on_block(_blk(3)) == "ok"
        m.target.on_loaded(Loaded("s", 2, blocks=(2,), failed=(3,)))   # another epoch: kept
        await asyncio.sleep(0.01)
        kept = m.held()["blocks"]
        m.target.on_loaded(Loaded("s", 1, blocks=(2,), failed=(3,)))
        await asyncio.sleep(0.01)
        held = m.held()
        await m.close()
        return kept, held
    kept, held = asyncio.run(run_())
    assert kept == 2
    assert held["inbound"] == 0 and held["blocks"] == 0 and held["reserved_bytes"] == 0


# ------------------------------------------------------------------ attach

@pytest.mark.parametrize("policy", ["fail", "", "recompute"])
def test_attach_refuses_a_vllm_whose_failed_block_loads_fail_the_request(policy):
    """Issue 25 item 2: the connector reports vLLM's kv_load_failure_policy; an attached vLLM
    (``--vllm-url``) that would fail a request on a block that did not load is refused with
    the reason and the fix; "recompute" is taken."""
    from agent.app import Agent, parse_args
    from agent.connector.messages import SchedHello, WorkerHello
    from agent.migration import MigrationEngine

    async def go():
        a = Agent(parse_args(["--model", "m", "--vllm-url", "http://127.0.0.1:1", "--insecure"]))
        a.migration = MigrationEngine(agent_id="a", peer_address="", sessions=a.sessions,
                                      vllm_client=a.vllm_client, hub=a.hub, identity=a.identity)
        a.hub.sched_info = SchedHello(block_size=32, load_failure_policy=policy)
        a.hub.worker_info = WorkerHello(block_bytes=64, num_layers=1, dtype="float32")
        a.hub._ready.set()
        orig = VllmClient.__init__

        def init(self, base_url, model, **kw):   # attach's client talks to the fake vLLM
            orig(self, base_url, model, transport=httpx.MockTransport(
                lambda req: httpx.Response(200)))
        VllmClient.__init__ = init
        try:
            if policy == "recompute":
                await a.attach("http://127.0.0.1:1", timeout_s=2)
                assert a.vllm_client.on_failed == a.migration.session_failed
                return None
            with pytest.raises(RuntimeError) as e:
                await a.attach("http://127.0.0.1:1", timeout_s=2)
            return str(e.value)
        finally:
            VllmClient.__init__ = orig
            await a.vllm_client.close()
    msg = asyncio.run(go())
    if policy != "recompute":
        assert "would fail the user's request" in msg and '"kv_load_failure_policy": "recompute"' in msg
        assert ("kv_load_failure_policy='fail'" if policy else "no kv_load_failure_policy") in msg


# ------------------------------------------------------------------ one holder (item 3)

class _Aborts:
    """A fake vLLM client's ``start``/``abort`` that records the sessions aborted (the request
    never gets going: no claim comes)."""

    def __init__(self, eng):
        self.aborted: list[str] = []

        async def abort(s):
            self.aborted.append(s.session_id)
        eng.abort = abort


async def _resumed(m):
    """Prepare, one block, a Sync and vLLM's claim: the session resumed at ``m``."""
    from agent.connector.messages import Claim
    assert (await m.target.on_prepare(_prep(prefix=64))).status == pb.STATUS_OK
    assert m.target.on_block(_blk(2)) == "ok"
    sync = asyncio.ensure_future(_resume(m))
    await asyncio.sleep(0.01)
    m.target.on_claim(Claim("s", 1, 64, 32, 100, 0.0, ()))
    assert (await sync).status == pb.STATUS_OK
    return m.ctx.sessions.get("s")


def _resume(m, deadline_s=8.0, epoch=1):
    return m.target.on_sync(pb.SyncRequest(
        session_id="s", epoch=epoch, token_ids=list(range(100)), prompt_tokens=70,
        streamed_blocks=1, split_tokens=64, ue_id="ue",
        sampling=pb.SamplingParams(max_tokens=20), deadline_s=deadline_s))


def test_a_sync_not_taken_up_by_vllm_is_undone_before_the_sources_deadline():
    """The target's vLLM is full (its request waits, no claim): the Sync used to wait
    resume + claim bounds (10 s) past the source's deadline, the source gave up and the
    target kept a resumed copy that decoded later (two holders)."""
    async def run_():
        m, hub, eng = _engine(claim_wait_s=5.0, resume_deadline_s=5.0)
        ab = _Aborts(eng)
        assert (await m.target.on_prepare(_prep(prefix=64))).status == pb.STATUS_OK
        assert m.target.on_block(_blk(2)) == "ok"
        t0 = asyncio.get_running_loop().time()
        rep = await _resume(m, deadline_s=1.0)
        took = asyncio.get_running_loop().time() - t0
        await asyncio.sleep(0.01)
        held, s = m.held(), m.ctx.sessions.get("s")
        await m.close()
        return rep, took, held, s, ab.aborted
    rep, took, held, s, aborted = asyncio.run(run_())
    assert rep.status == pb.STATUS_ERROR and "resume undone" in rep.message, rep
    assert 0.85 <= took < 1.0, took                      # answered before the source's 1 s
    assert aborted == ["s"] and s.state == SessionState.HANDED_OVER
    assert s.handover.agent_id == "a" and held["inbound"] == 0 and held["blocks"] == 0


def test_a_release_from_the_source_undoes_a_resume_it_gave_up_and_a_cancel_does_not():
    """The source's Sync timed out (or failed) after the target resumed: its Release of that
    epoch hands the session back (the source serves on); the xApp's Cancel at the target
    (undo_resume=False) leaves a resume alone (the xApp cannot know the commit failed)."""
    async def run_():
        m, hub, eng = _engine()
        ab = _Aborts(eng)
        s = await _resumed(m)
        kept = await m.target.on_release(pb.ReleaseRequest(session_id="s", epoch=1, reason="x"),
                                         undo_resume=False)
        kept_state = s.state
        undone = await m.target.on_release(pb.ReleaseRequest(session_id="s", epoch=1,
                                                             reason="sync failed"))
        held = m.held()
        await m.close()
        return kept, kept_state, undone, s, held, ab.aborted
    kept, kept_state, undone, s, held, aborted = asyncio.run(run_())
    assert kept.status == pb.STATUS_OK and kept_state == SessionState.RESUMED
    assert undone.status == pb.STATUS_OK and "resume undone" in undone.message
    assert s.state == SessionState.HANDED_OVER and aborted == ["s"]
    assert held["inbound"] == 0 and held["blocks"] == 0


def test_the_source_releases_an_abandoned_sync_before_it_answers_and_a_retry_commits():
    """A Sync that times out at the source is released at the target before the xApp gets
    the non-OK reply; the xApp's retry of the same commit (same epoch) runs again and
    commits (it used to get the cached failure)."""
    async def run_():
        m, hub, eng = _engine(commit_deadline_s=0.5)
        target = Target(sync_delay_s=30.0)
        server, tgt = await _served(target)
        s = _serving(m)
        try:
            r1 = await m.commit("s", 1, tgt, pb.SCHEME_RECOMPUTATION)
            ops1 = target.ops()
            state1 = s.state
            target.sync_delay_s = 0.0
            r2 = await m.commit("s", 1, tgt, pb.SCHEME_RECOMPUTATION)
            r3 = await m.commit("s", 1, tgt, pb.SCHEME_RECOMPUTATION)
        finally:
            await m.close()
            await server.stop(0)
        return r1, ops1, state1, r2, r3, s, target.ops()
    r1, ops1, state1, r2, r3, s, ops = asyncio.run(run_())
    assert r1.status == pb.STATUS_ERROR and ops1 == ["prepare", "sync", "release"], ops1
    assert state1 == SessionState.SERVING
    assert r2.status == pb.STATUS_OK and s.state == SessionState.HANDED_OVER, r2
    assert r3 == r2 and ops.count("sync") == 2                 # an OK reply stays cached


@pytest.mark.parametrize("deadline_passed", [True, False])
def test_a_sync_cancelled_before_its_answer_is_undone_at_its_deadline_only(deadline_passed):
    """The Sync's gRPC call is cancelled while the target waits for vLLM's claim. At the
    call's deadline (the Sync reached a loaded target late) the source saw no OK and serves on,
    so the target hands the session back by itself: the resumed request aborted, its blocks
    dropped, nothing held (the soak found such copies left RESUMED for ever when the Release
    timed out too). Before its deadline the source went away (its agent died): the target keeps
    the session (tests/e2e/test_engine_faults.py has that case on real vLLM)."""
    from agent.transfer import CALL_DEADLINE

    async def run_():
        m, hub, eng = _engine(claim_wait_s=5.0, resume_deadline_s=5.0)
        ab = _Aborts(eng)
        assert (await m.target.on_prepare(_prep(prefix=64))).status == pb.STATUS_OK
        assert m.target.on_block(_blk(2)) == "ok"
        now = asyncio.get_running_loop().time()   # the loop's clock is time.monotonic()
        CALL_DEADLINE.set(now if deadline_passed else now + 60.0)
        sync = asyncio.ensure_future(_resume(m, deadline_s=8.0))
        while not eng.started:                       # the resumed request is submitted
            await asyncio.sleep(0.001)
        sync.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sync
        for _ in range(30):                          # the undo runs in a task of its own
            if ab.aborted:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)
        held, s = m.held(), m.ctx.sessions.get("s")
        await m.close()
        return held, s, ab.aborted
    held, s, aborted = asyncio.run(run_())
    if deadline_passed:
        assert aborted == ["s"] and s.state == SessionState.HANDED_OVER
        assert s.handover.agent_id == "a"
        assert held["inbound"] == 0 and held["blocks"] == 0
    else:
        assert aborted == [] and s.state == SessionState.RESUMED


def test_a_release_cancelled_mid_undo_still_hands_the_session_back():
    """The Release that undoes a resume is itself cut short (its deadline passed while the
    target's vLLM was slow to abort): the undo still completes."""
    async def run_():
        m, hub, eng = _engine()
        gate = asyncio.Event()
        aborted = []

        async def slow_abort(s):
            await gate.wait()
            aborted.append(s.session_id)
        eng.abort = slow_abort
        s = await _resumed(m)
        rel = asyncio.ensure_future(m.target.on_release(pb.ReleaseRequest(session_id="s", epoch=1,
                                                                          reason="sync failed")))
        await asyncio.sleep(0.01)
        rel.cancel()
        with pytest.raises(asyncio.CancelledError):
            await rel
        state_cut = s.state
        gate.set()
        for _ in range(100):
            if s.state == SessionState.HANDED_OVER:
                break
            await asyncio.sleep(0.01)
        held = m.held()
        await m.close()
        return state_cut, s, held, aborted
    state_cut, s, held, aborted = asyncio.run(run_())
    assert state_cut == SessionState.RESUMED            # cut while the abort was under way
    assert aborted == ["s"] and s.state == SessionState.HANDED_OVER
    assert held["inbound"] == 0 and held["blocks"] == 0
