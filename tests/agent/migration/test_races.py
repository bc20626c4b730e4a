"""Control calls racing what ends an attempt under them (found by ``soak.py --faults --targets 2``
on issue 45's multi-target preparation): the call answers a plain non-OK status naming the end,
never an IllegalTransition, and what the target admitted for the ended attempt is released at
once, not at its lease's expiry. Each race is set up with events (a target that holds its
answer until the test lets it go), not with sleeps. Fakes: tests/agent/migration/fakes.py."""

from __future__ import annotations

import asyncio

from pallas_proto import pallas_pb2 as pb

from agent.session import SessionState
from agent.states import SourceState
from agent.transfer import serve_peer_transfer
from migration.fakes import _engine, _serving


class Held:
    """A PeerTransfer handler in front of a real target role (``inner``): each call named in
    ``hold`` sets ``entered[name]`` and waits for ``go[name]`` before ``inner`` answers it;
    every Release is recorded (its reply too) and sets ``released``."""

    def __init__(self, inner, hold=("prepare",)):
        self.inner = inner
        self.entered = {n: asyncio.Event() for n in hold}
        self.go = {n: asyncio.Event() for n in hold}
        self.releases: list[tuple[pb.ReleaseRequest, pb.ReleaseReply]] = []
        self.released = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def _held(self, name, req):
        if name in self.entered:
            self.entered[name].set()
            await self.go[name].wait()
        return await getattr(self.inner, f"on_{name}")(req)

    async def on_prepare(self, req):
        return await self._held("prepare", req)

    async def on_progress(self, req):
        return await self._held("progress", req)

    async def on_release(self, req):
        rep = await self.inner.on_release(req)
        self.releases.append((req, rep))
        self.released.set()
        return rep


async def _pair(hold=("prepare",), lease_s=30.0, handler_class=None, **src_cfg):
    """Source engine "b" (``src_cfg``: its MigrationConfig fields) serving "s" (100-token
    prompt) and a target engine "t" behind a :class:`Held` handler (or ``handler_class``) over
    gRPC. Returns (src, tgt, handler, server, endpoint, session)."""
    src, _, _ = _engine(**src_cfg)
    tgt, _, _ = _engine(lease_s=lease_s)
    tgt.ctx.agent_id = "t"
    handler = (handler_class or Held)(tgt.target, hold)
    server, addr = await serve_peer_transfer(handler, "127.0.0.1:0")
    s = _serving(src, n_prompt=100, outputs=tuple(range(30)), max_tokens=60)
    return src, tgt, handler, server, pb.PeerEndpoint(agent_id="t", address=addr), s


async def _close(src, tgt, server):
    await src.close()
    await tgt.close()
    await server.stop(0)


def test_a_trigger_racing_a_source_engine_kill_answers_non_ok_and_frees_the_target():
    """The source's engine dies while the target prepares the Trigger's attempt: the session's
    failure abandons the attempt (its Release reaches the target before the Prepare is
    answered, so the target then admits it). The Trigger answers STATUS_ERROR naming the
    failure (it raised ``cancelled -> prepared`` before) and the source releases the target's
    fresh lease at once."""
    async def run():
        src, tgt, h, server, ep, s = await _pair()
        try:
            call = asyncio.ensure_future(src.trigger("s", 1, ep, split_tokens=96))
            await h.entered["prepare"].wait()
            out = src.ctx.outbound.at("s", ep.address)
            s.fail("engine died", "engine")           # what the vLLM client does, then its hook
            src.session_failed(s)
            await h.released.wait()                   # the abandon's Release: nothing held yet
            first = h.releases[0][1].message
            h.released.clear()
            h.go["prepare"].set()                     # the target admits the attempt now
            rep = await call
            return (rep, out.state, first, [r[0].reason for r in h.releases],
                    sorted(tgt.ctx.inbound), tgt.held()["reserved_bytes"], len(src.ctx.outbound))
        finally:
            await _close(src, tgt, server)

    rep, state, first, reasons, held, reserved, outbound = asyncio.run(run())
    assert rep.status == pb.STATUS_ERROR and "IllegalTransition" not in rep.message, rep
    assert "session failed" in rep.message and "engine died" in rep.message, rep.message
    assert state == SourceState.CANCELLED and first == "nothing held"
    assert len(reasons) == 2 and "while the target prepared it" in reasons[1], reasons
    assert held == [] and reserved == 0 and outbound == 0


def test_a_trigger_whose_attempt_is_abandoned_while_its_prepare_runs_answers_rejected():
    """The same race with the session alive (its attempt abandoned by the agent's own
    housekeeping): STATUS_REJECTED naming the reason, the session serves on here, the target
    holds nothing."""
    async def run():
        src, tgt, h, server, ep, s = await _pair()
        try:
            call = asyncio.ensure_future(src.trigger("s", 1, ep, split_tokens=96))
            await h.entered["prepare"].wait()
            await src.source.abandon(src.ctx.outbound.at("s", ep.address), "agent draining")
            h.go["prepare"].set()
            rep = await call
            return rep, s.state, sorted(tgt.ctx.inbound)
        finally:
            await _close(src, tgt, server)

    rep, state, held = asyncio.run(run())
    assert rep.status == pb.STATUS_REJECTED and "agent draining" in rep.message, rep
    assert state == SessionState.SERVING and held == []


def test_a_commit_racing_its_attempts_lost_lease_answers_non_ok_and_serves_on():
    """The commit asks the prepared target's progress (the commit-time choice) and, while it
    waits, the target evicts the attempt and the source's renewal finds the lease gone (the
    attempt FAILED). The commit answers STATUS_REJECTED naming the loss (it raised ``failed
    -> committing`` before), sends no Sync, and the session serves on here, unfrozen."""
    async def run():
        src, tgt, h, server, ep, s = await _pair(hold=("progress",))
        try:
            assert (await src.trigger("s", 1, ep, split_tokens=96)).status == pb.STATUS_OK
            out = src.ctx.outbound.at("s", ep.address)
            call = asyncio.ensure_future(src.commit("s", 1, ep))
            await h.entered["progress"].wait()
            frozen = s.state
            changed = out.changed
            await tgt.target.drop_inbound(tgt.ctx.inbound["s"], "full", event="evicted")
            out.renew_now.set()                       # the renewal finds no lease: FAILED
            await changed.wait()
            lost = out.state
            h.go["progress"].set()
            rep = await call
            # the commit's background Release, if it started one
            await asyncio.gather(*[t for t in src.ctx.tasks if t.get_name().startswith("release-")])
            released = [r[0].reason for r in h.releases]
            return (rep, frozen, lost, s.state, s.frozen_at, tgt.ctx.sessions.get("s"),
                    len(src.ctx.outbound), released)
        finally:
            await _close(src, tgt, server)

    rep, frozen, lost, state, frozen_at, synced, outbound, released = asyncio.run(run())
    assert frozen == SessionState.COMMITTING and lost == SourceState.FAILED
    assert rep.status == pb.STATUS_REJECTED and "IllegalTransition" not in rep.message, rep
    assert "lease lost" in rep.message and "before the commit" in rep.message, rep.message
    assert rep.state == pb.SESSION_SERVING and state == SessionState.SERVING
    assert frozen_at is None and synced is None and outbound == 0
    assert len(released) == 1 and "before the commit" in released[0], released


class AdmitsLate(Held):
    """A target that admits the Prepare at once and then holds its answer until ``go``: the
    answer of an admitted attempt lost on the way back (a loaded target, a cut link)."""

    async def on_prepare(self, req):
        rep = await self.inner.on_prepare(req)
        self.entered["prepare"].set()
        await self.go["prepare"].wait()
        return rep


async def _unanswered(call, **src_cfg):
    """Run ``call(src, endpoint)`` against a target that admits the Prepare and holds its
    answer (:class:`AdmitsLate`); returns (reply, target's inbound sessions, its reserved
    bytes, the Releases' reasons, the session's state), read right after the reply."""
    src, tgt, h, server, ep, s = await _pair(handler_class=AdmitsLate, **src_cfg)
    try:
        rep = await call(src, ep)
        inbound, reserved = sorted(tgt.ctx.inbound), tgt.held()["reserved_bytes"]
        h.go["prepare"].set()
        return rep, inbound, reserved, [r[0].reason for r in h.releases], s.state
    finally:
        await _close(src, tgt, server)


def test_a_trigger_whose_prepare_times_out_after_the_target_admitted_it_frees_the_target():
    """The Prepare's deadline passes after the target admitted the attempt: the Trigger
    answers STATUS_ERROR and, before it answers, releases the target, which holds no lease
    and no reservation (it kept both until the lease expired before)."""
    rep, inbound, reserved, reasons, state = asyncio.run(_unanswered(
        lambda src, ep: src.trigger("s", 1, ep, split_tokens=96), rpc_timeout_s=0.5))
    assert rep.status == pb.STATUS_ERROR and "prepare failed" in rep.message, rep
    assert inbound == [] and reserved == 0, (inbound, reserved)
    assert len(reasons) == 1 and "prepare unanswered" in reasons[0], reasons
    assert state == SessionState.SERVING


def test_a_commit_whose_reactive_prepare_outlives_its_deadline_frees_the_target():
    """A commit at an unprepared target whose Prepare is admitted there but not answered
    before the commit's deadline: the commit answers non-OK, the session serves on here, and
    the target is released before the answer."""
    rep, inbound, reserved, reasons, state = asyncio.run(_unanswered(
        lambda src, ep: src.commit("s", 1, ep), commit_deadline_s=0.5))
    assert rep.status != pb.STATUS_OK and "prepare at the target failed" in rep.message, rep
    assert inbound == [] and reserved == 0, (inbound, reserved)
    assert len(reasons) == 1 and "prepare unanswered" in reasons[0], reasons
    assert state == SessionState.SERVING


def test_a_commit_cut_mid_way_publishes_what_it_held_back_and_a_repeat_runs_afresh():
    """A session that finished at the source (30 of 30 tokens, "length") is committed at an
    unprepared target with the UE at token 15, so 15 tokens are held back; the commit is
    cancelled while its Prepare waits at the target (the agent stopping, found by the K=2
    soak: that copy ended FINISHED with 15 tokens never published). The session keeps all 30
    tokens, unfrozen, FINISHED; a waiter on the cut call gets an error reply and a repeat of the
    commit runs afresh instead of waiting for ever."""
    async def run():
        src, tgt, h, server, ep, s = await _pair()
        try:
            s.sampling.max_tokens = 30
            s.set_state(SessionState.FINISHED, finish_reason="length")
            call = asyncio.ensure_future(src.commit("s", 1, ep, ue_tokens=15))
            await h.entered["prepare"].wait()
            held = len(s.held_token_ids)
            waiter = asyncio.ensure_future(src.commit("s", 1, ep, ue_tokens=15))
            await asyncio.sleep(0)
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
            waited = await asyncio.wait_for(waiter, 5)
            after = (len(s.output_token_ids), s.held_token_ids, s.frozen_at, s.state,
                     s.finish_reason)
            h.go["prepare"].set()
            repeat = await asyncio.wait_for(src.commit("s", 1, ep, ue_tokens=30), 10)
            return held, waited, after, repeat
        finally:
            await _close(src, tgt, server)

    held, waited, after, repeat = asyncio.run(run())
    assert held == 15
    assert waited.status == pb.STATUS_ERROR and "cancelled" in waited.message, waited
    assert after == (30, [], None, SessionState.FINISHED, "length"), after
    assert repeat.status == pb.STATUS_OK and repeat.state == pb.SESSION_HANDED_OVER, repeat
