"""The xApp's own RMR receive loop (xapp.e2.rmrloop, issue 28 item 1) over a stub of RMR's C
primitives (tests/xapp/fake_rmr.py): ricxappframe's ctypes wrappers, the transport and the
loop run unchanged on real ``rmr_mbuf_t`` structures; only librmr_si.so is replaced.

Times are the fake's virtual clock where a bound in time is asserted (the inflow advances it by
1/rate per message), so the assertions hold on a loaded machine: what is checked is how many
messages the loop takes before it delivers, not how fast the machine runs.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fake_rmr import FakeRmrLib

REPO = Path(__file__).resolve().parents[2]
RIC_INDICATION, HEALTH_REQ, HEALTH_RESP, A1_REQ, A1_RESP = 12050, 100, 101, 20010, 20011
NODE = b"gnb_001_01_00a81b0c"


def _indications(n_ues: int = 8) -> list[bytes]:
    from pallas_tools.tracegen import encode_rc_message_copy, encode_ric_indication, encode_rrc_meas_report
    from xapp.e2.e2ap import RicIndication
    from xapp.e2.ie import Cgi, Guami, UeId
    from xapp.e2.rrc import CellResult, RrcMeasReport, ServingResult
    from xapp.e2.sm_rc import RcMessageCopy
    out = []
    for ue in range(n_ues):
        u = UeId(kind="gNB", amf_ue_ngap_id=ue + 1, guami=Guami(plmn="00101"))
        r = RrcMeasReport(1, (ServingResult(0, CellResult(101, -90.0 - ue, -10.0, 10.0)),),
                          (CellResult(202, -95.0, -11.0, 5.0),))
        h, m = encode_rc_message_copy(RcMessageCopy(encode_rrc_meas_report(r), u, Cgi("00101", 0xA81B0C01)))
        out.append(encode_ric_indication(RicIndication(1, 1, 3, 1, h, m, sn=ue)))
    return out


def _wait(cond, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_continuous_inflow_is_delivered_at_once_with_bounded_memory_and_counted_losses(monkeypatch):
    """An inflow that never lets a receive come back empty (10,000 indications/s on the fake's
    clock; ricxappframe's rmr_rcvall_msgs_raw would never return under it) into a handler
    slower than the inflow (the real E2 ingest): the first indication reaches the xApp 51.2 ms
    after the inflow starts (one batch of 512), every message is stamped with its receipt time,
    the queue never exceeds its bound, no RMR buffer leaks, and what could not be handled is
    counted as dropped (queue full) or shed (older than shed_after_s), never lost silently."""
    from xapp.e2.ingest import Ingestor
    from xapp.e2.transport import RmrTransport
    from xapp.tracks import TrackStore

    pdus = _indications()
    fake = FakeRmrLib(inflow=lambda seq: (RIC_INDICATION, pdus[seq % len(pdus)], NODE, seq),
                      virtual_rate=10_000.0).install(monkeypatch)
    ingest = Ingestor(TrackStore())
    reg = CollectorRegistry()
    tr = RmrTransport(rmr_port=4599, use_fake_sdl=True, wait_for_ready=False, queue_size=1024, batch=512,
                      handle_max=128, shed_after_s=0.08, registry=reg, clock=fake.now)
    seen: list[tuple[float, int, float, int]] = []      # (fake time handled, seq, receipt time, queued)
    enough = threading.Event()

    def on_message(m):
        seen.append((fake.now(), m.sub_id, m.time, len(tr.receiver.indications)))
        assert ingest.on_indication(m.payload, m.e2_node, m.time, m.sub_id)
        if len(seen) >= 1500:
            enough.set()

    tr.start(on_message)
    try:
        assert enough.wait(120), tr.receiver.stats
    finally:
        tr.stop()
    st = tr.receiver.stats
    first_t, first_seq, first_rx, _ = seen[0]
    assert first_seq == 0 and first_t - fake.t0 == pytest.approx(512 / 10_000.0)   # one batch
    assert first_t - fake.t0 <= 0.100
    assert all(rx == fake.arrivals[seq] for _, seq, rx, _ in seen)       # receipt time stamped
    assert all(t - rx <= 0.08 for t, _, rx, _ in seen)                    # nothing older handled
    assert [s for _, s, _, _ in seen] == sorted(s for _, s, _, _ in seen)  # oldest first
    assert max(q for *_, q in seen) <= 1024 and len(tr.receiver.indications) == 0   # bounded; emptied at stop
    assert fake.live() == 0 and fake.allocs == fake.frees                 # every buffer freed
    assert st["dropped:queue full"] > 0 and st["shed"] > 0
    assert st["received:indication"] == st["handled"] + st["shed"] + st["dropped:queue full"] + \
        st["queued_at_stop"]
    assert ingest.stats["reports"] == st["handled"] == len(seen)
    assert reg.get_sample_value("pallas_rmr_dropped_total", {"reason": "queue_full"}) == st["dropped:queue full"]
    assert reg.get_sample_value("pallas_rmr_shed_total") == st["shed"]
    assert reg.get_sample_value("pallas_rmr_message_age_seconds_count") == st["handled"]
    assert reg.get_sample_value("pallas_rmr_message_age_seconds_bucket", {"le": "0.1"}) == st["handled"]
    assert reg.get_sample_value("pallas_rmr_queue_capacity", {"queue": "indication"}) == 1024


def test_health_checks_and_a1_requests_are_handled_ahead_of_indications(monkeypatch):
    """2,000 indications already waiting, then a health check and an A1 request: the health
    check is answered in the receive phase that takes it (after at most 3 x 32 indications were
    handled), the A1 request by the control thread while most of the backlog still waits."""
    from xapp.e2.transport import RmrTransport

    fake = FakeRmrLib().install(monkeypatch)
    pdus = _indications(1)
    for k in range(2000):
        fake.push(RIC_INDICATION, pdus[0], NODE, k)
    fake.push(HEALTH_REQ, b"ping", b"", -1)
    fake.push(A1_REQ, b'{"operation": "CREATE"}', b"", 26001)
    for k in range(10):
        fake.push(RIC_INDICATION, pdus[0], NODE, 2000 + k)
    tr = RmrTransport(rmr_port=4599, use_fake_sdl=True, wait_for_ready=False, shed_after_s=600.0)
    handled = [0]
    at_health: list[int] = []
    at_a1: list[int] = []
    fake.on_send = lambda mtype, payload: at_health.append(handled[0]) if mtype == HEALTH_RESP else None

    def on_message(m):
        if m.mtype == RIC_INDICATION:
            time.sleep(0.001)              # a slow handler: 2 s of backlog
            handled[0] += 1
        elif m.mtype == A1_REQ:
            at_a1.append(handled[0])
            assert m.payload == b'{"operation": "CREATE"}' and m.sub_id == 26001
            assert tr.rts(m, A1_RESP, b'{"status": "OK"}')

    tr.start(on_message)
    try:
        assert _wait(lambda: handled[0] == 2010, 60), (handled, tr.receiver.stats)
    finally:
        tr.stop()
    assert at_health and at_health[0] <= 3 * tr.receiver.handle_max        # 3 x 32
    assert at_a1 and at_a1[0] < 2000
    assert (HEALTH_RESP, b"OK\n", "rts") in fake.sent and (A1_RESP, b'{"status": "OK"}', "rts") in fake.sent
    assert tr.receiver.stats["health_answered"] == 1 and tr.receiver.stats["shed"] == 0
    assert fake.live() == 0


def test_a_full_control_queue_drops_and_counts(monkeypatch):
    """Control messages beyond control_queue_size while the control thread is busy are dropped,
    counted, and their buffers freed; the indications keep flowing meanwhile."""
    from xapp.e2.transport import RmrTransport

    fake = FakeRmrLib().install(monkeypatch)
    release = threading.Event()
    got: list[int] = []

    def on_message(m):
        got.append(m.mtype)
        if m.mtype == A1_REQ:
            release.wait(10)

    tr = RmrTransport(rmr_port=4599, use_fake_sdl=True, wait_for_ready=False, control_queue_size=2)
    tr.start(on_message)
    try:
        fake.push(A1_REQ, b"{}", b"", 1)
        assert _wait(lambda: A1_REQ in got, 10)
        for k in range(5):
            fake.push(A1_REQ, b"{}", b"", 2 + k)
        pdu = _indications(1)[0]
        fake.push(RIC_INDICATION, pdu, NODE, 7)
        assert _wait(lambda: RIC_INDICATION in got, 10)   # not held up by the busy control thread
        assert _wait(lambda: tr.receiver.stats["received:control"] == 6, 10)
        st = tr.receiver.stats
        assert st["dropped:control queue full"] == 3 and len(tr.receiver.control) == 2
        release.set()
        assert _wait(lambda: got.count(A1_REQ) == 3, 10)
    finally:
        release.set()
        tr.stop()
    assert fake.live() == 0


def test_indications_wait_while_a_cycle_runs_and_health_checks_do_not(monkeypatch):
    """While ``defer()`` says a decision cycle runs, the loop keeps receiving (a health check is
    answered, the indications are queued) but hands no indication on; once the cycle is over
    they all go, oldest first. With ``defer_max_s`` 0 a cycle that never ends holds nothing
    back (the deferral is bounded)."""
    from xapp.e2.transport import RmrTransport

    pdu = _indications(1)[0]
    for bound in (600.0, 0.0):
        fake = FakeRmrLib().install(monkeypatch)
        cycling = [True]
        got: list[int] = []
        tr = RmrTransport(rmr_port=4599, use_fake_sdl=True, wait_for_ready=False, shed_after_s=600.0,
                          defer_max_s=bound)
        tr.defer = lambda: cycling[0]
        tr.start(lambda m: got.append(m.sub_id))
        try:
            for k in range(10):
                fake.push(RIC_INDICATION, pdu, NODE, k)
            fake.push(HEALTH_REQ, b"ping", b"", -1)
            assert _wait(lambda: tr.receiver.stats["health_answered"] == 1, 10)
            assert _wait(lambda: tr.receiver.stats["received:indication"] == 10, 10)
            if bound:
                assert _wait(lambda: tr.receiver.stats["deferred"] >= 3, 10)
                assert got == [] and len(tr.receiver.indications) == 10    # held back, not lost
                cycling[0] = False
            assert _wait(lambda: len(got) == 10, 10), tr.receiver.stats
        finally:
            tr.stop()
        assert got == list(range(10)) and tr.receiver.stats["shed"] == 0
        assert (HEALTH_RESP, b"OK\n", "rts") in fake.sent and fake.live() == 0


def test_receipt_time_is_the_report_time_in_the_xapp(monkeypatch):
    """Through the whole xApp: the report a RIC_INDICATION makes carries the time the loop
    received it (not the time it was handled), and the E2 and RMR counters are on the registry."""
    from xapp.app import PallasXapp
    from xapp.config import load_config_file
    from xapp.e2.transport import RmrTransport

    fake = FakeRmrLib(virtual_rate=5.0, t0=time.time()).install(monkeypatch)
    cfg = load_config_file(REPO / "descriptors" / "config-file.json")
    reg = CollectorRegistry()
    app = PallasXapp(cfg, RmrTransport(rmr_port=4599, use_fake_sdl=True, wait_for_ready=False, registry=reg,
                                       clock=fake.now), telemetry=False, registry=reg)
    pdus = _indications(1)
    try:
        app.start()
        for k in range(3):
            fake.push(RIC_INDICATION, pdus[0], NODE, k)
        assert _wait(lambda: app.ingest.stats["reports"] == 3, 30)
        track = app.tracks.get("1")
        assert track is not None and track.last_report.time == fake.arrivals[2] == fake.t0 + 3 / 5.0
        fake.push(RIC_INDICATION, b"\x00\x01", NODE, 9)           # malformed: dropped with a reason
        fake.push(30123, b"?", b"", -1)                           # a type the xApp has no handler for
        assert _wait(lambda: reg.get_sample_value("pallas_xapp_unknown_messages_total", {"mtype": "30123"}) == 1)
        assert _wait(lambda: reg.get_sample_value("pallas_e2_indications_total", {"outcome": "dropped"}) == 1)
        assert reg.get_sample_value("pallas_e2_indications_total", {"outcome": "ok"}) == 3
        assert reg.get_sample_value("pallas_e2_reports_total") == 3
        assert reg.get_sample_value("pallas_rmr_received_total", {"kind": "indication"}) == 4
    finally:
        app.stop()
