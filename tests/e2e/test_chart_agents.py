"""The chart's rendered command lines, run as rendered against real vLLM (issue 42).

The chart is rendered twice with Helm's own engine (tests/chart_render.py), for agents edge-a
and edge-b, TLS off, each naming the other as its peer. Everything that must differ on one
machine is a chart value (ports, the model folder: the tiny test model, the advertise host,
CPU-sized vLLM arguments through ``vllm.extraArgs``); of the rendered containers only the
executables are replaced (the pod's ``python3`` and ``pallas-agent`` by this environment's
Python). vLLM is started from the vLLM container's command line and the agent from the agent
container's; then one UE session is triggered at edge-a, committed to edge-b and must continue
token-exact. On the chart of 3a25193 (measured) the rendered vLLM exits at start (without
--skip-tokenizer-init it loads a tokenizer, which the tiny model has not) and the agent gives
up after its 600 s wait; the chart's missing kv_load_failure_policy is checked by
tests/xapp/deploy/test_chart_render.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from pallas_proto import pallas_pb2 as pb
from pallas_proto import pallas_pb2_grpc

from agent.server import REPO_ROOT, free_port
from pallas_eval.client import UESession
from pallas_eval.cluster import LocalAgent
from pallas_eval.emulation import CONNECTOR_CLASS, CONNECTOR_MODULE, E2E_PACE, connector_extra
from tests.chart_render import container, flags, render

pytestmark = pytest.mark.vllm

MAX_TOKENS = 400


def _values(me: "ChartAgent", peer: "ChartAgent", model: str) -> dict:
    return {
        "agentId": me.agent_id, "tls": {"enabled": False},
        "model": {"path": model, "volume": {"type": "none"}},
        "vllm": {"port": me.vllm_port, "dtype": "float32", "blockSize": 32, "maxModelLen": 4096,
                 # Paced like the other e2e tests (decode steps 15 ms apart, pallas_eval.emulation.E2E_PACE)
                 # through the chart's own connector values, so the session still decodes when the
                 # Trigger and Commit come (unpaced, the tiny model finished 400 tokens first).
                 "kvConnector": {"agentPort": me.hub_port, "modulePath": CONNECTOR_MODULE,
                                 "className": CONNECTOR_CLASS, "extraConfig": connector_extra(*E2E_PACE)},
                 # CPU-sized: eager mode, a small KV pool (the GPU's utilisation does not apply).
                 "extraArgs": ["--enforce-eager", "--max-num-seqs=8", f"--kv-cache-memory-bytes={1 << 28}"]},
        "agent": {"controlPort": me.control_port, "peerPort": me.peer_port, "frontPort": me.front_port,
                  "advertiseHost": "127.0.0.1", "peerFronts": {peer.agent_id: peer.front_url}},
        "resources": {"gpus": 0},
    }


@dataclass
class ChartAgent(LocalAgent):
    """A LocalAgent whose command line, and its vLLM's, come from the rendered chart."""

    vllm_port: int = field(default_factory=free_port)
    hub_port: int = field(default_factory=free_port)
    rendered: dict = field(default_factory=dict)
    vllm_proc: subprocess.Popen | None = None

    def command(self, peer_fronts=None) -> list[str]:
        c = container(self.rendered, "agent")
        assert c["command"] == ["pallas-agent"]
        return [sys.executable, "-m", "agent.main", *c["args"]]

    def vllm_command(self) -> list[str]:
        c = container(self.rendered, "vllm")
        assert c["command"][0] == "python3"
        return [sys.executable, *c["command"][1:], *c["args"]]

    def start_vllm(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "proto")])
        env["VLLM_CPU_OMP_THREADS_BIND"] = self.omp_bind
        for e in container(self.rendered, "vllm")["env"]:
            if e["name"] == "PALLAS_AGENT_ADDRESS":
                env[e["name"]] = e["value"]
        os.makedirs(self.log_dir, exist_ok=True)
        with open(self.vllm_log_path, "wb") as log:
            self.vllm_proc = subprocess.Popen(self.vllm_command(), cwd=str(REPO_ROOT), env=env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, timeout_s: float = 30.0) -> None:
        super().stop(timeout_s)
        p, self.vllm_proc = self.vllm_proc, None
        if p is not None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=timeout_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def agents():
    from pallas_eval.models import build_model

    model = str(build_model("tiny"))
    a = ChartAgent("edge-a", model, omp_bind="0", insecure=True)
    b = ChartAgent("edge-b", model, omp_bind="1", insecure=True)
    a.rendered = render(_values(a, b, model), release="edge-a")
    b.rendered = render(_values(b, a, model), release="edge-b")
    try:
        for x in (a, b):
            x.start_vllm()
            x.start()
        for x in (a, b):
            x.wait_ready(600)
        yield {"a": a, "b": b}
    finally:
        a.stop()
        b.stop()


def test_the_rendered_command_lines_are_what_runs(agents):
    a = agents["a"]
    f = flags(a.vllm_command())
    assert '"kv_load_failure_policy":"recompute"' in f["--kv-transfer-config"]
    assert flags(a.command())["--vllm-url"] == f"http://127.0.0.1:{a.vllm_port}"
    assert "--insecure" in a.command() and f"--peer-front=edge-b={agents['b'].front_url}" in a.command()


def test_two_rendered_agents_migrate_a_session_token_exact(agents):
    a, b = agents["a"], agents["b"]
    ids = [3 + (i * 7919) % 1997 for i in range(100)]

    async def reference() -> list[int]:
        ue = UESession(a.front_url, ue_id="ref")
        await ue.open(prompt_token_ids=ids, max_tokens=MAX_TOKENS, ignore_eos=True, scheme="detour")
        toks = await ue.run()
        await ue.close()
        return toks

    async def migrated():
        ch = a.channel(aio=True)
        ctl = pallas_pb2_grpc.ControlStub(ch)
        ue = UESession(a.front_url, ue_id="ue-1")
        await ue.open(prompt_token_ids=ids, max_tokens=MAX_TOKENS, ignore_eos=True)
        replies = []
        try:
            async for rec in ue.tokens():
                if rec.index >= 30 and not replies:
                    replies.append(await ctl.Trigger(pb.TriggerRequest(
                        session_id=ue.session_id, epoch=1, target=b.endpoint)))
                if rec.index >= 80 and len(replies) == 1:
                    c, _ = await asyncio.gather(
                        ctl.Commit(pb.CommitRequest(session_id=ue.session_id, epoch=1, actual_target=b.endpoint)),
                        ue.handover(b.front_url))
                    replies.append(c)
            await ue.close()
        finally:
            await ch.close()
        return ue, replies

    ref = asyncio.run(asyncio.wait_for(reference(), 300))
    assert len(ref) == MAX_TOKENS
    ue, (t, c) = asyncio.run(asyncio.wait_for(migrated(), 300))
    assert t.status == pb.STATUS_OK and t.split_tokens > 0, t
    assert c.status == pb.STATUS_OK and c.scheme == pb.SCHEME_PALLAS, c
    assert ue.records[-1].agent_id == "edge-b"
    assert ue.token_ids == ref
