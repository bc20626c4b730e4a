"""The paper's regime emulated on a tiny model (pallas_eval/emulation.py, docs/model.md §9):
the emulated models' rates, the link scaling, each step's emulated duration and the paced
connector's worker side, with a fake clock."""

from __future__ import annotations

import json

import pytest

from pallas_eval import emulation as emu


def test_emulated_models_and_their_sources():
    q32 = emu.emulated_model("qwen3-32b")
    assert (q32.r_p, q32.r_d, q32.s_kv) == (1850.0, 25.0, 262_144.0)
    d = json.loads(emu.H200_RATES.read_text())
    pre = {m["model"]: sorted(x["tokens_per_s"] for x in m["prefill"]) for m in d["models"]}
    med = {k: v[len(v) // 2] for k, v in pre.items()}
    dec = {k: sum(x["tokens_per_s_per_request"] for x in v) / len(v) for k, v in d["graphed_decode"].items()}
    for name in ("qwen3-14b", "llama-3-8b"):
        m = emu.emulated_model(name)
        assert m.r_p == pytest.approx(1850 * med[name] / med["qwen3-32b"], abs=1)
        assert m.r_d == pytest.approx(25 * dec[name] / dec["qwen3-32b"], abs=0.1)
        assert q32.r_p < m.r_p and q32.r_d < m.r_d   # smaller models are faster
    assert emu.emulated_model("qwen3-14b").s_kv == 163_840 and emu.emulated_model("llama-3-8b").s_kv == 131_072
    with pytest.raises(ValueError, match="known: llama-3-8b, qwen3-14b, qwen3-32b"):
        emu.emulated_model("gpt-5")


def test_link_scaled_by_the_kv_size_ratio():
    # docs/model.md §9: 300 Mbit/s * 2,048 / 262,144 = 2.34 Mbit/s
    assert emu.emulated_peer_rate_mbps(2048, emu.emulated_model("qwen3-32b")) == pytest.approx(2.34375)
    # one token's KV then takes as long on the scaled link as the real model's on 300 Mbit/s
    m = emu.emulated_model("llama-3-8b")
    rate = emu.emulated_peer_rate_mbps(2048, m)
    assert 2048 * 8 / (rate * 1e6) == pytest.approx(m.s_kv * 8 / 300e6)
    with pytest.raises(ValueError):
        emu.emulated_peer_rate_mbps(0, m)


def test_step_seconds_prefill_and_decode():
    # 1,850 prompt tokens at 1,850 tok/s: one second; a decode step of three requests: one step (40 ms)
    assert emu.step_seconds({"a": 1850}, 1850, 25) == (1850, 0, pytest.approx(1.0))
    assert emu.step_seconds({"a": 1, "b": 1, "c": 1}, 1850, 25) == (0, 3, pytest.approx(0.04))
    # a mixed step costs its larger part (one pass: compute-bound chunk, weight-bound decode)
    p, d, s = emu.step_seconds({"a": 370, "b": 1}, 1850, 25)
    assert (p, d) == (370, 1) and s == pytest.approx(0.2)
    assert emu.step_seconds({"a": 37, "b": 1}, 1850, 25)[2] == pytest.approx(0.04)
    assert emu.step_seconds({}, 1850, 25) == (0, 0, 0.0)


def test_connector_flags_and_rates_are_checked():
    flags = emu.agent_flags(1850, 25, "/tmp/s.json")
    assert flags[:4] == ["--kv-connector-module", "pallas_eval.emulated_connector",
                         "--kv-connector-class", "EmulatedPallasConnector"]
    assert json.loads(flags[5]) == {"prefill_tokens_per_s": 1850.0, "decode_tokens_per_s": 25.0,
                                    "stats_path": "/tmp/s.json"}
    assert emu.server_settings(10, 5)["kv_connector_extra"] == {"prefill_tokens_per_s": 10.0,
                                                                 "decode_tokens_per_s": 5.0}
    for bad in (0, -3, "x"):
        with pytest.raises(ValueError, match="decode_tokens_per_s"):
            emu.connector_extra(100, bad)


def test_pace_stats_measure_rates_and_overruns():
    st = emu.PaceStats()
    st.observe(prefill=1000, decode=0, pace_s=0.5, work_s=0.1, total_s=0.5)
    st.observe(prefill=0, decode=2, pace_s=0.04, work_s=0.05, total_s=0.05)   # overran by 10 ms
    st.observe(prefill=0, decode=1, pace_s=0.04, work_s=0.01, total_s=0.03)
    st.observe(prefill=10, decode=1, pace_s=0.05, work_s=0.01, total_s=0.05)  # mixed: in neither rate
    assert st.measured_r_p() == pytest.approx(2000.0)
    assert st.measured_r_d() == pytest.approx(2 / 0.08)
    assert (st.steps, st.mixed_steps, st.overruns) == (4, 1, 1) and st.overrun_s == pytest.approx(0.01)
    assert emu.PaceStats().measured_r_p() is None


class _Clock:
    def __init__(self):
        self.now, self.slept = 100.0, []

    def __call__(self):
        return self.now

    def sleep(self, dt):
        self.slept.append(dt)
        self.now += dt


def _worker(clock, stats_path=None):
    """The paced connector's worker side without a vLLM config (its state set by hand)."""
    ec = pytest.importorskip("pallas_eval.emulated_connector")
    c = object.__new__(ec.EmulatedPallasConnector)
    c._connector_metadata = None
    c.worker, c.link, c.policy = None, None, None
    c.r_p, c.r_d, c._stats_path = 1850.0, 25.0, stats_path
    c._clock, c._sleep, c._t0, c._written, c._last_end = clock, clock.sleep, None, 0.0, None
    c.pace_stats = emu.PaceStats()
    return ec, c


def test_worker_sleeps_to_the_emulated_step_end_in_absolute_time(tmp_path):
    clock = _Clock()
    ec, c = _worker(clock, stats_path=str(tmp_path / "pace.json"))
    # a 925-token prefill: 0.5 s emulated; the forward pass took 0.2 s -> sleeps the other 0.3 s
    c.bind_connector_metadata(ec.EmulatedMetadata(pace_s=0.5, prefill_tokens=925))
    clock.now += 0.2
    c.wait_for_save()
    assert clock.slept == [pytest.approx(0.3)]
    # a decode step slower than 40 ms is not delayed, and counts as an overrun
    c.bind_connector_metadata(ec.EmulatedMetadata(pace_s=0.04, decode_reqs=1))
    clock.now += 0.06
    c.wait_for_save()
    assert len(clock.slept) == 1
    st = c.pace_stats
    assert st.measured_r_p() == pytest.approx(1850.0) and st.overruns == 1
    doc = json.loads((tmp_path / "pace.json").read_text())
    assert doc["measured_r_p"] == pytest.approx(1850.0) and doc["r_d"] == 25.0
    # the product metadata alone (no pace) never sleeps
    from agent.connector.vllm_connector import PallasConnectorMetadata
    c.bind_connector_metadata(PallasConnectorMetadata())
    c.wait_for_save()
    assert len(clock.slept) == 1 and c.pace_stats.steps == 2


def test_back_to_back_steps_are_paced_by_their_period():
    """The work between two steps (scheduling, output) is part of the emulated step period:
    decode steps 5 ms apart each sleep 5 ms less, so they start every 40 ms; after an idle gap
    longer than a step, the step is paced from its own start."""
    clock = _Clock()
    ec, c = _worker(clock)
    starts = []
    for _ in range(4):
        starts.append(clock.now)
        c.bind_connector_metadata(ec.EmulatedMetadata(pace_s=0.04, decode_reqs=1))
        clock.now += 0.01                 # the forward pass
        c.wait_for_save()
        clock.now += 0.005                # the scheduler and the output between steps
    # the first has no step before it: paced from its own start (then 5 ms of output work)
    assert [round(b - a, 6) for a, b in zip(starts, starts[1:])] == [0.045, 0.04, 0.04]
    assert clock.slept[0] == pytest.approx(0.03) and clock.slept[1:] == [pytest.approx(0.025)] * 3
    assert c.pace_stats.measured_r_d() == pytest.approx(25.0)
    clock.now += 1.0                      # idle
    c.bind_connector_metadata(ec.EmulatedMetadata(pace_s=0.04, decode_reqs=1))
    clock.now += 0.01
    c.wait_for_save()
    assert clock.slept[-1] == pytest.approx(0.03)


def test_scheduler_side_puts_the_step_duration_in_the_metadata():
    ec, c = _worker(_Clock())
    from types import SimpleNamespace

    from agent.connector.block_policy import SchedulerPolicy
    c.policy, c._requests, c._kv_cache_manager = SchedulerPolicy(32), {}, None
    meta = c.build_connector_meta(SimpleNamespace(num_scheduled_tokens={"a": 370, "b": 1}))
    assert isinstance(meta, ec.EmulatedMetadata)
    assert (meta.prefill_tokens, meta.decode_reqs) == (370, 1) and meta.pace_s == pytest.approx(0.2)
    assert meta.saves == [] and meta.loads == []


def test_emulated_models_are_the_presets_replay_setting():
    """One table of the paper's models (issue 17): the replay's emulation and its ``--rates
    paper`` read pallas_eval.experiments.presets' ``paper-replay`` setting, which keeps the
    replay's Qwen3-32B at 1,850 / 25 tokens/s and 300 Mbit/s (issue 13) while the experiments'
    ``rtx-a6000`` fit of the same paper figures differs (c_sync taken out)."""
    from pallas_common import timing
    from pallas_eval.experiments import presets as PR

    assert set(emu.EMULATED) == set(PR.MODELS)
    for name in PR.MODELS:
        r, m = PR.replay_rates(name), emu.emulated_model(name)
        assert (m.r_p, m.r_d, m.s_kv) == (r.r_p, r.r_d, float(PR.s_kv(name)))
        assert m.source == PR.replay_source(name)
    p = PR.PAPER_QWEN3_32B
    assert (p.r_p, p.r_d, p.s_kv, p.block_size) == (1850.0, 25.0, 262_144.0, 16)
    assert p.bandwidth == timing.mbit_per_s(300.0) and p.c_sync == 0.02
    assert p.hop_delay_s == timing.PAPER_HOP_COST.mean_s() == pytest.approx(0.0120, abs=5e-4)
    assert PR.RATE_PRESETS["paper"] is p
    assert emu.PAPER_LINK_MBPS == PR.PAPER_GOODPUT_MBPS == 300.0
    assert emu.PAPER_HOP_DELAY_S == PR.REPLAY_HOP_DELAY_S == pytest.approx(0.0120, abs=5e-4)
    assert PR.HOP_DELAY_S == timing.PAPER_HOP_COST.mean_s() == pytest.approx(0.0120, abs=5e-4)
    a6000 = PR.rates("qwen3-32b", "rtx-a6000")
    assert a6000.r_p == pytest.approx(5120 / (0.581 + 2.103 - 2 * (0.15 + 0.048)))   # ~2,238 tokens/s
    assert a6000.r_d == pytest.approx(1 / 0.048) and a6000.c_sync == 0.15


def test_paper_regime_step_budget_caps_a_long_prefill_in_vllms_own_config():
    """The agent's vLLM flags of the paper regime reach vLLM's scheduler config: 256 tokens a
    step, and a running long prefill capped at 128 of them while another request waits (a
    resumed session is admitted at once instead of after the whole prefill)."""
    import shlex

    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from pallas_eval.emulation import LONG_PREFILL_CAP_TOKENS, PREFILL_CHUNK_TOKENS, vllm_step_args

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(shlex.split(vllm_step_args()))
    ea = EngineArgs.from_cli_args(args)
    assert (ea.max_num_batched_tokens, ea.long_prefill_token_threshold) == (256, 128)
    assert LONG_PREFILL_CAP_TOKENS < PREFILL_CHUNK_TOKENS
