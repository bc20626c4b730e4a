import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from xapp.httpd import serve_http


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
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
