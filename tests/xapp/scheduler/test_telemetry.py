"""EWMA estimates with staleness fallback, and TelemetryReport ingestion."""

import numpy as np
import pytest

from pallas_proto import pallas_pb2
from xapp.scheduler import EwmaTable, SchedulerConfig, TelemetryStore

from sched_helpers import MODEL, server_report


def test_ewma_weights_the_newest_sample():
    t = EwmaTable("x", weight=0.3, stale_age_s=5.0, default=7.0)
    assert t.get("a", 0.0) == 7.0                      # unknown: default
    assert t.update("a", 100.0, 0.0)
    assert t.get("a", 0.0) == 100.0                    # the first sample starts the average
    t.update("a", 200.0, 1.0)
    assert t.get("a", 1.0) == pytest.approx(0.3 * 200 + 0.7 * 100)
    t.update("a", 50.0, 2.0)
    assert t.get("a", 2.0) == pytest.approx(0.3 * 50 + 0.7 * 130)


def test_stale_estimates_fall_back_and_restart():
    t = EwmaTable("x", weight=0.3, stale_age_s=5.0, default=7.0)
    t.update("a", 100.0, 0.0)
    assert t.get("a", 5.0) == 100.0 and t.is_fresh("a", 5.0)
    assert t.get("a", 5.01) == 7.0 and not t.is_fresh("a", 5.01)
    t.update("a", 40.0, 20.0)                          # after silence: no blend with 100
    assert t.get("a", 20.0) == 40.0


@pytest.mark.parametrize("bad", [0.0, -3.0, float("nan"), float("inf"), "fast", None])
def test_bad_samples_are_dropped(bad):
    t = EwmaTable("x", weight=0.3, stale_age_s=5.0, default=7.0)
    t.update("a", 100.0, 0.0)
    assert not t.update("a", bad, 1.0)
    assert t.get("a", 1.0) == 100.0


def test_vectorised_read_and_slot_reuse():
    t = EwmaTable("x", weight=0.5, stale_age_s=5.0, default=7.0, capacity=2)
    for i, key in enumerate("abcde"):                   # grows past the capacity
        t.update(key, 10.0 * (i + 1), float(i))
    slots = np.array([t.slot("a"), t.slot("e"), -1, t.slot("new")])
    got = t.read(slots, now=4.0)
    assert np.allclose(got, [10.0, 50.0, 7.0, 7.0])
    assert np.allclose(t.read(slots, now=5.5), [7.0, 50.0, 7.0, 7.0])   # "a" went stale
    s = t.slot("b")
    t.forget("b")
    assert "b" not in t and t.slot("f") == s and t.get("f", 4.0) == 7.0


def test_invalid_table_parameters():
    with pytest.raises(ValueError):
        EwmaTable("x", weight=0.0, stale_age_s=1.0, default=1.0)
    with pytest.raises(ValueError):
        EwmaTable("x", weight=0.5, stale_age_s=0.0, default=1.0)


def test_ingest_a_report():
    store = TelemetryStore(SchedulerConfig(default_goodput_mbps=100.0))
    sess = pallas_pb2.SessionTelemetry(session_id="s1", ue_id="ue1", tokens=1200, decode_rate=31.0,
                                       max_tokens=500, remaining_tokens=300, state="serving")
    nameless = pallas_pb2.SessionTelemetry(tokens=5)
    peer = pallas_pb2.PeerTelemetry(agent_id="b", goodput_bytes_per_s=30e6)
    out = store.ingest(server_report("a", 100.0, sessions=[sess, nameless], peers=[peer]))
    assert [s.session_id for s in out] == ["s1"]
    assert out[0].tokens == 1200 and out[0].remaining_tokens == 300 and out[0].agent_id == "a"
    assert store.prefill_rate("a", 100.0) == 2700.0
    assert store.decode_rate("s1", 100.0) == 31.0
    assert store.goodput_bytes_per_s("a", "b", 100.0) == 30e6
    assert store.goodput_bytes_per_s("b", "a", 100.0) == pytest.approx(12.5e6)   # default
    srv = store.server("a", 101.0)
    assert srv is not None and srv.model == MODEL and srv.free_kv_bytes == 100_000 * MODEL.block_bytes
    assert store.server("a", 106.0) is None and store.model_of("a") == MODEL     # stale, model kept
    assert store.ingest(pallas_pb2.TelemetryReport(time=1.0)) == []               # no agent: dropped
    store.forget_session("s1")
    assert store.decode_rate("s1", 100.0) == store.cfg.default_decode_rate_tps
