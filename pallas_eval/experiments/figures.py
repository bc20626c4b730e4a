"""The figures of ``pallas experiment``: our values as bars and lines, the paper's as black
marks (stars for points, shaded bands or dotted lines for ranges). Times are plotted in ms
unless an axis says s; every function takes the experiment's summary rows and a PNG path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from pallas_common.schemes import (ABLATIONS, COMPARED, CTHO, DETOUR, FULL_COPY, NO_RC, NO_SM, PALLAS,
                                   RECOMPUTATION, RECOVERING, label)


# ---------------------------------------------------------------------------------------------
# The paper's figures (pallas experiment): our values as bars/lines, the paper's as black marks
# ---------------------------------------------------------------------------------------------

SCHEME_COLOURS = {PALLAS: "tab:green", DETOUR: "tab:purple", FULL_COPY: "tab:red",
                  RECOMPUTATION: "tab:orange", CTHO: "tab:blue", NO_RC: "tab:brown", NO_SM: "tab:olive"}
PAPER_MARK = dict(marker="*", color="black", ms=11, ls="none", zorder=5)


def _figures(nrows: int, ncols: int, size: tuple[float, float]):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(nrows, ncols, figsize=size, squeeze=False)
    return fig, axes


def _save(fig, path: Path, title: str) -> Path:
    import matplotlib.pyplot as plt
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(ax, groups: Sequence[str], series: dict[str, Sequence[float]], err: dict[str, Sequence[float]] | None = None,
          scale: float = 1000.0) -> list[float]:
    """Grouped bars, one colour per scheme; returns the x centre of each group."""
    n = max(len(series), 1)
    width = 0.8 / n
    xs = np.arange(len(groups), dtype=np.float64)
    for i, (name, vals) in enumerate(series.items()):
        e = None if not err or name not in err else np.asarray(err[name]) * scale
        ax.bar(xs - 0.4 + width * (i + 0.5), np.asarray(vals) * scale, width, yerr=e, capsize=2,
               color=SCHEME_COLOURS.get(name), label=label(name))
    ax.set_xticks(xs)
    ax.set_xticklabels(groups)
    ax.grid(alpha=0.3, axis="y")
    return list(xs)


def _headroom(ax, factor: float = 30.0) -> None:
    """Room above the tallest bar (log axis) so the legend does not cover the data."""
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * factor)


def plot_figure5(path: Path, settings: Sequence[dict], traces: Sequence[dict], models: Sequence[str]) -> Path:
    """Figure 5: (a)-(c) mean SIT per scheme per goodput (one panel per model, log scale),
    (d) mean ITL per scheme per model, (e) mean SIT per scheme per goodput trace. The paper's
    stated values are marked in black (Qwen3-32B at 100 Mbit/s in (c); the Pallas ITL range in
    (d); the Pallas SIT range in (e))."""
    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(15.0, 8.0))
    gs = fig.add_gridspec(2, 3)
    top = [fig.add_subplot(gs[0, i]) for i in range(3)]
    target = (PALLAS, *RECOVERING)
    for i, (ax, m) in enumerate(zip(top, models)):
        rows = [s for s in settings if s["model"] == m]
        xs = _bars(ax, [f"{s['goodput_mbps']:.0f}" for s in rows],
                   {k: [s["sit_mean_s"][k] for s in rows] for k in target})
        ax.set_yscale("log")
        ax.set_xlabel("inter-gNB goodput (Mbit/s)")
        ax.set_ylabel("mean SIT (ms, log)")
        ax.set_title(f"({'abc'[i]}) {m}: SIT")
        if m == "qwen3-32b":
            j = [s["goodput_mbps"] for s in rows].index(100.0) if any(s["goodput_mbps"] == 100.0 for s in rows) else 0
            ax.plot([xs[j] - 0.3], [321.0], label="paper: Pallas 321 ms", **PAPER_MARK)
        _headroom(ax)
        ax.legend(fontsize=7, ncol=2, loc="upper right")
    ax = fig.add_subplot(gs[1, 0])
    itl = {k: [np.mean([s["itl_mean_s"][k] for s in settings if s["model"] == m]) for m in models]
           for k in COMPARED}
    _bars(ax, list(models), itl)
    ax.set_yscale("log")
    ax.axhline(100, color="grey", ls="--", lw=1, label="SLO 100 ms")
    for lo_hi in (28.0, 48.0):
        ax.axhline(lo_hi, color="black", ls=":", lw=1)
    ax.plot([], [], color="black", ls=":", label="paper: Pallas ITL 28-48 ms")
    ax.set_ylabel("mean ITL, 256 tokens after the HO (ms, log)")
    ax.set_title("(d) ITL (mean over goodputs)")
    _headroom(ax, 8.0)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    ax = fig.add_subplot(gs[1, 1:])
    labels = [f"{t['model']}\n{t['trace']} ({t['trace_mean_mbps']:.0f} Mbit/s)" for t in traces]
    _bars(ax, labels, {k: [t[k] for t in traces] for k in target})
    ax.set_yscale("log")
    ax.axhspan(204, 316, color="black", alpha=0.15, label="paper: Pallas 204-316 ms")
    ax.set_ylabel("mean SIT (ms, log)")
    ax.set_title("(e) time-varying goodput (synthetic normal / blockage traces)")
    ax.tick_params(axis="x", labelsize=8)
    _headroom(ax)
    ax.legend(fontsize=7, ncol=3, loc="upper right")
    return _save(fig, path, "Figure 5: single handover (simulate mode; the paper's values in black)")


def plot_table2(path: Path, table: Sequence[dict], detour_hops: dict[str, dict], models: Sequence[str]) -> Path:
    """Table 2 as a figure: mean and P99 SIT per scheme per model (log scale; the paper's Pallas
    range shaded), mean and P99 ITL, and Detour's ITL against the hop count."""
    fig, axes = _figures(1, 3, (15.0, 4.0))
    schemes = (PALLAS, *RECOVERING, DETOUR)
    ax = axes[0][0]
    get = lambda s, col: [next(t[col] for t in table if t["model"] == m and t["scheme"] == s) / 1000 for m in models]  # noqa: E731
    xs = _bars(ax, list(models), {s: get(s, "sit_mean_ms") for s in schemes[:4]})
    ax.plot(np.array(xs) - 0.3, [v * 1000 for v in get(PALLAS, "sit_p99_ms")], "v", color="tab:green",
            ls="none", label="Pallas P99")
    ax.axhspan(153.8, 323.8, color="black", alpha=0.12, label="paper: Pallas mean 153.8-323.8 ms")
    ax.set_yscale("log")
    ax.set_ylabel("SIT (ms, log)")
    ax.set_title("SIT per handover (bars: mean)")
    _headroom(ax, 20.0)
    ax.legend(fontsize=7, ncol=2, loc="upper right")
    ax = axes[0][1]
    _bars(ax, list(models), {s: get(s, "itl_mean_ms") for s in (PALLAS, DETOUR)})
    ax.plot(np.array(xs) - 0.2, [v * 1000 for v in get(PALLAS, "itl_p99_ms")], "v", color="tab:green", ls="none",
            label="Pallas P99")
    ax.plot(np.array(xs) + 0.2, [v * 1000 for v in get(DETOUR, "itl_p99_ms")], "v", color="tab:purple", ls="none",
            label="Detour P99")
    ax.axhspan(25.1, 66.7, color="black", alpha=0.12, label="paper: Pallas mean 25.1-66.7 ms")
    ax.axhline(100, color="grey", ls="--", lw=1, label="SLO 100 ms")
    ax.set_ylabel("ITL (ms)")
    ax.set_title("ITL (bars: token-weighted mean)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.6)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    ax = axes[0][2]
    for m in models:
        h = detour_hops[m]
        ax.plot(list(h), list(h.values()), "o-", label=m)
    ax.axhline(100, color="grey", ls="--", lw=1, label="SLO 100 ms")
    ax.set_xlabel("forwarding hops (handovers so far)")
    ax.set_ylabel("Detour ITL (ms)")
    ax.set_title("Detour's ITL growth with hops")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path, "Table 2: repeated handovers, 300±50 Mbit/s (simulate mode; paper's ranges shaded)")


def plot_figure6(path: Path, configs: Sequence[dict]) -> Path:
    """Figure 6: SIT (ms, left axis) and T_early (s, right axis) against the fixed window T_w,
    one panel per configuration, Pallas's selected window marked; the paper's selected point
    (1.64 s, 227.57 ms, T_early 0.017 s) marked with black stars on its configuration."""
    ncol = 3
    nrow = int(np.ceil(len(configs) / ncol))
    fig, axes = _figures(nrow, ncol, (13.0, 3.2 * nrow))
    for ax, c in zip(axes.flat, configs):
        w = np.asarray(c["windows_s"])
        ax.plot(w, np.asarray(c["sit_s"]) * 1000, "o-", ms=3, color="tab:green", label="SIT (fixed T_w)")
        ax.plot([c["selected_s"]], [c["selected_sit_s"] * 1000], "D", color="red", ms=7,
                label=f"Pallas: T_w*={c['selected_s']:.1f} s")
        ax.set_ylabel("SIT (ms)")
        ax.set_xlabel("prefetching window T_w (s)")
        ax2 = ax.twinx()
        ax2.plot(w, c["t_early_s"], "s--", ms=3, color="tab:blue", label="T_early (fixed T_w)")
        ax2.plot([c["selected_s"]], [c["selected_t_early_s"]], "D", color="darkred", ms=5)
        ax2.set_ylabel("T_early (s)")
        ax.axvline(c["selected_s"], color="red", lw=0.8, ls=":")
        if c["model"] == "qwen3-14b" and c["goodput_mbps"] == 300.0 and c["context"] == 3000:
            ax.plot([1.64], [227.57], label="paper: T_w* 1.64 s, 227.57 ms", **PAPER_MARK)
            ax2.plot([1.64], [0.017], **PAPER_MARK)
            ax.plot([0.0, 1.0], [1100.0, 250.0], "x", color="black", ms=8, label="paper Fig. 2: SIT at 0, 1 s")
            ax2.plot([4.0], [2.4], "x", color="black", ms=8)
        ax.set_title(f"{c['goodput_mbps']:.0f} Mbit/s, {c['model']}, {c['context']} tok", fontsize=9)
        ax.grid(alpha=0.3)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=6, loc="upper center")
    for ax in list(axes.flat)[len(configs):]:
        ax.set_visible(False)
    return _save(fig, path, "Figure 6: fixed windows vs the selected one (simulate mode; paper's points in black)")


def plot_figure8(path: Path, points: Sequence[dict]) -> Path:
    """Figure 8: mean and worst-UE SIT (ms) per contention configuration for Pallas and
    multi-user ctHO, and the residents' tail ITL (ms), error bars one standard deviation over
    the repetitions; the paper's 300 ms bound on Pallas's mean SIT as a dashed line."""
    fig, axes = _figures(1, 2, (13.0, 4.0))
    labels = [f"{p['kind']}\nn={p['migrations']} m={p['residents']}" for p in points]
    ax = axes[0][0]
    xs = np.arange(len(points))
    wd = 0.2
    for i, (key, name, col) in enumerate((("pallas_mean", "Pallas mean", "tab:green"),
                                          ("pallas_worst", "Pallas worst UE", "darkgreen"),
                                          ("ctho_mean", "ctHO (multi-user) mean", "tab:blue"),
                                          ("ctho_worst", "ctHO worst UE", "navy"))):
        ax.bar(xs - 0.3 + wd * i, [p[f"{key}_s"] * 1000 for p in points], wd,
               yerr=[p[f"{key}_sd_s"] * 1000 for p in points], capsize=2, color=col, label=name)
    ax.axhline(300, color="black", ls="--", lw=1, label="paper: Pallas mean < 300 ms")
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("SIT (ms, log)")
    ax.set_title("SIT under contention (n migrations, m residents)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    ax = axes[0][1]
    hi = [p for p in points if p["residents"] > 0]
    xs2 = np.arange(len(hi))
    ax.bar(xs2 - 0.2, [p["resident_itl_alone_s"] * 1000 for p in hi], 0.4, color="grey", label="residents alone")
    ax.bar(xs2 + 0.2, [p["tail_itl_s"] * 1000 for p in hi], 0.4, yerr=[p["tail_itl_sd_s"] * 1000 for p in hi],
           capsize=2, color="tab:orange", label="P99 with migration prefill")
    ax.axhline(100, color="grey", ls="--", lw=1, label="SLO 100 ms")
    ax.set_xticks(xs2)
    ax.set_xticklabels([f"{p['kind']}\nn={p['migrations']} m={p['residents']}" for p in hi], fontsize=7)
    ax.set_ylabel("resident ITL (ms)")
    ax.set_title("Resident requests' tail ITL")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    return _save(fig, path, "Figure 8: contention, Qwen3-14B, 2,000 tokens, 1 Gbit/s aggregate (10 reps, ±1 sd)")


def plot_figure9(path: Path, settings: Sequence[dict], models: Sequence[str]) -> Path:
    """Figure 9: mean SIT (ms, log) of Pallas, w/o RC and w/o SM per goodput, one panel per
    model; the paper's three values at Qwen3-14B, 300 Mbit/s marked with black stars."""
    fig, axes = _figures(1, len(models), (4.2 * len(models), 3.8))
    for ax, m in zip(axes[0], models):
        rows = [s for s in settings if s["model"] == m]
        xs = _bars(ax, [f"{s['goodput_mbps']:.0f}" for s in rows],
                   {v: [s[v] for s in rows] for v in (PALLAS, *ABLATIONS)})
        if m == "qwen3-14b":
            i = [s["goodput_mbps"] for s in rows].index(300.0)
            ax.plot([xs[i] - 0.27, xs[i], xs[i] + 0.27], [235, 12486, 655], label="paper (300 Mbit/s)", **PAPER_MARK)
        ax.set_yscale("log")
        ax.set_xlabel("inter-gNB goodput (Mbit/s)")
        ax.set_ylabel("mean SIT (ms, log)")
        ax.set_title(m)
        ax.legend(fontsize=7)
    return _save(fig, path, "Figure 9: ablation (simulate mode; paper's values in black)")


def plot_stress(path: Path, curves: Sequence[dict]) -> Path:
    """SIT (ms, log) against the imposed prediction lead T_avail per scheme, one panel per
    context; Pallas's preparation discarded (s) on a second axis."""
    ctxs = sorted({c["context"] for c in curves})
    fig, axes = _figures(1, len(ctxs), (4.4 * len(ctxs), 3.8))
    for ax, k in zip(axes[0], ctxs):
        cs = [c for c in curves if c["context"] == k]
        t = [c["t_avail_s"] for c in cs]
        for s in (PALLAS, *RECOVERING):
            ax.plot(t, [c[s] * 1000 for c in cs], "o-", ms=3, color=SCHEME_COLOURS[s], label=label(s))
        ax.set_yscale("log")
        ax.set_xlabel("prediction lead T_avail (s)")
        ax.set_ylabel("mean SIT (ms, log)")
        ax.set_title(f"Qwen3-14B, 300 Mbit/s, {k} tokens")
        ax.grid(alpha=0.3)
        ax2 = ax.twinx()
        ax2.plot(t, [c["discarded_s"] for c in cs], "x:", color="grey", label="Pallas: discarded preparation (s)")
        ax2.set_ylabel("discarded preparation (s)")
        ax2.set_ylim(0, max(0.05, 1.3 * max(c["discarded_s"] for c in cs)))
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        _headroom(ax, 8.0)
        ax.legend(h1 + h2, l1 + l2, fontsize=7, ncol=2, loc="upper right")
    return _save(fig, path, "Prediction stress: SIT vs T_avail (simulate mode; the paper's text gives no values)")


def plot_live(path: Path, rows: Sequence[dict], labels: Sequence[str], title: str,
              paper_ms: Sequence[float | None] | None = None, t_early_s: Sequence[float] | None = None) -> Path:
    """A live experiment: per row (a scheme or a variant), the mean SIT measured live beside the
    timing model's for the same handovers (ms, log), the live P99 as markers and, where given,
    the paper's value as a black star and ``t_early_s`` (the target's idle time, s) on a second
    axis."""
    fig, axes = _figures(1, 1, (max(7.5, 1.5 * len(rows)), 4.0))
    ax = axes[0][0]
    xs = np.arange(len(rows))
    ax.bar(xs - 0.2, [r["sit_mean_live_s"] * 1000 for r in rows], 0.4, color="tab:green", label="live (mean)")
    ax.bar(xs + 0.2, [r["sit_mean_model_s"] * 1000 for r in rows], 0.4, color="tab:grey",
           label="timing model, same handovers (mean)")
    ax.plot(xs - 0.2, [r["sit_p99_live_s"] * 1000 for r in rows], "v", color="darkgreen", ls="none", label="live P99")
    if paper_ms is not None and any(p is not None and np.isfinite(p) for p in paper_ms):
        px = [x for x, p in zip(xs, paper_ms) if p is not None and np.isfinite(p)]
        ax.plot(px, [p for p in paper_ms if p is not None and np.isfinite(p)], label="paper (mean)", **PAPER_MARK)
    ax.set_xticks(xs)
    ax.set_xticklabels(list(labels), fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("SIT (ms, log)")
    ax.grid(alpha=0.3, axis="y")
    _headroom(ax, 5.0)
    handles, names = ax.get_legend_handles_labels()
    if t_early_s is not None:
        ax2 = ax.twinx()
        ax2.plot(xs, list(t_early_s), "D", color="tab:grey", ms=6, ls="none",
                 label="engine's T_early at its triggers (s)")
        ax2.set_ylabel("T_early (s)")
        ax2.set_ylim(0, max(0.1, 1.5 * max([v for v in t_early_s if np.isfinite(v)] or [0.0])))
        h2, l2 = ax2.get_legend_handles_labels()
        handles, names = handles + h2, names + l2
    ax.legend(handles, names, fontsize=7, ncol=2, loc="upper left")
    return _save(fig, path, title)
