"""PeerTransfer over mutual TLS with the authorisation interceptor (agent.transfer's hooks,
pallas_common.tls): a directory agent streams blocks; a certificate of the CA whose identity is
not in the directory cannot Prepare, stream or Release; a client of another CA is refused."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from pallas_proto import pallas_pb2 as pb

from agent.transfer import PeerPool, serve_peer_transfer
from pallas_common import tls
from pallas_eval.localca import LocalCA
from test_peer_transfer import Handler, _blk


PEER_SERVICE_NAME = pb.DESCRIPTOR.services_by_name["PeerTransfer"].full_name


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = LocalCA("agents-ca")
    out = {n: ca.write(d / "one", n) for n in ("agent-a", "agent-b", "intruder")}
    out["stranger"] = LocalCA("agents-ca").write(d / "two", "agent-b")  # same names, other CA
    return out


def _pool(files: tls.TlsFiles) -> PeerPool:
    return PeerPool(channel_factory=tls.LinkSecurity(files).aio_channel)


def test_only_directory_agents_use_peer_transfer_over_mutual_tls(pki):
    async def run():
        h = Handler()
        sec = tls.LinkSecurity(pki["agent-a"])
        interceptors = sec.interceptors({PEER_SERVICE_NAME: ["agent-a", "agent-b"]})
        server, addr = await serve_peer_transfer(h, "127.0.0.1:0",
                                                 credentials=sec.server_credentials(),
                                                 interceptors=interceptors)
        auth = interceptors[0]
        target = pb.PeerEndpoint(agent_id="agent-a", address=addr)
        pools = {n: _pool(pki[n]) for n in ("agent-b", "intruder", "stranger")}
        try:
            good = pools["agent-b"].get(target)
            assert isinstance(good.channel, tls.ReloadingAioChannel)
            assert (await good.prepare(pb.PrepareRequest(session_id="s", epoch=1))).status \
                == pb.STATUS_OK
            st = good.open_stream("s", 1)
            for i in range(5):
                st.send(_blk(i))
            ack = await st.finish(10)
            assert (ack.blocks_received, h.store.count("s")) == (5, 5)

            bad = pools["intruder"].get(target)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await bad.prepare(pb.PrepareRequest(session_id="s", epoch=2))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            st = bad.open_stream("s", 1)
            st.send(_blk(9))
            assert await st.finish(10) is None
            assert st.error.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await bad.release(pb.ReleaseRequest(session_id="s", epoch=1))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert h.store.count("s") == 5  # nothing reached the handler

            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pools["stranger"].get(target).prepare(pb.PrepareRequest(session_id="s"))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert auth.refused == {(PEER_SERVICE_NAME, "PERMISSION_DENIED"): 3}
        finally:
            for p in pools.values():
                await p.close()
            await server.stop(0)
    asyncio.run(run())
