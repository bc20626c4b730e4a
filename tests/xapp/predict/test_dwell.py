"""Handover times from the learned dwell on the serving cell (issue 26: on real drives the
xApp named targets with no time, so nothing was prepared)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from xapp.drivetest import read_drive
from xapp.predict import PredictorConfig
from pallas_tools.evaluate import replay
from xapp.predict.maps import DwellModel, Knowledge

UCC = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "ucc-5g" / "Download" / "Driving"
needs_ucc = pytest.mark.skipif(not UCC.is_dir(), reason="the UCC 5G drives are not beside the repository")


def test_dwell_model_medians_fallback_and_signed_merge():
    d = DwellModel(bin_s=0.5, min_count=3)
    for x in (4.0, 5.0, 6.0, 30.0):
        d.add(1, 2, x)
    d.add(1, 3, 10.0)
    d.add(1, 2, float("nan"))          # ignored
    d.add(1, 2, -1.0)                  # ignored
    assert d.median(1, 2) == pytest.approx(5.25)          # bin [5, 5.5)
    # a pair seen fewer than min_count times takes the all-pairs median
    assert d.median(1, 3) == d.median(9, 9) == pytest.approx(6.25)
    assert math.isnan(DwellModel().median(1, 2))
    other = DwellModel()
    other.add(1, 2, 30.0)
    c = d.copy()
    c.merge(other, -1)                 # leave that drive out
    assert c.median(1, 2) == pytest.approx(5.25) and sum(c.pairs[(1, 2)].values()) == 3
    assert sum(d.pairs[(1, 2)].values()) == 4              # the copy is independent
    d.add(1, 2, 1e6)                    # beyond max_s: the last bin
    assert max(d.pairs[(1, 2)]) == int(d.max_s // d.bin_s)
    with pytest.raises(ValueError):
        DwellModel(bin_s=0.0)


def test_online_learning_records_entry_times_and_dwells():
    from xapp.drivetest import MeasurementReport
    k = Knowledge.create()
    cells = [1] * 5 + [2] * 8 + [3] * 3
    for i, c in enumerate(cells):
        k.observe(MeasurementReport(ue_id="u", time=float(i), serving_cell=c))
    # entered cell 3 between t = 12 and 13; dwell on 2: from 4.5 to 12.5
    assert k.entered("u") == pytest.approx(12.5)
    assert sum(k.dwell.pairs[(2, 3)].values()) == 1 and k.dwell.median(2, 3) == pytest.approx(8.25)
    assert (1, 2) not in k.dwell.pairs               # the first dwell began before the UE was seen
    k.forget("u")
    assert math.isnan(k.entered("u"))


@needs_ucc
def test_a_real_drive_gets_dwell_timed_predictions_never_sooner_than_the_floor():
    files = sorted(UCC.glob("*.csv"))
    drive = read_drive(next(f for f in files if f.stem == "B_2020.01.16_07.26.43"))
    history = [read_drive(f) for f in files if f.stem != drive.path.stem][:6]
    kn = Knowledge.from_drives(history)
    # every handover after a drive's first one is a learned dwell
    assert sum(kn.dwell.all.values()) == sum(max(0, len(d.handovers) - 1) for d in history)
    cfg = PredictorConfig()
    on = replay(drive, kn.copy(), cfg, ["combined"])["combined"]
    off = replay(drive, kn.copy(), replace(cfg, time_from_dwell=False), ["combined"])["combined"]
    dw = np.array([s == "combined:dwell" for s in on.source])
    assert dw.sum() > 50
    assert np.all(np.isfinite(on.t_ho[dw])) and np.all(on.t_ho[dw] >= on.t[dw] + cfg.dwell_min_lead_s - 1e-9)
    # the same instants without the dwell: the target alone, no time
    assert all(s in ("combined:history", "") for s in np.array(off.source)[dw])
    assert np.all(np.isnan(off.t_ho[dw]))
    assert np.array_equal(on.target, off.target)       # the dwell times; it never changes the target
