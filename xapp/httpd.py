"""The xApp's HTTP endpoints, as the OSC platform expects them of an xApp.

- ``GET /ric/v1/health/alive``: 200 while the process runs (liveness).
- ``GET /ric/v1/health/ready``: 200 once the xApp has started its transport and control loop,
  503 before (readiness).
- ``GET /ric/v1/metrics``: the Prometheus text exposition of the process's registry (the
  descriptor's ``metrics.url``; E2 ingestion, scheduler and policy counters).
- ``POST /ric/v1/subscriptions/response``: the subscription manager's notification of the E2
  outcome of a subscription (``SubscriptionResponse`` JSON), handed to ``on_subscription_response``;
  200 when taken, 400 for a malformed body (logged; the xApp runs on), 413 for a body over
  ``MAX_BODY`` (read and discarded up to ``MAX_DRAIN`` so the client sees the answer rather than a
  reset; a larger claim is answered at once and the connection closed), 408 for a body that does
  not arrive within ``REQUEST_TIMEOUT_S``, 404 without a handler.

A client gets ``REQUEST_TIMEOUT_S`` per read on its connection, so a slow or stalled peer ties up
one handler thread for a bounded time and never the probes (each connection has its own thread).

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
MAX_DRAIN = 4 << 20  # bytes; an over-cap body up to this is read and discarded before the 413
REQUEST_TIMEOUT_S = 10.0  # per socket read of one connection


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
        timeout = REQUEST_TIMEOUT_S  # StreamRequestHandler sets it on the connection's socket

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
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                n = -1
            if n < 0 or n > MAX_DRAIN:
                # No length to trust, or more than is worth reading: answer, then close.
                self.close_connection = True
                code = 413 if n > MAX_DRAIN else 400
                log.warning("http_request_refused", path=path, content_length=n, code=code)
                self._reply(code, f"Content-Length {n} outside 1..{MAX_BODY}\n".encode(),
                            "text/plain")
                return
            if path != SUBSCRIPTION_RESPONSE_PATH or on_subscription_response is None:
                self._drain(n)
                self._reply(404, b"not found\n", "text/plain")
                return
            if not 0 < n <= MAX_BODY:
                self._drain(n)
                log.warning("subscription_notification_dropped", content_length=n,
                            error="body size outside the cap")
                self._reply(413 if n else 400, f"Content-Length {n} outside 1..{MAX_BODY}\n".encode(),
                            "text/plain")
                return
            try:
                body = self.rfile.read(n)
                if len(body) < n:
                    raise TimeoutError(f"body ended after {len(body)} of {n} bytes")
            except OSError as e:  # TimeoutError included: a stalled or vanished client
                self.close_connection = True
                log.warning("subscription_notification_dropped", error=f"body not read: {e}")
                self._reply(408, b"request body not received in time\n", "text/plain")
                return
            try:
                on_subscription_response(json.loads(body))
            except ValueError as e:  # json.JSONDecodeError is one too
                log.warning("subscription_notification_dropped", error=str(e))
                self._reply(400, f"{e}\n".encode(), "text/plain")
                return
            except Exception as e:  # noqa: BLE001 - a bad notification never stops the xApp
                log.exception("subscription_notification_failed")
                self._reply(500, f"{e!r}\n".encode(), "text/plain")
                return
            self._reply(200, b"OK\n", "text/plain")

        def _drain(self, n: int) -> None:
            """Read and discard ``n`` body bytes (n <= MAX_DRAIN) so the reply is not lost to a reset."""
            try:
                while n > 0:
                    chunk = self.rfile.read(min(n, 1 << 16))
                    if not chunk:
                        break
                    n -= len(chunk)
            except OSError:  # the client stalled or went away: answer if it can still hear
                pass
            if n > 0:
                self.close_connection = True

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
