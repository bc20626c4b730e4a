"""xapp.config accepts exactly what descriptors/schema.json accepts, and says why it refuses."""

import copy
import json

import pytest
from hypothesis import event, given, settings, strategies as st
from jsonschema import Draft7Validator

from deploy_paths import DESCRIPTORS
from descriptor_fuzz import descriptor_files, make_check_descriptor
from xapp.config import (AgentEndpoint, ConfigError, XappConfig, from_descriptor,
                         load_config_file, load_controls, reload_descriptor)

SCHEMA = json.loads((DESCRIPTORS / "schema.json").read_text())
_CHECK_DESCRIPTOR = make_check_descriptor()
BASE = json.loads((DESCRIPTORS / "config-file.json").read_text())["controls"]


def test_the_shipped_descriptor_loads_into_one_typed_object():
    cfg = load_config_file(DESCRIPTORS / "config-file.json")
    assert isinstance(cfg, XappConfig)
    assert cfg.scheme == "pallas" and cfg.fallback == "ctho"
    assert cfg.scheduler.alpha == 0.8 and cfg.scheduler.t_max_s == 5.0
    assert cfg.predictor.a3.offset_db == 3.0 and cfg.association_map_path == ""
    assert cfg.scheduler.default_goodput_bytes_per_s == pytest.approx(100e6 / 8)
    assert cfg.agent_for_cell(41959425) == AgentEndpoint(
        "edge-a", "gnb_001_001_00000a01",
        "pallas-agent-edge-a.pallas.svc.cluster.local:50051",
        "pallas-agent-edge-a.pallas.svc.cluster.local:50052")
    assert cfg.agent_for_cell(12345) is None
    assert cfg.agent_for_e2_node("gnb_001_001_00000a02").agent_id == "edge-b"
    assert cfg.e2_nodes == ("gnb_001_001_00000a01", "gnb_001_001_00000a02")
    assert cfg.e2.ran_functions == {3: "rc", 2: "kpm"}
    assert cfg.e2.rc_ran_function_ids == (3,) and cfg.e2.kpm_ran_function_ids == (2,)
    assert (cfg.e2.rc_ran_function_id, cfg.e2.kpm_ran_function_id) == (3, 2)
    assert cfg.e2.kpm_measurements["L1M.SS-RSRP"] == "rsrp_dbm"
    assert cfg.a1.policy_type_id == 26001


def test_config_file_env_is_the_default_path(monkeypatch):
    monkeypatch.setenv("CONFIG_FILE", str(DESCRIPTORS / "config-file.json"))
    assert load_config_file().a1.handler_id == "pallas"
    monkeypatch.delenv("CONFIG_FILE")
    with pytest.raises(ConfigError, match="CONFIG_FILE"):
        load_config_file()


def test_unreadable_or_non_json_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config_file(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"controls": ')
    with pytest.raises(ConfigError, match="line 1 column"):
        load_config_file(bad)
    with pytest.raises(ConfigError, match="no 'controls' section"):
        from_descriptor({"name": "pallas"})
    deep = tmp_path / "deep.json"
    deep.write_text('{"controls": ' * 50_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config_file(deep)
    latin = tmp_path / "latin1.json"
    latin.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(ConfigError, match="not JSON: 'utf-8' codec"):
        load_config_file(latin)


def _set(path, value):
    def f(c):
        *head, last = path
        for k in head:
            c = c[k]
        c[last] = value
    return f


def _drop(path):
    def f(c):
        *head, last = path
        for k in head:
            c = c[k]
        del c[last]
    return f


@pytest.mark.parametrize("mutate, field, words", [
    (_set(("scheduler", "alpha"), 1.2), "controls.scheduler.alpha", "maximum of 1"),
    (_set(("scheduler", "dt_s"), 0), "controls.scheduler.dt_s", "less than the minimum of 0.01"),
    (_set(("scheduler", "t_max_s"), "5"), "controls.scheduler.t_max_s", "not of type 'number'"),
    (_drop(("scheduler", "c_sync_s")), "controls.scheduler", "'c_sync_s' is a required property"),
    (_set(("scheduler", "alfa"), 0.5), "controls.scheduler", "'alfa' was unexpected"),
    (_set(("predictor", "mode"), "oracle"), "controls.predictor.mode", "is not one of"),
    (_set(("predictor", "a3", "min_points"), 1), "controls.predictor.a3.min_points", "less than the minimum of 2"),
    (_set(("predictor", "cvh", "tile"), 30), "controls.predictor.cvh", "'tile' was unexpected"),
    (_set(("agents", "edge-a", "control_address"), "edge-a"), "controls.agents.edge-a.control_address",
     "does not match"),
    (_set(("cells", "cell-7"), "edge-a"), "controls.cells", "'cell-7' does not match"),
    (_set(("e2", "ran_functions", "4096"), "rc"), "controls.e2.ran_functions", "'4096' does not match"),
    (_set(("e2", "ran_functions", "3"), "ni"), "controls.e2.ran_functions.3", "'ni' is not one of"),
    (_set(("e2", "kpm_measurements", "DRB.UEThpDl"), "throughput"), "controls.e2.kpm_measurements.DRB.UEThpDl",
     "is not one of"),
    (_set(("proactive", "slices", "1-xyz"), True), "controls.proactive.slices", "'1-xyz' does not match"),
    (_set(("scheme",), "magic"), "controls.scheme", "is not one of"),
])
def test_invalid_variants_are_refused_naming_the_field(mutate, field, words):
    c = copy.deepcopy(BASE)
    mutate(c)
    assert not Draft7Validator(SCHEMA).is_valid(c)
    with pytest.raises(ConfigError) as ei:
        load_controls(c)
    assert any(p == field and words in m for p, m in ei.value.errors), ei.value.errors
    assert field in str(ei.value)


def test_every_violation_is_listed_not_only_the_first():
    c = copy.deepcopy(BASE)
    c["scheduler"]["alpha"] = 3
    c["predictor"]["a3"]["horizon_s"] = -1
    with pytest.raises(ConfigError) as ei:
        load_controls(c)
    assert {p for p, _ in ei.value.errors} == {"controls.scheduler.alpha", "controls.predictor.a3.horizon_s"}


def test_valid_variants_load():
    c = copy.deepcopy(BASE)
    c["cells"] = {"0": "edge-a", "68719476735": "nowhere"}   # an unknown agent = no edge agent there
    c["agents"] = {}
    c["e2"]["kpm_measurements"] = {}
    c["e2"]["ran_functions"] = {"0": "rc", "4095": "rc"}
    c["proactive"] = {"enabled": False, "cells": {"0": True}, "slices": {"1-00000A": False}}
    cfg = load_controls(c)
    assert cfg.agent_for_cell(68719476735) is None and cfg.unmapped_cells == (0, 68719476735)
    assert cfg.e2.rc_ran_function_ids == (0, 4095) and cfg.e2.kpm_ran_function_ids == ()
    assert cfg.e2.rc_ran_function_id == 0 and cfg.e2.kpm_ran_function_id is None
    assert cfg.proactive.allows(0, 5) is True            # a cell rule says yes
    assert cfg.proactive.allows(0, 5, "1-00000A") is False  # the slice rule says no: no wins
    assert cfg.proactive.allows(4, 5) is False           # no rule: the default (off)


def test_a_changed_descriptor_replaces_the_config_and_a_bad_one_keeps_it(descriptor):
    first = reload_descriptor(descriptor, None)
    assert first.scheduler.alpha == 0.8
    descriptor["controls"]["scheduler"]["alpha"] = 0.6
    second = reload_descriptor(descriptor, first)
    assert second is not first and second.scheduler.alpha == 0.6
    descriptor["controls"]["scheduler"]["alpha"] = "high"
    assert reload_descriptor(descriptor, second) is second
    assert reload_descriptor({"name": "pallas"}, None) is None


def test_nan_and_infinity_are_not_json_numbers(tmp_path, descriptor):
    c = copy.deepcopy(BASE)
    c["scheduler"]["stale_age_s"] = float("inf")
    c["predictor"]["a3"]["offset_db"] = float("nan")
    with pytest.raises(ConfigError) as ei:
        load_controls(c)
    assert [p for p, _ in ei.value.errors] == ["controls.scheduler.stale_age_s", "controls.predictor.a3.offset_db"]
    f = tmp_path / "c.json"
    f.write_text(json.dumps(descriptor).replace('"stale_age_s": 5.0', '"stale_age_s": Infinity'))
    with pytest.raises(ConfigError, match="Infinity is not a JSON number"):
        load_config_file(f)


def test_integral_floats_in_integer_fields_load_as_integers():
    # JSON Schema counts 4.0 as an integer, so onboarding accepts it; the typed config must too
    c = copy.deepcopy(BASE)
    c["predictor"]["a3"]["min_points"] = 4.0
    c["e2"]["report_period_ms"] = 100.0
    cfg = load_controls(c)
    assert type(cfg.predictor.a3.min_points) is int and cfg.e2.report_period_ms == 100
    c["predictor"]["a3"]["min_points"] = 4.5
    with pytest.raises(ConfigError, match=r"controls\.predictor\.a3\.min_points: 4\.5 is not of type 'integer'"):
        load_controls(c)


def test_predictor_fields_may_be_left_to_their_defaults():
    c = copy.deepcopy(BASE)
    c["predictor"] = {"mode": "a3", "a3": {"offset_db": 2.0}}
    cfg = load_controls(c)
    assert cfg.predictor.mode == "a3" and cfg.predictor.a3.offset_db == 2.0


# -- the loader and the schema agree on arbitrary edits of the shipped controls --------------

_LEAF_PATHS = []


def _walk(node, path):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            _walk(v, path + (k,))
    elif path:
        _LEAF_PATHS.append(path)


_walk(BASE, ())
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from([0, 0.5, 1, 2.0, 4095, True, False, "", "pallas", "ctho", "a3", "h:1", "edge-a",
                       "1-00000a", "41959425", "http://x/ric/v1"]),
    lambda ch: st.lists(ch, max_size=3) | st.dictionaries(st.text(max_size=6), ch, max_size=3),
    max_leaves=5)


@settings(max_examples=150, deadline=None)
@given(edits=st.lists(st.tuples(st.sampled_from(_LEAF_PATHS),
                                _json | st.floats(-1, 100) | st.integers(-1, 70000) | st.booleans(),
                                st.sampled_from([False, False, False, True])), min_size=1, max_size=2))
def test_loader_accepts_exactly_what_the_schema_accepts(edits):
    c = copy.deepcopy(BASE)
    for path, value, drop in edits:
        node = c
        for k in path[:-1]:
            if not isinstance(node, dict) or k not in node:
                break
            node = node[k]
        else:
            if isinstance(node, dict):
                if drop:
                    node.pop(path[-1], None)
                else:
                    node[path[-1]] = value
    valid = Draft7Validator(SCHEMA).is_valid(c)
    try:
        load_controls(c)
        loaded = True
    except ConfigError:
        loaded = False
    event(f"valid={valid}")
    assert loaded == valid


def test_every_scheme_the_schema_allows_maps_to_the_wire_enum():
    from pallas_proto import pallas_pb2
    from xapp.policy import scheme_value

    for key in ("scheme", "fallback"):
        for name in SCHEMA["definitions"][key]["enum"]:
            assert scheme_value(name) == pallas_pb2.Scheme.Value(f"SCHEME_{name.upper().replace('-', '_')}"), name


@settings(max_examples=120, deadline=None, derandomize=True)
@given(raw=descriptor_files())
def test_mutated_descriptor_files_load_or_are_refused_with_a_clear_error(raw):
    """Fuzzing with a fixed budget (issue 16): descriptor files (the shipped one edited and
    byte-mutated) read as $CONFIG_FILE: a configuration exactly when the schema accepts the
    controls, else a ConfigError naming the field or the file; never another exception. The
    long run by hand is benchmarks/fuzz.py --parser descriptor."""
    _CHECK_DESCRIPTOR(raw)
