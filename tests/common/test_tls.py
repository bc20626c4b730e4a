"""pallas_common.tls: mutual TLS and per-service authorisation over real gRPC on loopback.

Each test makes throwaway CAs and certificates (pallas_eval.localca) and runs the wire
contract's own services (Control, PeerTransfer) on a grpc.aio server bound to 127.0.0.1, in
whichever environment runs it (the agent's or the xApp's).
"""

from __future__ import annotations

import asyncio
import os
import time
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import grpc.aio
import pytest

from pallas_common import tls
from pallas_eval.localca import LocalCA
from pallas_proto import pallas_pb2 as pb
from pallas_proto import pallas_pb2_grpc as pbg

CONTROL = pb.DESCRIPTOR.services_by_name["Control"].full_name
PEER = pb.DESCRIPTOR.services_by_name["PeerTransfer"].full_name
POLICY = {CONTROL: ["xapp"], PEER: ["agent-a", "agent-b"]}


class Control(pbg.ControlServicer):
    def __init__(self, calls: list) -> None:
        self.calls = calls

    async def Trigger(self, request, context):  # noqa: N802
        self.calls.append(("Trigger", request.session_id))
        return pb.ControlReply(status=pb.STATUS_OK, session_id=request.session_id,
                               epoch=request.epoch)

    async def Telemetry(self, request, context):  # noqa: N802
        self.calls.append(("Telemetry", request.period_ms))
        for i in range(3):
            yield pb.TelemetryReport(agent_id=f"r{i}")


class Peer(pbg.PeerTransferServicer):
    def __init__(self, calls: list) -> None:
        self.calls = calls

    async def Release(self, request, context):  # noqa: N802
        self.calls.append(("Release", request.session_id))
        return pb.ReleaseReply(status=pb.STATUS_OK, blocks_released=7)

    async def StreamBlocks(self, request_iterator, context):  # noqa: N802
        n = 0
        async for blk in request_iterator:
            n += 1
        self.calls.append(("StreamBlocks", n))
        return pb.StreamAck(blocks_received=n)


def _place(files, dest: Path) -> tls.TlsFiles:
    """Copy an identity's three files onto ``dest/{tls.crt,tls.key,ca.crt}``, each replaced
    atomically (as a Secret volume update does). Returns the stable paths."""
    dest.mkdir(parents=True, exist_ok=True)
    out = tls.TlsFiles(dest / "tls.crt", dest / "tls.key", dest / "ca.crt")
    for src, dst in ((files.cert, out.cert), (files.key, out.key), (files.ca, out.ca)):
        tmp = dst.with_suffix(".tmp")
        tmp.write_bytes(Path(src).read_bytes())
        os.replace(tmp, dst)
    return out


def _secret_volume(files, dest: Path) -> tls.TlsFiles:
    """Publish an identity's files as the kubelet publishes a Secret volume (its atomic writer):
    a new timestamped folder, then the ``..data`` link swapped to it in one rename; ``tls.crt``,
    ``tls.key`` and ``ca.crt`` are links through ``..data``. Returns the stable paths."""
    dest.mkdir(parents=True, exist_ok=True)
    version = dest / f"..{time.time_ns()}"
    version.mkdir()
    for src, name in ((files.cert, "tls.crt"), (files.key, "tls.key"), (files.ca, "ca.crt")):
        (version / name).write_bytes(Path(src).read_bytes())
        if not (dest / name).is_symlink():
            (dest / name).symlink_to(Path("..data") / name)
    tmp = dest / "..data_tmp"
    tmp.symlink_to(version.name)
    os.replace(tmp, dest / "..data")
    return tls.TlsFiles(dest / "tls.crt", dest / "tls.key", dest / "ca.crt")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Two CAs; identities of CA1: agent-a (server), agent-b, xapp, intruder; of CA2: xapp,
    agent-a (for rotations) and an xapp issued by CA2 but trusting CA1 (another CA's client)."""
    d = tmp_path_factory.mktemp("pki")
    ca1, ca2 = LocalCA("ca-one"), LocalCA("ca-two")
    ids = {name: ca1.write(d / "one", name) for name in ("agent-a", "agent-b", "xapp", "intruder")}
    ids.update({f"{name}@2": ca2.write(d / "two", name) for name in ("agent-a", "xapp")})
    other = ca2.write(d / "other", "xapp")
    ids["xapp@other"] = tls.TlsFiles(other.cert, other.key, ids["xapp"].ca)  # trusts CA1's server
    return ids


@asynccontextmanager
async def serving(files: tls.TlsFiles | None, policy=POLICY, *, insecure: bool = False):
    """A grpc.aio server with Control and PeerTransfer behind the authorisation interceptor."""
    calls: list = []
    auth = tls.AuthorizationInterceptor(policy)
    server = grpc.aio.server(interceptors=[auth])
    pbg.add_ControlServicer_to_server(Control(calls), server)
    pbg.add_PeerTransferServicer_to_server(Peer(calls), server)
    watcher = tls.CertWatcher(files, check_interval_s=0) if files else None
    port = tls.add_server_port(server, "127.0.0.1:0", watcher, insecure=insecure)
    await server.start()
    try:
        yield f"127.0.0.1:{port}", calls, auth, watcher
    finally:
        await server.stop(None)


def _creds(files, with_cert: bool = True) -> grpc.ChannelCredentials:
    m = tls.TlsMaterial(Path(files.cert).read_bytes(), Path(files.key).read_bytes(),
                        Path(files.ca).read_bytes())
    return tls.channel_credentials(m) if with_cert else grpc.ssl_channel_credentials(m.ca)


async def _trigger(address: str, creds: grpc.ChannelCredentials | None) -> pb.ControlReply:
    ch = (grpc.aio.secure_channel(address, creds) if creds is not None
          else grpc.aio.insecure_channel(address))
    async with ch:
        return await pbg.ControlStub(ch).Trigger(pb.TriggerRequest(session_id="s1", epoch=3),
                                                 timeout=5)


async def _code(coro) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await coro
    return err.value.code()


def test_a_client_without_a_certificate_or_from_another_ca_is_refused_at_the_handshake(pki,
                                                                                       tmp_path):
    async def run():
        async with serving(_place(pki["agent-a"], tmp_path / "srv")) as (addr, calls, auth, _):
            assert await _code(_trigger(addr, _creds(pki["xapp"], with_cert=False))) \
                == grpc.StatusCode.UNAVAILABLE
            assert await _code(_trigger(addr, _creds(pki["xapp@other"]))) \
                == grpc.StatusCode.UNAVAILABLE
            assert await _code(_trigger(addr, None)) == grpc.StatusCode.UNAVAILABLE  # plaintext
            assert calls == []
            reply = await _trigger(addr, _creds(pki["xapp"]))  # the same server serves the xApp
            assert (reply.status, reply.session_id, reply.epoch) == (pb.STATUS_OK, "s1", 3)
            assert calls == [("Trigger", "s1")]
    asyncio.run(run())


def test_each_service_admits_only_its_named_identities(pki, tmp_path):
    async def run():
        async with serving(_place(pki["agent-a"], tmp_path / "srv")) as (addr, calls, auth, _):
            async def release(who):
                async with grpc.aio.secure_channel(addr, _creds(pki[who])) as ch:
                    return await pbg.PeerTransferStub(ch).Release(
                        pb.ReleaseRequest(session_id=who), timeout=5)

            async def telemetry(who):
                async with grpc.aio.secure_channel(addr, _creds(pki[who])) as ch:
                    call = pbg.ControlStub(ch).Telemetry(pb.TelemetryRequest(period_ms=9),
                                                         timeout=5)
                    return [r.agent_id async for r in call]

            # A valid certificate of the CA, but not a named identity: no service at all.
            assert await _code(_trigger(addr, _creds(pki["intruder"]))) \
                == grpc.StatusCode.PERMISSION_DENIED
            assert await _code(telemetry("intruder")) == grpc.StatusCode.PERMISSION_DENIED
            assert await _code(release("intruder")) == grpc.StatusCode.PERMISSION_DENIED
            # A directory agent may use PeerTransfer, not Control; the xApp the reverse.
            assert await _code(_trigger(addr, _creds(pki["agent-b"]))) \
                == grpc.StatusCode.PERMISSION_DENIED
            assert await _code(release("xapp")) == grpc.StatusCode.PERMISSION_DENIED
            assert calls == []
            assert auth.refused == {(CONTROL, "PERMISSION_DENIED"): 3,
                                    (PEER, "PERMISSION_DENIED"): 2}

            assert (await release("agent-b")).blocks_released == 7
            assert await telemetry("xapp") == ["r0", "r1", "r2"]
            async with grpc.aio.secure_channel(addr, _creds(pki["agent-a"])) as ch:
                blocks = (pb.KVBlock(session_id="s", block_index=i) for i in range(4))
                ack = await pbg.PeerTransferStub(ch).StreamBlocks(blocks, timeout=5)
            assert ack.blocks_received == 4
            assert calls == [("Release", "agent-b"), ("Telemetry", 9), ("StreamBlocks", 4)]

            # The directory grows at run time: the intruder's name joins PeerTransfer only.
            auth.allow(PEER, ["agent-a", "agent-b", "intruder"])
            assert (await release("intruder")).blocks_released == 7
            assert await _code(_trigger(addr, _creds(pki["intruder"]))) \
                == grpc.StatusCode.PERMISSION_DENIED
    asyncio.run(run())


def test_a_service_missing_from_the_policy_is_refused_to_everyone(pki, tmp_path):
    async def run():
        async with serving(_place(pki["agent-a"], tmp_path / "srv"), {PEER: ["*"]}) \
                as (addr, calls, _, _w):
            assert await _code(_trigger(addr, _creds(pki["xapp"]))) \
                == grpc.StatusCode.PERMISSION_DENIED
            async with grpc.aio.secure_channel(addr, _creds(pki["intruder"])) as ch:  # "*"
                reply = await pbg.PeerTransferStub(ch).Release(pb.ReleaseRequest(), timeout=5)
            assert reply.blocks_released == 7 and calls == [("Release", "")]
    asyncio.run(run())


def test_a_plaintext_server_behind_the_interceptor_refuses_as_unauthenticated():
    async def run():
        async with serving(None, insecure=True) as (addr, calls, auth, _):
            assert await _code(_trigger(addr, None)) == grpc.StatusCode.UNAUTHENTICATED
            assert calls == [] and auth.refused == {(CONTROL, "UNAUTHENTICATED"): 1}
    asyncio.run(run())


def test_the_server_serves_a_rotated_certificate_and_ca_without_a_restart(pki, tmp_path):
    """The server's files (a Secret volume) move from CA1 to CA2 while it runs: new connections
    then need (and get) CA2's chain both ways; the old CA's clients are refused."""
    async def run():
        srv = _secret_volume(pki["agent-a"], tmp_path / "srv")
        async with serving(srv) as (addr, calls, _, watcher):
            assert (await _trigger(addr, _creds(pki["xapp"]))).status == pb.STATUS_OK
            assert await _code(_trigger(addr, _creds(pki["xapp@2"]))) \
                == grpc.StatusCode.UNAVAILABLE
            _secret_volume(pki["agent-a@2"], tmp_path / "srv")
            assert (await _trigger(addr, _creds(pki["xapp@2"]))).status == pb.STATUS_OK
            assert await _code(_trigger(addr, _creds(pki["xapp"]))) \
                == grpc.StatusCode.UNAVAILABLE
            assert watcher.generation == 1 and len(calls) == 2
    asyncio.run(run())


def test_a_half_written_rotation_is_skipped_and_the_old_certificate_stays_in_use(pki, tmp_path):
    async def run():
        srv = _place(pki["agent-a"], tmp_path / "srv")
        async with serving(srv) as (addr, calls, _, watcher):
            srv.cert.write_bytes(Path(pki["agent-b"].cert).read_bytes())  # new cert, old key
            assert (await _trigger(addr, _creds(pki["xapp"]))).status == pb.STATUS_OK
            assert watcher.generation == 0 and watcher.failed_reloads >= 1
            srv.key.write_bytes(Path(pki["agent-b"].key).read_bytes())  # now whole
            assert (await _trigger(addr, _creds(pki["xapp"]))).status == pb.STATUS_OK
            assert watcher.generation == 1
            assert watcher.material.cert_chain == Path(pki["agent-b"].cert).read_bytes()
    asyncio.run(run())


def test_an_aio_client_channel_picks_up_its_rotated_certificate_under_the_same_stub(pki, tmp_path):
    async def run():
        async with serving(_place(pki["agent-a@2"], tmp_path / "srv")) as (addr, calls, _, _w):
            cli = _place(pki["xapp"], tmp_path / "cli")  # CA1's: the server trusts CA2 only
            watcher = tls.CertWatcher(cli, check_interval_s=0)
            ch = tls.open_channel(addr, watcher, aio=True)
            assert isinstance(ch, tls.ReloadingAioChannel)
            stub = pbg.ControlStub(ch)
            req = pb.TriggerRequest(session_id="rot", epoch=1)
            assert await _code(stub.Trigger(req, timeout=5)) == grpc.StatusCode.UNAVAILABLE
            _place(pki["xapp@2"], tmp_path / "cli")
            assert (await stub.Trigger(req, timeout=5)).session_id == "rot"
            assert (ch.rebuilds, watcher.generation, calls) == (1, 1, [("Trigger", "rot")])
            await ch.close()
    asyncio.run(run())


def test_a_sync_client_channel_picks_up_its_rotated_certificate_under_the_same_stub(pki, tmp_path):
    async def run():
        async with serving(_place(pki["agent-a@2"], tmp_path / "srv")) as (addr, calls, _, _w):
            cli = _place(pki["xapp"], tmp_path / "cli")
            ch = tls.open_channel(addr, tls.CertWatcher(cli, check_interval_s=0))
            assert isinstance(ch, tls.ReloadingChannel)
            stub = pbg.ControlStub(ch)
            req = pb.TriggerRequest(session_id="sync", epoch=2)
            with pytest.raises(grpc.RpcError) as err:
                await asyncio.to_thread(stub.Trigger, req, timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            _place(pki["xapp@2"], tmp_path / "cli")
            reply = await asyncio.to_thread(stub.Trigger, req, timeout=5)
            assert (reply.epoch, ch.rebuilds, calls) == (2, 1, [("Trigger", "sync")])
            ch.close()
    asyncio.run(run())


def test_the_watcher_rereads_at_most_once_per_interval(pki, tmp_path):
    now = [100.0]
    files = _place(pki["xapp"], tmp_path / "w")
    w = tls.CertWatcher(files, check_interval_s=5.0, clock=lambda: now[0])
    _place(pki["xapp@2"], tmp_path / "w")
    now[0] += 4.9
    assert (w.poll(), w.generation) == (False, 0)
    now[0] += 0.2
    assert (w.poll(), w.generation) == (True, 1)
    assert w.material.ca == Path(pki["xapp@2"].ca).read_bytes()
    assert (w.poll(), w.generation) == (False, 1)


def test_plaintext_needs_an_explicit_insecure_and_half_configured_tls_is_an_error(pki):
    with pytest.raises(tls.TlsError, match="insecure=True"):
        tls.open_channel("127.0.0.1:1", None)
    with pytest.raises(tls.TlsError, match="insecure=True"):
        tls.add_server_port(grpc.server(None), "127.0.0.1:0", None)
    with pytest.raises(tls.TlsError, match="choose one"):
        tls.open_channel("127.0.0.1:1", tls.CertWatcher(pki["xapp"]), insecure=True)
    ch = tls.open_channel("127.0.0.1:1", None, insecure=True)
    assert not isinstance(ch, tls.ReloadingChannel)
    ch.close()

    assert tls.TlsFiles.from_env({}) is None
    with pytest.raises(tls.TlsError, match="PALLAS_TLS_KEY, PALLAS_TLS_CA not set"):
        tls.TlsFiles.from_env({"PALLAS_TLS_CERT": "/c"})
    env = {"PALLAS_TLS_CERT": "/c", "PALLAS_TLS_KEY": "/k", "PALLAS_TLS_CA": "/a"}
    assert tls.TlsFiles.from_env(env) == tls.TlsFiles(Path("/c"), Path("/k"), Path("/a"))
    with pytest.raises(tls.TlsError, match="TLS cert file /c"):
        tls.CertWatcher(tls.TlsFiles.from_env(env))


def test_link_security_makes_the_choice_once_for_servers_channels_and_interceptors(pki):
    env = {"PALLAS_TLS_CERT": str(pki["xapp"].cert), "PALLAS_TLS_KEY": str(pki["xapp"].key),
           "PALLAS_TLS_CA": str(pki["xapp"].ca)}
    sec = tls.LinkSecurity.from_env(environ=env)
    assert sec.watcher.material.cert_chain == Path(pki["xapp"].cert).read_bytes()
    assert isinstance(sec.server_credentials(), grpc.ServerCredentials)
    [auth] = sec.interceptors({CONTROL: ["xapp"]})
    assert auth.allowed(CONTROL) == {"xapp"} and auth.allowed(PEER) == frozenset()
    ch = sec.channel("127.0.0.1:1")
    assert isinstance(ch, tls.ReloadingChannel)
    ch.close()
    with pytest.raises(tls.TlsError, match="choose one"):
        tls.LinkSecurity.from_env(environ=env, insecure=True)
    with pytest.raises(tls.TlsError, match="insecure=True"):
        tls.LinkSecurity.from_env(environ={})
    plain = tls.LinkSecurity.from_env(environ={}, insecure=True)
    assert (plain.server_credentials(), plain.interceptors({CONTROL: ["xapp"]})) == (None, [])
    ch = plain.channel("127.0.0.1:1")
    assert not isinstance(ch, tls.ReloadingChannel)
    ch.close()


def test_link_security_from_the_descriptors_tls_object(pki):
    f = pki["xapp"]
    tls_obj = {"enabled": True, "cert_file": str(f.cert), "key_file": str(f.key),
               "ca_file": str(f.ca), "check_interval_s": 30, "server_name": "agents.example"}
    sec = tls.LinkSecurity.from_mapping(tls_obj)
    assert (sec.watcher.files, sec.watcher.check_interval_s, sec.server_name) \
        == (f, 30.0, "agents.example")
    assert tls.LinkSecurity.from_mapping({"enabled": False}).insecure  # explicit in the file
    assert tls.LinkSecurity.from_mapping(None, insecure=True).insecure
    with pytest.raises(tls.TlsError, match="insecure=True"):
        tls.LinkSecurity.from_mapping(None)
    with pytest.raises(tls.TlsError, match="key_file, ca_file missing"):
        tls.LinkSecurity.from_mapping({"cert_file": "/c"})
    with pytest.raises(tls.TlsError, match="choose one"):
        tls.LinkSecurity.from_mapping(tls_obj, insecure=True)


def test_peer_identities_are_the_subject_cn_and_every_san():
    ctx = {"transport_security_type": [b"ssl"], "x509_common_name": [b"xapp"],
           "x509_subject_alternative_name": [b"pallas-xapp.ricxapp.svc", b"spiffe://pallas/xapp"],
           "x509_pem_cert": [b"-----BEGIN CERTIFICATE-----"]}
    assert tls.peer_identities(ctx) == {"xapp", "pallas-xapp.ricxapp.svc",
                                        "spiffe://pallas/xapp"}
    assert tls.peer_identities({"transport_security_type": [b"insecure"]}) == frozenset()
    assert tls.service_of("/pallas.v1.Control/Trigger") == "pallas.v1.Control"


def test_the_xapps_policy_client_and_telemetry_consumer_use_mutual_tls(pki, tmp_path):
    from xapp.policy import AgentEndpoint, PolicyClient, TelemetryConsumer

    async def run():
        async with serving(_place(pki["agent-a"], tmp_path / "srv")) as (addr, calls, _, _w):
            agents = {"a": AgentEndpoint("a", addr, addr)}

            def factory(who):
                return tls.LinkSecurity(pki[who]).channel

            clients = [PolicyClient(agents, retries=0, channel_factory=factory(who))
                       for who in ("xapp", "agent-b")]
            try:
                ok, refused = [await asyncio.to_thread(c.trigger("a", "s9", 4, "a").result, 10)
                               for c in clients]
            finally:
                for c in clients:
                    c.close()
            assert ok.ok and (ok.reply.session_id, ok.reply.epoch) == ("s9", 4)
            assert refused.reply is None and "PERMISSION_DENIED" in refused.error
            assert calls == [("Trigger", "s9")]

            got: list = []
            tc = TelemetryConsumer(agents, lambda aid, rep: got.append((aid, rep.agent_id)),
                                   period_ms=5, retry_s=0.05, channel_factory=factory("xapp"))
            tc.start()
            for _ in range(200):
                if len(got) >= 3:
                    break
                await asyncio.sleep(0.01)
            await asyncio.to_thread(tc.stop)
            assert got[:3] == [("a", "r0"), ("a", "r1"), ("a", "r2")]
    asyncio.run(run())
