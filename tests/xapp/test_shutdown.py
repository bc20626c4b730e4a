"""Live mode's bounded shutdown (xapp.main ``--shutdown-s``): from SIGTERM to the process's end
within the bound, under Kubernetes' 30 s grace period; a step that overruns it is named in the
log and the process exits with status 1 instead of waiting for SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from xapp.main import SHUTDOWN_S, shut_down

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "tests" / "xapp" / "deploy" / "stubbed_xapp.py"


def test_the_steps_run_in_order_and_one_that_raises_does_not_stop_the_next():
    ran = []

    def boom():
        ran.append("b")
        raise RuntimeError("b failed")
    steps = [("a", lambda: ran.append("a")), ("b", boom), ("c", lambda: ran.append("c"))]
    assert shut_down(steps, time.monotonic() + 30.0) is None
    assert ran == ["a", "b", "c"]


def test_a_step_past_the_deadline_is_named_with_its_part_and_left_behind():
    release = threading.Event()
    ran = []
    steps = [("a", lambda: ran.append("a")), ("xapp", lambda: release.wait(30.0)),
             ("c", lambda: ran.append("c"))]
    t0 = time.monotonic()
    try:
        assert shut_down(steps, t0 + 0.3, lambda: "policy calls") == "xapp: policy calls"
        assert time.monotonic() - t0 < 10.0 and ran == ["a"]    # returned at the deadline
    finally:
        release.set()


def test_the_default_fits_kubernetes_grace_period():
    assert 0 < SHUTDOWN_S < 30.0


def _live(tmp_path, *args, env=None):
    cfg = str(REPO / "descriptors" / "config-file.json")
    events = tmp_path / "live.jsonl"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'proto'}", **(env or {})}
    env.pop("CONFIG_FILE", None)
    log = open(tmp_path / "live.log", "wb")
    proc = subprocess.Popen([sys.executable, str(RUNNER), "--mode", "live", "--config", cfg, "--insecure",
                             "--store", "memory", "--rmr-port", "0", "--events", str(events),
                             "--log-level", "WARNING", *args],
                            env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    return proc, events


@pytest.mark.slow
def test_a_hung_step_ends_the_live_xapp_at_shutdown_s_with_status_1(tmp_path):
    # 6 s: the steps before the hung one (joins, a DNS lookup in flight) fit in it on a
    # loaded machine, so the step named is the hung one
    proc, events = _live(tmp_path, "--shutdown-s", "6", env={"PALLAS_TEST_HANG_POLICY_CLOSE": "1"})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if events.exists() and '"start"' in events.read_text():
                break
            time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "live.log").read_text()[-2000:]
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 1            # without the bound: never (the step hangs)
        assert time.monotonic() - t0 >= 6.0  # the steps had their time
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [json.loads(ln) for ln in (tmp_path / "live.log").read_text().splitlines()
             if ln.startswith("{")]
    overrun = [ln for ln in lines if ln["event"] == "shutdown_overrun"]
    assert [(o["step"], o["deadline_s"]) for o in overrun] == [("xapp: policy calls", 6.0)]


def test_a_shutdown_s_not_above_0_is_refused_in_one_line():
    from xapp.config import load_config_file
    from xapp.main import StartRefused, build_parser, build_xapp
    cfg = str(REPO / "descriptors" / "config-file.json")
    a = build_parser().parse_args(["--mode", "live", "--config", cfg, "--insecure", "--store", "memory",
                                   "--shutdown-s", "0"])
    with pytest.raises(StartRefused, match=r"^--shutdown-s 0.0: must be > 0 s$"):
        build_xapp(load_config_file(cfg), "live", a)
