"""controls.scheduler.warmup_cost_weight takes effect where the trigger is decided."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from xapp.config import load_controls
from xapp.scheduler import SchedulerConfig, SchedulerConfigError, TriggerAction

from test_engine import T0, add, make_engine, run_until_trigger

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("lam, conf, fires", [(0.0, 0.2, True), (20.0, 0.2, False), (20.0, 1.0, True)])
def test_an_unlikely_target_waits_when_a_wasted_warmup_costs(cfg, lam, conf, fires):
    eng = make_engine(dataclasses.replace(cfg, warmup_cost_weight=lam))
    add(eng)
    t_ho = T0 + 8.0
    eng.set_prediction("ue1", "b", t_ho, confidence=conf)
    t, acts = run_until_trigger(eng, T0, t_ho)
    assert (len(acts) == 1 and isinstance(acts[0], TriggerAction)) is fires


def test_the_descriptor_knob_reaches_the_engine_config():
    controls = copy.deepcopy(json.loads((REPO / "descriptors" / "config-file.json").read_text())["controls"])
    assert load_controls(controls).scheduler.warmup_cost_weight == 0.0
    controls["scheduler"]["warmup_cost_weight"] = 3.5
    assert load_controls(controls).scheduler.warmup_cost_weight == 3.5
    del controls["scheduler"]["warmup_cost_weight"]          # optional: defaults to 0
    assert load_controls(controls).scheduler.warmup_cost_weight == 0.0
    controls["scheduler"]["warmup_cost_weight"] = -1.0
    with pytest.raises(ValueError, match="warmup_cost_weight"):
        load_controls(controls)


def test_weight_out_of_range_is_refused():
    with pytest.raises(SchedulerConfigError, match="warmup_cost_weight"):
        SchedulerConfig(warmup_cost_weight=101.0)
