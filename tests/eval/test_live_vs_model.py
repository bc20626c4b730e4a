"""The replay's live-against-model verdict (issue 13: within 30 % or one decode step)."""

from __future__ import annotations

from types import SimpleNamespace

from pallas_eval.report import HandoverRow, live_vs_model, live_vs_model_lines


def _sm(scheme, sit_mean):
    return SimpleNamespace(scheme=scheme, sit_mean=sit_mean)


def _row(scheme, sit, commit=float("nan")):
    return HandoverRow(scheme=scheme, ue_id="1", time_s=0.0, from_cell=1, to_cell=2, sit_s=sit, commit_s=commit)


def test_a_scheme_within_tolerance_is_ok_and_one_outside_names_the_phase():
    rows = [_row("pallas", 0.50, 0.45), _row("pallas", 0.70, 0.60),     # commit 0.525 s of 0.60
            _row("ctho", 0.80, 0.74), _row("detour", 0.2, 0.03)]
    sim = {"pallas": {"sit_mean": 0.20}, "ctho": {"sit_mean": 0.75}, "detour": {"sit_mean": 0.03}}
    out = {c["scheme"]: c for c in live_vs_model([_sm("pallas", 0.60), _sm("ctho", 0.80), _sm("detour", 0.20)],
                                                 sim, rows, r_d=25.0)}
    assert out["ctho"]["ok"] and out["ctho"]["phase"] is None          # |0.80 - 0.75| <= 0.225
    p = out["pallas"]
    assert not p["ok"] and abs(p["tolerance_s"] - 0.06) < 1e-9          # 30 % of 0.20
    assert p["phase"] == "commit"                                      # 525 ms against 160 ms
    assert abs(p["phases"]["commit"][0] - 0.525) < 1e-9 and abs(p["phases"]["resume"][1] - 0.04) < 1e-9
    assert not out["detour"]["ok"] and out["detour"]["phase"] == "relay"
    lines = live_vs_model_lines(out.values())
    assert any("pallas: live 600 ms vs model 200 ms (outside 60 ms); the difference is in the commit phase" in x
               for x in lines)


def test_one_decode_step_is_the_floor_of_the_tolerance():
    out = live_vs_model([_sm("detour", 0.06)], {"detour": {"sit_mean": 0.03}}, [_row("detour", 0.06)], r_d=25.0)
    assert out[0]["ok"] and out[0]["tolerance_s"] == 0.04


def test_a_bridged_handover_is_one_relay_phase_though_its_commit_is_timed():
    # Pallas-Bridge's Commit (0.30 s) runs while the relay serves the UE: not part of its gap.
    rows = [_row("pallas-bridge", 0.20, 0.30), _row("pallas-bridge", 0.24, 0.34)]
    out, = live_vs_model([_sm("pallas-bridge", 0.22)], {"pallas-bridge": {"sit_mean": 0.09}}, rows,
                         r_d=25.0)
    assert not out["ok"] and out["phase"] == "relay"
    assert out["phases"] == {"relay": (0.22, 0.09)}


def test_each_scheme_is_modelled_on_its_own_handover_rows():
    """A scheme's own stalls move where its sessions are at its later handovers, so the model
    of each scheme runs on that scheme's rows (replay_run.model_on_own_rows), not the first
    scheme's: Full-Copy's SIT is priced at Full-Copy's tokens at the handover."""
    from pallas_common import timing
    from pallas_eval.replay_run import model_on_own_rows
    from pallas_eval.simulate import Rates

    def row(scheme, sid, k, t=1.0):
        return HandoverRow(scheme, "1", t, 1, 2, "edge-0", "edge-1", sid, k, sit_s=1.0)

    rates = Rates("t", 1850.0, 25.0, 292_500.0, 2048.0, 32, 0.02, 0.012)
    rows = [row("pallas", "p", 2000), row("full-copy", "f", 500), row("full-copy", "g", 700, 2.0),
            HandoverRow("recomputation", "1", 1.0, 1, 2)]             # no session in flight
    sim = model_on_own_rows(rows, rates, ("pallas", "full-copy", "recomputation"))
    assert set(sim) == {"pallas", "full-copy"} and sim["full-copy"]["handovers"] == 2
    fc = timing.sit_full_copy([500, 700], 2048.0, 292_500.0, 0.02) + 1 / 25.0
    assert abs(sim["full-copy"]["sit_mean"] - float(fc.mean())) < 1e-9
