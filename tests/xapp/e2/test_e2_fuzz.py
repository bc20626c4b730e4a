"""Fuzzing with a fixed budget (issue 16): mutations of valid PDUs of every format through the
whole decode path. A malformed PDU is a counted drop, never an exception out of ingest. The long
run by hand is ``benchmarks/e2_fuzz.py``."""

import logging
from dataclasses import replace

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xapp.e2.ingest import Dropped, IngestConfig, Ingestor, decode_indication
from xapp.e2.e2ap import decode_ric_indication
from pallas_tools.tracegen import encode_ric_indication, sample_pdus
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


@st.composite
def layer_mutated(draw):
    """One E2SM layer (header or message) mutated, re-wrapped in a valid E2AP envelope."""
    name = draw(st.sampled_from(NAMES))
    ind = decode_ric_indication(SEEDS[name])
    which = draw(st.sampled_from(["header", "message"]))
    x = bytearray(getattr(ind, which))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, max(0, len(x) - 1)))
        op = draw(st.integers(0, 2))
        if op == 0 and x:
            x[i] ^= 1 << draw(st.integers(0, 7))
        elif op == 1:
            x[i:i] = draw(st.binary(min_size=1, max_size=4))
        else:
            del x[i:]
    return name, encode_ric_indication(replace(ind, **{which: bytes(x)}))


@pytest.fixture(autouse=True, scope="module")
def _quiet():
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    yield
    structlog.reset_defaults()


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutated(), layer_mutated()))
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


def test_drop_kinds_are_bounded_whatever_the_pdu_says():
    """Counted kinds come from the fixed text before ':' or ' (' (at most 60 characters), so
    attacker-chosen names or numbers in a PDU cannot grow Ingestor.stats without bound."""
    assert Ingestor._kind("Format 2 UE ID: unsupported UEID kind x (" + "N" * 150 + ")") == "Format 2 UE ID"
    assert Ingestor._kind("unknown RAN function: 77") == "unknown RAN function"
    assert Ingestor._kind("record count: measData item 9 has 3 values for 1 pairs (UE 5)") == "record count"
    assert len(Ingestor._kind("x" * 500)) == 60


# Found by benchmarks/e2_fuzz.py (seed 16, 100,000 inputs): a KPM v2.03 Format 3 message whose
# measRecord REAL has an exponent beyond a double; the Format 3 walker raised OverflowError (an
# internal error drop) instead of leaving the record to the reference decoder.
REAL_OVERFLOW = bytes.fromhex(
    "00054080bf000007001d00050000010001000500020002000f000101001b00020001001c0001000019000c0b"
    "08e8fe6f80000003676e62001a0080888086400080820000010000070000f1100200c160000100032003c005"
    "0348032056c557512603c0005f2003c0000b000d000200a04c314d2e53532d5253525001200000a05de30005"
    "4068000007001d00050000010001000500020003000f000101001b00020001001c000100001900111040000d"
    "6000000000070000f1100200c1001a002d2c00000100020418004408040bbde328d81ffbc65180df8f00a062"
    "8e01034c7a000504090000f110000a81b0c0")


def test_a_real_beyond_a_double_is_a_documented_drop():
    ing = Ingestor(TrackStore(max_ues=10), IngestConfig(sm_versions={"*": {"kpm": "2.03"}}))
    assert ing.on_indication(REAL_OVERFLOW, "gnb", 1.0) == []
    assert not any(k.startswith("dropped:internal error") for k in ing.stats), dict(ing.stats)
    assert ing.stats["dropped:E2SM-KPM v2.03"] == 1
