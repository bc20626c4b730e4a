"""Fuzzing with a fixed budget (issue 16): mutations of valid PDUs of every format through the
whole decode path. A malformed PDU is a counted drop, never an exception out of ingest. The long
run by hand is ``benchmarks/e2_fuzz.py``."""

import logging

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xapp.e2.ingest import Dropped, IngestConfig, Ingestor, decode_indication
from xapp.e2.tracegen import sample_pdus
from xapp.tracks import TrackStore

SEEDS = sample_pdus()
NAMES = sorted(SEEDS)


@st.composite
def mutated(draw):
    name = draw(st.sampled_from(NAMES))
    x = bytearray(SEEDS[name])
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, max(0, len(x) - 1)))
        op = draw(st.integers(0, 4))
        if op == 0 and x:
            x[i] ^= 1 << draw(st.integers(0, 7))
        elif op == 1 and x:
            x[i] = draw(st.integers(0, 255))
        elif op == 2:
            x[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == 3:
            del x[i:i + draw(st.integers(1, 8))]
        else:
            del x[i:]
    return name, bytes(x)


@pytest.fixture(autouse=True, scope="module")
def _quiet():
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    yield
    structlog.reset_defaults()


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_pdus_decode_or_drop_never_raise(case):
    name, x = case
    cfg = IngestConfig(sm_versions={"*": {"kpm": "2.03"}}) if "v2.03" in name else IngestConfig()
    try:
        d = decode_indication(x, "gnb", 1.0, cfg)
        assert len(d.reports) == len(d.rs)
    except Dropped as e:
        assert e.reason
    ing = Ingestor(TrackStore(), cfg)
    ing.on_indication(x, "gnb", 1.0)
    assert ing.stats["indications"] == 1
    assert not any(k.startswith("dropped:internal error") for k in ing.stats)


def test_every_seed_decodes():
    for name, b in SEEDS.items():
        cfg = IngestConfig(sm_versions={"*": {"kpm": "2.03"}}) if "v2.03" in name else IngestConfig()
        d = decode_indication(b, "gnb", 1.0, cfg)
        assert not d.dropped, name
        assert d.reports or d.kpm_values, name
