"""gRPC message sizes per RPC (issue 16, "Bounds everywhere input arrives"), on the whole agent
wired by agent.app.Agent around a fake engine (blocks of 32 tokens, 64 KiB: the connector's
hello of fakes_agent.fake_attach): each RPC takes a message at its limit and refuses one byte
more with RESOURCE_EXHAUSTED, on the agent's servers (PeerTransfer sized from the engine's block
bytes, Control small) and on its peer clients (refused before it is sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import grpc
import pytest
from pallas_proto import pallas_pb2 as pb

import agent.weights
from agent.app import Agent, parse_args
from agent.transfer import GRPC_OPTIONS
from pallas_common.msglimits import (CONTROL_REQUEST_MAX, HEADER_SLACK, TOKEN_ID_BYTES,
                                     control_limits, peer_limits)

import fakes_agent as fk

BLOCK_BYTES = 65536          # fake_attach's hello
MAX_MODEL_LEN = 4096


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sized(msg, field: str, size: int):
    """``msg`` with string/bytes ``field`` padded so that the message is exactly ``size``
    bytes."""
    is_bytes = isinstance(getattr(msg, field), bytes)
    setattr(msg, field, b"" if is_bytes else "")
    base = msg.ByteSize()
    for n in range(max(0, size - base - 8), size - base + 1):
        setattr(msg, field, b"\x01" * n if is_bytes else "x" * n)
        if msg.ByteSize() == size:
            return msg
    raise AssertionError(f"cannot size {type(msg).__name__} to {size}")


@contextlib.asynccontextmanager
async def plaintext_agent(monkeypatch, *extra: str):
    monkeypatch.setattr(Agent, "attach", fk.fake_attach)
    monkeypatch.setattr(agent.weights, "weights_digest", lambda model: "d1")
    cp, fp = free_port(), free_port()
    cfg = parse_args(["--model", "/m/fake", "--vllm-url", "http://127.0.0.1:1", "--agent-id", "a",
                      "--control-port", str(cp), "--front-port", str(fp), "--peer-port", "0",
                      "--host", "127.0.0.1", "--probe-prefill-tokens", "0", "--insecure",
                      "--max-model-len", str(MAX_MODEL_LEN), *extra])
    app = Agent(cfg)
    await app.start()
    try:
        yield app, f"127.0.0.1:{cp}"
    finally:
        await app.stop()


def _raw(channel, method: str, stream: bool):
    """A multi-callable sending raw bytes (no client-side limit but the flat test bound)."""
    kind = channel.stream_unary if stream else channel.unary_unary
    return kind(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)


async def _outcome(call) -> str:
    try:
        await call
        return "taken"
    except grpc.aio.AioRpcError as e:
        return e.code().name


def test_limits_are_sized_from_the_block_and_the_context():
    lim = peer_limits(BLOCK_BYTES, MAX_MODEL_LEN)
    assert lim.request["StreamBlocks"] == BLOCK_BYTES + HEADER_SLACK
    assert lim.request["Prepare"] == MAX_MODEL_LEN * TOKEN_ID_BYTES + HEADER_SLACK
    assert lim.request["Sync"] == lim.request["Prepare"] + lim.request["StreamBlocks"]
    assert lim.request["Release"] == lim.request["Progress"] == HEADER_SLACK
    c = control_limits()
    assert set(c.request.values()) == {CONTROL_REQUEST_MAX}
    assert c.response["Telemetry"] > c.response["Commit"]
    with pytest.raises(ValueError):
        peer_limits(0, 10)


def test_each_rpc_takes_its_limit_and_refuses_one_byte_more(monkeypatch):
    lim = peer_limits(BLOCK_BYTES, MAX_MODEL_LEN)
    svc = "/pallas.v1.PeerTransfer/"
    cases = {
        "StreamBlocks": pb.KVBlock(session_id="s", epoch=1, block_index=3),
        "Prepare": pb.PrepareRequest(session_id="s", epoch=1),
        "Sync": pb.SyncRequest(session_id="s", epoch=1),
        "Release": pb.ReleaseRequest(session_id="s", epoch=1),
        "Progress": pb.ProgressRequest(session_id="s", epoch=1),
    }
    pad = {"StreamBlocks": "data", "Prepare": "ue_id", "Sync": "ue_id", "Release": "reason",
           "Progress": "session_id"}

    async def run():
        out = {}
        async with plaintext_agent(monkeypatch) as (app, ctl_addr):
            assert app.peer_limits() == lim     # from the engine's hello, not the flag's cap
            async with grpc.aio.insecure_channel(app.peer_address, options=GRPC_OPTIONS) as ch:
                for method, msg in cases.items():
                    limit = lim.request[method]
                    for extra in (0, 1):
                        raw = sized(msg, pad[method], limit + extra).SerializeToString()
                        call = _raw(ch, svc + method, method == "StreamBlocks")
                        out[(method, extra)] = await _outcome(
                            call(iter([raw]) if method == "StreamBlocks" else raw, timeout=10))
            async with grpc.aio.insecure_channel(ctl_addr, options=GRPC_OPTIONS) as ch:
                for extra in (0, 1):
                    raw = sized(pb.CancelRequest(session_id="s", epoch=1), "reason",
                                CONTROL_REQUEST_MAX + extra).SerializeToString()
                    out[("Cancel", extra)] = await _outcome(
                        _raw(ch, "/pallas.v1.Control/Cancel", False)(raw, timeout=10))
            # The agent's own peer client: a request over its method's limit is never sent.
            client = app.migration.ctx.peers.get(pb.PeerEndpoint(agent_id="a",
                                                                 address=app.peer_address))
            for extra in (0, 1):
                req = sized(pb.PrepareRequest(session_id="s", epoch=9), "ue_id",
                            lim.request["Prepare"] + extra)
                try:
                    await client.prepare(req)
                    out[("client Prepare", extra)] = "taken"
                except grpc.aio.AioRpcError as e:
                    out[("client Prepare", extra)] = e.code().name + (
                        " before sending" if "Sent message larger than max" in e.details() else "")
        return out

    out = asyncio.run(asyncio.wait_for(run(), 60))
    for method in list(cases) + ["Cancel"]:
        assert out[(method, 0)] == "taken", (method, out)
        assert out[(method, 1)] == "RESOURCE_EXHAUSTED", (method, out)
    assert out[("client Prepare", 0)] == "taken"
    assert out[("client Prepare", 1)] == "RESOURCE_EXHAUSTED before sending"


def test_a_telemetry_report_at_its_limit_streams_and_one_byte_more_is_refused():
    """The Telemetry stream's reports are bounded by TELEMETRY_REPORT_MAX on the agent's Control
    server and on the xApp's channel options."""
    from agent.control_service import ControlService, add_control_service
    from pallas_common.msglimits import TELEMETRY_REPORT_MAX
    from pallas_proto import pallas_pb2_grpc

    from migration.fakes import _engine

    async def first_report(size: int) -> str:
        m, hub, eng = _engine()
        rep = sized(pb.TelemetryReport(time=1.0), "agent_id", size)
        server = grpc.aio.server(options=control_limits().server_options())
        add_control_service(server, ControlService(m, agent_id="b", telemetry=lambda: rep))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(
                    f"127.0.0.1:{port}", options=control_limits().channel_options()) as ch:
                stream = pallas_pb2_grpc.ControlStub(ch).Telemetry(
                    pb.TelemetryRequest(period_ms=50), timeout=10)
                try:
                    got = await stream.read()
                    return f"read {got.ByteSize()}"
                except grpc.aio.AioRpcError as e:
                    return e.code().name
                finally:
                    stream.cancel()
        finally:
            await server.stop(0)

    at = asyncio.run(first_report(TELEMETRY_REPORT_MAX))
    over = asyncio.run(first_report(TELEMETRY_REPORT_MAX + 1))
    assert at == f"read {TELEMETRY_REPORT_MAX}" and over == "RESOURCE_EXHAUSTED", (at, over)
