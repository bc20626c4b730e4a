"""The xApp's live mode with RMR stubbed (docs/osc.md §1.2).

RIC_INDICATION messages delivered through the xApp's RMR receive loop (xapp.e2.rmrloop over
ricxappframe's RMR wrappers; only the C library is faked, tests/xapp/fake_rmr.py) make the xApp subscribe to
the E2 nodes through a loopback fake subscription manager, predict the handover, and send the
trigger and then the commit to a test agent (a fake Control gRPC servicer on loopback, which
also streams the telemetry the window decision needs), exactly as the replay does.
"""

from __future__ import annotations

import copy
import json
import queue
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest

from pallas_proto import pallas_pb2 as pb
from pallas_proto import pallas_pb2_grpc as pbg

from fake_rmr import FakeRmrLib
from policy_fakes import OrdersByKind

REPO = Path(__file__).resolve().parents[2]
# The xApp's parts (issues 3, 4, 7) this test wires together; until they are on the branch
# there is nothing to compose.
for _mod in ("xapp.e2.transport", "xapp.scheduler", "xapp.predict"):
    pytest.importorskip(_mod)
CELL_A, CELL_B = 0xA81B0C01, 0xA81C0D01        # 36-bit NR cell identities (gNB 0xA81B0C, 0xA81C0D)
PCI_A, PCI_B = 101, 202
UE = 7


class FakeAgent(pbg.ControlServicer):
    """A test agent: records Control calls, streams telemetry with one session of the UE."""

    def __init__(self, agent_id: str, serves_session: bool) -> None:
        self.agent_id = agent_id
        self.serves = serves_session
        self.calls: "queue.Queue[tuple[str, object]]" = queue.Queue()

    def _reply(self, req, state):
        return pb.ControlReply(status=pb.STATUS_OK, session_id=req.session_id, epoch=req.epoch,
                               state=pb.SessionState.Value("SESSION_" + state.upper()),
                               scheme=pb.SCHEME_PALLAS)

    def Trigger(self, request, context):
        self.calls.put(("Trigger", request))
        return self._reply(request, "migrating")

    def Cancel(self, request, context):
        self.calls.put(("Cancel", request))
        return self._reply(request, "serving")

    def Commit(self, request, context):
        self.calls.put(("Commit", request))
        rep = self._reply(request, "handed_over")
        rep.blocks_moved, rep.kv_bytes_moved, rep.reused_tokens, rep.recomputed_tokens = 4, 65536, 470, 10
        return rep

    def Telemetry(self, request, context):
        while context.is_active():
            rep = pb.TelemetryReport(agent_id=self.agent_id, time=time.time())
            rep.server.model.CopyFrom(pb.ModelIdentity(model="tiny", block_size=32, kv_bytes_per_token=16384))
            rep.server.prefill_rate = 5000.0
            rep.server.free_kv_blocks = 10000
            if self.serves:
                rep.sessions.add(session_id="sess-1", ue_id=str(UE), tokens=480, decode_rate=50.0,
                                 state="serving", remaining_tokens=200)
            yield rep
            time.sleep(0.05)


class FakeSubmgr(BaseHTTPRequestHandler):
    posts: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        FakeSubmgr.posts.append((self.path, body))
        out = json.dumps({"SubscriptionId": f"sub-{len(FakeSubmgr.posts)}", "SubscriptionInstances": []}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_DELETE(self):  # noqa: N802
        FakeSubmgr.posts.append((self.path, None))
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def _grpc_agent(agent: FakeAgent) -> tuple[grpc.Server, int]:
    srv = grpc.server(futures.ThreadPoolExecutor(8))
    pbg.add_ControlServicer_to_server(agent, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    return srv, port


def _indication(serving_cell: int, serving_pci: int, rsrp: float, nb_pci: int, nb_rsrp: float, sn: int,
                ue: int = UE) -> bytes:
    from pallas_tools.tracegen import encode_rc_message_copy, encode_ric_indication, encode_rrc_meas_report
    from xapp.e2.e2ap import RicIndication
    from xapp.e2.ie import Cgi, Guami, UeId
    from xapp.e2.rrc import CellResult, RrcMeasReport, ServingResult
    from xapp.e2.sm_rc import RcMessageCopy
    u = UeId(kind="gNB", amf_ue_ngap_id=ue, guami=Guami(plmn="00101"))
    r = RrcMeasReport(1, (ServingResult(0, CellResult(serving_pci, rsrp, -10.0, 10.0)),),
                      (CellResult(nb_pci, nb_rsrp, -10.0, 5.0),))
    h, m = encode_rc_message_copy(RcMessageCopy(encode_rrc_meas_report(r), u, Cgi("00101", serving_cell)))
    return encode_ric_indication(RicIndication(1, 1, 3, 1, h, m, sn=sn))


@pytest.fixture
def rmr_stub(monkeypatch):
    """ricxappframe importable and runnable without librmr_si.so: RMR's C primitives stubbed
    under ricxappframe's own wrappers (tests/xapp/fake_rmr.py); returns the fake library, whose
    ``push`` is a message arriving at RMR."""
    return FakeRmrLib().install(monkeypatch)


def test_live_mode_subscribes_predicts_triggers_and_commits(rmr_stub, tmp_path):
    from xapp.app import EventLog, PallasXapp
    from xapp.config import load_controls
    from xapp.e2.subscription import SubmgrClient, SubscriptionLedger, SubscriptionManager
    from xapp.e2.transport import RIC_INDICATION, RmrTransport

    a, b = FakeAgent("edge-a", True), FakeAgent("edge-b", False)
    (sa, pa), (sb, pb_) = _grpc_agent(a), _grpc_agent(b)
    http = ThreadingHTTPServer(("127.0.0.1", 0), FakeSubmgr)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    FakeSubmgr.posts = []
    controls = copy.deepcopy(json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"])
    controls["scheme"] = "pallas"
    controls["agents"] = {
        "edge-a": {"e2_node_id": "gnb_001_01_00a81b0c", "control_address": f"127.0.0.1:{pa}",
                   "peer_address": "127.0.0.1:1001"},
        "edge-b": {"e2_node_id": "gnb_001_01_00a81c0d", "control_address": f"127.0.0.1:{pb_}",
                   "peer_address": "127.0.0.1:1002"}}
    controls["cells"] = {str(CELL_A): "edge-a", str(CELL_B): "edge-b"}
    controls["e2"]["submgr_url"] = f"http://127.0.0.1:{http.server_port}/ric/v1"
    cfg = load_controls(controls)
    events = EventLog(tmp_path / "events.jsonl")
    ledger = SubscriptionLedger()
    subscriptions = SubscriptionManager(SubmgrClient(cfg.e2.submgr_url), ledger)
    app = PallasXapp(cfg, RmrTransport(rmr_port=4599, use_fake_sdl=True, wait_for_ready=False),
                     nrt={PCI_A: CELL_A, PCI_B: CELL_B}, events=events, subscriptions=subscriptions)
    try:
        app.start()
        subs = list(subscriptions.answers)
        held = dict(ledger.subscriptions)
        # The UE drives from A towards B: serving RSRP falls, B's rises (8 dB/s closing), one
        # report every 200 ms, delivered through RMR; then the first report from cell B.
        t0 = time.time()
        k = 0
        while time.time() - t0 < 6.0:
            dt = time.time() - t0
            if dt < 4.0:
                msg = _indication(CELL_A, PCI_A, -80.0 - 4.0 * dt, PCI_B, -100.0 + 4.0 * dt, k)
            else:
                msg = _indication(CELL_B, PCI_B, -80.0, PCI_A, -100.0, k)
            rmr_stub.push(RIC_INDICATION, msg, b"gnb_001_01_00a81b0c", 1)
            k += 1
            if dt >= 4.0:
                break
            time.sleep(0.2)
        calls = []
        deadline = time.time() + 5
        while time.time() < deadline and not any(c[0] == "Commit" for c in calls):
            try:
                calls.append(a.calls.get(timeout=0.2))
            except queue.Empty:
                pass
        while time.time() < deadline and not any(e["kind"] == "reply" and e["call"] == "commit"
                                                 for e in list(events.events)):
            time.sleep(0.05)
    finally:
        app.stop()
        sa.stop(0)
        sb.stop(0)
        http.shutdown()
    # Subscribed at both E2 nodes, with submgr's PascalCase body, on the right path; both
    # deleted at stop (what SIGTERM runs).
    posts = [(p, body) for p, body in FakeSubmgr.posts if body is not None]
    assert [p for p, _ in posts] == ["/ric/v1/subscriptions"] * 2
    assert {body["Meid"] for _, body in posts} == {"gnb_001_01_00a81b0c", "gnb_001_01_00a81c0d"}
    assert all(body["RANFunctionID"] == 3 and body["ClientEndpoint"]["RMRPort"] == 4560 for _, body in posts)
    assert len(subs) == 2
    assert {v["meid"] for v in held.values()} == {"gnb_001_01_00a81b0c", "gnb_001_01_00a81c0d"}
    assert set(held) == {a["SubscriptionId"] for a in subs}
    assert sorted(p for p, body in FakeSubmgr.posts if body is None) == \
        sorted(f"/ric/v1/subscriptions/{a['SubscriptionId']}" for a in subs)
    kinds = [c[0] for c in calls]
    assert "Trigger" in kinds and kinds[-1] == "Commit", kinds
    trig = next(r for k_, r in calls if k_ == "Trigger")
    commit = next(r for k_, r in calls if k_ == "Commit")
    assert trig.session_id == commit.session_id == "sess-1"
    assert trig.target.agent_id == "edge-b" and trig.target.address == "127.0.0.1:1002"
    assert trig.scheme == pb.SCHEME_PALLAS and trig.window_s >= 0.0
    assert trig.predicted_handover_time > t0
    assert commit.actual_target.agent_id == "edge-b" and commit.epoch == trig.epoch
    assert b.calls.empty()   # the target is reached through the source, never called by the xApp
    ev = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "prediction" and e["target_cell"] == CELL_B for e in ev)
    commit_ev = next(e for e in ev if e["kind"] == "commit")
    assert commit_ev["prepared"] is True and commit_ev["from_cell"] == CELL_A and commit_ev["to_cell"] == CELL_B
    # The commit's reply, with what the handover moved, is in the event log for the evaluation.
    rep_ev = next(e for e in ev if e["kind"] == "reply" and e["call"] == "commit")
    assert (rep_ev["blocks_moved"], rep_ev["kv_bytes_moved"], rep_ev["reused_tokens"],
            rep_ev["recomputed_tokens"]) == (4, 65536, 470, 10)
    assert app.ingest.stats["reports"] == k


class _RecordingPolicy(OrdersByKind):
    """Stands in for xapp.policy.PolicyClient: records the orders instead of sending them."""

    def __init__(self) -> None:
        self.agents: dict = {}
        self.on_reply = None
        self.calls: list = []

    def trigger(self, source, session, epoch, target, **kw):
        self.calls.append(("Trigger", source, session, epoch, target))

    def cancel(self, source, session, epoch, reason=""):
        self.calls.append(("Cancel", source, session, epoch, None))

    def commit(self, source, session, epoch, target, **kw):
        self.calls.append(("Commit", source, session, epoch, target))

    def close(self) -> None:
        pass


def test_handover_before_the_session_shows_in_telemetry_is_committed_when_it_does(tmp_path):
    """A UE opens a session just before its handover: the first telemetry report naming the
    session arrives after the handover; the xApp commits it then (by the fallback)."""
    from xapp.app import EventLog, PallasXapp
    from xapp.config import load_controls

    controls = copy.deepcopy(json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"])
    controls["scheme"] = "pallas"
    controls["agents"] = {
        "edge-a": {"e2_node_id": "gnb_001_01_00a81b0c", "control_address": "127.0.0.1:1",
                   "peer_address": "127.0.0.1:1001"},
        "edge-b": {"e2_node_id": "gnb_001_01_00a81c0d", "control_address": "127.0.0.1:2",
                   "peer_address": "127.0.0.1:1002"}}
    controls["cells"] = {str(CELL_A): "edge-a", str(CELL_B): "edge-b"}
    policy = _RecordingPolicy()
    app = PallasXapp(load_controls(controls), transport=None, policy=policy, telemetry=False,
                     events=EventLog(None), offset=time.time() - 1000.0)
    app.on_indication(_indication(CELL_A, PCI_A, -80.0, PCI_B, -90.0, 0), "gnb_001_01_00a81b0c", 1000.0)
    app.on_indication(_indication(CELL_B, PCI_B, -80.0, PCI_A, -90.0, 1), "gnb_001_01_00a81c0d", 1000.2)
    assert policy.calls == []            # no session known yet: nothing to commit
    rep = pb.TelemetryReport(agent_id="edge-a", time=time.time())
    rep.server.model.CopyFrom(pb.ModelIdentity(model="tiny", block_size=32, kv_bytes_per_token=16384))
    rep.server.prefill_rate, rep.server.free_kv_blocks = 5000.0, 10000
    rep.sessions.add(session_id="sess-9", ue_id=str(UE), tokens=300, decode_rate=40.0, state="serving",
                     remaining_tokens=100)
    app._on_telemetry("edge-a", rep)
    assert [(c[0], c[1], c[2], c[4]) for c in policy.calls] == [("Commit", "edge-a", "sess-9", "edge-b")]
    kinds = [e["kind"] for e in app.events.events]
    assert kinds.index("commit_skipped") < kinds.index("late_session") < kinds.index("commit")
    # The same telemetry again commits nothing more.
    app._on_telemetry("edge-a", rep)
    assert len(policy.calls) == 1
