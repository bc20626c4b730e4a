"""Whole-block slab copies with fake KV caches of two layouts (no vLLM)."""

from __future__ import annotations

import threading

import pytest
import torch

from agent.connector.mover import (LOAD_DEADLINE_S, SYNC_LOAD_DEADLINE_S, BlockMover,
                                   WorkerSide, find_block_dim)
from agent.connector.block_policy import LoadOp
from agent.connector.messages import Loaded
from agent.ipc import block_crc


def _caches(shape, n_layers=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn((n_layers, *shape), generator=g)
    return {f"layer.{i}": base[i] for i in range(n_layers)}


@pytest.mark.parametrize("shape,num_blocks,dim", [
    ((10, 2, 32, 128), 10, 0),        # vLLM CPU: [num_blocks, H, N, 2*head_dim]
    ((2, 10, 32, 2, 64), 10, 1),      # FlashAttention-like: [2, num_blocks, bs, H, D]
])
def test_copy_out_then_in_moves_exactly_one_block(shape, num_blocks, dim):
    src, dst = _caches(shape, seed=1), _caches(shape, seed=2)
    ms, md = BlockMover(src, num_blocks), BlockMover(dst, num_blocks)
    assert ms.block_dim == dim
    before = {k: v.clone() for k, v in dst.items()}
    slab = ms.copy_out(7)
    assert slab.shape[0] == 3 and slab.numel() * 4 == ms.block_bytes
    md.copy_in([4, 2], [slab.numpy().tobytes(), ms.copy_out(3).numpy().tobytes()])
    for k in src:
        assert torch.equal(dst[k].select(dim, 4), src[k].select(dim, 7))
        assert torch.equal(dst[k].select(dim, 2), src[k].select(dim, 3))
        for j in range(num_blocks):
            if j not in (2, 4):
                assert torch.equal(dst[k].select(dim, j), before[k].select(dim, j))
    with pytest.raises(ValueError):
        md.copy_in([4, 5], [slab.numpy().tobytes(), b"\x00" * 12])


def test_find_block_dim_and_mixed_layers_are_rejected():
    assert find_block_dim((2, 5, 32), 5) == 1
    with pytest.raises(ValueError):
        find_block_dim((2, 4, 32), 5)
    with pytest.raises(ValueError):
        BlockMover({"a": torch.zeros(5, 2, 4), "b": torch.zeros(5, 2, 8)}, 5)
    with pytest.raises(ValueError):
        BlockMover({}, 5)


class FakeLink:
    """The worker's link to the agent: ``fetch`` answers ``answers`` once ``release`` is set
    (or raises them if they are an exception), in whichever thread calls it."""

    def __init__(self, answers):
        self.answers = answers
        self.release = threading.Event()
        self.release.set()
        self.fetches = []
        self.reports = []
        self.sent = []

    def fetch(self, blocks, timeout_s):
        self.fetches.append((list(blocks), timeout_s, threading.current_thread().name))
        self.release.wait()
        if isinstance(self.answers, Exception):
            raise self.answers
        return self.answers

    def report(self, hdr):
        self.reports.append(hdr)

    def send_block(self, hdr, slab):
        self.sent.append((hdr, slab))

    def close(self):
        pass


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


LOADS = [LoadOp("r", "s", 1, 3, 2, 32), LoadOp("r", "s", 1, 4, 3, 32),
         LoadOp("r", "s", 1, 5, 4, 32), LoadOp("r", "s", 1, 6, 5, 20)]


def _worker(answers):
    caches = _caches((6, 2, 32, 8))
    ws = WorkerSide("tcp://127.0.0.1:9", clock=Clock())
    ws.mover = BlockMover(caches, 6)
    good = ws.mover.copy_out(1).numpy().tobytes()
    ws.link = FakeLink(answers(good) if callable(answers) else answers)
    return ws, caches, {k: v.clone() for k, v in caches.items()}, good


def test_the_load_runs_off_the_engine_thread_and_never_loads_a_block_that_fails_its_check():
    ws, caches, before, good = _worker(lambda good: [
        (32, block_crc(good), good), (32, block_crc(good), bytes(len(good))), None,
        (10, block_crc(good), good)])
    ws.link.release.clear()
    ws.load(LOADS)                     # returns with the fetch still waiting for its answer
    assert ws.take_finished() == set() and ws.take_errors() == set()
    ws.link.release.set()
    ws.close()                         # joins the loader thread
    (asked, timeout_s, thread), = ws.link.fetches
    assert [(i.idx, i.need) for i in asked] == [(3, 32), (4, 32), (5, 32), (6, 20)]
    assert thread == "pallas-loader" and timeout_s == LOAD_DEADLINE_S
    for k in caches:
        assert torch.equal(caches[k][2], before[k][1])              # loaded
        for j in (3, 4, 5):
            assert torch.equal(caches[k][j], before[k][j])          # untouched
    assert ws.take_finished() == {"r"} and ws.take_finished() == set()   # reported once
    assert ws.take_errors() == {3, 4, 5} and ws.take_errors() == set()
    assert ws.link.reports == [Loaded("s", 1, (3,), (4, 5, 6))]
    ws.save([("s", 1, 0, 1, 32, False, 32)])
    hdr, slab = ws.link.sent[0]
    assert hdr.idx == 0 and slab.numpy().tobytes() == good


def test_a_load_not_in_by_its_deadline_is_reported_failed_and_never_written_after():
    ws, caches, before, good = _worker(lambda good: [(32, block_crc(good), good)] * 4)
    ws.link.release.clear()
    ws.load(LOADS)
    ws._clock.t += LOAD_DEADLINE_S - 0.5
    assert ws.take_finished() == set()
    ws._clock.t += 0.5                 # the deadline: vLLM is told, and recomputes every block
    assert ws.take_finished() == {"r"} and ws.take_errors() == {2, 3, 4, 5}
    ws.link.release.set()              # the answer comes late: vLLM may own the blocks now
    ws.close()
    for k in caches:
        assert torch.equal(caches[k], before[k])
    assert ws.take_finished() == set() and ws.take_errors() == set()
    assert ws.link.reports == [Loaded("s", 1, (), (3, 4, 5, 6))]


def test_a_fetch_that_raises_still_ends_the_load_with_every_block_failed():
    ws, caches, before, _ = _worker(RuntimeError("agent gone"))
    ws.load(LOADS)
    ws.close()
    assert ws.take_finished() == {"r"} and ws.take_errors() == {2, 3, 4, 5}
    for k in caches:
        assert torch.equal(caches[k], before[k])


def test_a_synchronous_load_is_in_before_load_returns_and_never_reported_as_finished():
    ws, caches, before, good = _worker(lambda good: [
        (32, block_crc(good), good), None, (32, block_crc(good), bytes(len(good)))])
    sync = [op._replace(sync=True) for op in LOADS[:3]]
    ws.load(sync)                      # no thread involved: done when load returns
    (asked, timeout_s, thread), = ws.link.fetches
    assert thread == threading.current_thread().name
    assert timeout_s == pytest.approx(SYNC_LOAD_DEADLINE_S)
    for k in caches:
        assert torch.equal(caches[k][2], before[k][1])              # loaded
        assert torch.equal(caches[k][3], before[k][3])              # missing: untouched
        assert torch.equal(caches[k][4], before[k][4])              # bad CRC: untouched
    assert ws.take_errors() == {3, 4}      # failed blocks reported in this same step
    assert ws.take_finished() == set()     # vLLM scheduled it already: nothing to report
    assert ws.link.reports == [Loaded("s", 1, (3,), (4, 5))]
    ws.close()


def test_a_synchronous_fetch_that_raises_fails_its_blocks_and_leaves_the_async_ones_queued():
    ws, caches, before, _ = _worker(RuntimeError("agent gone"))
    ws.load([LOADS[0]._replace(req_id="a", sync=True), LOADS[1]._replace(req_id="b")])
    assert ws.take_errors() == {2}     # the synchronous one, at once
    ws.close()                         # the asynchronous one ends in the loader thread
    assert ws.take_finished() == {"b"} and ws.take_errors() == {3}
    for k in caches:
        assert torch.equal(caches[k], before[k])
