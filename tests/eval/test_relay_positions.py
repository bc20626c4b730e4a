"""The live relay's hop cost by position on the relay path (pallas_eval/relay.py, issue 26 item 1):
which position each proxy of a stream gets, and that draws at positions 1..k are the
compounding law over k hops (timing.PAPER_HOP_COST). No timed assertions: virtual clocks only."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from pallas_common import timing as T
from pallas_eval.relay import REPLAY_HOP_COST, ProxyPool, RelayPaths, delayed, hop_draw


def test_the_replay_draws_the_compounding_law():
    assert REPLAY_HOP_COST is T.PAPER_HOP_COST and REPLAY_HOP_COST.growth > 1


def test_a_chain_of_relays_numbers_its_proxies_from_the_ue():
    # A holds s; the UE at C: C asks B's proxy (relay=C), B asks A's proxy (relay=B).
    paths = RelayPaths()
    at_b = paths.open("B", "s", "C")
    at_a = paths.open("A", "s", "B")
    assert (at_b.position, at_a.position) == (1, 2)
    assert at_a.continues is at_b and at_b.continued
    # another session's stream through the same proxies is a path of its own
    assert paths.open("A", "t", "B").position == 1
    # the UE moves on to D: D asks C's proxy, C relays straight from A (agent/frontend.py relay_origin)
    at_c = paths.open("C", "s", "D")
    at_a2 = paths.open("A", "s", "C")
    assert (at_c.position, at_a2.position) == (1, 2)
    for c in (at_a, at_b, at_a2, at_c):
        paths.close(c)
    assert paths.carried("s") == []


def test_a_stream_already_continued_is_not_counted_twice():
    # The UE's old path (B's proxy to C, continued by A's proxy) is still open when B asks A for
    # a stream of its own (the UE came back to B): that one is the first hop, not the third.
    paths = RelayPaths()
    old_b = paths.open("B", "s", "C")
    old_a = paths.open("A", "s", "B")
    assert paths.open("A", "s", "B").position == 1
    # once the old upstream stream has closed, the old downstream one may be continued again
    paths.close(old_a)
    assert not old_b.continued
    assert paths.open("A", "s", "B").position == 2


def test_unnamed_proxies_and_requests_without_a_relay_are_first_hops():
    paths = RelayPaths()
    paths.open(None, "s", "C")
    assert paths.open(None, "s", None).position == 1
    assert paths.open("A", "s", None).position == 1


def test_the_pool_names_its_proxies_agents_and_shares_one_path_registry():
    with ProxyPool() as pool:
        pa = pool.add("http://127.0.0.1:1/", 0.0)
        pb = pool.add("http://127.0.0.1:2", 0.0)
        pool.name_agents({"A": "http://127.0.0.1:1", "B": "http://127.0.0.1:2/", "C": "http://127.0.0.1:3"})
        assert (pa.agent_id, pb.agent_id) == ("A", "B")
        assert pa.paths is pool.paths and pb.paths is pool.paths


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_draws_at_positions_one_to_k_are_the_law_over_k_hops(k):
    # Same seed, same order of draws: one draw at each position 1..k sums to sample() over k hops.
    n = 5000
    cost = T.PAPER_HOP_COST
    a = np.random.default_rng(11)
    per_pos = sum(cost.sample_at(a, pos, n) for pos in range(1, k + 1))
    assert np.array_equal(per_pos, cost.sample(np.random.default_rng(11), k, n))


def test_each_position_stalls_at_its_own_probability():
    # Without jitter a draw above the fixed delay is a stall: its share is the position's q g^(k-1).
    cost = dataclasses.replace(T.PAPER_HOP_COST, jitter_median_s=0.0)
    n = 200_000
    for pos in (1, 2, 3):
        x = cost.sample_at(np.random.default_rng([7, pos]), pos, n)
        q = cost.stall_prob_at(pos)
        share = float(np.mean(x > cost.fixed_s + 1e-12))
        assert share == pytest.approx(q, abs=5 * np.sqrt(q * (1 - q) / n))
    assert cost.stall_prob_at(3) > 5 * cost.stall_prob_at(2) > 25 * cost.stall_prob_at(1)
    assert cost.stall_prob_at(2) == pytest.approx(cost.stall_prob * cost.growth)
    with pytest.raises(ValueError):
        cost.sample_at(np.random.default_rng(0), 0, 3)


def test_hop_draw_spans_positions_and_is_deterministic_with_a_seed():
    cost = T.HopCost(fixed_s=0.001, jitter_median_s=0.0, jitter_sigma=0.0, stall_prob=1e-9,
                     stall_mean_s=0.1, growth=1e9)                       # only position 2 on stalls
    r = np.random.default_rng(3)
    assert [hop_draw(cost, r, 1) for _ in range(50)] == [pytest.approx(0.001)] * 50
    d2 = [hop_draw(cost, np.random.default_rng(3), 2) for _ in range(2)]
    assert d2[0] == d2[1] and d2[0] > 0.001
    assert hop_draw(cost, np.random.default_rng(3), 1, hops=2) > 0.002      # both hops, the second stalling
    assert hop_draw(cost, r, 1, hops=0) == 0.0


def _relay_gaps(cost, position, n=400, seed=5):
    """Gaps between the chunks leaving a relay at ``position``, all arriving at 0 on a virtual
    clock: each leaves one draw after the one before, so the gaps are the draws."""
    clock = [0.0]

    async def sleep(dt):
        clock[0] += dt

    async def chunks():
        for k in range(n):
            yield k

    async def go():
        return [clock[0] async for _ in delayed(chunks(), 0.0, cost=cost, position=position,
                                                rng=np.random.default_rng(seed), clock=lambda: clock[0],
                                                sleep=sleep)]
    return np.diff(asyncio.run(go()))


def test_delayed_pays_the_hop_of_its_position():
    cost = T.HopCost(fixed_s=0.005, jitter_median_s=0.0, jitter_sigma=0.0, stall_prob=1e-9,
                     stall_mean_s=0.1, growth=1e9)
    first, second = _relay_gaps(cost, 1), _relay_gaps(cost, 2)
    assert np.allclose(first, 0.005)                  # position 1: the fixed 5 ms on every gap, never a stall
    assert np.all(second > 0.005) and second.mean() > 0.005 + 0.05          # position 2: every token stalls
    assert np.array_equal(second, _relay_gaps(cost, 2))                     # same seed, same gaps
