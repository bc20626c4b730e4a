"""Telemetry: vLLM /metrics parsing, measured r_p and decode rates, report assembly."""

from __future__ import annotations

import pytest
from pallas_proto import pallas_pb2 as pb

from agent.session import Session
from agent.meter import Ewma, TelemetryCollector, VllmScraper, parse_vllm_metrics

EXPO = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="16384"} 1.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} %(gen)s
# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} %(pt)s
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 3.0
# HELP vllm:request_prefill_kv_computed_tokens Histogram of new KV tokens computed during prefill.
# TYPE vllm:request_prefill_kv_computed_tokens histogram
vllm:request_prefill_kv_computed_tokens_sum{engine="0",model_name="m"} %(pk)s
vllm:request_prefill_kv_computed_tokens_count{engine="0",model_name="m"} 3.0
"""


def test_parse_and_rates_from_two_scrapes():
    m0 = parse_vllm_metrics(EXPO % {"gen": 100, "pt": 1.0, "pk": 1000}, at=10.0)
    assert (m0.total_blocks, m0.block_size, m0.free_blocks) == (16384, 32, 12288)
    assert m0.prefill_tokens == 1000 and m0.prefill_time_s == 1.0 and m0.generation_tokens == 100
    sc = VllmScraper("http://x", alpha=0.5, min_prefill_tokens=64)
    sc.observe(m0)
    assert sc.prefill_rate.value is None  # one scrape is no rate
    sc.observe(parse_vllm_metrics(EXPO % {"gen": 150, "pt": 1.5, "pk": 2000}, at=12.0))
    assert sc.prefill_rate.value == pytest.approx(2000.0) and sc.decode_rate.value == pytest.approx(25.0)
    # A one-token resume measures step overhead, not r_p: it is not a sample.
    sc.observe(parse_vllm_metrics(EXPO % {"gen": 150, "pt": 1.6, "pk": 2001}, at=13.0))
    assert sc.prefill_rate.value == pytest.approx(2000.0)
    sc.observe_prefill(256, 0.5)  # a probe: 512 tok/s, EWMA 0.5
    assert sc.prefill_rate.value == pytest.approx(1256.0)


def test_ewma_and_bad_input():
    e = Ewma(0.3)
    assert e.update(10) == 10 and e.update(20) == pytest.approx(13.0) and e.update(float("nan")) == pytest.approx(13.0)
    with pytest.raises(ValueError):
        Ewma(0.0)
    with pytest.raises(ValueError):
        parse_vllm_metrics("this is { not prometheus")


def test_report_combines_sessions_server_and_peers():
    s = Session("s", "ue", [1] * 10, output_token_ids=[2] * 5, token_times=[0.0, 0.1, 0.2, 0.3, 0.4])
    sc = VllmScraper("http://x")
    sc.observe_prefill(1000, 0.5)
    col = TelemetryCollector("a", lambda: [s], scraper=sc,
                             identity=lambda: pb.ModelIdentity(model="m", block_size=32),
                             peers=lambda: [pb.PeerTelemetry(agent_id="b", goodput_bytes_per_s=3e7, bytes_sent=10),
                                            pb.PeerTelemetry(agent_id="c", bytes_sent=7)],
                             kv_blocks=lambda: (100, 400))
    r = col.report()
    assert r.sessions[0].tokens == 15 and r.sessions[0].decode_rate == pytest.approx(10.0)
    assert r.sessions[0].remaining_tokens == 123 and r.sessions[0].state == "new"
    assert r.server.prefill_rate == pytest.approx(2000.0)
    assert (r.server.free_kv_blocks, r.server.total_kv_blocks) == (100, 400) and r.server.model.model == "m"
    assert [p.agent_id for p in r.peers] == ["b", "c"] and r.peers[1].bytes_sent == 7
    # The decode rate is smoothed over reports (EWMA) and forgets finished sessions.
    s.output_token_ids.append(2)
    s.token_times.append(0.45)
    r2 = col.report()
    assert 10.0 < r2.sessions[0].decode_rate < 11.0
    col.sessions = lambda: []
    col.report()
    assert col._rd == {}


def test_reported_r_p_is_the_warmups_while_fresh_then_the_engines():
    """Issue 13 item 3: the r_p the xApp decides with is what a migration gets at this target
    (its warm-ups, queueing included), not vLLM's per-request figure that starts timing only
    once a request is scheduled; a stale warm-up sample gives way to the engine's figure."""
    sc = VllmScraper("http://x", alpha=0.5, warmup_fresh_s=30.0)
    sc.observe(parse_vllm_metrics(EXPO % {"gen": 100, "pt": 1.0, "pk": 1000}, at=10.0))
    sc.observe(parse_vllm_metrics(EXPO % {"gen": 150, "pt": 1.5, "pk": 2000}, at=12.0))   # 2,000 tok/s
    assert sc.migration_prefill_rate()[0] == pytest.approx(2000.0)
    sc.observe_prefill(448, 1.0, warmup=True)                       # a warm-up that queued: 448 tok/s
    r_p, at = sc.migration_prefill_rate()
    assert r_p == pytest.approx(448.0) and at == sc.warmup_measured_at > 0
    col = TelemetryCollector("a", lambda: [], scraper=sc)
    assert col.report().server.prefill_rate == pytest.approx(448.0)
    assert sc.migration_prefill_rate(now=at + 31.0)[0] == pytest.approx(sc.prefill_rate.value)
    assert VllmScraper("http://y").migration_prefill_rate() == (0.0, 0.0)
