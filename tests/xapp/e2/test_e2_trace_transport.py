"""Trace format, replay, the trace and RMR transports, the inspect command."""

import io
import json
import sys
import threading
from pathlib import Path

import pytest

from xapp.e2 import inspect as e2inspect
from xapp.e2 import trace as T
from xapp.e2.transport import A1_POLICY_REQ, A1_POLICY_RESP, RIC_INDICATION, RmrMessage, TraceTransport


def recs(e2, n=5):
    return [T.TraceRecord(100.0 + i * 0.5, f"gnb_001_01_{i:08x}", RIC_INDICATION,
                          e2.rc_indication(e2.ue(i + 1), e2.rrc(-90.0 - i)), sub_id=7) for i in range(n)]


def test_trace_write_read_round_trip(tmp_path, e2):
    rs = recs(e2) + [T.TraceRecord(103.0, "", A1_POLICY_REQ, b'{"operation": "CREATE"}', 20000)]
    p = str(tmp_path / "a.e2trace")
    assert T.write_trace(p, rs) == 6
    assert list(T.read_trace(p)) == rs
    raw = open(p, "rb").read()
    assert raw[:8] == b"PLLSE2TR"
    with pytest.raises(T.TraceFormatError, match="truncated"):
        list(T.read_trace(io.BytesIO(raw[:-3])))
    with pytest.raises(T.TraceFormatError, match="magic"):
        list(T.read_trace(io.BytesIO(b"XXXXXXXX\x01\x00\x00\x00")))


def test_trace_paths_may_be_pathlib_and_the_reader_refuses_disorder(tmp_path, e2):
    rs = recs(e2, 3)
    p = tmp_path / "b.e2trace"                              # a pathlib.Path, not a str
    assert T.write_trace(p, rs) == 3
    assert list(T.read_trace(p)) == rs
    tt = TraceTransport(p)
    got = []
    tt.start(got.append)
    assert [m.payload for m in got] == [r.payload for r in rs]
    # A file the writer could not have produced: the second record older than the first, or
    # a NaN time. The reader names the offset of the bad record (the first one is yielded).
    for bad_time in (99.0, float("nan")):
        buf = io.BytesIO()
        T.TraceWriter(buf).write(rs[0])
        buf.write(T._RECORD.pack(bad_time, RIC_INDICATION, -1, 1, 1) + b"nx")   # record layout by hand
        it = T.read_trace(io.BytesIO(buf.getvalue()))
        assert next(it) == rs[0]
        with pytest.raises(T.TraceFormatError, match="before the previous"):
            next(it)


def test_trace_transport_delivers_up_to_a_damaged_record_and_says_why(tmp_path, e2):
    rs = recs(e2, 3)
    p = tmp_path / "c.e2trace"
    T.write_trace(p, rs)
    p.write_bytes(p.read_bytes()[:-5])                      # the last record is cut short
    tt = TraceTransport(str(p))
    got = []
    tt.start(got.append)                                     # does not raise
    assert [m.payload for m in got] == [r.payload for r in rs[:2]] and tt.delivered == 2
    assert tt.error is not None and "truncated record" in tt.error
    ok = TraceTransport(rs)
    ok.start(lambda m: None)
    assert ok.delivered == 3 and ok.error is None


def test_writer_refuses_disorder():
    w = T.TraceWriter(io.BytesIO())
    w.write(T.TraceRecord(2.0, "", 1, b""))
    with pytest.raises(ValueError):
        w.write(T.TraceRecord(1.0, "", 1, b""))


def test_replay_at_recorded_speed_and_as_fast_as_possible(e2):
    rs = recs(e2, 4)  # times 100.0, 100.5, 101.0, 101.5
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s

    got = []
    assert T.replay(rs, got.append, speed=1.0, clock=lambda: now[0], sleep=sleep) == 4
    assert got == rs and sum(slept) == pytest.approx(1.5)
    now[0], slept[:] = 0.0, []
    T.replay(rs, got.append, speed=3.0, clock=lambda: now[0], sleep=sleep)
    assert sum(slept) == pytest.approx(0.5)
    slept[:] = []
    T.replay(rs, got.append, speed=None, clock=lambda: now[0], sleep=sleep)
    assert slept == []


def test_trace_transport_delivers_in_order_and_keeps_what_is_sent(tmp_path, e2):
    p = str(tmp_path / "b.e2trace")
    T.write_trace(p, recs(e2, 3) + [T.TraceRecord(102.0, "", A1_POLICY_REQ, b"{}", 20000)])
    tr = TraceTransport(p)
    seen = []

    def on_message(m: RmrMessage):
        seen.append((m.mtype, m.e2_node, m.time, m.sub_id))
        if m.mtype == A1_POLICY_REQ:
            assert tr.rts(m, A1_POLICY_RESP, b'{"status": "OK"}')
        if m.e2_node.endswith("1"):
            raise RuntimeError("handler bug")  # logged, the replay goes on

    tr.start(on_message)
    assert [s[0] for s in seen] == [RIC_INDICATION] * 3 + [A1_POLICY_REQ]
    assert seen[0][1:] == ("gnb_001_01_00000000", 100.0, 7)
    assert tr.sent == [(A1_POLICY_RESP, b'{"status": "OK"}', 20000)] and tr.delivered == 4
    assert tr.send(30000, b"x")


def test_trace_transport_threaded_stop(e2):
    rs = [T.TraceRecord(float(i), "", RIC_INDICATION, b"") for i in range(1000)]
    tr = TraceTransport(rs, speed=1.0, threaded=True)
    got = threading.Event()
    tr.start(lambda m: got.set())
    assert got.wait(5)
    tr.stop()
    assert tr.wait(5) and tr.delivered < 1000


# ----------------------------------------------------------------------------- live transport, RMR stubbed

def test_rmr_transport_with_rmr_stubbed(monkeypatch, e2):
    """The live transport over ricxappframe's RMR wrappers with the C library stubbed
    (tests/xapp/fake_rmr.py): an indication, an A1 request answered by return to sender, a
    health check answered by the receive loop itself, and a send."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fake_rmr import FakeRmrLib

    from xapp.e2.transport import RmrTransport

    fake = FakeRmrLib().install(monkeypatch)
    ind = e2.rc_indication(e2.ue(5), e2.rrc())
    fake.push(RIC_INDICATION, ind, b"gnb_001_01_0000a81b", 3)
    fake.push(A1_POLICY_REQ, b'{"policy_type_id": 20000}', b"", 20000)
    fake.push(100, b"ping", b"", -1)
    done = threading.Event()
    got = []
    tr = RmrTransport(rmr_port=4560, use_fake_sdl=True)

    def on_message(m: RmrMessage):
        got.append(m)
        if m.mtype == A1_POLICY_REQ:
            tr.rts(m, A1_POLICY_RESP, b'{"status": "OK"}')
        if len(got) == 2:
            done.set()

    tr.start(on_message)
    assert done.wait(10)
    assert tr.send(30000, b"hello")
    tr.stop()
    assert sorted((m.mtype, m.sub_id, m.e2_node) for m in got) == [(RIC_INDICATION, 3, "gnb_001_01_0000a81b"),
                                                                   (A1_POLICY_REQ, 20000, "")]
    assert next(m for m in got if m.mtype == RIC_INDICATION).payload == ind
    assert (101, b"OK\n", "rts") in fake.sent  # the health check answered by the receive loop
    assert (A1_POLICY_RESP, b'{"status": "OK"}', "rts") in fake.sent
    assert (30000, b"hello", "send") in fake.sent
    assert fake.live() == 0 and fake.closed


# ----------------------------------------------------------------------------- inspect

def test_inspect_trace_and_hex(tmp_path, e2):
    p = str(tmp_path / "c.e2trace")
    T.write_trace(p, recs(e2, 2) + [T.TraceRecord(105.0, "gnb_x", RIC_INDICATION, b"\x00\x05\x40\x7f")])
    out = io.StringIO()
    assert e2inspect.main([p], out=out) == 1  # one message failed
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert lines[0]["ran_function"] == 3 and lines[0]["service_model"] == "rc"
    assert lines[0]["reports"][0]["ue"] == "1" and lines[0]["reports"][0]["rsrp_dbm"] == -90.0
    assert lines[0]["reports"][0]["serving_cell"] == 0xA81B0C and lines[0]["e2_node"] == "gnb_001_01_00000000"
    assert "error" in lines[2] and lines[2]["error"].startswith("E2AP")
    out = io.StringIO()
    hexpdu = e2.rc_indication(e2.ue(9), e2.rrc(-70.0)).hex()
    assert e2inspect.main(["--hex", hexpdu, "--e2-node", "gnb_y"], out=out) == 0
    d = json.loads(out.getvalue())
    assert d["e2_node"] == "gnb_y" and d["reports"][0]["ue"] == "9" and d["reports"][0]["rsrp_dbm"] == -70.0


def test_inspect_describes_an_a1_payload_nested_too_deeply_as_an_error():
    from xapp.e2.ingest import IngestConfig
    d = e2inspect.describe(T.TraceRecord(0.0, "", A1_POLICY_REQ, b"[" * 100_000), IngestConfig())
    assert d["error"] == "A1 payload is not JSON: nested too deeply"
    out = io.StringIO()
    assert e2inspect.main(["--hex", (b"[" * 5000).hex(), "--mtype", str(A1_POLICY_REQ)], out=out) == 1
    assert "error" in json.loads(out.getvalue())
