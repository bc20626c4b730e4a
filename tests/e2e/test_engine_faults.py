"""The migration engine's faults of issue 12 and the commit-time choice of issue 13, on two
real vLLM CPU servers with the Pallas connector (tiny random model, greedy, token-exact).

- a commit the target refuses is answered non-OK and the source serves on, token-exact;
- a prepared target whose source goes silent frees its blocks and its KV reservation;
- a commit right after the trigger (the target's warm-up still running) takes the
  commit-time choice, reports it, and continues token-exact;
- a session cancelled at the target while its received blocks are being loaded into vLLM
  frees them (the agent's buffers, the connector's view, vLLM's KV pool back to its baseline)
  and the next session is admitted there, token-exact;
- a target whose source dies in the middle of the commit (its Sync call cut off while the
  target waits for the connector's claim) resumes the session within the commit's deadline
  and continues token-exact, then holds nothing.

(Commits at exactly k * block_size and k * block_size + 1 tokens are cases of
test_migration.py's token-exact table: ``tokens_end_on_block_boundary`` and
``kv_ends_on_block_boundary``.)
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import pytest

pytestmark = pytest.mark.vllm

from agent.app import Agent, AgentConfig  # noqa: E402
from agent.connector.messages import Claim, Fetch  # noqa: E402
from pallas_eval.localca import LocalCA  # noqa: E402
from pallas_common.tls import LinkSecurity  # noqa: E402
from pallas_eval.emulation import E2E_PACE, server_settings  # noqa: E402
from pallas_eval.models import build_model  # noqa: E402
from tests.e2e.loops import LoopThread  # noqa: E402
from tests.faults import hold_back  # noqa: E402
from agent.server import ServerConfig, VLLMServer, free_port  # noqa: E402
from agent.session import SamplingSpec, Session, SessionState  # noqa: E402
from agent.states import SourceState  # noqa: E402
from pallas_proto import pallas_pb2 as pb  # noqa: E402

IDLE_S = 3.0  # B drops a prepared attempt whose source is silent this long


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    model = str(build_model("tiny"))
    lt = LoopThread()
    nodes, servers = [], []
    names = ("ea", "eb")
    ca, pki = LocalCA("pallas-e2e-ca"), tmp_path_factory.mktemp("tls")
    try:
        for i, name in enumerate(names):
            cfg = AgentConfig(agent_id=name, model=model, host="127.0.0.1", peer_port=free_port(),
                              hub_address=f"tcp://127.0.0.1:{free_port()}", vllm_url="-",
                              resume_deadline_s=20.0, commit_deadline_s=30.0,
                              lease_s=IDLE_S, peer_identity=[n for n in names if n != name])
            a = Agent(cfg, LinkSecurity(ca.write(pki, name)))  # mutual TLS on the peer links
            lt.run(a.start_core())
            srv = VLLMServer(ServerConfig(model=model, agent_address=a.hub.address,
                                          omp_threads_bind=str(i), **server_settings(*E2E_PACE)))
            srv.start()
            nodes.append(a)
            servers.append(srv)
        for a, srv in zip(nodes, servers):
            srv.wait_ready(600)
            lt.run(a.attach(srv.base_url), 300)
        yield lt, nodes[0], nodes[1]
    finally:
        stop_all(lt, nodes, servers)


def stop_all(lt: LoopThread, nodes: list[Agent], servers: list[VLLMServer]) -> None:
    """Stop the agents (on ``lt``), then their vLLM servers, then the loop."""
    for a in nodes:
        try:
            lt.run(a.stop(), 30)
        except Exception:
            pass
    for srv in servers:
        srv.stop()
    lt.close()


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 2000) for _ in range(n)]


async def _run(a: Agent, prompt: list[int], max_tokens: int) -> Session:
    s = Session(uuid.uuid4().hex, "ue-1", prompt, SamplingSpec(max_tokens=max_tokens,
                                                                ignore_eos=True))
    a.sessions.add(s)
    a.vllm_client.start(s)
    return s


async def _reference(a: Agent, prompt: list[int], n: int) -> list[int]:
    return await a.vllm_client.complete(prompt, SamplingSpec(max_tokens=n, ignore_eos=True))


async def _outputs(a: Agent, sid: str, n: int) -> list[int]:
    s = a.sessions.get(sid)
    assert s is not None
    assert await s.wait_tokens(n - 1, 300), f"stopped at {len(s.output_token_ids)}: {s.state}"
    await a.vllm_client.abort(s)
    return s.output_token_ids[:n]


def test_a_refused_commit_is_not_ok_and_the_source_serves_on_token_exact(agents):
    lt, a, b = agents

    async def go():
        prompt = _prompt(100, 11)
        ref = await _reference(a, prompt, 120)
        s = await _run(a, prompt, 400)
        # B has seen a newer attempt of this session (epoch 9): it refuses epoch 1.
        src = pb.PeerEndpoint(agent_id="x", address="127.0.0.1:9")
        assert (await b.migration.target.on_prepare(pb.PrepareRequest(
            session_id=s.session_id, epoch=9, model=b.identity(), source=src))).status == 1
        await b.migration.target.on_release(pb.ReleaseRequest(session_id=s.session_id, epoch=9))
        assert await s.wait_tokens(20, 120)
        r = await a.migration.commit(s.session_id, 1, b.endpoint, pb.SCHEME_FULL_COPY)
        out = await _outputs(a, s.session_id, 120)
        return r, s, ref, out

    r, s, ref, out = lt.run(go())
    assert r.status == pb.STATUS_REJECTED and "target refused" in r.message, r
    assert r.state == pb.SESSION_SERVING and b.sessions.get(s.session_id) is None
    assert out == ref


def test_a_prepared_target_whose_source_goes_silent_frees_what_it_holds(agents):
    lt, a, b = agents

    async def go():
        base = b.hub.kv_blocks()
        prompt = _prompt(300, 12)
        s = await _run(a, prompt, 400)
        assert await s.wait_tokens(5, 120)
        assert (await a.migration.trigger(s.session_id, 1, b.endpoint, split_tokens=96)).status == 1
        t_end = time.monotonic() + 60
        while b.hub.store.num_blocks < 1:
            assert time.monotonic() < t_end, "no block reached B"
            await asyncio.sleep(0.05)
        held = b.migration.held()
        # The source goes silent: its stream stops, it renews the lease no more (a dead
        # source's renewal task is gone with it), and no Release will come.
        out = a.migration.ctx.outbound.pop(s.session_id)
        out.to(SourceState.FAILED)
        a.hub.stop_export(s.session_id)
        out.stream.abort()
        await asyncio.sleep(IDLE_S + 0.5)
        dropped = await b.migration.target.expire()
        await a.vllm_client.abort(s)
        await asyncio.sleep(1.0)
        return base, held, dropped, b.migration.held(), b.hub.kv_blocks()

    base, held, dropped, after, kv = lt.run(go())
    assert held["inbound"] == 1 and held["reserved_bytes"] > 0 and held["blocks"] >= 1
    assert dropped == 1
    assert after == {"inbound": 0, "outbound": 0, "blocks": 0, "bytes": 0, "reserved_bytes": 0,
                     "streams_queued": 0}
    assert kv is not None and base is not None and kv[0] >= base[0] - 1, (base, kv)


def test_a_commit_during_the_warmup_takes_the_fastest_way_and_stays_exact(agents):
    lt, a, b = agents

    async def go():
        prompt = _prompt(1500, 13)
        ref = await _reference(a, prompt, 80)
        s = await _run(a, prompt, 2000)
        assert await s.wait_tokens(2, 120)
        tr = await a.migration.trigger(s.session_id, 1, b.endpoint)
        assert tr.status == 1 and tr.split_tokens >= 1472, tr
        r = await a.migration.commit(s.session_id, 1, b.endpoint)    # at once: warm-up running
        assert r.status == 1, r
        assert s.state == SessionState.HANDED_OVER
        out = await _outputs(b, s.session_id, 80)
        return r, out, ref

    r, out, ref = lt.run(go())
    assert out == ref
    if r.HasField("choice"):       # absent only when the warm-up had already finished
        ch = r.choice
        best = min(ch.finish_s, ch.ctho_s, ch.recompute_s)
        assert ch.option in ("finish", "ctho", "recompute")
        assert {"finish": ch.finish_s, "ctho": ch.ctho_s, "recompute": ch.recompute_s}[ch.option] == best
        assert ch.prefill_rate > 0 and ch.handover_tokens >= 1502


NOTHING_HELD = {"inbound": 0, "outbound": 0, "blocks": 0, "bytes": 0, "reserved_bytes": 0,
                "streams_queued": 0}


async def _settled(a: Agent) -> dict:
    """What ``a`` holds and its connector's view, one hello period later."""
    await asyncio.sleep(0.6)
    return {"held": a.migration.held(), "kv": a.hub.kv_stats()}


def test_a_session_cancelled_while_its_blocks_load_at_the_target_frees_them(agents):
    lt, a, b = agents

    async def go():
        base = await _settled(b)
        prompt = _prompt(200, 14)
        s = await _run(a, prompt, 2000)
        assert await s.wait_tokens(5, 120)
        assert (await a.migration.trigger(s.session_id, 1, b.endpoint, split_tokens=192)).status == 1
        assert await s.wait_tokens(60, 120)
        loading = asyncio.Event()
        undo = hold_back(b, Fetch, s.session_id, 2.0, loading)  # B's worker waits 2 s for them
        try:
            r = await a.migration.commit(s.session_id, 1, b.endpoint, pb.SCHEME_PALLAS)
            assert r.status == 1, r
            await asyncio.wait_for(loading.wait(), 60)
            t = b.sessions.get(s.session_id)
            claim = t.claim
            # The UE cancels it there while the worker fetches its blocks (the front's DELETE).
            await b.vllm_client.abort(t)
            t.set_state(SessionState.FINISHED, finish_reason="abort")
            await asyncio.sleep(2.5)  # the held-back fetch is answered; the step ends
        finally:
            undo()
        after = await _settled(b)
        # The next session is admitted at B and runs token-exact.
        p2 = _prompt(100, 15)
        ref2 = await _reference(a, p2, 30)
        s2 = await _run(b, p2, 30)
        assert await s2.wait_tokens(29, 120)
        return base, claim, after, s2.output_token_ids[:30], ref2

    base, claim, after, out2, ref2 = lt.run(go())
    assert claim is not None and claim.external > 0, claim  # blocks were to be loaded
    assert after["held"] == NOTHING_HELD, after
    assert after["kv"]["free_blocks"] == base["kv"]["free_blocks"], (base, after)
    assert after["kv"]["avail_blocks"] == 0 and after["kv"]["tracked_reqs"] == 0, after
    assert out2 == ref2


def test_a_target_whose_source_dies_during_the_commit_resumes_and_never_hangs(agents):
    lt, a, b = agents
    deadline_s = a.cfg.commit_deadline_s

    async def go():
        base = await _settled(b)
        prompt = _prompt(150, 16)
        ref = await _reference(a, prompt, 160)
        s = await _run(a, prompt, 2000)
        assert await s.wait_tokens(5, 120)
        assert (await a.migration.trigger(s.session_id, 1, b.endpoint, split_tokens=128)).status == 1
        assert await s.wait_tokens(50, 120)
        claimed = asyncio.Event()
        undo = hold_back(b, Claim, s.session_id, 1.5, claimed)  # B's Sync waits for its claim
        commit = asyncio.ensure_future(a.migration.commit(s.session_id, 1, b.endpoint,
                                                          pb.SCHEME_PALLAS))
        try:
            await asyncio.wait_for(claimed.wait(), 60)
            # A dies in the middle of the commit: its Sync call is cut off at B.
            t_kill = time.monotonic()
            commit.cancel()
            with pytest.raises(asyncio.CancelledError):
                await commit
        finally:
            undo()
        # (A is dead: what it held is gone with it; the test's A serves other cases.)
        a.migration.ctx.outbound.pop(s.session_id, None)
        a.hub.stop_export(s.session_id)
        await a.vllm_client.abort(s)
        s.set_state(SessionState.FAILED)
        t = b.sessions.get(s.session_id)
        assert t is not None and t.state == SessionState.RESUMED, t
        first = await t.wait_tokens(t.resumed_from, deadline_s)
        t_first = time.monotonic() - t_kill
        assert first, "B never resumed the session"
        assert await t.wait_tokens(159, 120)
        out = t.output_token_ids[:160]
        await b.vllm_client.abort(t)
        t.set_state(SessionState.FINISHED, finish_reason="abort")
        after = await _settled(b)
        return base, after, out, ref, t_first, t.resumed_from

    base, after, out, ref, t_first, k = lt.run(go())
    assert t_first < deadline_s, t_first
    assert out[:k] == ref[:k] and out == ref, f"resumed at {k}"
    assert after["held"] == NOTHING_HELD, after
    assert after["kv"]["free_blocks"] == base["kv"]["free_blocks"], (base, after)
