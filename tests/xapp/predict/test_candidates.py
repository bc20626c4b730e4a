"""Ranked, calibrated candidate targets (issue 43 item 2) and the dwell source's timing
evidence (item 3): the residual dwell, the edge evidence, the ranking helpers, the facade's
candidates and the evaluation's leave-one-drive-out candidate reliability."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pallas_tools.evaluate import candidate_reliability
from xapp.predict import Calibrator, HandoverPredictor, PredictorConfig
from xapp.predict.combined import TOP_K, edge_evidence, put_first, rank_candidates
from xapp.predict.maps import DwellModel, Knowledge
from xapp.tracks import MeasurementReport, NeighbourMeas, UETrack, batch_of_one


def rep(t, cell=1, rsrp=-90.0, nbs=(), ue="u"):
    return MeasurementReport(time=t, ue_id=ue, serving_cell=cell, rsrp_dbm=rsrp, neighbours=tuple(nbs))


# ---------------------------------------------------------------- residual dwell
def test_residual_median_starts_at_the_median_and_moves_out_with_the_elapsed_time():
    d = DwellModel(bin_s=1.0, min_count=3)
    for x in (2.0, 3.0, 4.0, 20.0, 40.0, 60.0):
        d.add(1, 2, x)
    r = d.residual_median(1, 2, np.array([0.0, 5.0, 30.0]))
    # all six: the median bin is [4, 5): 4.5 (as median()); past 5 s: of 20, 40, 60 the median
    # is 40 (bin [40, 41): 40.5); past 30 s: 40 and 60 are left, fewer than min_count -> all pairs
    assert r[0] == pytest.approx(d.median(1, 2)) == pytest.approx(4.5)
    assert r[1] == pytest.approx(40.5)
    assert r[2] == pytest.approx(40.5)            # all pairs (the same six dwells): 40 and 60 left
    d.add(3, 4, 1.0)
    # pair (3, 4) has one dwell: the all-pairs histogram answers
    assert d.residual_median(3, 4, np.array([0.0]))[0] == pytest.approx(d.median(9, 9))
    # nothing dwelt longer than 100 s: no time
    assert math.isnan(d.residual_median(1, 2, np.array([100.0]))[0])
    assert math.isnan(DwellModel().residual_median(1, 2, np.array([0.0]))[0])


def test_residual_median_is_never_before_the_elapsed_time():
    d = DwellModel(bin_s=0.5, min_count=1)
    for x in np.linspace(1.0, 50.0, 40):
        d.add(1, 2, float(x))
    e = np.linspace(0.0, 49.0, 50)
    r = d.residual_median(1, 2, e)
    assert np.all(r >= e) and np.all(np.diff(r) >= -1e-9)


# ---------------------------------------------------------------- edge evidence
def _view(reps):
    tr = UETrack("u", capacity=16, max_neighbours=1)
    for r in reps:
        tr.append(r)
    return batch_of_one(tr.view())


def test_edge_evidence_from_a_close_neighbour_or_a_falling_serving_cell():
    now = np.array([4.0])
    flat_far = _view([rep(float(k), rsrp=-90.0, nbs=[NeighbourMeas(rsrp_dbm=-100.0)]) for k in range(5)])
    assert not edge_evidence(flat_far, now, 6.0, 1.0, 0.5)[0]
    close = _view([rep(float(k), rsrp=-90.0, nbs=[NeighbourMeas(rsrp_dbm=-89.0)]) for k in range(5)])
    assert edge_evidence(close, now, 6.0, 1.0, 0.5)[0]            # Mn - Mp = 1 dB >= 1 dB
    assert not edge_evidence(close, now, 6.0, 1.5, 0.5)[0]
    falling = _view([rep(float(k), rsrp=-90.0 - k) for k in range(5)])   # -1 dB/s, no neighbour
    assert edge_evidence(falling, now, 6.0, 1.0, 0.5)[0]
    assert not edge_evidence(falling, now, 6.0, 1.0, 1.5)[0]
    # the fall must be on the current serving cell: a handover resets the window
    other = _view([rep(float(k), cell=2, rsrp=-80.0 - 3 * k) for k in range(3)]
                  + [rep(3.0, rsrp=-90.0), rep(4.0, rsrp=-90.0)])
    assert not edge_evidence(other, now, 6.0, 1.0, 0.5)[0]
    nan = _view([rep(float(k), rsrp=math.nan) for k in range(5)])
    assert not edge_evidence(nan, now, 6.0, 1.0, 0.5)[0]


# ---------------------------------------------------------------- ranking helpers
def test_rank_candidates_dedupes_orders_and_pads():
    cells = np.array([[5, 6, 5, 7], [3, -1, 3, 3]])
    ok = np.array([[True, True, True, False], [True, False, True, True]])
    score = np.array([[0.2, 0.5, 0.2, 9.0], [0.4, 0.0, 0.4, 0.4]])
    c, s = rank_candidates(cells, ok, score, 3)
    assert c.tolist() == [[6, 5, -1], [3, -1, -1]]
    assert s.tolist() == [[0.5, 0.2, 0.0], [0.4, 0.0, 0.0]]
    # equal scores keep column order
    c2, _ = rank_candidates(np.array([[8, 9]]), np.array([[True, True]]), np.array([[0.3, 0.3]]), 3)
    assert c2.tolist() == [[8, 9, -1]]


def test_put_first_moves_up_or_prepends_and_empties_rows_without_a_target():
    cells = np.array([[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3]])
    probs = np.array([[0.5, 0.3, 0.1]] * 4)
    first = np.array([1, 3, 9, 2])
    fp = np.array([0.6, 0.2, 0.05, 0.4])
    has = np.array([True, True, True, False])
    c, p = put_first(cells, probs, first, fp, has)
    assert c.tolist() == [[1, 2, 3], [3, 1, 2], [9, 1, 2], [-1, -1, -1]]
    assert p.tolist() == [[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.05, 0.5, 0.3], [0.0, 0.0, 0.0]]


# ---------------------------------------------------------------- the facade's candidates
def _knowledge():
    k = Knowledge.create()
    for _ in range(6):
        k.trans.add(-1, 1, 2)
    for _ in range(3):
        k.trans.add(-1, 1, 3)
    k.trans.add(-1, 1, 4)
    return k


def test_predictions_carry_ranked_calibrated_candidates_led_by_the_target():
    cfg = PredictorConfig(time_from_dwell=False)
    pred = HandoverPredictor(cfg, _knowledge(), learn_online=False)
    tr = UETrack("u", capacity=8)
    for t in (0.0, 1.0, 2.0):
        tr.append(rep(t))
    p = pred.predict(tr, 2.0)
    cells = [c for c, _ in p.candidates]
    assert len(p.candidates) == TOP_K and cells[0] == p.target_cell == 2 and cells[1:] == [3, 4]
    probs = [q for _, q in p.candidates]
    assert probs[0] == pytest.approx(p.confidence) and probs[0] > probs[1] > probs[2] > 0
    assert sum(probs) <= 1.0 + 1e-9
    # calibrators for ranks 2 and 3 ("combined@2", "combined@3") apply to those ranks only
    flat = Calibrator(np.array([-math.inf, math.inf]), np.array([0.07]))
    cal = HandoverPredictor(cfg, _knowledge(), calibrators={"combined@2": flat.to_dict(), "combined@3": flat},
                            learn_online=False)
    q = cal.predict(tr, 2.0)
    assert q.candidates[0][1] == pytest.approx(p.confidence)
    assert [x for _, x in q.candidates[1:]] == pytest.approx([0.07, 0.07])


def test_dwell_time_needs_edge_evidence_when_asked():
    k = _knowledge()
    for _ in range(5):
        k.dwell.add(1, 2, 3.0)
    # the UE entered cell 1 at t = 0.5 (from cell 9); 3 s dwell -> due at 3.5
    reps = [rep(0.0, cell=9)] + [rep(float(t), rsrp=-90.0, nbs=[NeighbourMeas(rsrp_dbm=-110.0)]) for t in (1, 2, 3)]
    for edge, want in ((False, "combined:dwell"), (True, "combined:history")):
        cfg = PredictorConfig(dwell_edge=edge, dwell_residual=True)
        pred = HandoverPredictor(cfg, k.copy(), learn_online=False)
        tr = UETrack("u", capacity=8, max_neighbours=1)
        for r in reps:
            tr.append(r)
        p = pred.raw(tr.view(), 3.0, "u")
        assert p.source == want, edge
        if want == "combined:dwell":
            assert p.t_ho == pytest.approx(3.5 + 0.25, abs=0.26)
        else:
            assert math.isnan(p.t_ho)


# ---------------------------------------------------------------- evaluation's reliability
def test_candidate_reliability_is_left_one_drive_out_and_per_rank():
    rng = np.random.default_rng(3)
    per = []
    for _ in range(4):
        pairs = []
        for _ in range(400):
            q = float(rng.uniform())
            pairs.append((0, q, bool(rng.uniform() < q)))          # rank 1 calibrated as is
            q2 = float(rng.uniform(0, 0.5))
            pairs.append((1, q2, bool(rng.uniform() < q2 / 2)))   # rank 2 overconfident by 2x
        per.append({"cand_pairs": pairs})
    out = candidate_reliability(per)
    assert sum(b["n"] for b in out["table"]) == 4 * 800
    assert set(out["by_rank"]) == {f"rank{j + 1}" for j in range(TOP_K)} and out["by_rank"]["rank3"] == []
    # after calibration rank 2's bins say what they observe (within sampling noise)
    for b in out["by_rank"]["rank2"]:
        if b["n"] >= 200:
            assert abs(b["mean_conf"] - b["accuracy"]) < 0.08
    assert out["max_gap"] < 0.1
