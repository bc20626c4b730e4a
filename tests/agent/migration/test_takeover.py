"""Prepare and Sync cannot take over what is not theirs (issue 16, authorisation): a session
that lives at the target, an attempt prepared by another peer, an attempt of another epoch.

The target engine of test_engine (fake vLLM client, BlockHub without a connector); the calling
peer's identity is what agent.transfer.CALLER says (set from the verified certificate by the
PeerTransfer service); the last case goes through real gRPC with mutual TLS.
"""

from __future__ import annotations

import asyncio

import pytest
from pallas_proto import pallas_pb2 as pb

from agent.session import SessionState
from agent.transfer import CALLER, PeerPool, serve_peer_transfer
from pallas_common import tls
from pallas_eval.localca import LocalCA

from migration.fakes import _blk, _engine, _prep, _serving

PEER_SERVICE = pb.DESCRIPTOR.services_by_name["PeerTransfer"].full_name


def _sync(epoch=1, sid="s", n=70):
    return pb.SyncRequest(session_id=sid, epoch=epoch, token_ids=list(range(n)), prompt_tokens=64,
                          split_tokens=64, sampling=pb.SamplingParams(max_tokens=10))


def test_prepare_and_sync_cannot_take_over_a_session_that_lives_here():
    async def run():
        m, hub, eng = _engine()
        live = _serving(m)                      # "s" is decoding at this agent
        r = await m.target.on_prepare(_prep())
        assert r.status == pb.STATUS_REJECTED and "lives at this agent" in r.message, r
        assert m.ctx.inbound == {} and eng.prefills == [] and m.ctx.ledger.newest_in("s") == -1
        # An attempt prepared before the session appeared here: its Sync does not replace it.
        # (states set by hand: a handed-over record never serves again in the product)
        live.state = SessionState.HANDED_OVER
        assert (await m.target.on_prepare(_prep())).status == pb.STATUS_OK
        live.state = SessionState.SERVING
        r = await m.target.on_sync(_sync())
        assert r.status == pb.STATUS_REJECTED and "lives at this agent" in r.message, r
        assert m.ctx.sessions.get("s") is live and live.state == SessionState.SERVING
        assert eng.started == []
        # Handed over (or ended) here, the session may come back: the same Sync now resumes it.
        live.set_state(SessionState.HANDED_OVER)
        r = await m.target.on_sync(_sync())
        assert r.status == pb.STATUS_OK, r
        assert m.ctx.sessions.get("s") is not live and m.ctx.sessions.get("s").state == SessionState.RESUMED
    asyncio.run(run())


def test_another_peer_cannot_prepare_stream_sync_or_release_an_attempt():
    async def run():
        m, hub, eng = _engine()
        tok = CALLER.set(frozenset({"c"}))
        r = await m.target.on_prepare(_prep())        # claims source "a", the caller is "c"
        assert r.status == pb.STATUS_REJECTED and "not the attempt's source 'a'" in r.message
        assert m.ctx.inbound == {}
        CALLER.reset(tok)
        tok = CALLER.set(frozenset({"a", "a.example"}))
        assert (await m.target.on_prepare(_prep(expected=65536))).status == pb.STATUS_OK
        CALLER.reset(tok)
        tok = CALLER.set(frozenset({"c"}))
        same_epoch = _prep()
        same_epoch.source.agent_id = "c"
        r = await m.target.on_prepare(same_epoch)     # c's own claim, but epoch 1 is a's
        assert r.status == pb.STATUS_REJECTED and "prepared by 'a'" in r.message
        assert m.target.on_block(_blk(2)) == "refused"
        assert (await m.target.on_sync(_sync())).status == pb.STATUS_REJECTED
        rel = await m.target.on_release(pb.ReleaseRequest(session_id="s", epoch=5))
        assert rel.status == pb.STATUS_REJECTED
        assert m.ctx.ledger.newest_in("s") == 1    # the refused Release recorded no epoch
        assert m.ctx.sessions.get("s") is None and m.ctx.inbound["s"].blocks_in == 0
        assert m.held()["reserved_bytes"] == 2 * 65536     # the 64-token prefix's blocks
        CALLER.reset(tok)
        tok = CALLER.set(frozenset({"a"}))
        assert m.target.on_block(_blk(2)) == "ok"
        assert (await m.target.on_sync(_sync())).status == pb.STATUS_OK
        CALLER.reset(tok)
    asyncio.run(run())


def test_a_sync_of_another_epoch_changes_nothing():
    async def run():
        m, hub, eng = _engine()
        assert (await m.target.on_prepare(_prep(epoch=3))).status == pb.STATUS_OK
        assert (await m.target.on_sync(_sync(epoch=2))).status == pb.STATUS_STALE_EPOCH
        assert (await m.target.on_sync(_sync(epoch=4))).status == pb.STATUS_UNKNOWN_SESSION
        assert m.ctx.sessions.get("s") is None and m.ctx.inbound["s"].epoch == 3 and eng.started == []
    asyncio.run(run())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = LocalCA("pallas-test-ca")
    return {n: ca.write(d, n) for n in ("a", "b", "c")}


def test_over_mutual_tls_only_the_preparing_peer_syncs(pki):
    """Two directory agents "a" and "c" call the target "b": c's Sync of a's attempt is refused
    (the caller's identity comes from its certificate), a's goes through."""
    async def run():
        m, hub, eng = _engine()
        sec = tls.LinkSecurity(pki["b"])
        server, addr = await serve_peer_transfer(
            m.target, "127.0.0.1:0", credentials=sec.server_credentials(),
            interceptors=tuple(sec.interceptors({PEER_SERVICE: ["a", "c"]})))
        me = pb.PeerEndpoint(agent_id="b", address=addr)
        pools = {n: PeerPool(channel_factory=tls.LinkSecurity(pki[n], server_name="b").aio_channel)
                 for n in ("a", "c")}
        try:
            spoof = _prep()                    # c claims to be a
            r_spoof = await pools["c"].get(me).prepare(spoof)
            r_a = await pools["a"].get(me).prepare(_prep(expected=65536))
            r_c = await pools["c"].get(me).sync(_sync())
            r_a2 = await pools["a"].get(me).sync(_sync())
        finally:
            for p in pools.values():
                await p.close()
            await server.stop(0)
        return r_spoof, r_a, r_c, r_a2

    r_spoof, r_a, r_c, r_a2 = asyncio.run(asyncio.wait_for(run(), 30))
    assert r_spoof.status == pb.STATUS_REJECTED and "not the attempt's source" in r_spoof.message
    assert r_a.status == pb.STATUS_OK
    assert r_c.status == pb.STATUS_REJECTED and "'c'" in r_c.message, r_c
    assert r_a2.status == pb.STATUS_OK, r_a2


def test_admission_counts_the_targets_own_need_not_the_sources_claim():
    """A claim of 0 bytes does not bypass admission: the prefix's blocks are reserved."""
    async def run():
        m, hub, eng = _engine(free_blocks=2)
        zero = await m.target.on_prepare(_prep(prefix=96, expected=0))        # 3 blocks, 2 free
        ok = await m.target.on_prepare(_prep(sid="s2", prefix=64, expected=0))
        reserved = m.held()["reserved_bytes"]
        third = await m.target.on_prepare(_prep(sid="s3", prefix=0, expected=1))
        return zero, ok, reserved, third

    zero, ok, reserved, third = asyncio.run(run())
    assert zero.status == pb.STATUS_REJECTED and "needs 196608 B" in zero.message, zero
    assert ok.status == pb.STATUS_OK and reserved == 2 * 65536
    assert third.status == pb.STATUS_REJECTED and third.free_kv_bytes == 0
