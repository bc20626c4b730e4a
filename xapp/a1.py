"""A1 policy handling: A1_POLICY_REQ in, A1_POLICY_RESP out, the live configuration changed.

The near-RT RIC's A1 mediator sends each policy instance operation to the xApps registered for
its policy type (the descriptor's ``messaging.ports[].policies``) as RMR message A1_POLICY_REQ
(20010, RMR sub_id = policy type id) with the JSON body
``{operation: CREATE|UPDATE|DELETE|READ, policy_type_id, policy_instance_id, payload}``; the
xApp answers A1_POLICY_RESP (20011) ``{policy_type_id, policy_instance_id, handler_id,
status: OK|ERROR|DELETED}`` (O-RAN SC ric-plt-a1, docs/a1_xapp_contract_openapi.yaml; that
response schema admits no other field, so the reason of an ERROR goes to the log and to
:class:`A1Outcome`, not into the response). A1_POLICY_QUERY (20012) ``{policy_type_id}`` asks
A1 to send every existing instance again as CREATE, which the xApp does at start.

Two request forms are taken, since the published contract and the mediator's code differ: the
contract's (``policy_type_id`` a JSON integer, ``payload`` an object) and what the Go mediator
(ric-plt-a1 ``pkg/rmr/messages.go``) actually puts on RMR: every field a JSON string, so
``policy_type_id`` is ``"26001"``, ``payload`` the instance's JSON text inside a string, and a
DELETE carries ``""``. The answer is what that mediator parses (``pkg/rmr/rmr.go``, case
A1_POLICY_RESP): ``policy_type_id`` a JSON number, ``policy_instance_id``, ``handler_id`` and
``status`` strings (a string type id there would stop its handler). Anything else is answered
ERROR with the reason logged, and nothing changes. A body over :data:`MAX_REQUEST_BYTES` is
refused unparsed.

The policy type (``descriptors/policytype-<id>.json``, created by the operator through A1's
``PUT /A1-P/v2/policytypes/{id}``) carries the operator's knobs. Each live instance is an
overlay on the base configuration (the descriptor's ``controls``): the effective ``controls``
are the base with every instance applied in creation order (an UPDATE keeps its instance's
place), then validated and built by :func:`xapp.config.load_controls`. So a create or update
that fails the policy type's schema, or whose result is not a valid configuration, is answered
ERROR and changes nothing; a delete recomputes the configuration without that instance.

This module is pure logic (bytes in, bytes out); the RMR transport only routes 20010 to
:meth:`A1PolicyHandler.handle` and returns its bytes as 20011 (``rmr_rts``).
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from jsonschema import Draft7Validator

from xapp.config import ConfigError, XappConfig, load_controls
from xapp.e2.transport import A1_POLICY_QUERY, A1_POLICY_REQ, A1_POLICY_RESP  # the RMR types, defined once

__all__ = [
    "A1_POLICY_REQ",
    "A1_POLICY_RESP",
    "A1_POLICY_QUERY",
    "A1Outcome",
    "A1PolicyHandler",
    "apply_instance",
    "default_policy_type_path",
    "load_policy_type",
    "MAX_INSTANCES",
]


_OPERATIONS = ("CREATE", "UPDATE", "DELETE", "READ")
_MAX_TYPE_ID = 2147483647
#: Largest A1_POLICY_REQ body taken, and largest payload string in it (bytes / characters); an
#: instance of the Pallas type is a few hundred. Larger ones are answered ERROR unparsed.
MAX_REQUEST_BYTES = 64 * 1024
MAX_PAYLOAD_CHARS = MAX_REQUEST_BYTES
#: Live policy instances kept at most (each is overlaid on the descriptor at every change); a
#: CREATE of one more is answered ERROR (an UPDATE of a live one is taken).
MAX_INSTANCES = 64

log = structlog.get_logger("xapp.a1")


def default_policy_type_path(policy_type_id: int) -> Path:
    """``descriptors/policytype-<id>.json`` in the repository beside this package, or in the
    directory of ``$PALLAS_CONTROLS_SCHEMA`` when that is set (the container image)."""
    env = os.environ.get("PALLAS_CONTROLS_SCHEMA")
    base = Path(env).parent if env else Path(__file__).resolve().parent.parent / "descriptors"
    return base / f"policytype-{int(policy_type_id)}.json"


def load_policy_type(path: str | os.PathLike) -> dict:
    """Read an A1 policy type document ``{name, description, policy_type_id, create_schema}``.

    Raises ValueError if a key is missing or the id is not an integer in 1..2^31-1, and
    jsonschema.SchemaError if ``create_schema`` is not a valid draft-07 schema.
    """
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    missing = [k for k in ("name", "description", "policy_type_id", "create_schema") if k not in doc]
    if missing:
        raise ValueError(f"{path}: policy type lacks {', '.join(missing)}")
    tid = doc["policy_type_id"]
    if not isinstance(tid, int) or isinstance(tid, bool) or not 1 <= tid <= _MAX_TYPE_ID:
        raise ValueError(f"{path}: policy_type_id must be an integer in 1..{_MAX_TYPE_ID}, got {tid!r}")
    Draft7Validator.check_schema(doc["create_schema"])
    return doc


def apply_instance(controls: Mapping[str, Any], payload: Mapping[str, Any]) -> dict:
    """Return a copy of ``controls`` with one policy instance's knobs applied.

    ``alpha``, ``t_max_s``, ``dt_s`` (docs/model.md Eqs. 8-9) and ``targets_k``,
    ``targets_split``, ``targets_backhaul_share``, ``targets_return_s`` (docs/model.md §4.1) replace
    ``controls.scheduler`` fields of the same names; ``fallback`` replaces ``controls.fallback``; ``proactive.enabled``
    replaces ``controls.proactive.enabled`` and ``proactive.cells`` / ``proactive.slices`` are
    merged key by key into the configured rules. ``payload`` must already satisfy the policy
    type's schema; the result is not validated here.
    """
    out = copy.deepcopy(dict(controls))
    for k in ("alpha", "t_max_s", "dt_s", "targets_k", "targets_split", "targets_backhaul_share",
              "targets_return_s"):
        if k in payload:
            out["scheduler"][k] = payload[k]
    if "fallback" in payload:
        out["fallback"] = payload["fallback"]
    pro = payload.get("proactive") or {}
    if "enabled" in pro:
        out["proactive"]["enabled"] = pro["enabled"]
    for k in ("cells", "slices"):
        if k in pro:
            out["proactive"][k].update(pro[k])
    return out


_DECIMAL = re.compile(r"(0|[1-9][0-9]{0,9})")


def _type_id(value: Any) -> tuple[int | None, str]:
    """A request's ``policy_type_id``: a JSON integer (the published contract) or the decimal
    digits of one in a JSON string (what the OSC A1 mediator sends: ric-plt-a1
    ``pkg/rmr/messages.go`` marshals every field as a string). Returns (id, "") or
    (None, reason)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value, ""
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return int(value), ""
    return None, f"policy_type_id must be an integer or its decimal digits in a string, got {value!r}"


def _payload(value: Any, *, required: bool) -> tuple[dict, str]:
    """A request's ``payload``: a JSON object (the published contract) or a JSON string holding
    one (what the mediator sends; the HTTP body as it came). A DELETE or READ carries none: the
    mediator sends ``""``; an absent or null one, or any object, is accepted and ignored there.
    Returns (object, "") or ({}, reason). ``required``: CREATE and UPDATE need an object."""
    if isinstance(value, str):
        if value.strip() == "":
            return ({}, "payload must be a JSON object (or a JSON string holding one), got an empty string"
                    ) if required else ({}, "")
        if len(value) > MAX_PAYLOAD_CHARS:
            return {}, f"payload is {len(value)} characters, more than {MAX_PAYLOAD_CHARS}"
        try:
            value = json.loads(value, parse_constant=_no_constant)
        except ValueError as e:
            return {}, f"payload string is not JSON: {e}"
        except RecursionError:  # json's C decoder recurses per nesting level
            return {}, "payload string is not JSON: nested too deeply"
        if isinstance(value, str):  # a string inside a string: not what either form sends
            return {}, "payload must be a JSON object (or a JSON string holding one), got a string in a string"
    if value is None and not required:
        return {}, ""
    if not isinstance(value, dict):
        what = "nothing" if value is None else type(value).__name__
        return {}, f"payload must be a JSON object (or a JSON string holding one), got {what}"
    return value, ""


def _no_constant(token: str) -> Any:
    raise ValueError(f"{token} is not a JSON number")


@dataclass(frozen=True)
class A1Outcome:
    """What one A1_POLICY_REQ did.

    ``status`` is the A1_POLICY_RESP status (OK, ERROR, DELETED), ``reason`` a human-readable
    cause ("" when OK), ``changed`` whether the live configuration changed, ``response`` the
    A1_POLICY_RESP JSON body (UTF-8 bytes) to send back.
    """

    operation: str
    policy_type_id: int | None
    policy_instance_id: str
    status: str
    reason: str
    changed: bool
    response: bytes


class A1PolicyHandler:
    """Serves one A1 policy type and keeps the live configuration (base + instance overlays).

    Args:
        base: the configuration from the descriptor (:func:`xapp.config.load_config_file`).
        policy_type: the policy type document (:func:`load_policy_type`); its id must equal
            ``base.a1.policy_type_id``.
        on_change: called with the new effective :class:`XappConfig` after every change (the
            xApp swaps its engines' configuration there); an exception it raises is logged and
            does not undo the change.

    Raises ValueError if the policy type's id differs from the configured one.

    Not thread-safe: call it from the RMR receive loop only (ricxappframe runs handlers in one
    thread).
    """

    def __init__(self, base: XappConfig, policy_type: Mapping[str, Any], *,
                 on_change: Callable[[XappConfig], None] | None = None) -> None:
        if int(policy_type["policy_type_id"]) != base.a1.policy_type_id:
            raise ValueError(f"policy type {policy_type['policy_type_id']} is not the configured "
                             f"a1.policy_type_id {base.a1.policy_type_id}")
        self._type = dict(policy_type)
        self._validator = Draft7Validator(policy_type["create_schema"])
        self._base = base
        self._instances: dict[str, dict] = {}  # creation order = overlay order
        self._config = base
        self._on_change = on_change

    @property
    def policy_type_id(self) -> int:
        """The policy type id served."""
        return self._base.a1.policy_type_id

    @property
    def base(self) -> XappConfig:
        """The base configuration (the descriptor's), before any A1 instance."""
        return self._base

    @property
    def config(self) -> XappConfig:
        """The effective configuration: the base with every live instance applied."""
        return self._config

    @property
    def instances(self) -> dict[str, dict]:
        """A copy of the live instances: instance id -> payload, in creation order."""
        return copy.deepcopy(self._instances)

    def query_message(self) -> bytes:
        """A1_POLICY_QUERY (20012) body asking A1 to resend every instance of the type."""
        return json.dumps({"policy_type_id": self.policy_type_id}).encode()

    def handle(self, message: bytes | str) -> bytes:
        """Process one A1_POLICY_REQ body and return the A1_POLICY_RESP body (UTF-8 JSON)."""
        return self.process(message).response

    def rebase(self, base: XappConfig) -> XappConfig:
        """Replace the base configuration (the descriptor changed) and re-apply the live
        instances in order; an instance that no longer yields a valid configuration is skipped
        (logged) but kept, so it applies again once the base allows it. Returns the new
        effective configuration. Raises ValueError if the policy type id changed."""
        if base.a1.policy_type_id != self.policy_type_id:
            raise ValueError(f"the new base serves policy type {base.a1.policy_type_id}, "
                             f"this handler {self.policy_type_id}")
        self._base = base
        cfg = base
        for iid, payload in self._instances.items():
            try:
                cfg = load_controls(apply_instance(cfg.controls, payload))
            except ConfigError as e:
                log.warning("a1_instance_skipped", policy_instance_id=iid, reason=str(e))
        self._set(cfg)
        return cfg

    def process(self, message: bytes | str) -> A1Outcome:
        """Process one A1_POLICY_REQ body; see :class:`A1Outcome`. Never raises for bad input:
        a malformed request is answered ERROR (with whatever ids it carried) and logged."""
        if len(message) > MAX_REQUEST_BYTES:
            return self._answer("?", None, "", "ERROR",
                                f"request is {len(message)} bytes, more than {MAX_REQUEST_BYTES}", False)
        try:
            req = json.loads(message)
        except (ValueError, UnicodeDecodeError) as e:
            return self._answer("?", None, "", "ERROR", f"request is not JSON: {e}", False)
        except RecursionError:  # json's C decoder recurses per nesting level
            return self._answer("?", None, "", "ERROR", "request is not JSON: nested too deeply", False)
        if not isinstance(req, dict):
            return self._answer("?", None, "", "ERROR", "request is not a JSON object", False)
        op = req.get("operation")
        iid = req.get("policy_instance_id")
        tid, tid_why = _type_id(req.get("policy_type_id"))
        iid_s = iid if isinstance(iid, str) else ("" if iid is None else str(iid))
        if op not in _OPERATIONS:
            return self._answer(str(op), tid, iid_s, "ERROR",
                                f"operation must be one of {', '.join(_OPERATIONS)}, got {op!r}", False)
        if tid is None:
            return self._answer(op, None, iid_s, "ERROR", tid_why, False)
        if tid != self.policy_type_id:
            return self._answer(op, tid, iid_s, "ERROR",
                                f"policy type {tid} is not served here (serving {self.policy_type_id})", False)
        if not isinstance(iid, str) or not iid:
            return self._answer(op, tid, iid_s, "ERROR",
                                "policy_instance_id must be a non-empty string", False)
        payload, why = _payload(req.get("payload"), required=op in ("CREATE", "UPDATE"))
        if why:
            return self._answer(op, tid, iid, "ERROR", why, False)
        if op == "DELETE":
            return self._delete(tid, iid)
        if op == "READ":
            if iid in self._instances:
                return self._answer(op, tid, iid, "OK", "", False)
            return self._answer(op, tid, iid, "ERROR", f"no policy instance {iid!r}", False)
        # CREATE and UPDATE are both upserts: after an xApp restart A1 resends instances as
        # CREATE (A1_POLICY_QUERY), and an UPDATE may reach an xApp that missed the CREATE.
        return self._put(op, tid, iid, payload)

    # -- internals -----------------------------------------------------------------------

    def _put(self, op: str, tid: int, iid: str, payload: dict) -> A1Outcome:
        errs = sorted(self._validator.iter_errors(payload), key=lambda e: list(map(str, e.absolute_path)))
        if errs:
            why = "; ".join(".".join(["payload", *map(str, e.absolute_path)]) + ": " + e.message for e in errs)
            return self._answer(op, tid, iid, "ERROR", f"payload violates policy type {tid}: {why}", False)
        if iid not in self._instances and len(self._instances) >= MAX_INSTANCES:
            return self._answer(op, tid, iid, "ERROR", f"{len(self._instances)} policy instances "
                                f"are live, the most this xApp keeps ({MAX_INSTANCES})", False)
        staged = dict(self._instances)
        staged[iid] = copy.deepcopy(payload)  # an UPDATE (or a repeated CREATE) keeps its place
        try:
            cfg = self._overlay(staged)
        except ConfigError as e:
            return self._answer(op, tid, iid, "ERROR", f"the resulting configuration is invalid: {e}", False)
        self._instances = staged
        self._set(cfg)
        return self._answer(op, tid, iid, "OK", "", True)

    def _delete(self, tid: int, iid: str) -> A1Outcome:
        if iid not in self._instances:
            # Idempotent: A1 may retry a delete; there is nothing left to revert.
            return self._answer("DELETE", tid, iid, "DELETED", "", False)
        staged = {k: v for k, v in self._instances.items() if k != iid}
        try:
            cfg = self._overlay(staged)
        except ConfigError as e:  # only if the remaining overlays were valid only with this one
            return self._answer("DELETE", tid, iid, "ERROR", f"the configuration without it is invalid: {e}", False)
        self._instances = staged
        self._set(cfg)
        return self._answer("DELETE", tid, iid, "DELETED", "", True)

    def _overlay(self, instances: Mapping[str, Mapping[str, Any]]) -> XappConfig:
        controls: Mapping[str, Any] = self._base.controls
        for payload in instances.values():
            controls = apply_instance(controls, payload)
        return load_controls(controls) if instances else self._base

    def _set(self, cfg: XappConfig) -> None:
        self._config = cfg
        if self._on_change is not None:
            try:
                self._on_change(cfg)
            except Exception:  # the change stands; the callback's failure is the caller's to fix
                log.exception("a1_on_change_failed")

    def _answer(self, op: str, tid: int | None, iid: str, status: str, reason: str,
                changed: bool) -> A1Outcome:
        body = {
            # The contract's policy_type_id is 1..2^31-1: an id outside that is not echoed.
            "policy_type_id": tid if tid is not None and 1 <= tid <= _MAX_TYPE_ID else self.policy_type_id,
            "policy_instance_id": iid,
            "handler_id": self._base.a1.handler_id,
            "status": status,
        }
        if status == "ERROR":
            log.warning("a1_policy_rejected", operation=op, policy_type_id=tid,
                        policy_instance_id=iid, reason=reason)
        else:
            log.info("a1_policy", operation=op, policy_type_id=tid, policy_instance_id=iid,
                     status=status, changed=changed)
        return A1Outcome(op, tid, iid, status, reason, changed, json.dumps(body).encode())
