"""The xApp's own per-UE and per-session state is freed when a UE leaves or goes silent and
when a session ends, so memory stays flat under churn (issue 14: ``ues``, ``tokens``,
``_actions``, ``PolicyClient._done`` and the in-memory event log grew forever). The tracks' and
predictor's own state under churn is tested with them."""

from __future__ import annotations

import copy
import gc
import json
import time
import tracemalloc
from pathlib import Path

import pytest
import structlog

from pallas_proto import pallas_pb2 as pb
from xapp.app import PallasXapp
from xapp.config import load_controls
from xapp.events import EventLog
from xapp.predict.base import Prediction
from xapp.tracks import MeasurementReport
from policy_fakes import OrdersByKind

REPO = Path(__file__).resolve().parents[2]
CELL_A, CELL_B = 0xA81B0C01, 0xA81C0D01


@pytest.fixture(autouse=True)
def quiet_logs():
    """Warnings and errors only, as the xApp logs in production (a debug line per state
    transition, captured by pytest in memory, would be the only thing growing)."""
    import logging
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    yield
    structlog.configure(**saved)


class Recorder(OrdersByKind):
    def __init__(self) -> None:
        self.on_reply = None
        self.n = 0
        self.forgotten = 0

    def trigger(self, *a, **kw):
        self.n += 1

    cancel = commit = trigger

    def forget_session(self, sid):
        self.forgotten += 1

    def close(self):
        pass


class Forgetful:
    """A predictor that names CELL_B 0.3 s ahead and records what it is told to forget."""

    def __init__(self) -> None:
        self.forgotten = 0

    def observe(self, r):
        pass

    def predict(self, track, now):
        return Prediction(CELL_B, now + 0.3, 1.0, "test")

    def forget(self, ue_id):
        self.forgotten += 1


def _app():
    c = copy.deepcopy(json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"])
    c["agents"] = {"edge-a": {"e2_node_id": "gnb_a", "control_address": "127.0.0.1:1", "peer_address": "a:1"},
                   "edge-b": {"e2_node_id": "gnb_b", "control_address": "127.0.0.1:2", "peer_address": "b:1"}}
    c["cells"] = {str(CELL_A): "edge-a", str(CELL_B): "edge-b"}
    return PallasXapp(load_controls(c), None, policy=Recorder(), telemetry=False, predictor=Forgetful(),
                      events=EventLog(None, keep=100))


def _telemetry(agent, sessions, state="serving"):
    rep = pb.TelemetryReport(agent_id=agent, time=time.time())
    rep.server.model.CopyFrom(pb.ModelIdentity(model="tiny", block_size=32, kv_bytes_per_token=16384))
    rep.server.prefill_rate, rep.server.free_kv_blocks = 5000.0, 10_000_000
    for sid, ue in sessions:
        rep.sessions.add(session_id=sid, ue_id=ue, tokens=20000, decode_rate=50.0, state=state,
                         remaining_tokens=5000)
    return rep


def _churn(app, n: int, base: int) -> None:
    """``n`` UEs appear with a session each, report, get triggered, half of them hand over (their
    commits never answered), then the sessions finish and the UEs fall silent; the control
    cycles that follow free them."""
    now = time.time()
    ues = [(f"s{base + i}", str(base + i)) for i in range(n)]
    for sid, ue in ues:
        r = MeasurementReport(now, ue, CELL_A, -80.0)
        app.tracks.add(r)
        app.control.on_report(r)
    app.on_telemetry("edge-b", _telemetry("edge-b", []))
    app.on_telemetry("edge-a", _telemetry("edge-a", ues))
    app.control_cycle()                                    # predictions, triggers
    for sid, ue in ues[: n // 2]:                          # half hand over: commits in flight
        app.on_handover(ue, CELL_A, CELL_B, now)
    app.on_telemetry("edge-a", _telemetry("edge-a", ues, state="finished"))
    app.on_telemetry("edge-b", _telemetry("edge-b", ues, state="finished"))
    app.control.ue_silent_s = 0.0
    app.control.offset = -120.0                            # the trace clock moves past them
    app.control_cycle()
    app.control.offset = 0.0


@pytest.mark.slow
def test_ten_thousand_ues_leave_nothing_behind():
    app = _app()
    _churn(app, 10_000, 0)
    assert app.policy.n >= 10_000                          # they were triggered (then cancelled)
    assert len(app.ues) == 0 and len(app.tracks) == 0 and app.predictor.forgotten == 10_000
    assert len(app.engine) == 0 and app.tokens == {} and app.dispatcher.pending == {}
    assert app.control._pending_ho == {} and len(app.events.events) == 100
    assert app.policy.forgotten == 10_000                  # each ended session once
    assert len(app.engine.telemetry.decode) == 0
    assert app.engine._reservations == {}
    assert app.dispatcher.gate._inflight == {} and app.dispatcher.gate._held == {}
    assert app.engine._ue_pred == {} and app.engine._cands == {} and app.engine._returns == {}


def test_memory_is_flat_over_rounds_of_churn():
    app = _app()
    tracemalloc.start()
    for k in range(2):                                     # warm: arrays and tables sized
        _churn(app, 500, k * 10_000)
    gc.collect()
    first, _ = tracemalloc.get_traced_memory()
    for k in range(2, 5):
        _churn(app, 500, k * 10_000)
    gc.collect()
    last, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert last - first < 64 * 1024, (first, last)        # 1,500 more UEs: no per-UE residue


def test_a_ue_that_falls_silent_leaves_no_prediction_in_the_engine():
    """The engine keeps each UE's latest prediction for the UE's next session (a session first
    seen between two reports is planned at once); a UE that goes silent without a release
    notice took that entry with it only when its prediction was withdrawn, so churn of UEs
    that simply vanish grew it without bound (found in review of the share branch)."""
    app = _app()
    _churn(app, 50, 0)
    assert len(app.ues) == 0 and app.predictor.forgotten == 50
    assert app.engine._ue_pred == {}


def test_a_ue_pushed_out_of_the_capped_table_leaves_no_prediction_either():
    app = _app()
    app.control.max_ues = 3
    now = time.time()
    for i in range(5):
        r = MeasurementReport(now, str(i), CELL_A, -80.0)
        app.tracks.add(r)
        app.control.on_report(r)
        app.engine.set_predictions([str(i)], ["edge-b"], [now + 1.0], [1.0])
    assert set(app.engine._ue_pred) >= {"3", "4"}
    r = MeasurementReport(now, "5", CELL_A, -80.0)            # pushes "2" out
    app.tracks.add(r)
    app.control.on_report(r)
    assert list(app.ues) == ["3", "4", "5"]
    assert not {"0", "1", "2"} & set(app.engine._ue_pred)


def test_the_ue_table_is_capped_least_recently_heard_first():
    app = _app()
    app.control.max_ues = 3
    for i in range(5):
        r = MeasurementReport(time.time(), str(i), CELL_A, -80.0)
        app.tracks.add(r)
        app.control.on_report(r)
    assert list(app.ues) == ["2", "3", "4"] and app.tracks.get("0") is None


def test_the_event_log_streams_to_its_file_and_keeps_a_bounded_tail(tmp_path):
    log = EventLog(tmp_path / "e.jsonl", keep=10)
    for i in range(1000):
        log.write("x", i=i)
    log.close()
    lines = (tmp_path / "e.jsonl").read_text().splitlines()
    assert len(lines) == 1000 and json.loads(lines[-1])["i"] == 999
    assert [e["i"] for e in log.events] == list(range(990, 1000)) and log.written == 1000


@pytest.mark.parametrize("others", [[], [("s2", "2")]])
def test_a_failed_session_ends_like_a_finished_one(others):
    """An agent reports a session ``failed`` (pallas_common.schemes.SessionState.FAILED): the xApp
    stops tracking it as if it had finished, also when no other session of the report is left
    out (before, the failed state was rewritten to finished only when some other session was
    dropped from the report, so a report of serving and failed sessions kept the failed one
    tracked and its token count refreshed)."""
    app = _app()
    now = time.time()
    ues = [("s1", "1"), *others]
    for sid, ue in ues:
        r = MeasurementReport(now, ue, CELL_A, -80.0)
        app.tracks.add(r)
        app.control.on_report(r)
    app.on_telemetry("edge-a", _telemetry("edge-a", ues))
    assert {s for s, _ in ues} <= set(app.tokens)
    rep = _telemetry("edge-a", others)
    rep.sessions.add(session_id="s1", ue_id="1", tokens=20001, decode_rate=50.0, state="failed",
                     remaining_tokens=4999)
    app.on_telemetry("edge-a", rep)
    assert "s1" not in app.tokens
    with pytest.raises(KeyError):
        app.engine.session("s1")
    assert [s for s, _ in others] == [s for s in app.tokens]


def test_silent_ues_are_looked_for_once_a_second_and_go_at_most_a_second_late():
    # forget_silent walks every session's token count, so the cycle runs it once per
    # FORGET_EVERY_S of the trace clock, not every cycle; a UE silent for ue_silent_s still
    # goes, at most FORGET_EVERY_S (plus the cycle's period) after its silence began to count
    app = _app()
    ctl = app.control
    ctl.ue_silent_s = 5.0
    clock = [1000.0]
    ctl.now = lambda: clock[0]
    checks: list[float] = []
    forget = ctl.forget_silent
    ctl.forget_silent = lambda now: (checks.append(now), forget(now))[1]
    r = MeasurementReport(1000.0, "ue1", CELL_A, -80.0)
    app.tracks.add(r)
    ctl.on_report(r)
    gone_at = None
    for k in range(200):                                   # a cycle every 50 ms for 10 s
        clock[0] = 1000.0 + 0.05 * k
        app.control_cycle()
        if "ue1" not in app.ues and gone_at is None:
            gone_at = clock[0]
        if clock[0] - 1000.0 <= ctl.ue_silent_s:
            assert "ue1" in app.ues                        # not silent long enough yet
    assert gone_at is not None and 1005.0 < gone_at <= 1005.0 + ctl.FORGET_EVERY_S + 0.05 + 1e-9
    assert app.predictor.forgotten == 1 and len(app.tracks) == 0
    assert 9 <= len(checks) <= 11                          # about once a second, not 200 times
    assert all(b - a >= ctl.FORGET_EVERY_S - 1e-9 for a, b in zip(checks, checks[1:]))
    clock[0] -= 30.0                                       # the trace clock went back: look at once
    app.control_cycle()
    assert checks[-1] == clock[0]


def test_a_transport_with_a_defer_hook_is_told_while_a_cycle_runs():
    # live mode: the RMR receive loop holds indications back while a decision cycle runs
    # (xapp.e2.rmrloop, step 3); the xApp wires the transport's hook to ControlLoop.cycling
    app = _app()

    class Transport:
        defer = None
        started = False

        def start(self, on_message):
            self.started = True

        def stop(self):
            pass

    tr = app.transport = Transport()
    seen: list[bool] = []
    predict = app.predictor.predict
    app.predictor.predict = lambda track, now: (seen.append(tr.defer()), predict(track, now))[1]
    r = MeasurementReport(time.time(), "ue1", CELL_A, -80.0)
    app.tracks.add(r)
    app.control.on_report(r)
    app._stop.set()                                        # no cycle thread: this test runs the cycles
    app.start()
    try:
        assert tr.started and tr.defer is not None and tr.defer() is False
        app.control_cycle()
        assert seen == [True] and tr.defer() is False      # True inside the cycle only
    finally:
        app.stop()


def test_the_kept_prediction_is_the_last_one_given_for_a_ue():
    """set_predictions keeps each UE's latest prediction for its next session; within one call
    the last entry of a UE wins, a withdrawn one (target None) is dropped."""
    eng = _app().engine
    eng.set_predictions(["u", "v"], ["edge-a", "edge-b"], [1.0, 2.0], [0.9, 0.8])
    assert eng._ue_pred["u"][:3] == ("edge-a", 1.0, 0.9) and "v" in eng._ue_pred
    eng.set_predictions(["u", "u", "v", "v"], [None, "edge-b", "edge-a", None],
                        [float("nan"), 3.0, 4.0, float("nan")], [0.0, 0.7, 0.6, 0.0])
    assert eng._ue_pred["u"][:3] == ("edge-b", 3.0, 0.7) and "v" not in eng._ue_pred
    eng.set_predictions(["u"], [None], [float("nan")], [0.0])
    assert eng._ue_pred == {}
