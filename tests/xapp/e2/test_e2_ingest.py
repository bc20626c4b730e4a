"""Ingestion: indications -> tracks; malformed input logged with a reason and dropped."""

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from prometheus_client import CollectorRegistry

from xapp.e2.rrc import CellResult
from xapp.e2.ingest import IngestConfig, Ingestor
from xapp.tracks import TrackStore


def test_rc_message_copy_becomes_a_track_report(e2):
    ing = Ingestor(TrackStore(capacity=8))
    nbs = (CellResult(7, -101.0, -12.5, 3.0), CellResult(-1, -110.0))
    b = e2.rc_indication(e2.ue(11), e2.rrc(-95.0, -11.0, 9.5, 12, nbs, 51.9, -8.4, 10.0, 45.0), cell=0xA81B0C)
    (r,) = ing.on_indication(b, "gnb_001_01_0000a81b", t=100.0)
    assert (r.ue_id, r.serving_cell, r.serving_pci, r.e2_node) == ("11", 0xA81B0C, 12, "gnb_001_01_0000a81b")
    assert (r.rsrp_dbm, r.rsrq_db, r.sinr_db) == (-95.0, -11.0, 9.5)
    assert [(n.pci, n.rsrp_dbm) for n in r.neighbours] == [(7, -101.0), (-1, -110.0)]
    assert abs(r.lat - 51.9) < 1e-5 and abs(r.lon + 8.4) < 2e-5
    assert r.speed_mps == 36 / 3.6 and r.heading_deg == 45.0
    v = ing.store.get("11").view()
    assert v.rsrp_dbm.tolist() == [-95.0] and v.nb_pci[0, :2].tolist() == [7, -1]
    assert ing.stats["reports"] == 1


def test_kpm_format3_reports_per_ue_with_configured_names(e2):
    cfg = IngestConfig(kpm_measurements={"my.rsrp": "rsrp_dbm", "my.sinr": "sinr_db"})
    store = TrackStore()
    ing = Ingestor(store, cfg)
    ing.on_indication(e2.rc_indication(e2.ue(1), e2.rrc()), "n", t=1.0)  # learn UE 1's serving cell
    b = e2.kpm_indication([(e2.ue(1), [("my.rsrp", -90.0), ("my.sinr", 4)]),
                           (e2.ue(2), [("my.rsrp", -80.5), ("other.name", 3)])])
    reps = ing.on_indication(b, "n", t=2.0)
    assert [(r.ue_id, r.rsrp_dbm, r.serving_cell) for r in reps] == [("1", -90.0, 0xA81B0C), ("2", -80.5, -1)]
    assert reps[0].sinr_db == 4.0 and math.isnan(reps[1].sinr_db)
    # a name the xApp does not map is kept as a value, not an error (issue 14)
    assert ing.kpm_values["2"] == {"my.rsrp": -80.5, "other.name": 3}
    assert not any(k.startswith("dropped:") for k in ing.stats)
    out = ing.on_indication(e2.kpm_indication([(e2.ue(3), [("my.rsrp", 1e300), ("my.sinr", 2.0)])]), "n", t=3.0)
    assert [(r.ue_id, r.sinr_db) for r in out] == [("3", 2.0)] and math.isnan(out[0].rsrp_dbm)
    assert ing.stats["dropped:value out of range"] == 1


def test_unknown_ran_function_and_unsupported_format_are_dropped_with_reason(e2):
    ing = Ingestor(TrackStore())
    assert ing.on_indication(e2.rc_indication(e2.ue(), e2.rrc(), rf=77), "n", t=1.0) == []
    assert ing.stats["dropped:unknown RAN function"] == 1
    # an RC payload on the KPM RAN function: the KPM decoder rejects it
    assert ing.on_indication(e2.rc_indication(e2.ue(), e2.rrc(), rf=2), "n", t=1.0) == []
    assert any(k.startswith("dropped:E2SM-KPM") for k in ing.stats)
    assert len(ing.store) == 0


def test_out_of_order_report_is_dropped_and_track_kept(e2):
    ing = Ingestor(TrackStore())
    ing.on_indication(e2.rc_indication(e2.ue(), e2.rrc(-90.0)), "n", t=10.0)
    assert ing.on_indication(e2.rc_indication(e2.ue(), e2.rrc(-80.0)), "n", t=5.0) == []
    assert ing.store.get("7").view().rsrp_dbm.tolist() == [-90.0]
    assert any(k.startswith("dropped:out of order") for k in ing.stats)


def test_common_shape_counts_and_its_drops_match_the_general_path(e2):
    # the one-report fast path of on_indication counts what the general loop counts: the
    # report and its reference signal; an older report is dropped as out of order (the track
    # and the report count kept); a non-finite time is dropped by the general path's check
    ing = Ingestor(TrackStore())
    b = e2.rc_indication(e2.ue(), e2.rrc(-90.0))
    assert [r.time for r in ing.on_indication(b, "n", t=10.0)] == [10.0]
    assert ing.on_indication(b, "n", t=5.0) == []
    assert ing.on_indication(b, "n", t=math.nan) == []
    assert ing.on_indication(b, "n", t=math.inf) == []
    assert (ing.stats["indications"], ing.stats["reports"], ing.stats["rs:ssb"]) == (4, 1, 1)
    assert ing.stats["dropped:out of order"] == 1 and ing.stats["dropped:non-finite report time"] == 2
    assert ing.store.get("7").view().time.tolist() == [10.0]


def test_metrics_count_outcomes(e2):
    reg = CollectorRegistry()
    ing = Ingestor(TrackStore(), registry=reg)
    ing.on_indication(e2.rc_indication(e2.ue(), e2.rrc()), "n", t=1.0)
    ing.on_indication(b"\x00garbage", "n", t=2.0)
    assert reg.get_sample_value("pallas_e2_indications_total", {"outcome": "ok"}) == 1
    assert reg.get_sample_value("pallas_e2_indications_total", {"outcome": "dropped"}) == 1
    assert reg.get_sample_value("pallas_e2_reports_total") == 1


def _mutate(rng: random.Random, b: bytes) -> bytes:
    kind = rng.randrange(5)
    if kind == 0:
        return b[:rng.randrange(len(b))]                       # truncated
    x = bytearray(b)
    if kind == 1:
        for _ in range(rng.randrange(1, 4)):                   # bit flips
            i = rng.randrange(len(x))
            x[i] ^= 1 << rng.randrange(8)
    elif kind == 2:
        x[rng.randrange(len(x))] = rng.randrange(256)          # one octet replaced
    elif kind == 3:
        x += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))  # trailing garbage
    else:
        i = rng.randrange(len(x))
        del x[i:i + rng.randrange(1, 6)]                       # octets removed
    return bytes(x)


def test_fuzz_mutated_pdus_never_escape_and_never_touch_other_ues(e2):
    """Many mutated/truncated PDUs from 'victim' UEs interleaved with clean reports of
    'bystander' UEs: no exception escapes, and the bystanders' tracks are exactly those of a
    run without the bad PDUs."""
    rng = random.Random(2026)
    fuzzed, control = Ingestor(TrackStore(capacity=64)), Ingestor(TrackStore(capacity=64))
    sources = [e2.rc_indication(e2.ue(900 + i), e2.random_rrc(rng), sn=i) for i in range(20)]
    sources += [e2.kpm_indication([(e2.ue(950 + i), [("L1M.SS-RSRP", -90.0 - i), ("L1M.SS-SINR", 5)])]) for i in range(5)]
    t = 0.0
    n_bad = 0
    for step in range(600):
        t += 0.01
        by = step % 3
        good = e2.rc_indication(e2.ue(by + 1), e2.rrc(-80.0 - step % 40, -10.0, 5.0, pci=step % 1008), sn=step)
        fuzzed.on_indication(good, "n", t=t)
        control.on_indication(good, "n", t=t)
        for _ in range(3):
            bad = _mutate(rng, rng.choice(sources))
            n_bad += 1
            out = fuzzed.on_indication(bad, "n", t=t)
            assert all(r.ue_id not in ("1", "2", "3") for r in out)
    for ue in ("1", "2", "3"):
        a, b = fuzzed.store.get(ue).view(), control.store.get(ue).view()
        for f in a._fields:
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    dropped = sum(v for k, v in fuzzed.stats.items() if k.startswith("dropped:"))
    assert fuzzed.stats["indications"] == 600 + n_bad
    assert dropped > n_bad * 0.5  # most mutations are caught; the rest decode as other values
    assert not any(k.startswith("dropped:internal error") for k in fuzzed.stats), fuzzed.stats


@pytest.mark.parametrize("payload", [b"", b"\x00", b"\xff" * 40, bytes(range(256))])
def test_garbage_is_dropped_with_a_reason(payload, capsys):
    ing = Ingestor(TrackStore())
    assert ing.on_indication(payload, "n", t=0.0) == []
    assert sum(v for k, v in ing.stats.items() if k.startswith("dropped:E2AP")) == 1


def _builders():
    """The builders behind the ``e2`` fixture, loaded by path (hypothesis strategies need them
    at import time, and several test folders have a module named conftest)."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("e2_builders", Path(__file__).with_name("conftest.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


e2b = _builders()


def _seed_pdus(e2=e2b):
    rng = random.Random(11)
    full = e2.rrc(-95.0, -12.0, 8.0, pci=7, nbs=(CellResult(3, -101.0, -15.0, 2.0),),
                  lat=51.9, lon=-8.4, speed=12.0, heading=181.0)
    return ([e2.rc_indication(e2.ue(900), full), e2.rc_indication(e2.ue(901), e2.rrc())]
            + [e2.rc_indication(e2.ue(902 + i), e2.random_rrc(rng)) for i in range(4)]
            + [e2.kpm_indication([(e2.ue(950), [("L1M.SS-RSRP", -90.0), ("L1M.SS-SINR", 5)])])])


_SEEDS = _seed_pdus()
_edits = st.lists(st.tuples(st.sampled_from(["flip", "set", "cut", "insert", "delete"]),
                            st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4)


def _apply(pdu: bytes, edits) -> bytes:
    x = bytearray(pdu)
    for kind, pos, val in edits:
        i = pos % max(len(x), 1)
        if kind == "flip" and x:
            x[i] ^= 1 << (val % 8)
        elif kind == "set" and x:
            x[i] = val
        elif kind == "cut":
            del x[i:]
        elif kind == "insert":
            x[i:i] = bytes([val])
        elif x:
            del x[i:i + 1 + val % 5]
    return bytes(x)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(_SEEDS), edits=_edits, junk=st.binary(max_size=64), raw=st.booleans())
def test_hypothesis_mutated_pdus_are_dropped_with_a_decode_reason_never_an_internal_error(seed, edits, junk, raw):
    """Mutated RC/KPM indications (with position and velocity, which take the pycrate LPP
    fallback) or plain junk: nothing escapes, nothing is dropped as an internal error (that
    is, every failure is a decoding reason), and a bystander UE's track is untouched."""
    e2 = e2b
    ing = Ingestor(TrackStore())
    ing.on_indication(e2.rc_indication(e2.ue(1), e2.rrc(-80.0)), "n", t=1.0)
    out = ing.on_indication(junk if raw else _apply(seed, edits), "n", t=2.0)
    assert all(r.ue_id != "1" for r in out)
    assert ing.store.get("1").view().rsrp_dbm.tolist() == [-80.0]
    assert not any(k.startswith("dropped:internal error") for k in ing.stats), ing.stats
    assert ing.stats["indications"] == 2


def test_kpm_values_keep_max_kpm_ues_and_forget_the_oldest_past_it(e2):
    """Issue 16: KPM values per UE are kept for at most ``max_kpm_ues`` UEs (the least recently
    reported goes first), whatever UE ids the E2 node sends."""
    ing = Ingestor(TrackStore(), IngestConfig(kpm_measurements={"my.rsrp": "rsrp_dbm"}),
                   max_kpm_ues=3)
    for k in range(1, 4):
        ing.on_indication(e2.kpm_indication([(e2.ue(k), [("my.rsrp", -90.0 - k)])]), "n", t=float(k))
    at_cap = sorted(ing.kpm_values)
    ing.on_indication(e2.kpm_indication([(e2.ue(4), [("my.rsrp", -80.0)])]), "n", t=5.0)
    assert at_cap == ["1", "2", "3"] and sorted(ing.kpm_values) == ["2", "3", "4"]
