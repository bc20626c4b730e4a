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


async def _pair(hold=("prepare",), lease_s=30.0):
    """Source engine "b" serving "s" (100-token prompt) and a target engine "t" behind a
    :class:`Held` handler over gRPC. Returns (src, tgt, handler, server, endpoint, session)."""
    src, _, _ = _engine()
    tgt, _, _ = _engine(lease_s=lease_s)
    tgt.ctx.agent_id = "t"
    handler = Held(tgt.target, hold)
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
