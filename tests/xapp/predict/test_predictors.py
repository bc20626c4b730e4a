import math

import numpy as np
import pytest

from xapp.predict import (A3Config, A3Forecaster, AssociationMap, Calibrator, CVHPredictor, HandoverPredictor,
                          HistoryPredictor, Knowledge, NeighbourRelations, Prediction, PredictorConfig, Stabiliser,
                          TransitionModel, theil_sen)
from xapp.predict.config import CVHConfig, StabilityConfig
from xapp.predict.cvh import PlacesPredictor
from xapp.predict.maps import HandoverPlaces, LocalFrame
from pallas_tools.radio import RadioConfig, generate_drive, line_network, straight_route
from xapp.tracks import MeasurementReport, NeighbourMeas, UETrack


def border_drive(seed=1, noise_db=0.0, speed=14.0, x0=30.0):
    """Two omni sites 500 m apart, UMa path loss, no shadowing: one A3 handover near x = 280 m."""
    cfg = RadioConfig(shadow_sigma_db=0.0, meas_noise_db=noise_db)
    net = line_network(2, 500.0, cfg=cfg)
    res = generate_drive(net, straight_route((x0, 0.0), 90.0, 470.0 - x0, speed), seed=seed)
    return net, cfg, res


def a3_for(rcfg):
    return A3Config(offset_db=rcfg.a3_offset_db, hysteresis_db=rcfg.a3_hysteresis_db, ttt_s=rcfg.a3_ttt_s,
                    ho_delay_s=rcfg.ho_delay_s)


def predict_at(res, lead, cfg):
    (ho,) = res.handovers
    hp = HandoverPredictor(cfg)
    track = UETrack("ue", capacity=64)
    pred = None
    for r in res.reports:
        if r.time > ho.time - lead:
            break
        hp.observe(r)
        track.append(r)
        pred = hp.predict(track, r.time)
    return ho, pred


@pytest.mark.parametrize("lead", [1.0, 2.0])
@pytest.mark.parametrize("speed,x0", [(8.0, 60.0), (11.0, 40.0), (14.0, 30.0), (20.0, 0.0), (30.0, 0.0)])
def test_straight_border_a3_time_within_0p2s_and_right_target(lead, speed, x0):
    net, rcfg, res = border_drive(1, 0.0, speed, x0)
    ho, pred = predict_at(res, lead, PredictorConfig(mode="a3", a3=a3_for(rcfg)))
    assert pred is not None and pred.source == "a3"
    # the target never served yet, so the prediction names its PCI; the NRT resolves it
    assert pred.target_pci == net.cells[1].pci
    nrt = NeighbourRelations.from_table(net.neighbour_relations())
    assert nrt.resolve(ho.source_cell, pred.target_pci) == ho.target_cell
    assert abs(pred.t_ho - ho.time) <= 0.2


def test_straight_border_with_measurement_noise():
    """0.3 dB L1 error per sample: the median error stays within 0.2 s, the target always right."""
    errs = []
    for seed in range(1, 9):
        net, rcfg, res = border_drive(seed, 0.3, 10.0 + seed, 30.0 + 7 * seed)
        ho, pred = predict_at(res, 2.0, PredictorConfig(mode="a3", a3=a3_for(rcfg)))
        assert pred.target_pci == net.cells[1].pci
        errs.append(abs(pred.t_ho - ho.time))
    assert np.median(errs) <= 0.2 and max(errs) < 0.5


def test_a3_with_given_nrt_names_the_cell():
    net, rcfg, res = border_drive()
    (ho,) = res.handovers
    k = Knowledge.create()
    k.nrt = NeighbourRelations.from_table(net.neighbour_relations())
    hp = HandoverPredictor(PredictorConfig(mode="combined"), k)
    track = UETrack("ue", capacity=64)
    for r in res.reports:
        if r.time > ho.time - 1.5:
            break
        track.append(r)
        p = hp.predict(track, r.time)
    assert p.target_cell == ho.target_cell and p.source == "combined:a3"


def test_theil_sen_ignores_outliers_and_nans():
    t = np.arange(10.0)
    y = 2.0 * t + 1.0
    y[3] = 100.0
    y[6] = np.nan
    a, b, n = theil_sen(t, y, t_ref=9.0)
    assert b == pytest.approx(2.0) and a == pytest.approx(19.0) and n == 9


def rep(t, cell=1, rsrp=-90.0, nbs=(), lat=math.nan, lon=math.nan, v=math.nan, hd=math.nan, ue="u"):
    return MeasurementReport(time=t, ue_id=ue, serving_cell=cell, rsrp_dbm=rsrp, neighbours=tuple(nbs),
                             lat=lat, lon=lon, speed_mps=v, heading_deg=hd)


def test_a3_condition_already_holding_gives_enter_plus_ttt():
    tr = UETrack("u", capacity=32)
    a3 = A3Forecaster(A3Config(offset_db=3, hysteresis_db=1, ttt_s=0.64, ho_delay_s=0.0, min_points=3))
    for k in range(10):
        t = k * 0.2
        nb = -95.0 if t < 1.2 else -85.0      # jumps 5 dB above serving at t = 1.2
        tr.append(rep(t, nbs=[NeighbourMeas(pci=7, rsrp_dbm=nb)]))
    p = a3.predict(tr.view(), now=1.8)
    # entry interpolated between the reports at 1.0 (D = -5) and 1.2 (D = +5): 1.18
    assert p.target_pci == 7 and p.t_ho == pytest.approx(1.18 + 0.64)


def test_a3_anonymous_neighbour_gives_time_without_target():
    tr = UETrack("u", capacity=32)
    for k in range(8):
        tr.append(rep(float(k), rsrp=-90.0 - k, nbs=[NeighbourMeas(rsrp_dbm=-96.0 + k)]))   # closing 2 dB/s
    p = A3Forecaster(A3Config(window_s=6.0, min_points=3, ttt_s=0.0, ho_delay_s=0.0)).predict(tr.view(), now=7.0)
    # D(7) = -96 + 7 + 90 + 7 = 8 dB > 4 dB: holding since D first exceeded 4 dB (k = 5: D = 4, k = 6: D = 6)
    assert p.target_cell == -1 and p.target_pci == -1 and p.t_ho == pytest.approx(7.0)
    tr2 = UETrack("u", capacity=32)
    for k in range(5):
        tr2.append(rep(float(k), rsrp=-90.0, nbs=[NeighbourMeas(rsrp_dbm=-100.0 + k)]))     # +1 dB/s, D(4) = -6
    p2 = A3Forecaster(A3Config(window_s=6.0, min_points=3, ttt_s=0.0, ho_delay_s=0.0)).predict(tr2.view(), now=4.0)
    assert p2.t_ho == pytest.approx(4.0 + 10.0 / 1.0) if p2 else True  # beyond the 8 s horizon -> None
    assert p2 is None


def test_cvh_finds_leaving_the_serving_area():
    frame = LocalFrame(51.9, -8.5)
    m = AssociationMap(tile_m=20.0, frame=frame)
    for x in range(0, 400, 5):
        for _ in range(5):
            m.add_xy(x + 0.5, 5.0, 1 if x < 200 else 2)
    k_lat, k_lon = 51.9, -8.5
    # UE at x = 100 m heading east at 10 m/s: leaves cell 1's area at x = 200 -> 10 s ahead
    lon = k_lon + 100.0 / frame.kx
    lat = k_lat + 5.0 / frame.ky
    tr = UETrack("u", capacity=8)
    tr.append(rep(0.0, cell=1, lat=lat, lon=lon, v=10.0, hd=90.0))
    cvh = CVHPredictor(CVHConfig(horizon_s=15.0, step_s=0.25, tile_m=20.0), m)
    p = cvh.predict(tr.view(), now=2.0)   # 2 s after the fix: dead-reckoned to x = 120
    assert p.target_cell == 2 and p.t_ho == pytest.approx(10.0, abs=0.3)
    # heading west: never leaves within the horizon (unknown tiles are skipped)
    tr2 = UETrack("u", capacity=8)
    tr2.append(rep(0.0, cell=1, lat=lat, lon=lon, v=10.0, hd=270.0))
    assert cvh.predict(tr2.view(), now=0.0) is None


def test_places_predictor_times_the_learned_handover_place():
    frame = LocalFrame(51.9, -8.5)
    m = AssociationMap(tile_m=35.0, frame=frame)
    pl = HandoverPlaces()
    for dx in (-2.0, 0.0, 3.0):
        pl.add(1, 2, 300.0 + dx, 0.0, 90.0)
    pl.add(1, 3, 300.0, 0.0, 270.0)          # the opposite direction goes elsewhere
    tr = UETrack("u", capacity=8)
    tr.append(rep(0.0, cell=1, lat=51.9, lon=-8.5 + 250.0 / frame.kx, v=12.5, hd=90.0))
    p = PlacesPredictor(CVHConfig(), pl, m).predict(tr.view(), now=1.0)
    assert p.target_cell == 2 and p.t_ho == pytest.approx(4.0, abs=0.05)   # 50 m at 12.5 m/s


def test_history_second_order_and_backoff():
    tm = TransitionModel(smoothing=0.5, backoff_weight=1.0)
    for _ in range(6):
        tm.add(-1, 1, 2)
    for _ in range(3):
        tm.add(5, 1, 3)                       # coming from 5, the UE goes on to 3
    assert max(tm.probs(1).items(), key=lambda kv: kv[1])[0] == 2
    assert max(tm.probs(1, previous=5).items(), key=lambda kv: kv[1])[0] == 3
    tr = UETrack("u", capacity=8)
    for t, c in [(0.0, 5), (1.0, 1), (2.0, 1)]:
        tr.append(rep(t, cell=c))
    p = HistoryPredictor(tm).predict(tr.view(), 2.0)
    assert p.target_cell == 3 and math.isnan(p.t_ho) and p.source == "history"


def test_stabiliser_hysteresis_and_flips():
    st = Stabiliser(StabilityConfig(hold_s=1.0, switch_margin=0.3, drop_after_s=1.0))
    P = lambda c, conf=0.5: Prediction(c, 10.0, conf, "x")  # noqa: E731
    assert st.update(P(2), 0.0, 1).target_cell == 2
    assert st.update(P(3), 0.2, 1).target_cell == 2          # not held long enough
    assert st.update(P(3), 0.8, 1).target_cell == 2
    assert st.update(P(3), 1.3, 1).target_cell == 3          # led for 1.1 s: switch
    assert st.flips == 1
    assert st.update(P(4, 0.9), 1.4, 1).target_cell == 4     # far more confident: at once
    assert st.flips == 2
    assert st.update(None, 2.0, 1).target_cell == 4          # survives a short gap
    assert st.update(None, 2.6, 1) is None                   # withdrawn
    assert st.update(P(7), 3.0, 9).flips == 2                # a handover is not a flip


def test_calibrator_is_monotone_and_calibrated():
    rng = np.random.default_rng(0)
    s = rng.random(5000)
    y = rng.random(5000) < s ** 2          # true P(correct | s) = s^2
    cal = Calibrator().fit(s, y, n_bins=10)
    xs = np.linspace(0, 1, 21)
    v = np.array([cal(x) for x in xs])
    assert np.all(np.diff(v) >= 0)
    # a bin's value is the bin's accuracy: E[s^2 | s in [0.9, 1)] = 0.903, [0.3, 0.4) -> 0.123
    assert cal(0.95) == pytest.approx(0.903, abs=0.05) and cal(0.35) == pytest.approx(0.123, abs=0.05)
    again = Calibrator.from_dict(cal.to_dict())
    assert [again(x) for x in xs] == list(v)
    hp = HandoverPredictor(PredictorConfig(mode="history"), calibrators={"history": cal.to_dict()})
    assert hp.history.calibrator(0.95) == cal(0.95)
    with pytest.raises(ValueError):
        Calibrator.from_dict({"edges": [0.0], "values": [0.1, 0.2]})


def test_config_from_dict():
    c = PredictorConfig.from_dict({"mode": "a3", "a3": {"ttt_s": 0.16, "min_points": 5}})
    assert c.a3.ttt_s == 0.16 and c.a3.min_points == 5 and c.cvh == CVHConfig()
    assert PredictorConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="unknown keys"):
        PredictorConfig.from_dict({"a3": {"tt": 1}})
    with pytest.raises(ValueError, match="expected a number"):
        PredictorConfig.from_dict({"a3": {"ttt_s": "fast"}})
    with pytest.raises(ValueError, match="mode"):
        PredictorConfig.from_dict({"mode": "oracle"})


def test_knowledge_learns_online_and_folds_subtract():
    net, rcfg, res = border_drive()
    k = Knowledge.create()
    for r in res.reports:
        k.observe(r)
    (ho,) = res.handovers
    assert k.trans.probs(ho.source_cell) == {ho.target_cell: 1.0}
    assert k.nrt.resolve(ho.source_cell, net.cells[1].pci) == ho.target_cell
    assert len(k.places.events[ho.source_cell]) == 1
    k2 = Knowledge.create()
    k2.learn_drive(res.drive)
    tot = k.copy()
    tot.merge(k2)
    tot.merge(k2, -1)
    assert tot.trans.probs(ho.source_cell) == {ho.target_cell: 1.0}
    assert sum(len(c) for c in tot.assoc.tiles.values()) == sum(len(c) for c in k.assoc.tiles.values())


def test_facade_predict_all_and_bad_views():
    hp = HandoverPredictor()
    tr = UETrack("u", capacity=8)
    assert hp.predict(tr, 0.0) is None                    # empty track
    tr.append(rep(0.0))
    assert hp.predict_all([tr], 0.0) == {}                # nothing learned yet: no prediction


def test_batch_a3_matches_the_border_answer():
    """Two UEs in one store, one batch: the border UE's forecast is the per-UE answer."""
    from xapp.tracks import TrackStore

    for speed, x0 in [(11.0, 40.0), (14.0, 30.0), (20.0, 0.0)]:
        net, rcfg, res = border_drive(1, 0.0, speed, x0)
        (ho,) = res.handovers
        store = TrackStore(capacity=32)
        other = generate_drive(net, straight_route((400.0, 0.0), 90.0 + 180.0, 300.0, 10.0), seed=2, ue_id="ue-1")
        hp = HandoverPredictor(PredictorConfig(mode="a3", a3=a3_for(rcfg)))
        for r, q in zip(res.reports, other.reports):
            if r.time > ho.time - 1.0:
                break
            store.add(r)
            store.add(q)
        out = hp.update(store)
        assert out.ue_ids == ["ue-0", "ue-1"]
        p = out.get(0)
        assert p.target_pci == net.cells[1].pci and abs(p.t_ho - ho.time) <= 0.2
        one = HandoverPredictor(PredictorConfig(mode="a3", a3=a3_for(rcfg)))
        alone = one.predict(store.get("ue-0"), store.last_time("ue-0"))
        assert (alone.target_pci, alone.t_ho, alone.confidence) == (p.target_pci, p.t_ho, p.confidence)


def test_batch_median_equals_nanmedian():
    import warnings

    from xapp.predict.base import nanmedian_last

    rng = np.random.default_rng(1)
    for shape in ((200, 5, 3), (200, 5, 8), (3, 11), (4000, 8, 16), (7,)):
        x = rng.normal(size=shape).astype(np.float32)
        x[rng.random(x.shape) < 0.3] = np.nan
        x[..., :1][rng.random(x[..., :1].shape) < 0.1] = np.nan
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = np.nanmedian(x.astype(np.float64), axis=-1)
        assert np.allclose(ref, nanmedian_last(x), equal_nan=True, atol=1e-6)
    assert np.isnan(nanmedian_last(np.full((2, 4), np.nan))).all()


@pytest.mark.parametrize("mode", ["combined", "a3", "cvh", "places", "history"])
def test_update_over_many_ues_equals_each_ue_alone(mode):
    """The batched cycle (one window gather, every source over all changed UEs at once, padded
    tracks of different lengths, the stabiliser bank) gives each UE exactly what the per-UE
    path gives it, report by report, with knowledge learned from the drives."""
    import dataclasses

    from pallas_tools.radio import generate_drives
    from xapp.tracks import TrackStore

    _, drives = generate_drives(n=6, duration_s=60.0, seed=3)
    know = Knowledge.from_drives([d.drive for d in drives[:3]])
    cfg = PredictorConfig(mode=mode)
    fleet = HandoverPredictor(cfg, know, learn_online=False)
    alone = {d.drive.ue_id: HandoverPredictor(cfg, know, learn_online=False) for d in drives}
    store = TrackStore(capacity=cfg.window_reports, max_neighbours=8)
    tracks = {d.drive.ue_id: UETrack(d.drive.ue_id, cfg.window_reports, 8) for d in drives}
    # the drives run one after the other: shift them to overlap (UEs of different track lengths)
    reps = sorted((dataclasses.replace(r, time=r.time - d.drive.reports[0].time + 0.01 * n)
                   for n, d in enumerate(drives) for r in d.drive.reports[: 60 + 30 * n]), key=lambda r: r.time)
    compared = named = 0
    for k in range(0, len(reps), 9):               # a cycle every 9 reports: some UEs change, some not
        for r in reps[k:k + 9]:
            store.add(r)
            tracks[r.ue_id].append(r)
        out = fleet.update(store)
        for i, ue in enumerate(out.ue_ids):
            tr = tracks[ue]
            ref = alone[ue].predict(tr, float(tr.view(last=1).time[0]))
            got = out.get(i)
            same = (got is None and ref is None) or (got is not None and ref is not None and all(
                a == b or (a != a and b != b) for a, b in zip(dataclasses.astuple(got), dataclasses.astuple(ref))))
            assert same, (ue, got, ref)
            compared += 1
            named += got is not None
    assert compared > 300 and named > 100


def test_association_map_path_teaches_the_xapps_predictor(ucc_dir, tmp_path):
    import dataclasses
    import json
    from pathlib import Path

    from xapp.app import PallasXapp
    from xapp.config import from_descriptor
    from xapp.predict import knowledge_from_drives_at

    folder = ucc_dir / "Download" / "Driving"
    k = knowledge_from_drives_at(folder)
    assert len(k.assoc) > 100 and sum(len(c) for c in k.places.events.values()) > 10
    repo = Path(__file__).resolve().parents[3]
    cfg = from_descriptor(json.loads((repo / "descriptors" / "config-file.json").read_text()))
    assert cfg.association_map_path == ""
    p = PallasXapp._build_predictor(dataclasses.replace(cfg, association_map_path=str(folder)), None)
    assert len(p.knowledge.assoc) == len(k.assoc)
    assert len(PallasXapp._build_predictor(cfg, None).knowledge.assoc) == 0
    with pytest.raises(ValueError, match="does not exist"):
        knowledge_from_drives_at(tmp_path / "nope")
    with pytest.raises(ValueError, match="no drive-test CSV"):
        knowledge_from_drives_at(tmp_path)


def test_sorting_network_sorts_and_nanmedian_last_equals_numpy_on_both_paths():
    import itertools
    import warnings

    from xapp.predict.base import nanmedian_last, sorting_network

    for p in range(1, 11):                  # 0-1 principle: every 0/1 input sorted
        net = sorting_network(p)
        for bits in itertools.product((0, 1), repeat=p):
            v = list(bits)
            for i, j in net:
                if v[i] > v[j]:
                    v[i], v[j] = v[j], v[i]
            assert v == sorted(v)
    rng = np.random.default_rng(3)
    for p in (2, 5, 8, 9, 16, 33):          # network (p <= 10) and np.sort paths
        x = rng.integers(-40, 40, (200, 3, p)).astype(np.float32)
        x[rng.random(x.shape) < 0.3] = np.nan
        x[0, 0] = np.nan
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = np.nanmedian(x, axis=-1).astype(np.float64)
        assert np.array_equal(nanmedian_last(x), ref, equal_nan=True)


def test_every_modes_raw_output_from_one_shared_computation_equals_its_own():
    """``CombinedPredictor.modes`` (what ``evaluate`` replays with) gives each mode the raw
    output that mode's own predictor computes, on generated drives with learned knowledge."""
    from pallas_tools.evaluate import MODES
    from pallas_tools.radio import generate_drives
    from xapp.tracks import TrackStore

    _, drives = generate_drives(n=5, duration_s=60.0, seed=4)
    know = Knowledge.from_drives([d.drive for d in drives[:3]])
    own = {m: HandoverPredictor(PredictorConfig(mode=m), know, learn_online=False) for m in MODES}
    shared = own["a3"].combined
    store = TrackStore(capacity=32)
    checked = 0
    for k in range(0, 250, 10):
        for d in drives:
            for r in d.drive.reports[k:k + 10]:
                store.add(r)
        slots = store.held()
        v = store.window(slots)
        now = v.time[:, -1].copy()
        ues = store.ue_of(slots)
        got = shared.modes(v, now, ues, MODES)
        for m in MODES:
            ref = own[m].raw_batch(v, now, ues)
            for f in ("has", "cell", "pci", "t_ho", "conf", "src", "serving"):
                assert np.array_equal(getattr(got[m], f), getattr(ref, f), equal_nan=True), (m, f)
            checked += int(ref.has.sum())
    assert checked > 200


def test_stabiliser_bank_one_ue_scalar_path_equals_the_array_path():
    """``StabiliserBank.update`` of one UE (Python scalars) and of many (arrays) follow the
    same rules: a random stream of raw predictions gives the same reported state."""
    from xapp.predict.base import StabiliserBank

    rng = np.random.default_rng(5)
    one, many = StabiliserBank(StabilityConfig(), 4), StabiliserBank(StabilityConfig(), 4)
    t = 0.0
    for _ in range(3000):
        t += float(rng.choice([0.05, 0.2, 1.0, 3.0]))
        has = bool(rng.random() < 0.8)
        cell = int(rng.choice([-1, 10, 11, 12]))
        pci = int(rng.choice([-1, 3, 4]))
        conf = float(rng.random())
        sc = int(rng.choice([1, 1, 1, 2]))
        tho = float(t + rng.random() * 3) if rng.random() < 0.7 else math.nan
        r1 = one.update(np.array([1]), np.array([has]), np.array([cell]), np.array([pci]), np.array([tho]),
                        np.array([conf]), np.array([4], np.int16), np.array([t]), np.array([sc]))
        r2 = many.update(np.array([1, 2]), np.array([has, True]), np.array([cell, 5]), np.array([pci, 1]),
                         np.array([tho, t]), np.array([conf, 0.5]), np.array([4, 1], np.int16), np.array([t, t]),
                         np.array([sc, 9]))
        assert bool(r1[0]) == bool(r2[0])
        for k, arr in one.a.items():
            assert arr[1] == many.a[k][1] or (arr[1] != arr[1] and many.a[k][1] != many.a[k][1]), k
