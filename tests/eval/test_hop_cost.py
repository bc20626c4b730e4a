"""Detour's hop-cost models against the paper's Figure 1, and the option that picks one.

The compounding fit (``timing.PAPER_HOP_COST``, the default) must reproduce the seven points the
paper's text gives for Figure 1 (section 2.2, ``presets.FIGURE1_ITL``) at two and three hops
within the errors docs/model.md section 6.1 states, beat the linear fit over those points, and
the experiments' ``hop_model`` must change what the repeated experiment draws."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pallas_common import timing as T
from pallas_common.schemes import DETOUR
from pallas_eval.experiments import presets as PR
from pallas_eval.experiments import repeated


def _figures(cost: T.HopCost, n: int = 200_000, seed: int = 11) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for (model, hops) in PR.FIGURE1_ITL:
        x = 1000 * T.detour_itl_samples(rng, PR.PAPER_ITL_S[model], hops, n, cost)
        out[(model, hops)] = {"p90": np.percentile(x, 90), "p99": np.percentile(x, 99),
                              "slo%": 100 * np.mean(x > 100)}
    return out


def _error(fig: dict) -> float:
    return sum(math.log(fig[key][k] / v) ** 2 for key, pts in PR.FIGURE1_ITL.items() for k, v in pts.items())


def test_compounding_fit_reproduces_figure_1_points():
    fig = _figures(T.PAPER_HOP_COST)
    # within 20% of every point the paper gives at two and three hops (docs/model.md 6.1 lists them)
    for key, pts in PR.FIGURE1_ITL.items():
        for k, v in pts.items():
            assert fig[key][k] == pytest.approx(v, rel=0.20), (key, k)
    # and the convex growth from two to three hops: the share over 100 ms grows 5x or more
    for model in ("qwen3-32b", "llama-3-8b"):
        assert fig[(model, 3)]["slo%"] > 5 * fig[(model, 2)]["slo%"]


def test_compounding_fits_figure_1_better_than_linear():
    comp, lin = _error(_figures(T.PAPER_HOP_COST)), _error(_figures(T.PAPER_HOP_COST_LINEAR))
    assert comp < 0.2 < 2.0 < lin
    # the linear law misses Llama-3-8B's three-hop share by far (2.4% against 12.61%)
    assert _figures(T.PAPER_HOP_COST_LINEAR)[("llama-3-8b", 3)]["slo%"] < 5.0


def test_compounding_stall_probability_and_mean_by_hop():
    c = T.PAPER_HOP_COST
    assert c.growth > 1 and T.PAPER_HOP_COST_LINEAR.growth == 1.0
    assert c.stall_prob_at(1) == c.stall_prob and c.stall_prob_at(2) == pytest.approx(c.stall_prob * c.growth)
    assert c.stall_prob_at(8) == 1.0                                  # capped
    m = [c.mean_s(h) for h in range(9)]
    assert m[0] == 0.0 and all(np.diff(m) > 0)
    assert np.diff(m)[3] > 5 * np.diff(m)[0]                          # the fourth hop far dearer than the first
    assert c.with_mean(0.024).mean_s() == pytest.approx(0.024) and c.with_mean(0.024).growth == c.growth
    assert PR.rates("qwen3-32b").hop_delay_s == pytest.approx(c.mean_s())
    assert PR.rates("qwen3-32b", hop_model="linear").hop_delay_s == pytest.approx(T.PAPER_HOP_COST_LINEAR.mean_s())


def test_hop_model_option_changes_the_repeated_draws(tmp_path):
    rates_c, rates_l = PR.rates("qwen3-32b"), PR.rates("qwen3-32b", hop_model="linear")
    dc = repeated.hop_itl_draws(rates_c, np.random.default_rng(1), hop_model="compounding")
    dl = repeated.hop_itl_draws(rates_l, np.random.default_rng(1), hop_model="linear")
    # at eight hops the compounding law's mean gap is several times the linear one's
    assert dc[8].mean() > 2.5 * dl[8].mean()
    assert dl[8].mean() - 1 / rates_l.r_d == pytest.approx(8 * T.PAPER_HOP_COST_LINEAR.mean_s(), rel=0.1)
    with pytest.raises(KeyError):
        repeated.hop_itl_draws(rates_c, np.random.default_rng(1), hop_model="cubic")


def test_run_simulated_passes_the_hop_model(tmp_path):
    from pallas_eval.experiments import run_simulated
    res = {m: run_simulated("repeated", tmp_path / m, tiny=True, hop_model=m) for m in ("compounding", "linear")}
    for m, r in res.items():
        assert r.summary["hop_model"] == m
    det = {m: {x["model"]: x for x in r.summary["table2"] if x["scheme"] == DETOUR} for m, r in res.items()}
    for model in PR.MODELS:
        assert det["compounding"][model]["itl_mean_ms"] > det["linear"][model]["itl_mean_ms"]
        assert det["compounding"][model]["sit_mean_ms"] > det["linear"][model]["sit_mean_ms"]
    with pytest.raises(KeyError):
        run_simulated("repeated", tmp_path / "x", tiny=True, hop_model="cubic")


def test_cli_hop_model_option_reaches_the_experiment(tmp_path, capsys):
    import json

    from pallas_eval.cli import main
    factors = {}
    for m in ("compounding", "linear"):
        assert main(["experiment", "repeated", "--simulate", "--tiny", "--hop-model", m, "--out", str(tmp_path / m)]) == 0
        d = json.loads((tmp_path / m / "repeated" / "repeated.json").read_text())
        assert d["summary"]["hop_model"] == m
        factors[m] = next(c["ours"] for c in d["comparison"] if c["key"] == "repeated.detour_itl_factor.max")
    assert factors["compounding"] > factors["linear"]
    capsys.readouterr()
    # live mode draws the replay's relay, not a hop model: the option is refused there
    assert main(["experiment", "repeated", "--hop-model", "linear", "--out", str(tmp_path / "live")]) == 2
    assert "--hop-model applies to --simulate" in " ".join(capsys.readouterr().out.split())


def test_simulate_prices_detour_by_the_hop_law_not_hops_times_the_first_hop():
    """Detour's model SIT (timing.detour_switch_gap) takes the new path's mean hop cost from the
    hop law: with a direct old path and no set-up it is a decode step plus mean_s(h)."""
    import dataclasses
    from pallas_eval.simulate import simulate_arrays
    r = dataclasses.replace(PR.PAPER_QWEN3_32B, relay_request_s=0.0)
    step = 1.0 / r.r_d
    a = simulate_arrays([500, 500, 500], 0.0, r, (DETOUR,), hops=[1, 2, 3], prev_hops=0)
    c = T.PAPER_HOP_COST.with_mean(r.hop_delay_s)
    assert a.sit[DETOUR] == pytest.approx([step + c.mean_s(1), step + c.mean_s(2), step + c.mean_s(3)])
    assert a.sit[DETOUR][2] - step > 3 * r.hop_delay_s * 1.3     # the third hop stalls far more often
    lin = dataclasses.replace(PR.rates("qwen3-32b", hop_model="linear"), relay_request_s=0.0)
    b = simulate_arrays([500], 0.0, lin, (DETOUR,), hops=[3], prev_hops=0)
    assert b.sit[DETOUR] == pytest.approx([1.0 / lin.r_d + 3 * lin.hop_delay_s])


def test_repeated_detour_tokens_cross_the_path_they_are_delivered_over():
    """Table 2's Detour (pallas_eval/experiments/repeated.py ``detour_sessions``): a relay
    forwards a token only after the previous one crossed, so the stream falls behind the source
    and the tokens it has not delivered at a handover come over the next, longer path. The
    delivered tokens' hops are then later than the hops in place when they were decoded, and
    the mean gap above what the decode-time hops alone give (the pre-fix weighting)."""
    d, _, _ = repeated.drives(17, 1, 1)
    rates = PR.rates("qwen3-32b")
    cost = repeated.hop_cost_for(rates)
    gaps, hops, sits = repeated.detour_sessions(d, rates, cost, np.random.default_rng(3))
    step = 1.0 / rates.r_d
    n_tok = [int(math.floor(e / step + 1e-9)) + 1 for e in d.end_s]
    assert gaps.size == hops.size == sum(n - 1 for n in n_tok)
    assert np.array_equal(np.isfinite(sits), np.isfinite(d.ho_time))
    decoded_hops = []
    for i, n in enumerate(n_tok):
        ho = d.ho_time[i][np.isfinite(d.ho_time[i])]
        decoded_hops.append(np.searchsorted(ho, np.arange(1, n) * step, side="right"))
    decoded_hops = np.concatenate(decoded_hops)
    assert hops.mean() > decoded_hops.mean() + 0.5
    at_decode = np.mean([step + cost.mean_s(int(h)) for h in decoded_hops])
    assert gaps.mean() > 1.2 * at_decode
    # the first relayed path starts with nothing held back: the gap across the first handover is
    # the next decode step plus one hop's draw, a decode step at least
    first = sits[:, 0]
    assert np.all(first >= step - 1e-9) and np.mean(first) == pytest.approx(step + cost.mean_s(1), abs=0.03)
