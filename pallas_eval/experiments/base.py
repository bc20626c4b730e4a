"""What every experiment returns, the paper's values beside ours, and the output files.

An experiment writes into its own folder ``OUT/NAME/``: ``NAME.csv`` (one row per measured
point), ``NAME.json`` (settings, rates, summary, the comparison with the paper) and the plot
the issue names. :func:`comparison_table` prints our value, the paper's (``paper_values.json``,
the one file holding the paper's figures with their section) and the ratio ours / paper.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from pallas_eval.report import write_csv, write_json

PAPER_VALUES = Path(__file__).with_name("paper_values.json")
#: A difference beyond this (|ours / paper - 1|) is listed in the closing note.
TOLERANCE = 0.20


@lru_cache(maxsize=1)
def paper_values() -> dict[str, dict]:
    """The paper's values by key (``paper_values.json``). Raises ValueError on a duplicate key."""
    out: dict[str, dict] = {}
    for v in json.loads(PAPER_VALUES.read_text())["values"]:
        if v["key"] in out:
            raise ValueError(f"paper_values.json: duplicate key {v['key']!r}")
        out[v["key"]] = v
    return out


@dataclass
class Comparison:
    """Our value for one of the paper's (``key`` in paper_values.json), in the paper's unit.

    ``why``: where ours differs by more than :data:`TOLERANCE`, the reason, starting with its
    kind: "docs/model.md:" (a modelling choice), "preset:" (a rate we had to assume), "plot:" (a
    value read off a plot), "scale:" (a run smaller than the paper's), or "fault:".
    """

    key: str
    ours: float
    why: str = ""

    @property
    def paper(self) -> dict:
        return paper_values()[self.key]

    @property
    def ratio(self) -> float:
        p = float(self.paper["value"])
        return self.ours / p if p else float("nan")

    @property
    def differs(self) -> bool:
        """True where ours is outside the tolerance (for an upper bound: above it)."""
        if not math.isfinite(self.ratio):
            return True
        if self.paper.get("bound") == "upper":
            return self.ratio > 1.0 + TOLERANCE
        return abs(self.ratio - 1.0) > TOLERANCE

    def as_dict(self) -> dict:
        p = self.paper
        return {"key": self.key, "ours": self.ours, "paper": p["value"], "unit": p["unit"], "ratio": self.ratio,
                "differs": self.differs, "source": p["source"], "read_from_plot": p["read_from_plot"],
                "why": self.why if self.differs else ""}


@dataclass
class ExperimentResult:
    """One experiment's outcome: ``rows`` (dicts, the CSV), ``summary`` (the JSON), ``plots``
    (paths written), ``comparisons`` with the paper, ``notes`` (settings and scale in words)."""

    name: str
    mode: str
    rows: list[dict]
    summary: dict
    plots: list[Path] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def write(self, out_dir: Path) -> list[Path]:
        """``NAME.csv`` and ``NAME.json`` into ``out_dir``; returns every file written."""
        out_dir.mkdir(parents=True, exist_ok=True)
        csv_p, json_p = out_dir / f"{self.name}.csv", out_dir / f"{self.name}.json"
        write_csv(csv_p, self.rows)
        write_json(json_p, {"experiment": self.name, "mode": self.mode, "notes": self.notes, "summary": self.summary,
                            "comparison": [c.as_dict() for c in self.comparisons],
                            "plots": [p.name for p in self.plots], "wall_s": self.wall_s})
        return [csv_p, json_p, *self.plots]


def _fmt(v: float, unit: str) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    if unit in ("ms",) or abs(v) >= 100:
        return f"{v:,.1f}"
    return f"{v:.3g}" if abs(v) < 10 else f"{v:.2f}"


def comparison_table(results: Sequence[ExperimentResult], title: str = "Ours beside the paper"):
    """A rich Table: experiment, value, ours, paper, unit, ratio, source."""
    from rich.table import Table
    t = Table(title=title)
    for c, j in (("experiment", "left"), ("value", "left"), ("ours", "right"), ("paper", "right"),
                 ("unit", "left"), ("ours/paper", "right"), ("paper's source", "left")):
        t.add_column(c, justify=j)  # type: ignore[arg-type]
    for r in results:
        for c in r.comparisons:
            p = c.paper
            ratio = f"{c.ratio:.2f}" + (" *" if c.differs else "")
            paper = ("< " if p.get("bound") == "upper" else "") + _fmt(float(p["value"]), p["unit"])
            t.add_row(r.name, c.key, _fmt(c.ours, p["unit"]), paper, p["unit"], ratio,
                      p["source"] + (" (read off a plot)" if p["read_from_plot"] else ""))
    return t


def differences(results: Sequence[ExperimentResult]) -> list[str]:
    """The closing note: one line per value that differs from the paper's by more than 20%."""
    out = []
    for r in results:
        for c in r.comparisons:
            if c.differs:
                out.append(f"{c.key}: ours {_fmt(c.ours, c.paper['unit'])} vs paper "
                           f"{_fmt(float(c.paper['value']), c.paper['unit'])} {c.paper['unit']} "
                           f"(x{c.ratio:.2f}): {c.why or 'no reason recorded'}")
    return out


def rows_of(objs: Sequence[object]) -> list[dict]:
    """Dataclasses or dicts as dicts (for the CSV)."""
    return [o if isinstance(o, dict) else asdict(o) for o in objs]  # type: ignore[arg-type]
