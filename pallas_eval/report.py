"""The replay's outputs: the per-handover table, the per-scheme summary (rich tables on the
terminal), CSV and JSON files, and plots (SIT and ITL CDFs per scheme; one UE's tokens across
its handovers).

Units in files: seconds for times (columns end in ``_s``), bytes, tokens. On the terminal, times
are shown in milliseconds.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from pallas_common.schemes import spec_for
from pallas_eval.metrics import ITL_SLO_S, SchemeSummary, SessionRecord


@dataclass
class HandoverRow:
    """One handover under one scheme: what the xApp did and what the UE saw.

    ``lead_s``: how long before the handover the xApp's prediction named the right target and
    kept it (T_avail, docs/model.md §5), NaN if never. ``t_ho_error_s``: the xApp's latest
    predicted handover time minus the actual one (s; > 0: the HO came early; NaN: no predicted
    time), as the trigger margin measures it (xapp/scheduler/ho_timing.py). ``window_s``: the chosen T_w* (Eq. 9),
    NaN if no trigger. ``sit_s``: measured at the UE (section 7), NaN with no session in flight.
    ``outcome``: commit, fallback:<scheme>, recovered:<scheme> (reactive baselines), cancel,
    no-session, or error:<reason>.
    """

    scheme: str
    ue_id: str
    time_s: float
    from_cell: int
    to_cell: int
    from_server: str = ""
    to_server: str = ""
    session_id: str = ""
    tokens_at_ho: int = 0
    lead_s: float = float("nan")
    window_s: float = float("nan")
    t_early_s: float = float("nan")
    sit_s: float = float("nan")
    sit_model_s: float = float("nan")
    bytes_moved: int = 0
    prefill_tokens: int = 0
    outcome: str = ""
    commit_s: float = float("nan")
    t_ho_error_s: float = float("nan")


def as_float(v: Any) -> float:
    """``v`` as a float; NaN for None or anything not a number (``summary.json`` writes a NaN as
    null, and a field a run did not record is missing)."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def fmt_ms(v: Any) -> str:
    """Seconds ``v`` as whole milliseconds with thousands separators (``0.278`` -> ``278``,
    ``12.486`` -> ``12,486``); ``-`` when it is not a finite number. The replay's terminal tables
    and the results page (:mod:`pallas_eval.results_page`) both write times this way."""
    x = as_float(v)
    return "-" if not math.isfinite(x) else f"{x * 1000:,.0f}"


def _s(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}"


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return _jsonable(x.item())
    return x


def handover_table(rows: Sequence[HandoverRow], title: str = "Handovers"):
    """A rich Table of the per-handover rows."""
    from rich.table import Table
    t = Table(title=title, show_lines=False)
    for col, just in (("scheme", "left"), ("t (s)", "right"), ("UE", "left"), ("from→to cell", "left"),
                      ("servers", "left"), ("lead (s)", "right"), ("t_HO err (s)", "right"), ("T_w* (s)", "right"),
                      ("SIT (ms)", "right"), ("bytes", "right"), ("prefill tok", "right"), ("outcome", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rows:
        t.add_row(r.scheme, f"{r.time_s:.1f}", r.ue_id, f"{r.from_cell}→{r.to_cell}",
                  f"{r.from_server}→{r.to_server}", _s(r.lead_s), _s(r.t_ho_error_s), _s(r.window_s),
                  fmt_ms(r.sit_s),
                  f"{r.bytes_moved:,}" if r.bytes_moved else "-",
                  f"{r.prefill_tokens:,}" if r.prefill_tokens else "-", r.outcome)
    return t


def summary_table(summaries: Sequence[SchemeSummary], title: str = "Per scheme",
                  simulated: dict[str, dict] | None = None):
    """A rich Table of per-scheme summaries; ``simulated`` adds the timing model's SIT beside."""
    from rich.table import Table
    t = Table(title=title)
    cols = ["scheme", "HOs (w/ session)", "SIT mean [95% CI]", "SIT p50", "SIT p99", "ITL mean [95% CI]", "ITL p90",
            "ITL p99",
            f"ITL>{ITL_SLO_S * 1000:.0f}ms", "T_early", "token-exact", "prepared commits"]
    if simulated:
        cols += ["model SIT mean", "model SIT p99"]
    for c in cols:
        t.add_column(c + (" (ms)" if c.startswith(("SIT", "ITL ", "T_early", "model")) else ""),
                     justify="left" if c == "scheme" else "right")
    for s in summaries:
        row = [s.scheme, f"{s.handovers} ({s.handovers_with_session})", fmt_ms_ci(s.sit_mean, s.sit_mean_ci),
               fmt_ms(s.sit_p50), fmt_ms(s.sit_p99), fmt_ms_ci(s.itl_mean, s.itl_mean_ci), fmt_ms(s.itl_p90),
               fmt_ms(s.itl_p99),
               "-" if not math.isfinite(s.itl_over_slo) else f"{100 * s.itl_over_slo:.1f}%",
               fmt_ms(s.t_early_mean), f"{s.token_exact}/{s.token_checked}", str(s.commits)]
        if simulated:
            m = simulated.get(s.scheme, {})
            row += [fmt_ms(m.get("sit_mean")), fmt_ms(m.get("sit_p99"))]
        t.add_row(*row)
    return t


def lead_summary(rows: Sequence[HandoverRow], scheme: str) -> str:
    """One line on how early the xApp named each handover's target under ``scheme``: of the
    handovers, how many had the right target named ahead (T_avail > 0), at least 1 s and 2 s
    ahead (``pallas_tools.evaluate``'s L = 1, 2 columns score the same drive this way), the
    median lead, the median error of the predicted handover time (predicted - actual, s), and
    how many commits were prepared; "" without rows of that scheme."""
    rs = [r for r in rows if r.scheme == scheme]
    if not rs:
        return ""
    lead = np.array([r.lead_s for r in rs], dtype=np.float64)
    named = lead[np.isfinite(lead) & (lead > 0)]
    prepared = sum(1 for r in rs if r.outcome == "commit")
    med = f"{np.median(named):.1f} s" if named.size else "-"
    err = np.array([r.t_ho_error_s for r in rs], dtype=np.float64)
    err = err[np.isfinite(err)]
    err_s = f"{np.median(err):+.1f} s over {err.size}" if err.size else "-"
    return (f"{scheme}: right target named ahead for {named.size} of {len(rs)} handovers "
            f"(>= 1 s: {int(np.sum(named >= 1.0))}, >= 2 s: {int(np.sum(named >= 2.0))}; median lead {med}); "
            f"t_HO predicted - actual median {err_s}; prepared commits {prepared}")


def fmt_ms_ci(v: Any, ci: Any) -> str:
    """Seconds ``v`` in ms with its interval ``ci`` = (lo, hi) s, ``278 [231-330]``; without a
    finite interval (NaN, null, missing, not a pair) just :func:`fmt_ms` of ``v``."""
    try:
        pair = list(ci)
    except TypeError:
        pair = []
    lo, hi = (as_float(x) for x in (pair + [None, None])[:2])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return fmt_ms(v)
    return f"{fmt_ms(v)} [{lo * 1000:,.0f}-{hi * 1000:,.0f}]"


def ratio_table(sit_by: dict[str, Sequence[float]], base: str, title: str | None = None):
    """Each scheme's mean SIT over ``base``'s (``x`` times), with its 95% bootstrap interval
    (:func:`pallas_eval.metrics.ratio_ci`); ``None`` without ``base`` or another scheme."""
    from rich.table import Table
    from pallas_eval.metrics import ratio_ci
    if base not in sit_by or len(sit_by) < 2:
        return None
    t = Table(title=title or f"Mean SIT of each scheme over {base}'s (95% bootstrap interval)")
    for c in ("scheme", "ratio", "95% CI"):
        t.add_column(c, justify="left" if c == "scheme" else "right")
    for sch, x in sit_by.items():
        if sch == base:
            continue
        r, lo, hi = ratio_ci(x, sit_by[base])
        t.add_row(sch, "-" if not math.isfinite(r) else f"{r:.2f}x",
                  "-" if not math.isfinite(lo) else f"{lo:.2f}-{hi:.2f}x")
    return t


def write_csv(path: Path, rows: Sequence[object]) -> None:
    """Dataclass rows to CSV (header from the first row's fields); NaN written as empty."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        if not rows:
            f.write("")
            return
        d0 = asdict(rows[0]) if not isinstance(rows[0], dict) else rows[0]  # type: ignore[arg-type]
        w = csv.DictWriter(f, fieldnames=list(d0))
        w.writeheader()
        for r in rows:
            d = asdict(r) if not isinstance(r, dict) else r  # type: ignore[arg-type]
            w.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()})


def write_json(path: Path, obj) -> None:
    """JSON with NaN/inf written as null."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(obj), indent=1, sort_keys=False))


def _cdf(ax, x: np.ndarray, label: str, scale: float = 1000.0) -> None:
    x = np.sort(np.asarray(x, dtype=np.float64)[np.isfinite(x)]) * scale
    if x.size:
        ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=f"{label} (n={x.size})")


def _figure(size: tuple[float, float]):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=size)


def _finish(fig, ax, path: Path, xlabel: str, ylabel: str) -> Path:
    import matplotlib.pyplot as plt
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_cdfs(path: Path, per_scheme: dict[str, np.ndarray], xlabel: str, slo_ms: float | None = None,
              log_x: bool = False) -> Path:
    """A CDF per scheme (values in seconds, plotted in ms) saved to ``path`` (PNG)."""
    fig, ax = _figure((6.4, 4.0))
    for name, x in per_scheme.items():
        _cdf(ax, x, name)
    if slo_ms:
        ax.axvline(slo_ms, color="grey", ls="--", lw=1, label=f"SLO {slo_ms:.0f} ms")
    if log_x:
        ax.set_xscale("log")
    return _finish(fig, ax, path, xlabel, "CDF")


def plot_timeline(path: Path, ue_id: str, per_scheme: dict[str, Sequence[SessionRecord]],
                  handover_times: Sequence[float], t0: float = 0.0) -> Path:
    """One UE's tokens over time (cumulative count per scheme), handovers as vertical lines."""
    fig, ax = _figure((8.0, 4.0))
    for name, sessions in per_scheme.items():
        t = np.sort(np.concatenate([np.asarray(s.times) for s in sessions if s.ue_id == ue_id and s.times]
                                   or [np.zeros(0)]))
        if t.size:
            ax.step(t - t0, np.arange(1, t.size + 1), where="post", label=name, lw=1)
    for i, h in enumerate(handover_times):
        ax.axvline(h - t0, color="red", ls=":", lw=1, label="handover" if i == 0 else None)
    return _finish(fig, ax, path, "time since replay start (s)", f"tokens received by UE {ue_id}")


def cpu_rows(cpu: Mapping[str, Mapping[str, float]]) -> tuple[list[str], list[list[str]]]:
    """The CPU table's cells: (roles, rows), one row per scheme (name, % of one core per process
    role summed over the servers, total). Roles: ``agent``, ``vllm-api``, ``vllm-engine``,
    ``vllm-worker``, ``xapp``, ``harness`` as they occur. ``cpu``: scheme -> ``root/label`` ->
    share of one core (pallas_eval.cpu.cpu_share). The replay prints it (:func:`cpu_table`) and the
    results page renders it (``pallas_eval.results_page``)."""
    roles: dict[str, None] = {}
    by: dict[str, dict[str, float]] = {}
    for scheme, shares in cpu.items():
        row = by.setdefault(scheme, {})
        for key, v in shares.items():
            root, _, label = key.partition("/")
            role = "harness" if root == "harness" else label
            roles.setdefault(role, None)
            row[role] = row.get(role, 0.0) + float(v)
    rows = [[s] + [f"{100 * r.get(x, 0.0):.1f}" for x in roles] + [f"{100 * sum(r.values()):.1f}"]
            for s, r in by.items()]
    return list(roles), rows


def cpu_table(cpu: dict[str, dict[str, float]], title: str = "CPU per scheme (% of one core, while the UEs ran)"):
    """A rich Table of :func:`cpu_rows`."""
    from rich.table import Table
    roles, rows = cpu_rows(cpu)
    t = Table(title=title)
    t.add_column("scheme")
    for r in roles:
        t.add_column(r, justify="right")
    t.add_column("total", justify="right")
    for row in rows:
        t.add_row(*row)
    return t


def live_vs_model(summaries: Sequence[Any], simulated: dict[str, dict], rows: Sequence[HandoverRow],
                  r_d: float) -> list[dict[str, Any]]:
    """Each scheme's live mean SIT against the timing model's on the same handovers at the
    run's rates (issue 13: within 30 %, or one decode step 1 / ``r_d`` when that is larger);
    ``simulated``: the model on each scheme's own rows (``pallas_eval.replay_run.model_on_own_rows``).

    Where a scheme is off, the difference is put on a phase: ``commit`` (the Commit call at the
    xApp: the warm-up still to wait for, the blocks still to stream and the Sync; the model's
    SIT less its first decode step) or ``resume`` (from the Commit's reply to the first token at
    the UE: the target's first step and the UE's reconnection; the model's 1 / r_d). A scheme
    that serves the UE through a relay across the handover (Detour; Pallas-Bridge, whose gap is
    the switch after the commit, timing.sit_bridge) has only ``relay``: its whole gap, since its
    Commit call is not part of it. Returns one dict per scheme: scheme, live_s, model_s, tolerance_s, ok,
    phases ({phase: (live mean s, model s)}), phase (the one with the largest excess or None).
    """
    out = []
    step = 1.0 / r_d if r_d > 0 else 0.0
    for sm in summaries:
        m = simulated.get(sm.scheme, {}).get("sit_mean")
        if m is None or not math.isfinite(m) or not math.isfinite(sm.sit_mean):
            continue
        tol = max(0.3 * m, step)
        ok = abs(sm.sit_mean - m) <= tol
        mine = [r for r in rows if r.scheme == sm.scheme and math.isfinite(r.sit_s)]
        spec = spec_for(sm.scheme)
        relayed = spec.bridge or not spec.migrates
        timed = [] if relayed else [r for r in mine if math.isfinite(r.commit_s)]
        phases: dict[str, tuple[float, float]] = {}
        if timed:
            commit = sum(r.commit_s for r in timed) / len(timed)
            resume = sum(max(0.0, r.sit_s - r.commit_s) for r in timed) / len(timed)
            phases = {"commit": (commit, max(0.0, m - step)), "resume": (resume, step)}
        elif mine:
            phases = {"relay": (sm.sit_mean, m)}
        phase = None
        if not ok and phases:
            phase = max(phases, key=lambda k: phases[k][0] - phases[k][1])
        out.append({"scheme": sm.scheme, "live_s": sm.sit_mean, "model_s": m, "tolerance_s": tol,
                    "ok": ok, "phases": phases, "phase": phase})
    return out


def live_vs_model_lines(cmp: Sequence[dict[str, Any]]) -> list[str]:
    """One printable line per scheme of :func:`live_vs_model`."""
    lines = []
    for c in cmp:
        head = (f"{c['scheme']}: live {c['live_s'] * 1000:.0f} ms vs model {c['model_s'] * 1000:.0f} ms "
                f"({'within' if c['ok'] else 'outside'} {c['tolerance_s'] * 1000:.0f} ms)")
        if not c["ok"] and c["phase"]:
            parts = ", ".join(f"{k} {v[0] * 1000:.0f} ms (model {v[1] * 1000:.0f})" for k, v in c["phases"].items())
            head += f"; the difference is in the {c['phase']} phase: {parts}"
        lines.append(head)
    return lines
