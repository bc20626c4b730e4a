"""descriptors/config-file.json validated the way the OSC onboarder (dms_cli onboard) does.

docs/osc.md §3.1: the onboarder copies its root schema, replaces properties.controls by
the xApp's schema.json, checks the result with Draft7Validator.check_schema and validates
config-file.json against it (jsonschema's validate(), so no format checker).
"""

import copy
import json

import pytest
from jsonschema import Draft7Validator, ValidationError, validate

from deploy_paths import DESCRIPTORS, OSC_SCHEMA


def onboarder_schema() -> dict:
    root = json.loads(OSC_SCHEMA.read_text())
    schema = copy.deepcopy(root)
    schema["properties"]["controls"] = json.loads((DESCRIPTORS / "schema.json").read_text())
    Draft7Validator.check_schema(schema)
    return schema


def test_descriptor_passes_the_onboarders_validation(descriptor):
    validate(descriptor, onboarder_schema())
    # what onboard.py then needs to build its xApp object
    assert descriptor["name"] == "pallas" and descriptor["version"] == "0.1.0"


def test_without_schema_json_the_controls_section_is_refused(descriptor):
    # The onboarder's own default: controls must hold __empty_control_section__, so a descriptor
    # with controls needs its schema.json; this shows the check above has teeth.
    with pytest.raises(ValidationError, match="__empty_control_section__"):
        validate(descriptor, json.loads(OSC_SCHEMA.read_text()))


@pytest.mark.parametrize("mutate, what", [
    (lambda d: d["readinessProbe"].__setitem__("periodSeconds", "15"), "'15' is not of type 'integer'"),
    (lambda d: d["livenessProbe"].pop("initialDelaySeconds"), "is not valid under any of the given schemas"),
    (lambda d: d.__setitem__("version", "0.1"), "does not match"),
    (lambda d: d["containers"][0]["image"].__setitem__("registry", "localhost:5000"), "does not match"),
    (lambda d: d["messaging"]["ports"][2].pop("policies"), "'policies' is a dependency"),
    (lambda d: d["controls"]["scheduler"].__setitem__("alpha", -0.1), "less than the minimum"),
    (lambda d: d["controls"].pop("agents"), "'agents' is a required property"),
])
def test_onboarder_rejects_broken_variants(descriptor, mutate, what):
    mutate(descriptor)
    with pytest.raises(ValidationError, match=what):
        validate(descriptor, onboarder_schema())


def _port(descriptor, name):
    return next(p for p in descriptor["messaging"]["ports"] if p["name"] == name)


def test_messaging_covers_the_xapps_rmr_traffic(descriptor):
    rmr = _port(descriptor, "rmrdata")
    assert rmr["port"] == 4560 and _port(descriptor, "rmrroute")["port"] == 4561
    assert {"RIC_INDICATION", "A1_POLICY_REQ", "RIC_HEALTH_CHECK_REQ"} <= set(rmr["rxMessages"])
    assert {"A1_POLICY_RESP", "A1_POLICY_QUERY"} <= set(rmr["txMessages"])


def test_descriptor_parts_agree_with_each_other(descriptor):
    c = descriptor["controls"]
    rmr, http = _port(descriptor, "rmrdata"), _port(descriptor, "http")
    # the one A1 policy type: routed to us, served by the handler, shipped beside the descriptor
    assert rmr["policies"] == [c["a1"]["policy_type_id"]]
    ptype = json.loads((DESCRIPTORS / f"policytype-{c['a1']['policy_type_id']}.json").read_text())
    assert ptype["policy_type_id"] == c["a1"]["policy_type_id"]
    # where submgr reaches us is where we listen
    assert c["e2"]["client_endpoint"]["http_port"] == http["port"]
    assert c["e2"]["client_endpoint"]["rmr_port"] == rmr["port"]
    # liveness: the receive loop answers RIC_HEALTH_CHECK_REQ; rmr_probe (in the rmr deb) asks it.
    # readiness: over HTTP on the xApp's http port, where the onboarder's chart probes it
    assert descriptor["livenessProbe"]["exec"]["command"][-1].endswith(f":{rmr['port']}")
    assert descriptor["readinessProbe"]["httpGet"] == {"path": "/ric/v1/health/ready", "port": http["port"]}
    assert descriptor["annotations"]["prometheus.io/port"] == str(http["port"])
    assert descriptor["annotations"]["prometheus.io/path"] == descriptor["metrics"]["url"]
    # the xApp reads this file: the chart does not set CONFIG_FILE, appenv must
    assert descriptor["appenv"]["CONFIG_FILE"] == "/opt/ric/config/config-file.json"
    # every cell names a configured agent
    assert set(c["cells"].values()) <= set(c["agents"])
