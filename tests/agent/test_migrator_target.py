"""The Migrator's target side and its control-call guards, with fakes (no vLLM, no network)."""

from __future__ import annotations

import asyncio

from pallas_proto import pallas_pb2 as pb

from agent.ipc import BlockHub, block_crc
from agent.migration import MigrationConfig, Migrator
from agent.session import SamplingSpec, Session, SessionState, SessionStore

IDENT = pb.ModelIdentity(model="tiny", weights_digest="ab", dtype="float32",
                         kv_cache_dtype="auto", block_size=32, backend="cpu/CPU_ATTN/vec",
                         kv_bytes_per_token=2048, num_layers=2, block_bytes=65536)


class FakeEngine:
    def __init__(self):
        self.prefills: list[list[int]] = []
        self.started: list[tuple[Session, dict]] = []

    async def prefill(self, ids, **kw):
        self.prefills.append(list(ids))
        return {}

    def start(self, session, *, kv_transfer_params=None):
        self.started.append((session, kv_transfer_params))

    async def abort(self, session):
        pass


def _migrator(free_blocks=1000):
    hub = BlockHub()
    hub.sched_info = {"free_blocks": free_blocks, "block_size": 32}
    eng = FakeEngine()
    m = Migrator(agent_id="b", peer_address="127.0.0.1:1", sessions=SessionStore(), engine=eng,
                 hub=hub, identity=lambda: IDENT,
                 config=MigrationConfig(claim_wait_s=0.05, resume_deadline_s=0.01))
    return m, hub, eng


def _prep(epoch=1, prefix=64, model=IDENT, expected=1000):
    return pb.PrepareRequest(session_id="s", epoch=epoch, model=model,
                             prefix_token_ids=list(range(prefix)), expected_kv_bytes=expected,
                             source=pb.PeerEndpoint(agent_id="a", address="x:1"))


def _blk(idx, epoch=1, data=b"\x01" * 16, crc=None):
    return pb.KVBlock(session_id="s", epoch=epoch, block_index=idx, fill=32,
                      checksum=block_crc(data) if crc is None else crc, data=data)


def test_prepare_admission_and_epochs():
    async def run():
        m, hub, eng = _migrator(free_blocks=2)
        other = pb.ModelIdentity()
        other.CopyFrom(IDENT)
        other.weights_digest = "cd"
        r = await m.on_prepare(_prep(model=other))
        assert r.status == pb.STATUS_REJECTED and "weights_digest" in r.message
        r = await m.on_prepare(_prep(expected=10**9))
        assert r.status == pb.STATUS_REJECTED and r.free_kv_bytes == 2 * 65536
        r = await m.on_prepare(_prep(prefix=40))
        assert r.status == pb.STATUS_INVALID
        assert (await m.on_prepare(_prep(epoch=2))).status == pb.STATUS_OK
        assert (await m.on_prepare(_prep(epoch=2))).message == "already prepared"
        await asyncio.sleep(0)
        assert eng.prefills == [list(range(64))]   # warm-up with exactly the prefix
        assert (await m.on_prepare(_prep(epoch=1))).status == pb.STATUS_STALE_EPOCH
        # Blocks: only the prepared epoch is kept, bad checksums are rejected.
        assert m.on_block(_blk(2, epoch=2)) == "ok"
        assert m.on_block(_blk(3, epoch=1)) == "stale"
        assert m.on_block(_blk(3, epoch=2, crc=5)) == "bad"
        assert hub.store.num_blocks == 1
        rel = await m.on_release(pb.ReleaseRequest(session_id="s", epoch=1))
        assert rel.status == pb.STATUS_STALE_EPOCH and hub.store.num_blocks == 1
        rel = await m.on_release(pb.ReleaseRequest(session_id="s", epoch=2))
        assert rel.status == pb.STATUS_OK and rel.blocks_released == 1
        assert m.held() == {"inbound": 0, "outbound": 0, "blocks": 0, "bytes": 0,
                            "streams_queued": 0}
        assert m.on_block(_blk(4, epoch=2)) == "stale"   # released: nothing is taken any more
    asyncio.run(run())


def test_sync_resumes_with_reduced_sampling_and_load_params():
    async def run():
        m, hub, eng = _migrator()
        assert (await m.on_prepare(_prep(prefix=64))).status == pb.STATUS_OK
        m.on_block(_blk(2))
        tokens = list(range(100))       # 70 prompt + 30 generated
        tail = _blk(3)
        tail.fill = 3
        rep = await m.on_sync(pb.SyncRequest(
            session_id="s", epoch=1, token_ids=tokens, prompt_tokens=70, tail=tail,
            streamed_blocks=1, split_tokens=64, ue_id="ue", session_scheme=pb.SCHEME_CTHO,
            sampling=pb.SamplingParams(max_tokens=20, ignore_eos=True)))
        assert rep.status == pb.STATUS_OK
        s, params = eng.started[0]
        assert s.state == SessionState.RESUMED and s.resumed_from == 30
        assert s.info["scheme"] == pb.SCHEME_CTHO   # the UE's pin goes on with the session
        # What the target accepted for this epoch: the streamed block and the tail.
        assert (rep.blocks_received, rep.bytes_received) == (2, len(_blk(2).data) + len(tail.data))
        assert s.remaining_tokens == 20 and s.all_token_ids == tokens
        load = params["pallas"]["load"]
        assert (load["first_block"], load["last_block"], load["prefix_len"]) == (2, 3, 64)
        assert hub.store.count("s") == 2
        # Sync of an unknown attempt is refused.
        bad = await m.on_sync(pb.SyncRequest(session_id="zz", epoch=1, token_ids=[1]))
        assert bad.status == pb.STATUS_UNKNOWN_SESSION
    asyncio.run(run())


def test_source_guards():
    async def run():
        m, hub, eng = _migrator()
        tgt = pb.PeerEndpoint(agent_id="b", address="127.0.0.1:9")
        r = await m.trigger("nope", 1, tgt)
        assert r.status == pb.STATUS_UNKNOWN_SESSION
        s = Session("s", "ue", list(range(40)), SamplingSpec(max_tokens=10))
        s.set_state(SessionState.SERVING)
        s.epoch = 5
        m.sessions.add(s)
        assert (await m.trigger("s", 4, tgt)).status == pb.STATUS_STALE_EPOCH
        assert (await m.cancel("s", 4)).status == pb.STATUS_STALE_EPOCH
        assert (await m.commit("s", 4, tgt)).status == pb.STATUS_STALE_EPOCH
        assert (await m.commit("s", 5, tgt, ship_blocks="some")).status == pb.STATUS_INVALID
        assert (await m.trigger("s", 5, pb.PeerEndpoint())).status == pb.STATUS_INVALID
        r = await m.trigger("s", 6, tgt, proactive=False)
        assert r.status == pb.STATUS_OK and r.split_tokens == 32
        r = await m.cancel("s", 6)
        assert r.status == pb.STATUS_OK and s.state == SessionState.SERVING
        await m.peers.close()
    asyncio.run(run())


def test_failed_commit_leaves_the_source_serving_with_no_token_lost():
    async def run():
        m, hub, eng = _migrator()
        m.cfg.rpc_timeout_s = 1.0
        m.peers.timeout_s = 1.0
        s = Session("s", "ue", list(range(40)), SamplingSpec(max_tokens=50))
        s.set_state(SessionState.SERVING)
        s.append_tokens([5, 6, 7, 8])
        m.sessions.add(s)
        dead = pb.PeerEndpoint(agent_id="x", address="127.0.0.1:9")   # nothing listens
        r = await m.commit("s", 1, dead, split_tokens=0, ship_blocks="none", ue_tokens=2)
        assert r.status == pb.STATUS_ERROR and "prepare failed" in r.message
        assert s.state == SessionState.SERVING and s.frozen_at is None
        assert s.output_token_ids == [5, 6, 7, 8]        # tokens past the commit point kept
        s.append_tokens([9])
        assert s.output_token_ids[-1] == 9
        assert m.held()["outbound"] == 0
        await m.peers.close()
    asyncio.run(run())


def _exporting(request_s: float):
    """A source session whose request runs ``request_s`` more seconds, with block 1 streamed
    (first block 1) and the tail of block 2 not copied out yet."""
    from agent.migration import Outbound
    s = Session("s", "ue", list(range(40)), SamplingSpec(max_tokens=50))
    s._task = asyncio.ensure_future(asyncio.sleep(request_s))
    out = Outbound(session=s, epoch=1, target=pb.PeerEndpoint(agent_id="b", address="x:1"),
                   client=None, split=32, first_block=1, scheme=pb.SCHEME_PALLAS,
                   proactive=True, stream_suffix=True)
    out.full.add(1)
    return s, out


def test_commit_block_wait_ends_with_the_request_not_at_a_poll_timeout():
    """A request that ended here copies out nothing more: the commit must not sleep on."""
    async def run():
        m, hub, eng = _migrator()
        m.cfg.block_wait_s = 10.0
        s, out = _exporting(0.02)           # the tail of block 2 never comes
        t0 = asyncio.get_running_loop().time()
        await asyncio.wait_for(m._wait_blocks(out, need_end=70, ship_tail=True), 5.0)
        took = asyncio.get_running_loop().time() - t0
        assert took < 0.3, took             # the old 0.5 s poll slept past the request's end
        assert out.tail is None             # nothing invented: the target recomputes the tail
    asyncio.run(run())


def test_commit_block_wait_still_takes_a_copy_in_flight_after_the_request_ended():
    async def run():
        m, hub, eng = _migrator()
        s, out = _exporting(0)
        await asyncio.sleep(0.01)
        assert s._task.done()

        def tail_arrives():
            out.tail = (2, 7, 0, b"t", 71)   # block 2, 7 entries >= 70 % 32 = 6
            out.note()
        asyncio.get_running_loop().call_later(0.01, tail_arrives)
        await asyncio.wait_for(m._wait_blocks(out, need_end=70, ship_tail=True), 5.0)
        assert out.tail is not None and out.tail[0] == 2
    asyncio.run(run())


def test_commit_block_wait_returns_as_soon_as_the_tail_is_there():
    async def run():
        m, hub, eng = _migrator()
        m.cfg.block_wait_s = 10.0
        s, out = _exporting(30)
        t0 = asyncio.get_running_loop().time()

        def tail_arrives():
            out.tail = (2, 6, 0, b"t", 70)
            out.note()
        asyncio.get_running_loop().call_later(0.02, tail_arrives)
        await asyncio.wait_for(m._wait_blocks(out, need_end=70, ship_tail=True), 5.0)
        assert asyncio.get_running_loop().time() - t0 < 0.3
        assert not s._task.done()           # the wait never cancels the session's request
        s._task.cancel()
    asyncio.run(run())


class _RecordingTarget:
    """A PeerTransfer handler that admits everything and records the Sync it gets."""

    def __init__(self):
        self.syncs: list = []

    async def on_prepare(self, req):
        return pb.PrepareReply(status=pb.STATUS_OK, model=IDENT, free_kv_bytes=1 << 30)

    def on_block(self, blk, crc_ok=None):
        return "ok"

    async def on_sync(self, req):
        self.syncs.append(req)
        return pb.SyncReply(status=pb.STATUS_OK, reused_tokens=40, blocks_received=1,
                            bytes_received=65536)

    async def on_release(self, req):
        return pb.ReleaseReply(status=pb.STATUS_OK)


def test_commit_sends_the_sync_the_target_needs_and_reports_what_moved():
    """Source side over real gRPC to a recording target: the Sync carries the tokens, the reduced
    max_tokens and the session's pinned scheme; the reply carries the target's counts."""
    from agent.transfer import serve_peer_transfer

    async def run():
        m, hub, eng = _migrator()
        target = _RecordingTarget()
        server, addr = await serve_peer_transfer(target, "127.0.0.1:0")
        s = Session("s", "ue", list(range(40)), SamplingSpec(max_tokens=50))
        s.set_state(SessionState.SERVING)
        s.append_tokens([5, 6, 7])
        m.sessions.add(s)
        try:
            r = await m.commit("s", 1, pb.PeerEndpoint(agent_id="t", address=addr), split_tokens=0,
                               ship_blocks="none", scheme=pb.SCHEME_RECOMPUTATION,
                               session_scheme=pb.SCHEME_CTHO)
        finally:
            await server.stop(0)
            await m.peers.close()
        assert r.status == pb.STATUS_OK, r
        (sync,) = target.syncs
        assert list(sync.token_ids) == list(range(40)) + [5, 6, 7] and sync.prompt_tokens == 40
        assert sync.sampling.max_tokens == 47 and sync.scheme == pb.SCHEME_RECOMPUTATION
        assert sync.session_scheme == pb.SCHEME_CTHO
        assert (r.blocks_moved, r.kv_bytes_moved, r.reused_tokens, r.recomputed_tokens) == (1, 65536, 40, 3)
        assert s.state == SessionState.HANDED_OVER
    asyncio.run(run())
