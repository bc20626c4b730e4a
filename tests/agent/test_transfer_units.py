"""Token bucket, checksums, block store epochs, identity check, peer pool, session tokens (no vLLM)."""

from __future__ import annotations

import asyncio
import zlib

import grpc
import pytest
from pallas_proto import pallas_pb2

from agent.ipc import BlockStore, block_crc
from agent.session import SamplingSpec, Session, SessionState
from agent.transfer import PeerPool, TokenBucket, identity_mismatch, mbit_to_bytes_per_s


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket_long_run_rate():
    clock = Clock()
    rate = mbit_to_bytes_per_s(300)           # 37.5 MB/s
    assert rate == 37.5e6
    tb = TokenBucket(rate, clock=clock)
    block = 786_432                           # one 152M-model block, bigger than the bucket
    sent = 0
    for _ in range(200):
        wait = tb.reserve(block)
        clock.t += wait
        sent += block
    # 200 blocks at 37.5 MB/s take sent/rate seconds, give or take one bucket.
    assert clock.t == pytest.approx(sent / rate, abs=tb.burst / rate + 1e-9)
    assert TokenBucket(None).reserve(10**9) == 0.0


def test_token_bucket_burst_then_rate():
    clock = Clock()
    tb = TokenBucket(1000.0, burst=500.0, clock=clock)
    assert tb.reserve(500) == 0.0             # the bucket starts full
    assert tb.reserve(100) == pytest.approx(0.1)
    clock.t = 10.0
    assert tb.reserve(400) == 0.0             # refilled (capped at the burst)


def test_block_checksum_is_crc32c():
    # CRC-32C's check value (RFC 3720 §B.4; "123456789" -> 0xE3069283), not zlib's CRC-32.
    assert block_crc(b"123456789") == 0xE3069283 != zlib.crc32(b"123456789")
    data = bytes(range(256)) * 100
    assert block_crc(memoryview(data)) == block_crc(data)


def test_block_store_checksum_epochs_and_accounting():
    st = BlockStore()
    d = b"\x01" * 64
    assert st.put("s", 1, 3, 32, block_crc(d), d) == "ok"
    assert st.put("s", 1, 4, 32, block_crc(d) ^ 1, d) == "bad"
    assert st.bad("s") == {4} and st.get("s", 1, 4) is None
    assert (st.num_blocks, st.num_bytes) == (1, 64)
    # A fuller tail snapshot replaces a partial one; a smaller one does not.
    assert st.put("s", 1, 5, 10, block_crc(d), d) == "ok"
    assert st.put("s", 1, 5, 20, block_crc(d), d) == "ok" and st.get("s", 1, 5).fill == 20
    assert st.put("s", 1, 5, 15, block_crc(d), d) == "ok" and st.get("s", 1, 5).fill == 20
    assert st.num_blocks == 2
    # A newer epoch replaces everything; an older one is dropped.
    assert st.put("s", 2, 3, 32, block_crc(d), d) == "ok"
    assert st.num_blocks == 1 and st.get("s", 1, 3) is None
    assert st.put("s", 1, 6, 32, block_crc(d), d) == "stale"
    assert st.drop("s") == 1 and (st.num_blocks, st.num_bytes) == (0, 0)
    # Negative control (a test double): unverified storage accepts corrupted data.
    from tests.faults import UncheckedStore
    assert UncheckedStore().put("t", 1, 0, 32, 12345, d) == "ok"


def _ident(**kw):
    base = dict(model="tiny", weights_digest="ab", dtype="float32", kv_cache_dtype="auto",
                block_size=32, backend="cpu/CPU_ATTN/vec", kv_bytes_per_token=2048,
                num_layers=2, block_bytes=65536)
    base.update(kw)
    return pallas_pb2.ModelIdentity(**base)


def test_identity_mismatch_names_the_field():
    assert identity_mismatch(_ident(), _ident()) is None
    assert identity_mismatch(_ident(), _ident(weights_digest="cd")).startswith("weights_digest")
    assert identity_mismatch(_ident(), _ident(backend="cpu/CPU_ATTN/amx")).startswith("backend")
    assert identity_mismatch(_ident(), _ident(block_size=64)).startswith("block_size")


def test_the_peer_pool_keeps_one_client_per_address_and_id():
    """An address named with another agent id gets its own client and channel (so a pinned TLS
    channel is never reused for another identity); telemetry names each by id, else address."""
    async def run():
        opened = []

        def factory(address, options):
            opened.append(address)
            return grpc.aio.insecure_channel(address, options=options)

        pool = PeerPool(channel_factory=factory)
        ep = pallas_pb2.PeerEndpoint
        a = pool.get(ep(agent_id="b", address="127.0.0.1:9"))
        assert pool.get(ep(agent_id="b", address="127.0.0.1:9")) is a
        other = pool.get(ep(agent_id="c", address="127.0.0.1:9"))
        anon = pool.get(ep(address="127.0.0.1:9"))
        assert len({id(a), id(other), id(anon)}) == 3 and len(opened) == 3
        assert [t.agent_id for t in pool.telemetry()] == ["b", "c", "127.0.0.1:9"]
        await pool.close()
    asyncio.run(run())


def test_session_wait_freeze_unfreeze():
    async def run():
        s = Session("s", "ue", [1, 2, 3], SamplingSpec(max_tokens=5))
        s.set_state(SessionState.SERVING)
        waiter = asyncio.create_task(s.wait_tokens(0, timeout=5))
        await asyncio.sleep(0)
        s.append_tokens([7, 8])
        assert await waiter == [7, 8]
        assert s.all_token_ids == [1, 2, 3, 7, 8] and s.remaining_tokens == 3
        assert s.freeze() == 2
        s.append_tokens([9])                      # held back during the commit
        assert s.output_token_ids == [7, 8] and s.held_token_ids == [9]
        assert await s.wait_tokens(2, timeout=0.05) == []
        s.unfreeze()                              # handover failed: nothing lost
        assert s.output_token_ids == [7, 8, 9]
        got = []
        s.set_state(SessionState.FINISHED)
        async for i, tok, _ in s.stream(1):
            got.append((i, tok))
        assert got == [(1, 8), (2, 9)]
        with pytest.raises(ValueError):
            await s.wait_tokens(-1)
    asyncio.run(run())


def test_an_isolated_block_pays_its_serialization_time():
    """A block after an idle link is released when the link would have carried it (issue 13:
    the emulated 2.34 Mbit/s link sent isolated 64 KiB blocks at once, so the measured goodput
    read as loopback speed)."""
    clock = Clock()
    rate = mbit_to_bytes_per_s(2.34)                  # 292.5 kB/s
    tb = TokenBucket(rate, clock=clock)
    clock.t = 100.0                                   # idle: the bucket is full (50 ms of rate)
    assert tb.reserve(65536) == pytest.approx((65536 - 0.05 * rate) / rate)
