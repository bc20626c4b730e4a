"""``pallas compare`` (pallas_eval/compare.py): two arms of replays paired handover by handover."""

from __future__ import annotations

import csv
import json

import pytest

from pallas_eval.cli import main
from pallas_eval.compare import compare, load_sits

COLS = ["scheme", "ue_id", "time_s", "sit_s", "outcome"]


def _run(tmp_path, name, sits, commit="abc123", scheme="pallas", extra=()):
    d = tmp_path / name
    d.mkdir()
    with (d / "handovers.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLS)
        for i, s in enumerate(sits):
            w.writerow([scheme, str(i % 3), f"{10.0 + i:.12f}", "" if s is None else s / 1000.0, "commit"])
        for row in extra:
            w.writerow(row)
    (d / "summary.json").write_text(json.dumps({"provenance": {"commit": commit}}))
    return d


def test_pairs_by_handover_and_averages_an_arms_runs(tmp_path):
    a = _run(tmp_path, "a", [100, 200, 300, 400], extra=[["ctho", "0", "10.0", "0.9", "x"]])
    b1 = _run(tmp_path, "b1", [90, 150, 310, None], commit="def456")
    b2 = _run(tmp_path, "b2", [70, 150, 290, 380], commit="def456")
    c = compare([a], [b1, b2])
    # the 4th handover has no SIT in b1: it is left out of the pairing
    assert c.n == 3 and c.mean_a == pytest.approx(200.0) and c.mean_b == pytest.approx((80 + 150 + 300) / 3)
    assert c.diff == pytest.approx(((80 - 100) + (150 - 200) + (300 - 300)) / 3)
    assert c.median_diff == pytest.approx(-20.0) and c.b_faster == 2
    lo, hi = c.diff_ci
    assert lo <= c.diff <= hi and lo >= -50.0 and hi <= 0.0
    assert [r[1] for r in c.runs_b] == ["def456", "def456"] and c.runs_a[0][2] == pytest.approx(250.0)


def test_another_scheme_and_a_keyed_sit_are_read(tmp_path):
    a = _run(tmp_path, "a", [100, 200], extra=[["ctho", "0", "10.04", "0.5", "x"]])
    assert load_sits(a, "ctho") == {("0", 10.0): pytest.approx(500.0)}
    assert load_sits(a, "pallas")[("1", 11.0)] == pytest.approx(200.0)


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    a = _run(tmp_path, "a", [100, 200])
    other = tmp_path / "other"
    other.mkdir()
    (other / "handovers.csv").write_text("x,y\n1,2\n")
    with pytest.raises(ValueError, match="not a pallas replay handover table"):
        compare([a], [other])
    disjoint = _run(tmp_path, "d", [], extra=[["pallas", "9", "99.0", "0.1", "commit"]])
    with pytest.raises(ValueError, match="same drive and seed"):
        compare([a], [disjoint])
    with pytest.raises(ValueError, match="at least one run"):
        compare([], [a])
    assert main(["compare", str(a), str(tmp_path / "missing")]) == 2
    assert "handovers.csv" in capsys.readouterr().out


def test_the_command_prints_text_or_json(tmp_path, capsys):
    a = _run(tmp_path, "a", [100, 200, 300])
    b = _run(tmp_path, "b", [110, 190, 280])
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "paired over 3 handovers" in out and "B faster in 2 of 3" in out
    assert main(["compare", f"{a},{a}", str(b), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["n"] == 3 and got["diff"] == pytest.approx(-20 / 3) and len(got["runs_a"]) == 2
