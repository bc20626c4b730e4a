"""The live mode of ``pallas experiment``: the real xApp, agents and vLLM servers.

Each experiment's live mode runs the replay (``pallas_eval.replay``: tiny-model vLLM servers with
an agent each, the xApp in test mode, the UE harness) in the regime-faithful emulation of
docs/model.md §9 (``pallas replay --regime paper --emulate MODEL``: engines paced to the
emulated model's r_p and r_d, the link scaled by the KV-size ratio, so every timing is the
emulated model's), at a scale this 2-core machine carries:

Every driver runs one or more replays of a generated drive
(``pallas_eval.replay_run.run_replay``, not a copy of it), each holding the vLLM servers for its
whole duration, and reports per scheme or variant the live SIT and ITL beside the timing
model's on the same handovers (their tokens at the handover and prediction lead, at the rates
the run measured) and the paper's figure where it gives one. Its scale is :data:`LIVE_SCALE`; the knobs it turns are the replay's hooks
(``ReplayOptions.xapp_args``, ``xapp_controls``, ``generate_args``):

| name | what varies | knob |
|---|---|---|
| single | five schemes | - |
| ablation | Pallas, w/o RC, w/o SM (Figure 9) | the replay's ablation schemes |
| stress | T_avail (SIT against the prediction lead) | ``pallas-xapp --hold-correct-s`` (xapp.hold) |
| window | fixed T_w against Eq. 9's (Figure 6) | ``controls.scheduler.fixed_window_s`` |
| repeated | Pallas, Detour, ctHO over 100 m sites (Table 2) | ``pallas_eval.prepare --isd-m 100`` |
| contention | UEs handing over to one target at once (Figure 8) | ``pallas_eval.prepare --convoy N`` |

Where the replay lacks these hooks or the emulated regime, the live mode stops with
:func:`message` naming what is missing rather than printing any figure it did not measure.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from pallas_common.schemes import ABLATIONS, COMPARED, CTHO, DETOUR, PALLAS, RECOVERING, label
from pallas_eval.experiments.base import ExperimentResult, paper_values
from pallas_eval.experiments.presets import REPLAY_ANCHOR_MODEL as REPLAY_MODEL

LIVE_SCALE = {
    "single": "Qwen3-32B emulated (--emulate), 300 Mbit/s scaled link, a generated drive of 2 UEs x 45 s (its handovers with a session in flight)",
    "repeated": "Qwen3-32B emulated, 300 Mbit/s scaled link, a generated drive of 2 UEs x 60 s at 16 m/s over three-sector sites 100 m apart "
                "(handovers every few seconds, so a session spans several); Pallas, Detour, ctHO",
    "window": "Qwen3-14B emulated, 300 Mbit/s scaled link, one generated drive of 2 UEs x 45 s replayed under Pallas with "
              "fixed windows 0.2 and 3.0 s (controls.scheduler.fixed_window_s) and with the window Eq. 9 selects",
    "contention": "Qwen3-32B emulated, 300 Mbit/s scaled link, a generated drive of 4 UEs x 45 s, 3 of them in convoy on one "
                  "route (their handovers to one target at once), the 4th on its own; Pallas and ctHO",
    "ablation": "Qwen3-14B emulated, 300 Mbit/s scaled link, a generated drive of 2 UEs x 45 s: Pallas, w/o RC, w/o SM",
    "stress": "Qwen3-14B emulated, 300 Mbit/s scaled link, one generated drive of 2 UEs x 45 s replayed under Pallas with the "
              "correct prediction held back until T_avail = 0.5, 1.5 and 3.0 s before each handover (pallas-xapp --hold-correct-s)",
}
REQUIRED_FIELDS = ("regime", "emulate", "xapp_args", "xapp_controls", "generate_args")
LIVE_UES = 2
LIVE_DURATION_S = 45.0
#: The emulated model of ablation, stress and window: the paper's figures for them are Qwen3-14B at
#: 300 Mbit/s. (On this 2-core machine the UEs saw about 44 of its 52 tokens/s: the pacing check
#: fails by some 15%; Qwen3-32B's 25 tokens/s holds, so repeated and contention emulate that.)
LIVE_MODEL = "qwen3-14b"
STRESS_T_AVAIL = (0.5, 1.5, 3.0)
FIXED_WINDOWS = (0.2, 3.0)
REPEATED_ISD_M = 100.0
REPEATED_DURATION_S = 60.0
CONTENTION_UES = 3


def missing() -> list[str]:
    """What the live mode needs and this checkout lacks (empty when it can run)."""
    from pallas_eval import replay as rp
    have = {f.name for f in dataclasses.fields(rp.ReplayOptions)}
    return [f"pallas_eval.replay.ReplayOptions.{f} (pallas replay --regime paper --emulate MODEL)"
            for f in REQUIRED_FIELDS if f not in have]


def message(name: str) -> str:
    """The live mode's refusal for experiment ``name``: what is missing and what to run instead."""
    miss = missing()
    if name not in LIVE_DRIVERS:
        miss = miss + [f"a live driver for {name!r} (only {', '.join(LIVE_DRIVERS)} has one)"]
    what = "; ".join(miss)
    return (f"pallas experiment {name}: the live mode would run the real xApp, agents and vLLM at this scale: "
            f"{LIVE_SCALE.get(name, 'per experiment, see pallas_eval/experiments/live.py')}. "
            f"It needs {what}, which this checkout lacks. Nothing was run and no live figure is printed; "
            f"use --simulate for the timing model's figures.")


class LiveUnavailable(RuntimeError):
    """The live mode cannot run here; the message says what is missing."""


# ---------------------------------------------------------------------------------------------
# The replay, once per variant, and its figures per scheme
# ---------------------------------------------------------------------------------------------

def replay_options(out_dir: Path, *, emulate: str, ues: int, duration_s: float, seed: int,
                   schemes: tuple[str, ...], verify: bool = True, xapp_args: tuple[str, ...] = (),
                   xapp_controls: dict | None = None, generate_args: tuple[str, ...] = ()):
    """The ``pallas replay`` options of one live run: the paper regime emulating ``emulate``, a
    generated drive of ``ues`` UEs x ``duration_s`` s (``generate_args`` to pallas_eval.prepare),
    ``schemes`` in turn, the xApp given ``xapp_args`` and ``xapp_controls`` (the experiment's
    knob). Raises :class:`LiveUnavailable` where :func:`missing` is not empty."""
    if missing():
        raise LiveUnavailable("; ".join(missing()))
    from pallas_eval import replay as rp
    return rp.ReplayOptions(out_dir=out_dir, regime="paper", emulate=emulate, ues=ues,  # type: ignore[call-arg]
                            duration_s=duration_s, seed=seed, schemes=tuple(schemes), verify=verify,
                            xapp_args=tuple(xapp_args), xapp_controls=dict(xapp_controls or {}),
                            generate_args=tuple(generate_args))


def plan_path(opts) -> Path:
    """Where the replay of ``opts`` writes its plan (pallas_eval.prepare), known before it runs."""
    return opts.out_dir / "input" / "plan.json"


#: Set by ``pallas experiment --reuse-replays``: a replay whose summary.json is already in its
#: output folder is read instead of run again (to redraw an experiment's figures).
REUSE = False


def run_one(opts, con) -> dict:
    """Run the replay of ``opts`` (pallas_eval.replay_run.run_replay) and return its summary.json (with
    :data:`REUSE`, the one already there if any). Raises RuntimeError if it left processes running."""
    from pallas_eval.replay_run import run_replay
    if REUSE and (opts.out_dir / "summary.json").exists():
        return json.loads((opts.out_dir / "summary.json").read_text())
    res = run_replay(opts, con)
    if res.get("leftover_pids"):
        raise RuntimeError(f"the replay left processes running: {res['leftover_pids']}")
    return json.loads((opts.out_dir / "summary.json").read_text())


def _num(x) -> float:
    """A figure from summary.json as a float (NaN is written there as null)."""
    return float("nan") if x is None else float(x)


def _finite(xs) -> list[float]:
    return [_num(x) for x in xs if math.isfinite(_num(x))]


def _mean(xs) -> float:
    v = _finite(xs)
    return sum(v) / len(v) if v else float("nan")


def trigger_figures(replay_dir: Path | None, scheme: str) -> dict:
    """The Scheduler Engine's own figures at its triggers under ``scheme`` (the xApp's event log):
    mean window, and mean SIT and T_early that Eqs. 4-8 predicted at that window (whatever chose
    it: Eq. 9 or a fixed window), s; NaN without triggers."""
    p = None if replay_dir is None else replay_dir / scheme / "xapp-events.jsonl"
    trig = [] if p is None or not p.exists() else [
        e for e in (json.loads(x) for x in p.read_text().splitlines() if '"trigger"' in x) if e.get("kind") == "trigger"]
    return {"triggers": len(trig), "trigger_window_mean_s": _mean(e.get("window_s") for e in trig),
            "trigger_sit_pred_mean_s": _mean(e.get("t_sit_s") for e in trig),
            "trigger_t_early_pred_mean_s": _mean(e.get("t_early_s") for e in trig)}


def scheme_rows(summ: dict, replay_dir: Path | None = None, **extra) -> list[dict]:
    """One row per scheme of a replay's summary: live SIT/ITL, the timing model's SIT for the
    same handovers at the run's measured rates, prepared commits, the mean prediction lead and
    window of its handovers with a session, its wall time, pacing and CPU (whole replay), and
    with ``replay_dir`` the engine's figures at its triggers (:func:`trigger_figures`)."""
    model = summ.get("simulated", {}) or {}
    hos = summ.get("handovers", [])
    pacing = summ.get("pacing") or {}
    rows = []
    for s in summ["summary"]:
        sch = s["scheme"]
        m = model.get(sch, {})
        mine = [h for h in hos if h["scheme"] == sch and math.isfinite(_num(h["sit_s"]))]
        cpu = (summ.get("cpu") or {}).get(sch) or {}
        rows.append({**extra, "scheme": sch, "handovers_with_session": s["handovers_with_session"],
                     "prepared_commits": sum(1 for h in mine if h["outcome"] == "commit"),
                     "sit_mean_live_s": _num(s["sit_mean"]), "sit_p50_live_s": _num(s["sit_p50"]),
                     "sit_p99_live_s": _num(s["sit_p99"]),
                     "sit_max_live_s": max(_finite(h["sit_s"] for h in mine), default=float("nan")),
                     "itl_mean_live_s": _num(s["itl_mean"]), "itl_p99_live_s": _num(s["itl_p99"]),
                     "sit_mean_model_s": _num(m.get("sit_mean")), "sit_p99_model_s": _num(m.get("sit_p99")),
                     "lead_mean_s": _mean(h["lead_s"] for h in mine),
                     "window_mean_s": _mean(h["window_s"] for h in mine),
                     "token_exact": f"{s.get('token_exact', 0)}/{s.get('token_checked', 0)}",
                     "pacing_held": bool(pacing.get("held", False)),
                     "cpu_cores": round(sum(cpu.values()), 2), "replay_wall_s": round(float(summ.get("wall_s", 0.0)), 1),
                     **trigger_figures(replay_dir, sch)})
    return rows


def _notes(name: str, emulate: str, rows: list[dict], extra: str = "") -> list[str]:
    notes = [f"live: {LIVE_SCALE[name]}; the paper regime emulating {emulate}; the model columns are the timing "
             f"model on the same handovers (their tokens at the handover and prediction lead) at the rates the run "
             f"measured (its summary.json model_rates)"
             + (f"; {extra}" if extra else "")]
    if not all(r["pacing_held"] for r in rows):
        notes.append("the pacing check failed in at least one replay (see its summary.json): those live SITs are "
                     "not in the emulated model's units")
    return notes


def _result(name: str, out_dir: Path, rows: list[dict], summary: dict, plot_title: str, labels: list[str],
            notes: list[str], paper_ms: list[float | None] | None = None, comps=(),
            t_early: bool = False) -> ExperimentResult:
    from pallas_eval.experiments.figures import plot_live
    out_dir.mkdir(parents=True, exist_ok=True)
    plot = plot_live(out_dir / f"{name}_live.png", rows, labels, plot_title, paper_ms=paper_ms,
                     t_early_s=[r.get("trigger_t_early_pred_mean_s", float("nan")) for r in rows] if t_early else None)
    return ExperimentResult(name, "live", rows, summary, [plot], list(comps), notes)


def run_single(out_dir: Path, con, *, emulate: str = REPLAY_MODEL, ues: int = LIVE_UES,
               duration_s: float = LIVE_DURATION_S, seed: int = 2) -> ExperimentResult:
    """``single`` live (module docstring): replay in the paper regime, then each scheme's live
    SIT/ITL beside the timing model's for the same handovers. Writes the replay's own outputs
    under ``out_dir / "replay"``. Raises :class:`LiveUnavailable` where :func:`missing` is not
    empty, RuntimeError if the replay left processes running."""
    if missing():
        raise LiveUnavailable(message("single"))
    opts = replay_options(out_dir / "replay", emulate=emulate, ues=ues, duration_s=duration_s, seed=seed,
                          schemes=COMPARED)
    summ = run_one(opts, con)
    rows = scheme_rows(summ, opts.out_dir)

    def factor(col: str, sch: str) -> float:
        a = next((r[col] for r in rows if r["scheme"] == sch), float("nan"))
        b = next((r[col] for r in rows if r["scheme"] == PALLAS), float("nan"))
        return a / b if b and math.isfinite(a) and math.isfinite(b) else float("nan")

    factors = {sch: {"live": factor("sit_mean_live_s", sch), "model": factor("sit_mean_model_s", sch)}
               for sch in RECOVERING}
    notes = _notes("single", emulate, rows)
    return _result("single", out_dir, rows, {"factors_over_pallas": factors, "replay": str(opts.out_dir),
                                             "regime": summ.get("regime"), "pacing": summ.get("pacing")},
                   f"single, live: the replay in the paper regime emulating {emulate}",
                   [label(r["scheme"]) for r in rows], notes)


def run_ablation(out_dir: Path, con, *, emulate: str = LIVE_MODEL, ues: int = LIVE_UES,
                 duration_s: float = LIVE_DURATION_S, seed: int = 2) -> ExperimentResult:
    """``ablation`` live (Figure 9): one replay under Pallas, Pallas w/o RC and w/o SM (the
    replay's ``--ablations``), each variant's live SIT beside the timing model's on the same
    handovers and the paper's Figure 9 value at Qwen3-14B, 300 Mbit/s. Raises as :func:`run_single`."""
    opts = replay_options(out_dir / "replay", emulate=emulate, ues=ues, duration_s=duration_s, seed=seed,
                          schemes=(PALLAS, *ABLATIONS))
    summ = run_one(opts, con)
    rows = scheme_rows(summ, opts.out_dir)
    paper = paper_values()
    for r in rows:
        v = paper.get(f"ablation.{r['scheme'].replace('-', '_')}.qwen3-14b.300")
        r["paper_sit_mean_ms"] = float(v["value"]) if v else float("nan")
    return _result("ablation", out_dir, rows, {"replay": str(opts.out_dir), "regime": summ.get("regime"),
                                               "pacing": summ.get("pacing")},
                   f"ablation, live (paper regime, {emulate} emulated; paper's Figure 9 at Qwen3-14B, 300 Mbit/s in black)",
                   [label(r["scheme"]) for r in rows], _notes("ablation", emulate, rows),
                   paper_ms=[r["paper_sit_mean_ms"] for r in rows])


def stress_args(plan: Path, t_avail_s: float) -> tuple[str, ...]:
    """The xApp's test-mode arguments that hold each correct prediction until ``t_avail_s`` s
    before its handover (xapp.hold), the handovers read from the replay's ``plan``."""
    return ("--hold-correct-s", f"{float(t_avail_s):g}", "--handovers", str(plan))


def run_stress(out_dir: Path, con, *, emulate: str = LIVE_MODEL, ues: int = LIVE_UES,
               duration_s: float = LIVE_DURATION_S, seed: int = 2,
               t_avail: tuple[float, ...] = STRESS_T_AVAIL) -> ExperimentResult:
    """``stress`` live: one replay per T_avail (same drive, same sessions) under Pallas with the
    xApp's correct predictions held back until T_avail before each handover
    (``pallas-xapp --hold-correct-s``); the measured lead, Pallas's live SIT and the timing
    model's on the same handovers per T_avail. The paper's text gives no value for this figure."""
    rows = []
    for ta in t_avail:
        opts = replay_options(out_dir / f"replay-tavail-{ta:g}", emulate=emulate, ues=ues, duration_s=duration_s,
                              seed=seed, schemes=(PALLAS,), verify=False)
        opts.xapp_args = stress_args(plan_path(opts), ta)
        rows += scheme_rows(run_one(opts, con), opts.out_dir, t_avail_imposed_s=ta)
    return _result("stress", out_dir, rows, {"t_avail_s": list(t_avail)},
                   f"stress, live: Pallas's SIT against the imposed prediction lead ({emulate} emulated)",
                   [f"T_avail {r['t_avail_imposed_s']:g} s" for r in rows],
                   _notes("stress", emulate, rows, "lead_mean_s is the lead the xApp had (at most T_avail plus one "
                                                   "report period; less where the predictor named the target later)"))


def window_controls(fixed_s: float | None) -> dict:
    """The descriptor controls that force the window ``fixed_s`` (None: Eq. 9 selects)."""
    return {} if fixed_s is None else {"scheduler": {"fixed_window_s": float(fixed_s)}}


def run_window(out_dir: Path, con, *, emulate: str = LIVE_MODEL, ues: int = LIVE_UES,
               duration_s: float = LIVE_DURATION_S, seed: int = 2,
               windows: tuple[float, ...] = FIXED_WINDOWS) -> ExperimentResult:
    """``window`` live (Figure 6): one replay per fixed window (``controls.scheduler.
    fixed_window_s``) and one with the window Eq. 9 selects, under Pallas on the same drive;
    live SIT, the window actually used (the lead can cut it) and the model's SIT per variant."""
    rows = []
    for w in (*windows, None):
        tag = "selected" if w is None else f"fixed-{w:g}"
        opts = replay_options(out_dir / f"replay-{tag}", emulate=emulate, ues=ues, duration_s=duration_s,
                              seed=seed, schemes=(PALLAS,), verify=False, xapp_controls=window_controls(w))
        rows += scheme_rows(run_one(opts, con), opts.out_dir, window="selected (Eq. 9)" if w is None else f"{w:g}",
                            fixed_window_s=float("nan") if w is None else w)
    paper = paper_values()
    return _result("window", out_dir, rows, {"fixed_windows_s": list(windows),
                                             "paper_selected_s": paper["window.selected"]["value"],
                                             "paper_selected_sit_ms": paper["window.selected_sit"]["value"]},
                   f"window, live: Pallas with fixed windows and the selected one ({emulate} emulated)",
                   [f"T_w {r['window']}" for r in rows], _notes("window", emulate, rows,
                   "window_mean_s is the window the triggers used (a prediction nearer than T_w cuts it); the paper's "
                   "Figure 6 point is 1.64 s, 227.57 ms at Qwen3-14B, 300 Mbit/s, 3,000 tokens"),
                   paper_ms=[paper["window.selected_sit"]["value"] if r["window"].startswith("selected") else None
                             for r in rows], t_early=True)


def handovers_per_session(summ: dict, scheme: str) -> dict:
    """Handovers per session with a session in flight under ``scheme``: mean, max and the count
    of sessions with 1, 2, ... handovers."""
    per: dict[str, int] = {}
    for h in summ.get("handovers", []):
        if h["scheme"] == scheme and h.get("session_id") and math.isfinite(_num(h["sit_s"])):
            per[h["session_id"]] = per.get(h["session_id"], 0) + 1
    hist: dict[int, int] = {}
    for n in per.values():
        hist[n] = hist.get(n, 0) + 1
    return {"sessions": len(per), "mean": _mean(per.values()), "max": max(per.values(), default=0),
            "histogram": dict(sorted(hist.items()))}


def run_repeated(out_dir: Path, con, *, emulate: str = REPLAY_MODEL, ues: int = LIVE_UES,
                 duration_s: float = REPEATED_DURATION_S, seed: int = 2,
                 schemes: tuple[str, ...] = (PALLAS, DETOUR, CTHO)) -> ExperimentResult:
    """``repeated`` live (Table 2): a generated drive over sites ``REPEATED_ISD_M`` m apart, so
    sessions span several handovers, predictor and Scheduler Engine online; SIT and ITL per
    scheme and handovers per session, the paper's Table 2 range for Pallas beside."""
    opts = replay_options(out_dir / "replay", emulate=emulate, ues=ues, duration_s=duration_s, seed=seed,
                          schemes=schemes, verify=False, generate_args=("--isd-m", f"{REPEATED_ISD_M:g}"))
    summ = run_one(opts, con)
    rows = scheme_rows(summ, opts.out_dir)
    hps = {r["scheme"]: handovers_per_session(summ, r["scheme"]) for r in rows}
    for r in rows:
        r["handovers_per_session_mean"] = hps[r["scheme"]]["mean"]
        r["handovers_per_session_max"] = hps[r["scheme"]]["max"]
    paper = paper_values()
    lo, hi = paper["repeated.pallas_sit_mean.min"]["value"], paper["repeated.pallas_sit_mean.max"]["value"]
    return _result("repeated", out_dir, rows, {"replay": str(opts.out_dir), "handovers_per_session": hps,
                                               "paper_pallas_sit_mean_ms": [lo, hi], "pacing": summ.get("pacing")},
                   f"repeated, live: sessions across several handovers, sites {REPEATED_ISD_M:g} m apart ({emulate})",
                   [label(r["scheme"]) for r in rows], _notes("repeated", emulate, rows,
                   f"the paper's Table 2 Pallas mean SIT is {lo}-{hi} ms over its three models"),
                   paper_ms=[(lo + hi) / 2 if r["scheme"] == PALLAS else None for r in rows])


def resident_itl(replay_dir: Path, summ: dict, scheme: str, around_s: float = 2.0) -> dict:
    """The residents' decoding beside the migrations: the inter-token gaps, within ``around_s``
    s after a handover of the run, of tokens that the handover's target agent delivered to a UE
    not handing over then; mean and p99, s, and how many. Reads the scheme's sessions.jsonl
    (token times and agents) and the xApp's start time (its events)."""
    import numpy as np
    hos = [h for h in summ.get("handovers", []) if h["scheme"] == scheme]
    sess_p, ev_p = replay_dir / scheme / "sessions.jsonl", replay_dir / scheme / "xapp-events.jsonl"
    none = {"resident_itl_mean_s": float("nan"), "resident_itl_p99_s": float("nan"), "resident_gaps": 0}
    if not sess_p.exists() or not ev_p.exists():
        return none
    start = next((json.loads(x) for x in ev_p.read_text().splitlines() if '"start"' in x), {}).get("start_at")
    if start is None:
        return none
    moving = {}                                   # handover moment -> UEs handing over then
    for h in hos:
        moving.setdefault(round(h["time_s"], 1), set()).add(h["ue_id"])
    gaps = []
    for x in sess_p.read_text().splitlines():
        s = json.loads(x)
        ts, ag = s["times"], s["agents"]
        for k in range(1, len(ts)):
            for h in hos:
                if s["ue"] in moving[round(h["time_s"], 1)]:
                    continue
                if ag[k] == h["to_server"] and 0.0 <= ts[k] - start - h["time_s"] <= around_s:
                    gaps.append(ts[k] - ts[k - 1])
                    break
    g = np.asarray(gaps)
    if not g.size:
        return none
    return {"resident_itl_mean_s": float(g.mean()), "resident_itl_p99_s": float(np.percentile(g, 99)),
            "resident_gaps": int(g.size)}


def sit_by_concurrency(summ: dict, scheme: str) -> dict:
    """Mean and worst SIT (s) under ``scheme`` of the handovers that shared their moment and
    target agent with another (concurrent migrations to one target) and of those alone."""
    hos = [h for h in summ.get("handovers", []) if h["scheme"] == scheme and math.isfinite(_num(h["sit_s"]))]
    n: dict[tuple[float, str], int] = {}
    for h in hos:
        k = (round(h["time_s"], 1), h["to_server"])
        n[k] = n.get(k, 0) + 1
    out = {}
    for tag, pick in (("concurrent", lambda c: c > 1), ("alone", lambda c: c == 1)):
        v = [_num(h["sit_s"]) for h in hos if pick(n[(round(h["time_s"], 1), h["to_server"])])]
        out[f"sit_mean_{tag}_s"], out[f"sit_max_{tag}_s"], out[f"handovers_{tag}"] = (
            _mean(v), max(v, default=float("nan")), len(v))
    return out


def run_contention(out_dir: Path, con, *, emulate: str = REPLAY_MODEL, ues: int = CONTENTION_UES + 1,
                   duration_s: float = LIVE_DURATION_S, seed: int = 2,
                   schemes: tuple[str, ...] = (PALLAS, CTHO)) -> ExperimentResult:
    """``contention`` live (Figure 8, handover-handover): a generated convoy (every UE on one
    route with the same radio draws: pallas_eval.prepare ``--convoy``), so ``CONTENTION_UES`` UEs
    hand over to one target at the same moment, and ``ues - CONTENTION_UES`` UEs drive on their
    own (residents wherever a target serves them); mean and worst SIT per scheme, and the ITL of
    the residents' tokens beside the migrations (:func:`resident_itl`). The paper: Pallas's mean SIT stays below 300 ms."""
    opts = replay_options(out_dir / "replay", emulate=emulate, ues=ues, duration_s=duration_s, seed=seed,
                          schemes=schemes, verify=False, generate_args=("--convoy", str(CONTENTION_UES)))
    summ = run_one(opts, con)
    rows = scheme_rows(summ, opts.out_dir)
    plan = json.loads(plan_path(opts).read_text())
    at_once: dict[tuple[float, int], int] = {}
    for _ue, t, _a, b in plan["handovers"]:
        at_once[(round(float(t), 3), int(b))] = at_once.get((round(float(t), 3), int(b)), 0) + 1
    for r in rows:
        r.update(resident_itl(opts.out_dir, summ, r["scheme"]))
        r.update(sit_by_concurrency(summ, r["scheme"]))
    paper = paper_values()["contention.pallas_sit_mean.max"]["value"]
    return _result("contention", out_dir, rows, {"replay": str(opts.out_dir), "concurrent_handovers":
                                                 max(at_once.values(), default=0), "pacing": summ.get("pacing")},
                   f"contention, live: {CONTENTION_UES} UEs handing over to one target at once ({emulate})",
                   [label(r["scheme"]) for r in rows], _notes("contention", emulate, rows,
                   f"up to {max(at_once.values(), default=0)} handovers to one target at one moment; sit_max_live_s "
                   f"is the worst; the paper's Pallas mean SIT stays below {paper} ms"),
                   paper_ms=[paper if r["scheme"] == PALLAS else None for r in rows])


LIVE_DRIVERS = {"single": run_single, "ablation": run_ablation, "stress": run_stress, "window": run_window,
                "repeated": run_repeated, "contention": run_contention}
