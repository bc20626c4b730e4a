"""Results pages generated from a run's ``summary.json``, never typed by hand.

``pallas report RUN_DIR [RUN_DIR ...] --markdown [-o FILE]`` renders each ``pallas replay``
run folder (its ``summary.json``) as a Markdown section: the command, the commit and the date
it ran on and the machine's load (:func:`provenance`, recorded by the replay at its start), the
per-scheme table (SIT mean with its 95% bootstrap interval, p50/p99, the timing model's SIT on
the same handovers, ITL, token-exact sessions, prepared commits), each scheme's mean SIT over
the first scheme's with its interval (recomputed from the per-handover rows with
:func:`pallas_eval.metrics.ratio_ci`, deterministic), the live-against-model lines, the ITL after
a session's first handover, the CPU per process role, and the pacing verdict.

The docs' results page is written this way; a figure in the docs comes from here or cites a run's
page. Values are seconds in ``summary.json`` and milliseconds on the page.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pallas_eval.metrics import ratio_ci
from pallas_eval.report import as_float, cpu_rows, fmt_ms, fmt_ms_ci

REPO = Path(__file__).resolve().parents[1]


class ReportError(Exception):
    """A run folder that cannot be rendered (no ``summary.json``, not JSON, not a live replay)."""


def provenance(argv: Sequence[str] | None = None, repo: Path = REPO) -> dict[str, Any]:
    """Where and how a run was made: ``command`` (the command line, program name first),
    ``commit`` (``git rev-parse HEAD`` of ``repo``, "" outside a checkout), ``dirty`` (True when
    tracked files differ from the commit), ``date_utc`` (ISO 8601), ``cpus`` and ``load_avg``
    (the 1-minute load average at the call; every live figure here is a CPU figure)."""
    argv = list(sys.argv if argv is None else argv)
    prog = Path(argv[0]).name if argv else "pallas"
    if argv and Path(argv[0]).parts[-2:] == ("pallas_eval", "cli.py"):
        prog = "pallas"          # python -m pallas_eval.cli is the pallas entry point
    cmd = [prog] + argv[1:]

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if commit else False
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    return {"command": shlex.join(cmd), "commit": commit, "dirty": dirty,
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count() or 0,
            "load_avg": round(load, 2), "machine": platform.machine()}


def load_run(run_dir: Path) -> dict[str, Any]:
    """The ``summary.json`` of ``run_dir`` (or the file itself). Raises :class:`ReportError`
    naming the path when it is missing, not JSON or not a live replay's (no ``summary``)."""
    p = Path(run_dir)
    f = p / "summary.json" if p.is_dir() else p
    try:
        data = json.loads(f.read_text())
    except FileNotFoundError:
        raise ReportError(f"{f}: no such file (a pallas replay run folder holds summary.json)") from None
    except (OSError, ValueError) as e:
        raise ReportError(f"{f}: not a readable JSON summary ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("summary"), list):
        raise ReportError(f"{f}: not a live replay's summary (no per-scheme 'summary' list; "
                          f"a --simulate run has none)")
    return data


def _pct(v: Any) -> str:
    x = as_float(v)
    return "-" if not math.isfinite(x) else f"{100 * x:.1f}%"


def _table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def sit_by_scheme(handovers: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Per scheme (in first-seen order) the finite SITs (s) of its handover rows."""
    out: dict[str, list[float]] = {}
    for h in handovers:
        x = as_float(h.get("sit_s"))
        lst = out.setdefault(str(h.get("scheme", "")), [])
        if math.isfinite(x):
            lst.append(x)
    return out


def ratios(handovers: Sequence[Mapping[str, Any]], base: str) -> list[tuple[str, float, float, float]]:
    """(scheme, mean SIT / base's mean SIT, lo, hi) for every scheme but ``base``, the 95%
    bootstrap interval of :func:`pallas_eval.metrics.ratio_ci` (seed 0, as the replay prints)."""
    by = sit_by_scheme(handovers)
    if base not in by:
        return []
    return [(s, *ratio_ci(x, by[base])) for s, x in by.items() if s != base]


def render_run(data: Mapping[str, Any], title: str) -> str:
    """One run's Markdown section (see the module docstring). ``data``: a ``summary.json``."""
    prov = data.get("provenance") or {}
    lines = [f"## {title}", ""]
    if prov:
        commit = prov.get("commit") or "unknown"
        lines += [f"- command: `{prov.get('command', '')}`",
                  f"- commit: `{commit[:12]}`" + (" (with uncommitted changes)" if prov.get("dirty") else ""),
                  f"- date: {prov.get('date_utc', '')}; {prov.get('cpus', '?')} CPUs, load average "
                  f"{prov.get('load_avg', '?')} at the start" + (f", {data['load_avg_end']} at the end"
                                                                 if "load_avg_end" in data else "")]
    else:
        lines += ["- command, commit and date: not recorded (a run made before provenance was written)"]
    inp = data.get("input") or {}
    n_ho = len(inp.get("handovers") or [])
    wall = as_float(data.get("wall_s"))
    lines += [f"- input: {inp.get('source', '?')}; seeds {data.get('seeds', [])}; {n_ho} handovers in the trace"
              + (f"; wall time {wall:,.0f} s" if math.isfinite(wall) else "")]
    if data.get("regime"):
        lines += [f"- regime: {data['regime']}"]
    lines += [""]
    sim = data.get("simulated") or {}
    head = ["scheme", "HOs with session", "SIT mean [95% CI] (ms)", "p50 / p99 (ms)", "model SIT (ms)",
            "ITL mean / p99 (ms)", "ITL > 100 ms", "token-exact", "prepared commits"]
    rows = []
    for s in data["summary"]:
        m = sim.get(s.get("scheme"), {}) if isinstance(sim, dict) else {}
        rows.append([s.get("scheme", "?"), str(s.get("handovers_with_session", "?")),
                     fmt_ms_ci(s.get("sit_mean"), s.get("sit_mean_ci")),
                     f"{fmt_ms(s.get('sit_p50'))} / {fmt_ms(s.get('sit_p99'))}", fmt_ms(m.get("sit_mean")),
                     f"{fmt_ms(s.get('itl_mean'))} / {fmt_ms(s.get('itl_p99'))}", _pct(s.get("itl_over_slo")),
                     f"{s.get('token_exact', '?')}/{s.get('token_checked', '?')}", str(s.get("commits", 0))])
    lines += _table(head, rows) + [""]
    base = str(data["summary"][0].get("scheme", "")) if data["summary"] else ""
    rs = ratios(data.get("handovers") or [], base)
    if rs:
        lines += [f"Mean SIT over {base}'s (95% bootstrap interval):", ""]
        lines += _table(["scheme", "ratio", "95% CI"],
                        [[s, "-" if not math.isfinite(r) else f"{r:.2f}x",
                          "-" if not math.isfinite(lo) else f"{lo:.2f}-{hi:.2f}x"] for s, r, lo, hi in rs]) + [""]
    cmp = data.get("live_vs_model") or []
    if cmp:
        lines += ["Live against the timing model on the same handovers (within 30% or one decode step):", ""]
        for c in cmp:
            lines.append(f"- {c['scheme']}: live {fmt_ms(c.get('live_s'))} ms, model {fmt_ms(c.get('model_s'))} ms, "
                         + ("within" if c.get("ok") else "outside") + f" {fmt_ms(c.get('tolerance_s'))} ms"
                         + (f"; the difference is in the {c['phase']} phase" if not c.get("ok") and c.get("phase")
                            else ""))
        lines += [""]
    post = data.get("itl_after_handover") or {}
    if post:
        lines += ["ITL after a session's first handover (each handover's own gap left out):", ""]
        lines += _table(["scheme", "gaps", "mean (ms)", "P90 (ms)", "P99 (ms)", "> 100 ms"],
                        [[s, str(v.get("n", 0)), fmt_ms(v.get("mean_s")), fmt_ms(v.get("p90_s")),
                          fmt_ms(v.get("p99_s")), _pct(v.get("over_slo"))] for s, v in post.items()]) + [""]
    prep = data.get("preparation") or {}
    if prep:
        lines += ["SIT by whether the right target was named before the handover, and the warm-ups no commit "
                  "used (per UE-hour of replayed drive; prefill, stream and KV held are model estimates at "
                  "the triggers' rates):", ""]
        prow = []
        for s, v in prep.items():
            sp = v.get("sit_by_prediction") or {}
            w = v.get("wasted") or {}
            ph = w.get("per_hour") or {}

            def part(k: str) -> str:
                x = sp.get(k) or {}
                return "-" if not x.get("n") else f"{x['n']} ({x.get('prepared', 0)} prepared): " + \
                    fmt_ms_ci(x.get("mean_s"), [x.get("ci_lo_s"), x.get("ci_hi_s")])
            prow.append([s, part("predicted"), part("unpredicted"),
                         f"{w.get('count', 0)} of {w.get('triggers', 0)}" if w else "-",
                         "-" if not w else f"{as_float(ph.get('count')):.1f}",
                         "-" if not w else f"{as_float(ph.get('prefill_gpu_s')):.1f}",
                         "-" if not w else f"{as_float(ph.get('bytes_streamed')) / 2 ** 20:.1f}",
                         "-" if not w else f"{as_float(ph.get('vram_gib_s')):.2f}"])
        lines += _table(["scheme", "predicted: HOs, SIT mean [95% CI] (ms)", "unpredicted", "warm-ups unused",
                         "unused / UE-h", "prefill GPU-s / UE-h", "MiB streamed / UE-h", "KV GiB-s / UE-h"],
                        prow) + [""]
    cpu = data.get("cpu") or {}
    if cpu:
        roles, crow = cpu_rows(cpu)
        lines += ["CPU per scheme (% of one core while the UEs ran):", ""]
        lines += _table(["scheme", *roles, "total"], crow) + [""]
    pacing = data.get("pacing") or {}
    if pacing.get("verdict"):
        lines += [f"Pacing: {pacing['verdict']}", ""]
    for sch, reps in sorted((data.get("failover") or {}).items()):   # pallas replay --kill-replica
        from pallas_eval.failover import failover_lines
        for rep in reps:
            lines += [f"- {sch}: {line.strip()}" for line in failover_lines(rep)] + [""]
    errs = data.get("errors") or {}
    if errs:
        lines += [f"Errors: {sum(len(v) for v in errs.values())} (in summary.json)", ""]
    return "\n".join(lines)


#: How every page :func:`render_page` writes begins, after its heading.
_GENERATED = "Generated by `pallas report RUN_DIR ... --markdown`"


def render_page(runs: Sequence[tuple[str, Mapping[str, Any]]], heading: str = "Results") -> str:
    """A whole page: a header saying how it was made, then each (title, summary) section."""
    head = [f"# {heading}", "",
            _GENERATED + " from each run's `summary.json`; do not",
            "edit by hand. Every live figure is a CPU figure of the machine named in its section.", ""]
    return "\n".join(head + [render_run(d, t) + "\n" for t, d in runs]).rstrip() + "\n"


def append_sections(page: str, runs: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """``page`` (one :func:`render_page` wrote) with the sections of ``runs`` added at its end;
    a section whose title the page already has is replaced in place (one section per title).
    Raises ReportError for a page this module did not write."""
    if _GENERATED not in page.split("\n## ", 1)[0]:
        raise ReportError("the page to append to was not written by pallas report (no generated header)")
    head, *sections = page.rstrip("\n").split("\n## ")
    by_title = {sec.split("\n", 1)[0]: "## " + sec for sec in sections}
    for title, data in runs:
        by_title[title] = render_run(data, title)
    return "\n\n".join([head.rstrip("\n")] + [v.rstrip("\n") for v in by_title.values()]) + "\n"


def main_report(paths: Sequence[str], out: str | None, titles: Sequence[str] = (), append: bool = False) -> int:
    """``pallas report``: render ``paths`` (run folders) to ``out`` or stdout; with ``append``,
    add (or replace, by title) their sections in the page already at ``out``
    (:func:`append_sections`). Returns 0, or 2 with a one-line error on stderr for a folder that
    cannot be rendered or a page that cannot be appended to."""
    runs = []
    for i, p in enumerate(paths):
        try:
            data = load_run(Path(p))
        except ReportError as e:
            print(f"pallas report: {e}", file=sys.stderr)
            return 2
        runs.append((titles[i] if i < len(titles) else Path(p).name, data))
    if append:
        if not out or not Path(out).is_file():
            print("pallas report: --append needs -o naming an existing page", file=sys.stderr)
            return 2
        try:
            page = append_sections(Path(out).read_text(), runs)
        except ReportError as e:
            print(f"pallas report: {out}: {e}", file=sys.stderr)
            return 2
    else:
        page = render_page(runs)
    if out:
        Path(out).write_text(page)
    else:
        sys.stdout.write(page)
    return 0
