"""``pallas replay --trace T --history DIR``: the xApp learns from every drive of the area but the
replayed one (issue 26 item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pallas_eval import replay as rp
from pallas_eval.prepare import history_folder

UCC = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "ucc-5g"


@pytest.mark.skipif(not UCC.is_dir(), reason="the UCC 5G drives are not beside the repository (../shared/data)")
def test_history_holds_every_ucc_drive_but_the_replayed_one(tmp_path):
    all_csv = sorted(UCC.rglob("*.csv"))
    replayed = next(f for f in all_csv if f.stem == "B_2020.02.13_13.03.24")
    trace = tmp_path / f"{replayed.parent.name}_{replayed.stem}.e2trace"   # pallas_tools.convert's name
    folder, left = history_folder(UCC, trace, tmp_path / "history")
    links = sorted(folder.iterdir())
    assert left == [str(replayed)]
    assert len(links) == len(all_csv) - 1
    targets = {p.resolve() for p in links}
    assert replayed.resolve() not in targets and all(p.is_symlink() for p in links)
    assert targets == {f.resolve() for f in all_csv} - {replayed.resolve()}
    # converted from a copy in another folder: still the same drive, still left out
    _, left2 = history_folder(UCC, tmp_path / f"elsewhere_{replayed.stem}.e2trace", tmp_path / "history")
    assert left2 == [str(replayed)]


def test_history_refuses_a_folder_with_nothing_but_the_replayed_drive(tmp_path):
    d = tmp_path / "drives" / "Driving"
    d.mkdir(parents=True)
    (d / "B_1.csv").write_text("x\n")
    with pytest.raises(ValueError, match="no drive-test CSV besides"):
        history_folder(tmp_path / "drives", tmp_path / "Driving_B_1.e2trace", tmp_path / "h")
    with pytest.raises(ValueError, match="not a folder"):
        history_folder(tmp_path / "missing", tmp_path / "Driving_B_1.e2trace", tmp_path / "h")
    # a second call replaces the folder (a rerun into the same --out)
    (d / "B_2.csv").write_text("x\n")
    f1, _ = history_folder(tmp_path / "drives", tmp_path / "Driving_B_1.e2trace", tmp_path / "h")
    f2, _ = history_folder(tmp_path / "drives", tmp_path / "Driving_B_1.e2trace", tmp_path / "h")
    assert f1 == f2 and [p.name for p in f2.iterdir()] == ["0001_Driving_B_2.csv"]


def test_history_without_a_trace_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--history is for a real drive"):
        rp.prepare(rp.ReplayOptions(out_dir=tmp_path, history=str(tmp_path)))
