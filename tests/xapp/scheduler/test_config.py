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
