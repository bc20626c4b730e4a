"""Several real drives replayed together as one trace, one UE each (pallas_eval.prepare --trace
repeated): segments per drive, times shifted to a common start, UEs kept apart, and the xApp's
history left without any replayed drive. Runs in the xApp environment (the E2 decoders)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pallas_eval import prepare as pp
from xapp.e2.ingest import decode_trace

UCC = Path(__file__).resolve().parents[3] / "shared" / "data" / "ucc-5g"
DRIVES = ["Download/Driving/B_2020.01.16_12.10.03.csv", "Download/Driving/B_2019.12.16_11.49.59.csv",
          "Netflix/Driving/animated-RickandMorty/B_2019.11.21_10.20.17.csv"]

pytestmark = pytest.mark.skipif(not UCC.is_dir(), reason="the UCC drive data (../shared/data/ucc-5g) is not here")


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> list[Path]:
    from pallas_tools.convert import ConvertConfig, convert_file
    out = tmp_path_factory.mktemp("traces")
    return [Path(convert_file(UCC / d, out, i, ConvertConfig()).trace) for i, d in enumerate(DRIVES)]


def test_drives_are_merged_one_ue_each_from_a_common_start(traces, tmp_path):
    parts = []
    for tr in traces:
        reports, _ = decode_trace(str(tr))
        parts.append((tr, *pp.segment_bounds(reports, "0:120", min_handovers=1, lead_s=0, tail_s=0)))
    info = pp.merge_drives(parts, tmp_path / "drives.e2trace")
    merged, _ = decode_trace(str(tmp_path / "drives.e2trace"))
    by_ue: dict[str, list[float]] = {}
    for t, r in merged:
        by_ue.setdefault(r.ue_id, []).append(t)
    assert len(by_ue) == 3
    assert {i["ue"]: i["records"] for i in info} == {u: len(v) for u, v in by_ue.items()}
    starts = [min(v) for v in by_ue.values()]
    assert max(starts) - min(starts) < 1.5          # one report a second: all start together
    assert all(max(v) - min(v) <= 120.0 for v in by_ue.values())
    times = [t for t, _ in merged]
    assert times == sorted(times)
    # Each drive's own handovers survive the shift (same count within its window).
    for tr, (_, t0, t1), i in zip(traces, parts, info):
        own, _ = decode_trace(str(tr))
        window = [(t, r) for t, r in own if t0 <= t <= t1]
        mine = [(t, r) for t, r in merged if r.ue_id == i["ue"]]
        assert len(pp._handovers(window)) == len(pp._handovers(mine))


def test_the_same_ue_in_two_drives_is_refused(traces, tmp_path):
    from pallas_tools.convert import ConvertConfig, convert_file
    again = tmp_path / "again"
    again.mkdir()
    dup = Path(convert_file(UCC / DRIVES[1], again, 0, ConvertConfig()).trace)   # UE number 0, as drive 0's
    parts = [(traces[0], *_whole(traces[0])), (dup, *_whole(dup))]
    with pytest.raises(ValueError, match="carry the same UE"):
        pp.merge_drives(parts, tmp_path / "x.e2trace")


def _whole(tr: Path) -> tuple[float, float]:
    reports, _ = decode_trace(str(tr))
    return pp.segment_bounds(reports, "", min_handovers=1, lead_s=0, tail_s=0)


def test_segment_specs_and_trace_folders(traces, tmp_path):
    reports, _ = decode_trace(str(traces[0]))
    t_first = min(t for t, _ in reports)
    assert pp.segment_bounds(reports, "10:70", min_handovers=1, lead_s=0, tail_s=0) == (t_first + 10, t_first + 70)
    for bad in ("x", "70:10", "1:2:3"):
        with pytest.raises(ValueError, match="--segment"):
            pp.segment_bounds(reports, bad, min_handovers=1, lead_s=0, tail_s=0)
    assert pp.trace_files([str(traces[0].parent)]) == sorted(traces)
    assert pp.trace_files([str(traces[0]), str(traces[0].parent)]) == [traces[0]] + sorted(set(traces) - {traces[0]})
    with pytest.raises(ValueError, match="no such file"):
        pp.trace_files([str(tmp_path / "missing.e2trace")])
    with pytest.raises(ValueError, match="no .e2trace"):
        pp.trace_files([str(tmp_path)])


def test_prepare_plans_every_drive_and_leaves_them_out_of_the_history(traces, tmp_path):
    out = tmp_path / "input"
    args = [str(out)] + [x for tr in traces for x in ("--trace", str(tr))] + ["--segment", "0:200",
                                                                              "--history", str(UCC)]
    assert pp.main(args) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert len(plan["ues"]) == 3 and "3 drives replayed together" in plan["source"]
    linked = {p.name for p in (out / "history").iterdir()}
    for d in DRIVES:
        assert not any(n.endswith("_" + Path(d).name) and Path(d).parent.name in n for n in linked)
    assert len(linked) == sum(1 for _ in UCC.rglob("*.csv")) - 3
    assert plan["t_last"] - plan["t_first"] <= 201
