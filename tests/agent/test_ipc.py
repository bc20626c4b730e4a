"""The zmq channel between the agent (BlockHub) and fake connector sides (no vLLM)."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
import zmq
import zmq.asyncio

from agent.connector import messages as m
from agent.connector.messages import (BlockHeader, Claim, Export, FetchItem, MessageError,
                                      SchedHello, WorkerHello, decode, encode_header)
from agent.connector.link import SchedulerLink, WorkerLink, block_crc
from agent.ipc import BlockHub


async def _until(pred, timeout=10.0):
    t_end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < t_end, "condition not reached"
        await asyncio.sleep(0.01)


def test_hub_and_links_round_trip():
    async def run():
        hub = BlockHub("tcp://127.0.0.1:0")
        await hub.start()
        commands: list = []
        blocks: list = []
        hub.on_block = blocks.append
        claims: list = []
        hub.on_claim = claims.append
        sched = SchedulerLink(hub.address, lambda: SchedHello(block_size=32, free_blocks=7,
                                                              num_blocks=9), commands.append)
        worker = WorkerLink(hub.address, WorkerHello(block_bytes=64, num_layers=2,
                                                     dtype="float32"))
        try:
            await hub.wait_ready(10)
            assert hub.kv_stats()["free_blocks"] == 7 and hub.kv_blocks() == (7, 9)
            assert hub.worker_info.block_bytes == 64 and hub.sched_info.pid > 0
            # A (re)connected scheduler side is told to reset first.
            await _until(lambda: any(isinstance(c, m.Reset) for c in commands))
            hub.export("s", 3, 2)
            await _until(lambda: any(isinstance(c, Export) for c in commands))
            assert [c for c in commands if isinstance(c, Export)][0] == Export("s", 3, 2)
            # Worker -> agent: a slab arrives with its CRC-32 computed by the sender thread.
            slab = torch.arange(16, dtype=torch.float32)
            worker.send_block(BlockHeader("s", 3, 2, 32, 0, False, 96), slab)
            await _until(lambda: blocks)
            b = blocks[0]
            assert b.data == slab.numpy().tobytes() and b.crc == block_crc(b.data)
            assert (b.sid, b.epoch, b.idx, b.tail, b.computed) == ("s", 3, 2, False, 96)
            # Agent store -> worker fetch (synchronous, from a thread like the engine's).
            good = b"\x05" * 64
            assert hub.put_block("s", 3, 4, 32, block_crc(good), good) == "ok"
            await _until(lambda: m.Avail("s", 3, 4, 32) in commands)
            assert hub.put_block("s", 3, 5, 32, block_crc(good) ^ 7, good) == "bad"
            await _until(lambda: m.Bad("s", 3, 5) in commands)
            got = await asyncio.to_thread(worker.fetch, [FetchItem("s", 3, 4, 32),
                                                         FetchItem("s", 3, 5, 32),
                                                         FetchItem("s", 3, 4, 64)])
            assert got[0] == (32, block_crc(good), good) and got[1] is None and got[2] is None
            sched.report(Claim("s", 3, 96, 5, 102, 0.5, (4,)))
            await _until(lambda: claims)
            assert claims == [Claim("s", 3, 96, 5, 102, 0.5, (4,))]
            assert hub.drop("s") == 1 and hub.store.num_blocks == 0
            await _until(lambda: m.Drop("s") in commands)
            # A malformed message is dropped; the hub runs on.
            ctx = zmq.asyncio.Context()
            bad = ctx.socket(zmq.DEALER)
            bad.connect(hub.address)
            await bad.send_multipart([b"not json", b""])
            await bad.send_multipart([b'{"no": "type"}', b""])
            await bad.send_multipart([b'{"t": "mystery"}', b""])
            # well-formed JSON, wrong field types: dropped before any callback sees them
            await bad.send_multipart([b'{"t": "claim", "sid": "s", "epoch": "3", "local": 1,'
                                      b' "external": 1, "num_tokens": 3}', b""])
            await bad.send_multipart([b'{"t": "block", "sid": "s", "epoch": 3, "idx": -1,'
                                      b' "fill": 32, "crc": 0}', b"x"])
            await bad.send_multipart([encode_header(m.Export("s", 1, 0)), b""])  # not for it
            await _until(lambda: hub.dropped == 6)
            bad.close(0)
            ctx.term()
            assert len(claims) == 1 and len(blocks) == 1
            worker.send_block(BlockHeader("s", 3, 3, 32, 0, False, 128), slab)
            await _until(lambda: len(blocks) == 2)
        finally:
            sched.close()
            await asyncio.to_thread(worker.close)
            await hub.close()
    asyncio.run(run())


def test_fetch_times_out_without_an_agent():
    worker = WorkerLink("tcp://127.0.0.1:9", WorkerHello(64, 1, "float32"))  # nothing there
    try:
        t0 = time.monotonic()
        assert worker.fetch([FetchItem("s", 1, 0, 32)], timeout_s=0.2) == [None]
        assert time.monotonic() - t0 < 2.0
    finally:
        worker.close()


def test_every_message_round_trips_through_its_header():
    msgs = [SchedHello(32, 120, 100, 1, 2, 3, 4, 5, 6),
            WorkerHello(65536, 2, "float32", (2, 32, 8), 0, "cpu/CPU_ATTN", "m", "bfloat16",
                        "auto", 32, 1, 7),
            BlockHeader("s", 1, 2, 32, 99, True, 64), Claim("s", 1, 96, 5, 102, 0.25, (3, 4)),
            m.Loaded("s", 1, (3,), (4,)),
            m.Fetch(9, (FetchItem("s", 1, 3, 32), FetchItem("t", 2, 0, 1))),
            m.Fetched(9, (m.FetchedItem(32, 7), None)),
            Export("s", 1, 3, False, True), m.Stop("s"), m.Avail("s", 1, 3, 20),
            m.Bad("s", 1, 3), m.Drop("s"), m.Reset()]
    for msg in msgs:
        assert decode(encode_header(msg)) == msg


@pytest.mark.parametrize("raw, says", [
    (b"\xff", "not UTF-8 JSON"),
    (b"[1, 2]", "JSON list, not an object"),
    (b'{"sid": "s"}', "unknown message type None"),
    (b'{"t": "hello", "role": "gpu"}', "hello with unknown role 'gpu'"),
    (b'{"t": "hello", "role": ["sched"]}', "hello with unknown role ['sched']"),
    (b'{"t": "stop"}', "stop: missing field 'sid'"),
    (b'{"t": "stop", "sid": 5}', "stop.sid: expected a string"),
    (b'{"t": "avail", "sid": "s", "epoch": 1, "idx": 2, "fill": true}', "avail.fill: expected an integer"),
    (b'{"t": "avail", "sid": "s", "epoch": 1, "idx": -2, "fill": 3}', "avail.idx: expected an integer >= 0"),
    (b'{"t": "export", "sid": "s", "epoch": 1, "start_block": 0, "tail": "yes"}', "export.tail: expected a boolean"),
    (b'{"t": "claim", "sid": "s", "epoch": 1, "local": 0, "external": 0, "num_tokens": 1,'
     b' "waited_s": NaN}', "claim.waited_s: expected a finite number"),
    (b'{"t": "claim", "sid": "s", "epoch": 1, "local": 0, "external": 0, "num_tokens": 1,'
     b' "bad": 4}', "claim.bad: expected a list"),
    (b'{"t": "fetch", "rid": 1, "blocks": [["s", 1, 2]]}', "fetch.blocks[0]: expected [sid, epoch, idx, need]"),
    (b'{"t": "fetched", "rid": 1, "blocks": [[32, "x"]]}', "fetched.blocks[0].crc: expected an integer"),
])
def test_a_malformed_header_is_one_clear_error(raw, says):
    with pytest.raises(MessageError) as e:
        decode(raw)
    assert says in str(e.value)


def test_a_malformed_command_never_reaches_the_policy():
    """The scheduler side's link drops a command it cannot decode, or a message that is not a
    command, and keeps serving the next one."""
    async def run():
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        got: list = []
        link = SchedulerLink(f"tcp://127.0.0.1:{port}", lambda: SchedHello(32), got.append)
        try:
            ident = (await router.recv_multipart())[0]   # its first hello
            for frame in (b'{"t": "export", "sid": "s"}', b"{", encode_header(Claim("s", 1, 0, 0, 1)),
                          encode_header(m.Stop("s"))):
                await router.send_multipart([ident, frame])
            await _until(lambda: got)
            await asyncio.sleep(0.1)
            assert got == [m.Stop("s")]
        finally:
            link.close()
            router.close(0)
            ctx.term()
    asyncio.run(run())
