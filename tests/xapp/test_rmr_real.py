"""The receive loop over the real RMR library (librmr_si.so built by hand, on LD_LIBRARY_PATH;
marked ``rmr``, skipped without it), and the load benchmark's refusal without it."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_rmr import real_rmr_available

REPO = Path(__file__).resolve().parents[2]
needs_rmr = pytest.mark.skipif(not real_rmr_available(), reason="librmr_si.so not on LD_LIBRARY_PATH")


def test_the_load_benchmark_says_why_and_exits_without_librmr():
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    if real_rmr_available() and not os.environ.get("LD_LIBRARY_PATH"):
        pytest.skip("librmr_si.so is installed system-wide")
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "rmr_load.py")], env=env, capture_output=True,
                       text=True, timeout=120, cwd=REPO)
    assert r.returncode == 2 and "librmr_si.so not found" in r.stderr and "docs/osc.md" in r.stderr


@pytest.mark.rmr
@needs_rmr
def test_real_rmr_indications_health_check_and_a1_round_trip(tmp_path, monkeypatch):
    """Two RMR contexts on loopback (static route table): 2,000 indications, a health check and
    an A1 request reach the xApp's receive loop; the health check and the A1 request are
    answered to the sender by return to sender."""
    rt = tmp_path / "route.rt"
    rt.write_text("newrt|start\nmse|12050|-1|127.0.0.1:4591\nmse|100|-1|127.0.0.1:4591\n"
                  "mse|20010|-1|127.0.0.1:4591\nnewrt|end\n")
    monkeypatch.setenv("RMR_SEED_RT", str(rt))
    monkeypatch.setenv("RMR_ASYNC_CONN", "0")
    monkeypatch.setenv("RMR_RTG_SVC", "-1")
    monkeypatch.setenv("RMR_SRC_ID", "127.0.0.1")
    monkeypatch.delenv("CONFIG_FILE", raising=False)
    from ricxappframe.rmr import rmr
    from ricxappframe import xapp_frame
    from xapp.e2.transport import RmrTransport

    monkeypatch.setattr(xapp_frame._BaseXapp, "registerXapp", lambda self: None)
    got: list = []
    tr = RmrTransport(rmr_port=4591, use_fake_sdl=True)

    def on_message(m):
        got.append((m.mtype, m.payload, m.e2_node, m.time))
        if m.mtype == 20010:
            tr.rts(m, 20011, b'{"status": "OK"}')

    tr.start(on_message)
    snd = rmr.rmr_init(b"4592", rmr.RMR_MAX_RCV_BYTES, rmr.RMRFL_MTCALL)
    try:
        end = time.time() + 10
        while rmr.rmr_ready(snd) == 0 and time.time() < end:
            time.sleep(0.05)
        assert tr.receiver.calls._fast_poll is not None      # the GIL-holding poll over the real library
        t0 = time.time()
        for k in range(2000):
            sb = rmr.rmr_alloc_msg(snd, 256, payload=b"ind%d" % k, mtype=12050, meid=b"gnb_x")
            for _ in range(100):
                sb = rmr.rmr_send_msg(snd, sb)
                if sb.contents.state != 10:
                    break
            assert sb.contents.state == 0
            rmr.rmr_free_msg(sb)
        for mtype, payload in ((100, b"ping"), (20010, b'{"operation": "CREATE"}')):
            sb = rmr.rmr_alloc_msg(snd, 256, payload=payload, mtype=mtype)
            sb = rmr.rmr_send_msg(snd, sb)
            assert sb.contents.state == 0
            rmr.rmr_free_msg(sb)
        answers = {}
        rb = rmr.rmr_alloc_msg(snd, 4096)
        end = time.time() + 20
        while len(answers) < 2 and time.time() < end:
            rb = rmr.rmr_torcv_msg(snd, rb, 100)
            if rb.contents.state == 0:
                answers[rb.contents.mtype] = rmr.get_payload(rb)
        rmr.rmr_free_msg(rb)
        end = time.time() + 20
        while sum(1 for g in got if g[0] == 12050) < 2000 and time.time() < end:
            time.sleep(0.05)
    finally:
        tr.stop()
        rmr.rmr_close(snd)
    inds = [g for g in got if g[0] == 12050]
    assert [p for _, p, _, _ in inds] == [b"ind%d" % k for k in range(2000)]
    assert all(n == "gnb_x" for _, _, n, _ in inds) and all(t >= t0 for *_, t in inds)
    assert answers == {101: b"OK\n", 20011: b'{"status": "OK"}'}
    assert tr.receiver.stats["dropped:queue full"] == 0 and tr.receiver.stats["shed"] == 0
