"""Admission: compatible model and free KV memory for S_kv(K_HO) plus headroom."""

import dataclasses

import pytest

from xapp.scheduler import ServerState, admit, incompatibility

from sched_helpers import BLOCK, MODEL, S_KV


def test_compatibility_fields():
    assert incompatibility(MODEL, MODEL) is None
    for field, value in (("model", "other"), ("weights_digest", "ffff"), ("dtype", "float16"),
                         ("kv_cache_dtype", "fp8"), ("block_size", 32)):
        why = incompatibility(MODEL, dataclasses.replace(MODEL, **{field: value}))
        assert why is not None and field in why
    assert "layout" in incompatibility(MODEL, dataclasses.replace(MODEL, num_layers=48))
    assert incompatibility(MODEL, dataclasses.replace(MODEL, num_layers=0)) is None   # unreported


def test_memory_need_with_headroom_and_reservations():
    block_bytes = BLOCK * S_KV
    k_ho = 3000.0                                      # 188 blocks (ceil)
    need = int(188 * block_bytes * 1.1) + 1
    free_blocks = need // block_bytes + 1
    srv = ServerState("b", MODEL, free_blocks, 10 * free_blocks, 0.0)
    r = admit(MODEL, srv, k_ho, S_KV, 0.1)
    assert r.admitted and abs(r.need_bytes - 188 * block_bytes * 1.1) <= 1
    assert not admit(MODEL, srv, k_ho, S_KV, 0.1, reserved_bytes=2 * block_bytes).admitted
    tight = ServerState("b", MODEL, 188, 1000, 0.0)
    assert admit(MODEL, tight, k_ho, S_KV, 0.0).admitted
    refused = admit(MODEL, tight, k_ho, S_KV, 0.1)
    assert not refused.admitted and "free KV memory" in refused.reason
    assert admit(MODEL, tight, k_ho, S_KV, 0.1, check_memory=False).admitted


@pytest.mark.parametrize("source, server, reason", [
    (None, ServerState("b", MODEL, 10**6, 10**6, 0.0), "source model"),
    (MODEL, None, "no fresh telemetry"),
    (MODEL, ServerState("b", None, 10**6, 10**6, 0.0), "no fresh telemetry"),
    (MODEL, ServerState("b", dataclasses.replace(MODEL, dtype="float32"), 10**6, 10**6, 0.0), "dtype"),
    (dataclasses.replace(MODEL, block_bytes=0, kv_bytes_per_token=0),
     ServerState("b", dataclasses.replace(MODEL, block_bytes=0, kv_bytes_per_token=0), 10**6, 10**6, 0.0),
     "block size in bytes"),
])
def test_refusals_say_why(source, server, reason):
    r = admit(source, server, 100.0, S_KV, 0.1)
    assert not r.admitted and reason in r.reason
