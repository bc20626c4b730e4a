"""Every A1 knob (and a descriptor's scheme) takes effect on the xApp's next decision.

The xApp is composed as in live mode (A1 handler, control loop, engine, dispatcher) with a
scripted predictor, agents' telemetry fed by hand and a recording policy client, so each test
sees exactly the Control calls a knob leads to (issue 14: fallback and scheme changes had no
effect; per-slice rules were never consulted)."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

from pallas_proto import pallas_pb2 as pb
from xapp.a1 import A1PolicyHandler, default_policy_type_path, load_policy_type
from xapp.app import PallasXapp
from xapp.config import load_controls
from xapp.e2.transport import A1_POLICY_REQ, A1_POLICY_RESP, RmrMessage
from xapp.predict.base import Prediction
from xapp.tracks import MeasurementReport
from policy_fakes import OrdersByKind

REPO = Path(__file__).resolve().parents[2]
CELL_A, CELL_B = 0xA81B0C01, 0xA81C0D01
SLICE = "1-000001"


class Recorder(OrdersByKind):
    """Stands in for PolicyClient: records (call, source, session, epoch, target, scheme)."""

    def __init__(self) -> None:
        self.on_reply = None
        self.calls: list[tuple] = []

    def trigger(self, source, session, epoch, target, *, scheme="pallas", **kw):
        self.calls.append(("Trigger", source, session, epoch, target, scheme))

    def cancel(self, source, session, epoch, reason=""):
        self.calls.append(("Cancel", source, session, epoch, None, None))

    def commit(self, source, session, epoch, target, *, scheme="pallas", **kw):
        self.calls.append(("Commit", source, session, epoch, target, scheme))

    def close(self):
        pass


class Scripted:
    """A predictor that says what the test wants: CELL_B at ``t_ho`` from now, or nothing."""

    def __init__(self) -> None:
        self.lead_s: float | None = None

    def observe(self, r):
        pass

    def predict(self, track, now):
        if self.lead_s is None:
            return None
        return Prediction(CELL_B, now + self.lead_s, 1.0, "scripted")


class Rts:
    def __init__(self) -> None:
        self.sent: list[tuple[int, bytes]] = []

    def rts(self, msg, mtype, payload):
        self.sent.append((mtype, payload))
        return True

    def stop(self):
        pass


def _controls(scheme="pallas"):
    c = copy.deepcopy(json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"])
    c["scheme"] = scheme
    c["agents"] = {"edge-a": {"e2_node_id": "gnb_a", "control_address": "127.0.0.1:1", "peer_address": "a:1"},
                   "edge-b": {"e2_node_id": "gnb_b", "control_address": "127.0.0.1:2", "peer_address": "b:1"}}
    c["cells"] = {str(CELL_A): "edge-a", str(CELL_B): "edge-b"}
    return c


def _report(agent, sessions=()):
    rep = pb.TelemetryReport(agent_id=agent, time=time.time())
    rep.server.model.CopyFrom(pb.ModelIdentity(model="tiny", block_size=32, kv_bytes_per_token=16384))
    rep.server.prefill_rate, rep.server.free_kv_blocks = 5000.0, 100000
    for sid, ue in sessions:
        rep.sessions.add(session_id=sid, ue_id=ue, tokens=20000, decode_rate=50.0, state="serving",
                         remaining_tokens=5000)
    return rep


@pytest.fixture
def xapp():
    cfg = load_controls(_controls())
    policy, predictor, rts = Recorder(), Scripted(), Rts()
    a1 = A1PolicyHandler(cfg, load_policy_type(default_policy_type_path(cfg.a1.policy_type_id)))
    app = PallasXapp(cfg, rts, policy=policy, telemetry=False, predictor=predictor, a1=a1)
    now = time.time()
    app.tracks.add(MeasurementReport(now, "7", CELL_A, -80.0))
    app.control.on_report(MeasurementReport(now, "7", CELL_A, -80.0))
    app.on_telemetry("edge-b", _report("edge-b"))
    app.on_telemetry("edge-a", _report("edge-a", [("s1", "7")]))
    app.policy_calls, app.predictor_script, app.rts_out = policy.calls, predictor, rts.sent
    yield app
    app.stop()


def a1(app, payload: dict | None, op="CREATE"):
    """An A1_POLICY_REQ as the OSC mediator sends it, through the xApp's handler table."""
    body = json.dumps({"operation": op, "policy_type_id": "26001", "policy_instance_id": "k",
                       "payload": "" if payload is None else json.dumps(payload)}).encode()
    app.on_message(RmrMessage(A1_POLICY_REQ, body))
    mtype, resp = app.rts_out[-1]
    assert mtype == A1_POLICY_RESP
    return json.loads(resp)["status"]


def calls(app, kind):
    return [c for c in app.policy_calls if c[0] == kind]


def test_a1_fallback_applies_to_the_next_unprepared_handover(xapp):
    assert a1(xapp, {"fallback": "recomputation"}) == "OK"
    xapp.on_handover("7", CELL_A, CELL_B, time.time())       # nothing prepared
    assert calls(xapp, "Commit") == [("Commit", "edge-a", "s1", 1, "edge-b", "recomputation")]


def test_deleting_the_a1_instance_reverts_the_fallback(xapp):
    assert a1(xapp, {"fallback": "recomputation"}) == "OK"
    assert a1(xapp, None, op="DELETE") == "DELETED"
    xapp.on_handover("7", CELL_A, CELL_B, time.time())
    assert calls(xapp, "Commit")[0][5] == "ctho"             # the descriptor's fallback


def test_a_scheme_change_applies_to_the_next_decision(xapp):
    xapp.predictor_script.lead_s = 0.3
    xapp.control_cycle()
    assert [c[5] for c in calls(xapp, "Trigger")] == ["pallas"]
    xapp.reconfigure(load_controls(_controls(scheme="ctho")))   # the descriptor now says ctHO
    assert [c[0] for c in xapp.policy_calls] == ["Trigger", "Cancel"]
    xapp.control_cycle()
    assert len(calls(xapp, "Trigger")) == 1                  # ctHO never prepares
    xapp.on_handover("7", CELL_A, CELL_B, time.time())
    assert calls(xapp, "Commit")[0][5] == "ctho"


def test_a1_per_slice_rule_is_honoured_where_the_slice_is_known(xapp):
    xapp.control.note_slice("7", SLICE)
    assert a1(xapp, {"proactive": {"slices": {SLICE: False}}}) == "OK"
    xapp.predictor_script.lead_s = 0.3
    xapp.control_cycle()
    assert calls(xapp, "Trigger") == []                      # this UE's slice forbids it
    xapp.on_handover("7", CELL_A, CELL_B, time.time())
    assert calls(xapp, "Commit")[0][5] == "ctho"             # recovered by the fallback


def test_an_unknown_slice_is_judged_by_cell_rules_and_the_default(xapp):
    assert a1(xapp, {"proactive": {"slices": {SLICE: False}}}) == "OK"
    xapp.predictor_script.lead_s = 0.3
    xapp.control_cycle()
    assert len(calls(xapp, "Trigger")) == 1


def test_a1_per_cell_rule_cancels_a_prepared_attempt_on_the_next_cycle(xapp):
    xapp.predictor_script.lead_s = 0.3
    xapp.control_cycle()
    assert len(calls(xapp, "Trigger")) == 1
    assert a1(xapp, {"proactive": {"cells": {str(CELL_B): False}}}) == "OK"
    xapp.control_cycle()
    assert [c[0] for c in xapp.policy_calls] == ["Trigger", "Cancel"]
    xapp.on_handover("7", CELL_A, CELL_B, time.time())
    assert calls(xapp, "Commit")[0][5] == "ctho"


def test_a1_proactive_disabled_stops_the_next_trigger(xapp):
    assert a1(xapp, {"proactive": {"enabled": False}}) == "OK"
    xapp.predictor_script.lead_s = 0.3
    xapp.control_cycle()
    assert calls(xapp, "Trigger") == []


@pytest.mark.parametrize("payload, field, value, triggers", [
    ({"alpha": 0.0}, "alpha", 0.0, False),      # T_early only: the smallest window, not yet due
    ({"t_max_s": 0.1}, "t_max_s", 0.1, False),  # capped below the 0.2 s wanted: not yet due
    ({"dt_s": 0.25}, "dt_s", 0.25, True)])
def test_a1_window_knobs_reach_the_next_decision(xapp, payload, field, value, triggers):
    """With the descriptor's knobs this UE (0.3 s before its handover) triggers at once; each
    A1 knob changes the window of the very next cycle."""
    assert a1(xapp, payload) == "OK"
    assert getattr(xapp.engine.cfg, field) == value
    xapp.predictor_script.lead_s = 0.3
    xapp.control_cycle()
    assert len(calls(xapp, "Trigger")) == int(triggers)
    w = float(xapp.engine.last_window[xapp.engine._slot["s1"]])
    if field == "alpha":
        assert w == 0.0
    if field == "t_max_s":      # beyond T_max + the lookahead: not even evaluated this cycle
        assert w != w
    if field == "dt_s":
        assert w > 0 and w / 0.25 == pytest.approx(round(w / 0.25))


def test_with_the_descriptors_knobs_the_same_ue_triggers_at_once(xapp):
    xapp.predictor_script.lead_s = 0.3
    xapp.control_cycle()
    assert len(calls(xapp, "Trigger")) == 1
    assert float(xapp.engine.last_window[xapp.engine._slot["s1"]]) == pytest.approx(0.2)


def test_an_a1_error_changes_nothing(xapp):
    before = xapp.config
    assert a1(xapp, {"dt_s": 1e-9, "t_max_s": 60}) == "ERROR"
    assert xapp.config is before and xapp.engine.cfg.dt_s == 0.1


# --- issue 17's experiment knobs: a fixed window (descriptor) and the prediction lead (test mode)
@pytest.mark.parametrize("fixed, triggers, window", [(0.1, False, float("nan")), (1.0, True, 0.3)])
def test_a_descriptors_fixed_window_replaces_the_selected_one(xapp, fixed, triggers, window):
    """The same UE, 0.3 s before its handover, triggers at once with the selected window (0.2 s,
    test above); with controls.scheduler.fixed_window_s 0.1 s it waits, with 1 s it triggers at
    once with all 0.3 s it has."""
    c = _controls()
    c["scheduler"]["fixed_window_s"] = fixed
    xapp.reconfigure(load_controls(c))
    assert xapp.engine.cfg.fixed_window_s == fixed
    xapp.predictor_script.lead_s = 0.3
    xapp.control_cycle()
    assert len(calls(xapp, "Trigger")) == int(triggers)
    if triggers:
        assert float(xapp.engine.last_window[xapp.engine._slot["s1"]]) == pytest.approx(window, abs=0.02)


@pytest.mark.parametrize("hold_s, truth_cell, triggers", [
    (0.1, CELL_B, False),     # the correct prediction is held until 0.1 s before the handover
    (0.5, CELL_B, True),      # released: 0.3 s ahead is within the 0.5 s lead
    (0.1, CELL_A + 7, True),  # a wrong prediction (the UE really goes elsewhere) is never held
])
def test_the_hold_knob_delays_only_the_correct_prediction(xapp, hold_s, truth_cell, triggers):
    from xapp.hold import HoldCorrect
    now = time.time()
    hold = HoldCorrect(xapp.predictor_script, [("7", now + 0.3, CELL_A, truth_cell)], hold_s)
    xapp.control.predictor = hold
    xapp.predictor_script.lead_s = 0.3
    xapp.control_cycle()
    assert len(calls(xapp, "Trigger")) == int(triggers)
    assert hold.held == int(not triggers)


def test_the_hold_knob_in_batch_mode_and_after_the_last_handover():
    """A batch predictor's result is filtered by the trace clock; past the UE's last known
    handover nothing is held."""
    from xapp.hold import HoldCorrect

    class Batch:
        def __init__(self, preds):
            self.preds = preds

        def update(self, store):
            return type("R", (), {"ue_ids": ["7", "8"], "__len__": lambda s: 2,
                                  "get": lambda s, i: self.preds[i]})()

    p = Prediction(CELL_B, 0.0, 1.0, "x")
    clock = [100.0]
    h = HoldCorrect(Batch([p, p]), [("7", 103.0, CELL_A, CELL_B), ("8", 99.0, CELL_A, CELL_B)], 2.0,
                    clock=lambda: clock[0])
    res = h.update(None)
    assert [res.get(i) for i in range(len(res))] == [None, p]     # UE 8 is past its handover
    clock[0] = 101.5
    res = h.update(None)
    assert res.get(0) is p and h.held == 1
    assert not hasattr(HoldCorrect(Scripted(), [], 1.0), "update")   # per-UE predictor: no batch path
    with pytest.raises(ValueError):
        HoldCorrect(Scripted(), [], -1.0)


def test_the_hold_knob_needs_test_mode_and_the_handovers(capsys, monkeypatch):
    """pallas-xapp refuses --hold-correct-s without --handovers (or outside test mode) instead of
    running with a knob that has no effect."""
    import xapp.main as xmain
    from xapp.main import main
    monkeypatch.setattr(xmain, "_configure_logging", lambda level: None)   # keep the process's logging as it is
    cfg = str(REPO / "descriptors" / "config-file.json")
    assert main(["--mode", "test", "--config", cfg, "--trace", "x.e2trace", "--hold-correct-s", "1"]) == 2
    assert "--hold-correct-s" in capsys.readouterr().err
    assert main(["--mode", "live", "--config", cfg, "--hold-correct-s", "1", "--handovers", "p.json"]) == 2
