"""Controls overlays (pallas_common/controls.py): deep merge, one-setting parsing, profiles."""

import json

import pytest

from pallas_common.controls import PROFILES_DIR, load_profile, merge_controls, parse_setting


def test_merge_is_deep_and_leaves_both_inputs_alone():
    base = {"predictor": {"a3": {"offset_db": 3.0, "ttt_s": 0.32}, "w_cvh": 0.5}, "scheme": "pallas"}
    over = {"predictor": {"a3": {"ttt_s": 0.0}}, "scheduler": {"targets_k": 2}, "scheme": "ctho"}
    before = json.dumps(base), json.dumps(over)
    out = merge_controls(base, over)
    assert out == {"predictor": {"a3": {"offset_db": 3.0, "ttt_s": 0.0}, "w_cvh": 0.5}, "scheme": "ctho",
                   "scheduler": {"targets_k": 2}}
    assert (json.dumps(base), json.dumps(over)) == before
    out["predictor"]["a3"]["offset_db"] = 9.0
    assert base["predictor"]["a3"]["offset_db"] == 3.0


def test_a_non_object_replaces_an_object_and_the_other_way():
    assert merge_controls({"a": {"b": 1}}, {"a": 5}) == {"a": 5}
    assert merge_controls({"a": 5}, {"a": {"b": 1}}) == {"a": {"b": 1}}


@pytest.mark.parametrize("expr, want", [
    ("scheduler.targets_k=2", {"scheduler": {"targets_k": 2}}),
    ("predictor.a3.trend=all_pairs", {"predictor": {"a3": {"trend": "all_pairs"}}}),
    ('predictor.a3.trend="all_pairs"', {"predictor": {"a3": {"trend": "all_pairs"}}}),
    ("predictor.dwell_edge=true", {"predictor": {"dwell_edge": True}}),
    ("scheduler.targets_split=0.6", {"scheduler": {"targets_split": 0.6}}),
    ("a.b=", {"a": {"b": ""}}),
])
def test_a_setting_reads_its_value_as_json_else_text(expr, want):
    assert parse_setting(expr) == want


@pytest.mark.parametrize("expr", ["targets_k=2", "scheduler.targets_k", ".x=1", "a..b=1", "=1"])
def test_a_malformed_setting_is_refused(expr):
    with pytest.raises(ValueError, match="section.key=VALUE"):
        parse_setting(expr)


def test_profiles_load_by_name_or_path_and_bad_ones_are_refused(tmp_path):
    assert "predictor" in load_profile("drive-log")
    assert load_profile(str(PROFILES_DIR / "drive-log.json")) == load_profile("drive-log")
    with pytest.raises(ValueError, match="drive-log"):
        load_profile("no-such")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not readable as JSON"):
        load_profile(str(bad))
    bad.write_text('{"predictor": 3}')
    with pytest.raises(ValueError, match="object of controls sections"):
        load_profile(str(bad))
