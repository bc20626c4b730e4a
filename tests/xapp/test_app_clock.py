"""The xApp's trace clock: ``PallasXapp.offset`` (wall clock minus trace clock) is the one the
control loop reads; setting it after construction (a replay anchored later, the load benchmark)
moves the control loop's clock too, so UEs heard on the trace clock are not taken as silent."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

from xapp.tracks import MeasurementReport, NeighbourMeas

REPO = Path(__file__).resolve().parents[2]


class _NoPolicy:
    on_reply = None
    agents: dict = {}

    def close(self) -> None:
        pass


def _app():
    from xapp.app import EventLog, PallasXapp
    from xapp.config import load_controls

    controls = copy.deepcopy(json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"])
    controls["predictor"] = {"ue_silence_s": 10.0}
    return PallasXapp(load_controls(controls), transport=None, policy=_NoPolicy(), telemetry=False,
                      events=EventLog(None, keep=False))


def test_offset_set_after_construction_is_the_control_loops_clock():
    app = _app()
    app.offset = time.time() - 1000.0                 # trace clock 1000 s now
    assert app.control.offset == app.offset
    assert abs(app.control.now() - 1000.0) < 5.0
    assert abs(app.now() - 1000.0) < 5.0


def test_ue_heard_on_the_trace_clock_survives_a_cycle():
    app = _app()
    app.offset = time.time() - 1000.0
    r = MeasurementReport(1000.0, "ue1", 101, -90.0, serving_pci=1,
                          neighbours=(NeighbourMeas(pci=2, rsrp_dbm=-95.0),), lat=51.9, lon=-8.47)
    app.control.tracks.add(r)
    app.control.on_report(r)
    app.control_cycle()
    assert "ue1" in app.ues                          # not silent: heard 0 s ago on the trace clock
    assert len(app.tracks) == 1


class _SayAt:
    """A per-UE predictor naming cell 202 at trace time ``t_ho``."""

    def __init__(self, t_ho: float) -> None:
        self.t_ho = t_ho

    def observe(self, r) -> None:
        pass

    def predict(self, track, now):
        from xapp.predict.base import Prediction
        return Prediction(target_cell=202, t_ho=self.t_ho, confidence=0.9, source="test")


def test_a_handover_scores_the_latest_predicted_time_and_feeds_the_trigger_margin():
    """The control loop keeps each UE's latest predicted t_HO; the handover (first report from
    a new cell) hands predicted - actual to the engine (xapp/scheduler/ho_timing.py), once,
    and logs it with the handover; a handover without a prediction adds nothing."""
    from xapp.app import EventLog
    app = _app()
    app.control.events = EventLog(None, keep=100)
    app.offset = time.time() - 1000.0
    app.control.predictor = _SayAt(1010.0)
    r = MeasurementReport(1000.0, "ue1", 101, -90.0, serving_pci=1,
                          neighbours=(NeighbourMeas(pci=2, rsrp_dbm=-95.0),))
    app.control.tracks.add(r)
    app.control.on_report(r)
    app.control_cycle()
    assert app.ues["ue1"].predicted_t_ho == 1010.0
    app.control.on_report(MeasurementReport(1007.0, "ue1", 202, -88.0, serving_pci=2))
    assert app.engine.ho_timing.errors.tolist() == [3.0]           # the HO came 3 s early
    ho = [e for e in app.control.events.events if e["kind"] == "handover"][-1]
    assert ho["timing_error_s"] == 3.0 and ho["predicted_t_ho"] == 1010.0
    app.control.on_report(MeasurementReport(1008.0, "ue1", 101, -88.0, serving_pci=1))
    assert app.engine.ho_timing.n == 1                             # no prediction since: nothing
