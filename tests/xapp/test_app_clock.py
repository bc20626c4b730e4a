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
