"""Issue 25 item 3 on two real vLLM CPU servers (tiny random model, fp32, greedy): one agent
holds a session at all times, also when the target cannot take it up in time.

A full target (its one sequence slot, ``--max-num-seqs 1``, busy with a session of its own)
gets a commit: vLLM keeps the resumed request waiting, the target's Sync gives up before the
deadline the source sent and undoes the resume, the commit is answered non-OK and the source
serves on token-exact; nothing stays at the target (before: the Sync waited 10 s, past the
source's deadline; the target kept a ``resumed`` copy that decoded once a slot freed, while
the source served on, and every later commit was refused "lives at this agent"). The xApp's
retry of the same commit, once the target has room, commits and the session continues
token-exact there.
"""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.vllm

from agent.session import SamplingSpec, SessionState  # noqa: E402
from pallas_eval.emulation import E2E_PACE, server_settings  # noqa: E402
from pallas_proto import pallas_pb2 as pb  # noqa: E402
from tests.e2e.test_engine_faults import NOTHING_HELD, _prompt, _run, _settled  # noqa: E402
from tests.e2e.test_vllm_failures import agent_pair  # noqa: E402

COMMIT_DEADLINE_S = 4.0


@pytest.fixture(scope="module")
def agents():
    paced = server_settings(*E2E_PACE)
    full = dict(paced, max_num_seqs=1)
    for lt, nodes, servers in agent_pair([paced, full], commit_deadline_s=COMMIT_DEADLINE_S,
                                         resume_deadline_s=5.0):
        yield lt, nodes


def test_a_full_target_gives_a_commit_up_in_time_and_a_retry_commits_token_exact(agents):
    lt, (a, b) = agents

    async def go():
        prompt = _prompt(150, 31)
        ref = await a.vllm_client.complete(prompt, SamplingSpec(max_tokens=200, ignore_eos=True))
        busy = await _run(b, _prompt(60, 32), 4000)          # B's only slot
        assert await busy.wait_tokens(2, 120)
        s = await _run(a, prompt, 2000)
        assert await s.wait_tokens(20, 120)
        assert (await a.migration.trigger(s.session_id, 1, b.endpoint,
                                          split_tokens=128)).status == pb.STATUS_OK
        assert await s.wait_tokens(40, 120)
        t0 = asyncio.get_running_loop().time()
        r1 = await a.migration.commit(s.session_id, 1, b.endpoint, pb.SCHEME_PALLAS)
        took = asyncio.get_running_loop().time() - t0
        state1 = s.state
        # B gets room: a copy left resumed there would now decode
        await b.vllm_client.abort(busy)
        busy.set_state(SessionState.FINISHED, finish_reason="abort")
        await asyncio.sleep(2.0)
        t1 = b.sessions.get(s.session_id)
        left = (t1.state, len(t1.output_token_ids) - t1.resumed_from) if t1 is not None else None
        held_b = await _settled(b)
        # the xApp retries the same commit: the target has room now
        r2 = await a.migration.commit(s.session_id, 1, b.endpoint, pb.SCHEME_PALLAS)
        t2 = b.sessions.get(s.session_id)
        assert t2 is not None and await t2.wait_tokens(199, 120), t2
        out = list(t2.output_token_ids[:200])
        await b.vllm_client.abort(t2)
        t2.set_state(SessionState.FINISHED, finish_reason="abort")
        return (r1, took, state1, left, held_b, r2, out, ref, t2.resumed_from,
                await _settled(a), await _settled(b))

    r1, took, state1, left, held_b, r2, out, ref, k, after_a, after_b = lt.run(go(), 500)
    assert r1.status != pb.STATUS_OK and state1 == SessionState.SERVING, r1
    assert took < COMMIT_DEADLINE_S + 6.0, took                # the deadline + one Release
    assert left is None or left == (SessionState.HANDED_OVER, 0), \
        f"the target kept the session: {left}"
    assert held_b["held"] == NOTHING_HELD, held_b
    assert r2.status == pb.STATUS_OK, r2
    assert out == ref, f"resumed at {k}"
    assert after_a["held"] == NOTHING_HELD and after_b["held"] == NOTHING_HELD, (after_a, after_b)
