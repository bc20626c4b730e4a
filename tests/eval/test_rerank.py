"""``python -m pallas_tools.rerank``: the candidate dump replays the combination exactly, and the
numpy figures (ceiling, baselines, linear re-ranker) are consistent."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pallas_tools import rerank as R
from pallas_tools.evaluate import _generated, evaluate, profile_config


@pytest.fixture(scope="module")
def drives():
    return _generated(3, 2, 150.0, None, 0.2)


@pytest.fixture(scope="module")
def dumped(drives):
    d = R.dump(drives, profile_config(drives))
    d["meta"] = json.loads(str(d["meta"]))
    return d


def test_dump_shapes_and_labels(dumped, drives):
    d = dumped
    N, I, H = len(d["inst"]), len(d["t"]), sum(len(x.handovers) for x in drives)
    assert d["X"].shape == (N, R.F) and d["cell"].shape == d["y"].shape == (N,)
    assert I == sum(len(x.reports) for x in drives) and N > I
    assert d["ho_at"].shape == (H, len(R.LEADS)) and d["ho_target"].shape == (H,)
    assert np.all(np.diff(d["inst"]) >= 0)                   # rows grouped by instant
    # a candidate is never the serving cell, and no instant lists a cell twice
    assert not np.any(d["cell"] == d["serving"][d["inst"]])
    pairs = d["inst"] * (1 << 40) + d["cell"]
    assert len(np.unique(pairs)) == N
    # a positive row names the target of the handover that ends its instant's dwell
    pos = d["y"].astype(bool)
    assert pos.any() and np.all(d["cell"][pos] == d["next_target"][d["inst"][pos]])
    # causal: the scored instant of a lead L lies at least L before the handover's first report on B
    ok = d["ho_at"][:, 1] >= 0
    assert np.all(d["serving"][d["ho_at"][ok, 1]] != d["ho_target"][ok])


def test_combination_row_is_what_evaluate_scores(dumped, drives):
    res = evaluate(drives, profile_config(drives), ("combined",))
    c = res["combined"]["connected"]
    comb = np.full((len(dumped["t"]), 1), -1, np.int64)
    comb[:, 0] = dumped["target"]
    for L in R.LEADS:
        assert R.right_at(dumped, comb, L) == pytest.approx(c[f"right@{L:g}"], abs=1e-4)
    assert dumped["meta"]["false_alarms_per_h"] == pytest.approx(res["combined"]["false_alarms_per_h"], abs=0.01)


def test_ceiling_bounds_every_ranker(dumped):
    d = dumped
    ceil = R.right_at(d, R.ceiling_named(d), 2.0)
    rows = dict((n, R.report_rows(d, c)) for n, c in R.baseline_table(d))
    lin = R.cross_fit(d, R.linear_fit_predict)
    rows["linear"] = R.report_rows(d, R.top_cells(d, lin))
    for n, r in rows.items():
        assert r["right@2"] <= ceil + 1e-12, n
        if "top3@2" in r:
            assert r["right@2"] <= r["top2@2"] <= r["top3@2"] <= ceil + 1e-12, n
    assert 0.0 < ceil <= 1.0


def test_top_cells_orders_within_each_instant():
    d = {"t": np.zeros(3), "inst": np.array([0, 0, 0, 2, 2]), "cell": np.array([5, 6, 7, 8, 9])}
    top = R.top_cells(d, np.array([0.1, 0.9, 0.5, 0.2, 0.2]), 2)
    assert top.tolist() == [[6, 7], [-1, -1], [8, 9]]


def test_fit_cli_reads_a_dump_without_lightgbm(tmp_path, dumped, capsys):
    p = tmp_path / "d.npz"
    np.savez_compressed(p, **{**dumped, "meta": np.array(json.dumps(dumped["meta"]))})
    assert R.main(["--fit", str(p), "--no-gbm", "--folds", "2"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["rows"]) >= {"ceiling (target among candidates)", "linear conditional logit"}


def test_nested_training_dump_leaves_the_held_out_drives_out(drives, dumped):
    cfg = profile_config(drives)
    sub = R.dump(drives, cfg, only=[1, 2], exclude=[0])
    assert set(np.unique(sub["drive"]).tolist()) == {1, 2} and sub["X"].shape[1] == R.F
    # drive 1's successor statistics lose what drive 0 taught them: some rows must differ
    a = dumped["X"][dumped["drive"][dumped["inst"]] == 1]
    b = sub["X"][sub["drive"][sub["inst"]] == 1]
    assert a.shape == b.shape and not np.array_equal(np.nan_to_num(a), np.nan_to_num(b))
    d = dict(dumped)
    for q, held in enumerate(R.folds_of(3, 3)):
        s = R.dump(drives, cfg, only=[n for n in range(3) if n not in held], exclude=held.tolist())
        d.update({R.nested_key(q) + k: v for k, v in s.items() if k != "meta"})
    sc = R.cross_fit(d, R.linear_fit_predict, 3, nested=True)
    assert R.right_at(d, R.top_cells(d, sc)[:, :1]) <= R.right_at(d, R.ceiling_named(d)) + 1e-12
    with pytest.raises(ValueError, match="nested"):
        R.cross_fit(dumped, R.linear_fit_predict, 3, nested=True)


def test_stacked_protocol_learns_knowledge_from_a_third_group(drives, capsys):
    dumps = R.stacked_dumps(drives, profile_config(drives), 3)
    # group q's dump holds the two other drives, with knowledge from drive q alone
    assert [sorted(np.unique(x["drive"]).tolist()) for x in dumps] == [[1, 2], [0, 2], [0, 1]]
    for x in dumps:
        x["meta"] = json.loads(str(x["meta"]))
    res = R.stacked_report(dumps, gbm=False)
    rows = res["rows"]
    ceil = rows["ceiling (target among candidates)"]["right@2"]
    for name, r in rows.items():
        assert 0.0 <= r["right@2"] <= ceil + 1e-9, name
    assert "linear conditional logit (stacked)" in rows
    sub = R._subset(dumps[0], np.array([2]))
    assert np.all(sub["drive"] == 2) and sub["inst"].max() < len(sub["t"]) and sub["X"].shape[0] == len(sub["inst"])
