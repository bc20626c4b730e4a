"""Every command of the README runs as written (issue 42: the README is the front door).

The README's indented code blocks are read, continuation lines joined; each command is either
run here, from a scratch folder laid out like the checkout (``.venv``, ``descriptors`` linked),
and must exit 0, or named below as needing what a test cannot have (a cluster, the RIC's
onboarder, the whole test suite or the twelve-minute main job). A command of a program not
classified fails the test, so a new README command is either run here or listed with a reason.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

#: Programs whose commands are not run here, and why.
NOT_RUN = {
    "make": "the set-up commands: the whole test suite (this test is part of it) and the 12-minute main job",
    "kubectl": "needs a Kubernetes cluster",
    "dms_cli": "OSC's onboarder, with a RIC",
    "helm": "installs onto a cluster (the chart's rendering is tested in tests/xapp/deploy)",
    "curl": "talks to a RIC's A1 mediator",
}


def readme_commands(text: str) -> list[str]:
    """The commands of ``text``'s indented (4-space) code blocks, a trailing ``\\`` joining the
    next line, ``# comments`` dropped."""
    cmds, cur = [], ""
    for line in text.splitlines():
        if not line.startswith("    ") or not line.strip():
            if cur:
                cmds.append(cur)
                cur = ""
            continue
        body = line[4:].rstrip()
        cur = (cur + " " + body.strip()) if cur else body
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
            continue
        cmds.append(re.sub(r"\s+#.*$", "", cur).strip())
        cur = ""
    if cur:
        cmds.append(cur)
    return [c for c in cmds if c]


def test_the_reader_joins_continuations_and_drops_comments():
    text = "x\n\n    make test    # the tests\n    a --b \\\n        --c d\n\ny\n"
    assert readme_commands(text) == ["make test", "a --b --c d"]


def _program(cmd: str) -> str:
    return Path(shlex.split(cmd)[0]).name


def test_every_readme_command_is_classified():
    cmds = readme_commands(README.read_text())
    assert any(c.startswith("make replay") for c in cmds) and any(c.startswith("make test") for c in cmds)
    unknown = [c for c in cmds if _program(c) not in NOT_RUN and not c.startswith(".venv/")]
    assert unknown == [], "README commands neither run by this test nor listed in NOT_RUN"


@pytest.mark.skipif(not (REPO / ".venv" / "xapp" / "bin" / "python").exists(), reason="no xApp environment")
def test_the_readme_commands_run_as_written(tmp_path):
    for name in (".venv", "descriptors"):
        (tmp_path / name).symlink_to(REPO / name)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "proto")])}
    ran = []
    for cmd in readme_commands(README.read_text()):
        if _program(cmd) in NOT_RUN:
            continue
        r = subprocess.run(shlex.split(cmd), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{cmd}\n{r.stderr[-2000:]}"
        ran.append(cmd)
    assert any("pallas-xapp --mode test" in c for c in ran), ran
    # Test mode replayed the generated trace: the event log has the run's start, its handovers and its end.
    events = [json.loads(x) for x in (tmp_path / "runs" / "quick" / "events.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("handover") >= 1
