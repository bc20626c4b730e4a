"""Re-rank the combination's candidate targets: ``python -m pallas_tools.rerank <folder> [...]``.

Usage::

    # dump + numpy baselines (xApp env), then the learned re-rankers (needs lightgbm/scikit-learn)
    python -m pallas_tools.rerank ../shared/data/ucc-5g --dump /tmp/rank.npz
    python -m pallas_tools.rerank --fit /tmp/rank.npz            # numpy + lightgbm env is enough
    python -m pallas_tools.rerank ../shared/data/ucc-5g --nested 3 --dump /tmp/rank3.npz   # nested check
    python -m pallas_tools.rerank ../shared/data/ucc-5g --stack 3 --dump /tmp/stack.npz    # leak-free
    python -m pallas_tools.rerank --fit /tmp/stack.npz --stack 3
    python -m pallas_tools.rerank --generate 3 --seed 1          # generated drives

What it measures: how far a better *ranking* of the candidate targets could lift the combined
predictor's ``right@L`` (``pallas_tools.evaluate``), given the evidence the predictor has.

Dump (``dump``): every drive is replayed leave-one-drive-out exactly as ``evaluate.replay``
does it (the knowledge of the other drives, learned online from the held-out drive's reports as
they arrive; the combined predictor with its hysteresis). At every report (an *instant*) the
candidate cells are gathered: the full successor table P(B | serving A, previous C), the CVH,
handover-place and A3 votes, the combination's ranked and reported targets, the previous two
serving cells and the cells this drive went to after / came from into A the last time it was on
A. Each (instant, candidate) gets a feature row (``FEATURES``, all causal: they use the
reports up to the instant, the other drives' knowledge and what the held-out drive did before;
no cell identity is a feature, so a ranker cannot learn particular cells).
Shapes: ``X`` (N, F) float32, ``inst`` (N,) the row's instant, ``cell`` (N,), ``y`` (N,) whether
the candidate is the target of the handover that ends the instant's dwell (the label used
for training only); per instant (I,): ``drive``, ``t``, ``serving``, ``target`` (the reported
combined target), ``t_ho`` and ``next_target``; per handover (H,): ``ho_drive``, ``ho_target``,
``ho_idle`` and ``ho_at`` (H, len(LEADS)): the instant ``evaluate.score_drive`` scores at lead L
(the last one <= T - L on the source cell), -1 none.

Figures (connected-mode handovers, ``right@L`` as ``evaluate`` scores it: the named cell at
the instant ``ho_at`` is the target; no instant is a miss):

- ``ceiling``: the target is among the instant's candidates (no ranking can do better);
- ``combination``: the reported combined target (what ``evaluate`` prints: the check that the
  dump replays the predictor exactly);
- ``history p2`` / ``memory rule``: n-gram baselines (the most likely successor; the cell this
  drive went to from A last time, else the successor);
- ``linear``: a conditional logit (softmax over an instant's candidates) over the features,
  fitted by numpy;
- ``lightgbm``: a LambdaRank gradient-boosted ranker (``--fit``; lightgbm, else scikit-learn's
  HistGradientBoostingClassifier on the rows).

The learned rankers are fitted leave-one-drive-out (or ``--folds K`` groups of drives): on the
other drives' instants that have the target among their candidates (``--train-lead``: only
those at most that many seconds before their next cell change), then rank the held-out drive's.
Their top-2 and top-3 are scored like ``top{n}@L``. The false alarms do not change: the
re-ranked predictor keeps the combination's time (an alarm is about *when*, not *which* cell).
``flips/h`` counts changes of the named cell on one serving cell: the re-rankers name the raw
per-instant best (no hysteresis), the combination its reported (held) target.

Leakage (why the plain protocol overstates a learned ranker): every drive's features come from
one shared total of counts less the drive's own (leave-one-out). A tuple of counts (n(A,B),
N(A), n(B,A), ...) nearly identifies a cell pair, and its deficit against the total is the
drive's own transitions, i.e. its labels: the classic leave-one-out target-encoding leak. A
ranker trained on such rows learns "a little below the usual count -> the target", and the
held-out drive's features carry the same deficit. The combination learns nothing, so
``evaluate`` is not affected. ``--nested K`` (per group of K drives, the other drives dumped
with knowledge lacking the group; each fold trained on those) and ``--group-knowledge`` (the
scored drives' knowledge lacks their group too) remove the shared total across train and test;
``--stack K`` removes it altogether: the knowledge from one group of drives, the ranker trained
on a second and scored on a third (every ordered pair; each drive scored twice), the combination
scored on the same dumps.

Measured on ../shared/data/ucc-5g (907 connected-mode handovers; right@2):
- plain LOO: ceiling 80.9%, combination 54.2%, linear 53.5%, LightGBM 61.1% (top-3 76.1%; the 43
  features before the map shares and fix age were added);
- clean 3-fold (``--nested 3 --group-knowledge``): ceiling 78.1%, combination 52.6%, linear 50.4%,
  LightGBM 45.3% (it learned the deficit cue, absent at test);
- stacked 3 groups (``--stack 3``; knowledge from 13 drives): ceiling 73.2%, combination 46.7%,
  linear 45.1%, LightGBM 46.9% (top-3 66.9%).
A learned re-ranker on these features matches the combination; it does not beat it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time as _time
from typing import Sequence

import numpy as np

LEADS = (1.0, 2.0, 3.0, 5.0)

FEATURES = (
    # successor statistics of the other drives (+ this drive so far, learned online)
    "p2", "p1", "p2_rank", "log_n1", "log_n2", "log_n2_rev", "log_n1_rev", "log_N1", "hist_entropy",
    # the sources' votes
    "cvh", "cvh_score", "places", "places_score", "places_dt", "a3", "a3_score", "a3_dt",
    # the combination
    "reported", "raw_target", "comb_share", "comb_rank",
    # this drive's own past (route memory)
    "is_prev", "is_prev_recent", "is_prev2", "served_before", "log_served_n", "log_since_served",
    "drive_next", "drive_prev", "drive_n_ab", "drive_tri", "drive_tri_rev",
    # the other drives' association map at the dead-reckoned position, and 50 / 100 m ahead
    "assoc_here", "assoc_50", "assoc_100",
    # time on the serving cell
    "log_dwell", "log_dwell_med", "dwell_ratio",
    # radio and motion (per instant)
    "rsrp", "rsrp_slope", "nb_gap", "edge", "speed", "hd_sin", "hd_cos", "n_cand", "fix_age",
)
F = len(FEATURES)
_FI = {f: i for i, f in enumerate(FEATURES)}
#: how many entries of the successor table become candidates (by probability)
TABLE_K = 8
#: ``comb_rank`` of a cell the combination did not rank
TOP_RANK_NONE = 9


# ---------------------------------------------------------------------------------------------
# dump (needs the xApp's code)
# ---------------------------------------------------------------------------------------------
def _slope(t: np.ndarray, y: np.ndarray) -> float:
    ok = np.isfinite(t) & np.isfinite(y)
    if ok.sum() < 3:
        return 0.0
    t, y = t[ok], y[ok]
    dt = t - t.mean()
    sxx = float((dt * dt).sum())
    return float((dt * (y - y.mean())).sum() / sxx) if sxx > 1e-9 else 0.0


def _ho_rows(drive, t: np.ndarray, serving: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per instant, the target of the handover ending its dwell (-1 none), and per handover the
    instants ``score_drive`` considers (its dwell on the source), as ``score_drive`` picks them."""
    nxt = np.full(len(t), -1, np.int64)
    out = []
    prev_row = 0
    for h in drive.handovers:
        row = h.row if h.row >= 0 else int(np.searchsorted(t, h.time - 1e-9))
        ks = np.arange(prev_row, row)
        ks = ks[(t[ks] < h.time) & (serving[ks] == h.source_cell)] if ks.size else ks
        prev_row = row
        nxt[ks] = h.target_cell
        out.append(ks)
    return nxt, out


def dump_drive(drive, knowledge, cfg) -> dict:
    """Replay one drive (as ``evaluate.replay``, combined mode) and gather its candidate rows."""
    from dataclasses import replace

    from xapp.predict.combined import HandoverPredictor
    from xapp.tracks import UETrack, batch_of_one

    pred = HandoverPredictor(replace(cfg, mode="combined"), knowledge, learn_online=False)
    comb = pred.combined
    trans, dwell = knowledge.trans, knowledge.dwell
    track = UETrack(drive.ue_id, capacity=max(2, cfg.window_reports),
                    max_neighbours=max([len(r.neighbours) for r in drive.reports] + [1]))
    ue = [drive.ue_id]
    K = len(drive.reports)
    inst_t, inst_s = np.empty(K), np.empty(K, np.int64)
    inst_target, inst_tho = np.full(K, -1, np.int64), np.full(K, np.nan)
    rows: list[np.ndarray] = []
    r_inst: list[int] = []
    r_cell: list[int] = []
    seq: list[int] = []          # this drive's serving cells, one per dwell
    left: dict[int, float] = {}  # when this drive last left each cell
    served_n: dict[int, int] = {}
    dmed: dict[tuple[int, int], float] = {}
    entered = math.nan
    fix: tuple[float, float, float, float, float] | None = None   # (t, x, y, speed, heading) of the newest fix
    assoc = knowledge.assoc
    for i, r in enumerate(drive.reports):
        track.append(r)
        knowledge.observe(r)
        if not seq or seq[-1] != r.serving_cell:
            if seq:
                left[seq[-1]] = r.time
                entered = 0.5 * (r.time + drive.reports[i - 1].time)
            seq.append(r.serving_cell)
            served_n[r.serving_cell] = served_n.get(r.serving_cell, 0) + 1
        if r.lat == r.lat and r.lon == r.lon and assoc.frame is not None:
            x, y = assoc.frame.xy(r.lat, r.lon)
            if fix is None or (float(x), float(y)) != fix[1:3]:
                fix = (r.time, float(x), float(y), r.speed_mps, r.heading_deg)
        view = batch_of_one(track.view())
        now = np.array([r.time])
        src = comb.sources(view, now, ue)
        raw = comb.combine(src, now)
        p = pred.report(raw, now, ue)
        inst_t[i], inst_s[i] = r.time, r.serving_cell
        rep = int(p.cell[0]) if p.has[0] else -1
        if p.has[0]:
            inst_target[i], inst_tho[i] = rep, float(p.t_ho[0])
        a = r.serving_cell
        c = seq[-2] if len(seq) >= 2 else -1
        c2 = seq[-3] if len(seq) >= 3 else -1
        # this drive's past visits to A (before the current one)
        d_next = d_prev = -1
        for j in range(len(seq) - 2, -1, -1):
            if seq[j] == a:
                d_next = seq[j + 1]
                d_prev = seq[j - 1] if j >= 1 else -1
                break
        d_ab: dict[int, int] = {}
        d_tri: set[int] = set()
        d_rev: set[int] = set()
        for j in range(len(seq) - 1):
            if seq[j] == a:
                d_ab[seq[j + 1]] = d_ab.get(seq[j + 1], 0) + 1
                if j >= 1 and seq[j - 1] == c:
                    d_tri.add(seq[j + 1])
                if j >= 1 and seq[j + 1] == c:
                    d_rev.add(seq[j - 1])
        tab = trans.probs_cached(a, c)
        top = sorted(tab.items(), key=lambda kv: -kv[1])[:TABLE_K]
        p1tab = trans.probs_cached(a, -1)
        rank_of = {b: q for q, (b, _) in enumerate(sorted(tab.items(), key=lambda kv: -kv[1]))}
        n1 = trans.n1.get(a, {})
        n2 = trans.n2.get((c, a), {}) if c >= 0 else {}
        N1 = sum(max(v, 0) for v in n1.values())
        pv = np.array([q for q in tab.values() if q > 0])
        ent = float(-(pv / pv.sum() * np.log(pv / pv.sum())).sum()) if pv.size else 0.0
        cv, pl, f = src.cv, src.pl, src.f
        cands = [b for b, _ in top]
        comb_rank: dict[int, tuple[int, float]] = {}
        if raw.cand_cell is not None:
            for q in range(raw.cand_cell.shape[1]):
                b = int(raw.cand_cell[0, q])
                if b >= 0:
                    comb_rank.setdefault(b, (q, float(raw.cand_raw[0, q])))
                    cands.append(b)
        votes = (int(cv.cell[0]) if cv.has[0] else -1, int(pl.cell[0]) if pl.has[0] else -1,
                 int(src.a3_cell[0]) if f.has[0] else -1)
        cands += list(votes) + [rep, int(raw.cell[0]) if raw.has[0] else -1, c, c2, d_next, d_prev]
        seen = set()
        cands = [b for b in cands if b >= 0 and b != a and not (b in seen or seen.add(b))]
        # per-instant radio and motion
        v = track.view()
        on = (v.serving_cell == a) & (v.time >= r.time - 5.0)
        slope = _slope(v.time[on], v.rsrp_dbm[on].astype(np.float64))
        nb = np.asarray(v.nb_rsrp_dbm[-1], np.float64) if v.nb_rsrp_dbm.ndim == 2 else np.zeros(0)
        nb_gap = float(np.nanmax(nb) - r.rsrp_dbm) if nb.size and np.isfinite(nb).any() else np.nan
        dwell_now = r.time - entered if entered == entered else np.nan
        hd = math.radians(r.heading_deg) if r.heading_deg == r.heading_deg else np.nan
        base = [r.rsrp_dbm, slope, nb_gap, float(src.edge[0]), r.speed_mps, math.sin(hd), math.cos(hd),
                float(len(cands)), r.time - fix[0] if fix is not None else np.nan]
        # dead reckoning from the newest fix (causal: the fix and its speed and heading only)
        spots: list[tuple[float, float]] = []
        if fix is not None:
            fsp, fhd = fix[3], fix[4]
            moving = fsp == fsp and fhd == fhd
            dr = min(fsp * (r.time - fix[0]), knowledge.max_dr_m) if moving else 0.0
            sx, sy = (math.sin(math.radians(fhd)), math.cos(math.radians(fhd))) if moving else (0.0, 0.0)
            spots = [(fix[1] + (dr + ah) * sx, fix[2] + (dr + ah) * sy) for ah in (0.0, 50.0, 100.0)]
        for b in cands:
            key = (a, b)
            if key not in dmed:
                dmed[key] = dwell.median(a, b)
            med = dmed[key]
            x = np.full(F, np.nan, np.float32)
            x[:] = [
                tab.get(b, 0.0), p1tab.get(b, 0.0), rank_of.get(b, TABLE_K + 5), math.log1p(max(n1.get(b, 0), 0)),
                math.log1p(max(n2.get(b, 0), 0)),
                math.log1p(max(trans.n2.get((b, a), {}).get(c, 0), 0)) if c >= 0 else 0.0,
                math.log1p(max(trans.n1.get(b, {}).get(a, 0), 0)), math.log1p(N1), ent,
                float(votes[0] == b), float(cv.score[0]) if votes[0] == b else 0.0,
                float(votes[1] == b), float(pl.score[0]) if votes[1] == b else 0.0,
                float(pl.t_ho[0] - r.time) if votes[1] == b else np.nan,
                float(votes[2] == b), float(f.score[0]) if votes[2] == b else 0.0,
                float(f.t_ho[0] - r.time) if votes[2] == b else np.nan,
                float(rep == b), float(raw.has[0] and raw.cell[0] == b),
                comb_rank.get(b, (0, 0.0))[1], comb_rank.get(b, (TOP_RANK_NONE, 0.0))[0],
                float(b == c), float(b == c and dwell_now == dwell_now and dwell_now <= 10.0), float(b == c2),
                float(b in left), math.log1p(served_n.get(b, 0)),
                math.log1p(r.time - left[b]) if b in left else np.nan,
                float(b == d_next), float(b == d_prev), math.log1p(d_ab.get(b, 0)), float(b in d_tri),
                float(b in d_rev),
                *([assoc.share(px, py, b) for px, py in spots] if spots else [np.nan] * 3),
                math.log1p(dwell_now) if dwell_now == dwell_now else np.nan,
                math.log1p(med) if med == med else np.nan,
                dwell_now / med if (med == med and med > 0 and dwell_now == dwell_now) else np.nan,
                *base,
            ]
            rows.append(x)
            r_inst.append(i)
            r_cell.append(b)
    nxt, _ = _ho_rows(drive, inst_t, inst_s)
    X = np.stack(rows) if rows else np.zeros((0, F), np.float32)
    inst = np.asarray(r_inst, np.int64)
    cell = np.asarray(r_cell, np.int64)
    return {"X": X, "inst": inst, "cell": cell, "y": cell == nxt[inst] if len(inst) else np.zeros(0, bool),
            "t": inst_t, "serving": inst_s, "target": inst_target, "t_ho": inst_tho, "next_target": nxt}


def ho_instants(drive, t: np.ndarray, serving: np.ndarray) -> np.ndarray:
    """(H, len(LEADS)) the instant ``evaluate.score_drive`` scores each handover at, -1 none."""
    _, kss = _ho_rows(drive, t, serving)
    out = np.full((len(drive.handovers), len(LEADS)), -1, np.int64)
    for n, (h, ks) in enumerate(zip(drive.handovers, kss)):
        for j, L in enumerate(LEADS):
            kk = ks[t[ks] <= h.time - L] if ks.size else ks
            if kk.size:
                out[n, j] = int(kk[-1])
    return out


def dump(drives, cfg, log=None, only: Sequence[int] | None = None, exclude: Sequence[int] = (),
         groups: int = 0) -> dict:
    """Leave-one-drive-out dump of the drives ``only`` (default all; the knowledge as
    ``evaluate.evaluate`` builds it, less the drives ``exclude`` too, and with ``groups`` K > 0
    less every drive of the drive's group of ``folds_of(len(drives), K)``). Returns the arrays of
    the module doc, instants and rows numbered over the dumped drives, ``drive`` the index into
    ``drives``."""
    group_of = {int(n): g.tolist() for g in folds_of(len(drives), groups) for n in g} if groups else {}
    from pallas_tools.evaluate import Trace, drive_knowledge, score_drive

    total, parts = drive_knowledge(drives, cfg)
    acc: dict[str, list] = {k: [] for k in ("X", "inst", "cell", "y", "t", "serving", "target", "t_ho",
                                            "next_target", "drive", "ho_drive", "ho_target", "ho_idle", "ho_at")}
    off = 0
    false_alarms = 0
    for n, (d, part) in enumerate(zip(drives, parts)):
        if only is not None and n not in only:
            continue
        k = total.copy()
        k.merge(part, -1)
        for e in set(exclude) | set(group_of.get(n, ())):
            if e != n:
                k.merge(parts[e], -1)
        o = dump_drive(d, k, cfg)
        I = len(o["t"])
        for key in ("X", "cell", "y", "t", "serving", "target", "t_ho", "next_target"):
            acc[key].append(o[key])
        acc["inst"].append(o["inst"] + off)
        acc["drive"].append(np.full(I, n, np.int64))
        at = ho_instants(d, o["t"], o["serving"])
        acc["ho_at"].append(np.where(at >= 0, at + off, -1))
        acc["ho_drive"].append(np.full(len(d.handovers), n, np.int64))
        acc["ho_target"].append(np.array([h.target_cell for h in d.handovers], np.int64))
        acc["ho_idle"].append(np.array([h.idle for h in d.handovers], bool))
        tr = Trace(o["t"], o["serving"], o["target"], o["t_ho"], np.zeros(I), [""] * I)
        false_alarms += score_drive(d, tr, 2.0, cfg.alarm_horizon_s)["false_alarms"]
        off += I
        if log:
            log(f"[{n + 1}/{len(drives)}] {d.ue_id}: {I} instants, {len(o['inst'])} candidate rows")
    out = {k: np.concatenate(v) if v else np.zeros(0) for k, v in acc.items()}
    if not acc["X"]:
        out["X"] = np.zeros((0, F), np.float32)
    if len(out["ho_at"]) == 0:
        out["ho_at"] = np.zeros((0, len(LEADS)), np.int64)
    hours = sum(d.duration_s for d in drives) / 3600.0
    out["meta"] = np.array(json.dumps({"features": FEATURES, "leads": LEADS, "hours": hours,
                                       "false_alarms_per_h": round(false_alarms / max(hours, 1e-9), 2),
                                       "drives": [d.ue_id for d in drives]}))
    return out


# ---------------------------------------------------------------------------------------------
# scoring and rankers (numpy only)
# ---------------------------------------------------------------------------------------------
def top_cells(d: dict, score: np.ndarray, n: int = 3) -> np.ndarray:
    """(I, n) the n best candidate cells of every instant by ``score`` (N,), -1 padding; ties go
    to the earlier row (the candidate gathered first)."""
    I = len(d["t"])
    out = np.full((I, n), -1, np.int64)
    inst = d["inst"]
    if not len(inst):
        return out
    order = np.lexsort((np.arange(len(inst)), -score, inst))
    si = inst[order]
    first = np.r_[0, np.flatnonzero(si[1:] != si[:-1]) + 1]
    pos = np.arange(len(si)) - np.repeat(first, np.diff(np.r_[first, len(si)]))
    keep = pos < n
    out[si[keep], pos[keep]] = d["cell"][order][keep]
    return out


def right_at(d: dict, named: np.ndarray, lead: float = 2.0, connected: bool = True) -> float:
    """Share of (connected) handovers whose target is in ``named`` (I,) or (I, n) at the instant
    ``evaluate`` scores them at ``lead`` (no instant: a miss)."""
    j = LEADS.index(lead)
    sel = ~d["ho_idle"] if connected else np.ones(len(d["ho_idle"]), bool)
    at = d["ho_at"][sel, j]
    tg = d["ho_target"][sel]
    if not len(at):
        return float("nan")
    nm = named.reshape(len(named), -1)
    ok = at >= 0
    hit = np.zeros(len(at), bool)
    hit[ok] = (nm[at[ok]] == tg[ok, None]).any(axis=1)
    return float(hit.mean())


def ceiling_named(d: dict) -> np.ndarray:
    """(I,) the labelled target where it is among the instant's candidates, else -1."""
    out = np.full(len(d["t"]), -1, np.int64)
    pos = d["y"].astype(bool)
    out[d["inst"][pos]] = d["cell"][pos]
    return out


def group_softmax(inst: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Softmax of ``z`` (N,) within each instant (rows grouped by instant, in order)."""
    if not len(z):
        return z.astype(np.float64)
    starts = np.r_[0, np.flatnonzero(inst[1:] != inst[:-1]) + 1]
    size = np.diff(np.r_[starts, len(z)])
    e = np.exp(z - np.repeat(np.maximum.reduceat(z, starts), size))
    return e / np.repeat(np.add.reduceat(e, starts), size)


def prepare(X: np.ndarray) -> np.ndarray:
    """Features for the linear model: NaN -> 0 plus a missing-indicator per feature (N, 2F)."""
    miss = np.isnan(X)
    return np.concatenate([np.nan_to_num(X, nan=0.0), miss.astype(np.float32)], 1).astype(np.float64)


def fit_logit(Z: np.ndarray, inst: np.ndarray, y: np.ndarray, l2: float = 1e-3, iters: int = 200) -> np.ndarray:
    """A conditional logit (softmax over each instant's candidates, one positive per instant)
    fitted by Adam (full batch, L2 ``l2``); returns the weights (Z.shape[1],)."""
    w = np.zeros(Z.shape[1])
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    G = max(1, len(np.unique(inst)))
    for it in range(1, iters + 1):
        p = group_softmax(inst, Z @ w)
        g = Z.T @ (p - y) / G + l2 * w
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        w -= 0.05 * (m / (1 - 0.9 ** it)) / (np.sqrt(v / (1 - 0.999 ** it)) + 1e-8)
    return w


def train_rows(d: dict, train_drives: np.ndarray, train_lead: float = 0.0) -> np.ndarray:
    """Candidate rows of the training drives' instants that have a positive candidate (and, with
    ``train_lead`` > 0, lie at most that many seconds before their drive's next cell change)."""
    inst = d["inst"]
    drv = d["drive"][inst]
    pos_inst = np.zeros(len(d["t"]), bool)
    pos_inst[inst[d["y"].astype(bool)]] = True
    keep = np.isin(drv, train_drives) & pos_inst[inst]
    if train_lead > 0:
        keep &= _time_to_ho(d)[inst] <= train_lead
    return np.flatnonzero(keep)


def _time_to_ho(d: dict) -> np.ndarray:
    """(I,) seconds from each instant to the next change of its drive's serving cell (inf none)."""
    out = np.full(len(d["t"]), np.inf)
    for n in np.unique(d["drive"]):
        ii = np.flatnonzero(d["drive"] == n)
        s, t = d["serving"][ii], d["t"][ii]
        ch = np.flatnonzero(s[1:] != s[:-1]) + 1
        nxt = np.searchsorted(ch, np.arange(len(ii)), side="right")
        ok = nxt < len(ch)
        out[ii[ok]] = t[ch[nxt[ok]]] - t[ok]
    return out


def folds_of(n_drives: int, k: int) -> list[np.ndarray]:
    """Held-out drive groups: each drive alone (k <= 0 or k >= n) or k interleaved groups."""
    if k <= 0 or k >= n_drives:
        return [np.array([i]) for i in range(n_drives)]
    return [np.arange(i, n_drives, k) for i in range(k)]


def nested_key(q: int) -> str:
    return f"nested{q}_"


def _fit_or_prior(fit_predict, d: dict, tr: np.ndarray, X_test: np.ndarray) -> np.ndarray:
    """``fit_predict`` on the rows ``tr`` of ``d``; the successor probability if there are none."""
    if not len(tr):
        return np.nan_to_num(X_test[:, _FI["p2"]]).astype(np.float64)
    return fit_predict(d["X"][tr], d["inst"][tr], d["y"][tr].astype(np.int32), X_test)


def cross_fit(d: dict, fit_predict, folds: int = 0, train_lead: float = 0.0, nested: bool = False,
              log=None) -> np.ndarray:
    """Scores (N,) of every candidate row of ``d`` from a ranker fitted without its drive:
    ``fit_predict(X_train, inst_train, y_train, X_test) -> scores``. ``nested``: fold q trains
    on the dump ``d[nested_key(q) + ...]`` of the other drives made with knowledge that lacks the
    held-out drives as well (``dump(exclude=...)``), so no figure of a held-out drive reaches
    the ranker through the training features."""
    nd = int(d["drive"].max()) + 1 if len(d["drive"]) else 0
    score = np.zeros(len(d["inst"]))
    drv = d["drive"][d["inst"]]
    for q, held in enumerate(folds_of(nd, folds)):
        src = d
        if nested:
            pre = nested_key(q)
            src = {k[len(pre):]: v for k, v in d.items() if k.startswith(pre)}
            if not src:
                raise ValueError(f"no nested training dump for fold {q + 1} (dump with --nested {folds})")
        tr = train_rows(src, np.setdiff1d(np.arange(nd), held), train_lead)
        te = np.flatnonzero(np.isin(drv, held))
        if len(te):
            score[te] = _fit_or_prior(fit_predict, src, tr, d["X"][te])
        if log:
            log(f"  fold {q + 1}: {len(tr)} train rows, {len(te)} test rows")
    return score


def linear_fit_predict(X: np.ndarray, inst: np.ndarray, y: np.ndarray, X_test: np.ndarray) -> np.ndarray:
    """The conditional logit over standardised ``prepare`` features."""
    Z = prepare(X)
    mu, sd = Z.mean(axis=0), Z.std(axis=0) + 1e-6
    w = fit_logit((Z - mu) / sd, inst, y.astype(np.float64))
    return ((prepare(X_test) - mu) / sd) @ w


def gbm_fit_predict(n_trees: int = 150, seed: int = 0, threads: int = 1):
    """A LightGBM LambdaRank fit_predict (groups: instants); scikit-learn's HistGradientBoosting
    classifier on the rows if lightgbm is missing. Raises ImportError if neither is installed.
    The fitted models collect in ``fp.models``."""
    try:
        import lightgbm as lgb

        def fp(X, inst, y, X_test):
            _, counts = np.unique(inst, return_counts=True)
            m = lgb.LGBMRanker(objective="lambdarank", n_estimators=n_trees, learning_rate=0.1, num_leaves=15,
                               min_child_samples=100, subsample=0.5, subsample_freq=1, colsample_bytree=0.8,
                               max_bin=63, lambdarank_truncation_level=3, random_state=seed, verbose=-1,
                               n_jobs=threads)
            m.fit(X, y, group=counts)
            fp.models.append(m)
            return m.predict(X_test)
        fp.kind = "lightgbm lambdarank"
    except ImportError:
        from sklearn.ensemble import HistGradientBoostingClassifier

        def fp(X, inst, y, X_test):
            m = HistGradientBoostingClassifier(max_iter=n_trees, learning_rate=0.1, random_state=seed)
            m.fit(X, y)
            fp.models.append(m)
            return m.predict_proba(X_test)[:, 1]
        fp.kind = "sklearn histgb (rows)"
    fp.models = []
    return fp


def stacked_dumps(drives, cfg, k: int = 3, log=None) -> list[dict]:
    """Per group G of ``folds_of(len(drives), k)``: the dump of every other drive with knowledge
    learned from G's drives only (plus each drive's own reports online). No drive's own counts
    are ever subtracted from a shared total, so a feature cannot reveal its drive's own handovers
    by a deficit (the leave-one-out target-encoding leak of the plain dump)."""
    out = []
    for q, g in enumerate(folds_of(len(drives), k)):
        rest = [n for n in range(len(drives)) if n not in set(g.tolist())]
        if log:
            log(f"stacked dump {q + 1}/{k}: knowledge from drives {g.tolist()}")
        out.append(dump(drives, cfg, None, only=rest, exclude=rest))
    return out


def _subset(d: dict, drives: np.ndarray) -> dict:
    """The instants, rows and handovers of ``drives`` of a dump, renumbered."""
    keep_i = np.isin(d["drive"], drives)
    new = np.cumsum(keep_i) - 1
    keep_r = keep_i[d["inst"]]
    out = {k: d[k][keep_i] for k in ("t", "serving", "target", "t_ho", "next_target", "drive")}
    out.update({k: d[k][keep_r] for k in ("X", "cell", "y")})
    out["inst"] = new[d["inst"][keep_r]]
    keep_h = np.isin(d["ho_drive"], drives)
    out.update({k: d[k][keep_h] for k in ("ho_drive", "ho_target", "ho_idle")})
    at = d["ho_at"][keep_h]
    out["ho_at"] = np.where(at >= 0, new[np.maximum(at, 0)], -1)
    out["meta"] = d["meta"]
    return out


def stacked_fit(dumps: list[dict], fit_predict, log=None) -> list[tuple[dict, np.ndarray]]:
    """For every knowledge group and every other group as the test drives: fit on the third
    group's instants, score the test group's. Returns (test dump, its row scores) pairs: every
    drive is scored twice (once per knowledge group it is not in)."""
    k = len(dumps)
    nd = int(max(x["drive"].max() for x in dumps)) + 1
    groups = folds_of(nd, k)
    out = []
    for q, d in enumerate(dumps):
        for t in range(k):
            if t == q:
                continue
            test = _subset(d, groups[t])
            rest = np.concatenate([groups[r] for r in range(k) if r not in (q, t)])
            tr = train_rows(d, rest)
            out.append((test, _fit_or_prior(fit_predict, d, tr, test["X"])))
            if log:
                log(f"  knowledge {q + 1}, test {t + 1}: {len(tr)} train rows")
    return out


def pooled(pairs: list[tuple[dict, np.ndarray]], named_of) -> dict:
    """``report_rows`` pooled over (dump, scores) pairs, weighted by connected handovers."""
    acc: dict[str, float] = {}
    n = 0
    for d, sc in pairs:
        w = int((~d["ho_idle"]).sum())
        for key, v in report_rows(d, named_of(d, sc)).items():
            acc[key] = acc.get(key, 0.0) + (v if key == "flips/h" else v * w)
        n += w
    return {key: (v / len(pairs) if key == "flips/h" else v / max(n, 1)) for key, v in acc.items()}


def baseline_table(d: dict) -> list[tuple[str, np.ndarray]]:
    """(name, (I, 3) named cells) of the numpy baselines."""
    X = d["X"]
    p2 = np.nan_to_num(X[:, _FI["p2"]])
    comb = np.zeros((len(d["t"]), 3), np.int64) - 1
    comb[:, 0] = d["target"]
    memory = np.where(X[:, _FI["drive_next"]] > 0, 10.0, 0.0) + p2
    comb_full = np.nan_to_num(X[:, _FI["reported"]]) * 10.0 + np.nan_to_num(X[:, _FI["comb_share"]])
    return [("ceiling (target among candidates)", ceiling_named(d)[:, None]),
            ("combination (reported target)", comb),
            ("combination, its top-3", top_cells(d, comb_full)),
            ("history p2 (successor table)", top_cells(d, p2)),
            ("memory rule (drive's last A->B, else p2)", top_cells(d, memory))]


def flips_per_h(d: dict, named: np.ndarray) -> float:
    """Changes of the named cell (I,) between consecutive instants on one serving cell of one
    drive, per hour (as ``evaluate`` counts flips of the reported target)."""
    meta = d["meta"] if isinstance(d["meta"], dict) else json.loads(str(d["meta"]))
    same = (d["drive"][1:] == d["drive"][:-1]) & (d["serving"][1:] == d["serving"][:-1])
    ok = same & (named[1:] >= 0) & (named[:-1] >= 0)
    return float(np.sum(ok & (named[1:] != named[:-1])) / max(meta.get("hours", 0.0), 1e-9))


def report_rows(d: dict, named: np.ndarray) -> dict:
    named = named.reshape(len(named), -1)
    out = {f"right@{L:g}": right_at(d, named[:, :1], L) for L in LEADS}
    for n in (2, 3):
        if named.shape[1] >= n:
            out[f"top{n}@2"] = right_at(d, named[:, :n], 2.0)
    out["flips/h"] = flips_per_h(d, named[:, 0])
    return out


def print_table(rows: list[tuple[str, dict]], meta: dict, out=sys.stdout) -> None:
    cols = ["right@1", "right@2", "right@3", "right@5", "top2@2", "top3@2"]
    print(f"{'connected-mode handovers':46s}" + "".join(f"{c:>9s}" for c in cols) + f"{'flips/h':>9s}", file=out)
    for name, r in rows:
        print(f"{name:46s}" + "".join(f"{100 * r[c]:8.1f}%" if c in r else f"{'':>9s}" for c in cols)
              + f"{r['flips/h']:9.1f}", file=out)
    print(f"false alarms/h (the combination's times, kept by every re-ranker): {meta.get('false_alarms_per_h')}",
          file=out)


def load(path: str) -> dict:
    z = np.load(path, allow_pickle=False)
    d = {k: z[k] for k in z.files}
    d["meta"] = json.loads(str(d["meta"]))
    return d


def fit_and_report(d: dict, folds: int = 0, train_lead: float = 0.0, gbm: bool = True, linear: bool = True,
                   nested: bool = False, log=None) -> dict:
    """The table of the module doc (printed) and its figures as a dict."""
    meta = d["meta"] if isinstance(d["meta"], dict) else json.loads(str(d["meta"]))
    rows = [(n, report_rows(d, c)) for n, c in baseline_table(d)]
    tag = " (nested)" if nested else ""
    if linear:
        lin = cross_fit(d, linear_fit_predict, folds, train_lead, nested, log)
        rows.append(("linear conditional logit" + tag, report_rows(d, top_cells(d, lin))))
    imp: list[tuple[str, float]] = []
    if gbm:
        try:
            fp = gbm_fit_predict()
        except ImportError:
            print("the nonlinear ranker needs lightgbm or scikit-learn (pip install lightgbm); skipped",
                  file=sys.stderr)
        else:
            s = cross_fit(d, fp, folds, train_lead, nested, log)
            rows.append((fp.kind + tag, report_rows(d, top_cells(d, s))))
            if fp.models and hasattr(fp.models[0], "booster_"):
                g = np.mean([m.booster_.feature_importance("gain") for m in fp.models], axis=0)
                imp = sorted(zip(FEATURES, (g / g.sum()).tolist()), key=lambda kv: -kv[1])
    print_table(rows, meta)
    if imp:
        print("top features (share of LightGBM gain): " + ", ".join(f"{f} {v:.3f}" for f, v in imp[:12]))
    return {"rows": {n: {k: round(v, 4) for k, v in r.items()} for n, r in rows},
            "false_alarms_per_h": meta.get("false_alarms_per_h"), "importance": imp[:20],
            "folds": folds or "leave-one-drive-out", "nested": nested, "train_lead": train_lead,
            "connected_handovers": int((~d["ho_idle"]).sum()), "instants": len(d["t"]), "rows_n": len(d["inst"])}


def stacked_report(dumps: list[dict], gbm: bool = True, linear: bool = True, log=None) -> dict:
    """The table of ``fit_and_report`` under the stacked protocol (``stacked_dumps``)."""
    nd = int(max(x["drive"].max() for x in dumps)) + 1
    groups = folds_of(nd, len(dumps))
    tests = [(_subset(d, groups[t]), None) for q, d in enumerate(dumps) for t in range(len(dumps)) if t != q]
    rows = []
    for name, col in (("ceiling (target among candidates)", None), ("combination (reported target)", "target"),
                      ("history p2 (successor table)", "p2")):
        def named_of(d, _sc, col=col):
            if col is None:
                return ceiling_named(d)
            if col == "target":
                return d["target"][:, None]
            return top_cells(d, np.nan_to_num(d["X"][:, _FI["p2"]]))
        rows.append((name, pooled(tests, named_of)))
    fps = []
    if linear:
        fps.append(("linear conditional logit", linear_fit_predict))
    if gbm:
        try:
            fp = gbm_fit_predict()
            fps.append((fp.kind, fp))
        except ImportError:
            print("the nonlinear ranker needs lightgbm or scikit-learn; skipped", file=sys.stderr)
    for name, fp in fps:
        rows.append((name + " (stacked)", pooled(stacked_fit(dumps, fp, log), lambda d, sc: top_cells(d, sc))))
    meta = dumps[0]["meta"] if isinstance(dumps[0]["meta"], dict) else json.loads(str(dumps[0]["meta"]))
    print_table(rows, {"false_alarms_per_h": "(each knowledge group's own; see the plain dump)"})
    return {"rows": {n: {k: round(v, 4) for k, v in r.items()} for n, r in rows}, "protocol": "stacked",
            "groups": len(dumps), "hours": meta.get("hours")}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pallas_tools.rerank", description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", help="folder of drive-test CSVs (recursive)")
    ap.add_argument("--generate", type=int, default=0, help="dump N generated drives instead of a folder")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--dump", help="save the dump here (.npz)")
    ap.add_argument("--fit", help="fit and score the re-rankers on this dump (.npz) instead of replaying")
    ap.add_argument("--folds", type=int, default=0, help="drive groups for the re-rankers (0: leave-one-drive-out)")
    ap.add_argument("--train-lead", type=float, default=0.0,
                    help="train on instants at most this many s before their handover (0: all)")
    ap.add_argument("--nested", type=int, default=0,
                    help="dump: also dump, per group of K drives, the other drives with knowledge lacking the group; "
                         "fit K folds, each trained on those (no held-out drive in any training feature)")
    ap.add_argument("--group-knowledge", action="store_true",
                    help="with --nested K: the scored dump's knowledge also lacks the drive's group (K-fold by "
                         "drive throughout: training and test features from equally many drives)")
    ap.add_argument("--stack", type=int, default=0,
                    help="stacked protocol over K drive groups: knowledge from one group, the ranker trained on "
                         "a second, scored on a third (no leave-one-out deficit in any feature)")
    ap.add_argument("--no-gbm", action="store_true", help="numpy baselines and the linear ranker only")
    ap.add_argument("--no-linear", action="store_true", help="skip the linear ranker")
    a = ap.parse_args(argv)
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    t0 = _time.perf_counter()
    if a.fit:
        d = load(a.fit)
        if a.stack:
            dumps = [{k[len(f"stack{q}_"):]: v for k, v in d.items() if k.startswith(f"stack{q}_")}
                     for q in range(a.stack)]
            for x in dumps:
                x["meta"] = d["meta"]
            res = stacked_report(dumps, not a.no_gbm, not a.no_linear, log)
            print(json.dumps(res, separators=(",", ":")))
            return 0
    else:
        if not a.folder and not a.generate:
            ap.error("give a folder, --generate N or --fit dump.npz")
        from pallas_tools.evaluate import _generated, profile_config
        from xapp.drivetest import read_drives

        drives = _generated(a.generate, a.seed, a.duration, None, 0.2) if a.generate else read_drives(a.folder)
        if not drives:
            print(f"no drives found in {a.folder}", file=sys.stderr)
            return 2
        cfg = profile_config(drives)
        if a.stack:
            dumps = stacked_dumps(drives, cfg, a.stack, log)
            if a.dump:
                flat = {f"stack{q}_{k}": v for q, x in enumerate(dumps) for k, v in x.items() if k != "meta"}
                np.savez_compressed(a.dump, meta=dumps[0]["meta"], **flat)
                log(f"dump: {a.dump}")
            for x in dumps:
                x["meta"] = json.loads(str(x["meta"]))
            res = stacked_report(dumps, not a.no_gbm, not a.no_linear, log)
            print(json.dumps(res, separators=(",", ":")))
            return 0
        d = dump(drives, cfg, log, groups=a.nested if a.group_knowledge else 0)
        for q, held in enumerate(folds_of(len(drives), a.nested) if a.nested else []):
            log(f"nested training dump {q + 1}/{a.nested}: without drives {held.tolist()}")
            sub = dump(drives, cfg, None, only=[n for n in range(len(drives)) if n not in held], exclude=held.tolist())
            d.update({nested_key(q) + k: v for k, v in sub.items() if k != "meta"})
        if a.dump:
            np.savez_compressed(a.dump, **d)
            log(f"dump: {a.dump}")
        d["meta"] = json.loads(str(d["meta"]))
    nested = bool(a.nested)
    if nested:
        a.folds = a.nested
    res = fit_and_report(d, a.folds, a.train_lead, not a.no_gbm, not a.no_linear, nested, log)
    res["seconds"] = round(_time.perf_counter() - t0, 1)
    print(json.dumps(res, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
