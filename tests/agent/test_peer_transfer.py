"""PeerTransfer over real loopback gRPC with a fake target handler (no vLLM)."""

from __future__ import annotations

import asyncio
import time

from pallas_proto import pallas_pb2 as pb

from agent.ipc import BlockStore, block_crc
from agent.transfer import PeerClient, serve_peer_transfer


class Handler:
    def __init__(self):
        self.store = BlockStore()
        self.epoch = 1

    async def on_prepare(self, req):
        return pb.PrepareReply(status=pb.STATUS_OK)

    def on_block(self, blk, crc_ok=None):
        if blk.epoch != self.epoch:
            return "stale"
        return self.store.put(blk.session_id, blk.epoch, blk.block_index, blk.fill,
                              blk.checksum, blk.data, crc_ok)

    async def on_sync(self, req):
        raise RuntimeError("boom")          # becomes STATUS_ERROR, the service runs on

    async def on_release(self, req):
        return pb.ReleaseReply(status=pb.STATUS_OK, blocks_released=self.store.drop(req.session_id))


async def _no_task_left(within_s: float = 5.0) -> None:
    """Assert that no task but the caller's is left within ``within_s``."""
    for _ in range(int(within_s / 0.05)):
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if not left:
            return
        await asyncio.sleep(0.05)
    assert not left, left


def _blk(i, epoch=1, size=4096, corrupt=False):
    data = bytes([i % 251]) * size
    return pb.KVBlock(session_id="s", epoch=epoch, block_index=i, fill=32,
                      checksum=block_crc(data) ^ (1 if corrupt else 0), data=data)


def test_stream_checksums_epochs_errors_and_release():
    async def run():
        h = Handler()
        server, addr = await serve_peer_transfer(h, "127.0.0.1:0")
        client = PeerClient(addr)
        try:
            st = client.open_stream("s", 1)
            for i in range(20):
                st.send(_blk(i, corrupt=(i == 7)))
            st.send(_blk(20, epoch=0))      # an old epoch: dropped
            ack = await st.finish(10)
            assert (ack.blocks_received, ack.blocks_rejected) == (19, 2)
            assert ack.bytes_received == 19 * 4096
            assert h.store.bad("s") == {7} and h.store.count("s") == 19
            assert st.sent_indices == list(range(21)) and client.bytes_sent == 21 * 4096
            assert not st.send(_blk(21))    # closed
            rep = await client.sync(pb.SyncRequest(session_id="s", epoch=1))
            assert rep.status == pb.STATUS_ERROR and "boom" in rep.message
            rel = await client.release(pb.ReleaseRequest(session_id="s", epoch=1))
            assert rel.blocks_released == 19 and h.store.num_bytes == 0
        finally:
            await client.close()
            await server.stop(0)
    asyncio.run(run())


def test_rate_limit_and_dead_peer():
    async def run():
        h = Handler()
        server, addr = await serve_peer_transfer(h, "127.0.0.1:0")
        # 8 Mbit/s = 1 MB/s: 40 blocks of 50 kB (2 MB) take about 2 s minus one bucket (64 kB).
        client = PeerClient(addr, link_rate_mbps=8)
        try:
            st = client.open_stream("s", 1)
            t0 = time.monotonic()
            for i in range(40):
                st.send(_blk(i, size=50_000))
            ack = await st.finish(30)
            dt = time.monotonic() - t0
            assert ack.blocks_received == 40
            assert 1.7 < dt < 4.0, dt
        finally:
            await client.close()
            await server.stop(0)
        # A peer that dies mid-stream: the stream fails, send() refuses, nothing hangs.
        server, addr = await serve_peer_transfer(h, "127.0.0.1:0")
        client = PeerClient(addr, link_rate_mbps=8)
        st = client.open_stream("s", 1)
        for i in range(100):
            st.send(_blk(i, size=50_000))
        await asyncio.sleep(0.3)
        await server.stop(0)
        await asyncio.wait_for(st.task, 10)
        assert st.error is not None and st.ack is None
        assert not st.send(_blk(1))
        await client.close()
        # Nothing of the failed stream is left running (gRPC's request-draining task included).
        await _no_task_left()
    asyncio.run(run())


def test_stream_to_a_peer_that_went_away_leaves_no_task_behind():
    """Idle stream, peer stops: the call fails and gRPC's task draining the request generator
    ends with it (it used to wait on the empty queue until the event loop closed)."""
    async def run():
        server, addr = await serve_peer_transfer(Handler(), "127.0.0.1:0")
        client = PeerClient(addr)
        st = client.open_stream("s", 1)
        for i in range(5):
            st.send(_blk(i))
        await asyncio.sleep(0.2)
        await server.stop(0)
        await asyncio.wait_for(st.task, 10)
        assert st.error is not None
        await client.close()
        await _no_task_left()
    asyncio.run(run())
