import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from xapp.httpd import serve_http


def _get(url, body: bytes | None = None):
    """GET ``url`` (POST ``body`` as JSON when given); returns (status, text)."""
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_probes_and_metrics():
    reg = CollectorRegistry()
    Counter("pallas_test_events", "events", registry=reg).inc(3)
    ready = {"v": False}
    srv = serve_http("127.0.0.1", 0, lambda: ready["v"], registry=reg)
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        assert _get(base + "/ric/v1/health/alive")[0] == 200
        assert _get(base + "/ric/v1/health/ready")[0] == 503
        ready["v"] = True
        assert _get(base + "/ric/v1/health/ready")[0] == 200
        code, body = _get(base + "/ric/v1/metrics")
        assert code == 200 and "pallas_test_events_total 3.0" in body
        assert _get(base + "/nope")[0] == 404
    finally:
        srv.shutdown()


def test_submgr_notifications_are_recorded_and_bad_ones_refused():
    import json

    from xapp.e2.subscription import SubscriptionLedger

    ledger = SubscriptionLedger()
    ledger.requested({"SubscriptionId": "sub-1"}, "gnb_001_01_00a81b0c", 3)
    ledger.requested({"SubscriptionId": "sub-2"}, "gnb_001_01_00a81c0d", 3)
    srv = serve_http("127.0.0.1", 0, lambda: True, on_subscription_response=ledger.notify)
    url = f"http://127.0.0.1:{srv.server_address[1]}/ric/v1/subscriptions/response"
    try:
        ok = {"SubscriptionId": "sub-1",
              "SubscriptionInstances": [{"XappEventInstanceId": 1, "E2EventInstanceId": 77}]}
        failed = {"SubscriptionId": "sub-2", "SubscriptionInstances": [
            {"XappEventInstanceId": 1, "E2EventInstanceId": 0, "ErrorCause": "ranFunctionIdInvalid",
             "ErrorSource": "E2Node"}]}
        assert _get(url, json.dumps(ok).encode())[0] == 200
        assert _get(url, json.dumps(failed).encode())[0] == 200
        for bad in (b"{not json", b"[]", json.dumps({"SubscriptionId": "x"}).encode(),
                    json.dumps({"SubscriptionId": "x", "SubscriptionInstances": [
                        {"XappEventInstanceId": 1, "E2EventInstanceId": 70000}]}).encode(),
                    json.dumps({"SubscriptionId": "x", "SubscriptionInstances": [
                        {"XappEventInstanceId": "1", "E2EventInstanceId": 3}]}).encode(),
                    json.dumps({"SubscriptionId": "x", "SubscriptionInstances": [
                        {"XappEventInstanceId": 1, "E2EventInstanceId": 3,
                         "ErrorSource": "somewhere"}]}).encode()):
            code, text = _get(url, bad)
            assert code == 400, (bad, code, text)
        assert _get(url.replace("/response", "/other"), b"{}")[0] == 404
        assert _get(url.rsplit("/ric", 1)[0] + "/ric/v1/health/alive")[0] == 200  # still serving
    finally:
        srv.shutdown()
    assert ledger.active == {77: "sub-1"}
    assert [(f["subscription_id"], f["error_cause"], f["error_source"]) for f in ledger.failed] == [
        ("sub-2", "ranFunctionIdInvalid", "E2Node")]
    assert "x" not in ledger.subscriptions  # nothing of a refused notification was kept


def test_no_handler_no_notification_endpoint():
    srv = serve_http("127.0.0.1", 0, lambda: True)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/ric/v1/subscriptions/response"
        assert _get(url, b"{}")[0] == 404
    finally:
        srv.shutdown()


def test_a_notification_body_at_the_cap_is_read_and_one_byte_more_refused():
    from xapp.httpd import MAX_BODY

    got = []
    srv = serve_http("127.0.0.1", 0, lambda: True, on_subscription_response=got.append)
    url = f"http://127.0.0.1:{srv.server_address[1]}/ric/v1/subscriptions/response"
    body = b'{"SubscriptionId": "sub-1"}'
    at_cap = body[:-1] + b" " * (MAX_BODY - len(body)) + b"}"
    try:
        codes = [_get(url, at_cap)[0], _get(url, at_cap + b" ")]
    finally:
        srv.shutdown()
    assert len(at_cap) == MAX_BODY
    assert codes[0] == 200 and got == [{"SubscriptionId": "sub-1"}]
    assert codes[1][0] == 400 and f"outside 1..{MAX_BODY}" in codes[1][1]
