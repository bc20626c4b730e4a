"""The zmq channel between the agent (BlockHub) and fake connector sides (no vLLM)."""

from __future__ import annotations

import asyncio
import time

import torch
import zmq
import zmq.asyncio

from agent.ipc import BlockHub, SchedulerLink, WorkerLink, block_crc, encode


async def _until(pred, timeout=10.0):
    t_end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < t_end, "condition not reached"
        await asyncio.sleep(0.01)


def test_hub_and_links_round_trip():
    async def run():
        hub = BlockHub("tcp://127.0.0.1:0")
        await hub.start()
        commands: list[dict] = []
        blocks: list = []
        hub.on_block = blocks.append
        claims: list[dict] = []
        hub.on_claim = claims.append
        sched = SchedulerLink(hub.address, lambda: {"block_size": 32, "free_blocks": 7,
                                                    "num_blocks": 9}, commands.append)
        worker = WorkerLink(hub.address, {"block_bytes": 64, "num_layers": 2})
        try:
            await hub.wait_ready(10)
            assert hub.kv_stats()["free_blocks"] == 7
            # A (re)connected scheduler side is told to reset first.
            await _until(lambda: any(c["t"] == "reset" for c in commands))
            hub.export("s", 3, 2)
            await _until(lambda: any(c["t"] == "export" for c in commands))
            assert [c for c in commands if c["t"] == "export"][0]["start_block"] == 2
            # Worker -> agent: a slab arrives with its CRC-32 computed by the sender thread.
            slab = torch.arange(16, dtype=torch.float32)
            worker.send_block({"t": "block", "sid": "s", "epoch": 3, "idx": 2, "fill": 32,
                               "tail": False, "computed": 96}, slab)
            await _until(lambda: blocks)
            b = blocks[0]
            assert b.data == slab.numpy().tobytes() and b.crc == block_crc(b.data)
            assert (b.sid, b.epoch, b.idx, b.tail, b.computed) == ("s", 3, 2, False, 96)
            # Agent store -> worker fetch (synchronous, from a thread like the engine's).
            good = b"\x05" * 64
            assert hub.put_block("s", 3, 4, 32, block_crc(good), good) == "ok"
            await _until(lambda: any(c["t"] == "avail" and c["idx"] == 4 for c in commands))
            assert hub.put_block("s", 3, 5, 32, block_crc(good) ^ 7, good) == "bad"
            await _until(lambda: any(c["t"] == "bad" and c["idx"] == 5 for c in commands))
            got = await asyncio.to_thread(worker.fetch, [["s", 3, 4, 32], ["s", 3, 5, 32],
                                                         ["s", 3, 4, 64]])
            assert got[0] == (32, block_crc(good), good) and got[1] is None and got[2] is None
            sched.report({"t": "claim", "sid": "s", "epoch": 3, "local": 96, "external": 5})
            await _until(lambda: claims)
            assert hub.drop("s") == 1 and hub.store.num_blocks == 0
            await _until(lambda: any(c["t"] == "drop" for c in commands))
            # A malformed message is dropped; the hub runs on.
            ctx = zmq.asyncio.Context()
            bad = ctx.socket(zmq.DEALER)
            bad.connect(hub.address)
            await bad.send_multipart([b"not json"])
            await bad.send_multipart(encode({"no": "type"}))
            await bad.send_multipart(encode({"t": "mystery"}))
            bad.close(0)
            ctx.term()
            worker.send_block({"t": "block", "sid": "s", "epoch": 3, "idx": 3, "fill": 32,
                               "tail": False, "computed": 128}, slab)
            await _until(lambda: len(blocks) == 2)
        finally:
            sched.close()
            await asyncio.to_thread(worker.close)
            await hub.close()
    asyncio.run(run())


def test_fetch_times_out_without_an_agent():
    worker = WorkerLink("tcp://127.0.0.1:9", {})  # nothing listens there
    try:
        t0 = time.monotonic()
        assert worker.fetch([["s", 1, 0, 32]], timeout_s=0.2) == [None]
        assert time.monotonic() - t0 < 2.0
    finally:
        worker.close()
