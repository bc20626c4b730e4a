"""The trigger margin from the predicted handover time's recent errors (issue 26 item 4;
xapp/scheduler/ho_timing.py) and its effect on the engine's trigger."""

import dataclasses
import math

import numpy as np
import pytest

from xapp.scheduler import SchedulerConfig, TriggerAction
from xapp.scheduler.config import SchedulerConfigError
from xapp.scheduler.ho_timing import MAX_ABS_ERROR_S, MIN_SAMPLES, HandoverTimingError

from test_engine import T0, add, expected_window, make_engine, run_until_trigger


def test_no_margin_until_enough_handovers_then_the_quantile():
    h = HandoverTimingError(quantile=0.8, max_margin_s=10.0, window=32)
    for k in range(MIN_SAMPLES - 1):
        assert h.observe(10.0, 7.0) == pytest.approx(3.0)      # HO 3 s before its prediction
        assert h.margin_s == 0.0
    errs = [3.0, 3.0, 1.0, 5.0, -2.0]
    for e in errs[MIN_SAMPLES - 1:]:
        h.observe(100.0 + e, 100.0)
    assert h.n == len(errs)
    assert h.margin_s == pytest.approx(np.quantile(errs, 0.8))


def test_the_margin_is_never_negative_and_never_above_its_cap():
    late = HandoverTimingError(quantile=0.8, max_margin_s=10.0)
    for _ in range(5):
        late.observe(10.0, 12.0)                                # HOs came 2 s after the prediction
    assert late.margin_s == 0.0
    capped = HandoverTimingError(quantile=0.8, max_margin_s=4.0)
    for _ in range(5):
        capped.observe(30.0, 10.0)
    assert capped.margin_s == 4.0


def test_no_usable_prediction_is_not_an_error():
    h = HandoverTimingError()
    assert h.observe(math.nan, 5.0) is None
    assert h.observe(math.inf, 5.0) is None
    assert h.observe(5.0 + MAX_ABS_ERROR_S + 1, 5.0) is None
    assert h.n == 0


def test_the_window_keeps_the_latest_and_reconfigure_trims_it():
    h = HandoverTimingError(quantile=1.0, max_margin_s=60.0, window=4)
    for e in [9.0, 1.0, 1.0, 1.0, 1.0]:
        h.observe(e, 0.0)
    assert h.errors.tolist() == [1.0, 1.0, 1.0, 1.0] and h.margin_s == 1.0   # the 9 s fell out
    h.configure(quantile=1.0, max_margin_s=0.5, window=3)
    assert h.n == 3 and h.margin_s == 0.5


@pytest.mark.parametrize("kw", [dict(quantile=1.1), dict(quantile=-0.1), dict(max_margin_s=-1.0),
                                dict(max_margin_s=math.nan), dict(window=0), dict(window=2.5)])
def test_out_of_range_parameters_are_refused(kw):
    with pytest.raises(ValueError):
        HandoverTimingError(**kw)


@pytest.mark.parametrize("data, key", [({"ho_timing_quantile": 1.5}, "ho_timing_quantile"),
                                       ({"ho_timing_max_margin_s": -1}, "ho_timing_max_margin_s"),
                                       ({"ho_timing_window": 0}, "ho_timing_window"),
                                       ({"ho_timing_window": 3.5}, "ho_timing_window")])
def test_the_config_bounds_the_knobs(data, key):
    with pytest.raises(SchedulerConfigError, match=key):
        SchedulerConfig.from_dict(data)
    assert SchedulerConfig.from_dict({}).ho_timing_window == 32      # defaulted, not required


def _early_engine(cfg, errors_s):
    eng = make_engine(cfg)
    for e in errors_s:
        eng.observe_ho_timing(T0 + e, T0)
    add(eng)
    return eng


def test_handovers_that_came_early_bring_the_trigger_forward_by_the_margin(cfg):
    """Predictions that were 3 s late: the trigger comes when t_HO_hat - 3 s - now falls to
    the window, i.e. about 3 s before the plain rule's trigger, with the window Eq. 9 picks
    for the shortened T_remain_hat."""
    t_ho = T0 + 10.0
    plain = _early_engine(cfg, [])
    plain.set_prediction("ue1", "b", t_ho)
    t_plain, _ = run_until_trigger(plain, T0, t_ho)
    eng = _early_engine(cfg, [3.0] * MIN_SAMPLES)
    assert eng.ho_timing.margin_s == pytest.approx(3.0)
    eng.set_prediction("ue1", "b", t_ho)
    t, acts = run_until_trigger(eng, T0, t_ho)
    assert isinstance(acts[0], TriggerAction)
    assert t_plain - t == pytest.approx(3.0, abs=0.25)
    t_remain = t_ho - 3.0 - t
    w = expected_window(cfg, 2850 + 30.0 * (t - T0), t_remain)
    assert acts[0].window_s == pytest.approx(w)
    assert w <= t_remain <= w + cfg.trigger_lookahead_s + 1e-9
    assert acts[0].predicted_handover_time == t_ho            # the prediction itself is kept


def test_a_margin_beyond_the_prediction_lead_triggers_at_once(cfg):
    """A 10 s margin and a prediction 6 s ahead: T_remain_hat < 0, so the first cycle
    triggers (window 0: the prefix the target can prefill is what exists now)."""
    eng = _early_engine(cfg, [10.0] * MIN_SAMPLES)
    eng.set_prediction("ue1", "b", T0 + 6.0)
    t, acts = run_until_trigger(eng, T0, T0 + 6.0)
    assert t == T0 and isinstance(acts[0], TriggerAction)


def test_the_cap_knob_takes_effect_on_reconfigure(cfg):
    """ho_timing_max_margin_s = 0 restores Eq. 9's literal rule: same errors, later trigger."""
    t_ho = T0 + 10.0
    eng = _early_engine(cfg, [3.0] * MIN_SAMPLES)
    eng.reconfigure(dataclasses.replace(cfg, ho_timing_max_margin_s=0.0))
    assert eng.ho_timing.margin_s == 0.0
    eng.set_prediction("ue1", "b", t_ho)
    t, _ = run_until_trigger(eng, T0, t_ho)
    plain = _early_engine(cfg, [])
    plain.set_prediction("ue1", "b", t_ho)
    assert t == run_until_trigger(plain, T0, t_ho)[0]


def test_the_default_cap_admits_a_ping_pong_stretchs_errors():
    """The UCC drive's ping-pong stretch (docs/real-drives.md "Replay a real drive") had recent errors whose
    0.8 quantile was about 25 s; the default cap must not cut that margin (it was 10 s, which put
    a trigger after its handover)."""
    h = HandoverTimingError(**{k: getattr(SchedulerConfig(), f"ho_timing_{k}")
                               for k in ("quantile", "max_margin_s", "window")})
    for e in [6.5, 4.75, 27.25, 8.5, 24.75]:
        h.observe(100.0 + e, 100.0)
    assert h.margin_s == pytest.approx(np.quantile([6.5, 4.75, 27.25, 8.5, 24.75], 0.8))
    assert h.margin_s > 20.0
