"""A1 policy instances through the xApp's handler: create, update, delete, good and bad."""

import json

import pytest

from deploy_paths import DESCRIPTORS
from xapp.a1 import (A1_POLICY_QUERY, A1_POLICY_REQ, A1_POLICY_RESP, A1PolicyHandler,
                     apply_instance, default_policy_type_path, load_policy_type)
from xapp.config import load_config_file

TYPE_ID = 26001
SRC, TGT = 41959425, 41975809          # a cell of edge-a, a cell of edge-b


@pytest.fixture
def base():
    return load_config_file(DESCRIPTORS / "config-file.json")


@pytest.fixture
def changes():
    return []


@pytest.fixture
def handler(base, changes):
    return A1PolicyHandler(base, load_policy_type(default_policy_type_path(TYPE_ID)),
                           on_change=changes.append)


def req(op, iid="inst-1", payload=None, type_id=TYPE_ID):
    return json.dumps({"operation": op, "policy_type_id": type_id, "policy_instance_id": iid,
                       "payload": {} if payload is None else payload}).encode()


def resp(raw: bytes) -> dict:
    """Decode an A1_POLICY_RESP and check it against the A1-xApp contract (ric-plt-a1
    docs/a1_xapp_contract_openapi.yaml downstream_notification_schema: exactly these four
    fields, status one of OK/ERROR/DELETED)."""
    body = json.loads(raw)
    assert set(body) == {"policy_type_id", "policy_instance_id", "handler_id", "status"}
    assert isinstance(body["policy_type_id"], int) and 1 <= body["policy_type_id"] <= 2**31 - 1
    assert isinstance(body["policy_instance_id"], str) and isinstance(body["handler_id"], str)
    assert body["status"] in ("OK", "ERROR", "DELETED")
    return body


def test_message_types_are_the_rmr_ones():
    assert (A1_POLICY_REQ, A1_POLICY_RESP, A1_POLICY_QUERY) == (20010, 20011, 20012)


def test_create_update_delete_change_and_revert_the_live_config(handler, base, changes):
    assert handler.config.scheduler.alpha == 0.8
    r = resp(handler.handle(req("CREATE", payload={"alpha": 0.5, "t_max_s": 3.0,
                                                   "proactive": {"cells": {str(TGT): False}}})))
    assert r == {"policy_type_id": TYPE_ID, "policy_instance_id": "inst-1", "handler_id": "pallas",
                 "status": "OK"}
    cfg = handler.config
    assert (cfg.scheduler.alpha, cfg.scheduler.t_max_s, cfg.scheduler.dt_s) == (0.5, 3.0, 0.1)
    assert not cfg.proactive.allows(SRC, TGT) and cfg.proactive.allows(SRC, SRC)
    assert changes == [cfg]

    r = resp(handler.handle(req("UPDATE", payload={"dt_s": 0.2, "fallback": "detour"})))
    assert r["status"] == "OK"
    cfg = handler.config
    # an update replaces the instance's payload: its earlier knobs no longer apply
    assert (cfg.scheduler.alpha, cfg.scheduler.dt_s, cfg.fallback) == (0.8, 0.2, "detour")
    assert cfg.proactive.allows(SRC, TGT)

    r = resp(handler.handle(req("DELETE")))
    assert r["status"] == "DELETED"
    assert handler.config.controls == base.controls and handler.instances == {}
    assert len(changes) == 3


@pytest.mark.parametrize("op", ["CREATE", "UPDATE"])
@pytest.mark.parametrize("payload, why", [
    ({"alpha": 1.5}, "payload.alpha: 1.5 is greater than the maximum of 1"),
    ({"t_max_s": 0}, "payload.t_max_s"),
    ({"dt_s": "0.1"}, "payload.dt_s: '0.1' is not of type 'number'"),
    ({"proactive": {"cells": {"cell-9": False}}}, "'cell-9' does not match"),
    ({"fallback": "teleport"}, "payload.fallback: 'teleport' is not one of"),
    ({"alhpa": 0.5}, "'alhpa' was unexpected"),
    ({}, "should be non-empty"),
    ("alpha=0.5", "payload must be a JSON object"),
])
def test_a_bad_instance_is_answered_error_and_changes_nothing(handler, changes, op, payload, why):
    good = resp(handler.handle(req("CREATE", iid="kept", payload={"alpha": 0.6})))
    assert good["status"] == "OK"
    before, instances = handler.config, handler.instances
    out = handler.process(req(op, iid="kept" if op == "UPDATE" else "new", payload=payload))
    assert resp(out.response)["status"] == "ERROR"
    assert why in out.reason, out.reason
    assert handler.config is before and handler.instances == instances and not out.changed
    assert len(changes) == 1


@pytest.mark.parametrize("raw, why", [
    (b"\xff\xfe not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (json.dumps({"operation": "PATCH", "policy_type_id": TYPE_ID, "policy_instance_id": "i",
                 "payload": {}}).encode(), "operation must be one of"),
    (req("CREATE", type_id=20008, payload={"alpha": 0.5}), "policy type 20008 is not served here"),
    (json.dumps({"operation": "CREATE", "policy_type_id": "26001", "policy_instance_id": "i",
                 "payload": {"alpha": 0.5}}).encode(), "policy_type_id must be an integer"),
    (req("CREATE", iid="", payload={"alpha": 0.5}), "policy_instance_id must be a non-empty string"),
])
def test_malformed_requests_are_answered_error(handler, raw, why):
    out = handler.process(raw)
    assert resp(out.response)["status"] == "ERROR" and why in out.reason
    assert handler.config.scheduler.alpha == 0.8 and handler.instances == {}


def test_instances_stack_in_creation_order_and_delete_reverts_only_its_own(handler):
    assert resp(handler.handle(req("CREATE", "a", {"alpha": 0.3, "proactive": {"enabled": False}})))["status"] == "OK"
    assert resp(handler.handle(req("CREATE", "b", {"alpha": 0.9})))["status"] == "OK"
    assert handler.config.scheduler.alpha == 0.9 and not handler.config.proactive.enabled
    # updating "a" keeps its place: "b" still has the last word on alpha
    assert resp(handler.handle(req("UPDATE", "a", {"alpha": 0.1, "proactive": {"enabled": False}})))["status"] == "OK"
    assert handler.config.scheduler.alpha == 0.9
    assert resp(handler.handle(req("DELETE", "b")))["status"] == "DELETED"
    assert handler.config.scheduler.alpha == 0.1 and not handler.config.proactive.enabled
    assert list(handler.instances) == ["a"]


def test_delete_of_an_unknown_instance_is_idempotent(handler, changes):
    out = handler.process(req("DELETE", "never-created"))
    assert resp(out.response)["status"] == "DELETED" and not out.changed and changes == []


def test_read_reports_whether_the_instance_exists(handler):
    assert resp(handler.handle(req("READ", "x")))["status"] == "ERROR"
    handler.handle(req("CREATE", "x", {"alpha": 0.4}))
    assert resp(handler.handle(req("READ", "x")))["status"] == "OK"


def test_rebase_reapplies_live_instances_on_a_new_descriptor(handler, base):
    handler.handle(req("CREATE", "a", {"alpha": 0.3}))
    controls = dict(base.controls)
    controls["scheduler"] = dict(controls["scheduler"], c_sync_s=0.2, alpha=0.7)
    from xapp.config import load_controls
    cfg = handler.rebase(load_controls(controls))
    assert cfg.scheduler.c_sync_s == 0.2 and cfg.scheduler.alpha == 0.3


def test_query_message_asks_for_this_type():
    h = A1PolicyHandler(load_config_file(DESCRIPTORS / "config-file.json"),
                        load_policy_type(default_policy_type_path(TYPE_ID)))
    assert json.loads(h.query_message()) == {"policy_type_id": TYPE_ID}


def test_policy_type_knobs_have_the_same_bounds_as_the_controls_schema():
    """A value A1 accepts for a knob must be one the configuration accepts, and back."""
    ptype = load_policy_type(default_policy_type_path(TYPE_ID))["create_schema"]["properties"]
    controls = json.loads((DESCRIPTORS / "schema.json").read_text())
    sched = controls["properties"]["scheduler"]["properties"]
    strip = lambda d: {k: v for k, v in d.items() if k != "description"}
    for k in ("alpha", "t_max_s", "dt_s"):
        assert strip(ptype[k]) == strip(sched[k]), k
    assert ptype["fallback"]["enum"] == controls["definitions"]["fallback"]["enum"]
    for k, d in (("cells", "cellRules"), ("slices", "sliceRules")):
        assert strip(ptype["proactive"]["properties"][k]) == strip(controls["definitions"][d])


def test_apply_instance_does_not_touch_its_input(base):
    before = json.dumps(dict(base.controls), sort_keys=True)
    out = apply_instance(base.controls, {"alpha": 0.2, "proactive": {"slices": {"1": False}}})
    assert out["scheduler"]["alpha"] == 0.2 and out["proactive"]["slices"] == {"1": False}
    assert json.dumps(dict(base.controls), sort_keys=True) == before


def test_the_policy_type_id_must_match_the_configuration(base):
    ptype = load_policy_type(default_policy_type_path(TYPE_ID))
    with pytest.raises(ValueError, match="not the configured"):
        A1PolicyHandler(base, dict(ptype, policy_type_id=1))
