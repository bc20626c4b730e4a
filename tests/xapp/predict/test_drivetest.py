import math

import numpy as np
import pytest

from xapp.drivetest import bearing_deg, find_handovers, monotone_times, read_drive, read_drives
from xapp.tracks import MeasurementReport, UETrack

HEADER = ("Timestamp,Longitude,Latitude,Speed,Operatorname,CellID,NetworkMode,RSRP,RSRQ,SNR,CQI,RSSI,"
          "DL_bitrate,UL_bitrate,State,PINGAVG,PINGMIN,PINGMAX,PINGSTDEV,PINGLOSS,CELLHEX,NODEHEX,"
          "LACHEX,RAWCELLID,NRxRSRP,NRxRSRQ")


def row(ts, lon, lat, spd, rsrp, state, node, raw, nrsrp="-", nrsrq="-", mode="LTE"):
    return (f"{ts},{lon},{lat},{spd},B,1,{mode},{rsrp},-10,5.0,9,-80,1,1,{state},-,-,-,-,-,1,{node},9CBA,"
            f"{raw},{nrsrp},{nrsrq}")


def test_monotone_times_spreads_repeats_and_clamps_backwards():
    t = monotone_times([10, 10, 12, 11, 13, 13, 13])
    assert np.all(np.diff(t) > 0)
    assert t.tolist()[:2] == [10.0, 10.5]
    # the backwards 11 is clamped to 12, forming a run of two inside second 12
    assert t[2] == 12.0 and t[3] == pytest.approx(12.5)
    assert t[4:].tolist() == pytest.approx([13.0, 13 + 1 / 3, 13 + 2 / 3])


def test_bearing():
    assert bearing_deg(0.0, 0.0, 1.0, 0.0) == pytest.approx(0.0)
    assert bearing_deg(0.0, 0.0, 0.0, 1.0) == pytest.approx(90.0)
    assert bearing_deg(0.0, 0.0, -1.0, 0.0) == pytest.approx(180.0)


def test_synthetic_csv(tmp_path):
    lines = [HEADER,
             row("2020.01.01_10.00.00", -8.5, 51.9, 36, -80, "D", "AA", 100, "-85.0", "-12.0"),
             row("2020.01.01_10.00.00", -8.5, 51.9, 36, -81, "D", "AA", 100),
             row("2020.01.01_10.00.02", -8.5, 51.901, 36, -300, "D", "AA", 101, "-48.0", "-225.0"),
             "garbage,row",
             row("2020.01.01_10.00.03", -8.5, 51.901, 36, -90, "I", "BB", 200),
             row("2020.01.01_10.00.04", -8.5, 51.902, 36, -90, "D", "BB", 201, mode="UMTS")]
    p = tmp_path / "B_test.csv"
    p.write_text("\n".join(lines) + "\n")
    d = read_drive(p)
    assert d.ue_id == "B_test"
    assert len(d.reports) == 5  # the garbage row is dropped
    r0, r1, r2, r3, r4 = d.reports
    assert r1.time == pytest.approx(r0.time + 0.5)
    assert r0.speed_mps == pytest.approx(10.0)
    assert r0.neighbours[0].pci == -1 and r0.neighbours[0].rsrp_dbm == -85.0
    assert r1.neighbours == ()
    assert math.isnan(r2.rsrp_dbm)  # -300 dBm is outside the reporting range
    assert math.isnan(r2.neighbours[0].rsrq_db)
    assert math.isnan(r0.heading_deg) and r2.heading_deg == pytest.approx(0.0)
    assert not r3.connected and r4.connected
    hos = d.handovers
    assert [(h.source_cell, h.target_cell, h.idle, h.kind) for h in hos] == [
        (100, 101, False, "lte-intra-enb"), (101, 200, True, "lte-inter-enb"), (200, 201, True, "lte-3g")]
    assert d.fix_rows == [0, 2, 4]
    d2 = read_drive(p, fixes_only=True)
    assert math.isnan(d2.reports[1].lat) and d2.reports[2].lat == pytest.approx(51.901)


def test_not_a_drive(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError):
        read_drive(p)


def test_find_handovers_plain_reports():
    reps = [MeasurementReport(time=float(i), ue_id="u", serving_cell=c) for i, c in enumerate([1, 1, 2, 2, 1])]
    hos = find_handovers(reps)
    assert [(h.time, h.source_cell, h.target_cell, h.kind) for h in hos] == [(2.0, 1, 2, "unknown"), (4.0, 2, 1, "unknown")]


def test_real_drive(ucc_dir):
    p = ucc_dir / "Download" / "Driving" / "B_2020.02.14_09.38.22.csv"
    d = read_drive(p)
    assert d.ue_id == "B_2020.02.14_09.38.22"
    t = np.array([r.time for r in d.reports])
    assert np.all(np.diff(t) > 0)
    assert d.reports[0].serving_cell == 87761409 and d.reports[0].e2_node == "53B22"
    assert d.reports[0].neighbours[0].rsrp_dbm == -89.0
    assert all(h.source_cell != h.target_cell for h in d.handovers)
    assert len(d.handovers) > 5
    # it feeds a UETrack without error
    tr = UETrack(d.ue_id, capacity=64)
    for r in d.reports:
        tr.append(r)
    assert len(tr.view().time) == 64


@pytest.mark.slow
def test_all_real_drives_match_the_notes(ucc_dir):
    ds = read_drives(ucc_dir)
    assert len(ds) == 39
    assert sum(len(d.reports) for d in ds) == 65815
    hos = [h for d in ds for h in d.handovers]
    assert len(hos) == 1463
    assert sum(h.kind == "lte-intra-enb" for h in hos) == 325
