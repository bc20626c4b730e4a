"""pallas-agent: flags/environment, and the whole agent wired around a fake core (no vLLM)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import socket

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pallas_proto import pallas_pb2 as pb
from pallas_proto import pallas_pb2_grpc

import agent.app
import agent.weights
from agent.app import Agent, parse_args
from agent.connector.messages import SchedHello, WorkerHello
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
    cfg = parse_args(["--model", "/m", "--scheme", "ctho", "--peer-front", "b=http://h:1,c=http://h:2/",
                      "--front-port", "9000"])
    assert cfg.agent_id == "gnb-7" and cfg.peer_rate_mbps == 300.0
    assert cfg.scheme == "ctho" and cfg.peer_front == {"b": "http://h:1", "c": "http://h:2"}
    assert cfg.front_port == 9000
    cfg2 = parse_args(["--model", "/m", "--agent-id", "x"])
    assert cfg2.agent_id == "x"  # the flag wins over the environment
    assert cfg.vllm_log == "" and parse_args(
        ["--model", "/m", "--vllm-log", "/r/logs/v.log"]).vllm_log == "/r/logs/v.log"
    for bad in (["--model", "/m", "--scheme", "warp"], [],
                ["--model", "/m", "--peer-front", "nonsense"],
                ["--model", "/m", "--peer-rate-mbps", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
    assert "unknown scheme" in capsys.readouterr().err


def test_new_flags_and_their_variables(monkeypatch, capsys):
    monkeypatch.setenv("PALLAS_PEER_FRONT", "b=http://h:1")
    monkeypatch.setenv("PALLAS_KV_CONNECTOR_EXTRA", '{"pace": 2}')
    cfg = parse_args(["--model", "/m", "--kv-cache-gib", "0.25", "--vllm-args",
                      "--num-gpu-blocks-override 64", "--kv-connector-module", "pallas_eval.pacing",
                      "--commit-deadline-s", "3"])
    assert cfg.peer_front == {"b": "http://h:1"} and cfg.kv_connector_extra == {"pace": 2}
    assert cfg.kv_cache_gib == 0.25 and cfg.kv_connector_class == "PallasConnector"
    assert cfg.migration().commit_deadline_s == 3.0
    from agent.server import ServerConfig, VLLMServer
    cmd = VLLMServer(ServerConfig(model="m", agent_address="tcp://h:1", kv_cache_gib=0.25,
                                  kv_connector_module=cfg.kv_connector_module,
                                  kv_connector_extra=cfg.kv_connector_extra,
                                  extra_args=["--num-gpu-blocks-override", "64"])).command()
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(1 << 28)
    kv = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
    assert kv["kv_connector_module_path"] == "pallas_eval.pacing"
    assert kv["kv_connector_extra_config"] == {"pace": 2, "agent_address": "tcp://h:1"}
    assert cmd[-2:] == ["--num-gpu-blocks-override", "64"]
    # Issue 12 fault 2: tensor parallelism is refused at start, with the reason.
    with pytest.raises(SystemExit):
        parse_args(["--model", "/m", "--vllm-args", "--tensor-parallel-size 2"])
    assert "tensor parallelism 2" in capsys.readouterr().err


def test_connector_and_vllm_args_flags(monkeypatch, capsys):
    cfg = parse_args(["--model", "/m"])
    assert (cfg.kv_connector_module, cfg.kv_connector_class) == ("agent.connector", "PallasConnector")
    assert cfg.kv_connector_extra == {} and cfg.vllm_args == ""
    monkeypatch.setenv("PALLAS_KV_CONNECTOR_EXTRA", '{"decode_tokens_per_s": 25}')
    cfg = parse_args(["--model", "/m", "--kv-connector-module", "pallas_eval.emulated_connector",
                      "--kv-connector-class", "EmulatedPallasConnector",
                      "--vllm-args", "--max-num-batched-tokens 4096 --disable-log-stats"])
    assert cfg.kv_connector_module == "pallas_eval.emulated_connector"
    assert cfg.kv_connector_class == "EmulatedPallasConnector"
    assert cfg.kv_connector_extra == {"decode_tokens_per_s": 25}
    assert shlex.split(cfg.vllm_args) == ["--max-num-batched-tokens", "4096", "--disable-log-stats"]
    for bad in (["--kv-connector-extra", "[1, 2]"], ["--kv-connector-extra", "{oops"], ["--vllm-args", "'open"]):
        with pytest.raises(SystemExit):
            parse_args(["--model", "/m", *bad])
    assert "--kv-connector-extra" in capsys.readouterr().err


def test_the_launched_vllm_gets_the_agents_engine_flags(monkeypatch):
    """_launch_vllm passes every engine flag on to the vLLM server it launches."""
    from agent.server import VLLMServer
    monkeypatch.setattr(VLLMServer, "start", lambda self: setattr(self, "proc", type("P", (), {"pid": 1})))
    cfg = parse_args(["--model", "/m", "--insecure", "--vllm-port", "8123", "--kv-cache-gib", "0.5",
                      "--omp-bind", "0-1", "--block-size", "64", "--max-model-len", "2048",
                      "--max-num-seqs", "3", "--dtype", "bfloat16", "--kv-connector-module", "x.y",
                      "--kv-connector-class", "C", "--kv-connector-extra", '{"pace": 2}',
                      "--vllm-args", "--seed 1", "--vllm-log", "/r/v.log"])
    a = Agent(cfg)
    assert a._launch_vllm() == "http://127.0.0.1:8123"
    c = a.vllm.cfg
    assert (c.model, c.port, c.agent_address, c.kv_cache_gib, c.omp_threads_bind) == (
        "/m", 8123, a.hub.address, 0.5, "0-1")
    assert (c.block_size, c.max_model_len, c.max_num_seqs, c.dtype) == (64, 2048, 3, "bfloat16")
    assert (c.kv_connector_module, c.kv_connector_class, c.kv_connector_extra) == ("x.y", "C", {"pace": 2})
    assert (c.extra_args, c.log_path, c.kv_load_failure_policy) == (["--seed", "1"], "/r/v.log", "recompute")


def test_the_served_model_name_reaches_vllm_and_the_client(monkeypatch):
    """--served-model-name: the launched vLLM serves under it and the agent asks for it."""
    from agent.server import VLLMServer
    monkeypatch.setattr(VLLMServer, "start", lambda self: setattr(self, "proc", type("P", (), {"pid": 1})))
    a = Agent(parse_args(["--model", "/m", "--insecure", "--served-model-name", "qwen"]))
    a._launch_vllm()
    assert a.vllm.cfg.extra_args[-2:] == ["--served-model-name", "qwen"]
    assert Agent(parse_args(["--model", "/m", "--insecure"])).cfg.served_model_name == ""


def test_a_wrong_model_path_is_named_at_start(tmp_path, monkeypatch, capsys):
    """A path-like --model that does not exist, or a folder without config.json, exits 2 with
    one line naming it (before, the agent waited --vllm-ready-timeout-s for vLLM); a hub-style
    name and a real model folder pass."""
    from agent.app import model_path_error
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    assert model_path_error(str(tmp_path / "good")) is None
    assert model_path_error("Qwen/Qwen3-14B") is None and model_path_error("gpt2") is None
    assert "has no config.json" in model_path_error(str(tmp_path / "empty"))
    (tmp_path / "cwd").mkdir()             # the relative paths resolve here, not around the checkout
    monkeypatch.chdir(tmp_path / "cwd")
    for bad in ("/models/Qwen3-14b", "./models/x", "../x", "models/org/name", "~/nowhere-pallas"):
        assert model_path_error(bad) == f"model path {bad!r} does not exist", bad
    monkeypatch.setenv("PALLAS_INSECURE", "1")
    assert agent.app.main(["--model", "/models/typo", "--vllm-url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "pallas-agent: error: --model: model path '/models/typo' does not exist"


def test_attach_refuses_a_vllm_with_tensor_parallelism():
    async def go():
        a = Agent(parse_args(["--model", "m", "--vllm-url", "http://127.0.0.1:1", "--insecure"]))
        from agent.migration import MigrationEngine
        a.migration = MigrationEngine(agent_id="a", peer_address="", sessions=a.sessions,
                                      vllm_client=a.vllm_client, hub=a.hub, identity=a.identity)
        a.hub.sched_info = SchedHello(block_size=32)
        a.hub.worker_info = WorkerHello(block_bytes=64, num_layers=1, dtype="float32", tp_size=2)
        a.hub._ready.set()

        async def healthy():
            return True
        from agent import session
        orig = session.VllmClient.health
        session.VllmClient.health = lambda self: healthy()
        try:
            with pytest.raises(RuntimeError, match="tensor parallelism 2"):
                await a.attach("http://127.0.0.1:1", timeout_s=2)
        finally:
            session.VllmClient.health = orig
            await a.vllm_client.close()
    asyncio.run(go())


def test_agent_serves_control_health_front_metrics(monkeypatch, capsys):
    """The whole agent wired by agent.app.Agent, vLLM replaced by a fake engine and the peer
    by a recording target: health, a UE session over the front, a Commit with the session's
    own scheme, the Telemetry stream, /metrics and JSON logs."""
    from migration.fakes import Target, _served

    monkeypatch.setattr(Agent, "attach", fk.fake_attach)
    monkeypatch.setattr(agent.weights, "weights_digest", lambda model: "d1")
    cp, fp = free_port(), free_port()
    cfg = parse_args(["--model", "/m/fake", "--vllm-url", "http://127.0.0.1:1", "--agent-id", "a",
                      "--control-port", str(cp), "--front-port", str(fp), "--peer-port", "0",
                      "--host", "127.0.0.1", "--probe-prefill-tokens", "0", "--insecure"])
    configure_logging("INFO", json=True)

    async def go():
        target = Target()
        server, tgt = await _served(target)
        app = Agent(cfg)
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
                    c1 = await ctl.Commit(pb.CommitRequest(session_id=sid, epoch=1, actual_target=tgt))
                    rep = None
                    async for rep in ctl.Telemetry(pb.TelemetryRequest(period_ms=20)):
                        break
                    metrics = (await c.get(f"http://127.0.0.1:{fp}/metrics")).text
            return h, c1, rep, metrics, target
        finally:
            await app.stop()
            await server.stop(0)

    h, c1, rep, metrics, target = asyncio.run(asyncio.wait_for(go(), 30))
    assert h.status == health_pb2.HealthCheckResponse.SERVING
    assert c1.status == pb.STATUS_OK and c1.scheme == pb.SCHEME_FULL_COPY, c1  # the session's own
    (sync,) = [x[1] for x in target.calls if x[0] == "sync"]
    assert sync.split_tokens == 0 and sync.scheme == pb.SCHEME_FULL_COPY
    assert rep.agent_id == "a" and rep.server.model.model == "fake" and rep.server.model.weights_digest == "d1"
    assert "pallas_kv_blocks_held 0.0" in metrics and "pallas_control_calls_total" in metrics
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


def test_local_agents_get_certificates_from_a_local_ca(tmp_path):
    """pallas_eval's harness (issue 16): each agent gets its own certificate (CN = agent id)
    through PALLAS_TLS_*, the harness the xApp's; an agent told `insecure` gets `--insecure` and
    no certificate; the replay's descriptor carries the xApp's files in controls.tls."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    from pallas_eval.cluster import LocalAgent, provision_tls
    from pallas_eval.replay import Server, xapp_descriptor

    a, b, c = (LocalAgent(n, "m", log_dir=str(tmp_path)) for n in ("edge-0", "edge-1", "edge-2"))
    c.insecure = True
    xapp = provision_tls([a, b, c], tmp_path / "tls")

    def cn(path):
        cert = x509.load_pem_x509_certificate(open(path, "rb").read())
        return cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value

    assert cn(a.tls_env["PALLAS_TLS_CERT"]) == "edge-0" and cn(b.tls.cert) == "edge-1"
    assert cn(xapp.cert) == "pallas-xapp" and a.client_tls == b.client_tls == xapp
    assert a.tls.ca == b.tls.ca == xapp.ca
    assert "--insecure" not in a.command() and "--insecure" in c.command()
    assert c.tls is None and c.tls_env == {} and c.client_tls is None
    # Each agent's own files make a LinkSecurity the agent would accept (read and checked).
    for x in (a, b):
        sec = agent.app.link_security(parse_args(x.command()[3:]), environ=x.tls_env)
        assert sec.watcher is not None
    desc = xapp_descriptor({"cells": []}, {}, [Server(0, a, None, 1)], "pallas")
    assert desc["controls"]["tls"] == {"enabled": True, "cert_file": str(xapp.cert),
                                       "key_file": str(xapp.key), "ca_file": str(xapp.ca)}
    assert "tls" not in xapp_descriptor({"cells": []}, {}, [Server(0, c, None, 1)], "pallas")["controls"]
    # the history trace of a generated drive is what the xApp learns from at start; none: empty
    assert desc["controls"]["association_map"] == {"path": ""}
    hist = xapp_descriptor({"cells": [], "history": "/x/history.e2trace"}, {}, [Server(0, c, None, 1)], "pallas")
    assert hist["controls"]["association_map"] == {"path": "/x/history.e2trace"}


def test_an_http_port_that_cannot_be_bound_is_an_error_the_agent_cleans_up_after():
    """uvicorn exits (SystemExit(3)) when it cannot bind; inside a task that left the event loop
    past the agent's clean-up and left the launched vLLM running. It is a RuntimeError now."""
    import asyncio

    from agent.app import _serve_http

    class Srv:
        async def serve(self):
            raise SystemExit(3)

    with pytest.raises(RuntimeError, match="port 8080 did not start"):
        asyncio.run(_serve_http(Srv(), 8080))


def test_the_lease_flag_and_its_variable_reach_the_targets_prepare_reply(monkeypatch, capsys):
    """--lease-s / PALLAS_LEASE_S (issue 45) is the lease a target grants (PrepareReply.lease_s)
    and expires by; it must be > 0."""
    from migration.fakes import IDENT, _prep
    from agent.ipc import BlockHub
    from agent.migration import MigrationEngine

    monkeypatch.setenv("PALLAS_LEASE_S", "4.5")
    assert parse_args(["--model", "/m"]).migration().lease_s == 4.5
    cfg = parse_args(["--model", "/m", "--lease-s", "2.5"])       # the flag wins
    with pytest.raises(SystemExit):
        parse_args(["--model", "/m", "--lease-s", "0"])
    assert "--lease-s must be > 0" in capsys.readouterr().err

    async def run():
        hub = BlockHub()
        hub.sched_info = SchedHello(block_size=32, free_blocks=100)
        m = MigrationEngine(agent_id="t", peer_address="", sessions=SessionStore(),
                            vllm_client=None,        # no prefix: no warm-up
                            hub=hub, identity=lambda: IDENT, config=cfg.migration())
        rep = await m.target.on_prepare(_prep(prefix=0, expected=65536))
        t = m.ctx.inbound["s"].touched
        kept, gone = await m.target.expire(now=t + 2.5), await m.target.expire(now=t + 2.501)
        await m.close()
        return rep.lease_s, kept, gone

    assert asyncio.run(run()) == (2.5, 0, 1)
