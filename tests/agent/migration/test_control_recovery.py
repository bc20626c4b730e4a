"""What an xApp killed mid-call and restarted finds at the agents (issue 16, the restart's agent
side): a Control call whose client went away still runs to its end (a commit never leaves the
session frozen at the source, and the restarted xApp's repeat gets the first reply at once),
and a Cancel sent to the target agent releases the attempt prepared there.

Real gRPC on loopback: the agent's ControlService over a MigrationEngine (fake vLLM client),
PeerTransfer targets from tests/agent/migration/fakes.py.
"""

from __future__ import annotations

import asyncio

import grpc
from pallas_proto import pallas_pb2 as pb
from pallas_proto import pallas_pb2_grpc

from agent.control_service import ControlService, add_control_service
from agent.session import SessionState

from migration.fakes import Target, _blk, _engine, _prep, _served, _serving


async def _control(m):
    server = grpc.aio.server()
    add_control_service(server, ControlService(m, agent_id=m.ctx.agent_id))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_a_commit_whose_caller_died_still_ends_and_the_repeat_gets_its_reply():
    async def run():
        m, hub, eng = _engine()
        s = _serving(m, max_tokens=5000)
        tgt = Target(sync_delay_s=0.6)          # the Sync takes a while: the commit is in flight
        peer_srv, ep = await _served(tgt)
        ctl_srv, addr = await _control(m)
        req = pb.CommitRequest(session_id="s", epoch=1, actual_target=ep)
        try:
            async with grpc.aio.insecure_channel(addr) as ch:
                call = pallas_pb2_grpc.ControlStub(ch).Commit(req)
                while "sync" not in tgt.ops():
                    await asyncio.sleep(0.01)
                frozen = s.frozen_at is not None and s.state == SessionState.COMMITTING
                call.cancel()                   # the xApp is killed: its call goes away
            for _ in range(400):                # the Sync takes 0.6 s; a loaded host longer
                if s.state != SessionState.COMMITTING:
                    break
                await asyncio.sleep(0.05)
            state_after = s.state
            async with grpc.aio.insecure_channel(addr) as ch:   # the restarted xApp repeats
                rep = await pallas_pb2_grpc.ControlStub(ch).Commit(req, timeout=2.0)
        finally:
            await ctl_srv.stop(0)
            await peer_srv.stop(0)
        return frozen, state_after, rep, tgt.ops()

    frozen, state_after, rep, ops = asyncio.run(asyncio.wait_for(run(), 30))
    assert frozen                                 # the call was cut while the session was frozen
    assert state_after == SessionState.HANDED_OVER  # the commit ran to its end regardless
    assert rep.status == pb.STATUS_OK and rep.state == pb.SESSION_HANDED_OVER, rep
    assert ops.count("sync") == 1                 # the repeat was answered, not done again


def test_a_cancel_at_the_target_releases_the_attempt_prepared_there():
    async def run():
        m, hub, eng = _engine()
        assert (await m.target.on_prepare(_prep(epoch=4, expected=65536))).status == pb.STATUS_OK
        assert m.target.on_block(_blk(2, epoch=4)) == "ok"
        ctl_srv, addr = await _control(m)
        try:
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = pallas_pb2_grpc.ControlStub(ch)
                old = await stub.Cancel(pb.CancelRequest(session_id="s", epoch=3, reason="x"))
                held_after_old = m.held()
                rep = await stub.Cancel(pb.CancelRequest(session_id="s", epoch=4,
                                                         reason="xapp restarted"))
        finally:
            await ctl_srv.stop(0)
        return old, held_after_old, rep, m.held()

    old, held_after_old, rep, held = asyncio.run(asyncio.wait_for(run(), 30))
    # An older epoch's cancel leaves the newer attempt alone.
    assert old.status == pb.STATUS_STALE_EPOCH and held_after_old["inbound"] == 1
    assert rep.status == pb.STATUS_OK and "released the attempt prepared here (1 blocks)" in \
        rep.message, rep
    assert held == {"inbound": 0, "outbound": 0, "blocks": 0, "bytes": 0, "reserved_bytes": 0,
                    "streams_queued": 0}
