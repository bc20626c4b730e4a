"""SchedulerConfig: defaults, the descriptor's section, and clear errors."""

import json
from pathlib import Path

import pytest

from pallas_common import timing
from xapp.scheduler import SchedulerConfig, SchedulerConfigError

REPO = Path(__file__).resolve().parents[3]


def test_defaults_follow_model_md():
    c = SchedulerConfig()
    assert (c.alpha, c.dt_s, c.t_max_s, c.control_period_s, c.ewma_weight) == (0.8, 0.1, 5.0, 0.1, 0.3)
    p = c.decision_params()
    assert (p.alpha, p.dt, p.t_max) == (0.8, 0.1, 5.0)
    assert p.trigger_lookahead == pytest.approx(c.control_period_s + c.rtt_s / 2)
    assert c.default_goodput_bytes_per_s == pytest.approx(100e6 / 8)


def test_decide_takes_the_config():
    inp = timing.WindowInputs(k_curr=2000, t_remain=3.0, block_size=16, r_p=2700, r_d=30,
                              bandwidth=37.5e6, s_kv=163_840, c_sync=0.05)
    c = SchedulerConfig(t_max_s=2.0)
    assert timing.decide(inp, c).window[0] == timing.decide(inp, c.decision_params()).window[0]
    assert timing.decide(inp, c).t_limit[0] == 2.0


def test_from_the_descriptor_section():
    path = REPO / "descriptors" / "config-file.json"
    if not path.exists():
        pytest.skip("descriptors/config-file.json not in this checkout")
    section = json.loads(path.read_text())["controls"]["scheduler"]
    c = SchedulerConfig.from_dict(section)
    assert c.to_dict() == {**SchedulerConfig().to_dict(), **{k: float(v) for k, v in section.items()}}


def test_round_trip_and_ints_accepted():
    c = SchedulerConfig.from_dict({"t_max_s": 3, "alpha": 1})
    assert c.t_max_s == 3.0 and isinstance(c.t_max_s, float)
    assert SchedulerConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("data, keys", [
    ({"alpha": 1.5}, ["alpha"]),
    ({"dt_s": 0}, ["dt_s"]),
    ({"ewma_weight": "0.3"}, ["ewma_weight"]),
    ({"c_sync_s": True}, ["c_sync_s"]),
    ({"bogus": 1, "also_bogus": 2}, ["also_bogus", "bogus"]),
    ({"alpha": -0.1, "t_max_s": float("nan")}, ["alpha", "t_max_s"]),
])
def test_errors_name_every_offending_key(data, keys):
    with pytest.raises(SchedulerConfigError) as err:
        SchedulerConfig.from_dict(data)
    assert [k for k, _ in err.value.errors] == keys
    for k in keys:
        assert k in str(err.value)


def test_not_a_mapping():
    with pytest.raises(SchedulerConfigError, match="mapping"):
        SchedulerConfig.from_dict([("alpha", 0.5)])


def test_the_descriptor_schema_has_the_same_fields_and_bounds():
    """controls.scheduler in descriptors/schema.json and SchedulerConfig agree: the same fields
    (tie_tol_s is the engine's own; the optional fixed_window_s and the defaulted ho_timing_*
    are not required) and the same bounds, inclusive or exclusive; the whole-number ones are
    "integer" there."""
    from dataclasses import fields
    from xapp.scheduler.config import _DEFAULTED, _INTEGRAL, _OPTIONAL, _RANGES
    props = json.loads((REPO / "descriptors" / "schema.json").read_text())["properties"]["scheduler"]
    names = {f.name for f in fields(SchedulerConfig)} - {"tie_tol_s"}
    assert set(props["properties"]) == names
    assert set(props["required"]) == names - _OPTIONAL - _DEFAULTED
    for name in names:
        p = props["properties"][name]
        lo, lo_inc, hi, hi_inc = _RANGES[name]
        assert p["type"] == ("integer" if name in _INTEGRAL else "number"), name
        assert (p.get("minimum"), p.get("exclusiveMinimum")) == ((lo, None) if lo_inc else (None, lo)), name
        assert (p.get("maximum"), p.get("exclusiveMaximum")) == ((hi, None) if hi_inc else (None, hi)), name


# --- the candidate-window grid is bounded (issue 14: {"dt_s": 1e-9, "t_max_s": 60} made ~6e10
# windows per cycle; issue 16: window parameters capped, tested at the limit and one past it)
def test_the_largest_grid_is_accepted():
    from xapp.scheduler.config import MAX_WINDOW_STEPS, MIN_DT_S
    c = SchedulerConfig.from_dict({"t_max_s": 60, "dt_s": MIN_DT_S})
    assert round(c.t_max_s / c.dt_s) == MAX_WINDOW_STEPS == 6000


@pytest.mark.parametrize("data, key", [
    ({"t_max_s": 60, "dt_s": 1e-9}, "dt_s"),                # the case
    ({"t_max_s": 60, "dt_s": 0.0099}, "dt_s"),              # just under the smallest step
    ({"t_max_s": 60.001, "dt_s": 0.01}, "t_max_s"),         # just over the largest window
])
def test_one_step_past_the_grid_limit_is_refused(data, key):
    with pytest.raises(SchedulerConfigError) as err:
        SchedulerConfig.from_dict(data)
    assert [k for k, _ in err.value.errors] == [key]


def test_the_window_count_bound_holds_in_code_whatever_the_field_bounds():
    """The ratio is checked on its own, so a later change of one field's range cannot reopen it."""
    import xapp.scheduler.config as sc
    saved = sc._RANGES["dt_s"]
    try:
        sc._RANGES["dt_s"] = (0.0, False, 1.0, True)
        with pytest.raises(SchedulerConfigError, match="t_max_s / dt_s must be <= 6000"):
            SchedulerConfig.from_dict({"t_max_s": 60, "dt_s": 60 / 6001})
        assert SchedulerConfig.from_dict({"t_max_s": 60, "dt_s": 60 / 6000}).dt_s == 0.01
    finally:
        sc._RANGES["dt_s"] = saved


def test_schema_policy_type_and_code_agree_on_the_grid_bounds():
    import json
    from pathlib import Path
    from xapp.scheduler.config import _RANGES, MAX_WINDOW_STEPS, MIN_DT_S
    d = Path(__file__).resolve().parents[3] / "descriptors"
    sched = json.loads((d / "schema.json").read_text())["properties"]["scheduler"]["properties"]
    ptype = json.loads((d / "policytype-26001.json").read_text())["create_schema"]["properties"]
    for where in (sched, ptype):
        assert where["dt_s"]["minimum"] == MIN_DT_S == _RANGES["dt_s"][0] and _RANGES["dt_s"][1]
        assert where["t_max_s"]["maximum"] == _RANGES["t_max_s"][2]
        assert where["t_max_s"]["maximum"] / where["dt_s"]["minimum"] == MAX_WINDOW_STEPS
