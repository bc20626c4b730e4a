"""The xApp's gRPC links under the descriptor's ``controls.tls`` (issue 16): the composition root
opens its policy and telemetry channels with mutual TLS (pallas_common.tls.LinkSecurity), so the
xApp reaches an agent whose certificate chains to the configured CA and is refused when it
presents a certificate of another CA; plaintext only by an explicit choice."""

from __future__ import annotations

import copy
import json
import queue
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from pallas_eval.localca import LocalCA
from pallas_common.tls import LinkSecurity, TlsError
from pallas_proto import pallas_pb2 as pb
from pallas_proto import pallas_pb2_grpc as pbg

REPO = Path(__file__).resolve().parents[2]


class Agent(pbg.ControlServicer):
    """Records Trigger calls; streams one telemetry report every 20 ms."""

    def __init__(self) -> None:
        self.calls: "queue.Queue[tuple[str, int]]" = queue.Queue()

    def Trigger(self, request, context):
        self.calls.put((request.session_id, int(request.epoch)))
        return pb.ControlReply(status=pb.STATUS_OK, session_id=request.session_id,
                               epoch=request.epoch, state=pb.SESSION_MIGRATING)

    def Telemetry(self, request, context):
        while context.is_active():
            yield pb.TelemetryReport(agent_id="edge-a", time=time.time())
            time.sleep(0.02)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca, other = LocalCA("pallas-ca"), LocalCA("another-ca")
    agent = ca.write(d / "agent", "edge-a")
    xapp = ca.write(d / "xapp", "pallas-xapp")
    rogue = other.write(d / "rogue", "pallas-xapp")
    return {"agent": agent, "xapp": xapp, "rogue": rogue, "ca": xapp.ca}


@pytest.fixture
def tls_agent(pki):
    agent = Agent()
    srv = grpc.server(futures.ThreadPoolExecutor(4))
    pbg.add_ControlServicer_to_server(agent, srv)
    port = LinkSecurity(pki["agent"], check_interval_s=0).add_port(srv, "127.0.0.1:0")
    srv.start()
    yield agent, f"127.0.0.1:{port}"
    srv.stop(0)


def _controls(address: str, tls: dict | None) -> dict:
    c = copy.deepcopy(json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"])
    c["agents"] = {"edge-a": {"e2_node_id": "gnb_001_01_00a81b0c", "control_address": address,
                              "peer_address": "127.0.0.1:1001"}}
    c["cells"] = {"1": "edge-a"}
    if tls is None:
        c.pop("tls", None)
    else:
        c["tls"] = tls
    return c


def _tls(files, ca) -> dict:
    return {"enabled": True, "cert_file": str(files.cert), "key_file": str(files.key),
            "ca_file": str(ca), "check_interval_s": 1.0}


def _app(controls: dict, mode: str = "live", insecure: bool = False):
    from xapp.app import PallasXapp
    from xapp.config import load_controls
    from xapp.main import link_security
    cfg = load_controls(controls)
    return PallasXapp(cfg, transport=None, security=link_security(cfg.controls, mode, insecure))


def test_the_xapps_policy_and_telemetry_reach_an_agent_over_mutual_tls(pki, tls_agent):
    agent, addr = tls_agent
    app = _app(_controls(addr, _tls(pki["xapp"], pki["ca"])))
    reports: list = []
    app.on_telemetry = lambda aid, rep: reports.append((aid, rep.agent_id))
    app.telemetry.on_report = app.on_telemetry
    try:
        out = app.policy.trigger("edge-a", "s1", 7, "edge-a").result(10)
        app.start_telemetry()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not reports:
            time.sleep(0.02)
    finally:
        app.telemetry.stop()
        app.policy.close()
    assert out.ok and (out.reply.session_id, out.reply.epoch) == ("s1", 7)
    assert agent.calls.get_nowait() == ("s1", 7)
    assert reports[0] == ("edge-a", "edge-a")


def test_a_certificate_of_another_ca_is_refused_and_plaintext_never_reaches_a_tls_agent(
        pki, tls_agent):
    agent, addr = tls_agent
    outcomes = []
    for controls, insecure in ((_controls(addr, _tls(pki["rogue"], pki["ca"])), False),
                               (_controls(addr, None), True)):
        app = _app(controls, insecure=insecure)
        app.policy.retries = 0
        try:
            outcomes.append(app.policy.trigger("edge-a", "s1", 7, "edge-a").result(10))
        finally:
            app.policy.close()
    assert [o.reply for o in outcomes] == [None, None]
    assert all("UNAVAILABLE" in o.error for o in outcomes), [o.error for o in outcomes]
    assert agent.calls.empty()


def test_plaintext_only_by_choice_live_mode_needs_tls_or_insecure(pki):
    from xapp.main import link_security, main
    with pytest.raises(TlsError, match="controls.tls missing"):
        link_security({}, "live", False)
    assert link_security({}, "test", False).insecure is True          # test mode: plaintext
    assert link_security({"tls": _tls(pki["xapp"], pki["ca"])}, "test", False).insecure is True
    assert link_security({"tls": _tls(pki["xapp"], pki["ca"])}, "live", True).insecure is True
    assert link_security({"tls": {"enabled": False}}, "live", False).insecure is True
    sec = link_security({"tls": _tls(pki["xapp"], pki["ca"])}, "test", False, use_tls=True)   # --tls
    assert sec.insecure is False and sec.watcher.files.cert == pki["xapp"].cert
    with pytest.raises(TlsError, match="controls.tls missing"):
        link_security({}, "test", False, use_tls=True)
    with pytest.raises(TlsError, match="choose one"):
        link_security({"tls": _tls(pki["xapp"], pki["ca"])}, "test", True, use_tls=True)
    # The shipped descriptor asks for TLS; its files are absent here: a clear refusal to start.
    assert main(["--mode", "live", "--config", str(REPO / "descriptors" / "config-file.json"),
                 "--store", "memory", "--log-level", "ERROR"]) == 2
