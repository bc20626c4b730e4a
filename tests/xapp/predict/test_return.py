"""The return vote (issue 43, right target 2 s ahead): ``maps.ReturnModel`` learns how often
the next handover goes back to the previous cell by the time spent on the current one, and the
combination votes for that cell in the first ``return_max_s`` seconds on a cell, also where the
successor table never saw that (previous, serving) pair return."""

from __future__ import annotations

import math

import numpy as np
import pytest

from xapp.drivetest import Drive, Handover
from xapp.predict import HandoverPredictor, PredictorConfig
from xapp.predict.config import HistoryConfig
from xapp.predict.maps import Knowledge, ReturnModel, TransitionModel
from xapp.tracks import MeasurementReport, UETrack


def rep(t, cell, ue="u"):
    return MeasurementReport(time=float(t), ue_id=ue, serving_cell=cell, rsrp_dbm=-90.0)


# ---------------------------------------------------------------- the model
def test_return_odds_fall_with_the_time_spent_on_the_cell():
    m = ReturnModel(bin_s=1.0, prior=0.0)
    for d in (1.0, 2.0, 2.5, 3.0):
        m.add(d, True)
    for d in (2.0, 20.0, 40.0, 60.0):
        m.add(d, False)
    p = m.p_return(np.array([0.0, 2.0, 10.0, 100.0]))
    # all 8 dwells: 4 returns; from 2 s (bin [2, 3) on): 3 returns of 7; from 10 s: none of 3
    assert p[:3].tolist() == pytest.approx([0.5, 3 / 7, 0.0])
    # past every dwell, with no prior to lean on: the overall share
    assert p[3] == pytest.approx(0.5)
    assert math.isnan(m.p_return(np.array([np.nan]))[0])


def test_prior_pulls_sparse_bins_towards_the_overall_share_and_no_data_gives_zero():
    m = ReturnModel(bin_s=1.0, prior=4.0)
    for _ in range(6):
        m.add(1.0, True)
    for _ in range(2):
        m.add(1.0, False)
    m.add(50.0, True)
    # overall 7/9; past 10 s: one return of one dwell -> (1 + 4 * 7/9) / (1 + 4)
    assert m.p_return(np.array([10.0]))[0] == pytest.approx((1 + 4 * 7 / 9) / 5)
    assert m.p_return(np.array([0.0]))[0] == pytest.approx((7 + 4 * 7 / 9) / 13)
    assert ReturnModel().p_return(np.array([0.0, 5.0])).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError):
        ReturnModel(bin_s=0.0)


def test_merge_with_a_sign_takes_a_drive_out_and_copies_are_independent():
    a, b = ReturnModel(bin_s=1.0, prior=0.0), ReturnModel(bin_s=1.0, prior=0.0)
    a.add(1.0, True)
    a.add(1.0, False)
    b.add(1.0, True)
    b.add(1.0, True)
    c = a.copy()
    c.merge(b)
    assert c.p_return(np.array([0.0]))[0] == pytest.approx(0.75)
    c.merge(b, -1)
    assert c.p_return(np.array([0.0]))[0] == pytest.approx(0.5)
    c.add(1.0, True)
    assert a.p_return(np.array([0.0]))[0] == pytest.approx(0.5)


# ---------------------------------------------------------------- what feeds it
def test_drives_and_online_reports_teach_returns_with_their_dwells():
    # offline: 5 -> 1 (t 10) -> 5 (t 13): a return after 3 s on cell 1; then 5 -> 7 after 5 s
    reps = [rep(t, c) for t, c in [(9, 5), (10, 1), (12, 1), (13, 5), (17, 5), (18, 7)]]
    hos = [Handover(10.0, 5, 1, False, 1, 9.0, "lte-inter-enb"),
           Handover(13.0, 1, 5, False, 3, 12.0, "lte-inter-enb"),
           Handover(18.0, 5, 7, False, 5, 17.0, "lte-inter-enb")]
    k = Knowledge.create()
    k.learn_drive(Drive("u", None, reps, hos))
    assert sum(k.returns.back.values()) == 1 and sum(k.returns.on.values()) == 1
    assert list(k.returns.back) == [int(3.0 // k.returns.bin_s)]
    assert list(k.returns.on) == [int(5.0 // k.returns.bin_s)]
    # online, causal: the same sequence report by report
    on = Knowledge.create()
    for r in reps:
        on.observe(r)
    assert on.returns.back == k.returns.back and on.returns.on == k.returns.on
    # a UE that is forgotten starts afresh: its next change has no previous cell, no return
    on.forget("u")
    on.observe(rep(30, 7))
    on.observe(rep(31, 5))
    assert sum(on.returns.back.values()) + sum(on.returns.on.values()) == 2


# ---------------------------------------------------------------- the vote
def _knowledge(returns: int = 8, elsewhere: int = 2) -> Knowledge:
    k = Knowledge.create()
    for _ in range(6):
        k.trans.add(-1, 1, 2)          # cell 1 hands to 2; it never handed back to 9
    for _ in range(returns):
        k.returns.add(5.0, True)
    for _ in range(elsewhere):
        k.returns.add(40.0, False)
    return k


def _track():
    tr = UETrack("u", capacity=16)
    for t, c in [(0, 9), (1, 9), (2, 1), (3, 1), (4, 1)]:
        tr.append(rep(t, c))
    return tr


@pytest.mark.parametrize("w, now, want", [(0.0, 4.0, 2), (3.0, 4.0, 9), (3.0, 8.0, 2)])
def test_the_previous_cell_wins_early_on_a_cell_only_with_the_vote(w, now, want):
    cfg = PredictorConfig(w_return=w, return_max_s=6.0, time_from_dwell=False)
    pred = HandoverPredictor(cfg, _knowledge(), learn_online=False)
    tr = _track()
    for t in range(5, int(now) + 1):
        tr.append(rep(t, 1))
    p = pred.raw(tr.view(), now, "u")
    # entered cell 1 at 1.5 s: 2.5 s on it at now = 4 (odds 0.8, vote 2.4 > the table's 1 for
    # cell 2), 6.5 s at now = 8 (no vote)
    assert p.target_cell == want
    cells = [c for c, _ in p.candidates]
    assert (9 in cells) == (w > 0 and now - 1.5 < 6.0)


def test_the_vote_weighs_the_learned_odds():
    cfg = PredictorConfig(w_return=1.0, time_from_dwell=False)
    # the table gives 2 probability 1; odds of return 0.9 -> 9 loses, 0.9 x 2 -> 9 wins
    low = HandoverPredictor(cfg, _knowledge(returns=9, elsewhere=1), learn_online=False)
    assert low.raw(_track().view(), 4.0, "u").target_cell == 2
    high = HandoverPredictor(PredictorConfig(w_return=2.0, time_from_dwell=False),
                             _knowledge(returns=9, elsewhere=1), learn_online=False)
    assert high.raw(_track().view(), 4.0, "u").target_cell == 9


def test_config_checks_and_the_vote_is_off_by_default():
    with pytest.raises(ValueError):
        PredictorConfig.from_dict({"w_return": -1.0})
    assert PredictorConfig().w_return == 0.0 and PredictorConfig().history.order == 2


# ---------------------------------------------------------------- the route
def test_a_longer_route_tells_apart_what_one_previous_cell_does_not():
    tm = TransitionModel(smoothing=0.5, backoff_weight=1.0)
    # (7, 5, 1) -> 2 three times; (8, 5, 1) -> 3 three times: (5, 1) alone is a tie
    for _ in range(3):
        tm.add(5, 1, 2, earlier=(7,))
        tm.add(5, 1, 3, earlier=(8,))
    p2 = tm.probs_route((5, 1))
    assert p2 == tm.probs(1, 5) and p2[2] == pytest.approx(p2[3])
    a, b = tm.probs_route((7, 5, 1)), tm.probs_route((8, 5, 1))
    assert max(a, key=a.get) == 2 and max(b, key=b.get) == 3
    # (3 + 1 * 0.5) / (3 + 1): the route's counts smoothed towards the two-cell table
    assert a[2] == pytest.approx((3 + p2[2]) / 4) and sum(a.values()) == pytest.approx(1.0)
    # a route never seen backs off to the shorter one; a fourth cell goes one step further
    assert tm.probs_route((9, 5, 1)) == p2
    tm.add(5, 1, 3, earlier=(4, 7))
    c = tm.probs_route((4, 7, 5, 1))
    assert c[3] > tm.probs_route((7, 5, 1))[3]
    assert tm.probs_route((1,)) == tm.probs(1)
    # merge with a sign takes the routes out as well
    t2 = tm.copy()
    t2.merge(tm, -1)
    assert t2.probs_route((7, 5, 1)) == {}


def test_knowledge_learns_routes_offline_and_online_and_forgets_the_ue():
    seq = [(9, 5), (10, 1), (13, 5), (16, 6), (19, 1), (22, 2)]
    reps = [rep(t, c) for t, c in seq]
    hos = [Handover(float(t), a, b, False, i + 1, float(t) - 1, "lte-inter-enb")
           for i, ((t, b), (_, a)) in enumerate(zip(seq[1:], seq[:-1]))]
    off = Knowledge.create()
    off.learn_drive(Drive("u", None, reps, hos))
    on = Knowledge.create()
    for r in reps:
        on.observe(r)
    # 5 1 5 6 1 2: routes (5, 1, 5) -> 6, (5, 1, 5, 6) -> 1, (1, 5, 6, 1) -> 2, ...
    for tm in (off.trans, on.trans):
        assert tm.nk[(5, 1, 5)] == {6: 1}
        assert tm.nk[(1, 5, 6, 1)] == {2: 1} and tm.nk[(5, 6, 1)] == {2: 1}
        assert all(len(k) <= TransitionModel.MAX_ORDER for k in tm.nk)
    assert on.trans.nk == off.trans.nk
    assert on.route("u") == (5, 6, 1, 2)
    on.forget("u")
    assert on.route("u") == ()


def test_the_predictor_takes_the_route_with_order_4_only():
    k = Knowledge.create()
    for _ in range(3):
        k.trans.add(5, 1, 2, earlier=(7,))
        k.trans.add(5, 1, 3, earlier=(8,))
    k.trans.add(5, 1, 3)                  # without the route, 3 leads
    got = {}
    for order in (2, 4):
        kn = k.copy()
        pred = HandoverPredictor(PredictorConfig(history=HistoryConfig(order=order), time_from_dwell=False), kn,
                                 learn_online=False)
        tr = UETrack("u", capacity=16)
        for t, c in [(0, 7), (2, 5), (4, 1), (5, 1)]:
            r = rep(t, c)
            kn.observe(r)
            tr.append(r)
        got[order] = pred.raw(tr.view(), 5.0, "u").target_cell
    assert got == {2: 3, 4: 2}
    with pytest.raises(ValueError):
        PredictorConfig.from_dict({"history": {"order": 5}})
