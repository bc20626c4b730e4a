import math

import numpy as np
import pytest

from pallas_tools.radio import (RadioConfig, generate_drive, generate_drives, hex_network, line_network,
                                manhattan_route, straight_route, uma_path_loss_db)


def test_uma_path_loss_matches_tr38901_formula():
    d3d = 100.0
    d2d = math.sqrt(d3d ** 2 - 23.5 ** 2)
    # NLOS': 13.54 + 39.08 log10(100) + 20 log10(3.5) = 102.58 dB (dominates the LOS value 82.9 dB)
    assert uma_path_loss_db(np.array([d2d]), 3.5, 25.0, 1.5, los=False)[0] == pytest.approx(102.58, abs=0.01)
    assert uma_path_loss_db(np.array([d2d]), 3.5, 25.0, 1.5, los=True)[0] == pytest.approx(82.88, abs=0.01)
    d = np.linspace(20, 2000, 50)
    assert np.all(np.diff(uma_path_loss_db(d, 3.5, 25.0, 1.5, los=False)) > 0)


def test_shadowing_statistics_and_spatial_correlation():
    net = hex_network(rows=3, cols=3, seed=3)
    x = np.linspace(0, 1000, 2001)
    s = net.shadowing_db(x, np.full_like(x, 300.0))[:, 0]
    assert 3.5 < s.std() < 8.5                    # sigma 6 dB (one finite sample)
    lag = lambda k: np.corrcoef(s[:-k], s[k:])[0, 1]  # noqa: E731  (0.5 m spacing)
    assert lag(10) > 0.8                          # 5 m apart: strongly correlated
    assert lag(200) < 0.5                         # 100 m apart: mostly decorrelated (d_cor = 50 m)


def test_deterministic_by_seed():
    _, a = generate_drives(n=1, duration_s=60, seed=5)
    _, b = generate_drives(n=1, duration_s=60, seed=5)
    _, c = generate_drives(n=1, duration_s=60, seed=6)
    assert [r.rsrp_dbm for r in a[0].reports] == [r.rsrp_dbm for r in b[0].reports]
    assert [r.rsrp_dbm for r in a[0].reports] != [r.rsrp_dbm for r in c[0].reports]


def test_reports_are_what_e2_delivers_and_handovers_follow_a3():
    cfg = RadioConfig()
    net = hex_network(seed=2, cfg=cfg)
    route = manhattan_route(net, 3000.0, 14.0, seed=2)
    res = generate_drive(net, route, seed=2)
    times = np.array([r.time for r in res.reports])
    assert np.allclose(np.diff(times), cfg.report_period_s)
    fixes = [r for r in res.reports if r.lat == r.lat]
    assert len(fixes) == pytest.approx(len(res.reports) * cfg.report_period_s / cfg.gps_period_s, abs=2)
    r = res.reports[10]
    assert r.serving_pci >= 0 and all(nb.pci >= 0 and nb.cell_id == -1 for nb in r.neighbours)
    assert 0 < len(r.neighbours) <= cfg.max_neighbours
    assert len(res.handovers) > 3
    idx = {c.cell_id: c.index for c in net.cells}
    thr = cfg.a3_offset_db + cfg.a3_hysteresis_db
    for h in res.handovers:
        t_rep = h.time - cfg.ho_delay_s                      # TTT expiry: the measurement report
        k = int(math.floor(t_rep / cfg.step_s + 1e-9))       # last sample before it
        s, tgt = idx[h.source_cell], idx[h.target_cell]
        k0 = int(math.ceil((t_rep - cfg.a3_ttt_s) / cfg.step_s - 1e-9))   # the entry sample
        d = res.l3_rsrp[k0:k + 1, tgt] - res.l3_rsrp[k0:k + 1, s]
        assert np.all(d > thr), "entering condition must hold for the whole TTT"
        assert not (res.l3_rsrp[k0 - 1, tgt] - res.l3_rsrp[k0 - 1, s] > thr)
        assert res.serving[k] == s
        assert res.serving[int(math.ceil(h.time / cfg.step_s - 1e-9))] == tgt


def test_straight_line_network_single_handover():
    cfg = RadioConfig(shadow_sigma_db=0.0, meas_noise_db=0.3)
    net = line_network(2, 500.0, cfg=cfg)
    res = generate_drive(net, straight_route((30.0, 0.0), 90.0, 440.0, 14.0), seed=1)
    assert [(h.source_cell, h.target_cell) for h in res.handovers] == [(net.cells[0].cell_id, net.cells[1].cell_id)]
    x_ho = res.x_m[np.searchsorted(res.t, res.handovers[0].time)]
    assert 250.0 < x_ho < 330.0      # past the midpoint by the A3 offset + hysteresis
