"""pallas-agent: flags/environment, and the whole agent wired around a fake core (no vLLM)."""

from __future__ import annotations

import asyncio
import json
import os
import socket

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pallas_proto import pallas_pb2 as pb
from pallas_proto import pallas_pb2_grpc

import agent.core
from agent.main import AgentApp, parse_args
from agent.obs import configure_logging
from agent.session import SessionStore

import fakes_agent as fk


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_flags_env_and_errors(monkeypatch, capsys):
    monkeypatch.setenv("PALLAS_AGENT_ID", "gnb-7")
    monkeypatch.setenv("PALLAS_PEER_RATE_MBPS", "300")
    cfg = parse_args(["--model-preset", "tiny", "--scheme", "ctho", "--peer-front", "b=http://h:1,c=http://h:2/",
                      "--front-port", "9000"])
    assert cfg.agent_id == "gnb-7" and cfg.peer_rate_bytes_per_s == pytest.approx(37.5e6)
    assert cfg.scheme == "ctho" and cfg.peer_fronts == {"b": "http://h:1", "c": "http://h:2"}
    assert cfg.front_port == 9000 and cfg.front_url.endswith(":9000")
    cfg2 = parse_args(["--model-preset", "tiny", "--agent-id", "x"])
    assert cfg2.agent_id == "x"  # the flag wins over the environment
    assert cfg.vllm_log is None and parse_args(
        ["--model-preset", "tiny", "--vllm-log", "/r/logs/v.log"]).vllm_log == "/r/logs/v.log"
    for bad in (["--model-preset", "tiny", "--scheme", "warp"], [],
                ["--model-preset", "tiny", "--peer-front", "nonsense"],
                ["--model-preset", "tiny", "--peer-rate-mbps", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
    assert "unknown scheme" in capsys.readouterr().err


def test_connector_and_vllm_args_flags(monkeypatch, capsys):
    cfg = parse_args(["--model-preset", "tiny"])
    assert (cfg.kv_connector_module, cfg.kv_connector_class) == ("agent.connector", "PallasConnector")
    assert cfg.kv_connector_extra == {} and cfg.vllm_args == []
    monkeypatch.setenv("PALLAS_KV_CONNECTOR_EXTRA", '{"decode_tokens_per_s": 25}')
    cfg = parse_args(["--model-preset", "tiny", "--kv-connector-module", "pallas_eval.emulated_connector",
                      "--kv-connector-class", "EmulatedPallasConnector",
                      "--vllm-args", "--max-num-batched-tokens 4096 --disable-log-stats"])
    assert cfg.kv_connector_module == "pallas_eval.emulated_connector"
    assert cfg.kv_connector_class == "EmulatedPallasConnector"
    assert cfg.kv_connector_extra == {"decode_tokens_per_s": 25}
    assert cfg.vllm_args == ["--max-num-batched-tokens", "4096", "--disable-log-stats"]
    for bad in (["--kv-connector-extra", "[1, 2]"], ["--kv-connector-extra", "{oops"], ["--vllm-args", "'open"]):
        with pytest.raises(SystemExit):
            parse_args(["--model-preset", "tiny", *bad])
    assert "--kv-connector-extra" in capsys.readouterr().err


class FakeCore:
    """What agent.core.build_core returns, with fakes inside."""

    def __init__(self):
        self.sessions = SessionStore()
        self.engine = fk.FakeEngine()
        self.migrator = fk.FakeMigrator(self.sessions)
        self.vllm_url = "http://127.0.0.1:1"  # nothing there: the scraper just finds nothing
        self.model_path = None
        self.closed = False

    def identity(self):
        return pb.ModelIdentity(model="fake", block_size=32, kv_bytes_per_token=1024)

    def peer_goodput(self, target):
        return 1e6

    def peer_stats(self):
        from agent.telemetry import PeerStat
        return [PeerStat("b", 1e6, 123, 0.001)]

    def bytes_moved(self):
        return [(("b", "sent"), 123.0)]

    def blocks_held(self):
        return 4

    async def close(self):
        self.closed = True


def test_agent_serves_control_health_front_metrics(monkeypatch, capsys):
    core = FakeCore()

    async def fake_build(cfg, log):
        return core

    monkeypatch.setattr(agent.core, "build_core", fake_build)
    cp, fp = free_port(), free_port()
    cfg = parse_args(["--model-preset", "tiny", "--agent-id", "a", "--control-port", str(cp),
                      "--front-port", str(fp), "--host", "127.0.0.1", "--probe-prefill-tokens", "0"])
    configure_logging("INFO", json=True)

    async def go():
        app = AgentApp(cfg)
        await app.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{cp}") as ch:
                h = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="pallas.v1.Control"))
                ctl = pallas_pb2_grpc.ControlStub(ch)
                async with httpx.AsyncClient() as c:
                    r = await c.post(f"http://127.0.0.1:{fp}/v1/sessions",
                                     json={"ue_id": "u", "prompt_token_ids": [1, 2, 3], "max_tokens": 400,
                                           "stream": False, "scheme": "full-copy"})
                    sid = r.json()["session_id"]
                    await asyncio.sleep(0.05)
                    c1 = await ctl.Commit(pb.CommitRequest(session_id=sid, epoch=1,
                                                           actual_target=pb.PeerEndpoint(agent_id="b", address="x:1")))
                    rep = None
                    async for rep in ctl.Telemetry(pb.TelemetryRequest(period_ms=20)):
                        break
                    metrics = (await c.get(f"http://127.0.0.1:{fp}/metrics")).text
            return h, c1, rep, metrics
        finally:
            await app.stop()

    h, c1, rep, metrics = asyncio.run(asyncio.wait_for(go(), 30))
    assert h.status == health_pb2.HealthCheckResponse.SERVING
    assert c1.status == pb.STATUS_OK and c1.scheme == pb.SCHEME_FULL_COPY  # the session's own scheme
    assert core.migrator.calls[-1][5]["ship_blocks"] == "all"
    assert rep.agent_id == "a" and rep.server.model.model == "fake" and rep.peers[0].bytes_sent == 123
    assert 'pallas_bytes_moved_total{direction="sent",peer="b"} 123.0' in metrics
    assert "pallas_kv_blocks_held 4.0" in metrics
    assert core.closed
    # Logs are JSON lines carrying session and epoch.
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    commits = [x for x in lines if x.get("event") == "control_reply" and x.get("method") == "commit"]
    assert commits and commits[0]["epoch"] == 1 and commits[0]["session"]


def test_local_agent_keeps_the_vllm_log_beside_its_own():
    from pallas_eval.cluster import LocalAgent
    a = LocalAgent("edge-1", "m", log_dir="/run/logs")
    cmd = a.command()
    assert cmd[cmd.index("--vllm-log") + 1] == a.vllm_log_path
    assert os.path.dirname(a.vllm_log_path) == os.path.dirname(a.log_path) == "/run/logs"
    assert parse_args(cmd[3:]).vllm_log == a.vllm_log_path
