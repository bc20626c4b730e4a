"""Score handover predictors on drives: ``python -m pallas_tools.evaluate <folder> [...]``.

Usage::

    python -m pallas_tools.evaluate ../shared/data/ucc-5g                # leave-one-drive-out
    python -m pallas_tools.evaluate <folder> --map-from <other folder>   # knowledge from elsewhere
    python -m pallas_tools.evaluate --generate 8 --seed 1                # generated drives
    ... [--plot tavail.png] [--modes a3,cvh,history,combined] [--config cfg.json]

Each drive is replayed report by report through a UETrack; at every report the predictors run
(``now`` = the report's time) after the knowledge has seen the report (online learning is
causal). Knowledge learned offline comes only from the other drives (leave-one-drive-out) or
from ``--map-from``.

Per real handover h (time T, source A, target B), over the instants of its dwell on A:

- ``right@L``: the prediction at the last instant <= T - L names B (no instant: a miss);
- ``timed@L``: right@L and |t_ho_hat - T| <= tol (2 s on drive data, 0.5 s on generated);
- ``T_avail`` (paper §4.4, docs/model.md §5): T minus the start of the final run of instants that
  name B up to the handover; 0 if the last prediction before T is not B;
- ``E_early``: the largest amount by which a predicted t_ho preceded T before that run;
- time error at L: t_ho_hat - T for right predictions;
- the same restricted to handovers whose dwell on the source was at least L (``right_elig``,
  ``timed_elig``): a handover that follows the previous one by less than L cannot be called
  L ahead at all (the prediction is made while the source serves).

Connected-mode handovers (neither adjacent row idle) are scored apart from those involving
idle rows. Over the whole drive time: an *alarm* is an instant whose prediction is due within
``alarm_horizon_s`` (3 s); an alarm instant is *false* if no handover follows within
``alarm_horizon_s`` + 2 s; a maximal run of false alarm instants on one serving cell is one
false alarm (so a prediction stuck at "imminent" keeps raising them); *flips* are changes of the
reported target within one serving cell. Confidence reliability is reported after a
leave-one-drive-out isotonic calibration of the raw scores (``base.Calibrator``).

Output: a rich table per predictor and class, the plot (``--plot``), and a JSON summary as
the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time as _time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from pallas_common.controls import load_profile, merge_controls
from xapp.drivetest import Drive, read_drives
from xapp.predict.base import Calibrator, reliability
from xapp.predict.combined import TOP_K, HandoverPredictor
from xapp.predict.config import PredictorConfig
from xapp.predict.maps import Knowledge
from xapp.tracks import UETrack, batch_of_one

MODES = ("a3", "cvh", "places", "history", "combined")
LEADS = (1.0, 2.0, 3.0, 5.0)


@dataclass
class Trace:
    """One predictor's reported predictions at every instant of one drive. Shapes (K,)."""

    t: np.ndarray
    serving: np.ndarray
    target: np.ndarray       # -1: no prediction or unresolved target
    t_ho: np.ndarray         # NaN: no time
    score: np.ndarray        # raw confidence
    source: list[str] = field(default_factory=list)
    cand: np.ndarray | None = None       # (K, TOP_K) ranked candidate cells, -1 none (combined only)
    cand_p: np.ndarray | None = None     # (K, TOP_K) their uncalibrated probabilities


def profile_config(drives: Sequence[Drive]) -> PredictorConfig:
    """Defaults for the data's report rate: sparse logs (>= 0.5 s between rows, e.g. G-NetTrack at
    ~1 Hz) get a longer A3 trend window; E2-like reports (200 ms) keep the defaults."""
    dts = [np.median(np.diff([r.time for r in d.reports])) for d in drives if len(d.reports) > 2]
    if dts and float(np.median(dts)) >= 0.5:
        return drive_log_config()
    return PredictorConfig()


#: The descriptor profile that holds the drive-log predictor settings.
DRIVE_LOG_PROFILE = "drive-log"


def drive_log_config() -> PredictorConfig:
    """The profile for G-NetTrack-like logs (1 s rows, sparse GPS, one anonymous neighbour),
    chosen on the UCC drives (leave-one-drive-out): the location votes weigh more, and the
    combination gives a time only from a confident handover place, since A3 on the anonymous
    neighbour and CVH timing raised ~70 and ~20 false alarms/h for 1-2 points of timed@3.
    Issue 43: the handover place and the learned dwell give a time only with edge evidence
    (``combined.edge_evidence``), the place only from a score of 0.6 (62.1 -> 14.2 false
    alarms/h, the same right@2; docs/drive-data.md §5); the successor table reads the UE's last
    four cells and the previous cell gets a return vote in the first 8 s on a cell (right@2
    54.2% -> 57.7%, docs/drive-data.md §5.1). Its one home is the descriptor profile
    ``descriptors/profiles/drive-log.json``, which ``pallas replay --xapp-profile drive-log``
    merges into the xApp's controls (fields it leaves out take PredictorConfig's defaults)."""
    return PredictorConfig.from_dict(load_profile(DRIVE_LOG_PROFILE)["predictor"], where="drive-log profile")


def replay(drive: Drive, knowledge: Knowledge, cfg: PredictorConfig, modes: Sequence[str]) -> dict[str, Trace]:
    """Replay one drive through one predictor per mode sharing ``knowledge`` (updated online)."""
    preds = {m: HandoverPredictor(replace(cfg, mode=m), knowledge, learn_online=False) for m in modes}
    k = len(drive.reports)
    out = {m: Trace(np.empty(k), np.empty(k, dtype=np.int64), np.full(k, -1, dtype=np.int64),
                    np.full(k, np.nan), np.zeros(k), []) for m in modes}
    track = UETrack(drive.ue_id, capacity=max(2, cfg.window_reports),
                    max_neighbours=max([len(r.neighbours) for r in drive.reports] + [1]))
    # every mode's raw output from one computation of the sources (the per-mode predictors
    # would compute A3, CVH, places and history twice: once alone, once in the combination)
    shared = preds[modes[0]].combined if modes else None
    ue = [drive.ue_id]
    for i, r in enumerate(drive.reports):
        track.append(r)
        knowledge.observe(r)
        view = batch_of_one(track.view())
        now = np.array([r.time])
        raws = shared.modes(view, now, ue, modes)
        for m in modes:
            p = preds[m].report(raws[m], now, ue).get(0)
            tr = out[m]
            tr.t[i] = r.time
            tr.serving[i] = r.serving_cell
            if p is not None:
                tr.target[i] = p.target_cell
                tr.t_ho[i] = p.t_ho
                tr.score[i] = p.confidence
                tr.source.append(p.source)
                if p.candidates:
                    if tr.cand is None:
                        tr.cand, tr.cand_p = np.full((k, TOP_K), -1, np.int64), np.zeros((k, TOP_K))
                    for j, (c, q) in enumerate(p.candidates[:TOP_K]):
                        tr.cand[i, j], tr.cand_p[i, j] = c, q
            else:
                tr.source.append("")
    return out


def score_drive(drive: Drive, tr: Trace, tol_s: float, alarm_horizon_s: float) -> dict:
    """Per-handover records and drive-level alarm/flip counts for one predictor's trace."""
    hos = []
    t = tr.t
    prev_row = 0
    prev_t = t[0] if len(t) else 0.0
    for h in drive.handovers:
        row = h.row if h.row >= 0 else int(np.searchsorted(t, h.time - 1e-9))
        ks = np.arange(prev_row, row)
        ks = ks[(t[ks] < h.time) & (tr.serving[ks] == h.source_cell)] if ks.size else ks
        prev_row = row
        rec = {"time": h.time, "idle": h.idle, "kind": h.kind, "dwell": float(h.time - prev_t)}
        prev_t = h.time
        for L in LEADS:
            kk = ks[t[ks] <= h.time - L] if ks.size else ks
            if kk.size == 0:
                rec[f"right@{L:g}"] = False
                rec[f"timed@{L:g}"] = False
                rec[f"err@{L:g}"] = math.nan
                for n in range(1, TOP_K + 1):
                    rec[f"top{n}@{L:g}"] = False
                continue
            k = int(kk[-1])
            right = bool(tr.target[k] == h.target_cell)
            err = float(tr.t_ho[k] - h.time) if right else math.nan
            rec[f"right@{L:g}"] = right
            rec[f"timed@{L:g}"] = bool(right and abs(err) <= tol_s)
            rec[f"err@{L:g}"] = err
            for n in range(1, TOP_K + 1):
                rec[f"top{n}@{L:g}"] = bool(tr.cand is not None and (tr.cand[k, :n] == h.target_cell).any())
        tav, e_early = 0.0, 0.0
        if ks.size and tr.target[ks[-1]] == h.target_cell:
            j = ks.size - 1
            while j > 0 and tr.target[ks[j - 1]] == h.target_cell:
                j -= 1
            tav = float(h.time - t[ks[j]])
            before = tr.t_ho[ks[:j]]
            before = before[~np.isnan(before)]
            if before.size:
                e_early = float(max(0.0, np.max(h.time - before)))
        rec["t_avail"] = tav
        rec["e_early"] = e_early
        hos.append(rec)
    # alarms and flips
    ho_times = np.array([h.time for h in drive.handovers])
    with np.errstate(invalid="ignore"):
        alarm = (tr.target >= 0) & (tr.t_ho - t <= alarm_horizon_s)
    # an alarm instant is false if no handover follows within alarm_horizon_s + 2 s; false-alarm
    # episodes are maximal runs of false alarm instants on one serving cell
    nxt_ho = np.searchsorted(ho_times, t, side="right")
    if len(ho_times):
        ho_after = np.where(nxt_ho < len(ho_times), ho_times[np.minimum(nxt_ho, len(ho_times) - 1)], np.inf)
    else:
        ho_after = np.full(len(t), np.inf)
    false_inst = alarm & (ho_after - t > alarm_horizon_s + 2.0)
    episodes = int(np.sum(alarm[1:] & ~(alarm[:-1] & (tr.serving[1:] == tr.serving[:-1])))) + int(alarm[:1].sum())
    false_eps = int(np.sum(false_inst[1:] & ~(false_inst[:-1] & (tr.serving[1:] == tr.serving[:-1]))))
    false_eps += int(false_inst[:1].sum())
    starts = np.flatnonzero(false_inst & ~np.concatenate([[False], false_inst[:-1] & (tr.serving[1:] == tr.serving[:-1])]))
    false_src = _count_sources([tr.source[k] or "?" for k in starts.tolist()])
    same = (tr.serving[1:] == tr.serving[:-1]) & (tr.target[1:] >= 0) & (tr.target[:-1] >= 0)
    flips = int(np.sum(same & (tr.target[1:] != tr.target[:-1])))
    # reliability pairs: each instant with a prediction vs the next handover's target
    pairs_s, pairs_y = [], []
    nxt = np.searchsorted(ho_times, t, side="right")
    for k in np.nonzero(tr.target >= 0)[0]:
        if nxt[k] < len(drive.handovers):
            h = drive.handovers[nxt[k]]
            if h.source_cell == tr.serving[k]:
                pairs_s.append(float(tr.score[k]))
                pairs_y.append(bool(h.target_cell == tr.target[k]))
    # candidate pairs: (rank, uncalibrated probability, right) for every ranked candidate
    cand_pairs: list[tuple[int, float, bool]] = []
    if tr.cand is not None:
        for k in np.nonzero(tr.cand[:, 0] >= 0)[0]:
            if nxt[k] < len(drive.handovers):
                h = drive.handovers[nxt[k]]
                if h.source_cell == tr.serving[k]:
                    for j in range(TOP_K):
                        if tr.cand[k, j] >= 0:
                            cand_pairs.append((j, float(tr.cand_p[k, j]), bool(tr.cand[k, j] == h.target_cell)))
    return {"cand_pairs": cand_pairs, "handovers": hos, "episodes": episodes, "false_alarms": false_eps, "flips": flips,
            "hours": drive.duration_s / 3600.0, "pairs": (pairs_s, pairs_y),
            "sources": _count_sources(tr.source), "false_by_source": false_src}


def _count_sources(src: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in src:
        if s:
            out[s] = out.get(s, 0) + 1
    return out


def _rank_pairs(pairs: list[list[tuple[int, float, bool]]], rank: int) -> tuple[list[float], list[bool]]:
    """The (probabilities, rights) of candidates at ``rank`` (0-based) over drives' pairs."""
    ps = [(q, y) for d in pairs for (j, q, y) in d if j == rank]
    return [q for q, _ in ps], [y for _, y in ps]


def candidate_reliability(per: list[dict]) -> dict:
    """Leave-one-drive-out calibration of the ranked candidates: for each drive, each rank's
    ``Calibrator`` is fitted on the other drives' candidates of that rank and applied to this
    drive's. Returns {"table": reliability rows over every candidate (bins of 0.2: mean
    calibrated probability, observed frequency, count), "by_rank": the same per rank,
    "max_gap": the largest |mean probability - frequency| over the pooled bins}."""
    all_pairs = [p["cand_pairs"] for p in per]
    conf: list[float] = []
    right: list[bool] = []
    rank: list[int] = []
    for i, mine in enumerate(all_pairs):
        others = all_pairs[:i] + all_pairs[i + 1:]
        cals = [Calibrator().fit(*_rank_pairs(others, j)) for j in range(TOP_K)]
        for j, q, y in mine:
            conf.append(float(cals[j](q)))
            right.append(y)
            rank.append(j)
    tab = reliability(conf, right)
    r = np.asarray(rank)
    c, y = np.asarray(conf), np.asarray(right)
    by = {f"rank{j + 1}": reliability(c[r == j].tolist(), y[r == j].tolist()) for j in range(TOP_K)}
    gap = max((abs(b["mean_conf"] - b["accuracy"]) for b in tab), default=float("nan"))
    return {"table": tab, "by_rank": by, "max_gap": round(float(gap), 3)}


def summarise(per_drive: list[dict], cls: str) -> dict:
    """Aggregate per-handover records of one class (``connected``, ``idle``, ``all``)."""
    recs = [r for d in per_drive for r in d["handovers"]
            if cls == "all" or (cls == "idle") == r["idle"]]
    n = len(recs)
    out: dict = {"n": n}
    if n == 0:
        return out
    for L in LEADS:
        out[f"right@{L:g}"] = round(sum(r[f"right@{L:g}"] for r in recs) / n, 4)
        out[f"timed@{L:g}"] = round(sum(r[f"timed@{L:g}"] for r in recs) / n, 4)
        for q in range(1, TOP_K + 1):
            out[f"top{q}@{L:g}"] = round(sum(r.get(f"top{q}@{L:g}", False) for r in recs) / n, 4)
        errs = np.array([r[f"err@{L:g}"] for r in recs if r[f"err@{L:g}"] == r[f"err@{L:g}"]])
        out[f"err_med@{L:g}"] = round(float(np.median(errs)), 3) if errs.size else None
        out[f"err_p90abs@{L:g}"] = round(float(np.percentile(np.abs(errs), 90)), 3) if errs.size else None
        elig = [r for r in recs if r["dwell"] >= L]
        out[f"eligible@{L:g}"] = round(len(elig) / n, 4)
        out[f"right_elig@{L:g}"] = round(sum(r[f"right@{L:g}"] for r in elig) / max(1, len(elig)), 4)
        out[f"timed_elig@{L:g}"] = round(sum(r[f"timed@{L:g}"] for r in elig) / max(1, len(elig)), 4)
    tav = np.array([r["t_avail"] for r in recs])
    out["t_avail_med"] = round(float(np.median(tav)), 3)
    out["t_avail_mean"] = round(float(tav.mean()), 3)
    out["t_avail_ge2"] = round(float(np.mean(tav >= 2.0)), 4)
    out["e_early_med"] = round(float(np.median([r["e_early"] for r in recs])), 3)
    return out


def drive_knowledge(drives: Sequence[Drive], cfg: PredictorConfig) -> tuple[Knowledge, list[Knowledge]]:
    """The knowledge of every drive, for leave-one-drive-out: (the total, one part per drive in
    ``drives``' order, all in the total's map frame). A drive's held-out knowledge is
    ``total.copy()`` with its part merged at weight -1."""
    tile, sm, bw = cfg.cvh.tile_m, cfg.history.smoothing, cfg.history.backoff_weight
    parts: list[Knowledge] = []
    total = Knowledge.create(tile, sm, bw)
    for d in drives:
        kd = Knowledge.create(tile, sm, bw)
        kd.assoc.frame = total.assoc.frame
        kd.learn_drive(d)
        if total.assoc.frame is None:
            total.assoc.frame = kd.assoc.frame
        total.merge(kd)
        parts.append(kd)
    return total, parts


def evaluate(drives: Sequence[Drive], cfg: PredictorConfig, modes: Sequence[str] = MODES,
             map_from: Sequence[Drive] | None = None, tol_s: float = 2.0, log=None) -> dict:
    """Leave-one-drive-out (or ``map_from``) evaluation. Returns {mode: summary}, plus the raw
    T_avail lists under ``_tavail`` for plotting."""
    if map_from is not None:
        tile, sm, bw = cfg.cvh.tile_m, cfg.history.smoothing, cfg.history.backoff_weight
        base = Knowledge.from_drives(map_from, tile, sm, bw)
        folds = [(d, None) for d in drives]
    else:
        base, parts = drive_knowledge(drives, cfg)
        folds = list(zip(drives, parts))
    scored: dict[str, list[dict]] = {m: [] for m in modes}
    for i, (d, part) in enumerate(folds):
        k = base.copy()
        if part is not None:
            k.merge(part, -1)
        traces = replay(d, k, cfg, modes)
        for m in modes:
            scored[m].append(score_drive(d, traces[m], tol_s, cfg.alarm_horizon_s))
        if log:
            log(f"[{i + 1}/{len(folds)}] {d.ue_id}: {len(d.reports)} reports, {len(d.handovers)} HOs")
    hours = sum(d.duration_s for d in drives) / 3600.0
    res: dict = {"_tavail": {}}
    for m in modes:
        per = scored[m]
        s = {"connected": summarise(per, "connected"), "idle": summarise(per, "idle"), "all": summarise(per, "all")}
        s["false_alarms_per_h"] = round(sum(p["false_alarms"] for p in per) / max(hours, 1e-9), 2)
        s["alarm_episodes_per_h"] = round(sum(p["episodes"] for p in per) / max(hours, 1e-9), 2)
        s["flips_per_h"] = round(sum(p["flips"] for p in per) / max(hours, 1e-9), 2)
        srcs: dict[str, int] = {}
        for p in per:
            for a, b in p["sources"].items():
                srcs[a] = srcs.get(a, 0) + b
        s["sources"] = srcs
        fsrc: dict[str, int] = {}
        for p in per:
            for a, b in p["false_by_source"].items():
                fsrc[a] = fsrc.get(a, 0) + b
        s["false_alarms_per_h_by_source"] = {a: round(b / max(hours, 1e-9), 2) for a, b in sorted(fsrc.items())}
        # leave-one-drive-out calibration of the raw scores, then reliability
        conf, corr = [], []
        for j, p in enumerate(per):
            others_s = [x for q, o in enumerate(per) if q != j for x in o["pairs"][0]]
            others_y = [x for q, o in enumerate(per) if q != j for x in o["pairs"][1]]
            cal = Calibrator().fit(others_s, others_y)
            conf += [cal(x) for x in p["pairs"][0]]
            corr += p["pairs"][1]
        s["reliability"] = reliability(conf, corr)
        all_s = [x for p in per for x in p["pairs"][0]]
        all_y = [x for p in per for x in p["pairs"][1]]
        res.setdefault("_calibration", {})[m] = Calibrator().fit(all_s, all_y).to_dict()
        if any(p["cand_pairs"] for p in per):
            s["candidates"] = candidate_reliability(per)
            res.setdefault("_calibration", {}).update(
                {f"{m}@{j + 1}": Calibrator().fit(*_rank_pairs([p["cand_pairs"] for p in per], j)).to_dict()
                 for j in range(1, TOP_K)})
        s["brier"] = round(float(np.mean((np.array(conf) - np.array(corr, dtype=float)) ** 2)), 4) if conf else None
        res[m] = s
        res["_tavail"][m] = [r["t_avail"] for p in per for r in p["handovers"] if not r["idle"]]
    res["_meta"] = {"drives": len(drives), "hours": round(hours, 3),
                    "handovers": sum(len(d.handovers) for d in drives),
                    "connected_handovers": sum(len(d.connected_handovers) for d in drives),
                    "tol_s": tol_s, "protocol": "map-from" if map_from is not None else "leave-one-drive-out"}
    return res


def print_tables(res: dict, console=None) -> None:
    """A rich table per predictor (rows: handover class)."""
    from rich.console import Console
    from rich.table import Table

    con = console or Console(file=sys.stderr, width=240)
    meta = res["_meta"]
    for m, s in res.items():
        if m.startswith("_"):
            continue
        tb = Table(title=f"{m}: {meta['drives']} drives, {meta['hours']} h, {meta['protocol']}, "
                         f"tol {meta['tol_s']} s; false alarms {s['false_alarms_per_h']}/h "
                         f"(alarm episodes {s['alarm_episodes_per_h']}/h), flips {s['flips_per_h']}/h")
        cols = ["class", "n", "right@1", "right@2", "right@3", "right@5", "timed@2", "timed@3",
                "err_med@3", "err_p90abs@3", "T_avail med", "T_avail>=2s", "E_early med",
                "dwell>=2s", "right@2|dwell>=2", "timed@2|dwell>=2"]
        for c in cols:
            tb.add_column(c, justify="right")
        for cls in ("connected", "idle", "all"):
            x = s[cls]
            if not x.get("n"):
                tb.add_row(cls, "0", *[""] * (len(cols) - 2))
                continue
            pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
            tb.add_row(cls, str(x["n"]), pct(x["right@1"]), pct(x["right@2"]), pct(x["right@3"]), pct(x["right@5"]),
                       pct(x["timed@2"]), pct(x["timed@3"]), str(x["err_med@3"]), str(x["err_p90abs@3"]),
                       f"{x['t_avail_med']:.1f}", pct(x["t_avail_ge2"]), f"{x['e_early_med']:.1f}",
                       pct(x["eligible@2"]), pct(x["right_elig@2"]), pct(x["timed_elig@2"]))
        con.print(tb)
        rel = ", ".join(f"{r['bin']}: {r['accuracy']:.2f} (n={r['n']})" for r in s["reliability"])
        con.print(f"  reliability (calibrated confidence bin: observed accuracy): {rel}; Brier {s['brier']}")
        if "candidates" in s:
            x = s["connected"]
            cov = ", ".join(f"top-{q} {100 * x[f'top{q}@2']:.1f}%" for q in range(1, TOP_K + 1))
            con.print(f"  ranked candidates, connected-mode handovers, target among them 2 s ahead: {cov}")
            con.print("  candidate reliability (leave-one-drive-out calibration; bin: mean probability -> "
                      f"observed frequency, count; largest gap {s['candidates']['max_gap']}):")
            for b in s["candidates"]["table"]:
                con.print(f"    {b['bin']}: {b['mean_conf']:.3f} -> {b['accuracy']:.3f}  (n={b['n']})")
            for rk, tb in s["candidates"]["by_rank"].items():
                con.print(f"    {rk}: " + ", ".join(f"{b['bin']}: {b['mean_conf']:.2f}->{b['accuracy']:.2f} (n={b['n']})"
                                                    for b in tb))
        con.print(f"  sources: {s['sources']}; false alarms/h by the source that raised them: "
                  f"{s['false_alarms_per_h_by_source']}")


def plot_tavail(res: dict, path: str | Path) -> None:
    """Empirical CDF of T_avail (connected-mode HOs) per predictor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for m, v in res["_tavail"].items():
        if not v:
            continue
        x = np.sort(np.minimum(np.asarray(v), 30.0))
        ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", label=m)
    ax.set_xlabel("T_avail (s): target stably right before the handover (capped at 30 s)")
    ax.set_ylabel("share of handovers with T_avail <= x")
    ax.set_title(f"{res['_meta']['drives']} drives, {res['_meta']['connected_handovers']} connected-mode HOs")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _generated(n: int, seed: int, duration_s: float, n_routes: int | None, speed_spread: float) -> list[Drive]:
    from pallas_tools.radio import generate_drives

    _, res = generate_drives(n=n, duration_s=duration_s, seed=seed, n_routes=n_routes, speed_spread=speed_spread)
    return [r.drive for r in res]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pallas_tools.evaluate", description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", help="folder of drive-test CSVs (recursive)")
    ap.add_argument("--map-from", help="learn the knowledge from this folder instead of leave-one-drive-out")
    ap.add_argument("--generate", type=int, default=0, help="score N generated drives instead of a folder")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=600.0, help="generated drive length (s)")
    ap.add_argument("--routes", type=int, default=0, help="generated drives share this many routes (0: all distinct)")
    ap.add_argument("--speed-spread", type=float, default=0.2, help="generated speeds vary by +-this share")
    ap.add_argument("--limit", type=int, default=0, help="score only the first N drives")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--config", help="JSON file of PredictorConfig overrides (nested objects merge key by key)")
    ap.add_argument("--tol", type=float, default=None, help="time tolerance (s); default 2 (files) / 0.5 (generated)")
    ap.add_argument("--plot", help="save the T_avail distribution here (PNG)")
    ap.add_argument("--save-calibration", help="save the per-predictor confidence calibration (JSON) fitted on "
                                                "all scored drives, for HandoverPredictor(calibrators=...)")
    a = ap.parse_args(argv)
    if not a.folder and not a.generate:
        ap.error("give a folder or --generate N")
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    t0 = _time.perf_counter()
    if a.generate:
        drives = _generated(a.generate, a.seed, a.duration, a.routes or None, a.speed_spread)
        tol = 0.5 if a.tol is None else a.tol
    else:
        drives = read_drives(a.folder)
        tol = 2.0 if a.tol is None else a.tol
    if a.limit:
        drives = drives[: a.limit]
    if not drives:
        print(f"no drives found in {a.folder}", file=sys.stderr)
        return 2
    cfg = profile_config(drives)
    if a.config:
        try:
            over = json.loads(Path(a.config).read_text())
            cfg = PredictorConfig.from_dict(merge_controls(cfg.to_dict(), over), where="--config")
        except (OSError, ValueError) as exc:   # JSONDecodeError is a ValueError
            print(f"--config {a.config}: {exc}", file=sys.stderr)
            return 2
    map_from = read_drives(a.map_from) if a.map_from else None
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown modes {bad}; choose from {MODES}")
    res = evaluate(drives, cfg, modes, map_from, tol, log=log)
    print_tables(res)
    if a.plot:
        plot_tavail(res, a.plot)
        log(f"T_avail plot: {a.plot}")
    if a.save_calibration:
        Path(a.save_calibration).write_text(json.dumps(res["_calibration"], indent=1))
        log(f"calibration: {a.save_calibration}")
    summary = {k: v for k, v in res.items() if k not in ("_tavail", "_calibration")}
    summary["_meta"]["seconds"] = round(_time.perf_counter() - t0, 1)
    summary["_meta"]["config"] = cfg.to_dict()
    print(json.dumps(summary, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
