"""Fixtures for the Scheduler Engine tests."""

from __future__ import annotations

import pytest

from xapp.scheduler import SchedulerConfig


@pytest.fixture
def cfg() -> SchedulerConfig:
    return SchedulerConfig(default_goodput_mbps=300.0, default_prefill_rate_tps=2700.0,
                           default_decode_rate_tps=30.0, stale_age_s=5.0)
