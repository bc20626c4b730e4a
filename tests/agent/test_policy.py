"""Scheduler-side connector policy with fake requests (no vLLM)."""

from __future__ import annotations

import pytest

from agent.connector.messages import decode
from agent.connector.block_policy import ScheduledReq, SchedulerPolicy

BS = 32


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _policy():
    reports: list[dict] = []
    clock = Clock()
    return SchedulerPolicy(BS, report=reports.append, clock=clock), reports, clock


def _sched(rid, before, n, ids):
    return ScheduledReq(rid, before, n, lambda: list(ids))


def test_source_emits_each_full_block_once_and_the_tail_every_step():
    pol, _, _ = _policy()
    pol.on_new_request("r1", {"pallas": {"sid": "s"}})
    ids = list(range(100, 110))
    # Prefill of 100 tokens before the export: nothing is emitted.
    saves, loads = pol.build([_sched("r1", 0, 100, ids)])
    assert saves == [] and loads == []
    pol.on_command(decode({"t": "export", "sid": "s", "epoch": 1, "start_block": 1}))
    saves, _ = pol.build([_sched("r1", 100, 1, ids)])   # computed 101: blocks 1, 2 + tail 3
    assert [(s[2], s[3], s[4], s[5]) for s in saves] == [(1, 101, 32, False), (2, 102, 32, False),
                                                          (3, 103, 5, True)]
    saves, _ = pol.build([_sched("r1", 101, 1, ids)])   # only the tail again
    assert [(s[2], s[4], s[5]) for s in saves] == [(3, 6, True)]
    # Block 3 completes at computed = 128: full block, no tail (nothing partial).
    saves, _ = pol.build([_sched("r1", 127, 1, ids)])
    assert [(s[2], s[4], s[5]) for s in saves] == [(3, 32, False)]
    # Other requests and non-exported sessions emit nothing.
    pol.on_new_request("r2", None)
    assert pol.build([_sched("r2", 0, 64, ids)]) == ([], [])


def test_preemption_uses_the_current_block_table():
    pol, _, _ = _policy()
    pol.on_new_request("r1", {"pallas": {"sid": "s"}})
    pol.on_command(decode({"t": "export", "sid": "s", "epoch": 1, "start_block": 0}))
    pol.build([_sched("r1", 0, 64, [5, 6, 7])])          # blocks 0, 1 shipped
    # Preempted and resumed: recomputes from 0 in new blocks; only block 2 is new.
    saves, _ = pol.build([_sched("r1", 0, 96, [8, 9, 10])])
    assert [(s[2], s[3]) for s in saves if not s[5]] == [(2, 10)]


def test_stop_and_reset_end_exports():
    pol, _, _ = _policy()
    pol.on_new_request("r1", {"pallas": {"sid": "s"}})
    pol.on_command(decode({"t": "export", "sid": "s", "epoch": 1, "start_block": 0}))
    pol.on_command(decode({"t": "stop", "sid": "s"}))
    assert pol.build([_sched("r1", 0, 64, [1, 2])]) == ([], [])
    pol.on_command(decode({"t": "export", "sid": "s", "epoch": 2, "start_block": 0}))
    pol.on_command(decode({"t": "reset"}))
    assert pol.stats()["exports"] == 0


def _load_params(epoch=1, first=3, last=5, deadline=2000.0, prefix=96):
    return {"pallas": {"sid": "s", "load": {"epoch": epoch, "prefix_len": prefix,
                                            "first_block": first, "last_block": last,
                                            "deadline": deadline}}}


def _avail(pol, idx, fill=32, epoch=1, t="avail"):
    pol.on_command(decode({"t": t, "sid": "s", "epoch": epoch, "idx": idx, "fill": fill}))


def test_target_claims_contiguous_blocks_up_to_n_minus_1():
    pol, reports, _ = _policy()
    for i, f in ((3, 32), (4, 32), (5, 20)):
        _avail(pol, i, f)
    # n = 181 tokens: KV needed for [0, 180); local hit 96 -> claim 84 (blocks 3, 4, 5[:20]).
    n = pol.match("r9", _load_params(), 181, 96)
    assert n == 84
    assert reports[-1].local == 96 and reports[-1].external == 84
    assert not pol.loads_async("r9")   # 3 blocks: loaded before the step's forward
    pol.after_alloc("r9", 84, list(range(50, 56)))
    saves, loads = pol.build([])
    assert loads == [("r9", "s", 1, 3, 53, 32, True), ("r9", "s", 1, 4, 54, 32, True),
                     ("r9", "s", 1, 5, 55, 20, True)]
    assert pol.build([]) == ([], [])     # sent once
    # A tail with more entries than needed is fine; fewer means waiting for a fuller one.
    assert pol.match("r10", _load_params(), 180, 96) == 83
    assert pol.match("r11", _load_params(), 182, 96) is None
    pol2, _, _ = _policy()
    for i, f in ((3, 32), (4, 32), (5, 19)):
        _avail(pol2, i, f)
    assert pol2.match("r", _load_params(deadline=0), 181, 96) == 64


def test_a_claim_over_the_sync_bound_loads_asynchronously():
    reports: list = []
    pol = SchedulerPolicy(BS, report=reports.append, clock=Clock(), sync_max_blocks=2)
    for i, f in ((3, 32), (4, 32), (5, 20)):
        _avail(pol, i, f)
    assert pol.match("r", _load_params(), 181, 96) == 84 and pol.loads_async("r")
    pol.after_alloc("r", 84, list(range(50, 56)))
    assert [op.sync for op in pol.build([])[1]] == [False, False, False]
    assert pol.match("r2", _load_params(), 150, 96) == 53 and not pol.loads_async("r2")
    pol.after_alloc("r2", 53, list(range(60, 66)))
    assert [op.sync for op in pol.build([])[1]] == [True, True]
    assert not pol.loads_async("nobody")
    never = SchedulerPolicy(BS, clock=Clock(), sync_max_blocks=0)
    _avail(never, 3)
    assert never.match("r", _load_params(), 129, 96) == 32 and never.loads_async("r")
    with pytest.raises(ValueError):
        SchedulerPolicy(BS, sync_max_blocks=-1)


def test_target_waits_for_expected_blocks_until_the_deadline():
    pol, reports, clock = _policy()
    _avail(pol, 3)
    assert pol.match("r", _load_params(deadline=1010.0), 181, 96) is None
    assert not reports
    clock.t = 1011.0   # past the deadline: claim what is there, recompute the rest
    assert pol.match("r", _load_params(deadline=1010.0), 181, 96) == 32
    assert reports[-1].waited_s == pytest.approx(11.0)


def test_bad_block_stops_waiting_and_is_never_claimed():
    pol, reports, _ = _policy()
    _avail(pol, 3)
    _avail(pol, 4, t="bad")
    _avail(pol, 5)
    assert pol.match("r", _load_params(), 181, 96) == 32
    assert reports[-1].bad == (4,)
    # A later good copy of block 4 (newer snapshot) replaces the bad mark.
    _avail(pol, 4)
    assert pol.match("r", _load_params(), 181, 96) == 84


def test_evicted_prefix_falls_back_to_recompute():
    pol, reports, _ = _policy()
    for i in (3, 4, 5):
        _avail(pol, i)
    assert pol.match("r", _load_params(), 181, 0) == 0      # local hit 0 < prefix 96
    assert reports[-1].local == 0 and reports[-1].external == 0
    # A longer local hit than the prefix: load only what is past it.
    assert pol.match("r", _load_params(), 181, 128) == 52


def test_old_epoch_blocks_are_dropped():
    pol, _, _ = _policy()
    _avail(pol, 3, epoch=2)
    _avail(pol, 4, epoch=1)          # older epoch: dropped
    assert pol.match("r", _load_params(epoch=2, deadline=0), 181, 96) == 32
    assert pol.match("r", _load_params(epoch=1, deadline=0), 181, 96) == 0
    pol.on_command(decode({"t": "drop", "sid": "s"}))
    assert pol.stats()["avail_blocks"] == 0


def test_requests_without_pallas_params_are_ignored():
    pol, reports, _ = _policy()
    assert pol.match("r", None, 100, 0) == 0
    assert pol.match("r", {"pallas": {"sid": "s"}}, 100, 0) == 0
    assert reports == []
    with pytest.raises(ValueError):
        SchedulerPolicy(0)


def test_a_preempted_request_claims_at_once_instead_of_waiting_for_dropped_blocks():
    """A resumed request preempted after its first claim (vLLM recomputes it from its prefix
    hit) is asked again; the agent dropped its blocks after the first token, so waiting for
    them again would stall it until the load deadline. It claims what is held, at once."""
    pol, reports, clock = _policy()
    for i, f in ((3, 32), (4, 32), (5, 20)):
        _avail(pol, i, f)
    assert pol.match("r", _load_params(deadline=2000.0), 181, 96) == 84
    pol.on_command(decode({"t": "drop", "sid": "s"}))
    assert pol.match("r", _load_params(deadline=2000.0), 181, 64) == 0   # not None: no wait
    assert (reports[-1].local, reports[-1].external) == (64, 0)
    _avail(pol, 2)                                                       # what is held is used
    assert pol.match("r", _load_params(deadline=2000.0), 181, 64) == 32
    # Before its first claim a request still waits for blocks in flight.
    pol.finished("r")
    assert pol.match("r2", _load_params(deadline=2000.0), 181, 96) is None
