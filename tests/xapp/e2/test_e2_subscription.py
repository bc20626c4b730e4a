"""E2 subscription JSON (PascalCase, the submgr API's names) posted to a loopback fake submgr."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from xapp.e2.sm_rc import rc_action_definition_message_copy, rc_event_trigger_message_copy
from xapp.e2 import subscription as S


@pytest.fixture
def submgr():
    seen = []

    class H(BaseHTTPRequestHandler):
        def _reply(self, code, body=None):
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(("POST", self.path, body))
            if self.path != "/ric/v1/subscriptions":
                return self._reply(404, {"error": "no such path"})
            if "ClientEndpoint" not in body or "RANFunctionID" not in body:
                return self._reply(400, {"error": "bad params"})
            self._reply(201, {"SubscriptionId": "sub-1", "SubscriptionInstances": [
                {"XappEventInstanceId": 1, "E2EventInstanceId": 42}]})

        def do_DELETE(self):
            seen.append(("DELETE", self.path, None))
            self._reply(204)

        def do_GET(self):
            seen.append(("GET", self.path, None))
            self._reply(200, [{"SubscriptionId": "sub-1"}])

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/ric/v1", seen
    srv.shutdown()
    srv.server_close()


def test_rc_message_copy_subscription_json_is_pascal_case():
    et, actions = S.rc_message_copy_details()
    p = S.subscription_params(host="service-ricxapp-pallas-http.ricxapp", http_port=8080, rmr_port=4560,
                              meid="gnb_001_01_0000a81b", ran_function_id=3, event_trigger=et, actions=actions,
                              e2_timeout_s=2, e2_retry_count=2, rmr_routing_needed=True)
    assert set(p) == {"ClientEndpoint", "Meid", "RANFunctionID", "SubscriptionDetails", "E2SubscriptionDirectives"}
    assert p["ClientEndpoint"] == {"Host": "service-ricxapp-pallas-http.ricxapp", "HTTPPort": 8080, "RMRPort": 4560}
    d = p["SubscriptionDetails"][0]
    assert d["XappEventInstanceId"] == 1 and bytes(d["EventTriggers"]) == rc_event_trigger_message_copy()
    a = d["ActionToBeSetupList"][0]
    assert a == {"ActionID": 1, "ActionType": "report", "ActionDefinition": list(rc_action_definition_message_copy())}
    assert p["E2SubscriptionDirectives"] == {"E2TimeoutTimerValue": 2, "E2RetryCount": 2, "RMRRoutingNeeded": True}
    json.dumps(p)  # plain JSON
    with pytest.raises(ValueError):
        S.subscription_params(host="h", http_port=1, rmr_port=2, meid="m", ran_function_id=4096,
                              event_trigger=et, actions=actions)


def test_subscribe_unsubscribe_list_against_fake_submgr(submgr):
    url, seen = submgr
    et, actions = S.kpm_ue_details(["L1M.SS-RSRP", "L1M.SS-SINR"], period_ms=1000)
    actions = [S.Action(1, actions[0].definition, subsequent_type="continue", time_to_wait="w10ms")]
    c = S.SubmgrClient(url)
    out = c.subscribe(S.subscription_params(host="x", http_port=8080, rmr_port=4560, meid="gnb_001_01_00000001",
                                            ran_function_id=2, event_trigger=et, actions=actions))
    assert out["SubscriptionId"] == "sub-1"
    method, path, body = seen[0]
    assert (method, path) == ("POST", "/ric/v1/subscriptions")
    assert body["RANFunctionID"] == 2 and body["Meid"] == "gnb_001_01_00000001"
    assert body["SubscriptionDetails"][0]["ActionToBeSetupList"][0]["SubsequentAction"] == {
        "SubsequentActionType": "continue", "TimeToWait": "w10ms"}
    c.unsubscribe("sub-1")
    assert seen[1][:2] == ("DELETE", "/ric/v1/subscriptions/sub-1")
    assert c.list() == [{"SubscriptionId": "sub-1"}]


def test_submgr_errors_become_subscription_error(submgr):
    url, _ = submgr
    c = S.SubmgrClient(url.replace("/ric/v1", "/wrong"))
    et, actions = S.rc_message_copy_details()
    with pytest.raises(S.SubscriptionError) as ei:
        c.subscribe(S.subscription_params(host="x", http_port=1, rmr_port=2, meid="m", ran_function_id=3,
                                          event_trigger=et, actions=actions))
    assert ei.value.status == 404
    with pytest.raises(S.SubscriptionError):
        S.SubmgrClient("http://127.0.0.1:9/ric/v1", timeout_s=0.5).list()


def test_the_ledger_is_bounded_whatever_the_notifications_say():
    """Issue 16: the notification endpoint takes unauthenticated input. Unknown subscription ids
    up to the cap are recorded and one more is refused; a subscription keeps its most recent
    instances (the active map follows); failures keep the most recent."""
    from xapp.e2.subscription import SubscriptionLedger

    led = SubscriptionLedger()
    cap = led.MAX_SUBSCRIPTIONS
    for i in range(cap):
        led.notify({"SubscriptionId": f"x{i}", "SubscriptionInstances": []})
    assert len(led.subscriptions) == cap
    with pytest.raises(ValueError, match="the most it keeps"):
        led.notify({"SubscriptionId": "one-more", "SubscriptionInstances": []})
    assert len(led.subscriptions) == cap and "one-more" not in led.subscriptions
    led.notify({"SubscriptionId": "x0", "SubscriptionInstances": []})   # a known one still goes

    n = led.MAX_INSTANCES
    led.notify({"SubscriptionId": "x1", "SubscriptionInstances": [
        {"XappEventInstanceId": 1, "E2EventInstanceId": k} for k in range(n)]})
    assert len(led.subscriptions["x1"]["instances"]) == n and set(range(n)) <= set(led.active)
    led.notify({"SubscriptionId": "x1", "SubscriptionInstances": [
        {"XappEventInstanceId": 1, "E2EventInstanceId": n}]})
    kept = [r["e2_event_instance_id"] for r in led.subscriptions["x1"]["instances"]]
    assert kept == list(range(1, n + 1)) and 0 not in led.active and led.active[n] == "x1"

    f = led.MAX_FAILED
    for k in range(f + 1):
        led.notify({"SubscriptionId": "x2", "SubscriptionInstances": [
            {"XappEventInstanceId": 1, "E2EventInstanceId": 0, "ErrorCause": f"cause {k}"}]})
    assert len(led.failed) == f and led.failed[0]["error_cause"] == "cause 1"
    assert len(led.subscriptions["x2"]["instances"]) == n
