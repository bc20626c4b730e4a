"""Shared helpers for the Scheduler Engine tests (model identity, telemetry reports)."""

from __future__ import annotations

from pallas_common.timing import kv_bytes_per_token
from pallas_proto import pallas_pb2
from xapp.scheduler import ModelKey

# Public Hugging Face config fields of Qwen3-14B.
QWEN3_14B = {"num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 8,
             "head_dim": 128, "hidden_size": 5120, "torch_dtype": "bfloat16"}
S_KV = kv_bytes_per_token(QWEN3_14B)
BLOCK = 16
MODEL = ModelKey(model="Qwen/Qwen3-14B", weights_digest="abc123", dtype="bfloat16",
                 kv_cache_dtype="auto", block_size=BLOCK, kv_bytes_per_token=S_KV, num_layers=40,
                 block_bytes=BLOCK * S_KV)


def server_report(agent: str, t: float, *, free_blocks: int = 100_000, prefill_rate: float = 2700.0,
                  model: ModelKey = MODEL, sessions=(), peers=()) -> pallas_pb2.TelemetryReport:
    """A TelemetryReport as an agent would send it."""
    ident = pallas_pb2.ModelIdentity(model=model.model, weights_digest=model.weights_digest,
                                     dtype=model.dtype, kv_cache_dtype=model.kv_cache_dtype,
                                     block_size=model.block_size,
                                     kv_bytes_per_token=model.kv_bytes_per_token,
                                     num_layers=model.num_layers, block_bytes=model.block_bytes)
    return pallas_pb2.TelemetryReport(
        agent_id=agent, time=t,
        server=pallas_pb2.ServerTelemetry(model=ident, prefill_rate=prefill_rate,
                                          free_kv_blocks=free_blocks, total_kv_blocks=free_blocks * 2),
        sessions=list(sessions), peers=list(peers))
