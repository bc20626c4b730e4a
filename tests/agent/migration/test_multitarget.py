"""One session prepared at more than one target (issue 45; docs/architecture.md §5): the source
agent's attempts per (session, target), the block fan-out to every streamed target, and the
one-holder rule (only the target the UE reached gets the Sync; the others are released after its
OK, kept after a failed commit). Fakes: tests/agent/migration/fakes.py."""

from __future__ import annotations

import asyncio

from pallas_proto import pallas_pb2 as pb

from agent.ipc import BlockHub, LocalBlock, block_crc
from agent.session import SessionState
from agent.states import SourceState
from migration.fakes import Target, _engine, _served, _serving

DATA = b"\x02" * 64


class Recording(Target):
    """A :class:`Target` that also records the blocks it receives, and (``lose_lease``) grants a
    short lease it then says it no longer holds."""

    def __init__(self, lose_lease: bool = False, **kw):
        super().__init__(**kw)
        self.lose_lease = lose_lease

    async def on_prepare(self, req):
        rep = await super().on_prepare(req)
        if self.lose_lease and rep.status == pb.STATUS_OK:
            rep.lease_s = 0.03
        return rep

    def on_block(self, blk, crc_ok=None):
        self.calls.append(("block", blk.block_index))
        return "ok"

    async def on_renew(self, req):
        self.calls.append(("renew", req))
        return pb.RenewReply(status=pb.STATUS_UNKNOWN_SESSION if self.lose_lease else pb.STATUS_OK)


async def _two(lose_a=False, sync_b=pb.STATUS_OK, third=False):
    """Engine "b" serving "s" (100-token prompt, 30 outputs: 130 tokens), Triggers of epoch 1 at
    A (rank 0) and B (rank 1) with split 96 (block 3 on). Returns (engine, hub, session,
    [(target handler, endpoint, server)] for A, B and, with ``third``, an unprepared C)."""
    m, hub, _ = _engine()
    peers = []
    for name, t in (("A", Recording(lose_lease=lose_a)), ("B", Recording(sync_status=sync_b)),
                    ("C", Recording()))[:3 if third else 2]:
        server, ep = await _served(t)
        ep.agent_id = name
        peers.append((t, ep, server))
    s = _serving(m, n_prompt=100, outputs=tuple(range(30)), max_tokens=60)
    # The request "ended" as far as block waits go: a commit waits only the flush grace.
    s._task = asyncio.ensure_future(asyncio.sleep(0))
    await s._task
    for rank, (t, ep, _) in enumerate(peers[:2]):
        rep = await m.trigger("s", 1, ep, split_tokens=96, rank=rank)
        assert rep.status == pb.STATUS_OK, rep
    return m, hub, s, peers


async def _close(m, peers):
    await m.close()
    for _, _, server in peers:
        await server.stop(0)


async def _until(cond, timeout=5.0):
    for _ in range(int(timeout / 0.01)):
        if cond():
            return True
        await asyncio.sleep(0.01)
    return cond()


def _blocks(m, idx, tail=False, fill=32):
    m.source.on_local_block(LocalBlock("s", 1, idx, fill, block_crc(DATA), DATA, tail=tail,
                                       computed=idx * 32 + fill))


def test_two_targets_are_prepared_and_a_commit_at_the_second_releases_the_first():
    async def run():
        m, hub, s, peers = await _two()
        (a, ea, _), (b, eb, _) = peers
        try:
            outs = m.ctx.outbound.of("s")
            ranks = [c[1].rank for t in (a, b) for c in t.calls if c[0] == "prepare"]
            both_streaming = [o.state for o in outs]
            exported = hub._exports["s"]
            _blocks(m, 3)                      # one full block: to both streams
            _blocks(m, 4, tail=True, fill=2)   # the tail at the commit point
            assert await _until(lambda: ("block", 3) in a.calls and ("block", 3) in b.calls)
            r = await m.commit("s", 1, eb)
            assert await _until(lambda: "release" in a.ops())
            held = m.held()
        finally:
            await _close(m, peers)
        assert ranks == [0, 1] and both_streaming == [SourceState.STREAMING] * 2
        assert (exported.start_block, exported.stream) == (3, True)
        assert r.status == pb.STATUS_OK and r.scheme == pb.SCHEME_PALLAS, r
        assert "fallback" not in r.message and s.state == SessionState.HANDED_OVER
        assert "sync" in b.ops() and "release" not in b.ops()       # one holder: B
        assert "sync" not in a.ops() and a.ops()[-1] == "release"
        (rel,) = [c[1] for c in a.calls if c[0] == "release"]
        assert rel.epoch == 1 and "committed at B" in rel.reason
        assert held["outbound"] == 0 and "s" not in hub._exports, (held, hub._exports)
    asyncio.run(run())


def test_a_commit_at_an_unprepared_third_target_falls_back_and_releases_both():
    async def run():
        m, hub, s, peers = await _two(third=True)
        (a, _, _), (b, _, _), (c, ec, _) = peers
        try:
            r = await m.commit("s", 1, ec)
            held = m.held()
        finally:
            await _close(m, peers)
        assert r.status == pb.STATUS_OK and r.scheme == pb.SCHEME_CTHO, r
        assert "fallback from pallas" in r.message
        assert a.ops()[-1] == b.ops()[-1] == "release"
        assert "sync" not in a.ops() + b.ops() and c.ops().count("sync") == 1
        assert held["outbound"] == 0 and s.state == SessionState.HANDED_OVER
    asyncio.run(run())


def test_a_cancel_releases_every_target_of_the_epoch():
    async def run():
        m, hub, s, peers = await _two()
        (a, _, _), (b, _, _) = peers
        try:
            r = await m.cancel("s", 1, "prediction dropped")
            held = m.held()
        finally:
            await _close(m, peers)
        assert r.status == pb.STATUS_OK and "at 2 targets" in r.message, r
        assert a.ops()[-1] == b.ops()[-1] == "release"
        assert held["outbound"] == 0 and "s" not in hub._exports
        assert s.state == SessionState.SERVING
    asyncio.run(run())


def test_a_newer_epoch_supersedes_every_target_of_the_older_one():
    async def run():
        m, hub, s, peers = await _two(third=True)
        (a, _, _), (b, _, _), (c, ec, _) = peers
        try:
            r = await m.trigger("s", 2, ec, split_tokens=96)
            left = [(o.target.agent_id, o.epoch) for o in m.ctx.outbound.of("s")]
        finally:
            await _close(m, peers)
        assert r.status == pb.STATUS_OK
        assert a.ops()[-1] == b.ops()[-1] == "release" and left == [("C", 2)]
    asyncio.run(run())


def test_one_target_losing_its_lease_leaves_the_other_usable():
    async def run():
        m, hub, s, peers = await _two(lose_a=True)
        (a, ea, _), (b, eb, _) = peers
        try:
            assert await _until(lambda: m.ctx.outbound.at("s", ea.address) is None)
            still = [(o.target.agent_id, o.state) for o in m.ctx.outbound.of("s")]
            state, exported = s.state, "s" in hub._exports
            _blocks(m, 3)
            assert await _until(lambda: ("block", 3) in b.calls)
            r = await m.commit("s", 1, eb)
        finally:
            await _close(m, peers)
        assert still == [("B", SourceState.STREAMING)] and state == SessionState.MIGRATING
        assert exported                         # B's share of the export goes on
        assert ("block", 3) not in a.calls
        assert r.status == pb.STATUS_OK and "fallback" not in r.message, r
        assert "sync" not in a.ops() and b.ops().count("sync") == 1
    asyncio.run(run())


def test_a_failed_commit_keeps_the_other_targets_lease_and_a_retry_there_works():
    async def run():
        m, hub, s, peers = await _two(sync_b=pb.STATUS_REJECTED)
        (a, ea, _), (b, eb, _) = peers
        try:
            r = await m.commit("s", 1, eb)
            after = ([o.target.agent_id for o in m.ctx.outbound.of("s")], s.state,
                     list(a.ops()))
            r2 = await m.commit("s", 1, ea)
        finally:
            await _close(m, peers)
        assert r.status != pb.STATUS_OK and b.ops()[-1] == "release"   # B's own attempt ended
        assert after == (["A"], SessionState.MIGRATING, ["prepare"])
        assert r2.status == pb.STATUS_OK and "fallback" not in r2.message, r2
        assert a.ops().count("sync") == 1 and s.state == SessionState.HANDED_OVER
    asyncio.run(run())


def test_a_repeated_trigger_of_one_target_renews_it_and_prepares_nothing_more():
    async def run():
        m, hub, s, peers = await _two()
        (a, ea, _), (b, eb, _) = peers
        try:
            again = await m.trigger("s", 1, eb, split_tokens=96, rank=1)
            n = len(m.ctx.outbound)
        finally:
            await _close(m, peers)
        assert again.status == pb.STATUS_OK and n == 2
        assert a.ops().count("prepare") == b.ops().count("prepare") == 1
    asyncio.run(run())


def test_the_export_lasts_while_any_holder_wants_it_with_every_holders_flags():
    hub = BlockHub()
    hub.export("s", 1, 5, stream=True, tail=False, key="A")
    hub.export("s", 1, 3, stream=False, tail=True, key="B")
    both = hub._exports["s"]
    hub.stop_export("s", "B")
    one = hub._exports["s"]
    hub.export("s", 2, 7, key="C")          # a newer epoch replaces the older holders
    newer = hub._exports["s"]
    hub.stop_export("s", "C")
    assert (both.start_block, both.stream, both.tail) == (3, True, True)
    assert (one.start_block, one.stream, one.tail) == (5, True, False)
    assert (newer.epoch, newer.start_block) == (2, 7)
    assert "s" not in hub._exports and "s" not in hub._holders
    hub.export("s", 1, 0, key="A")
    hub.export("s", 1, 0, key="B")
    hub.stop_export("s")                     # None: every holder
    assert "s" not in hub._exports and "s" not in hub._holders


def test_a_targeted_cancel_releases_that_target_alone_and_the_epoch_goes_on():
    """CancelRequest.target set (issue 45: an extra target that stopped being a candidate):
    only its attempt ends and its target is released; the other target streams on, the
    session stays MIGRATING and a Commit of the epoch there is a prepared one."""
    async def run():
        m, hub, s, peers = await _two()
        (a, ea, _), (b, eb, _) = peers
        try:
            r = await m.cancel("s", 1, "dropped out of the choice", target=eb)
            after = ([(o.target.agent_id, o.state) for o in m.ctx.outbound.of("s")], s.state,
                     list(a.ops()), list(b.ops()))
            _blocks(m, 3)
            assert await _until(lambda: ("block", 3) in a.calls)
            c = await m.commit("s", 1, ea)
        finally:
            await _close(m, peers)
        assert r.status == pb.STATUS_OK and "cancelled at " + eb.address in r.message, r
        assert "1 other target(s) stay prepared" in r.message
        assert after == ([("A", SourceState.STREAMING)], SessionState.MIGRATING, ["prepare"],
                         ["prepare", "release"])
        (rel,) = [c[1] for c in b.calls if c[0] == "release"]
        assert rel.epoch == 1 and rel.reason == "dropped out of the choice"
        assert ("block", 3) not in b.calls
        assert c.status == pb.STATUS_OK and "fallback" not in c.message, c
        assert a.ops().count("sync") == 1 and "sync" not in b.ops()
    asyncio.run(run())


def test_a_dropped_target_is_not_prepared_again_under_its_epoch_and_a_full_cancel_still_works():
    """The epoch rule for a targeted Cancel: a Trigger naming the dropped target again under
    the epoch is STALE_EPOCH (it prepared nothing: one Prepare there in all); the targeted
    Cancel repeated answers as the first time; an untargeted Cancel (no target: as before the
    field existed) then ends the other target's attempt and closes the epoch."""
    async def run():
        m, hub, s, peers = await _two()
        (a, ea, _), (b, eb, _) = peers
        try:
            first = await m.cancel("s", 1, "dropped", target=eb)
            again = await m.trigger("s", 1, eb, split_tokens=96, rank=1)
            repeat = await m.cancel("s", 1, "dropped", target=eb)
            full = await m.cancel("s", 1, "prediction withdrawn")
            held = m.held()
        finally:
            await _close(m, peers)
        assert again.status == pb.STATUS_STALE_EPOCH and "new epoch" in again.message, again
        assert b.ops() == ["prepare", "release"]
        assert repeat == first
        assert full.status == pb.STATUS_OK and a.ops()[-1] == "release"
        assert held["outbound"] == 0 and s.state == SessionState.SERVING
    asyncio.run(run())


def test_the_control_service_passes_the_cancels_target_and_its_absence_on():
    """ControlService.Cancel: a CancelRequest with ``target`` cancels that target alone; one
    without (an older xApp's) cancels every target of the epoch."""
    from agent.control_service import ControlService

    async def run():
        m, hub, s, peers = await _two()
        (a, ea, _), (b, eb, _) = peers
        svc = ControlService(m, agent_id=m.ctx.agent_id)
        try:
            one = await svc.Cancel(pb.CancelRequest(session_id="s", epoch=1, reason="x",
                                                    target=eb), None)
            left = [o.target.agent_id for o in m.ctx.outbound.of("s")]
            every = await svc.Cancel(pb.CancelRequest(session_id="s", epoch=1, reason="y"), None)
            return one, left, every, len(m.ctx.outbound), a.ops(), b.ops()
        finally:
            await _close(m, peers)

    one, left, every, n, a_ops, b_ops = asyncio.run(run())
    assert one.status == every.status == pb.STATUS_OK and left == ["A"] and n == 0
    assert a_ops[-1] == b_ops[-1] == "release" and b_ops.count("release") == 1
