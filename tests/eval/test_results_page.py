"""Results pages generated from a run's summary.json (pallas_eval/results_page.py, ``pallas report``)."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pallas_eval import results_page as rpg
from pallas_eval.metrics import ratio_ci

FIXTURE = Path(__file__).parent / "fixtures" / "replay_summary.json"


def _row(page: str, first_cell: str) -> list[str]:
    """The cells of the Markdown table row whose first cell is ``first_cell`` (first such row)."""
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in\n{page}")


def test_the_page_carries_the_runs_values_and_provenance():
    data = json.loads(FIXTURE.read_text())
    page = rpg.render_page([("Default replay", data)])
    assert "- command: `pallas replay --seeds 2`" in page
    assert "- commit: `0123456789ab`" in page and "2026-12-04T23:00:00Z" in page
    assert "load average 1.5 at the start, 2.25 at the end" in page
    p = _row(page, "pallas")
    assert p[1:9] == ["3", "200 [100-300]", "200 / 298", "180", "41 / 76", "1.3%", "6/6", "3"]
    c = _row(page, "ctho")
    assert c[2] == "500 [300-700]" and c[4] == "520" and c[7] == "5/6" and c[5] == "43 / 77"
    # The ratio is recomputed from the per-handover rows (NaN SITs left out), as the replay prints it.
    r, lo, hi = ratio_ci([0.3, 0.5, 0.7], [0.1, 0.2, 0.3])
    assert abs(r - 2.5) < 1e-9
    ratio_line = [ln for ln in page.splitlines() if ln.startswith("| ctho | 2.50x")]
    assert ratio_line == [f"| ctho | 2.50x | {lo:.2f}-{hi:.2f}x |"]
    assert "- ctho: live 500 ms, model 300 ms, outside 90 ms; the difference is in the commit phase" in page
    assert "- pallas: live 200 ms, model 180 ms, within 54 ms" in page
    # CPU: the two agents summed into one role column, the total over roles.
    cpu = [ln for ln in page.splitlines() if ln.startswith("| scheme | agent")]
    assert cpu == ["| scheme | agent | vllm-engine | harness | total |"]
    assert "| pallas | 15.0 | 20.0 | 3.0 | 38.0 |" in page
    assert _row(page, "pallas")[0] == "pallas"
    prep = [ln for ln in page.splitlines() if ln.startswith("| pallas | 2 (2 prepared)")]
    assert prep == ["| pallas | 2 (2 prepared): 150 [100-200] | 1 (0 prepared): 300 | 3 of 5 | 6.0 | 1.0 | 4.0 | 0.50 |"]
    assert "Pacing: pacing held: 3 of 1,000 paced steps overran" in page


def test_a_run_without_provenance_says_so(tmp_path):
    data = json.loads(FIXTURE.read_text())
    del data["provenance"]
    page = rpg.render_run(data, "old")
    assert "not recorded" in page and "command:" not in page


def test_bad_run_folders_are_one_line_errors(tmp_path, capsys):
    assert rpg.main_report([str(tmp_path / "missing")], None) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "summary.json").write_text("{not json")
    assert rpg.main_report([str(tmp_path)], None) == 2
    assert "not a readable JSON summary" in capsys.readouterr().err
    (tmp_path / "summary.json").write_text(json.dumps({"simulated": {}}))
    assert rpg.main_report([str(tmp_path)], None) == 2
    assert "not a live replay's summary" in capsys.readouterr().err


def test_the_command_writes_the_page(tmp_path):
    run = tmp_path / "run-a"
    run.mkdir()
    shutil.copy(FIXTURE, run / "summary.json")
    out = tmp_path / "page.markdown"
    from pallas_eval.cli import main
    assert main(["report", str(run), "--markdown", "-o", str(out), "--title", "Seed 2"]) == 0
    text = out.read_text()
    assert text.startswith("# Results\n") and "## Seed 2" in text and "| pallas | 3 | 200 [100-300]" in text


def test_provenance_names_the_checkout_commit():
    p = rpg.provenance(["pallas", "replay", "--seeds", "1,2"])
    assert p["command"] == "pallas replay --seeds 1,2"
    assert rpg.provenance(["/r/pallas_eval/cli.py", "replay"])["command"] == "pallas replay"
    head = subprocess.run(["git", "-C", str(rpg.REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    assert p["commit"] == head.stdout.strip() and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", p["date_utc"])
    assert p["cpus"] >= 1


def test_append_adds_a_section_keeps_the_others_and_replaces_by_title(tmp_path, capsys):
    """``pallas report RUN --append -o PAGE``: the new run's section is added after the page's
    sections (whose run folders may be gone), a section of the same title is replaced in place,
    and a page that pallas report did not write is refused (exit 2, one line)."""
    run = tmp_path / "run-a"
    run.mkdir()
    shutil.copy(FIXTURE, run / "summary.json")
    page = tmp_path / "results.markdown"
    from pallas_eval.cli import main
    assert main(["report", str(run), "-o", str(page), "--title", "First"]) == 0
    first = page.read_text()
    data = json.loads(FIXTURE.read_text())
    data["provenance"]["commit"] = "fedcba987654"
    (run / "summary.json").write_text(json.dumps(data))
    assert main(["report", str(run), "--append", "-o", str(page), "--title", "Second"]) == 0
    two = page.read_text()
    assert two.startswith(first.rstrip("\n")) and two.count("\n## ") == 2
    assert two.index("## First") < two.index("## Second") and "`fedcba987654`" in two.split("## Second")[1]
    assert main(["report", str(run), "--append", "-o", str(page), "--title", "First"]) == 0
    again = page.read_text()
    assert again.count("\n## ") == 2 and again.index("## First") < again.index("## Second")
    assert "`0123456789ab`" not in again and again.split("## Second")[0].count("`fedcba987654`") == 1
    hand = tmp_path / "hand.markdown"
    hand.write_text("# Notes\n\nTyped by hand.\n")
    assert main(["report", str(run), "--append", "-o", str(hand)]) == 2
    assert "not written by pallas report" in capsys.readouterr().err
    assert main(["report", str(run), "--append", "-o", str(tmp_path / "none.markdown")]) == 2
