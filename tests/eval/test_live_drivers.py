"""The live drivers of ``pallas experiment`` (issue 17), wired without vLLM: each builds the
replay options its experiment needs (schemes, the xApp's knob, the generated drive), and turns
a replay's summary into its rows, files and plot. The replay itself is replaced by a recorder
returning a fixed summary, so nothing is started here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pallas_common.schemes import CTHO, DETOUR, NO_RC, NO_SM, PALLAS
from pallas_eval.experiments import NAMES, live


def _summary(schemes, scale=1.0):
    """A replay's summary.json for ``schemes``: two handovers each, one session spanning both."""
    summ, hos = [], []
    for i, s in enumerate(schemes):
        summ.append({"scheme": s, "handovers_with_session": 2, "sit_mean": 0.2 * scale * (i + 1),
                     "sit_p50": 0.2, "sit_p99": 0.3 * scale * (i + 1), "itl_mean": 0.02, "itl_p99": 0.05,
                     "token_exact": 3, "token_checked": 3})
        for k, (t, out) in enumerate(((5.0, "commit"), (9.0, "fallback:ctho"))):
            hos.append({"scheme": s, "ue_id": "1", "time_s": t, "to_server": "edge-1", "session_id": f"{s}-a",
                        "sit_s": 0.1 * (k + 1) * (i + 1), "lead_s": 1.0 + k, "window_s": 0.5, "outcome": out})
    return {"summary": summ, "handovers": hos, "pacing": {"held": True},
            "simulated": {s: {"sit_mean": 0.15 * (i + 1), "sit_p99": 0.25} for i, s in enumerate(schemes)},
            "cpu": {s: {"edge-0/vllm": 0.5, "harness/python": 0.25} for s in schemes}, "wall_s": 100.0}


@pytest.fixture
def recorded(monkeypatch):
    """live.run_one replaced: records each ReplayOptions and returns a summary of its schemes."""
    seen = []

    def fake(opts, con):
        seen.append(opts)
        return _summary(opts.schemes)
    monkeypatch.setattr(live, "run_one", fake)
    return seen


def test_every_experiment_has_a_live_driver_and_a_stated_scale():
    assert set(live.LIVE_DRIVERS) == set(NAMES) == set(live.LIVE_SCALE)
    assert live.missing() == []


def test_ablation_runs_pallas_and_both_ablations_in_one_replay(tmp_path, recorded):
    r = live.run_ablation(tmp_path, None)
    (opts,) = recorded
    assert opts.schemes == (PALLAS, NO_RC, NO_SM) and opts.regime == "paper" and opts.emulate == "qwen3-14b"
    assert [row["scheme"] for row in r.rows] == [PALLAS, NO_RC, NO_SM]
    assert [row["paper_sit_mean_ms"] for row in r.rows] == [235, 12486, 655]      # Figure 9 (Qwen3-14B, 300)
    row = r.rows[1]
    assert (row["sit_mean_live_s"], row["sit_mean_model_s"], row["prepared_commits"]) == (0.4, 0.3, 1)
    assert row["cpu_cores"] == 0.75 and row["sit_max_live_s"] == pytest.approx(0.4)
    files = r.write(tmp_path)
    assert [f.name for f in files] == ["ablation.csv", "ablation.json", "ablation_live.png"]
    assert all(f.exists() and f.stat().st_size > 0 for f in files)


def test_stress_holds_the_correct_prediction_for_each_t_avail(tmp_path, recorded):
    r = live.run_stress(tmp_path, None, t_avail=(0.5, 3.0))
    assert [o.schemes for o in recorded] == [(PALLAS,), (PALLAS,)]
    for o, ta in zip(recorded, ("0.5", "3")):
        assert o.xapp_args == ("--hold-correct-s", ta, "--handovers", str(o.out_dir / "input" / "plan.json"))
    assert recorded[0].out_dir != recorded[1].out_dir
    assert [row["t_avail_imposed_s"] for row in r.rows] == [0.5, 3.0]
    assert r.rows[0]["lead_mean_s"] == pytest.approx(1.5)


def test_the_stress_arguments_are_what_the_xapp_accepts(tmp_path):
    """The arguments the driver passes are the xApp's own test-mode options (parsed by its parser)."""
    xmain = pytest.importorskip("xapp.main")
    a = xmain.build_parser().parse_args(["--mode", "test", *live.stress_args(tmp_path / "plan.json", 1.5)])
    assert a.hold_correct_s == 1.5 and a.handovers == str(tmp_path / "plan.json")


def test_window_forces_each_fixed_window_then_lets_eq9_select(tmp_path, recorded):
    r = live.run_window(tmp_path, None, windows=(0.2, 1.0))
    assert [o.xapp_controls for o in recorded] == [{"scheduler": {"fixed_window_s": 0.2}},
                                                    {"scheduler": {"fixed_window_s": 1.0}}, {}]
    assert [row["window"] for row in r.rows] == ["0.2", "1", "selected (Eq. 9)"]
    assert math.isnan(r.rows[-1]["fixed_window_s"])


def test_the_window_controls_pass_the_descriptor_schema():
    """The knob the driver sets is accepted by the xApp's configuration and reaches the Scheduler."""
    xcfg = pytest.importorskip("xapp.config")
    c = json.loads((Path(live.__file__).resolve().parents[2] / "descriptors" / "config-file.json").read_text())["controls"]
    c["scheduler"].update(live.window_controls(1.0)["scheduler"])
    assert xcfg.load_controls(c).scheduler.fixed_window_s == 1.0


def test_repeated_generates_small_cells_and_counts_handovers_per_session(tmp_path, recorded):
    r = live.run_repeated(tmp_path, None)
    (opts,) = recorded
    assert opts.generate_args == ("--isd-m", "100") and opts.schemes == (PALLAS, DETOUR, CTHO)
    assert all(row["handovers_per_session_mean"] == 2 and row["handovers_per_session_max"] == 2 for row in r.rows)
    assert r.summary["handovers_per_session"][PALLAS]["histogram"] == {2: 1}


def test_contention_generates_a_convoy(tmp_path, recorded, monkeypatch):
    plan = {"handovers": [["1", 5.0, 1, 2], ["2", 5.0, 1, 2], ["3", 5.0, 1, 2], ["4", 7.0, 3, 1]]}

    def fake(opts, con):
        recorded.append(opts)
        p = opts.out_dir / "input" / "plan.json"
        p.parent.mkdir(parents=True)
        p.write_text(json.dumps(plan))
        return _summary(opts.schemes)
    monkeypatch.setattr(live, "run_one", fake)
    r = live.run_contention(tmp_path, None)
    (opts,) = recorded
    assert opts.generate_args == ("--convoy", "3") and opts.ues == 4 and opts.schemes == (PALLAS, CTHO)
    assert r.summary["concurrent_handovers"] == 3


def test_resident_itl_takes_only_other_ues_tokens_at_the_target(tmp_path):
    """Gaps within 2 s after a handover, delivered by its target agent to a UE not handing over."""
    d = tmp_path / PALLAS
    d.mkdir()
    start = 1000.0
    (d / "xapp-events.jsonl").write_text(json.dumps({"kind": "start", "start_at": start}) + "\n")
    sessions = [
        {"ue": "9", "times": [start + 4.9, start + 5.2, start + 5.6, start + 8.0], "agents": ["edge-1"] * 4},
        {"ue": "1", "times": [start + 4.9, start + 5.5], "agents": ["edge-0", "edge-1"]},   # the migrating UE
        {"ue": "8", "times": [start + 4.9, start + 5.3], "agents": ["edge-2", "edge-2"]},   # another agent
    ]
    (d / "sessions.jsonl").write_text("".join(json.dumps(s) + "\n" for s in sessions))
    summ = {"handovers": [{"scheme": PALLAS, "ue_id": "1", "time_s": 5.0, "to_server": "edge-1"}]}
    out = live.resident_itl(tmp_path, summ, PALLAS)
    assert out["resident_gaps"] == 2
    assert out["resident_itl_mean_s"] == pytest.approx((0.3 + 0.4) / 2)


def test_prepare_generates_a_convoy_and_small_cells(tmp_path):
    """pallas_eval.prepare's new drive options (xApp environment: pallas_tools.radio)."""
    pytest.importorskip("pallas_tools.radio")
    pytest.importorskip("asn1tools")            # the E2 codecs: the xApp's environment
    from pallas_eval.prepare import main
    assert main([str(tmp_path / "c"), "--generate", "--ues", "3", "--duration-s", "20", "--convoy", "2"]) == 0
    hos = json.loads((tmp_path / "c" / "plan.json").read_text())["handovers"]
    by_ue = {u: [(round(t, 3), b) for v, t, _a, b in hos if v == u] for u in {h[0] for h in hos}}
    convoy = [v for v in by_ue.values()]
    assert any(convoy[i] == convoy[j] and convoy[i] for i in range(len(convoy)) for j in range(i + 1, len(convoy)))
    assert main([str(tmp_path / "s"), "--generate", "--ues", "2", "--duration-s", "30", "--isd-m", "100"]) == 0
    assert main([str(tmp_path / "b"), "--generate", "--ues", "2", "--duration-s", "30"]) == 0
    n_small = len(json.loads((tmp_path / "s" / "plan.json").read_text())["handovers"])
    n_big = len(json.loads((tmp_path / "b" / "plan.json").read_text())["handovers"])
    assert n_small > 2 * n_big          # 9 against 4 (seed 2)


def test_trigger_figures_are_the_engines_own_at_its_triggers(tmp_path):
    d = tmp_path / PALLAS
    d.mkdir()
    evs = [{"kind": "start", "start_at": 1.0},
           {"kind": "trigger", "window_s": 3.0, "t_sit_s": 0.1, "t_early_s": 2.0},
           {"kind": "trigger", "window_s": 1.0, "t_sit_s": 0.3, "t_early_s": 0.0},
           {"kind": "commit", "window_s": 9.0}]
    (d / "xapp-events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    f = live.trigger_figures(tmp_path, PALLAS)
    assert f == {"triggers": 2, "trigger_window_mean_s": 2.0, "trigger_sit_pred_mean_s": pytest.approx(0.2),
                 "trigger_t_early_pred_mean_s": 1.0}
    assert live.trigger_figures(None, PALLAS)["triggers"] == 0


def test_sit_by_concurrency_splits_handovers_sharing_a_moment_and_target():
    hos = [{"scheme": PALLAS, "time_s": 5.0, "to_server": "edge-1", "sit_s": 0.4},
           {"scheme": PALLAS, "time_s": 5.02, "to_server": "edge-1", "sit_s": 0.6},
           {"scheme": PALLAS, "time_s": 5.0, "to_server": "edge-2", "sit_s": 0.1},     # another target
           {"scheme": PALLAS, "time_s": 9.0, "to_server": "edge-1", "sit_s": None},    # no session
           {"scheme": CTHO, "time_s": 5.0, "to_server": "edge-1", "sit_s": 9.0}]
    f = live.sit_by_concurrency({"handovers": hos}, PALLAS)
    assert (f["handovers_concurrent"], f["handovers_alone"]) == (2, 1)
    assert f["sit_mean_concurrent_s"] == pytest.approx(0.5) and f["sit_max_concurrent_s"] == 0.6
    assert f["sit_mean_alone_s"] == pytest.approx(0.1)


def test_single_runs_the_compared_schemes_and_their_factors_over_pallas(tmp_path, recorded):
    from pallas_common.schemes import COMPARED, FULL_COPY
    r = live.run_single(tmp_path, None)
    (opts,) = recorded
    assert opts.schemes == COMPARED and opts.emulate == "qwen3-32b" and opts.xapp_args == ()
    i = COMPARED.index(FULL_COPY)
    assert r.summary["factors_over_pallas"][FULL_COPY]["live"] == pytest.approx(i + 1)    # 0.2 (i + 1) / 0.2
    assert r.summary["factors_over_pallas"][FULL_COPY]["model"] == pytest.approx(i + 1)
