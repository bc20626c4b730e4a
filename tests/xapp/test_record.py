"""Record mode (``pallas-xapp --record FILE``, xapp.e2.record): the E2 indications a live xApp
handles, written as an E2 trace that test mode replays to the same decisions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xapp.e2.record import TraceRecorder
from xapp.e2.trace import HEADER_SIZE, TraceRecord, read_trace, record_size
from xapp.e2.transport import RmrMessage

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "tests" / "xapp" / "deploy" / "stubbed_xapp.py"
SPEED = 5.0     # the live inflow runs the 30 s drive 5x faster; the recording keeps that pace


def _msg(t: float, mtype: int = 12050, payload: bytes = b"\x00\x01", node: str = "gnb_001_01_00a81b0c"):
    return RmrMessage(mtype, payload, 7, node, t)


def test_indications_are_written_whole_and_readable_before_close(tmp_path):
    rec = TraceRecorder(tmp_path / "r.e2trace", 1 << 20)
    rec.on_message(_msg(10.0))
    rec.on_message(_msg(11.0, mtype=20010))            # A1: not an E2 indication
    rec.on_message(_msg(9.5, payload=b"\x02"))         # clock stepped back: kept in order
    # not closed (a killed xApp): what is on disk is whole records
    got = list(read_trace(tmp_path / "r.e2trace"))
    assert [(r.time, r.mtype, r.sub_id, r.e2_node, r.payload) for r in got] == [
        (10.0, 12050, 7, "gnb_001_01_00a81b0c", b"\x00\x01"), (10.0, 12050, 7, "gnb_001_01_00a81b0c", b"\x02")]
    assert rec.count == 2 and rec.bytes == (tmp_path / "r.e2trace").stat().st_size
    rec.close()
    rec.on_message(_msg(12.0))
    assert len(list(read_trace(tmp_path / "r.e2trace"))) == 2


def test_the_cap_stops_recording_at_a_record_boundary(tmp_path):
    one = record_size(TraceRecord(0.0, "gnb_001_01_00a81b0c", 12050, b"\x00\x01", 7))
    rec = TraceRecorder(tmp_path / "r.e2trace", HEADER_SIZE + 3 * one + one // 2)
    for k in range(5):
        rec.on_message(_msg(float(k)))
    assert rec.count == 3 and "cap" in rec.stopped
    assert (tmp_path / "r.e2trace").stat().st_size == HEADER_SIZE + 3 * one
    assert len(list(read_trace(tmp_path / "r.e2trace"))) == 3


def test_record_is_refused_in_test_mode_and_for_an_unwritable_file(tmp_path):
    cfg = str(REPO / "descriptors" / "config-file.json")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'proto'}"}
    for args, line in ((["--mode", "test", "--trace", "x.e2trace", "--record", "r.e2trace"],
                        "--record is a live-mode flag (test mode replays a trace)"),
                       (["--mode", "live", "--insecure", "--store", "memory", "--record",
                         str(tmp_path / "no" / "dir.e2trace")],
                        f"--record {tmp_path}/no/dir.e2trace: No such file or directory")):
        out = subprocess.run([sys.executable, "-m", "xapp.main", "--config", cfg, "--log-level", "ERROR", *args],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert (out.returncode, out.stderr.strip().splitlines()) == (2, [line])


def test_a_bad_trace_or_nrt_is_one_line_and_exit_2_in_test_mode(tmp_path):
    """The README's test-mode command with a wrong --trace or --nrt: no traceback."""
    cfg = str(REPO / "descriptors" / "config-file.json")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'proto'}"}
    csv = tmp_path / "drive.csv"
    csv.write_text("Timestamp,Longitude,Latitude,Speed,Operatorname,CellID,NetworkMode,RSRP\n" * 3)
    empty = tmp_path / "empty.e2trace"
    TraceRecorder(empty, 1 << 20).close()
    good = tmp_path / "one.e2trace"
    rec = TraceRecorder(good, 1 << 20)
    rec.on_message(_msg(1.0))
    rec.close()
    (tmp_path / "nrt.json").write_text("[1, 2]")
    for args, line in ((["--trace", str(tmp_path / "none.e2trace")],
                        f"--trace {tmp_path}/none.e2trace: No such file or directory"),
                       (["--trace", str(csv)],
                        f"--trace {csv}: not a Pallas E2 trace (magic b'Timestam'); a drive-test CSV becomes a "
                        f"trace with: python -m pallas_tools.convert {csv} -o DIR (in the xApp's environment)"),
                       (["--trace", str(empty)], f"--trace {empty}: empty trace (no record)"),
                       (["--trace", str(good), "--nrt", str(tmp_path / "nrt.json")],
                        f"--nrt {tmp_path}/nrt.json: not a JSON object of PCI -> NR cell identity "
                        "('list' object has no attribute 'items')")):
        out = subprocess.run([sys.executable, "-m", "xapp.main", "--mode", "test", "--config", cfg,
                              "--log-level", "ERROR", *args],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert (out.returncode, out.stderr.strip().splitlines()) == (2, [line])


def _events(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def _handovers(events: list[dict]) -> list:
    """The handovers the xApp saw: (UE, report time, from cell, to cell), in order."""
    return [(e["ue"], round(e["trace_t"], 6), e["from_cell"], e["to_cell"])
            for e in events if e["kind"] == "handover"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_live_recording_replays_in_test_mode_to_the_same_decisions(tmp_path):
    from pallas_eval.prepare import generate
    src, nrt, _ = generate(tmp_path, seed=3, ues=2, duration_s=30.0, speed_mps=16.0, rows=2, cols=2)
    (tmp_path / "nrt.json").write_text(json.dumps({str(k): v for k, v in nrt.items()}))
    n_src = sum(1 for _ in read_trace(src))
    cfg = str(REPO / "descriptors" / "config-file.json")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'proto'}",
           "PALLAS_TEST_RMR_INFLOW": str(src), "PALLAS_TEST_RMR_INFLOW_DELAY_S": "1",
           "PALLAS_TEST_RMR_INFLOW_SPEED": str(SPEED)}
    env.pop("CONFIG_FILE", None)
    rec, live_ev = tmp_path / "live.e2trace", tmp_path / "live.jsonl"
    log = open(tmp_path / "live.log", "wb")
    proc = subprocess.Popen([sys.executable, str(RUNNER), "--mode", "live", "--config", cfg, "--insecure",
                             "--store", "memory", "--rmr-port", "0", "--nrt", str(tmp_path / "nrt.json"),
                             "--record", str(rec), "--events", str(live_ev), "--log-level", "WARNING"],
                            env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            if rec.exists() and sum(1 for _ in read_trace(rec)) >= n_src:
                break
            time.sleep(0.5)
        recorded = list(read_trace(rec))         # read while the xApp still runs
        assert len(recorded) == n_src, (tmp_path / "live.log").read_text()[-2000:]
        time.sleep(1.0)                          # the last reports' cycle
        proc.send_signal(signal.SIGTERM)
        try:                                     # within --shutdown-s (20 s), else it names the step
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            rc = None
        assert rc == 0, (rc, (tmp_path / "live.log").read_text()[-3000:])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # byte for byte what arrived, stamped with the receipt times the live xApp used
    assert [(r.e2_node, r.mtype, r.payload) for r in recorded] == \
        [(r.e2_node, r.mtype, r.payload) for r in read_trace(src)]
    assert [e["records"] for e in _events(live_ev) if e["kind"] == "recorded"] == [n_src]
    test_ev = tmp_path / "test.jsonl"
    out = subprocess.run([sys.executable, "-m", "xapp.main", "--mode", "test", "--config", cfg,
                          "--trace", str(rec), "--nrt", str(tmp_path / "nrt.json"), "--events", str(test_ev),
                          "--speed", "1", "--linger-s", "1", "--log-level", "WARNING"],
                         env={k: v for k, v in env.items() if not k.startswith("PALLAS_TEST")},
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # The per-report decisions are the same: every handover, at the same report time. (The
    # predictions come from the 0.1 s wall-clock control cycle, whose phase against the reports
    # the trace does not fix, so they are not compared one by one.)
    live_hos, test_hos = _handovers(_events(live_ev)), _handovers(_events(test_ev))
    assert live_hos and live_hos == test_hos
    assert [e["ingest"]["reports"] for e in _events(test_ev) if e["kind"] == "end"] == [n_src]


def test_history_takes_an_e2_trace_such_as_a_recording(tmp_path):
    """``pallas replay``/``pallas_eval.prepare --trace T --history H``: H may be an E2 trace (what
    --record writes) as well as a folder of drive-test CSVs; the plan hands it to the xApp's
    ``association_map.path`` as is."""
    from pallas_eval.prepare import generate, history_source, main as prepare
    from xapp.predict.maps import knowledge_from_drives_at
    (tmp_path / "g").mkdir()
    trace, _, hist = generate(tmp_path / "g", seed=4, ues=1, duration_s=20.0, speed_mps=16.0, rows=2, cols=2,
                              history_drives=1)
    path, what = history_source(hist, trace, tmp_path / "h")
    assert path == hist.resolve() and "E2 trace" in what
    assert knowledge_from_drives_at(path) is not None
    assert prepare([str(tmp_path / "p"), "--trace", str(trace), "--history", str(hist)]) == 0
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["history"] == str(hist.resolve())
    with pytest.raises(ValueError, match="the replayed trace itself"):
        history_source(trace, trace, tmp_path / "h")
    bad = tmp_path / "drive.e2trace"
    bad.write_text("Date,Time,Longitude\n")
    with pytest.raises(ValueError, match=r"^--history .*drive.e2trace: not a Pallas E2 trace"):
        history_source(bad, trace, tmp_path / "h")
