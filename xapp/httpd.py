"""The xApp's HTTP endpoints, as the OSC platform expects them of an xApp.

- ``GET /ric/v1/health/alive``: 200 while the process runs (liveness).
- ``GET /ric/v1/health/ready``: 200 once the xApp has started its transport and control loop,
  503 before (readiness).
- ``GET /ric/v1/metrics``: the Prometheus text exposition of the process's registry (the
  descriptor's ``metrics.url``; E2 ingestion, scheduler and policy counters).
- ``POST /ric/v1/subscriptions/response``: the subscription manager's notification of the E2
  outcome of a subscription (``SubscriptionResponse`` JSON), handed to ``on_subscription_response``;
  200 when taken, 400 for a malformed body (logged; the xApp runs on), 404 without a handler.

Served from a daemon thread on the descriptor's http port (``controls.e2.client_endpoint.http_port``,
8080 by default), so the RIC's probes and Prometheus reach the xApp the way they reach
ric-app-hw-python and its siblings.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest


log = structlog.get_logger("pallas.xapp.httpd")

SUBSCRIPTION_RESPONSE_PATH = "/ric/v1/subscriptions/response"
MAX_BODY = 1 << 20  # bytes; a notification is a few hundred


def serve_http(host: str, port: int, ready: Callable[[], bool],
               registry: CollectorRegistry = REGISTRY,
               on_subscription_response: Callable[[Any], Any] | None = None) -> ThreadingHTTPServer:
    """Start the endpoints on ``host:port`` (port 0 picks a free one) in a daemon thread.

    ``ready()`` answers the readiness probe. ``on_subscription_response(body)`` takes submgr's
    notifications (parsed JSON; a ValueError it raises makes a 400). Returns the server
    (``server_address`` holds the bound port; ``shutdown()`` stops it). Raises OSError if the
    port cannot be bound.
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0].rstrip("/")
            if path == "/ric/v1/health/alive":
                self._reply(200, b"OK\n", "text/plain")
            elif path == "/ric/v1/health/ready":
                ok = bool(ready())
                self._reply(200 if ok else 503, b"OK\n" if ok else b"starting\n", "text/plain")
            elif path == "/ric/v1/metrics":
                self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._reply(404, b"not found\n", "text/plain")

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0].rstrip("/")
            if path != SUBSCRIPTION_RESPONSE_PATH or on_subscription_response is None:
                self._reply(404, b"not found\n", "text/plain")
                return
            try:
                n = int(self.headers.get("Content-Length") or 0)
                if not 0 < n <= MAX_BODY:
                    raise ValueError(f"Content-Length {n} outside 1..{MAX_BODY}")
                on_subscription_response(json.loads(self.rfile.read(n)))
            except ValueError as e:  # json.JSONDecodeError is one too
                log.warning("subscription_notification_dropped", error=str(e))
                self._reply(400, f"{e}\n".encode(), "text/plain")
                return
            except Exception as e:  # noqa: BLE001 - a bad notification never stops the xApp
                log.exception("subscription_notification_failed")
                self._reply(500, f"{e!r}\n".encode(), "text/plain")
                return
            self._reply(200, b"OK\n", "text/plain")

        def _reply(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args) -> None:  # probes every few seconds: no access log
            return

    srv = ThreadingHTTPServer((host, port), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, name="xapp-http", daemon=True).start()
    return srv
