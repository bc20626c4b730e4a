"""UE front and UE client over real HTTP (uvicorn on loopback) with fake engines (no vLLM)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest

from pallas_eval.client import SessionError, UESession
from agent.frontend import SessionFront, new_session_credentials
from agent.session import SamplingSpec, Session, SessionState, SessionStore

import fakes_agent as fk

PROMPT = [5, 9, 11, 300, 2]
N = 60


def expected(n=N, prompt=PROMPT):
    return [fk.expected_token(prompt, i) for i in range(n)]


class Agent:
    def __init__(self, agent_id, step_s=0.005, **kw):
        self.id = agent_id
        self.store = SessionStore()
        self.vllm_client = fk.FakeVllmClient(step_s)
        self.opened = []
        self.front = SessionFront(self.store, self.vllm_client, agent_id=agent_id, resume_wait_s=3.0,
                                  on_open=lambda s, sch: self.opened.append((s.session_id, sch)), **kw)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_open_streams_every_token_with_indices_and_header():
    a = Agent("a")

    async def go():
        async with fk.ServedApp(a.front.app) as srv:
            ue = UESession(srv.url, ue_id="ue1")
            hdr = await ue.open(prompt_token_ids=PROMPT, max_tokens=N, scheme="ctho")
            toks = await ue.run()
            await ue.close()
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ue.token}"}) as c:
                info = (await c.get(f"{srv.url}/v1/sessions/{ue.session_id}")).json()
                full = (await c.get(f"{srv.url}/v1/sessions/{ue.session_id}",
                                    params={"include_tokens": "true"})).json()
                assert "output_token_ids" not in info
                assert full["output_token_ids"] == toks and len(full["token_times"]) == N
                assert [r.t_agent for r in ue.records] == full["token_times"]
                metrics = (await c.get(f"{srv.url}/metrics")).text
            return hdr, toks, ue, info, metrics

    hdr, toks, ue, info, metrics = run(go())
    assert hdr["object"] == "session" and hdr["agent_id"] == "a" and hdr["prompt_tokens"] == len(PROMPT)
    assert toks == expected()
    assert [r.index for r in ue.records] == list(range(N))
    assert ue.end["state"] == "finished" and ue.end["finish_reason"] == "length" and ue.end["next_index"] == N
    assert info["state"] == "finished" and info["output_tokens"] == N and info["ue_id"] == "ue1"
    assert a.opened[0][1] == 4  # SCHEME_CTHO pinned for the session
    assert 'pallas_sessions{state="finished"} 1.0' in metrics
    assert all(x >= 0 for x in ue.itls())


def test_bad_requests_are_refused_clearly():
    a = Agent("a")

    async def go():
        async with fk.ServedApp(a.front.app) as srv, httpx.AsyncClient() as c:
            r1 = await c.post(f"{srv.url}/v1/sessions", json={"prompt": "hello"})
            r2 = await c.post(f"{srv.url}/v1/sessions", json={"prompt_token_ids": [1, -2]})
            r3 = await c.post(f"{srv.url}/v1/sessions", json={"prompt_token_ids": [1], "max_tokens": 0})
            r4 = await c.post(f"{srv.url}/v1/sessions", content=b"{not json")
            r5 = await c.post(f"{srv.url}/v1/sessions", json={"prompt_token_ids": [1], "scheme": "warp"})
            sid, token = new_session_credentials()
            r6 = await c.get(f"{srv.url}/v1/sessions/{sid}", headers={"Authorization": f"Bearer {token}"})
            ok = await c.post(f"{srv.url}/v1/sessions", json={"prompt_token_ids": [1], "session_id": "x",
                                                              "stream": False})
            again = await c.post(f"{srv.url}/v1/sessions", json={"prompt_token_ids": [1], "session_id": "x",
                                                                 "stream": False})
            return r1, r2, r3, r4, r5, r6, ok, again

    r1, r2, r3, r4, r5, r6, ok, again = run(go())
    assert r1.status_code == 400 and "tokenizer" in r1.json()["error"]["message"]
    for r in (r2, r3, r4, r5):
        assert r.status_code == 400, r.text
    assert r6.status_code == 404
    # A client's session_id is a label: the front appends the token's digest, so a second
    # open with the same label is a new session (never a token for an existing id).
    assert ok.status_code == 200 and ok.json()["session_id"].startswith("x.")
    assert again.status_code == 200 and again.json()["session_id"].startswith("x.")
    assert again.json()["session_id"] != ok.json()["session_id"]


def test_session_outlives_the_ue_stream_and_resumes_from_an_index():
    a = Agent("a")

    async def go():
        async with fk.ServedApp(a.front.app) as srv:
            ue = UESession(srv.url, ue_id="ue1")
            await ue.open(prompt_token_ids=PROMPT, max_tokens=N)
            async for rec in ue.tokens():
                if rec.index == 9:
                    break
            await ue.close()  # the UE drops off; the session decodes on
            await asyncio.sleep(0.1)
            ue2 = UESession(srv.url, ue_id="ue1", session_id=ue.session_id, token=ue.token)
            ue2.records = list(ue.records)
            await ue2.resume()
            return await ue2.run(), ue2

    toks, ue2 = run(go())
    assert toks == expected()
    # Tokens decoded while the UE was away arrive in a burst when it comes back.
    assert ue2.records[10].index == 10


def test_handover_with_commit_in_flight_relays_then_serves_locally():
    """The UE reaches B before the commit lands: B relays A, then serves its own copy."""
    a, b = Agent("a", step_s=0.01), Agent("b", step_s=0.01)

    async def go():
        async with fk.ServedApp(a.front.app) as sa, fk.ServedApp(b.front.app) as sb:
            b.front.directory["a"] = sa.url  # B relays A: A's front is a peer front of B
            ue = UESession(sa.url, ue_id="ue1")
            await ue.open(prompt_token_ids=PROMPT, max_tokens=N)
            committed = False
            async for rec in ue.tokens():
                if rec.index == 14 and not ue.handovers:
                    await ue.handover(sb.url)
                elif rec.relayed_by == "b" and not committed:
                    # The xApp's commit lands after the UE reached B and B relayed A for a while
                    # (on B's first relayed token, not after a fixed sleep: a loaded host may
                    # take longer than any sleep to reconnect, and then nothing was relayed).
                    committed = True
                    fk.handover(a.store, ue.session_id, "b", b.store, b.vllm_client)
            assert committed
            await ue.close()
            return ue

    ue = run(go())
    assert ue.token_ids == expected()
    relayed = [r for r in ue.records if r.relayed_by == "b"]
    local_b = [r for r in ue.records if r.agent_id == "b" and r.relayed_by is None]
    assert relayed and local_b, "expected a relayed stretch then local serving at B"
    assert max(r.index for r in relayed) < min(r.index for r in local_b)
    assert ue.handovers[0].next_index >= 15 and len(ue.handover_gaps()) == 1


def test_handover_after_commit_serves_locally_from_the_right_index():
    a, b = Agent("a", step_s=0.01), Agent("b", step_s=0.01)

    async def go():
        async with fk.ServedApp(a.front.app) as sa, fk.ServedApp(b.front.app) as sb:
            b.front.directory["a"] = sa.url  # B relays A: A's front is a peer front of B
            ue = UESession(sa.url, ue_id="ue1")
            await ue.open(prompt_token_ids=PROMPT, max_tokens=N)
            async for rec in ue.tokens():
                if rec.index == 19 and not ue.handovers:
                    fk.handover(a.store, ue.session_id, "b", b.store, b.vllm_client)
                    await ue.handover(sb.url)
            await ue.close()
            return ue

    ue = run(go())
    assert ue.token_ids == expected()
    after = ue.records[ue.handovers[0].next_index:]
    assert after and all(r.agent_id == "b" and r.relayed_by is None for r in after)
    assert a.store.get(ue.session_id).state == SessionState.HANDED_OVER


def test_tokens_decoded_before_the_handover_are_the_sources_even_when_the_target_delivers_them():
    """The source decoded past what the UE got before the commit: the target delivers those
    carried tokens at once, attributed to the source that decoded them; its own from the resume
    point on. (The harness's SIT runs to the first token the new agent decoded; attributing the
    carried ones to it ended the SIT before the real stall.)"""
    a, b = Agent("a"), Agent("b")
    sid = "s" * 32

    async def go():
        src = a.store.add(Session(session_id=sid, ue_id="ue1", prompt_token_ids=list(PROMPT),
                                     sampling=SamplingSpec(max_tokens=N)))
        a.vllm_client.start(src)
        while len(src.output_token_ids) < 24:      # the UE got 0..19, then left
            await asyncio.sleep(0.005)
        t = fk.handover(a.store, sid, "b", b.store, b.vllm_client, source_id="a")
        out = []
        async for chunk in b.front.events(sid, 20, None, None):
            line = chunk.decode() if isinstance(chunk, bytes) else chunk
            for part in line.split("\n"):
                if part.startswith("data: {"):
                    ev = json.loads(part[6:])
                    if ev.get("object") == "session.token":
                        out.append((ev["index"], ev["agent_id"]))
        return t.resumed_from, out

    carried, out = run(go())
    assert carried >= 24 and [i for i, _ in out] == list(range(20, N))
    assert all(ag == "a" for i, ag in out if i < carried)
    assert all(ag == "b" for i, ag in out if i >= carried)


def test_detour_relays_every_later_token_through_the_new_agent():
    a, b = Agent("a"), Agent("b")

    async def go():
        async with fk.ServedApp(a.front.app) as sa, fk.ServedApp(b.front.app) as sb:
            b.front.directory["a"] = sa.url  # B relays A: A's front is a peer front of B
            ue = UESession(sa.url, ue_id="ue1")
            await ue.open(prompt_token_ids=PROMPT, max_tokens=N)
            async for rec in ue.tokens():
                if rec.index == 9 and not ue.handovers:
                    await ue.handover(sb.url)
            await ue.close()
            return ue

    ue = run(go())
    assert ue.token_ids == expected()
    after = ue.records[ue.handovers[0].next_index:]
    assert after and all(r.relayed_by == "b" and r.agent_id == "a" for r in after)
    assert ue.end["state"] == "finished" and ue.end["relayed_by"] == "b"
    assert b.store.get(ue.session_id) is None  # B never held the session


def test_detour_over_two_handovers_relays_through_the_previous_agent_without_a_stall():
    """The session stays at A; the UE goes A -> B -> C and names its previous agent (B) as
    origin. B never held the session: it relays it on from A (one more hop), instead of
    waiting resume_wait_s for a session that never comes (5-28 s stalls in the replay)."""
    a, b, c = Agent("a", step_s=0.02), Agent("b", step_s=0.02), Agent("c", step_s=0.02)

    async def go():
        async with fk.ServedApp(a.front.app) as sa, fk.ServedApp(b.front.app) as sb, \
                fk.ServedApp(c.front.app) as sc:
            b.front.directory["a"] = sa.url
            c.front.directory["b"] = sb.url
            ue = UESession(sa.url, ue_id="ue1")
            await ue.open(prompt_token_ids=PROMPT, max_tokens=N)
            async for rec in ue.tokens():
                if rec.index == 9 and not ue.handovers:
                    await ue.handover(sb.url)
                elif rec.index == 19 and len(ue.handovers) == 1:
                    await ue.handover(sc.url)
            await ue.close()
            return ue, sa.url

    ue, a_url = run(go())
    assert ue.token_ids == expected()
    after = ue.records[ue.handovers[1].next_index:]
    assert after and all(r.relayed_by == "c" and r.agent_id == "a" for r in after)
    assert max(ue.itls()) < 1.0, max(ue.itls())      # resume_wait_s is 3 s in these tests
    assert b.front.relay_origin(ue.session_id) == a_url and b.store.get(ue.session_id) is None


def test_detour_ue_coming_back_to_an_agent_it_left_is_relayed_without_a_loop():
    """The session stays at A; the UE goes A -> B -> C -> B, naming its previous agent as
    origin each time. B and C relay from the holder A (at most two hops); B coming back from C
    must not relay C while C relays B (a loop that flooded the fronts in the replay)."""
    a, b, c = Agent("a", step_s=0.02), Agent("b", step_s=0.02), Agent("c", step_s=0.02)

    async def go():
        async with fk.ServedApp(a.front.app) as sa, fk.ServedApp(b.front.app) as sb, \
                fk.ServedApp(c.front.app) as sc:
            b.front.directory.update(a=sa.url, c=sc.url)
            c.front.directory.update(a=sa.url, b=sb.url)
            ue = UESession(sa.url, ue_id="ue1")
            await ue.open(prompt_token_ids=PROMPT, max_tokens=N)
            path = {9: sb.url, 19: sc.url, 29: sb.url}
            async for rec in ue.tokens():
                nxt = path.pop(rec.index, None)
                if nxt:
                    await ue.handover(nxt)
            await ue.close()
            return ue

    ue = run(go())
    assert ue.token_ids == expected()
    assert [h.to_url for h in ue.handovers][-1] == ue.handovers[0].to_url
    after = ue.records[ue.handovers[2].next_index:]
    assert after and all(r.relayed_by == "b" and r.agent_id == "a" for r in after)
    assert max(ue.itls()) < 1.0, max(ue.itls())


def test_a_to_b_to_a_with_stale_record_at_a():
    a, b = Agent("a", step_s=0.01), Agent("b", step_s=0.01)

    async def go():
        async with fk.ServedApp(a.front.app) as sa, fk.ServedApp(b.front.app) as sb:
            a.front.directory["b"], b.front.directory["a"] = sb.url, sa.url
            ue = UESession(sa.url, ue_id="ue1")
            await ue.open(prompt_token_ids=PROMPT, max_tokens=N)
            async for rec in ue.tokens():
                if rec.index == 14 and len(ue.handovers) == 0:
                    fk.handover(a.store, ue.session_id, "b", b.store, b.vllm_client)
                    await ue.handover(sb.url)
                elif rec.index == 34 and len(ue.handovers) == 1:
                    await ue.handover(sa.url)  # A still holds its old handed-over record

                    async def back():
                        await asyncio.sleep(0.1)
                        fk.handover(b.store, ue.session_id, "a", a.store, a.vllm_client)
                    asyncio.create_task(back())
            await ue.close()
            return ue

    ue = run(go())
    assert ue.token_ids == expected()
    assert [h.to_url.split(":")[-1] for h in ue.handovers][0] != [h.to_url.split(":")[-1] for h in ue.handovers][1]
    assert ue.records[-1].agent_id == "a" and ue.records[-1].relayed_by is None


@contextlib.asynccontextmanager
async def _peered(a, b):
    """A's and B's fronts served and in each other's directory; a UE streaming at A."""
    async with fk.ServedApp(a.front.app) as sa, fk.ServedApp(b.front.app) as sb:
        a.front.directory["b"], b.front.directory["a"] = sb.url, sa.url
        ue = UESession(sa.url, ue_id="ue1")
        await ue.open(prompt_token_ids=PROMPT, max_tokens=N)
        try:
            yield sa, sb, ue
        finally:
            await ue.close()


def test_ue_left_at_the_source_is_served_through_a_relay_of_the_new_holder():
    """The commit moves the session while the UE stays in the old cell: its stream goes on."""
    a, b = Agent("a", step_s=0.01), Agent("b", step_s=0.01)

    async def go():
        async with _peered(a, b) as (_, _, ue):
            async for rec in ue.tokens():
                if rec.index == 14 and b.store.get(ue.session_id) is None:
                    fk.handover(a.store, ue.session_id, "b", b.store, b.vllm_client)
        return ue

    ue = run(go())
    assert ue.token_ids == expected() and not ue.handovers
    late = ue.records[-1]
    assert late.agent_id == "b" and late.relayed_by == "a", late
    assert ue.end["state"] == "finished"


def test_ue_back_at_the_source_before_the_commit_lands_loses_nothing():
    """A -> B -> A ping-pong while the commit A -> B is still in flight (seen in a replay)."""
    a, b = Agent("a", step_s=0.01), Agent("b", step_s=0.01)

    async def go():
        async with _peered(a, b) as (sa, sb, ue):
            commit = None
            async for rec in ue.tokens():
                if rec.index == 14 and not ue.handovers:
                    await ue.handover(sb.url)  # B relays A: the commit has not landed

                    async def late_commit():
                        await asyncio.sleep(0.25)
                        fk.handover(a.store, ue.session_id, "b", b.store, b.vllm_client)
                    commit = asyncio.create_task(late_commit())
                elif rec.index == 18 and len(ue.handovers) == 1:
                    await ue.handover(sa.url)  # back before the commit lands
            await commit
        return ue

    ue = run(go())
    assert ue.token_ids == expected()
    assert ue.records[-1].agent_id == "b" and ue.records[-1].relayed_by == "a"


def test_resume_of_unknown_session_without_origin_is_404():
    a = Agent("a")
    a.front.resume_wait_s = 0.1

    async def go():
        async with fk.ServedApp(a.front.app) as sa:
            sid, token = new_session_credentials()  # a valid token of a session never opened
            ue = UESession(sa.url, ue_id="ue1", session_id=sid, token=token)
            await ue.resume()
            with pytest.raises(SessionError, match="404"):
                await ue.run()

    run(go())


def test_client_refuses_a_diverging_resume():
    ue = UESession("http://127.0.0.1:1", ue_id="x")
    ue._on_token({"index": 0, "token_id": 5})
    ue._on_token({"index": 0, "token_id": 5})  # duplicate is dropped
    assert ue.token_ids == [5]
    with pytest.raises(SessionError, match="differs"):
        ue._on_token({"index": 0, "token_id": 6})
    with pytest.raises(SessionError, match="gap"):
        ue._on_token({"index": 3, "token_id": 6})


def test_sse_shape():
    from agent.frontend import sse
    assert sse({"a": 1}) == b'data: {"a":1}\n\n' and sse("[DONE]") == b"data: [DONE]\n\n"
    assert json.loads(sse({"x": [1, 2]})[6:]) == {"x": [1, 2]}
