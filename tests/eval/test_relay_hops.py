"""Relay hops per token and the ITL breakdown by hops (pallas_eval/metrics.py)."""

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
