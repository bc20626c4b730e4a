"""``pallas experiment``: each experiment at a tiny size in simulate mode, with checks of shape
and monotonicity that a wrong timing model or a wrong wiring would fail; the presets, the
paper's values file, the vectorised simulation and the CLI.

Runs in the agent's environment (numpy, matplotlib, rich); every test takes seconds.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from pallas_common import timing
from pallas_eval.experiments import NAMES, base, live
from pallas_eval.experiments import mobility as M
from pallas_eval.experiments import presets as PR
from pallas_eval.experiments.presets import PAPER_QWEN3_32B
from pallas_eval.simulate import SimHandover, simulate, simulate_arrays


@pytest.fixture(scope="module")
def outdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("experiments")


def _run(name: str, out: Path):
    from pallas_eval.experiments import run_simulated
    res = run_simulated(name, out, tiny=True)
    folder = out / name
    for f in (f"{name}.csv", f"{name}.json", *[p.name for p in res.plots]):
        assert (folder / f).stat().st_size > 0, f
    assert res.plots and all(p.suffix == ".png" for p in res.plots)
    return res


# ------------------------------------------------------------------------------ presets, values

def test_presets_s_kv_from_configs_and_table1_rates():
    assert PR.s_kv("llama-3-8b") == 131_072 and PR.s_kv("qwen3-14b") == 163_840 and PR.s_kv("qwen3-32b") == 262_144
    r = PR.rates("qwen3-32b", "rtx-a6000", 300.0)
    # Table 1: Recomputation 581 ms at 1K and 2,103 ms at 4K, Full-Copy 7.17 s and 29.07 s.
    a = simulate_arrays([1024.0, 4096.0], 0.0, r, ("full-copy", "recomputation", "ctho"))
    assert a.sit["recomputation"] == pytest.approx([0.581, 2.103], rel=0.15)
    assert a.sit["full-copy"] == pytest.approx([7.17, 29.07], rel=0.05)
    assert a.sit["ctho"][1] == pytest.approx(2.058, rel=0.10)
    # Bigger model: slower prefill and decode on the same GPU; the H200 is faster than the A6000.
    rs = [PR.rates(m) for m in PR.MODELS]
    assert rs[0].r_p > rs[1].r_p > rs[2].r_p and rs[0].r_d > rs[1].r_d > rs[2].r_d
    assert PR.rates("qwen3-32b", "h200").r_p > r.r_p
    with pytest.raises(KeyError):
        PR.rates("gpt-2")
    with pytest.raises(KeyError):
        PR.rates("qwen3-14b", "tpu")
    with pytest.raises(ValueError):
        PR.rates("qwen3-14b", goodput_mbps=0)


def test_paper_values_have_sources_units_and_unique_keys():
    raw = json.loads(base.PAPER_VALUES.read_text())["values"]
    vals = base.paper_values()
    assert len(vals) == len(raw)                                      # no duplicate key
    for v in raw:
        assert v["source"].startswith("section") and isinstance(v["read_from_plot"], bool)
        assert v["unit"] in ("s", "ms", "x", "%", "") and v["experiment"] in NAMES
    with pytest.raises(KeyError):
        _ = base.Comparison("no.such.value", 1.0).paper


def test_comparison_ratio_and_upper_bound():
    c = base.Comparison("ablation.pallas.qwen3-14b.300", 282.0)
    assert c.ratio == pytest.approx(282 / 235) and c.differs is False
    assert base.Comparison("ablation.pallas.qwen3-14b.300", 283.0).differs is True
    assert base.Comparison("contention.pallas_sit_mean.max", 100.0).differs is False    # below the bound
    assert base.Comparison("contention.pallas_sit_mean.max", 400.0).differs is True


# ------------------------------------------------------------------------------ the simulation core

def test_full_copy_linear_in_context_inverse_in_goodput():
    r = PR.rates("qwen3-14b")
    fixed = r.c_sync + 1.0 / r.r_d
    k = np.array([1000.0, 2000.0, 4000.0])
    for g in (100.0, 300.0, 500.0):
        a = simulate_arrays(k, 0.0, PR.with_goodput(r, g), ("full-copy",))
        x = a.sit["full-copy"] - fixed
        assert x == pytest.approx(k * r.s_kv / timing.mbit_per_s(g))
    lo = simulate_arrays(k, 0.0, PR.with_goodput(r, 100.0), ("full-copy",)).sit["full-copy"] - fixed
    hi = simulate_arrays(k, 0.0, PR.with_goodput(r, 500.0), ("full-copy",)).sit["full-copy"] - fixed
    assert lo / hi == pytest.approx(5.0)


def test_pallas_below_ctho_and_recomputation_at_the_papers_rates():
    for m in PR.MODELS:
        for g in (100.0, 300.0, 500.0):
            r = PR.rates(m, goodput_mbps=g)
            a = simulate_arrays(np.array([1000.0, 2500.0, 4000.0]), 5.0, r)
            assert np.all(a.sit["pallas"] < a.sit["ctho"]) and np.all(a.sit["ctho"] <= a.sit["recomputation"] + 1e-12)
            assert np.all(a.sit["recomputation"] < a.sit["full-copy"]) and not a.fallback.any()


def test_fallback_and_prediction_error():
    r = PR.rates("qwen3-14b")
    a = simulate_arrays([3000.0, 3000.0, 3000.0, 3000.0], [0.0, 5.0, 5.0, 5.0], r, ("pallas", "ctho"),
                        ho_error_s=[0.0, 0.0, 0.5, -10.0])
    assert a.fallback.tolist() == [True, False, False, True]        # no lead; HO before the trigger
    assert a.sit["pallas"][0] == a.sit["ctho"][0] and a.sit["pallas"][3] == a.sit["ctho"][3]
    assert a.window[2] == pytest.approx(a.chosen[2] + 0.5)          # a later HO lengthens the window
    assert a.t_early[2] > a.t_early[1]


def test_young_session_keeps_its_tokens_at_the_handover():
    # A session 13 tokens old with a 1 s lead at 25 tok/s: the trigger cannot precede the session,
    # so Pallas prepares exactly the 13 tokens there are (the old code prepared r_d * lead = 25).
    hos = [SimHandover("u", 0.0, 1, 2, 13, 1.0, 1)]
    (res,) = [x for x in simulate(hos, PAPER_QWEN3_32B, ("pallas",))]
    assert res.outcome == "commit" and res.prefill_tokens == pytest.approx(13.0)


# ------------------------------------------------------------------------------ mobility

def test_drives_predictor_and_goodput_draws():
    rng = np.random.default_rng(3)
    d = M.generate_drives(rng, np.array([1, 3, 8]))
    assert d.n_handovers.tolist() == [1, 3, 8]
    # every handover is a move to an adjacent cell
    for i in range(d.n):
        for j in range(int(d.n_handovers[i])):
            a, b = divmod(int(d.ho_from[i, j]), 8), divmod(int(d.ho_to[i, j]), 8)
            assert abs(a[0] - b[0]) + abs(a[1] - b[1]) in (1, 2)
    p = M.cvh_predict(d, rng)
    ta = M.t_avail(d, p)
    assert np.all(ta[np.isfinite(d.ho_time)] >= 0) and np.all(np.isnan(ta[~np.isfinite(d.ho_time)]))
    g = M.truncated_normal(np.random.default_rng(0), 20000)
    assert g.min() >= 150.0 and 300.0 < g.mean() < 306.0          # truncation lifts the mean a little
    with pytest.raises(ValueError):
        M.generate_drives(rng, np.array([0]))


def test_straight_drive_predicts_the_crossing():
    d = M.Drives(0.1, 8, 100.0, x=np.linspace(50, 150, 101)[None, :], y=np.full((1, 101), 50.0),
                 cell=None, alive=np.ones((1, 101), bool), ho_time=np.array([[5.0]]),  # type: ignore[arg-type]
                 ho_from=np.array([[0]]), ho_to=np.array([[8]]), end_s=np.array([10.0]))
    d.cell = M._cell_of(d.x, d.y, 8, 100.0)
    p = M.cvh_predict(d, np.random.default_rng(0), gps_noise_m=0.0)
    # 10 m/s along x from x = 50: from the second fix (0.5 s) on, the crossing at x = 100 is
    # predicted at 5 s, so T_avail is 4.5 s (the step at 5.0 s is already in the target cell).
    assert np.all(p.target[0, :5] == -1) and np.all(p.target[0, 5:50] == 8)
    assert p.t_ho[0, 20] == pytest.approx(5.0, abs=1e-9)
    assert M.t_avail(d, p)[0, 0] == pytest.approx(4.5)


# ------------------------------------------------------------------------------ the experiments

def test_single(outdir):
    res = _run("single", outdir)
    st = res.summary["settings"]
    assert len(st) == 9 and len(res.rows) == 9 * 8
    for s in st:
        m = s["sit_mean_s"]
        assert m["pallas"] < m["ctho"] <= m["recomputation"] < m["full-copy"]
        assert s["itl_mean_s"]["pallas"] < s["itl_mean_s"]["detour"]
    for model in PR.MODELS:
        fc = [s["sit_mean_s"]["full-copy"] for s in st if s["model"] == model]
        assert fc[0] > fc[1] > fc[2]                                 # 100 > 300 > 500 Mbit/s
    # Larger KV per token: Full-Copy grows with the model at a fixed goodput.
    at300 = {s["model"]: s["sit_mean_s"]["full-copy"] for s in st if s["goodput_mbps"] == 300.0}
    assert at300["llama-3-8b"] < at300["qwen3-14b"] < at300["qwen3-32b"]
    assert {r["trace"] for r in res.summary["traces"]} == {"normal", "blockage"}
    keys = {c.key for c in res.comparisons}
    assert "table1.full_copy.4k" in keys and "single.factor_ctho.max" in keys
    t1 = {c.key: c for c in res.comparisons if c.key.startswith("table1")}
    assert all(not c.differs for c in t1.values())                   # Table 1 within 20%


def test_repeated(outdir):
    res = _run("repeated", outdir)
    assert res.summary["handovers_per_model"] == sum(range(1, 9))    # one drive per count 1-8
    t = {(x["model"], x["scheme"]): x for x in res.summary["table2"]}
    for m in PR.MODELS:
        assert t[(m, "pallas")]["sit_mean_ms"] < t[(m, "ctho")]["sit_mean_ms"] < t[(m, "full-copy")]["sit_mean_ms"]
        assert t[(m, "detour")]["itl_mean_ms"] > t[(m, "pallas")]["itl_mean_ms"]
        assert t[(m, "pallas")]["itl_p99_ms"] <= t[(m, "detour")]["itl_p99_ms"]
        hops = res.summary["detour_itl_ms_by_hops"][m]
        assert all(np.diff(list(hops.values())) > 0)
    with open(outdir / "repeated" / "repeated.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 * 36 and {r["handover"] for r in rows} == {str(i) for i in range(1, 9)}


def test_weighted_percentile():
    from pallas_eval.experiments.repeated import weighted_percentile
    assert weighted_percentile(np.array([1.0, 10.0]), np.array([99.0, 1.0]), 99) == 1.0
    assert weighted_percentile(np.array([1.0, 10.0]), np.array([98.0, 2.0]), 99) == 10.0
    assert weighted_percentile(np.array([3.0, 1.0, 2.0]), np.ones(3), 50) == 2.0


def test_window(outdir):
    res = _run("window", outdir)
    for c in res.summary["configs"]:
        sit, early, j = (np.asarray(c[k]) for k in ("sit_s", "t_early_s", "j_s"))
        # Eq. 9's choice on the 0.1 s grid is at or below the minimum of J over the 0.2 s grid.
        assert c["selected_j_s"] <= j.min() + 1e-9
        assert 0.0 <= c["selected_s"] <= 5.0
        assert sit[0] > 1.5 * c["selected_sit_s"]                     # a zero window leaves the prefix
        assert sit[-1] <= sit[0]
        # past the selected window, T_early only grows
        w = np.asarray(c["windows_s"])
        assert np.all(np.diff(early[w >= c["selected_s"]]) >= -1e-9)
        assert early[-1] > 3.0


def test_contention(outdir):
    res = _run("contention", outdir)
    pts = {(p["kind"], p["migrations"], p["residents"]): p for p in res.summary["points"]}
    hh1, hh8 = pts[("HH", 1, 0)], pts[("HH", 8, 0)]
    assert hh8["pallas_mean_s"] > hh1["pallas_mean_s"] and hh8["ctho_mean_s"] > 4 * hh1["ctho_mean_s"]
    for p in pts.values():
        assert p["pallas_mean_s"] < p["ctho_mean_s"] and p["pallas_worst_s"] >= p["pallas_mean_s"]
    hi = pts[("HI", 1, 16)]
    assert hi["tail_itl_s"] > hi["resident_itl_alone_s"]
    assert np.isnan(hh1["tail_itl_s"])


def test_ablation(outdir):
    res = _run("ablation", outdir)
    for s in res.summary["settings"]:
        assert s["no-rc"] > 10 * s["pallas"]                          # shipping the whole cache
    for m in PR.MODELS:
        nr = [s["no-rc"] for s in res.summary["settings"] if s["model"] == m]
        assert nr[0] > nr[1] > nr[2]
    # at 300 Mbit/s and above, streaming the suffix is no worse than recomputing it (docs/model.md)
    for s in res.summary["settings"]:
        if s["goodput_mbps"] >= 300:
            assert s["no-sm"] >= s["pallas"] - 0.01


def test_stress(outdir):
    res = _run("stress", outdir)
    for k in (1000, 2000, 3000):
        cs = sorted((c for c in res.summary["curves"] if c["context"] == k), key=lambda c: c["t_avail_s"])
        pal = np.array([c["pallas"] for c in cs])
        assert cs[0]["t_avail_s"] == 0.0 and pal[0] == pytest.approx(cs[0]["ctho"])   # no lead: ctHO
        assert np.all(np.diff(pal[1:]) <= 1e-6)                    # non-increasing in T_avail
        assert pal[-1] < 0.5 * cs[-1]["ctho"]
        assert all(c["full-copy"] == cs[0]["full-copy"] for c in cs)  # reactive: no lead dependence
    with open(outdir / "stress" / "stress.csv") as f:
        rows = list(csv.DictReader(f))
    assert all(float(r["discarded_s"]) <= float(r["discard_bound_s"]) + 1e-9 for r in rows)   # Eq. 10


# ------------------------------------------------------------------------------ CLI

def test_cli_simulate_and_live_refusal(tmp_path, capsys, monkeypatch):
    from pallas_eval.cli import main
    assert main(["experiment", "window", "--simulate", "--tiny", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "window" in out and "wall time" in out
    d = json.loads((tmp_path / "window" / "window.json").read_text())
    assert d["mode"] == "simulate" and d["plots"] == ["figure6.png"]
    # Where the replay lacks what the live mode needs, it refuses and runs nothing (never vLLM here).
    monkeypatch.setattr(live, "missing", lambda: ["pallas_eval.replay.ReplayOptions.xapp_args"])
    assert main(["experiment", "window", "--out", str(tmp_path / "live")]) == 2
    msg = " ".join(capsys.readouterr().out.split())     # the console wraps long lines
    assert "xapp_args" in msg and "Nothing was run" in msg and "fixed windows" in msg
    with pytest.raises(live.LiveUnavailable):
        live.run_single(tmp_path / "live", None)
    with pytest.raises(live.LiveUnavailable):
        live.run_window(tmp_path / "live", None)
    assert not (tmp_path / "live").exists()
    assert set(NAMES) == {"single", "repeated", "window", "contention", "ablation", "stress"}


def test_a_target_that_served_the_session_before_is_modelled_with_its_prefix_cache():
    """A ping-pong A -> B -> A: at the second handover A holds the blocks it computed before
    the first; Recomputation recomputes only the rest, ctHO (the source B knows: the session
    came from A) ships only what A lacks; a third server C holds nothing."""
    from types import SimpleNamespace as NS
    from pallas_eval.simulate import held_from_rows
    from pallas_eval.experiments.presets import PAPER_QWEN3_32B as R
    rows = [NS(session_id="s", from_server="A", to_server="B", tokens_at_ho=1_000),
            NS(session_id="s", from_server="B", to_server="A", tokens_at_ho=1_100),
            NS(session_id="s", from_server="A", to_server="C", tokens_at_ho=1_200),
            NS(session_id="s", from_server="C", to_server="B", tokens_at_ho=1_300),
            NS(session_id="", from_server="A", to_server="B", tokens_at_ho=0)]
    assert held_from_rows(rows) == [(0, 0), (999, 999), (0, 0), (1_099, 0), (0, 0)]
    k = np.array([1_100.0, 1_100.0])
    a = simulate_arrays(k, 0.0, R, ("recomputation", "ctho"), cached_tokens=[0, 999], known_held_tokens=[0, 999])
    P = R.block_size
    held = 999 // P * P
    assert a.sit["recomputation"][1] == pytest.approx(a.sit["recomputation"][0] - held / R.r_p)
    assert a.prefill_tokens["recomputation"].tolist() == [1_100, 1_100 - held]
    assert a.sit["ctho"][1] < a.sit["ctho"][0] / 3
    # cached but unknown to the source: the split is the plain one, its prefill cheaper
    b = simulate_arrays(k, 0.0, R, ("ctho",), cached_tokens=[0, 999], known_held_tokens=[0, 0])
    assert a.sit["ctho"][1] <= b.sit["ctho"][1] < b.sit["ctho"][0]
