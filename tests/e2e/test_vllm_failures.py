"""Issue 25 on two real vLLM CPU servers (tiny random model, fp32, greedy): vLLM's failures are
failures, never "finished", and a KV load failure at the target is recovered token-exact.

- a block that fails to load at the target after its checksum passed (the fault-injecting
  connector tests/fault_connector.py drops it at the load) is recomputed by vLLM
  (``kv_load_failure_policy=recompute``, which the agent now launches vLLM with): the session
  continues token-exact and both agents hold nothing afterwards. Before: vLLM ran with the
  default policy "fail", failed the request, and the agent dropped vLLM's error chunk: the
  session stayed ``resumed`` with no further token (the UE hung);
- the source's vLLM engine core killed between Trigger and Commit: the session fails at the
  source within a bounded time with a reason naming vLLM, the Commit is answered non-OK with
  it, the target holds nothing. Before: the session stayed ``migrating`` and the Commit was
  ``STATUS_OK "finished"`` with the target marking the session finished short of its tokens.

- the target's vLLM engine core killed after it resumed a session: the session fails there
  with a reason naming vLLM, its tokens so far token-exact; nothing held at either agent.

The engine-kill tests leave the vLLM they kill dead: they run last in this module, the
target's first (the source's test needs a live source; a dead target only refuses it).
"""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.vllm

from agent.app import Agent, AgentConfig  # noqa: E402
from agent.server import ServerConfig, VLLMServer, free_port  # noqa: E402
from agent.session import SamplingSpec, SessionState  # noqa: E402
from pallas_eval.emulation import E2E_PACE, server_settings  # noqa: E402
from pallas_eval.models import build_model  # noqa: E402
from pallas_proto import pallas_pb2 as pb  # noqa: E402
from tests.e2e.loops import LoopThread  # noqa: E402
from tests.faults import kill_engine_core  # noqa: E402
from tests.e2e.test_engine_faults import (NOTHING_HELD, _prompt, _run, _settled,  # noqa: E402
                                          stop_all)


def agent_pair(server_kw: list[dict], **agent_kw):
    """Start agents "fa", "fb" (and "fc", ... for more ``server_kw``; plaintext links), each
    beside its own vLLM server with ``server_kw[i]`` (ServerConfig fields, bound to core i
    modulo the cores there are), and yield ``(loop, agents, servers)``; stops all."""
    model = str(build_model("tiny"))
    lt = LoopThread()
    nodes, servers = [], []
    try:
        for i, name in enumerate(f"f{chr(ord('a') + j)}" for j in range(len(server_kw))):
            kw = dict(resume_deadline_s=20.0, commit_deadline_s=30.0)
            kw.update(agent_kw)
            cfg = AgentConfig(agent_id=name, model=model, host="127.0.0.1", peer_port=free_port(),
                              hub_address=f"tcp://127.0.0.1:{free_port()}", vllm_url="-",
                              insecure=True, **kw)
            a = Agent(cfg)
            lt.run(a.start_core())
            srv = VLLMServer(ServerConfig(model=model, agent_address=a.hub.address,
                                          omp_threads_bind=str(i % (os.cpu_count() or 1)),
                                          **server_kw[i]))
            srv.start()
            nodes.append(a)
            servers.append(srv)
        for a, srv in zip(nodes, servers):
            srv.wait_ready(600)
            lt.run(a.attach(srv.base_url), 300)
        yield lt, nodes, servers
    finally:
        stop_all(lt, nodes, servers)


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    """Agents "fa" (source, paced like the other e2e tests) and "fb" (target, vLLM with the
    fault-injecting connector; its control file is ``fault_file``)."""
    fault_file = tmp_path_factory.mktemp("faults") / "faults.json"
    faulty = {"kv_connector_module": "tests.fault_connector",
              "kv_connector_class": "FaultyPallasConnector",
              "kv_connector_extra": {"fault_file": str(fault_file)}}
    for lt, nodes, servers in agent_pair([server_settings(*E2E_PACE), faulty]):
        yield lt, nodes, servers, fault_file


async def _triggered(a: Agent, b: Agent, prompt_len: int, seed: int, split: int, outputs: int,
                     ref_tokens: int = 0):
    """A 2,000-token session at ``a`` triggered (epoch 1, ``split``) to ``b`` and run to
    ``outputs`` outputs; returns it and ``a``'s greedy reference of ``ref_tokens`` tokens."""
    prompt = _prompt(prompt_len, seed)
    ref = (await a.vllm_client.complete(prompt, SamplingSpec(max_tokens=ref_tokens, ignore_eos=True))
           if ref_tokens else [])
    s = await _run(a, prompt, 2000)
    assert await s.wait_tokens(5, 120)
    assert (await a.migration.trigger(s.session_id, 1, b.endpoint,
                                      split_tokens=split)).status == pb.STATUS_OK
    assert await s.wait_tokens(outputs, 120)
    return s, ref


def test_a_block_that_fails_to_load_after_its_checksum_is_recomputed_token_exact(agents):
    lt, (a, b), servers, fault_file = agents

    async def go():
        base = await _settled(b)
        s, ref = await _triggered(a, b, 200, 21, 192, 60, ref_tokens=160)
        fault_file.write_text(json.dumps({"drop_loads": 1}))   # B's next verified block is lost
        r = await a.migration.commit(s.session_id, 1, b.endpoint, pb.SCHEME_PALLAS)
        assert r.status == pb.STATUS_OK, r
        t = b.sessions.get(s.session_id)
        assert t is not None and t.state == SessionState.RESUMED, t
        # bounded: on the old code the session hung here (vLLM failed it, the agent did not see)
        got = await t.wait_tokens(159, 90)
        state, error, loaded, claim = t.state, t.error, t.loaded, t.claim
        out = list(t.output_token_ids[:160])
        await b.vllm_client.abort(t)
        if not t.done:
            t.set_state(SessionState.FINISHED, finish_reason="abort")
        fault_file.write_text(json.dumps({"drop_loads": 0}))
        return base, await _settled(b), await _settled(a), ref, out, got, state, error, \
            loaded, claim, t.resumed_from

    base, after_b, after_a, ref, out, got, state, error, loaded, claim, k = lt.run(go(), 400)
    assert claim is not None and claim.external > 0, claim       # blocks were to be loaded
    assert loaded is not None and len(loaded.failed) == 1, loaded  # and one failed to load
    assert got, f"the resumed session stopped at {k} ({state.value}: {error!r})"
    assert out == ref, f"resumed at {k}"
    assert after_b["held"] == NOTHING_HELD and after_a["held"] == NOTHING_HELD, (after_a, after_b)
    assert after_b["kv"]["free_blocks"] == base["kv"]["free_blocks"], (base, after_b)


def test_the_target_engine_dying_after_the_resume_fails_the_session_there(agents):
    """The target's vLLM engine core killed after it resumed a session: the session fails
    there within a bounded time, with a reason naming vLLM (the UE's stream ends with it), its
    tokens up to then token-exact; nothing is held at either agent. (Leaves the target's vLLM
    dead: runs after the load-failure test.)"""
    lt, (a, b), servers, fault_file = agents
    bound_s = 30.0

    async def go():
        s, ref = await _triggered(a, b, 150, 23, 128, 40, ref_tokens=400)
        r = await a.migration.commit(s.session_id, 1, b.endpoint, pb.SCHEME_PALLAS)
        assert r.status == pb.STATUS_OK, r
        t = b.sessions.get(s.session_id)
        assert t is not None and await t.wait_tokens(t.resumed_from + 5, 120)
        t_failed = await kill_engine_core(servers[1], t, bound_s)
        return t.state, t.error, list(t.output_token_ids), ref, t_failed, \
            await _settled(a), await _settled(b)

    state, error, out, ref, t_failed, after_a, after_b = lt.run(go(), 400)
    assert state == SessionState.FAILED, f"{state.value} {t_failed:.1f} s after the kill"
    assert t_failed < bound_s and "vLLM" in error, (t_failed, error)
    assert out == ref[:len(out)] and len(out) < 2000
    assert after_a["held"] == NOTHING_HELD and after_b["held"] == NOTHING_HELD, (after_a, after_b)


def test_the_source_engine_dying_between_trigger_and_commit_fails_the_session(agents):
    """(Runs last: the source's vLLM stays dead.)"""
    lt, (a, b), servers, fault_file = agents
    bound_s = 30.0

    async def go():
        s, _ = await _triggered(a, b, 150, 22, 128, 40)
        t_failed = await kill_engine_core(servers[0], s, bound_s)
        state, error, n = s.state, s.error, len(s.output_token_ids)
        r = await a.migration.commit(s.session_id, 1, b.endpoint, pb.SCHEME_PALLAS)
        t = b.sessions.get(s.session_id)
        return state, error, n, t_failed, r, t, await _settled(a), await _settled(b)

    state, error, n, t_failed, r, t, after_a, after_b = lt.run(go(), 400)
    assert state == SessionState.FAILED, f"{state.value} {t_failed:.1f} s after the kill"
    assert t_failed < bound_s and "vLLM" in error, (t_failed, error)
    assert n < 2000
    assert r.status not in (pb.STATUS_OK,) and r.state == pb.SESSION_FAILED, r
    assert error in r.message, r
    assert t is None, f"the target holds the session: {t.state.value} {t.finish_reason}"
    assert after_a["held"] == NOTHING_HELD and after_b["held"] == NOTHING_HELD, (after_a, after_b)
