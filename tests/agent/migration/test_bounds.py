"""Each bound of the migration engine at its limit and one past it (issue 16, "Each limit has
a test at limit + 1"): a streamed block's size, the KV one attempt and the whole agent may
buffer, the epoch ledger, the idle expiry of a prepared attempt. (gRPC message sizes:
test_msglimits.py; the front's body cap and field lengths: test_front_requests.py.)"""

from __future__ import annotations

import asyncio

from pallas_proto import pallas_pb2 as pb

from migration.fakes import IDENT, _blk, _engine, _prep

BLOCK = int(IDENT.block_bytes)


def test_a_block_of_block_bytes_is_taken_and_one_byte_more_refused():
    async def run():
        m, hub, eng = _engine()
        assert (await m.target.on_prepare(_prep())).status == pb.STATUS_OK
        return (m.target.on_block(_blk(2, data=b"\x01" * BLOCK)),
                m.target.on_block(_blk(3, data=b"\x01" * (BLOCK + 1))), hub.store.num_bytes)

    at, over, held = asyncio.run(run())
    assert (at, over, held) == ("ok", "refused", BLOCK)


def test_inbound_bytes_per_attempt_and_per_agent_take_their_limit_and_no_byte_more():
    async def run():
        m, hub, eng = _engine(max_inbound_session_bytes=100, max_inbound_bytes=150)
        for sid in ("s", "s2"):
            assert (await m.target.on_prepare(_prep(sid=sid))).status == pb.STATUS_OK
        out = [m.target.on_block(_blk(2, data=b"\x01" * 60)),
               m.target.on_block(_blk(3, data=b"\x01" * 40)),          # the attempt at 100: its limit
               m.target.on_block(_blk(4, data=b"\x01" * 1)),           # 101
               m.target.on_block(_blk(2, sid="s2", data=b"\x01" * 50)),  # the agent at 150: its limit
               m.target.on_block(_blk(3, sid="s2", data=b"\x01" * 1))]   # 151
        return out, m.ctx.inbound["s"].bytes_in, m.target.buffered_bytes()

    out, attempt, agent = asyncio.run(run())
    assert out == ["ok", "ok", "refused", "ok", "refused"]
    assert (attempt, agent) == (100, 150)


def test_the_ledger_keeps_its_limit_and_forgets_the_oldest_past_it():
    async def run():
        m, hub, eng = _engine(max_ledger=8)
        for i in range(8):
            await m.target.on_release(pb.ReleaseRequest(session_id=f"s{i}", epoch=3))
        kept = [m.ctx.ledger.newest_in(f"s{i}") for i in range(8)]
        await m.target.on_release(pb.ReleaseRequest(session_id="s8", epoch=3))
        return kept, m.ctx.ledger.newest_in("s0"), m.ctx.ledger.newest_in("s8"), len(m.ctx.ledger._newest)

    kept, first, last, n = asyncio.run(run())
    assert kept == [3] * 8 and (first, last, n) == (-1, 3, 8)


def test_a_prepared_attempt_lives_its_idle_time_and_expires_past_it():
    async def run():
        m, hub, eng = _engine(lease_s=10.0)
        assert (await m.target.on_prepare(_prep(expected=65536))).status == pb.STATUS_OK
        t = m.ctx.inbound["s"].touched
        at = await m.target.expire(now=t + 10.0)
        past = await m.target.expire(now=t + 10.0 + 1e-3)
        return at, past, m.held()["reserved_bytes"]

    at, past, reserved = asyncio.run(run())
    assert (at, past, reserved) == (0, 1, 0)


def test_a_telemetry_period_below_the_floor_is_raised_to_it():
    """Control.Telemetry: a requested period at the agent's floor (20 ms) is kept; one below it
    (19 ms, or 1 ms) streams at the floor."""
    from agent.control_service import ControlService

    async def period_of(period_ms: int) -> float:
        m, hub, eng = _engine()
        ctl = ControlService(m, agent_id="b", telemetry=lambda: pb.TelemetryReport(agent_id="b"),
                             min_period_s=0.02)
        stream = ctl.Telemetry(pb.TelemetryRequest(period_ms=period_ms), None)
        await stream.__anext__()
        t0 = asyncio.get_running_loop().time()
        for _ in range(3):
            await stream.__anext__()
        await stream.aclose()
        return (asyncio.get_running_loop().time() - t0) / 3

    at, below, far_below = (asyncio.run(period_of(p)) for p in (20, 19, 1))
    assert 0.0195 <= at and 0.0195 <= below and 0.0195 <= far_below, (at, below, far_below)


def test_an_ended_session_is_kept_its_ttl_and_forgotten_past_it(monkeypatch):
    """The agent's janitor: a finished (or handed-over) session is remembered
    ``--session-ttl-s`` after its end, then dropped with its ledger records."""
    import time

    from agent.session import SamplingSpec, Session, SessionState
    from test_msglimits import plaintext_agent

    async def run():
        async with plaintext_agent(monkeypatch, "--session-ttl-s", "10") as (app, _ctl):
            now = time.time()
            for sid, ended in (("within", now - 8.0), ("past", now - 10.5)):
                s = Session(sid, "ue", [1, 2], SamplingSpec(max_tokens=4))
                s.set_state(SessionState.FINISHED, finish_reason="length")
                s.ended_at = ended
                app.sessions.add(s)
                app.migration.ctx.ledger.see(sid, 7)
            await asyncio.sleep(0.6)            # the janitor's first pass comes at once
            return ({s.session_id for s in app.sessions},
                    app.migration.ctx.ledger.newest("within"), app.migration.ctx.ledger.newest("past"))

    kept, within, past = asyncio.run(asyncio.wait_for(run(), 30))
    assert "within" in kept and "past" not in kept
    assert (within, past) == (7, 0)
