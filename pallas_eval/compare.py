"""``pallas compare``: two builds (or settings) on the same handovers, handover by handover.

Two ``pallas replay`` runs of the same drive and seed replay the same handovers with the same
sessions, yet a run's mean SIT moves by +-15-25 ms from one run to the next on this machine
(the 2-core host's scheduling, a misprediction's fallback landing on a busy engine): the same
commit, 3a25193, read 169 ms in one run and 206 ms in another. An unpaired comparison of two
runs' means cannot see a 20 ms change through that. Pairing each handover with itself removes
what the handovers themselves vary by; what is left is the build's effect and the runs' noise.

Each arm is one or more run folders (``summary.json`` and ``handovers.csv`` of
``pallas replay``); with several, a handover's SIT is its mean over the arm's runs, and only
handovers with a SIT in every run of both arms count. A handover is keyed by (UE, trace time
to 0.1 s). The figures: each run's mean SIT, the paired mean of each arm, the mean of B - A
with its 95% percentile-bootstrap interval (:func:`pallas_eval.metrics.bootstrap_ci`), the
median difference and in how many handovers B was faster.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from pallas_eval.metrics import bootstrap_ci

__all__ = ["Comparison", "load_sits", "compare", "main_compare"]


@dataclass(frozen=True)
class Comparison:
    """A paired comparison of one scheme's SIT between arms A and B (ms).

    ``runs_a`` / ``runs_b``: (folder, commit or "", mean SIT over its handovers); ``n``: paired
    handovers; ``mean_a`` / ``mean_b``: the arms' means over them; ``diff``: mean of B - A
    (negative: B faster) and ``diff_ci`` its 95% interval; ``median_diff``; ``b_faster``:
    handovers where B's SIT was lower.
    """

    scheme: str
    runs_a: list[tuple[str, str, float]]
    runs_b: list[tuple[str, str, float]]
    n: int
    mean_a: float
    mean_b: float
    diff: float
    diff_ci: tuple[float, float]
    median_diff: float
    b_faster: int


def load_sits(run: str | Path, scheme: str) -> dict[tuple[str, float], float]:
    """{(UE id, trace time rounded to 0.1 s): SIT in ms} of ``scheme``'s handovers with a SIT in
    ``run``'s ``handovers.csv``.

    Raises:
        FileNotFoundError: the folder has no ``handovers.csv``.
        ValueError: the file lacks a column this reads (not a ``pallas replay`` output).
    """
    path = Path(run) / "handovers.csv"
    out: dict[tuple[str, float], float] = {}
    with path.open(newline="") as f:
        rows = csv.DictReader(f)
        need = {"scheme", "ue_id", "time_s", "sit_s"}
        if not need <= set(rows.fieldnames or ()):
            raise ValueError(f"{path}: not a pallas replay handover table (needs {sorted(need)})")
        for r in rows:
            if r["scheme"] != scheme or not r["sit_s"]:
                continue
            sit = float(r["sit_s"]) * 1000.0
            if math.isfinite(sit):
                out[(r["ue_id"], round(float(r["time_s"]), 1))] = sit
    return out


def _commit(run: str | Path) -> str:
    try:
        prov = json.loads((Path(run) / "summary.json").read_text()).get("provenance") or {}
    except (OSError, ValueError):
        return ""
    return str(prov.get("commit") or prov.get("git_commit") or "")[:12]


def compare(arm_a: Sequence[str | Path], arm_b: Sequence[str | Path], scheme: str = "pallas") -> Comparison:
    """Pair ``scheme``'s handovers of the runs of arm A with those of arm B (module docstring).

    Raises:
        ValueError: an arm without runs, or no handover with a SIT in every run.
    """
    if not arm_a or not arm_b:
        raise ValueError("each arm needs at least one run folder")
    loaded = [[load_sits(r, scheme) for r in arm] for arm in (arm_a, arm_b)]
    keys = set.intersection(*(set(s) for arm in loaded for s in arm))
    if not keys:
        raise ValueError(f"no {scheme} handover has a SIT in every run: not the same drive and seed?")
    ks = sorted(keys)
    per_arm = [np.array([[s[k] for k in ks] for s in arm]).mean(axis=0) for arm in loaded]
    d = per_arm[1] - per_arm[0]
    runs = [[(str(r), _commit(r), float(np.mean(list(s.values())))) for r, s in zip(arm, sits)]
            for arm, sits in zip((arm_a, arm_b), loaded)]
    return Comparison(scheme=scheme, runs_a=runs[0], runs_b=runs[1], n=len(ks),
                      mean_a=float(per_arm[0].mean()), mean_b=float(per_arm[1].mean()),
                      diff=float(d.mean()), diff_ci=bootstrap_ci(d), median_diff=float(np.median(d)),
                      b_faster=int((d < 0).sum()))


def render(c: Comparison) -> str:
    """The comparison as plain text lines."""
    lines = [f"{c.scheme}: SIT of arm B against arm A on the same handovers (ms)"]
    for name, runs in (("A", c.runs_a), ("B", c.runs_b)):
        for folder, commit, mean in runs:
            lines.append(f"  {name} {folder} {commit or '(commit unknown)'}: mean {mean:.0f} over its handovers")
    lo, hi = c.diff_ci
    lines.append(f"  paired over {c.n} handovers: A {c.mean_a:.0f}, B {c.mean_b:.0f}; "
                 f"B - A {c.diff:+.1f} [{lo:+.1f}, {hi:+.1f}] (95% bootstrap), median {c.median_diff:+.1f}; "
                 f"B faster in {c.b_faster} of {c.n}")
    return "\n".join(lines)


def main_compare(arm_a: str, arm_b: str, scheme: str, as_json: bool) -> int:
    """``pallas compare``: arms are comma-separated run folders; 0, or 2 on bad input."""
    try:
        c = compare([p for p in arm_a.split(",") if p], [p for p in arm_b.split(",") if p], scheme)
    except (OSError, ValueError) as e:
        print(f"pallas compare: {e}")
        return 2
    print(json.dumps(asdict(c)) if as_json else render(c))
    return 0
