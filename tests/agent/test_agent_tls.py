"""The agent's links with mutual TLS and authorisation (issue 16), the whole agent wired by
agent.app.Agent around a fake engine (no vLLM), certificates from a throwaway CA:

- Control admits only the xApp's identity; a client without a certificate, or with another
  certificate of the CA, is refused; gRPC health is open to any certificate of the CA;
- PeerTransfer admits only the directory's agents (``--peer-front`` ids, ``--peer-identity``);
- a Trigger/Commit naming a target outside the directory is refused (non-OK, nothing sent,
  the source serves on), and so is a directory id at an address whose server certificate does
  not name that agent;
- neither TLS files nor ``--insecure``: the agent refuses to start, naming both.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from agent.session import SessionState
from agent.transfer import PeerPool, serve_peer_transfer
from pallas_common import tls
from pallas_eval.localca import LocalCA

import fakes_agent as fk
from migration.fakes import Target

PEER_SERVICE = pb.DESCRIPTOR.services_by_name["PeerTransfer"].full_name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = LocalCA("pallas-test-ca")
    return {n: ca.write(d, n) for n in ("a", "b", "pallas-xapp", "intruder")}


@pytest.fixture
def fake_core(monkeypatch):
    monkeypatch.setattr(Agent, "attach", fk.fake_attach)
    monkeypatch.setattr(agent.weights, "weights_digest", lambda model: "d1")


@contextlib.asynccontextmanager
async def tls_agent(pki, monkeypatch):
    """Agent "a" with TLS from PALLAS_TLS_* (its certificate), directory = {"b"} (by
    --peer-front), the xApp identity "pallas-xapp"; and two PeerTransfer targets: "b" (b's
    certificate) and "intruder" (a certificate of the same CA, not in the directory)."""
    files = pki["a"]
    for k, v in ((tls.ENV_CERT, files.cert), (tls.ENV_KEY, files.key), (tls.ENV_CA, files.ca)):
        monkeypatch.setenv(k, str(v))
    cp, fp = free_port(), free_port()
    cfg = parse_args(["--model", "/m/fake", "--vllm-url", "http://127.0.0.1:1", "--agent-id", "a",
                      "--control-port", str(cp), "--front-port", str(fp), "--peer-port", "0",
                      "--host", "127.0.0.1", "--probe-prefill-tokens", "0",
                      "--peer-front", "b=http://127.0.0.1:1"])
    targets, servers = {}, []
    for name in ("b", "intruder"):
        sec = tls.LinkSecurity(pki[name])
        h = Target()
        srv, addr = await serve_peer_transfer(h, "127.0.0.1:0", credentials=sec.server_credentials(),
                                              interceptors=sec.interceptors({PEER_SERVICE: ["a"]}))
        servers.append(srv)
        targets[name] = (h, addr)
    app = Agent(cfg)
    await app.start()
    try:
        yield app, f"127.0.0.1:{cp}", f"http://127.0.0.1:{fp}", targets
    finally:
        await app.stop()
        for s in servers:
            await s.stop(0)


async def _open_session(front: str, max_tokens: int = 400) -> str:
    async with httpx.AsyncClient() as c:
        r = await c.post(f"{front}/v1/sessions", json={"ue_id": "u", "prompt_token_ids": [1, 2, 3],
                                                      "max_tokens": max_tokens, "stream": False})
        sid = r.json()["session_id"]
    await asyncio.sleep(0.05)
    return sid


def _channel(files: tls.TlsFiles, address: str):
    return tls.LinkSecurity(files).aio_channel(address)


def test_control_admits_only_the_xapp(pki, monkeypatch, fake_core):
    async def go():
        async with tls_agent(pki, monkeypatch) as (app, ctl_addr, front, targets):
            sid = await _open_session(front)
            req = pb.CommitRequest(session_id=sid, epoch=1, actual_target=pb.PeerEndpoint(
                agent_id="b", address=targets["b"][1]))
            codes = {}
            # Plaintext, and TLS without a client certificate: the handshake fails.
            ca = pki["a"].ca.read_bytes()
            for name, ch in (("plaintext", grpc.aio.insecure_channel(ctl_addr)),
                             ("no-cert", grpc.aio.secure_channel(
                                 ctl_addr, grpc.ssl_channel_credentials(root_certificates=ca)))):
                async with ch:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await pallas_pb2_grpc.ControlStub(ch).Commit(req, timeout=5)
                    codes[name] = err.value.code()
            # A certificate of the CA that is not the xApp's: health yes, Control no.
            async with _channel(pki["intruder"], ctl_addr) as ch:
                h = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service="pallas.v1.Control"))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await pallas_pb2_grpc.ControlStub(ch).Commit(req, timeout=5)
                codes["intruder"] = err.value.code()
            state_before = app.sessions.get(sid).state
            # The xApp's certificate: the Commit runs, over TLS to the directory agent b.
            async with _channel(pki["pallas-xapp"], ctl_addr) as ch:
                rep = await pallas_pb2_grpc.ControlStub(ch).Commit(req, timeout=10)
            return codes, h, state_before, rep, targets["b"][0].calls

    codes, h, state_before, rep, b_calls = asyncio.run(asyncio.wait_for(go(), 30))
    assert codes == {"plaintext": grpc.StatusCode.UNAVAILABLE,
                     "no-cert": grpc.StatusCode.UNAVAILABLE,
                     "intruder": grpc.StatusCode.PERMISSION_DENIED}
    assert h.status == health_pb2.HealthCheckResponse.SERVING
    assert state_before == SessionState.SERVING  # the refused Commits did nothing
    assert rep.status == pb.STATUS_OK, rep
    assert [c[0] for c in b_calls if c[0] != "progress"] == ["prepare", "sync"]


def test_peer_transfer_admits_only_directory_agents(pki, monkeypatch, fake_core):
    async def go():
        async with tls_agent(pki, monkeypatch) as (app, _ctl, _front, _targets):
            me = pb.PeerEndpoint(agent_id="a", address=app.peer_address)
            out = {}
            for name in ("intruder", "pallas-xapp", "b"):
                pool = PeerPool(channel_factory=tls.LinkSecurity(pki[name]).aio_channel)
                c = pool.get(me)
                try:
                    for call, req in (("prepare", pb.PrepareRequest(session_id="s1", epoch=1)),
                                      ("sync", pb.SyncRequest(session_id="s1", epoch=1))):
                        try:
                            r = await getattr(c, call)(req)
                            out[(name, call)] = pb.Status.Name(r.status)
                        except grpc.aio.AioRpcError as e:
                            out[(name, call)] = e.code()
                finally:
                    await pool.close()
            return out, dict(app.migration.ctx.inbound)

    out, inbound = asyncio.run(asyncio.wait_for(go(), 30))
    for name in ("intruder", "pallas-xapp"):
        assert out[(name, "prepare")] == out[(name, "sync")] == grpc.StatusCode.PERMISSION_DENIED
    # The directory agent reaches the engine: it answers (an unknown model / no prepared attempt
    # is the engine's own refusal, a protocol status, not an RPC error).
    assert isinstance(out[("b", "prepare")], str) and isinstance(out[("b", "sync")], str), out


def test_trigger_and_commit_to_a_non_directory_target_are_refused(pki, monkeypatch, fake_core):
    async def go():
        async with tls_agent(pki, monkeypatch) as (app, ctl_addr, front, targets):
            sid = await _open_session(front, max_tokens=3000)  # decoding for 15 s
            intruder_addr = targets["intruder"][1]
            async with _channel(pki["pallas-xapp"], ctl_addr) as ch:
                ctl = pallas_pb2_grpc.ControlStub(ch)
                outside = pb.PeerEndpoint(agent_id="intruder", address=intruder_addr)
                t = await ctl.Trigger(pb.TriggerRequest(session_id=sid, epoch=1, target=outside))
                c = await ctl.Commit(pb.CommitRequest(session_id=sid, epoch=1, actual_target=outside))
                # A directory id at the intruder's address: its certificate does not name "b".
                spoofed = pb.PeerEndpoint(agent_id="b", address=intruder_addr)
                c2 = await ctl.Commit(pb.CommitRequest(session_id=sid, epoch=2,
                                                       actual_target=spoofed))
            s = app.sessions.get(sid)
            # (FakeVllmClient stops appending once frozen, unlike vLLM whose held tokens unfreeze()
            # publishes; so "serves on" is checked as: still here, serving, not frozen.)
            return t, c, c2, s.state, s.frozen_at, targets["intruder"][0].calls

    t, c, c2, state, frozen_at, intruder_calls = asyncio.run(asyncio.wait_for(go(), 30))
    assert (t.status, c.status) == (pb.STATUS_REJECTED, pb.STATUS_REJECTED), (t, c)
    assert "not a directory agent" in c.message and "'intruder'" in c.message
    assert c2.status != pb.STATUS_OK and c2.status == pb.STATUS_ERROR, c2
    assert intruder_calls == []  # nothing of the session left this agent
    assert state == SessionState.SERVING and frozen_at is None  # the source serves on


def test_agent_refuses_to_start_without_tls_or_insecure(monkeypatch, capsys, pki):
    from agent.app import link_security

    for k in (tls.ENV_CERT, tls.ENV_KEY, tls.ENV_CA, "PALLAS_INSECURE"):
        monkeypatch.delenv(k, raising=False)
    argv = ["--model", "/m/fake", "--vllm-url", "http://127.0.0.1:1"]
    assert agent.app.main(argv) == 2
    err = capsys.readouterr().err
    assert "PALLAS_TLS_CERT" in err and "--insecure" in err
    with pytest.raises(tls.TlsError, match="--insecure"):
        Agent(parse_args(argv))
    assert link_security(parse_args(argv + ["--insecure"])).insecure is True
    monkeypatch.setenv("PALLAS_INSECURE", "1")
    assert parse_args(argv).insecure is True
    # Both is refused too: TLS files and --insecure.
    env = {tls.ENV_CERT: str(pki["a"].cert), tls.ENV_KEY: str(pki["a"].key), tls.ENV_CA: str(pki["a"].ca)}
    with pytest.raises(tls.TlsError, match="both"):
        link_security(parse_args(argv), environ=env)
    cfg = parse_args(argv + ["--peer-front", "b=http://h:1", "--peer-identity", "c,d",
                             "--peer-identity", "e, c,", "--xapp-identity", "spiffe://x/xapp"])
    assert cfg.directory == {"b", "c", "d", "e"} and cfg.xapp_identity == "spiffe://x/xapp"
    assert cfg.peer_identity == ["c", "d", "e"]  # in order, once each
