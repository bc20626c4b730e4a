"""``pallas replay --kill-replica I@T`` (pallas_eval/failover.py, issue 46): the flag's parsing
and its one-line refusals, the fail-over accounting over synthetic replica events (who owned the
dead replica's nodes again and when, indications lost on the other nodes, how the dead replica's
sessions ended, handovers with no preparation in the window), the merge of a killed replica's
cut-short events file, and the kill itself on a real process."""

from __future__ import annotations

import json
import sys
import time

import pytest

from pallas_eval.failover import KillSpec, check_within, failover_lines, failover_report, owned_at, parse_kill


def _parse(*argv):
    from pallas_eval.cli import build_parser, options_from_args
    return options_from_args(build_parser().parse_args(["replay", *argv]))


def test_kill_spec_parses_and_refuses_in_one_line():
    assert parse_kill("1@40", 3) == KillSpec(1, 40.0)
    assert parse_kill(" 0@12.5 ", 2) == KillSpec(0, 12.5)
    assert str(KillSpec(1, 40.0)) == "1@40"
    for spec, n, why in (("1", 3, "REPLICA@SECONDS"), ("a@3", 3, "REPLICA@SECONDS"), ("1@x", 3, "REPLICA@SECONDS"),
                         ("3@40", 3, "replica 3 of 3 (0..2)"), ("-1@40", 3, "replica -1 of 3"),
                         ("0@40", 1, "needs --xapp-replicas 2"), ("1@0", 3, "must be > 0"),
                         ("1@nan", 3, "must be > 0"), ("1@inf", 3, "must be > 0")):
        with pytest.raises(ValueError) as e:
            parse_kill(spec, n)
        assert why in str(e.value) and "\n" not in str(e.value), (spec, str(e.value))
    check_within(KillSpec(1, 89.0), 90.0)
    with pytest.raises(ValueError, match="lasts 90 s"):
        check_within(KillSpec(1, 90.0), 90.0)


def test_the_flag_reaches_the_options_or_exits_with_one_line():
    assert _parse("--xapp-replicas", "3", "--kill-replica", "1@40").kill_replica == KillSpec(1, 40.0)
    assert _parse("--xapp-replicas", "3").kill_replica is None
    for argv, why in ((("--xapp-replicas", "3", "--kill-replica", "3@40"), "replica 3 of 3"),
                      (("--kill-replica", "0@40"), "needs --xapp-replicas 2"),
                      (("--xapp-replicas", "3", "--duration-s", "60", "--kill-replica", "1@60"), "lasts 60 s")):
        with pytest.raises(SystemExit) as e:
            _parse(*argv)
        assert str(e.value).startswith("pallas replay: --kill-replica") and why in str(e.value)
    # a converted drive's length is known after its preparation: checked there, not here
    assert _parse("--trace", "x", "--xapp-replicas", "2", "--kill-replica", "1@500").kill_replica.at_s == 500


# -- the accounting over synthetic events ----------------------------------------------------------

T0, KILL, LEASE, BEAT = 1000.0, 1040.0, 1.5, 0.5
NODES = [f"n{i}" for i in range(9)]
SHARE = {"xapp-0": NODES[0:3], "xapp-1": NODES[3:6], "xapp-2": NODES[6:9]}


def _ev(t, replica, kind, **kw):
    return {"t": t, "replica": replica, "kind": kind, **kw}


def _indications():
    """Every node reports every 0.5 s over the replay's first 60 s."""
    return {n: [T0 + 0.5 * k for k in range(120)] for n in NODES}


def _events(lost_on_n0=0, n8_moved=False):
    """Three replicas take their shares at the start; xapp-1 is killed at KILL and its nodes are
    claimed again 1.7 s (xapp-0: n3, n4) and 1.9 s (xapp-2: n5) later. Sessions: s1 prepared by
    xapp-1 then committed by the fallback at xapp-0 after the kill; s2 prepared by xapp-1 and
    left open; s3 cancelled by xapp-1 before the kill; s4 always xapp-0's."""
    ind = _indications()
    evs = [_ev(T0 - 5, r, "lease", claimed=nodes, released=[], lost=[], owned=nodes) for r, nodes in SHARE.items()]
    evs += [_ev(1020.0, "xapp-1", "trigger", session="s1", epoch=5, ue="ue1"),
            _ev(1021.0, "xapp-1", "trigger", session="s2", epoch=6, ue="ue2"),
            _ev(1019.0, "xapp-1", "trigger", session="s3", epoch=3, ue="ue3"),
            _ev(1022.0, "xapp-1", "cancel", session="s3", epoch=3),
            _ev(1023.0, "xapp-0", "trigger", session="s4", epoch=8, ue="ue4"),
            _ev(KILL + 1.7, "xapp-0", "lease", claimed=["n3", "n4"], released=[], lost=[],
                owned=["n0", "n1", "n2", "n3", "n4"]),
            _ev(KILL + 1.9, "xapp-2", "lease", claimed=["n5"], released=[], lost=[],
                owned=["n5", "n6", "n7", "n8"]),
            _ev(KILL + 3.0, "xapp-0", "commit", session="s1", epoch=2 << 38, ue="ue1", prepared=False),
            _ev(KILL + 3.1, "xapp-0", "reply", call="commit", session="s1", epoch=2 << 38, ok=True)]
    if n8_moved:       # n8 lost by xapp-2 and taken by xapp-0 half a second later
        evs += [_ev(1050.0, "xapp-2", "lease", claimed=[], released=[], lost=["n8"], owned=["n5", "n6", "n7"]),
                _ev(1050.5, "xapp-0", "lease", claimed=["n8"], released=[], lost=[],
                    owned=["n0", "n1", "n2", "n3", "n4", "n8"])]
    evs.sort(key=lambda e: e["t"])

    def after(n, t):
        return sum(1 for x in ind[n] if x >= t)
    admitted = {"xapp-0": {n: len(ind[n]) for n in NODES[0:3]}, "xapp-2": {n: len(ind[n]) for n in NODES[6:9]}}
    admitted["xapp-0"]["n0"] -= lost_on_n0
    admitted["xapp-0"].update(n3=after("n3", KILL + 1.7), n4=after("n4", KILL + 1.7))
    admitted["xapp-2"]["n5"] = after("n5", KILL + 1.9)
    if n8_moved:
        admitted["xapp-2"]["n8"] = sum(1 for x in ind["n8"] if x < 1050.0)
        admitted["xapp-0"]["n8"] = after("n8", 1050.5)
    evs += [_ev(1070.0, r, "end", cluster={"admitted": a}) for r, a in admitted.items()]
    return evs


def _report(evs, rows=()):
    return failover_report(evs, killed="xapp-1", t_kill=KILL, start_at=T0, lease_s=LEASE, heartbeat_s=BEAT,
                           indications=_indications(), rows=rows,
                           sessions={"s2": {"error": "", "agents_after_kill": ["edge-1"]}})


def test_the_dead_replicas_nodes_and_when_they_were_owned_again():
    evs = _events()
    assert owned_at(evs, "xapp-1", KILL) == {"n3", "n4", "n5"}
    assert owned_at(evs, "xapp-0", KILL + 2) == {"n0", "n1", "n2", "n3", "n4"}
    rep = _report(evs)
    assert [(r["node"], r["owned_again_by"], r["gap_s"]) for r in rep["nodes"]] == [
        ("n3", "xapp-0", 1.7), ("n4", "xapp-0", 1.7), ("n5", "xapp-2", 1.9)]
    # reports at 40.0, 40.5, 41.0, 41.5 s (n3, n4: before 41.7) and also at 41.5 for n5 (before 41.9)
    assert [r["indications_unhandled"] for r in rep["nodes"]] == [4, 4, 4]
    assert rep["bound_s"] == 2.0 and rep["within_bound"] is True
    assert rep["reowned_min_s"] == 1.7 and rep["reowned_max_s"] == 1.9
    assert rep["owned_again_by"] == {"xapp-0": 2, "xapp-2": 1}
    assert rep["window_s"] == [40.0, 41.9] and rep["at_s"] == 40.0
    assert rep["surviving"] == {"nodes": 6, "indications": 720, "handled": 720, "lost": 0, "lost_by_node": {},
                                "dropped_in_handover": {}, "never_owned": {}}


def test_a_gap_beyond_the_bound_and_a_node_never_owned_again_are_said():
    evs = [e for e in _events() if not (e["kind"] == "lease" and e["t"] == KILL + 1.9)]
    evs.append(_ev(KILL + 2.4, "xapp-2", "lease", claimed=["n5"], released=[], lost=[], owned=["n5"]))
    assert _report(evs)["within_bound"] is False
    evs = [e for e in evs if not (e["kind"] == "lease" and e["t"] == KILL + 2.4)]
    rep = _report(evs)
    assert rep["nodes_not_owned_again"] == ["n5"] and rep["within_bound"] is False
    assert rep["nodes"][2]["indications_unhandled"] == 40          # every report from the kill on
    assert any("NOT owned again: n5" in line for line in failover_lines(rep))


def test_indications_lost_on_a_surviving_node_are_counted_apart_from_a_hand_over():
    rep = _report(_events(lost_on_n0=2, n8_moved=True))
    s = rep["surviving"]
    assert s["lost"] == 2 and s["lost_by_node"] == {"n0": 2}
    assert s["dropped_in_handover"] == {"n8": 1}      # the report at 1050.0 s: n8 between owners
    assert s["handled"] == 720 - 3
    # a survivor without its end event: what it handled is unknown, not zero
    no_end = [e for e in _events() if not (e["kind"] == "end" and e["replica"] == "xapp-2")]
    assert _report(no_end)["surviving"] is None
    # a node of the trace no replica ever owned is not a survivor's loss
    ind = dict(_indications(), other=[T0 + 1.0])
    rep = failover_report(_events(), killed="xapp-1", t_kill=KILL, start_at=T0, lease_s=LEASE,
                          heartbeat_s=BEAT, indications=ind)
    assert rep["surviving"]["never_owned"] == {"other": 1} and rep["surviving"]["lost"] == 0


def test_how_the_dead_replicas_sessions_ended():
    rep = _report(_events())
    by = {s["session"]: s for s in rep["sessions"]}
    assert sorted(by) == ["s1", "s2", "s3"]                    # s4 was xapp-0's
    assert by["s1"] == {"session": "s1", "ue": "ue1", "at_kill": "open", "end": "committed (fallback)",
                        "by": "xapp-0", "defined": True}
    assert by["s2"]["end"].startswith("open") and by["s2"]["defined"] is False
    assert by["s2"]["agents_after_kill"] == ["edge-1"] and by["s2"]["error"] == ""
    assert by["s3"]["at_kill"] == "cancelled" and by["s3"]["defined"] is True
    assert rep["undefined_sessions"] == 1
    assert rep["sessions_by_end"]["committed (fallback)"] == 1
    # a commit the agent refused leaves the session at its source
    evs = [dict(e, ok=False) if e["kind"] == "reply" else e for e in _events()]
    assert _report(evs)["sessions"][0]["end"] == "committed (fallback), refused by the agent: served at the source"


def test_handovers_with_no_preparation_in_the_window_or_of_the_dead_sessions():
    rows = [("ue4", 1030.0, "s4", "commit"),                  # before: prepared
            ("ue5", 1031.0, "s5", "fallback:recompute"),      # before: unprepared, elsewhere
            ("ue4", KILL + 1.0, "s4", "fallback:recompute"),  # in the window
            ("ue6", KILL + 1.5, "", "no-session"),            # nothing to move: not counted
            ("ue1", KILL + 3.0, "s1", "fallback:recompute"),  # the dead replica's session, first after
            ("ue1", KILL + 9.0, "s1", "fallback:recompute"),  # its second: not the fail-over's
            ("ue2", KILL + 5.0, "s2", "commit")]              # dead session, prepared again
    h = _report(_events(), rows)["handovers"]
    assert h == {"in_window": 1, "unprepared_in_window": 1, "unprepared_of_dead_sessions": 1, "cost": 2,
                 "elsewhere": 3, "unprepared_elsewhere": 2}
    lines = failover_lines(_report(_events(), rows))
    assert lines[0].startswith("fail-over: xapp-1 SIGKILLed at 40.0 s holding 3 E2 node(s); owned again "
                               "after 1.70-1.90 s by xapp-0 (2), xapp-2 (1)")
    assert "= 2 s: held" in lines[0] and "12 of their indications unhandled" in lines[0]
    assert "720 handled by the survivors, 0 lost" in lines[1]
    assert "in no defined state: 1" in lines[2]
    assert lines[3].startswith("  handovers with no preparation from the fail-over: 2 (1 of 1 in the window")


# -- the harness's parts ----------------------------------------------------------------------------

def test_a_killed_replicas_cut_short_last_line_is_left_out(tmp_path):
    from pallas_eval.replicas import merge_events
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"t": 1.0, "kind": "start"}) + "\n" + '{"t": 2.0, "ki')
    b.write_text(json.dumps({"t": 1.5, "kind": "start"}) + "\n")
    assert [(e["replica"], e["t"]) for e in merge_events([("a", a), ("b", b)])] == [("a", 1.0), ("b", 1.5)]
    a.write_text('{"t": 2.0, "ki\n' + json.dumps({"t": 3.0, "kind": "end"}) + "\n")
    with pytest.raises(ValueError):
        merge_events([("a", a)])


def test_the_kill_timer_sigkills_the_named_replica_only(tmp_path):
    from pallas_eval.procs import Supervisor
    from pallas_eval.replay import ReplayOptions, _kill_timer
    opts = ReplayOptions(out_dir=tmp_path, xapp_replicas=2, kill_replica=KillSpec(1, 0.2))
    desc = {"controls": {"cluster": {"lease_s": 1.5, "heartbeat_s": 0.5}}}
    with Supervisor(tmp_path / "logs") as sup:
        xapps = [("dbaas", None, None)] + [
            (f"xapp-{i}", sup.start(f"xapp-{i}", [sys.executable, "-c", "import time; time.sleep(60)"]), None)
            for i in range(2)]
        kill: dict = {}
        start = time.time()
        timer = _kill_timer(opts, xapps, start, desc, kill)
        timer.join(30)
        assert xapps[2][1].popen.wait(10) == -9                  # SIGKILL, no clean stop
        assert xapps[1][1].alive()
        assert kill["replica"] == "xapp-1" and kill["t"] >= start + 0.2
        assert (kill["lease_s"], kill["heartbeat_s"]) == (1.5, 0.5)
        for _, c, _ in xapps[1:]:
            sup.stop(c)                                          # a dead child stops quietly
    assert _kill_timer(ReplayOptions(out_dir=tmp_path), xapps, start, desc, {}) is None


def test_a_runs_failover_reads_the_trace_rows_and_sessions(tmp_path):
    from pallas_eval.metrics import SessionRecord
    from pallas_eval.replay import SchemeRun, failover_of
    from pallas_eval.report import HandoverRow
    from xapp.e2.trace import TraceRecord, write_trace
    trace = tmp_path / "t.e2trace"
    offset = 900.0                       # trace time T0 - 900 replays at wall time T0
    recs = [TraceRecord(T0 - offset + 0.5 * k, n, 12050, b"x") for k in range(120) for n in NODES]
    recs.append(TraceRecord(T0 - offset + 59.9, "", 20010, b"{}"))        # an A1 message: not counted
    write_trace(trace, recs)
    row = HandoverRow(scheme="pallas", ue_id="ue1", time_s=43.0, from_cell=1, to_cell=2, from_server="edge-0",
                      to_server="edge-1", session_id="s1", tokens_at_ho=10, lead_s=1.0, t_ho_error_s=0.0,
                      window_s=1.0, t_early_s=0.1, sit_s=0.2, outcome="fallback:recompute")
    ses = SessionRecord("ue1", "s1", 10, 20, T0, times=[KILL - 1, KILL + 1], token_ids=[1, 2],
                        agents=["edge-0", "edge-1"])
    run = SchemeRun("pallas", T0, [ses], {}, _events(), [], offset,
                    kill={"replica": "xapp-1", "t": KILL, "lease_s": LEASE, "heartbeat_s": BEAT})
    rep = failover_of(run, {"trace": str(trace)}, [row])
    assert rep["surviving"]["indications"] == 720 and rep["surviving"]["lost"] == 0
    assert [r["indications_unhandled"] for r in rep["nodes"]] == [4, 4, 4]
    assert rep["handovers"]["unprepared_of_dead_sessions"] == 1 and rep["handovers"]["cost"] == 1
    assert rep["sessions"][0]["agents_after_kill"] == ["edge-1"]
    assert failover_of(SchemeRun("pallas", T0, [], {}, [], [], offset), {"trace": str(trace)}, []) is None


def test_pallas_report_renders_the_failover_of_a_summary():
    from pallas_eval import results_page as rpg
    rep = json.loads(json.dumps(_report(_events())))            # as summary.json holds it
    base = {"summary": [], "handovers": []}
    page = rpg.render_run({**base, "failover": {"pallas": [rep]}}, "killed")
    assert "- pallas: fail-over: xapp-1 SIGKILLed at 40.0 s holding 3 E2 node(s)" in page
    assert "- pallas: sessions xapp-1 owned at the kill: 3" in page
    assert "fail-over" not in rpg.render_run(base, "none")


def test_a_killed_replica_that_held_no_node_is_said_so_not_failed():
    """Rendezvous can leave a replica without a node (4 gNBs over 3 replicas gave 1/0/3 on the
    default drive): its kill has nothing to take over, which the line says instead of NOT HELD."""
    evs = [e for e in _events() if not (e["replica"] == "xapp-1" and e["kind"] == "lease")]
    evs.append(_ev(T0 - 5, "xapp-1", "lease", claimed=[], released=[], lost=[], owned=[]))
    rep = _report(sorted(evs, key=lambda e: e["t"]))
    assert rep["nodes"] == [] and rep["within_bound"] is None
    first = failover_lines(rep)[0]
    assert "holding 0 E2 node(s)" in first and "nothing to take over" in first and "NOT HELD" not in first


def test_a_session_left_open_that_finished_its_output_is_a_defined_end():
    """The kill of 3 replicas on the default drive left 4 sessions prepared by the dead replica
    and decided by nobody; each completed its output token-exact at its source. Such a session
    is served to the end (its preparation left to the target's lease), not an undefined state;
    one that did not finish stays undefined."""
    evs = _events()
    for finished, undefined in ((True, 0), (False, 1)):
        rep = failover_report(evs, killed="xapp-1", t_kill=KILL, start_at=T0, lease_s=LEASE, heartbeat_s=BEAT,
                              indications=_indications(), rows=(),
                              sessions={"s2": {"error": "", "finished": finished, "agents_after_kill": ["edge-1"]}})
        s2 = next(s for s in rep["sessions"] if s["session"] == "s2")
        assert s2["defined"] is finished and rep["undefined_sessions"] == undefined
        assert s2["end"].startswith("open") and ("served to the end" in s2["end"]) is finished
