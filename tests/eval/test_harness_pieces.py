"""Unit tests of the replay harness's pieces: cell-to-server map, UE-side metrics, session
lengths, outputs (table, CSV, JSON, plots), process supervision."""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pallas_eval.cellmap import ColouringError, map_cells_to_servers, shared_pairs
from pallas_eval.lengths import LengthSampler, derive_quantiles, ue_session_stream, _CONTEXT_Q, _GENERATED_Q
from pallas_eval.metrics import Handover, SessionRecord, gap_between_tokens, sit_for_handover, summarize
from pallas_eval.report import HandoverRow, handover_table, plot_cdfs, plot_timeline, summary_table, write_csv, write_json

AZURE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "azure-llm" / "AzureLLMInferenceTrace_conv.csv"


# --- cell-to-server map --------------------------------------------------------------------
def test_path_of_cells_alternates_over_two_servers():
    hos = [(1, 2), (2, 3), (3, 4), (4, 5), (5, 4), (4, 3)]
    m = map_cells_to_servers([1, 2, 3, 4, 5], hos, n_servers=2)
    assert set(m) == {1, 2, 3, 4, 5}
    assert shared_pairs(m, hos) == []
    assert set(m.values()) <= {0, 1}


def test_triangle_needs_three_servers():
    hos = [(1, 2), (2, 3), (3, 1)]
    with pytest.raises(ColouringError, match="cannot be split over 2 servers"):
        map_cells_to_servers([], hos, n_servers=2)
    m = map_cells_to_servers([], hos, n_servers=3)
    assert shared_pairs(m, hos) == []


def test_soft_neighbour_pairs_kept_apart_when_possible():
    # A hex-like cluster: hard edges form a path, soft edges close triangles (3-colourable).
    hos = [(1, 2), (2, 3)]
    nbs = [(1, 3)] * 5 + [(1, 4), (2, 4), (3, 4)]
    m = map_cells_to_servers([1, 2, 3, 4], hos, nbs, n_servers=3)
    assert shared_pairs(m, hos) == []
    assert (1, 3) not in shared_pairs(m, nbs)
    # Random drives over a grid: every handover pair on different servers with three servers.
    rng = np.random.default_rng(0)
    for _ in range(20):
        walk = [int(rng.integers(0, 4)) * 10 + int(rng.integers(0, 4))]
        for _ in range(30):
            r, c = divmod(walk[-1], 10)
            dr, dc = [(0, 1), (1, 0), (0, -1), (-1, 0)][int(rng.integers(4))]
            walk.append(min(3, max(0, r + dr)) * 10 + min(3, max(0, c + dc)))
        hos = [(a, b) for a, b in zip(walk, walk[1:]) if a != b]
        m = map_cells_to_servers(walk, hos, n_servers=2)  # a grid graph is bipartite
        assert shared_pairs(m, hos) == []


# --- metrics -------------------------------------------------------------------------------
def _session(ue, sid, times, prompt=10):
    return SessionRecord(ue, sid, prompt, len(times), times[0] - 0.1, list(times), list(range(len(times))))


def test_sit_is_last_token_before_to_first_after():
    s = _session("u1", "s1", [1.0, 1.05, 1.10, 1.60, 1.65])
    r = sit_for_handover(Handover("u1", 1.2, 7, 8), [s])
    assert r.session_id == "s1"
    assert r.sit == pytest.approx(0.5)
    assert r.tokens_at_ho == 10 + 3
    # No session in flight: NaN. Another UE's session is ignored.
    assert math.isnan(sit_for_handover(Handover("u1", 2.0, 8, 7), [s]).sit)
    assert math.isnan(sit_for_handover(Handover("u2", 1.2, 7, 8), [s]).sit)


def test_a_session_in_its_prefill_at_the_handover_gets_a_sit():
    # opened at 0.9, the handover at 0.95 in its prefill, the first token at 1.4: the UE waited
    # 0.45 s after the handover
    s = _session("u1", "s1", [1.4, 1.45, 1.5])
    s.start = 0.9
    r = sit_for_handover(Handover("u1", 0.95, 7, 8), [s])
    assert r.session_id == "s1" and r.sit == pytest.approx(0.45) and r.tokens_at_ho == 10
    assert r.last_before == pytest.approx(0.95) and r.first_after == pytest.approx(1.4)
    # no token gap across it: left out of the largest-token-gap figure (Pallas-Bridge's)
    assert gap_between_tokens([r]).size == 0
    # relayed first, then served by the new agent: the longest gap up to its first own token
    s.agents, s.relayed = ["B", "B", "B"], ["A", "", ""]
    s.times = [1.0, 1.6, 1.65]
    r = sit_for_handover(Handover("u1", 0.95, 7, 8), [s], new_agent="B")
    assert r.sit == pytest.approx(0.6) and r.last_before == pytest.approx(1.0)
    assert list(gap_between_tokens([r])) == [pytest.approx(0.6)]     # a gap between two tokens
    # a session opened after the handover was not in flight
    assert math.isnan(sit_for_handover(Handover("u1", 0.85, 7, 8), [s]).sit)


def test_summary_itl_and_slo_share():
    s1 = _session("u1", "a", [0.0, 0.05, 0.10, 0.30, 0.35])   # ITLs .05 .05 .2 .05
    s2 = _session("u2", "b", [0.0, 0.02, 0.04])               # ITLs .02 .02
    s1.reference = list(s1.token_ids)
    s2.reference = [9, 9, 9]
    sits = [sit_for_handover(Handover("u1", 0.2, 1, 2), [s1, s2])]
    sm = summarize("pallas", sits, [s1, s2], t_early=[0.1, float("nan"), 0.3])
    assert sm.itl_mean == pytest.approx(np.mean([.05, .05, .2, .05, .02, .02]))
    assert sm.itl_over_slo == pytest.approx(1 / 6)
    assert sm.sit_mean == pytest.approx(0.2)
    assert sm.t_early_mean == pytest.approx(0.2)
    assert (sm.token_exact, sm.token_checked) == (1, 2)
    assert sm.handovers_with_session == 1


# --- session lengths -----------------------------------------------------------------------
@pytest.mark.skipif(not AZURE.exists(), reason="Azure trace not available")
def test_bundled_quantiles_are_derived_from_the_azure_trace():
    ctx, gen = derive_quantiles(AZURE)
    assert np.array_equal(ctx, _CONTEXT_Q)
    assert np.array_equal(gen, _GENERATED_Q)


def test_sampler_respects_model_length_and_is_reproducible():
    s = LengthSampler(max_model_len=1024, min_output=16, max_output=256)
    rng = np.random.default_rng(1)
    draws = [s.draw(rng) for _ in range(2000)]
    assert all(p >= 1 and 16 <= o <= 256 and p + o <= 1023 for p, o in draws)
    assert np.median([o for _, o in draws]) == pytest.approx(129, rel=0.2)   # Azure conv median 129
    a = [x for x, _ in zip(ue_session_stream(7, "ue-1", s, 2048), range(3))]
    b = [x for x, _ in zip(ue_session_stream(7, "ue-1", s, 2048), range(3))]
    c = [x for x, _ in zip(ue_session_stream(7, "ue-2", s, 2048), range(3))]
    assert a == b and a != c
    assert all(3 <= t < 2048 for x in a for t in x.prompt_ids)


def test_sampler_rejects_a_non_azure_file(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not an Azure LLM trace"):
        LengthSampler(p)


# --- outputs -------------------------------------------------------------------------------
def test_tables_csv_json_and_plots(tmp_path):
    from rich.console import Console
    rows = [HandoverRow("pallas", "u1", 12.3, 1, 2, "s0", "s1", "sess", 500, 3.0, 0.4, 0.01, 0.12,
                        outcome="commit"),
            HandoverRow("ctho", "u1", 12.3, 1, 2, "s0", "s1", outcome="no-session")]
    s1 = _session("u1", "a", [0.0, 0.05, 0.10, 0.30, 0.35])
    sm = summarize("pallas", [sit_for_handover(Handover("u1", 0.2, 1, 2), [s1])], [s1])
    con = Console(record=True, width=200)
    con.print(handover_table(rows))
    con.print(summary_table([sm], simulated={"pallas": {"sit_mean": 0.1, "sit_p99": 0.2}}))
    txt = con.export_text()
    assert "1→2" in txt and "120" in txt and "no-session" in txt and "200" in txt
    write_csv(tmp_path / "h.csv", rows)
    got = list(csv.DictReader(open(tmp_path / "h.csv")))
    assert got[0]["sit_s"] == "0.12" and got[1]["sit_s"] == ""
    write_json(tmp_path / "s.json", {"summary": [sm.as_dict()], "x": float("nan")})
    j = json.loads((tmp_path / "s.json").read_text())
    assert j["x"] is None and j["summary"][0]["scheme"] == "pallas"
    p = plot_cdfs(tmp_path / "sit.png", {"pallas": np.array([0.1, 0.2]), "ctho": np.array([1.0])}, "SIT (ms)")
    q = plot_timeline(tmp_path / "tl.png", "u1", {"pallas": [s1]}, [0.2])
    assert p.stat().st_size > 1000 and q.stat().st_size > 1000


# --- process supervision -------------------------------------------------------------------
def test_supervisor_stops_the_whole_process_group(tmp_path):
    from pallas_eval.procs import Supervisor, group_members
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")
    sup = Supervisor(tmp_path, grace_s=2.0)
    c = sup.start("sleeper", [sys.executable, "-c", code])
    deadline = time.time() + 10
    while len(group_members(c.pgid)) < 2 and time.time() < deadline:
        time.sleep(0.1)
    sup.refresh()
    assert len(sup.started_pids) >= 2
    sup.close()
    assert sup.leftovers() == set()
    assert group_members(c.pgid) == set()


def test_supervisor_also_stops_a_grandchild_in_its_own_session(tmp_path):
    from pallas_eval.procs import Supervisor, descendants
    # The child starts a grandchild in a new session (as an agent starts vLLM) and ignores SIGTERM.
    code = ("import subprocess, sys, time, signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
            "time.sleep(60)")
    sup = Supervisor(tmp_path, grace_s=1.0)
    c = sup.start("parent", [sys.executable, "-c", code])
    deadline = time.time() + 10
    # Wait until the grandchild runs in its own session (its process group is not the child's).
    while not any(pg != c.pgid for pg in descendants(c.popen.pid).values()) and time.time() < deadline:
        time.sleep(0.1)
    sup.refresh()
    assert c.extra_pgids, "the grandchild's own process group was not found"
    sup.close()
    assert sup.leftovers() == set()


def test_sit_counts_the_stall_when_the_new_agent_takes_over_from_a_relay():
    # Tokens 0-2 from A; after the HO at 1.2 the new agent B relays A (1.25, 1.30), then B serves
    # itself after a 0.4 s stall (restore at the target): the UE's interruption is 0.4 s.
    s = SessionRecord("u1", "s1", 10, 8, 0.9, [1.0, 1.05, 1.10, 1.25, 1.30, 1.70, 1.75],
                      list(range(7)), agents=["A", "A", "A", "A", "A", "B", "B"],
                      relayed=["", "", "", "B", "B", "", ""])
    r = sit_for_handover(Handover("u1", 1.2, 7, 8), [s], new_agent="B")
    assert r.sit == pytest.approx(0.4)
    assert r.last_before == pytest.approx(1.30)
    # Without the agent names it is the gap at the handover.
    assert sit_for_handover(Handover("u1", 1.2, 7, 8), [s]).sit == pytest.approx(0.15)
    # Detour: B never serves directly, so the gap at the handover.
    s.agents = ["A"] * 7
    s.relayed = ["", "", "", "B", "B", "B", "B"]
    assert sit_for_handover(Handover("u1", 1.2, 7, 8), [s], new_agent="B").sit == pytest.approx(0.15)


def test_migration_figures_from_the_commit_replies():
    from pallas_eval.replay import SchemeRun, fill_migration_figures, migration_figures
    run = SchemeRun("pallas", start_at=110.0, sessions=[], specs={}, errors=[], offset=10.0, events=[
        {"kind": "commit", "ue": "u", "trace_t": 105.5, "session": "s1", "epoch": 2},
        {"kind": "commit", "ue": "u", "trace_t": 107.0, "session": "s2", "epoch": 1},
        {"kind": "reply", "call": "trigger", "session": "s1", "epoch": 2, "status": "STATUS_OK",
         "split_tokens": 384},
        {"kind": "reply", "call": "commit", "session": "s1", "epoch": 2, "status": "STATUS_OK",
         "split_tokens": 384, "recomputed_tokens": 10, "kv_bytes_moved": 3 * 65536, "latency_s": 0.25},
        {"kind": "reply", "call": "commit", "session": "s2", "epoch": 1, "status": "STATUS_OK",
         "split_tokens": 0, "recomputed_tokens": 99, "kv_bytes_moved": 0},
        {"kind": "reply", "call": "commit", "session": "s3", "epoch": 1, "status": "STATUS_ERROR"}])
    m = migration_figures([run])
    assert math.isnan(m[("s2", 1)].pop("latency"))          # no latency in that reply
    assert m == {("s1", 2): {"prefix": 384, "recomputed": 10, "bytes": 3 * 65536, "latency": 0.25},
                 ("s2", 1): {"prefix": 0, "recomputed": 99, "bytes": 0}}
    rows = [HandoverRow("pallas", "u", 5.5, 1, 2), HandoverRow("pallas", "u", 7.0, 2, 1),
            HandoverRow("pallas", "u", 9.0, 1, 2)]
    fill_migration_figures(rows, [run], m)
    assert (rows[0].bytes_moved, rows[0].prefill_tokens, rows[0].commit_s) == (3 * 65536, 384 + 10, 0.25)
    assert (rows[1].bytes_moved, rows[1].prefill_tokens) == (0, 99)
    assert (rows[2].bytes_moved, rows[2].prefill_tokens) == (0, 0)


def test_prediction_lead_is_the_time_the_right_target_was_held_before_the_handover():
    from pallas_eval.replay import _lead
    ev = [{"kind": "prediction", "ue": "u", "trace_t": 1.0, "target_cell": 5},
          {"kind": "prediction", "ue": "v", "trace_t": 1.5, "target_cell": 7},
          {"kind": "prediction", "ue": "u", "trace_t": 2.0, "target_cell": 7},
          {"kind": "prediction", "ue": "u", "trace_t": 3.0, "target_cell": -1},
          {"kind": "prediction", "ue": "u", "trace_t": 4.0, "target_cell": 7},
          {"kind": "prediction", "ue": "u", "trace_t": 9.0, "target_cell": 8}]
    assert _lead(ev, "u", 6.0, 7) == pytest.approx(2.0)     # held 7 since t=4 (withdrawn at 3)
    assert math.isnan(_lead(ev, "u", 6.0, 5))               # 5 was not named at the handover
    assert math.isnan(_lead(ev, "u", 0.5, 5))               # nothing before the handover


def test_two_handovers_in_one_interruption_each_get_their_part_of_it():
    """A ping-pong (two handovers 0.3 s apart, no token between them) used to give the second
    handover no SIT at all; now the interruption is split at it and both parts count."""
    from types import SimpleNamespace

    from pallas_eval.replay import SchemeRun, handover_rows
    s = _session("u1", "s1", [1.0, 1.05, 1.10, 1.90, 1.95])
    run = SchemeRun("ctho", start_at=0.0, sessions=[s], specs={}, events=[], errors=[], offset=0.0)
    plan = {"t_first": 0.0, "handovers": [["u1", 1.2, 7, 8], ["u1", 1.5, 8, 9], ["u1", 3.0, 9, 7]]}
    servers = [SimpleNamespace(index=i, agent_id=f"edge-{i}") for i in range(3)]
    rows, sits = handover_rows(run, plan, {7: 0, 8: 1, 9: 2}, servers)
    assert [r.sit_s for r in rows[:2]] == [pytest.approx(0.4), pytest.approx(0.4)]   # 1.10->1.5, 1.5->1.9
    assert sum(x.sit for x in sits[:2]) == pytest.approx(0.8)                        # the whole gap
    assert rows[1].outcome != "no-session" and math.isnan(rows[2].sit_s)             # 3.0: session over
