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
    assert codes[1][0] == 413 and f"outside 1..{MAX_BODY}" in codes[1][1]


def _raw(port: int, head: bytes, body: bytes = b"", timeout: float = 5.0) -> bytes:
    """Send ``head`` (and ``body``) on a fresh connection; return all the server sent back."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_a_claimed_body_too_large_to_read_is_answered_at_once_and_the_connection_closed():
    from xapp.httpd import MAX_DRAIN

    srv = serve_http("127.0.0.1", 0, lambda: True, on_subscription_response=lambda b: None)
    port = srv.server_address[1]
    try:
        head = (b"POST /ric/v1/subscriptions/response HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: %d\r\n\r\n" % (MAX_DRAIN + 1))
        reply = _raw(port, head, b"{}")  # returns once the server closes: nothing waits for the body
        bad = _raw(port, b"POST /ric/v1/subscriptions/response HTTP/1.1\r\nHost: x\r\n"
                   b"Content-Length: -5\r\n\r\n")
        assert _get(f"http://127.0.0.1:{port}/ric/v1/health/alive")[0] == 200
    finally:
        srv.shutdown()
    assert reply.startswith(b"HTTP/1.0 413") or reply.startswith(b"HTTP/1.1 413"), reply[:80]
    assert bad.split(b" ", 2)[1] == b"400", bad[:80]


def test_a_stalled_client_is_cut_off_after_the_read_timeout_while_probes_are_answered(monkeypatch):
    import time

    import xapp.httpd as httpd

    monkeypatch.setattr(httpd, "REQUEST_TIMEOUT_S", 0.5)
    srv = serve_http("127.0.0.1", 0, lambda: True, on_subscription_response=lambda b: None)
    port = srv.server_address[1]
    try:
        import socket

        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /ric/v1/subscriptions/response HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: 100\r\n\r\n{")  # 99 bytes never come
            t0 = time.monotonic()
            assert _get(f"http://127.0.0.1:{port}/ric/v1/health/alive")[0] == 200
            probe_s = time.monotonic() - t0
            rest = s.recv(65536)  # the server gives up on the body and closes
            cut_s = time.monotonic() - t0
    finally:
        srv.shutdown()
    assert probe_s < 0.5, probe_s
    assert cut_s < 4.0 and rest.split(b" ", 2)[1] == b"408", (cut_s, rest[:80])
