"""Relay hops per token and the ITL breakdown by hops (pallas_eval/metrics.py)."""

import dataclasses

import numpy as np
import pytest

from pallas_eval.metrics import SessionRecord, hop_itl_line, itl_by_hops, relay_hops


def _session(path, times):
    """``path``: per token (decoder, relaying agent or "")."""
    s = SessionRecord("ue", "s", 10, len(path), 0.0)
    s.times = list(times)
    s.token_ids = list(range(len(path)))
    s.agents = [d for d, _ in path]
    s.relayed = [r for _, r in path]
    return s


def test_detour_hops_grow_to_two_and_a_return_to_the_holder_is_local():
    # A holds the session; the UE goes A -> B (B relays A) -> C (C asks B, B relays A) -> A.
    path = [("A", "")] * 2 + [("A", "B")] * 2 + [("A", "C")] * 2 + [("A", "")] * 2
    assert relay_hops(_session(path, range(8))).tolist() == [0, 0, 1, 1, 2, 2, 0, 0]


def test_a_relay_from_the_previous_agent_after_passing_through_others_is_one_hop():
    # A -> B -> A -> C: C asks A, the holder: one hop, though the session has moved three times.
    path = [("A", "")] + [("A", "B")] + [("A", "")] + [("A", "C")] * 2
    assert relay_hops(_session(path, range(5))).tolist() == [0, 1, 0, 1, 1]


def test_an_agent_that_relayed_the_session_before_relays_the_holder_directly():
    # A -> B (B relays A) -> C (C asks B, B relays A) -> B: B remembers A (agent/frontend.py
    # relay_origin) and relays it directly, one hop, though the UE came from C.
    path = [("A", "")] + [("A", "B")] * 2 + [("A", "C")] * 2 + [("A", "B")] * 2
    assert relay_hops(_session(path, range(7))).tolist() == [0, 1, 1, 2, 2, 1, 1]


def test_a_bridge_relay_then_local_decoding_at_the_target():
    # Pallas-Bridge: the target B relays the source A, then decodes itself.
    path = [("A", "")] * 2 + [("A", "B")] * 2 + [("B", "")] * 2
    assert relay_hops(_session(path, range(6))).tolist() == [0, 0, 1, 1, 0, 0]


def test_itl_by_hops_keys_each_gap_by_its_later_token():
    path = [("A", "")] * 3 + [("A", "B")] * 3 + [("A", "C")] * 3
    times = [0.0, 0.04, 0.08, 0.20, 0.25, 0.30, 0.45, 0.60, 0.75]
    by = itl_by_hops([_session(path, times)])
    assert sorted(by) == [0, 1, 2]
    assert by[0] == pytest.approx([0.04, 0.04])
    assert by[1] == pytest.approx([0.12, 0.05, 0.05])
    assert by[2] == pytest.approx([0.15, 0.15, 0.15])
    line = hop_itl_line("detour", by)
    assert line is not None and "2 hops: n 3" in line and ">100 ms 100.0%" in line
    assert "1 hop: n 3" in line and ">100 ms 33.3%" in line


def test_no_relayed_token_gives_no_line_and_mismatched_lengths_count_as_local():
    s = _session([("A", "")] * 4, [0.0, 0.04, 0.08, 0.12])
    assert hop_itl_line("pallas", itl_by_hops([s])) is None
    s.relayed = []          # an older record without the relay field
    assert relay_hops(s).tolist() == [0, 0, 0, 0]
    assert np.array_equal(itl_by_hops([s])[0], np.diff(s.times))


def test_the_model_takes_the_live_fronts_relay_hops_and_the_gap_across_the_switch():
    """pallas_eval.simulate.front_relay_paths gives the model the hops the fronts relay over
    (agent/frontend.py relay_origin: 0 at the holder, at most 2, 1 where the new front relayed
    before), and Detour's model SIT is timing.detour_switch_gap of those hops, not the mean hop
    cost of one hop per handover so far."""
    from pallas_common import timing
    from pallas_eval.report import HandoverRow
    from pallas_eval.replay_run import _sim_handovers_live
    from pallas_eval.simulate import Rates, front_relay_paths, simulate

    def row(t, a, b, sid="s1"):
        return HandoverRow("detour", "ue", t, 0, 1, a, b, sid, 100, sit_s=0.08)

    # the session held at A; the UE goes A -> B -> C -> B -> A -> C; another session B -> C
    rows = [row(1, "A", "B"), row(2, "B", "C"), row(3, "C", "B"), row(4, "B", "A"), row(5, "A", "C"),
            row(6, "B", "C", "s2"), HandoverRow("detour", "ue", 7, 0, 1, "C", "A")]
    assert front_relay_paths(rows) == [(1, 0), (2, 1), (1, 2), (0, 1), (1, 0), (1, 0), (0, 0)]
    rates = Rates("t", 1850.0, 25.0, 292_500.0, 2048.0, 32, 0.012, 0.012, relay_request_s=0.012,
                  relay_requests_per_hop=2)
    hos = _sim_handovers_live(rows[:6])
    assert [(h.relay_hops, h.prev_relay_hops) for h in hos] == front_relay_paths(rows[:6])
    got = [r.sit_s for r in simulate(hos, rates, ("detour",))]
    want = timing.detour_switch_gap(25.0, [1, 2, 1, 0, 1, 1], [0, 1, 2, 1, 0, 0], rates.hop_cost(), 0.012, 2)
    assert got == pytest.approx(want.tolist())
    # the chain (no relay hops known: the paper's experiments) keeps one more hop a handover
    chain = simulate([dataclasses.replace(h, relay_hops=None) for h in hos], rates, ("detour",))
    assert chain[1].sit_s == pytest.approx(float(timing.detour_switch_gap(25.0, 2, 1, rates.hop_cost(), 0.012, 2)))
    assert chain[4].sit_s > got[4]          # the fifth handover: 5 hops in the chain, 1 live
