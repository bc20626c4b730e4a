"""E2 subscriptions through the OSC subscription manager's REST API (submgr).

The xApp builds the ``SubscriptionParams`` JSON itself with the API's PascalCase names
(ric-plt-xapp-frame-py ``api/xapp_rest_api.yaml``) and POSTs it to
``<submgr>/ric/v1/subscriptions``. ricxappframe 3.2.2's ``NewSubscriber.Subscribe`` posts to
the wrong path (without ``/subscriptions``) and with snake_case keys, so it is not used.

Body of ``POST /ric/v1/subscriptions``::

    {"SubscriptionId": "" (optional),
     "ClientEndpoint": {"Host": str, "HTTPPort": int, "RMRPort": int},
     "Meid": <E2 node name>, "RANFunctionID": 0..4095,
     "E2SubscriptionDirectives": {"E2TimeoutTimerValue": s, "E2RetryCount": n,
                                  "RMRRoutingNeeded": bool} (optional),
     "SubscriptionDetails": [{"XappEventInstanceId": int, "EventTriggers": [octet values],
        "ActionToBeSetupList": [{"ActionID": 0..255, "ActionType": "report"|"insert"|"policy",
            "ActionDefinition": [octet values],
            "SubsequentAction": {"SubsequentActionType": "continue"|"wait",
                                 "TimeToWait": "zero"|"w1ms"|...} (optional)}]}]}

The response (201) is ``{"SubscriptionId": str, "SubscriptionInstances": [...]}``; submgr
then POSTs the E2 outcome to the xApp's ``/ric/v1/subscriptions/response`` and the
indications arrive over RMR (12050) with the RMR sub id = the E2 instance id.

The lifecycle (:class:`SubscriptionManager`): the subscriptions wanted are one per E2 node of
the configured agents and E2SM-RC RAN function; :meth:`SubscriptionManager.sync` adds the new
ones and deletes (``DELETE /ric/v1/subscriptions/{id}``) those no longer wanted after a reload;
a failed one is retried with exponential backoff; :meth:`SubscriptionManager.delete_all`
removes them all at shutdown (SIGTERM), so submgr and the E2 nodes stop sending.

The E2SM payloads come from :mod:`.sm_rc` and :mod:`.sm_kpm`: E2SM-RC REPORT Style 1 on NR UL-DCCH
MeasurementReport (:func:`rc_message_copy_details`) and E2SM-KPM REPORT Style 4 UE-level
measurements (:func:`kpm_ue_details`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping, Sequence

import structlog
from prometheus_client import Counter

from . import ie, sm_kpm, sm_rc

log = structlog.get_logger("xapp.e2.subscription")

SUBMGR_URL = "http://service-ricplt-submgr-http.ricplt:8088/ric/v1"
TIME_TO_WAIT = ("zero", "w1ms", "w2ms", "w5ms", "w10ms", "w20ms", "w30ms", "w40ms", "w50ms",
                "w100ms", "w200ms", "w500ms", "w1s", "w2s", "w5s", "w10s", "w20s", "w60s")


class SubscriptionError(RuntimeError):
    """submgr refused or could not be reached; ``status`` is the HTTP status (0 if none)."""

    def __init__(self, msg: str, status: int = 0) -> None:
        super().__init__(msg)
        self.status = status


@dataclass(frozen=True)
class Action:
    """One RIC action to set up: id 0..255, type, E2SM action definition octets, and an optional
    subsequent action (type 'continue'|'wait', time to wait one of :data:`TIME_TO_WAIT`)."""

    action_id: int
    definition: bytes
    action_type: str = "report"
    subsequent_type: str | None = None
    time_to_wait: str = "zero"

    def to_json(self) -> dict:
        """The subscription manager's ActionToBeSetup JSON (ActionID, ActionType,
        ActionDefinition, SubsequentAction). Raises ValueError for an id outside 0..255 or an
        unknown action, subsequent-action or time-to-wait name."""
        if not 0 <= self.action_id <= 255:
            raise ValueError("ActionID must be 0..255")
        if self.action_type not in ("report", "insert", "policy"):
            raise ValueError(f"ActionType {self.action_type!r}")
        d: dict[str, Any] = {"ActionID": self.action_id, "ActionType": self.action_type,
                             "ActionDefinition": list(self.definition)}
        if self.subsequent_type is not None:
            if self.subsequent_type not in ("continue", "wait") or self.time_to_wait not in TIME_TO_WAIT:
                raise ValueError("SubsequentAction type/time to wait")
            d["SubsequentAction"] = {"SubsequentActionType": self.subsequent_type,
                                     "TimeToWait": self.time_to_wait}
        return d


def subscription_params(*, host: str, http_port: int, rmr_port: int, meid: str, ran_function_id: int,
                        event_trigger: bytes, actions: Sequence[Action], xapp_event_instance_id: int = 1,
                        subscription_id: str | None = None, e2_timeout_s: int | None = None,
                        e2_retry_count: int | None = None, rmr_routing_needed: bool | None = None) -> dict:
    """The ``SubscriptionParams`` JSON object (PascalCase, as submgr's API names them)."""
    if not 0 <= ran_function_id <= 4095:
        raise ValueError("RANFunctionID must be 0..4095")
    if not actions:
        raise ValueError("at least one action")
    p: dict[str, Any] = {
        "ClientEndpoint": {"Host": host, "HTTPPort": http_port, "RMRPort": rmr_port},
        "Meid": meid,
        "RANFunctionID": ran_function_id,
        "SubscriptionDetails": [{
            "XappEventInstanceId": xapp_event_instance_id,
            "EventTriggers": list(event_trigger),
            "ActionToBeSetupList": [a.to_json() for a in actions],
        }],
    }
    if subscription_id is not None:
        p["SubscriptionId"] = subscription_id
    directives = {k: v for k, v in (("E2TimeoutTimerValue", e2_timeout_s), ("E2RetryCount", e2_retry_count),
                                    ("RMRRoutingNeeded", rmr_routing_needed)) if v is not None}
    if directives:
        p["E2SubscriptionDirectives"] = directives
    return p


def rc_message_copy_details(action_id: int = 1, condition_id: int = 1) -> tuple[bytes, list[Action]]:
    """(event trigger, actions) for E2SM-RC REPORT Style 1 on NR UL-DCCH MeasurementReport."""
    return (sm_rc.rc_event_trigger_message_copy(condition_id),
            [Action(action_id, sm_rc.rc_action_definition_message_copy())])


def kpm_ue_details(names: Sequence[str], period_ms: int = 1000, action_id: int = 1,
                   cell: ie.Cgi | None = None) -> tuple[bytes, list[Action]]:
    """(event trigger, actions) for E2SM-KPM REPORT Style 4: ``names`` per UE every ``period_ms``."""
    return (sm_kpm.kpm_event_trigger(period_ms),
            [Action(action_id, sm_kpm.kpm_action_definition_ue_level(names, period_ms, cell))])


class SubmgrClient:
    """A small client for submgr's REST API (``requests``; ``session`` injectable for tests)."""

    def __init__(self, base_url: str = SUBMGR_URL, timeout_s: float = 5.0, session: Any = None) -> None:
        import requests
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.session = session or requests.Session()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        import requests
        url = f"{self.base_url}{path}"
        try:
            r = self.session.request(method, url, timeout=self.timeout_s, **kw)
        except requests.RequestException as e:
            raise SubscriptionError(f"{method} {url}: {e}") from None
        if r.status_code >= 300:
            raise SubscriptionError(f"{method} {url}: HTTP {r.status_code} {r.text[:200]}", r.status_code)
        return r.json() if r.content else None

    def subscribe(self, params: dict) -> dict:
        """POST /subscriptions; returns the response ``{"SubscriptionId", "SubscriptionInstances"}``."""
        out = self._call("POST", "/subscriptions", json=params)
        if not isinstance(out, dict) or "SubscriptionId" not in out:
            raise SubscriptionError(f"unexpected submgr response {out!r}")
        log.info("e2_subscribed", meid=params.get("Meid"), ran_function=params.get("RANFunctionID"),
                 subscription_id=out["SubscriptionId"])
        return out

    def unsubscribe(self, subscription_id: str) -> None:
        """DELETE /subscriptions/{id}."""
        self._call("DELETE", f"/subscriptions/{subscription_id}")

    def list(self) -> Any:
        """GET /subscriptions."""
        return self._call("GET", "/subscriptions")


# --------------------------------------------------------------------------------------------
# submgr's notification (POST <xApp>/ric/v1/subscriptions/response)

SUBSCRIPTION_OUTCOMES = Counter("pallas_e2_subscription_instances",
                                "E2 event instances reported by submgr, by outcome", ["outcome"])
_INSTANCE_FIELDS = {"XappEventInstanceId": int, "E2EventInstanceId": int, "ErrorCause": str,
                    "ErrorSource": str, "TimeoutType": str}


def parse_subscription_response(body: Any) -> Any:
    """submgr's ``SubscriptionResponse`` JSON -> ricxappframe's model (validated).

    ``{"SubscriptionId": str, "SubscriptionInstances": [{"XappEventInstanceId": 0..65535,
    "E2EventInstanceId": 0..65535, "ErrorCause"?: str, "ErrorSource"?: SUBMGR|RTMGR|DBAAS|ASN1|
    E2Node, "TimeoutType"?: E2-Timeout|RTMGR-Timeout|DBAAS-Timeout}]}`` (ric-plt-xapp-frame-py
    ``api/xapp_rest_api.yaml``). Ranges and enumerations are checked by the framework's own
    swagger models. Raises ValueError for anything else.
    """
    from ricxappframe.subsclient.models import SubscriptionInstance, SubscriptionResponse

    if not isinstance(body, dict) or not isinstance(body.get("SubscriptionId"), str):
        raise ValueError("SubscriptionId (string) missing")
    items = body.get("SubscriptionInstances")
    if not isinstance(items, list):
        raise ValueError("SubscriptionInstances (list) missing")
    instances = []
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"SubscriptionInstances[{k}] is not an object")
        for name, typ in _INSTANCE_FIELDS.items():
            v = item.get(name)
            if v is not None and (not isinstance(v, typ) or isinstance(v, bool)):
                raise ValueError(f"SubscriptionInstances[{k}].{name}: {typ.__name__} expected")
        instances.append(SubscriptionInstance(
            xapp_event_instance_id=item.get("XappEventInstanceId"),
            e2_event_instance_id=item.get("E2EventInstanceId"),
            error_cause=item.get("ErrorCause"), error_source=item.get("ErrorSource"),
            timeout_type=item.get("TimeoutType")))  # ValueError on a range or enum breach
    return SubscriptionResponse(subscription_id=body["SubscriptionId"],
                                subscription_instances=instances)


class SubscriptionLedger:
    """The xApp's E2 subscriptions: what it asked submgr for and what submgr reported back.

    :meth:`requested` records submgr's answer to a POST (SubscriptionId -> E2 node, RAN
    function); :meth:`notify` takes submgr's later notification and records, per E2 event
    instance, whether the E2 node set it up (the E2 instance id is the RMR sub id of the
    indications that follow) or why not (ErrorCause / ErrorSource / TimeoutType, logged as an
    error). Thread-safe: notifications arrive on the HTTP server's threads.

    Bounded (the notification endpoint takes unauthenticated input, issue 16): at most
    :attr:`MAX_SUBSCRIPTIONS` subscription records (a notification naming one more unknown id
    is refused with ValueError, nothing recorded), the :attr:`MAX_INSTANCES` most recent
    instances per subscription (older ones and their active entries go), the
    :attr:`MAX_FAILED` most recent failures.
    """

    MAX_SUBSCRIPTIONS = 1024
    MAX_INSTANCES = 64
    MAX_FAILED = 256

    def __init__(self) -> None:
        import collections
        import threading
        self._lock = threading.Lock()
        self.subscriptions: dict[str, dict] = {}
        self.active: dict[int, str] = {}      # E2 event instance id -> SubscriptionId
        self.failed: collections.deque[dict] = collections.deque(maxlen=self.MAX_FAILED)

    def forget(self, subscription_id: str) -> None:
        """Drop a deleted subscription and its E2 instances."""
        with self._lock:
            self.subscriptions.pop(subscription_id, None)
            for inst in [i for i, s in self.active.items() if s == subscription_id]:
                del self.active[inst]

    def requested(self, answer: dict, meid: str, ran_function_id: int) -> None:
        """Record submgr's answer to the subscription of ``meid`` / ``ran_function_id``."""
        with self._lock:
            self.subscriptions[str(answer.get("SubscriptionId"))] = {
                "meid": meid, "ran_function": int(ran_function_id), "instances": []}

    def notify(self, body: Any) -> int:
        """Record submgr's notification; returns how many instances it reported.

        Raises ValueError for a malformed body (nothing recorded). An unknown SubscriptionId is
        recorded too (a restarted xApp can be told about subscriptions it made before) and
        logged as a warning.
        """
        resp = parse_subscription_response(body)
        sid = resp.subscription_id
        with self._lock:
            sub = self.subscriptions.get(sid)
            if sub is None:
                if len(self.subscriptions) >= self.MAX_SUBSCRIPTIONS:
                    raise ValueError(f"unknown subscription {sid!r}: the ledger holds "
                                     f"{len(self.subscriptions)}, the most it keeps")
                log.warning("e2_subscription_notification_for_unknown_id", subscription_id=sid)
                sub = self.subscriptions[sid] = {"meid": None, "ran_function": None, "instances": []}
            for inst in resp.subscription_instances:
                rec = {"xapp_event_instance_id": inst.xapp_event_instance_id,
                       "e2_event_instance_id": inst.e2_event_instance_id,
                       "error_cause": inst.error_cause, "error_source": inst.error_source,
                       "timeout_type": inst.timeout_type}
                sub["instances"].append(rec)
                if inst.error_cause or inst.error_source or inst.timeout_type:
                    self.failed.append({"subscription_id": sid, **rec})
                    SUBSCRIPTION_OUTCOMES.labels("failed").inc()
                    log.error("e2_subscription_failed", subscription_id=sid, e2_node=sub["meid"],
                              ran_function=sub["ran_function"], cause=inst.error_cause,
                              source=inst.error_source, timeout=inst.timeout_type)
                else:
                    self.active[inst.e2_event_instance_id] = sid
                    SUBSCRIPTION_OUTCOMES.labels("active").inc()
                    log.info("e2_subscription_active", subscription_id=sid, e2_node=sub["meid"],
                             ran_function=sub["ran_function"],
                             e2_instance=inst.e2_event_instance_id)
            while len(sub["instances"]) > self.MAX_INSTANCES:
                old = sub["instances"].pop(0)
                e2_id = old["e2_event_instance_id"]
                if self.active.get(e2_id) == sid and not any(
                        r["e2_event_instance_id"] == e2_id for r in sub["instances"]):
                    del self.active[e2_id]
        return len(resp.subscription_instances)


# --------------------------------------------------------------------------------------------
# the lifecycle

Key = tuple[str, int]
"""A wanted subscription: (E2 node id, RAN function id)."""


def wanted_subscriptions(config: Any, nodes: Collection[str] | None = None,
                         host: str | None = None) -> dict[Key, dict]:
    """The ``SubscriptionParams`` the configuration wants, by (E2 node, RAN function): E2SM-RC
    REPORT Style 1 message copy at every E2 node of ``nodes`` (None: of the configured
    agents, ``config.e2_nodes``), for each RC RAN function (``controls.e2.ran_functions``),
    with the xApp's client endpoint; ``host`` replaces its host (a replica's own,
    ``xapp.cluster.endpoint.replica_host``; None: ``controls.e2.client_endpoint.host``)."""
    e2 = config.e2
    trigger, actions = rc_message_copy_details()
    rc_ids = getattr(e2, "rc_ran_function_ids", None) or (getattr(e2, "rc_ran_function_id", 3),)
    return {(node, int(rf)): subscription_params(
                host=host or e2.client_host, http_port=e2.client_http_port, rmr_port=e2.client_rmr_port,
                meid=node, ran_function_id=int(rf), event_trigger=trigger, actions=actions)
            for node in (config.e2_nodes if nodes is None else sorted(nodes)) for rf in rc_ids}


class SubscriptionManager:
    """Keeps the xApp's E2 subscriptions at submgr equal to what the configuration wants.

    ``client``: a :class:`SubmgrClient` (or anything with ``subscribe(params) -> answer`` and
    ``unsubscribe(id)``); ``ledger``: the :class:`SubscriptionLedger` the HTTP notification
    path fills. A subscription that fails (submgr unreachable or refusing) is retried after
    ``backoff_s``, doubling up to ``max_backoff_s``, by :meth:`retry_due` (called by the
    thread of :meth:`start`, or by hand). ``client_host``: the ClientEndpoint host of every
    subscription it makes, whatever the configuration says (a replica's own address,
    docs/scale-out.md §6; None: ``controls.e2.client_endpoint.host``). Thread-safe.
    """

    def __init__(self, client: Any, ledger: SubscriptionLedger | None = None, *, backoff_s: float = 1.0,
                 max_backoff_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 client_host: str | None = None) -> None:
        self.client = client
        self.client_host = client_host
        self.ledger = ledger if ledger is not None else SubscriptionLedger()
        self.backoff_s, self.max_backoff_s, self.clock = backoff_s, max_backoff_s, clock
        self._lock = threading.RLock()
        self.active: dict[Key, tuple[str, dict]] = {}              # key -> (SubscriptionId, params)
        self.pending: dict[Key, tuple[dict, float, float]] = {}    # key -> (params, next try, backoff)
        self.answers: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sync(self, config: Any, owned: Collection[str] | None = None) -> list[dict]:
        """Make the subscriptions those of ``config``: delete the ones no longer wanted (or whose
        parameters changed), subscribe the new ones now (a failure goes to the retry list).
        ``owned``: with several replicas (docs/scale-out.md), the E2 nodes this replica holds
        the lease of (the RIC's nodes, configured or not: §2): exactly those are subscribed to,
        every other node's subscriptions deleted or not made (None: every configured node).
        Returns submgr's answers to the subscriptions made by this call."""
        wanted = wanted_subscriptions(config, owned, self.client_host)
        with self._lock:
            for key in [k for k, (_, p) in self.active.items() if wanted.get(k) != p]:
                self._delete(key)
            for key in [k for k, (p, _, _) in self.pending.items() if wanted.get(k) != p]:
                del self.pending[key]
            new = [(k, p) for k, p in wanted.items() if k not in self.active and k not in self.pending]
        return [a for k, p in new if (a := self._subscribe(k, p, self.backoff_s)) is not None]

    def _subscribe(self, key: Key, params: dict, backoff: float) -> dict | None:
        node, rf = key
        try:
            answer = self.client.subscribe(params)
        except Exception as e:  # submgr down or refusing: retried later, the xApp runs on
            with self._lock:
                self.pending[key] = (params, self.clock() + backoff, min(backoff * 2, self.max_backoff_s))
            log.error("subscription failed, will retry", e2_node=node, ran_function=rf, retry_in_s=backoff,
                      error=repr(e))
            return None
        sid = str(answer["SubscriptionId"])
        with self._lock:
            self.pending.pop(key, None)
            self.active[key] = (sid, params)
            self.answers.append(answer)
        self.ledger.requested(answer, node, rf)
        log.info("subscribed", e2_node=node, ran_function=rf, subscription_id=sid)
        return answer

    def retry_due(self) -> int:
        """Retry the failed subscriptions whose time has come; returns how many now exist."""
        now = self.clock()
        with self._lock:
            due = [(k, p, b) for k, (p, t, b) in self.pending.items() if t <= now]
        return sum(self._subscribe(k, p, b) is not None for k, p, b in due)

    def _delete(self, key: Key) -> bool:
        sid, _ = self.active.pop(key)
        try:
            self.client.unsubscribe(sid)
        except Exception as e:  # submgr down: it expires the subscription when the xApp is gone
            log.error("subscription delete failed", e2_node=key[0], ran_function=key[1],
                      subscription_id=sid, error=repr(e))
            return False
        finally:
            self.ledger.forget(sid)
        log.info("unsubscribed", e2_node=key[0], ran_function=key[1], subscription_id=sid)
        return True

    def delete_all(self) -> int:
        """Delete every subscription at submgr (shutdown); stops the retry thread first.
        Returns how many submgr confirmed."""
        self.stop()
        with self._lock:
            self.pending.clear()
            return sum(self._delete(k) for k in list(self.active))

    def start(self, period_s: float = 0.5) -> "SubscriptionManager":
        """Retry failed subscriptions from a daemon thread every ``period_s``."""
        def run() -> None:
            while not self._stop.wait(period_s):
                self.retry_due()
        self._thread = threading.Thread(target=run, name="e2-subscriptions", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)
