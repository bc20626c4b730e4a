"""A stand-in for OSC's subscription manager (submgr) and the routes rtmgr derives from it, for
``benchmarks/rmr_load.py --replicas N`` (issue 46, docs/scale-out.md).

What it keeps of the real one (ric-plt-submgr's REST API, ``api/xapp_rest_api.yaml`` of
ric-plt-xapp-frame-py; its routes as rtmgr pushes them to the E2 termination):

- ``POST /ric/v1/subscriptions`` with a ``SubscriptionParams`` body (``Meid``,
  ``RANFunctionID``, ``ClientEndpoint`` {``Host``, ``HTTPPort``, ``RMRPort``},
  ``SubscriptionDetails``) answers 201 ``{"SubscriptionId", "SubscriptionInstances": []}`` and
  then POSTs the E2 outcome (``E2EventInstanceId``: the RMR sub id of the indications) to the
  client's ``/ric/v1/subscriptions/response``, as submgr does once the E2 node answered;
- identical subscriptions (same E2 node, RAN function and details) from two clients are merged
  into one E2 instance with both endpoints, as submgr merges them;
- ``DELETE /ric/v1/subscriptions/{id}`` removes the client's endpoint (the E2 instance with its
  last one); ``GET /ric/v1/subscriptions`` lists them;
- :func:`route_table` writes what rtmgr derives: one ``mse|12050|<E2 instance id>|host:port``
  entry per subscription, so each subscription's indications go to the client that made it
  (a merged one's to each of its clients, ``;``-separated groups).

There is no E2 node behind it: every subscription succeeds at once. Everything but the HTTP
server is pure (:class:`Ledger`, :func:`route_table`, :func:`routes_by_node`) and tested
without RMR (``tests/xapp/test_fake_submgr.py``).
"""

from __future__ import annotations

import json
import threading
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable

RIC_INDICATION = 12050

__all__ = ["E2Instance", "FakeSubmgr", "Ledger", "route_table", "routes_by_node"]


@dataclass
class E2Instance:
    """One E2 subscription at an E2 node: its E2 instance id (the indications' RMR sub id,
    1..65535), the node (``Meid``), the RAN function, the details' JSON (what merging compares)
    and the clients' RMR endpoints by SubscriptionId ({id: "host:port"})."""

    instance_id: int
    meid: str
    ran_function: int
    details: str
    clients: dict[str, str] = field(default_factory=dict)


class Ledger:
    """submgr's subscriptions, pure and thread-safe. :meth:`subscribe` takes a
    ``SubscriptionParams`` dict and returns (SubscriptionId, E2 instance id); a body without
    ``Meid``, ``RANFunctionID``, ``ClientEndpoint.Host``/``RMRPort`` or
    ``SubscriptionDetails`` raises ValueError (HTTP 400), nothing recorded. :meth:`delete`
    returns False for an unknown SubscriptionId (HTTP 404)."""

    MAX_INSTANCE = 65535

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.instances: dict[int, E2Instance] = {}
        self._by_sub: dict[str, int] = {}
        self._next_sub = 0
        self._next_inst = 0
        self.changes = 0                      # subscriptions made or deleted, ever

    def subscribe(self, params: Any) -> tuple[str, int]:
        try:
            meid = str(params["Meid"])
            rf = int(params["RANFunctionID"])
            ep = params["ClientEndpoint"]
            endpoint = f"{ep['Host']}:{int(ep['RMRPort'])}"
            details = json.dumps(params["SubscriptionDetails"], sort_keys=True)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"SubscriptionParams: {type(e).__name__} {e}") from None
        if not meid:
            raise ValueError("SubscriptionParams: empty Meid")
        with self._lock:
            inst = next((i for i in self.instances.values()
                         if (i.meid, i.ran_function, i.details) == (meid, rf, details)), None)
            if inst is None:                  # a new E2 subscription; else merged into inst
                if len(self.instances) >= self.MAX_INSTANCE:
                    raise ValueError("no E2 instance id left")
                while True:
                    self._next_inst = self._next_inst % self.MAX_INSTANCE + 1
                    if self._next_inst not in self.instances:
                        break
                inst = self.instances[self._next_inst] = E2Instance(self._next_inst, meid, rf, details)
            self._next_sub += 1
            sid = f"fake-submgr-{self._next_sub}"
            inst.clients[sid] = endpoint
            self._by_sub[sid] = inst.instance_id
            self.changes += 1
            return sid, inst.instance_id

    def delete(self, subscription_id: str) -> bool:
        with self._lock:
            k = self._by_sub.pop(subscription_id, None)
            if k is None:
                return False
            inst = self.instances[k]
            del inst.clients[subscription_id]
            if not inst.clients:
                del self.instances[k]
            self.changes += 1
            return True

    def snapshot(self) -> list[E2Instance]:
        """A copy of the E2 instances, by instance id."""
        with self._lock:
            return [E2Instance(i.instance_id, i.meid, i.ran_function, i.details, dict(i.clients))
                    for _, i in sorted(self.instances.items())]


def route_table(instances: Iterable[E2Instance], static: Iterable[str] = ()) -> str:
    """The RMR route table (``RMR_SEED_RT`` format) of the E2 termination: ``static`` entries
    (``mse|<mtype>|<subid>|<endpoints>`` lines, written as given) and, per E2 instance,
    ``mse|12050|<instance id>|<endpoint>``; a merged instance's endpoints as ``;``-separated
    groups (each gets a copy; OSC's rtmgr keeps one entry per message type and sub id).
    An instance with no client is left out."""
    lines = ["newrt|start", *static]
    for i in sorted(instances, key=lambda i: i.instance_id):
        eps = sorted(set(i.clients.values()))
        if eps:
            lines.append(f"mse|{RIC_INDICATION}|{i.instance_id}|{';'.join(eps)}")
    lines.append("newrt|end")
    return "\n".join(lines) + "\n"


def routes_by_node(instances: Iterable[E2Instance]) -> dict[str, tuple[int, tuple[str, ...]]]:
    """{E2 node (MEID): (E2 instance id, its clients' endpoints sorted)}: what the E2
    termination sends a node's indications with. Raises ValueError when a node has several
    instances (several RAN functions or details: the benchmark sends one kind per node)."""
    out: dict[str, tuple[int, tuple[str, ...]]] = {}
    for i in instances:
        if i.meid in out:
            raise ValueError(f"E2 node {i.meid} has several subscriptions "
                             f"({out[i.meid][0]}, {i.instance_id})")
        out[i.meid] = (i.instance_id, tuple(sorted(set(i.clients.values()))))
    return out


class FakeSubmgr:
    """The HTTP server over a :class:`Ledger` on ``127.0.0.1:port`` (0: a free one; ``url``
    is the base the xApp's ``controls.e2.submgr_url`` takes). ``notify``: POST the E2
    outcome to the client's ``/ric/v1/subscriptions/response`` after each subscription
    (failures counted in ``notify_failures``). :meth:`close` stops it."""

    def __init__(self, port: int = 0, notify: bool = True) -> None:
        self.ledger = Ledger()
        self.notify_failures = 0
        ledger, me = self.ledger, self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:   # quiet
                pass

            def _reply(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                if self.path.rstrip("/") != "/ric/v1/subscriptions":
                    return self._reply(404, {"error": "not found"})
                try:
                    params = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    sid, inst = ledger.subscribe(params)
                except ValueError as e:
                    return self._reply(400, {"error": str(e)})
                self._reply(201, {"SubscriptionId": sid, "SubscriptionInstances": []})
                if notify:
                    ep = params["ClientEndpoint"]
                    threading.Thread(target=me._notify, daemon=True, args=(
                        f"http://{ep['Host']}:{int(ep.get('HTTPPort', 8080))}/ric/v1/subscriptions/response",
                        sid, inst, params)).start()

            def do_DELETE(self) -> None:  # noqa: N802
                prefix = "/ric/v1/subscriptions/"
                if not self.path.startswith(prefix):
                    return self._reply(404, {"error": "not found"})
                if ledger.delete(self.path[len(prefix):]):
                    self.send_response(204)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._reply(404, {"error": "unknown subscription"})

            def do_GET(self) -> None:  # noqa: N802
                if self.path.rstrip("/") != "/ric/v1/subscriptions":
                    return self._reply(404, {"error": "not found"})
                self._reply(200, [{"SubscriptionId": s, "Meid": i.meid, "ClientEndpoint": [ep],
                                   "E2EventInstanceId": i.instance_id}
                                  for i in ledger.snapshot() for s, ep in i.clients.items()])

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/ric/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, name="fake-submgr", daemon=True)
        self._thread.start()

    def _notify(self, url: str, sid: str, inst: int, params: dict) -> None:
        x = [d.get("XappEventInstanceId", 1) for d in params.get("SubscriptionDetails", [])] or [1]
        body = json.dumps({"SubscriptionId": sid, "SubscriptionInstances": [
            {"XappEventInstanceId": int(v), "E2EventInstanceId": inst} for v in x]}).encode()
        try:
            req = urllib.request.Request(url, body, {"Content-Type": "application/json"}, method="POST")
            urllib.request.urlopen(req, timeout=5).read()
        except Exception:  # noqa: BLE001 - the client's endpoint not up: counted
            self.notify_failures += 1

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
