"""A1 policy instances through the xApp's handler: create, update, delete, good and bad."""

import json

import pytest
from hypothesis import HealthCheck, given, settings

from deploy_paths import DESCRIPTORS
from descriptor_fuzz import a1_objects, a1_response
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


resp = a1_response


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
    ("alpha=0.5", "payload string is not JSON"),
    (["alpha", 0.5], "payload must be a JSON object"),
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
    (json.dumps({"operation": "CREATE", "policy_type_id": "26001.0", "policy_instance_id": "i",
                 "payload": {"alpha": 0.5}}).encode(), "policy_type_id must be an integer"),
    (json.dumps({"operation": "CREATE", "policy_type_id": " 26001", "policy_instance_id": "i",
                 "payload": {"alpha": 0.5}}).encode(), "policy_type_id must be an integer"),
    (json.dumps({"operation": "CREATE", "policy_type_id": True, "policy_instance_id": "i",
                 "payload": {"alpha": 0.5}}).encode(), "policy_type_id must be an integer"),
    (req("CREATE", payload=""), "got an empty string"),
    (req("CREATE", payload="{\"alpha\": 0.5"), "payload string is not JSON"),
    (req("CREATE", payload='"{\\"alpha\\": 0.5}"'), "a string in a string"),
    (req("CREATE", payload="[0.5]"), "got list"),
    (req("CREATE", payload='{"alpha": NaN}'), "NaN is not a JSON number"),
    (req("UPDATE", payload=None) .replace(b'"payload": {}', b'"payload": null'), "got nothing"),
    (req("DELETE", payload=7), "got int"),
    (req("CREATE", iid="", payload={"alpha": 0.5}), "policy_instance_id must be a non-empty string"),
    (b"[" * 60_000, "nested too deeply"),
    (b'{"a": ' * 10_000, "nested too deeply"),
    (json.dumps({"operation": "CREATE", "policy_type_id": TYPE_ID, "policy_instance_id": "i",
                 "payload": "[" * 60_000}).encode(), "nested too deeply"),
    (req("CREATE", type_id=10**40, payload={"alpha": 0.5}), "is not served here"),
    (req("CREATE", type_id=-5, payload={"alpha": 0.5}), "is not served here"),
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


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=a1_objects)
def test_fuzzed_requests_never_raise_and_answer_per_the_contract(handler, request):
    """Any JSON request: an answer that satisfies the A1-xApp contract, and an ERROR changes
    nothing (the live configuration stays the last good one)."""
    before = handler.config
    out = handler.process(json.dumps(request).encode())
    body = resp(out.response)
    assert body["status"] == out.status and (out.status == "ERROR") == bool(out.reason)
    if out.status == "ERROR":
        assert handler.config is before and not out.changed
    sc = handler.config.scheduler          # whatever was accepted, the window grid stays capped
    assert sc.t_max_s / sc.dt_s <= 6000 * (1 + 1e-9)


# --- the OSC A1 mediator's own form (field case ../shared/cases/a1/) ----------------------------
CASES = DESCRIPTORS.parent.parent / "shared" / "cases" / "a1"


def mediator_mirror(raw: bytes) -> tuple[int, str, str, str]:
    """What the Go A1 mediator does with an A1_POLICY_RESP (ric-plt-a1 pkg/rmr/rmr.go, case
    A1_POLICY_RESP): type assertions policy_type_id -> float64 (a JSON number), the three others
    -> string; any other JSON type makes its handler panic. Returns what it stores."""
    body = json.loads(raw)
    tid, iid, hid, status = (body["policy_type_id"], body["policy_instance_id"], body["handler_id"],
                             body["status"])
    assert isinstance(tid, (int, float)) and not isinstance(tid, bool), tid
    assert isinstance(iid, str) and isinstance(hid, str) and isinstance(status, str)
    return int(tid), iid, hid, status


def test_the_mediators_create_and_delete_apply_and_revert(handler, base, changes):
    """Family: A1_POLICY_REQ as the OSC A1 mediator marshals it (every field a JSON string: the
    type id "26001", the instance's JSON inside the payload string, "" as a DELETE's payload).
    Before the fix both were answered ERROR ('policy_type_id must be an integer') and nothing
    was applied or reverted."""
    create = (CASES / "mediator-create.json").read_bytes()
    out = handler.process(create)
    assert out.status == "OK" and out.changed, out.reason
    assert mediator_mirror(out.response) == (TYPE_ID, "ops-1", "pallas", "OK")
    cfg = handler.config
    assert cfg.scheduler.alpha == 0.9 and cfg.fallback == "ctho"
    assert cfg.proactive.cells[41959425] is False
    assert handler.instances == {"ops-1": {"alpha": 0.9, "proactive": {"cells": {"41959425": False}},
                                           "fallback": "ctho"}}
    out = handler.process((CASES / "mediator-delete.json").read_bytes())
    assert out.status == "DELETED" and out.changed, out.reason
    assert mediator_mirror(out.response) == (TYPE_ID, "ops-1", "pallas", "DELETED")
    assert handler.config is base and handler.instances == {}
    assert changes[-1] is base and len(changes) == 2


def test_both_forms_of_the_same_instance_give_the_same_configuration(base):
    forms = []
    for tid, payload in ((TYPE_ID, {"alpha": 0.4, "t_max_s": 2.0}),
                         (str(TYPE_ID), json.dumps({"alpha": 0.4, "t_max_s": 2.0}))):
        h = A1PolicyHandler(base, load_policy_type(default_policy_type_path(TYPE_ID)))
        out = h.process(json.dumps({"operation": "CREATE", "policy_type_id": tid,
                                    "policy_instance_id": "x", "payload": payload}).encode())
        assert out.status == "OK", out.reason
        forms.append(json.dumps(dict(h.config.controls), sort_keys=True))
    assert forms[0] == forms[1]


def test_a_mediator_create_with_a_bad_instance_is_refused_with_the_reason(handler, changes):
    out = handler.process(json.dumps({"operation": "CREATE", "policy_type_id": "26001",
                                      "policy_instance_id": "ops-2",
                                      "payload": json.dumps({"alpha": 2})}).encode())
    assert mediator_mirror(out.response) == (TYPE_ID, "ops-2", "pallas", "ERROR")
    assert "payload.alpha: 2 is greater than the maximum of 1" in out.reason
    assert handler.instances == {} and changes == []


@pytest.mark.parametrize("extra, status", [(0, "OK"), (1, "ERROR")])
def test_a_request_at_the_size_limit_is_read_and_one_byte_more_is_refused(handler, extra, status):
    from xapp.a1 import MAX_REQUEST_BYTES
    head = {"operation": "CREATE", "policy_type_id": TYPE_ID, "policy_instance_id": "big",
            "payload": {"alpha": 0.5}}
    raw = json.dumps(head).encode()
    raw = raw[:-1] + b" " * (MAX_REQUEST_BYTES - len(raw)) + b"}"      # whitespace up to the limit
    assert len(raw) == MAX_REQUEST_BYTES
    out = handler.process(raw + b" " * extra)
    assert out.status == status
    if status == "ERROR":
        assert f"more than {MAX_REQUEST_BYTES}" in out.reason and handler.instances == {}


@pytest.mark.parametrize("payload, status", [
    ({"dt_s": 0.01, "t_max_s": 60}, "OK"),          # the largest grid: 6000 steps
    ({"dt_s": 0.0099, "t_max_s": 60}, "ERROR"),     # one step past it
    ({"dt_s": 1e-9, "t_max_s": 60}, "ERROR"),       # issue 14: ~6e10 windows every cycle
])
def test_a1_caps_the_window_grid(handler, payload, status):
    out = handler.process(req("CREATE", payload=payload))
    assert out.status == status, out.reason
    if status == "ERROR":
        assert "payload.dt_s" in out.reason and handler.instances == {}
        assert handler.config.scheduler.dt_s == 0.1
    else:
        assert (handler.config.scheduler.dt_s, handler.config.scheduler.t_max_s) == (0.01, 60.0)


def test_live_instances_are_capped_and_one_more_is_refused(handler):
    from xapp.a1 import MAX_INSTANCES
    for i in range(MAX_INSTANCES):
        assert handler.process(req("CREATE", iid=f"i{i}", payload={"alpha": 0.5})).status == "OK"
    out = handler.process(req("CREATE", iid="one-more", payload={"alpha": 0.5}))
    assert out.status == "ERROR" and f"the most this xApp keeps ({MAX_INSTANCES})" in out.reason
    assert len(handler.instances) == MAX_INSTANCES and "one-more" not in handler.instances
    # A live one may still change, and a deleted one frees its place.
    assert handler.process(req("UPDATE", iid="i0", payload={"alpha": 0.4})).status == "OK"
    assert handler.process(req("DELETE", iid="i1")).status == "DELETED"
    assert handler.process(req("CREATE", iid="one-more", payload={"alpha": 0.5})).status == "OK"
