"""vLLM server command line/environment and model-folder helpers (no vLLM, no torch)."""

from __future__ import annotations

import json
import struct

import pytest

from pallas_eval.models import PRESETS, build_model, num_parameters, weights_digest
from agent.server import ServerConfig, VLLMServer


def test_server_command_carries_the_connector_and_the_cpu_settings(tmp_path):
    srv = VLLMServer(ServerConfig(model="/m/tiny", port=18123, agent_address="tcp://127.0.0.1:5",
                                  omp_threads_bind="1", kv_cache_gib=2,
                                  log_path=str(tmp_path / "x.log")))
    cmd = srv.command()
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    for flag in ("--skip-tokenizer-init", "--enforce-eager", "--enable-prefix-caching"):
        assert flag in cmd
    assert cmd[cmd.index("--block-size") + 1] == "32"
    assert cmd[cmd.index("--dtype") + 1] == "float32"
    kv = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
    assert kv["kv_connector"] == "PallasConnector"
    assert kv["kv_connector_module_path"] == "agent.connector"
    assert kv["kv_connector_extra_config"]["agent_address"] == "tcp://127.0.0.1:5"
    assert kv["kv_connector_extra_config"] == {"agent_address": "tcp://127.0.0.1:5"}  # no pacing in the product
    assert kv["kv_load_failure_policy"] == "recompute"   # issue 25: a failed block load recomputes
    env = srv.environment()
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(2 << 30)
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    paths = env["PYTHONPATH"].split(":")
    assert any(p.endswith("proto") for p in paths)
    assert srv.base_url == "http://127.0.0.1:18123"
    assert "--kv-transfer-config" not in VLLMServer(ServerConfig(model="/m")).command()
    srv.stop()  # never started: a no-op


def test_another_connector_and_vllm_args_reach_the_command(tmp_path):
    srv = VLLMServer(ServerConfig(model="/m", agent_address="tcp://127.0.0.1:5",
                                  kv_connector_module="pallas_eval.emulated_connector",
                                  kv_connector_class="EmulatedPallasConnector",
                                  kv_connector_extra={"decode_tokens_per_s": 25.0, "agent_address": "x"},
                                  extra_args=["--max-num-batched-tokens", "4096"],
                                  log_path=str(tmp_path / "x.log")))
    cmd = srv.command()
    kv = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
    assert kv["kv_connector"] == "EmulatedPallasConnector"
    assert kv["kv_connector_module_path"] == "pallas_eval.emulated_connector"
    # the extra entries are merged; the agent's own address always wins
    assert kv["kv_connector_extra_config"] == {"decode_tokens_per_s": 25.0, "agent_address": "tcp://127.0.0.1:5"}
    assert cmd[-2:] == ["--max-num-batched-tokens", "4096"]


def _fake_safetensors(path, shapes):
    header = {name: {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}
              for name, shape in shapes.items()}
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_parameter_count_and_digest(tmp_path):
    _fake_safetensors(tmp_path / "model.safetensors", {"a": [4, 8], "b": [3]})
    assert num_parameters(tmp_path) == 35
    d1 = weights_digest(tmp_path)
    assert len(d1) == 64 and weights_digest(tmp_path) == d1   # cached
    (tmp_path / "pallas-digest.txt").unlink()
    _fake_safetensors(tmp_path / "model.safetensors", {"a": [4, 9]})
    assert weights_digest(tmp_path) != d1


def test_presets_and_unknown_model():
    assert PRESETS["m152"]["num_hidden_layers"] == 12 and PRESETS["tiny"]["head_dim"] == 64
    with pytest.raises(KeyError):
        build_model("no-such-preset")
