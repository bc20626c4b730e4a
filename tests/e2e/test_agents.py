"""Two real agents, each with its own vLLM CPU server and the tiny random Llama (fp32, block 32).

One module-scoped fixture starts both agents (``pallas-agent`` subprocesses) and every case
reuses them. Each case drives one UE session through the agents' real endpoints: the UE
client (pallas_eval/client.py) on the HTTP front, the xApp's calls on the Control gRPC service.
Every case checks that the UE's full token sequence equals the same session served without
any handover (greedy decoding, fp32: token-exact, docs/vllm.md §6.1).
"""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from pallas_proto import pallas_pb2 as pb
from pallas_proto import pallas_pb2_grpc

from pallas_eval.client import UESession
from pallas_eval.cluster import LocalAgent, provision_tls, start_agents
from pallas_eval.emulation import E2E_PACE, agent_flags

pytestmark = pytest.mark.vllm

MAX_TOKENS = 300   # with 15 ms steps the source is still decoding well past a plan's last step (110)


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    from pallas_eval.models import build_model

    model = str(build_model("tiny"))
    # Engines paced by the harness's emulation connector (decode steps 15 ms apart): the tiny
    # model decodes at about a real model's pace, so every plan step comes while the source is
    # still decoding.
    flags = ["--probe-prefill-tokens", "128", "--resume-wait-s", "20", *agent_flags(*E2E_PACE)]
    # "b-other-cell": B known under a second directory id (its certificate names both), for
    # the commit that lands at B under another identity than the prepared one.
    a = LocalAgent("a", model, omp_bind="0", extra=flags + ["--peer-identity", "b-other-cell"])
    b = LocalAgent("b", model, omp_bind="1", extra=flags)
    provision_tls([a, b], tmp_path_factory.mktemp("tls"), aliases={"b": ["b-other-cell"]})
    start_agents([a, b], timeout_s=600)
    try:
        yield {"a": a, "b": b}
    finally:
        a.stop()
        b.stop()


def prompt(seed: int, n: int = 100) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 2000) for _ in range(n)]


_refs: dict[tuple, list[int]] = {}


def reference(agents, ids: list[int], max_tokens: int = MAX_TOKENS) -> list[int]:
    """The session's tokens without any handover (served by agent a alone)."""
    key = (tuple(ids), max_tokens)
    if key not in _refs:
        async def go():
            ue = UESession(agents["a"].front_url, ue_id="ref")
            await ue.open(prompt_token_ids=ids, max_tokens=max_tokens, ignore_eos=True, scheme="detour")
            toks = await ue.run()
            await ue.close()
            return toks
        _refs[key] = asyncio.run(asyncio.wait_for(go(), 300))
        assert len(_refs[key]) == max_tokens
    return _refs[key]


async def drive(agents, ids, plan, *, scheme=None, start="a", max_tokens=MAX_TOKENS):
    """Run one UE session; ``plan`` maps an output index to an async action(ue, ctl) run when
    the UE has received that token. Returns (ue, replies)."""
    chans = {k: v.channel(aio=True) for k, v in agents.items()}
    ctl = {k: pallas_pb2_grpc.ControlStub(c) for k, c in chans.items()}
    replies = []
    ue = UESession(agents[start].front_url, ue_id="ue-1")
    try:
        await ue.open(prompt_token_ids=ids, max_tokens=max_tokens, ignore_eos=True, scheme=scheme)
        done = set()
        async for rec in ue.tokens():
            for idx in sorted(plan):
                if idx <= rec.index and idx not in done:
                    done.add(idx)
                    r = await plan[idx](ue, ctl)
                    if r is not None:
                        replies.append(r)
        await ue.close()
    finally:
        for c in chans.values():
            await c.close()
    return ue, replies


def trigger(src, dst, epoch, agents, **kw):
    async def act(ue, ctl):
        return await ctl[src].Trigger(pb.TriggerRequest(session_id=ue.session_id, epoch=epoch,
                                                        target=agents[dst].endpoint, **kw))
    return act


def commit(src, dst, epoch, agents, *, endpoint=None, move_ue=True, **kw):
    """The handover: the UE moves to ``dst``'s front while the xApp's Commit goes to ``src``."""
    async def act(ue, ctl):
        call = ctl[src].Commit(pb.CommitRequest(session_id=ue.session_id, epoch=epoch,
                                                actual_target=endpoint or agents[dst].endpoint, **kw))
        if not move_ue:
            return await call
        r, _ = await asyncio.gather(call, ue.handover(agents[dst].front_url))
        return r
    return act


def cancel(src, epoch):
    async def act(ue, ctl):
        return await ctl[src].Cancel(pb.CancelRequest(session_id=ue.session_id, epoch=epoch, reason="test"))
    return act


def run(coro, timeout=300):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def session_info(agent: LocalAgent, ue: UESession) -> dict:
    return httpx.get(f"{agent.front_url}/v1/sessions/{ue.session_id}", timeout=5,
                     headers={"Authorization": f"Bearer {ue.token}"}).json()


# ------------------------------------------------------------------ control calls

def test_trigger_then_commit(agents):
    ids = prompt(1)
    ref = reference(agents, ids)
    ue, (t, c) = run(drive(agents, ids, {30: trigger("a", "b", 1, agents), 80: commit("a", "b", 1, agents)}))
    assert t.status == pb.STATUS_OK and t.split_tokens % 32 == 0 and t.split_tokens > 0, t
    assert c.status == pb.STATUS_OK and c.scheme == pb.SCHEME_PALLAS, c
    assert ue.token_ids == ref
    assert session_info(agents["b"], ue)["state"] in ("resumed", "finished")
    assert session_info(agents["a"], ue)["state"] == "handed_over"
    assert ue.records[-1].agent_id == "b"


def test_trigger_then_cancel_source_serves_on(agents):
    ids = prompt(2)
    ref = reference(agents, ids)
    held_before = agents["b"].metrics().get("pallas_kv_blocks_held", 0.0)

    async def wait_then_cancel(ue, ctl):
        return await cancel("a", 1)(ue, ctl)

    ue, (t, c) = run(drive(agents, ids, {20: trigger("a", "b", 1, agents), 90: wait_then_cancel}))
    assert t.status == pb.STATUS_OK and c.status == pb.STATUS_OK, (t, c)
    assert ue.token_ids == ref and all(r.agent_id == "a" for r in ue.records)
    assert max(ue.itls()) < 2.0  # the source never stopped
    assert agents["b"].metrics().get("pallas_kv_blocks_held", 0.0) == held_before
    # Retries get the first answers again; an older epoch is refused.
    async def retries():
        async with agents["a"].channel(aio=True) as ch:
            s = pallas_pb2_grpc.ControlStub(ch)
            again = await s.Cancel(pb.CancelRequest(session_id=ue.session_id, epoch=1))
            t_again = await s.Trigger(pb.TriggerRequest(session_id=ue.session_id, epoch=1, target=agents["b"].endpoint))
            older = await s.Trigger(pb.TriggerRequest(session_id=ue.session_id, epoch=0, target=agents["b"].endpoint))
            return again, t_again, older
    again, t_again, older = run(retries())
    assert again == c and t_again == t and older.status == pb.STATUS_STALE_EPOCH


def test_commit_to_a_different_target_than_prepared_falls_back(agents):
    """Prepared at B under one identity, the UE lands at B under another: ctHO recovery."""
    ids = prompt(3)
    ref = reference(agents, ids)
    other = pb.PeerEndpoint(agent_id="b-other-cell", address=agents["b"].endpoint.address)
    ue, (t, c) = run(drive(agents, ids, {20: trigger("a", "b", 1, agents, split_tokens=96),
                                         70: commit("a", "b", 2, agents, endpoint=other)}))
    assert t.status == pb.STATUS_OK
    assert c.status == pb.STATUS_OK and c.scheme == pb.SCHEME_CTHO and "fallback" in c.message, c
    assert ue.token_ids == ref


def test_commit_without_trigger_recovers_after_the_handover(agents):
    ids = prompt(4)
    ref = reference(agents, ids)
    ue, (c,) = run(drive(agents, ids, {60: commit("a", "b", 1, agents)}))
    assert c.status == pb.STATUS_OK and c.scheme == pb.SCHEME_CTHO, c
    assert ue.token_ids == ref


def test_repeated_handovers_a_b_a(agents):
    ids = prompt(5)
    ref = reference(agents, ids)
    plan = {20: trigger("a", "b", 1, agents), 50: commit("a", "b", 1, agents),
            80: trigger("b", "a", 2, agents), 110: commit("b", "a", 2, agents)}
    ue, replies = run(drive(agents, ids, plan))
    assert [r.status for r in replies] == [pb.STATUS_OK] * 4, replies
    assert ue.token_ids == ref
    assert [h.to_url for h in ue.handovers] == [agents["b"].front_url, agents["a"].front_url]
    assert ue.records[-1].agent_id == "a" and ue.records[100].agent_id in ("a", "b")


# ------------------------------------------------------------------ the UE's view

def test_ue_resumes_from_the_right_token_at_the_new_agent(agents):
    ids = prompt(6)
    ref = reference(agents, ids)
    ue, _ = run(drive(agents, ids, {10: trigger("a", "b", 1, agents), 64: commit("a", "b", 1, agents)}))
    h = ue.handovers[0]
    assert h.next_index >= 65
    assert ue.token_ids == ref and [r.index for r in ue.records] == list(range(MAX_TOKENS))
    assert all(r.agent_id == "a" for r in ue.records[:h.next_index])
    assert ue.records[-1].agent_id == "b" and ue.records[-1].relayed_by is None
    assert len(ue.handover_gaps()) == 1


def test_detour_relays_through_the_new_agent(agents):
    ids = prompt(7)
    ref = reference(agents, ids)
    ue, (c,) = run(drive(agents, ids, {40: commit("a", "b", 1, agents)}, scheme="detour"))
    assert c.status == pb.STATUS_OK and c.scheme == pb.SCHEME_DETOUR
    assert ue.token_ids == ref
    after = ue.records[ue.handovers[0].next_index:]
    assert after and all(r.relayed_by == "b" and r.agent_id == "a" for r in after)


# ------------------------------------------------------------------ baselines

def test_bridge_relays_then_hands_over_at_a_token_boundary_token_exact(agents):
    """pallas-bridge at a target nobody prepared: the source decodes on (relayed by b) while b is
    prepared with ctHO's split, then hands over after a token; b serves the rest itself."""
    ids = prompt(9)
    ref = reference(agents, ids)
    ue, (c,) = run(drive(agents, ids, {40: commit("a", "b", 1, agents)}, scheme="pallas-bridge"))
    assert c.status == pb.STATUS_OK and c.scheme == pb.SCHEME_PALLAS_BRIDGE, c
    assert ue.token_ids == ref and [r.index for r in ue.records] == list(range(MAX_TOKENS))
    after = ue.records[ue.handovers[0].next_index:]
    served = [(r.agent_id, r.relayed_by) for r in after]
    assert served[-1] == ("b", None)                  # b decodes itself at the end
    first_local = served.index(("b", None))
    assert all(x == ("a", "b") for x in served[:first_local])   # relayed until the switch
    assert session_info(agents["a"], ue)["state"] == "handed_over"


@pytest.mark.parametrize("scheme", ["pallas", "pallas-bridge", "full-copy", "recomputation", "ctho", "no-rc",
                                    "no-sm", "detour"])
def test_each_baseline_recovers_the_same_session_token_exactly(agents, scheme):
    ids = prompt(8)
    ref = reference(agents, ids)
    ue, replies = run(drive(agents, ids, {30: trigger("a", "b", 1, agents), 90: commit("a", "b", 1, agents)},
                            scheme=scheme))
    t, c = replies
    assert t.status == pb.STATUS_OK and c.status == pb.STATUS_OK, replies
    from pallas_common.schemes import scheme_value
    assert c.scheme == scheme_value(scheme), c
    assert ue.token_ids == ref
