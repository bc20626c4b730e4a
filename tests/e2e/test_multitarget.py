"""Issue 45 on three real vLLM CPU servers (tiny random model, fp32, greedy, paced like the other
e2e tests): one session prepared at two targets, the UE goes to the second.

Agent "fa" serves the session; two Triggers of one epoch prepare "fb" (rank 0) and "fc"
(rank 1), and each streams the session's new KV blocks from the one export. The commit at "fc"
resumes the session there token-exact against fa's own greedy continuation; "fb" got no Sync,
is released after fc's OK and holds nothing afterwards (no attempt, no block, no reservation, its
KV pool back where it was); it never had the session.
"""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.vllm

from agent.session import SessionState  # noqa: E402
from agent.states import SourceState  # noqa: E402
from pallas_eval.emulation import E2E_PACE, server_settings  # noqa: E402
from pallas_proto import pallas_pb2 as pb  # noqa: E402
from tests.e2e.test_engine_faults import (NOTHING_HELD, _prompt, _reference, _run,  # noqa: E402
                                          _settled)
from tests.e2e.test_vllm_failures import agent_pair  # noqa: E402

N_REF = 160


@pytest.fixture(scope="module")
def agents():
    paced = server_settings(*E2E_PACE)
    for lt, nodes, servers in agent_pair([paced, paced, paced]):
        yield lt, nodes


async def _until(cond, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond() and loop.time() < end:
        await asyncio.sleep(0.05)
    return cond()


def test_two_targets_prepared_the_ue_reaches_the_second_which_resumes_token_exact(agents):
    lt, (a, b, c) = agents

    async def go():
        base_b, base_c = await _settled(b), await _settled(c)
        prompt = _prompt(200, 45)
        ref = await _reference(a, prompt, N_REF)
        s = await _run(a, prompt, 2000)
        sid = s.session_id
        assert await s.wait_tokens(5, 120)
        r0 = await a.migration.trigger(sid, 1, b.endpoint, split_tokens=192, rank=0)
        r1 = await a.migration.trigger(sid, 1, c.endpoint, split_tokens=192, rank=1)
        prepared = sorted((o.target.agent_id, o.rank, o.state)
                          for o in a.migration.ctx.outbound.of(sid))
        ranks = (b.migration.ctx.inbound[sid].rank, c.migration.ctx.inbound[sid].rank)
        assert await s.wait_tokens(60, 120)
        # both targets receive the suffix blocks (blocks 6 and 7 are full by then)
        streamed = await _until(lambda: b.hub.store.count(sid) >= 2 and c.hub.store.count(sid) >= 2,
                                30)
        rc = await a.migration.commit(sid, 1, c.endpoint, pb.SCHEME_PALLAS)
        t = c.sessions.get(sid)
        assert t is not None and await t.wait_tokens(N_REF, 120), t
        out = list(t.output_token_ids[:N_REF])
        await c.vllm_client.abort(t)
        t.set_state(SessionState.FINISHED, finish_reason="abort")
        released = await _until(lambda: b.migration.held()["inbound"] == 0, 10)
        return (r0, r1, prepared, ranks, streamed, rc, out, ref, t.resumed_from, s.state,
                b.sessions.get(sid), base_b, base_c,
                await _settled(a), await _settled(b), await _settled(c))

    (r0, r1, prepared, ranks, streamed, rc, out, ref, k, src_state, at_b, base_b, base_c,
     after_a, after_b, after_c) = lt.run(go(), 500)
    assert r0.status == pb.STATUS_OK and r1.status == pb.STATUS_OK, (r0, r1)
    assert prepared == [("fb", 0, SourceState.STREAMING), ("fc", 1, SourceState.STREAMING)]
    assert ranks == (0, 1) and streamed
    assert rc.status == pb.STATUS_OK and "fallback" not in rc.message, rc
    assert src_state == SessionState.HANDED_OVER
    assert out == ref, f"resumed at {k}"
    # one holder: fb never had the session and holds nothing
    assert at_b is None
    assert after_b["held"] == NOTHING_HELD, after_b
    assert after_b["kv"]["free_blocks"] == base_b["kv"]["free_blocks"], (base_b, after_b)
    assert after_b["kv"]["avail_blocks"] == 0, after_b
    assert after_a["held"] == NOTHING_HELD and after_c["held"] == NOTHING_HELD, (after_a, after_c)
    assert after_c["kv"]["free_blocks"] == base_c["kv"]["free_blocks"], (base_c, after_c)
