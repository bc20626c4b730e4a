"""Prepare a replay's input in the xApp's environment: the E2 trace and the plan derived from it.

``python -m pallas_eval.prepare OUT_DIR (--generate [...] | --trace FILE [--segment auto])``

- ``--generate``: a short drive made by the project: UEs driving Manhattan routes through a
  hexagonal grid of three-sector gNB sites (``pallas_tools.radio``: TR 38.901 UMa path loss,
  correlated shadowing, L3 filtering, A3 handovers, a MeasurementReport every 200 ms), each
  report encoded as the RIC_INDICATION its serving E2 node would send (``pallas_tools.convert``:
  E2AP RICindication with an E2SM-RC message copy of the NR RRC MeasurementReport), written as
  an E2 trace (``xapp.e2.trace``). The network's neighbour relation table (PCI -> NR cell
  identity) is written beside it, as an E2 node would announce it.
- ``--trace FILE_OR_DIR`` (repeatable): converted drives (``python -m pallas_tools.convert``),
  each one UE. Per drive, ``--segment auto`` cuts the shortest stretch holding
  ``--min-handovers`` handovers (plus ``--lead-s`` before the first and ``--tail-s`` after the
  last); ``--segment A:B`` cuts seconds A to B from the drive's start; ``''`` keeps it whole.
  Several drives are replayed together (:func:`merge_drives`): each segment shifted to start
  with the first's, so one run holds every drive's handovers.

Either way the trace is then *decoded with the xApp's own ingest* (``xapp.e2.ingest``), so the
plan holds exactly what the xApp will see: per UE its serving cell over time and the handovers
(the first report of a UE from a new serving cell), every cell, the serving/neighbour pairs
reported (for the cell-to-server map) and the E2 node of each cell. ``plan.json`` is read by the
harness, which runs in the agent's environment (no pycrate there).
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np


def _drive_records(net, k: int, ue_index: int, *, seed: int, duration_s: float, speed_mps: float,
                   t0: float, cfg, block_m: float = 150.0) -> list:
    """One generated UE's drive on ``net`` as E2 trace records (route and radio seeds from
    ``seed``, UE index ``ue_index`` in the trace, Manhattan blocks of ``block_m`` metres)."""
    from pallas_tools.convert import reports_to_records
    from pallas_tools.radio import generate_drive, manhattan_route

    route = manhattan_route(net, speed_mps * duration_s + 200.0, speed_mps, seed=seed, block_m=block_m)
    sim = generate_drive(net, route, duration_s, seed=seed, ue_id=f"gen-{k}", t0=t0)
    return list(reports_to_records(sim.reports, ue_index, cfg))


def _write_trace(path: Path, streams: list[list]) -> Path:
    from xapp.e2.trace import TraceWriter
    with TraceWriter(str(path)) as w:
        for rec in heapq.merge(*streams, key=lambda r: r.time):
            w.write(rec)
    return path


# The history drives' UE indices and seeds stay clear of the replayed UEs' (0..ues-1, seed*1000+k).
HISTORY_UE_BASE = 10_000
HISTORY_SEED_BASE = 500
HISTORY_DRIVE_S = 300.0


def generate(out_dir: Path, *, seed: int, ues: int, duration_s: float, speed_mps: float,
             rows: int, cols: int, t0: float = 1_000_000.0, history_drives: int = 0,
             isd_m: float = 500.0, convoy: int = 0) -> tuple[Path, dict[int, int], Path | None]:
    """Generate the default drive's trace; returns (trace path, NRT {pci: cell id}, history
    trace path or None).

    ``isd_m``: the sites' inter-site distance, m (pallas_tools.radio.hex_network). ``convoy``: the
    first ``convoy`` UEs drive the first UE's route with its radio draws (shadowing, fading), so
    they hand over at the same moments to the same cells (concurrent migrations to one target);
    the others drive their own.

    ``history_drives`` > 0 also writes ``history.e2trace``: that many other UEs' drives of
    ``HISTORY_DRIVE_S`` seconds through the same network (same sites, same shadowing; other
    routes, ending before the replayed drive starts). It stands for the traffic a deployed xApp
    has seen in its network before: the xApp learns its association map, handover places and
    successors from it at start (descriptor ``association_map.path``), as it would have learned
    them online. None of the replayed UEs' routes or reports are in it.
    """
    from pallas_tools.convert import ConvertConfig
    from pallas_tools.radio import hex_network

    net = hex_network(rows, cols, isd_m=isd_m, seed=seed)
    cfg = ConvertConfig()
    block_m = min(150.0, isd_m)
    streams = [_drive_records(net, k, k, seed=seed * 1000 + (0 if k < convoy else k), duration_s=duration_s,
                              speed_mps=speed_mps, t0=t0, cfg=cfg, block_m=block_m) for k in range(ues)]
    path = _write_trace(out_dir / "drive.e2trace", streams)
    hist = None
    if history_drives > 0:
        t_h = t0 - HISTORY_DRIVE_S - 60.0
        hs = [_drive_records(net, k, HISTORY_UE_BASE + k, seed=seed * 1000 + HISTORY_SEED_BASE + k,
                             duration_s=HISTORY_DRIVE_S, speed_mps=speed_mps, t0=t_h, cfg=cfg,
                             block_m=block_m)
              for k in range(history_drives)]
        hist = _write_trace(out_dir / "history.e2trace", hs)
    nrt = {int(c.pci): int(c.cell_id) for c in net.cells}
    return path, nrt, hist


def _decode(trace: Path):
    """Every RIC_INDICATION of the trace through the xApp's ingest: [(record time, report)]."""
    from xapp.e2.ingest import decode_trace
    return decode_trace(str(trace))


def _handovers(reports) -> list[tuple[str, float, int, int]]:
    last: dict[str, int] = {}
    hos = []
    for _, r in reports:
        prev = last.get(r.ue_id)
        if prev is not None and r.serving_cell != prev and r.serving_cell >= 0 and prev >= 0:
            hos.append((r.ue_id, r.time, prev, r.serving_cell))
        if r.serving_cell >= 0:
            last[r.ue_id] = r.serving_cell
    return hos


def history_folder(history: Path, traces: Path | Sequence[Path], out: Path) -> tuple[Path, list[str]]:
    """What a deployed xApp knows of the area of real drives: ``out`` (made anew) holding a
    link to every drive-test CSV under ``history`` but the ones ``traces`` were converted from
    (``pallas_tools.convert`` names a trace ``<folder>_<stem>.e2trace``: a CSV whose stem a
    trace's name ends with, whatever folder it was converted from); the xApp learns its
    association map, handover places and successors from that folder
    (``xapp.predict.maps.knowledge_from_drives_at``), as ``pallas_tools.evaluate --map-from``
    scores it. Returns (folder, names of the CSVs left out).

    Raises:
        ValueError: ``history`` is not a folder, or holds no CSV besides the replayed drives.
    """
    if not history.is_dir():
        raise ValueError(f"--history {history}: not a folder")
    stems = [t.stem for t in ([traces] if isinstance(traces, Path) else traces)]
    import shutil
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    kept, left_out = 0, []
    for i, f in enumerate(sorted(history.rglob("*.csv"))):
        if any(st == f.stem or st.endswith("_" + f.stem) for st in stems):
            left_out.append(str(f))
            continue
        (out / f"{i:04d}_{f.parent.name}_{f.name}").symlink_to(f.resolve())
        kept += 1
    if kept == 0:
        raise ValueError(f"--history {history}: no drive-test CSV besides the replayed drive(s) "
                         f"{', '.join(stems)}")
    return out, left_out


def history_trace(history: Path, traces: Path | Sequence[Path]) -> Path:
    """``--history FILE.e2trace``: an E2 trace of the same area (``pallas-xapp --record``, or
    ``python -m pallas_tools.convert``) the xApp learns from as it is
    (``xapp.predict.maps.knowledge_from_drives_at``). Returns its absolute path.

    Raises:
        ValueError: the file is the replayed trace itself, or is not a readable E2 trace with
        at least one record (one line naming the file).
    """
    from xapp.e2.trace import TraceFormatError, read_trace
    if any(history.resolve() == t.resolve() for t in ([traces] if isinstance(traces, Path) else traces)):
        raise ValueError(f"--history {history}: the replayed trace itself (the xApp would know the drive ahead)")
    try:
        if next(iter(read_trace(history)), None) is None:
            raise ValueError(f"--history {history}: empty trace (no record)")
    except (OSError, TraceFormatError) as e:
        raise ValueError(f"--history {history}: {getattr(e, 'strerror', None) or e}") from None
    return history.resolve()


def history_source(history: Path, traces: Path | Sequence[Path], out: Path) -> tuple[Path, str]:
    """What the xApp learns from for ``--history``: an E2 trace file (:func:`history_trace`) or a
    folder of drive-test CSVs (:func:`history_folder`). Returns (path for
    ``controls.association_map.path``, a phrase for the plan's source). Raises ValueError as
    those do."""
    if history.is_file() and history.suffix == ".e2trace":
        return history_trace(history, traces), f"; the xApp learned from the E2 trace {history}"
    hist, left = history_folder(history, traces, out)
    return hist, (f"; the xApp learned from {sum(1 for _ in hist.iterdir())} drive(s) of {history}"
                  + (f" (the replayed {', '.join(Path(x).name for x in left)} left out)" if left else ""))


def trace_files(specs: Sequence[str]) -> list[Path]:
    """The converted drives named by ``--trace`` (files, or folders whose ``*.e2trace`` files are
    taken in name order), each once. Raises ValueError naming a path that is missing or a folder
    without traces."""
    out: list[Path] = []
    for spec in specs:
        p = Path(spec)
        if p.is_dir():
            found = sorted(p.glob("*.e2trace"))
            if not found:
                raise ValueError(f"--trace {p}: a folder with no .e2trace file (python -m pallas_tools.convert "
                                 f"CSV_OR_DIR -o DIR writes them)")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise ValueError(f"--trace {p}: no such file or folder")
    seen: set[Path] = set()
    return [p for p in out if not (p.resolve() in seen or seen.add(p.resolve()))]


def segment_bounds(reports, segment: str, *, min_handovers: int, lead_s: float,
                   tail_s: float) -> tuple[float, float]:
    """[t0, t1] (record times, s) of one drive's segment: ``auto`` (:func:`auto_segment`),
    ``A:B`` (seconds A to B from the drive's first record) or ``''`` (the whole drive).
    ``reports``: the drive's decoded [(record time, report)]. Raises ValueError on a bad spec."""
    times = [t for t, _ in reports]
    t_first, t_last = min(times), max(times)
    if not segment:
        return t_first, t_last
    if segment == "auto":
        return auto_segment(_handovers(reports), min_handovers, lead_s, tail_s)
    try:
        s0, s1 = (float(x) for x in segment.split(":"))
    except ValueError:
        raise ValueError(f"--segment {segment!r}: 'auto', START:END seconds or ''") from None
    if not 0 <= s0 < s1:
        raise ValueError(f"--segment {segment!r}: needs 0 <= START < END")
    return t_first + s0, t_first + s1


def merge_drives(parts: Sequence[tuple[Path, float, float]], out: Path,
                 decoded: dict[Path, list] | None = None) -> list[dict]:
    """Replay several drives together: each part (trace, t0, t1) is cut to [t0, t1] and shifted
    so that every part starts at the first part's t0; the records are merged in time order into
    ``out``. Each drive is one UE, so the drives must carry distinct UE identities
    (``python -m pallas_tools.convert DIR -o OUT`` numbers the UEs of one call; ``--first-ue``
    across calls). ``decoded``: each trace's [(record time, report)] where the caller has it
    already (:func:`_decode`), else decoded here. Returns per part {trace, ue, shift_s, records,
    start_s, end_s}.

    Raises:
        ValueError: two drives carry the same UE, or a part has no record in its window.
    """
    from xapp.e2.trace import TraceRecord, TraceWriter, read_trace
    base = parts[0][1]
    streams, info, owner = [], [], {}
    for trace, t0, t1 in parts:
        reports = (decoded or {}).get(trace) or _decode(trace)[0]
        ues = sorted({r.ue_id for t, r in reports if t0 <= t <= t1})
        for u in ues:
            if u in owner:
                raise ValueError(f"{trace.name} and {owner[u]} carry the same UE {u}: convert the drives in one "
                                 f"call (python -m pallas_tools.convert CSV... -o DIR) so each gets its own UE")
            owner[u] = trace.name
        shift = base - t0
        recs = [TraceRecord(r.time + shift, r.e2_node, r.mtype, r.payload, r.sub_id)
                for r in read_trace(str(trace)) if t0 <= r.time <= t1]
        if not recs:
            raise ValueError(f"{trace}: no record between {t0:.0f} and {t1:.0f}")
        streams.append(recs)
        first = min(t for t, _ in reports)
        info.append({"trace": str(trace), "ue": ",".join(ues), "shift_s": shift, "records": len(recs),
                     "start_s": round(t0 - first, 1), "end_s": round(t1 - first, 1)})
    with TraceWriter(str(out)) as w:
        for rec in heapq.merge(*streams, key=lambda r: r.time):
            w.write(rec)
    return info


def auto_segment(hos: Sequence[tuple[str, float, int, int]], min_handovers: int, lead_s: float,
                 tail_s: float) -> tuple[float, float]:
    """The shortest [first HO - lead, last HO + tail] holding ``min_handovers`` handovers of one
    UE. Raises ValueError if no UE has that many."""
    best = None
    by_ue: dict[str, list[float]] = {}
    for ue, t, _, _ in hos:
        by_ue.setdefault(ue, []).append(t)
    for ts in by_ue.values():
        for i in range(len(ts) - min_handovers + 1):
            span = ts[i + min_handovers - 1] - ts[i]
            if best is None or span < best[0]:
                best = (span, ts[i] - lead_s, ts[i + min_handovers - 1] + tail_s)
    if best is None:
        raise ValueError(f"no UE of the trace has {min_handovers} handovers")
    return best[1], best[2]


def build_plan(trace: Path, nrt: dict[int, int] | None = None, source: str = "") -> dict:
    """Decode ``trace`` and derive the plan (see the module docstring)."""
    reports, stats = _decode(trace)
    if not reports:
        raise ValueError(f"{trace}: no decodable RIC_INDICATION (ingest stats {stats})")
    pci_to_cell: dict[int, int] = dict(nrt or {})
    for _, r in reports:
        if r.serving_pci >= 0 and r.serving_cell >= 0:
            pci_to_cell.setdefault(r.serving_pci, r.serving_cell)
    ues: dict[str, dict] = {}
    cells: set[int] = set()
    e2_nodes: dict[int, str] = {}
    nb_pairs: Counter = Counter()
    for t, r in reports:
        u = ues.setdefault(r.ue_id, {"ue_id": r.ue_id, "start": t, "end": t, "cells": []})
        u["end"] = t
        if r.serving_cell >= 0:
            cells.add(r.serving_cell)
            e2_nodes.setdefault(r.serving_cell, r.e2_node)
            if not u["cells"] or u["cells"][-1][1] != r.serving_cell:
                u["cells"].append([t, r.serving_cell])
            for nb in r.neighbours:
                c = nb.cell_id if nb.cell_id >= 0 else pci_to_cell.get(nb.pci, -1)
                if c >= 0 and c != r.serving_cell:
                    nb_pairs[(r.serving_cell, c)] += 1
    hos = _handovers(reports)
    times = [t for t, _ in reports]
    return {
        "source": source,
        "trace": str(trace),
        "t_first": min(times),
        "t_last": max(times),
        "reports": len(reports),
        "ingest": stats,
        "ues": [u for u in ues.values() if u["cells"]],
        "handovers": [list(h) for h in hos],
        "cells": sorted(cells),
        "neighbour_pairs": [[a, b, n] for (a, b), n in sorted(nb_pairs.items())],
        "e2_nodes": {str(c): n for c, n in sorted(e2_nodes.items())},
        "nrt": {str(p): c for p, c in sorted(pci_to_cell.items())},
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pallas_eval.prepare", description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--generate", action="store_true", help="generate the default drive")
    src.add_argument("--trace", action="append",
                     help="a converted E2 trace (python -m pallas_tools.convert) or a folder of them; repeat it "
                          "for several drives, replayed together, one UE each")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--ues", type=int, default=2)
    ap.add_argument("--duration-s", type=float, default=50.0)
    ap.add_argument("--speed-mps", type=float, default=16.0)
    ap.add_argument("--grid", default="2x2", help="gNB sites, ROWSxCOLS (three cells each)")
    ap.add_argument("--history-drives", type=int, default=0,
                    help="generated drive: also write history.e2trace, this many earlier drives through "
                         "the same network for the xApp to learn from (0: none, it starts empty)")
    ap.add_argument("--isd-m", type=float, default=500.0, help="inter-site distance, m")
    ap.add_argument("--convoy", type=int, default=0, metavar="N",
                    help="the first N UEs on the first UE's route and radio draws: their handovers to one target at once")
    ap.add_argument("--history", default="",
                    help="--trace: what the xApp learns the area from: an E2 trace of it (*.e2trace, e.g. "
                         "pallas-xapp --record) or a folder of drive-test CSVs (every one but the replayed drives)")
    ap.add_argument("--segment", default="", help="per drive: 'auto', START:END seconds from the drive's start, "
                                                  "or '' (whole drives)")
    ap.add_argument("--min-handovers", type=int, default=5)
    ap.add_argument("--lead-s", type=float, default=10.0)
    ap.add_argument("--tail-s", type=float, default=5.0)
    a = ap.parse_args(argv)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    nrt: dict[int, int] = {}
    hist: Path | None = None
    if a.generate:
        rows, cols = (int(x) for x in a.grid.lower().split("x"))
        trace, nrt, hist = generate(out, seed=a.seed, ues=a.ues, duration_s=a.duration_s,
                                    speed_mps=a.speed_mps, rows=rows, cols=cols, history_drives=a.history_drives,
                                    isd_m=a.isd_m, convoy=a.convoy)
        source = (f"generated: {a.ues} UE(s){f' ({a.convoy} in convoy)' if a.convoy else ''}, {a.duration_s:g} s at "
                  f"{a.speed_mps:g} m/s, {rows}x{cols} three-sector sites {a.isd_m:g} m apart, seed {a.seed}")
        if hist is not None:
            source += f"; the xApp learned from {a.history_drives} earlier drives of {HISTORY_DRIVE_S:g} s"
    else:
        traces = trace_files(a.trace)
        source = (f"trace {traces[0]}" if len(traces) == 1
                  else f"{len(traces)} drives replayed together as {len(traces)} UEs ({', '.join(t.name for t in traces)})")
        if a.history:
            hist, what = history_source(Path(a.history), traces, out / "history")
            source += what
        if len(traces) == 1 and not a.segment:
            trace = traces[0]
        else:
            parts, decoded = [], {}
            for tr in traces:
                reports = decoded[tr] = _decode(tr)[0]
                parts.append((tr, *segment_bounds(reports, a.segment, min_handovers=a.min_handovers,
                                                  lead_s=a.lead_s, tail_s=a.tail_s)))
            seg = out / ("segment.e2trace" if len(traces) == 1 else "drives.e2trace")
            info = merge_drives(parts, seg, decoded)
            (out / "drives.json").write_text(json.dumps(info, indent=1))
            if len(traces) == 1:
                source += f", segment {info[0]['start_s']:.0f}-{info[0]['end_s']:.0f} s ({info[0]['records']} records)"
            else:
                source += "; segments " + ", ".join(f"{i['start_s']:.0f}-{i['end_s']:.0f} s" for i in info)
            trace = seg
    plan = build_plan(trace, nrt, source)
    plan["history"] = str(hist) if hist is not None else ""
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    (out / "nrt.json").write_text(json.dumps(plan["nrt"]))
    print(json.dumps({"plan": str(out / "plan.json"), "ues": len(plan["ues"]), "handovers": len(plan["handovers"]),
                      "cells": len(plan["cells"]), "seconds": round(plan["t_last"] - plan["t_first"], 1),
                      "source": source}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
