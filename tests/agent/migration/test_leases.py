"""Leases at the target (issue 45; agent/migration/target.py, docs/architecture.md §5): KV
reserved at admission, renewed by the source's messages and Renew calls, released at the commit,
on a Release or when no renewal came; a full target evicts or refuses higher ranks first."""

from __future__ import annotations

import asyncio

from pallas_proto import pallas_pb2 as pb
from prometheus_client import REGISTRY

from agent.states import SourceState
from agent.session import SessionState
from agent.transfer import CALLER, serve_peer_transfer
from migration.fakes import _blk, _engine, _prep, _serving

BLOCK = 65536


def metric(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def counters() -> dict[str, float]:
    out = {e: metric("pallas_lease_events_total", event=e)
           for e in ("granted", "renewed", "committed", "released", "expired", "evicted")}
    out["held"] = metric("pallas_leases_held")
    out["wasted"] = metric("pallas_wasted_prefill_tokens_total")
    return out


def delta(before: dict[str, float]) -> dict[str, float]:
    now = counters()
    return {k: now[k] - before[k] for k in now if now[k] != before[k]}


def _renew(sid="s", epoch=1):
    return pb.RenewRequest(session_id=sid, epoch=epoch)


def test_a_renewal_moves_the_lease_on_and_silence_past_it_expires_it():
    async def run():
        m, hub, eng = _engine(lease_s=1.0)
        before = counters()
        rep = await m.target.on_prepare(_prep(expected=BLOCK * 3))
        assert rep.status == pb.STATUS_OK and rep.lease_s == 1.0
        await asyncio.sleep(0)          # the warm-up (64 tokens) runs
        inb = m.ctx.inbound["s"]
        t0 = inb.touched
        await asyncio.sleep(0.01)
        r = await m.target.on_renew(_renew())
        assert r.status == pb.STATUS_OK and r.lease_s == 1.0
        t1 = inb.touched
        assert t1 > t0
        assert await m.target.expire(now=t0 + 1.0 + 1e-3) == 0     # renewed: not yet
        assert await m.target.expire(now=t1 + 1.0) == 0
        assert await m.target.expire(now=t1 + 1.0 + 1e-3) == 1
        assert m.held()["reserved_bytes"] == 0 and "s" not in m.ctx.inbound
        lost = await m.target.on_renew(_renew())
        return before, lost

    before, lost = asyncio.run(run())
    assert lost.status == pb.STATUS_UNKNOWN_SESSION
    assert delta(before) == {"granted": 1, "renewed": 1, "expired": 1, "wasted": 64}


def test_a_renewal_that_comes_while_the_expiry_drops_another_lease_keeps_its_own():
    """Found by ``soak.py --faults --targets 2``: after a 10 s stall of the agents' process the
    housekeeping found two leases silent past ``lease_s``; the source's renewal of the second
    came while the first was being dropped, and the second was expired anyway (logged
    ``silent_s=-0.736``). The expiry re-reads each lease before it drops it."""
    async def run():
        m, hub, eng = _engine(lease_s=1.0)
        for sid in ("s", "t"):
            assert (await m.target.on_prepare(_prep(sid=sid, expected=BLOCK))).status == pb.STATUS_OK
        await asyncio.sleep(0)
        later = max(i.touched for i in m.ctx.inbound.values()) + 1.0 + 1e-3
        drop = m.target.drop_inbound

        async def renewing_t(inb, reason, event="released"):   # "t" renewed meanwhile
            if inb.session_id == "s":
                assert (await m.target.on_renew(_renew("t"))).status == pb.STATUS_OK
            return await drop(inb, reason, event)

        m.target.drop_inbound = renewing_t
        n = await m.target.expire(now=later)
        return n, sorted(m.ctx.inbound)

    assert asyncio.run(run()) == (1, ["t"])


def test_every_message_of_the_attempt_renews_it():
    async def run():
        m, hub, eng = _engine(lease_s=1.0)
        await m.target.on_prepare(_prep(expected=BLOCK * 3))
        inb = m.ctx.inbound["s"]
        seen = [inb.touched]
        for call in (lambda: m.target.on_block(_blk(2)),
                     lambda: m.target.on_progress(pb.ProgressRequest(session_id="s", epoch=1)),
                     lambda: m.target.on_prepare(_prep(expected=BLOCK * 3))):
            await asyncio.sleep(0.005)
            got = call()
            if asyncio.iscoroutine(got):
                await got
            seen.append(inb.touched)
        return seen

    seen = asyncio.run(run())
    assert all(b > a for a, b in zip(seen, seen[1:])), seen


def test_release_and_renew_share_their_epoch_and_source_checks():
    """Target._from_source: a Release and a Renew of an older epoch are STALE, from a peer that
    is not the held attempt's source (its verified identity, CALLER) REJECTED; neither changes
    the lease or records the epoch. The source itself is answered OK."""
    async def run():
        m, hub, eng = _engine(lease_s=1.0)
        await m.target.on_prepare(_prep(epoch=2, expected=BLOCK))
        inb = m.ctx.inbound["s"]
        t = inb.touched
        got = {"stale": (await m.target.on_release(pb.ReleaseRequest(session_id="s", epoch=1)),
                         await m.target.on_renew(_renew(epoch=1)))}
        CALLER.set(frozenset({"mallory"}))
        got["other peer"] = (await m.target.on_release(pb.ReleaseRequest(session_id="s", epoch=3)),
                             await m.target.on_renew(_renew(epoch=2)))
        kept = (m.ctx.inbound.get("s") is inb, inb.touched == t, m.ctx.ledger.newest_in("s"))
        CALLER.set(frozenset({"a"}))
        got["source"] = (await m.target.on_renew(_renew(epoch=2)),
                         await m.target.on_release(pb.ReleaseRequest(session_id="s", epoch=2)))
        return got, kept, "s" in m.ctx.inbound

    got, kept, still_held = asyncio.run(run())
    assert [r.status for r in got["stale"]] == [pb.STATUS_STALE_EPOCH] * 2
    assert all(r.message == "newest epoch is 2" for r in got["stale"])
    assert [r.status for r in got["other peer"]] == [pb.STATUS_REJECTED] * 2
    assert all("mallory" in r.message for r in got["other peer"])
    assert kept == (True, True, 2)
    assert [r.status for r in got["source"]] == [pb.STATUS_OK] * 2 and not still_held


def test_renew_of_an_older_epoch_or_an_unknown_attempt_changes_nothing():
    async def run():
        m, hub, eng = _engine(lease_s=1.0)
        unknown = await m.target.on_renew(_renew())
        await m.target.on_prepare(_prep(epoch=2, expected=BLOCK))
        t = m.ctx.inbound["s"].touched
        stale = await m.target.on_renew(_renew(epoch=1))
        newer = await m.target.on_renew(_renew(epoch=3))
        return unknown, stale, newer, m.ctx.inbound["s"].touched == t

    unknown, stale, newer, same = asyncio.run(run())
    assert unknown.status == newer.status == pb.STATUS_UNKNOWN_SESSION
    assert stale.status == pb.STATUS_STALE_EPOCH and same


def test_the_commit_ends_the_lease_without_waste_and_a_release_ends_it_with():
    async def run():
        m, hub, eng = _engine(lease_s=5.0)
        before = counters()
        await m.target.on_prepare(_prep(prefix=64, expected=BLOCK * 4))
        await asyncio.sleep(0)
        rep = await m.target.on_sync(pb.SyncRequest(
            session_id="s", epoch=1, token_ids=list(range(200)), prompt_tokens=170,
            split_tokens=64, ue_id="ue", sampling=pb.SamplingParams(max_tokens=20)))
        committed = delta(before), m.held()["reserved_bytes"]
        before = counters()
        await m.target.on_prepare(_prep(sid="s2", prefix=96, expected=BLOCK * 4))
        await asyncio.sleep(0)
        rel = await m.target.on_release(pb.ReleaseRequest(session_id="s2", epoch=1, reason="cancel"))
        return rep, committed, rel, delta(before), m.held()["reserved_bytes"]

    rep, (committed, reserved_after_sync), rel, released, reserved = asyncio.run(run())
    assert rep.status == pb.STATUS_OK and rel.status == pb.STATUS_OK
    assert committed == {"granted": 1, "committed": 1} and reserved_after_sync == 0
    assert released == {"granted": 1, "released": 1, "wasted": 96} and reserved == 0


def test_a_full_target_evicts_a_lower_ranked_preparation_for_a_rank_0_one():
    async def run():
        m, hub, eng = _engine(free_blocks=4, lease_s=5.0)
        before = counters()
        low = _prep(sid="low", prefix=0, expected=3 * BLOCK)
        low.rank = 1
        assert (await m.target.on_prepare(low)).status == pb.STATUS_OK
        top = _prep(sid="top", prefix=0, expected=3 * BLOCK)      # rank 0
        got = await m.target.on_prepare(top)
        return got, sorted(m.ctx.inbound), delta(before), await m.target.on_renew(_renew("low"))

    got, held, d, lost = asyncio.run(run())
    assert got.status == pb.STATUS_OK and held == ["top"]
    assert d == {"granted": 2, "evicted": 1, "held": 1}
    assert lost.status == pb.STATUS_UNKNOWN_SESSION      # its source learns at its next renewal


def test_a_full_target_refuses_the_lower_rank_and_never_evicts_an_equal_one():
    async def run():
        m, hub, eng = _engine(free_blocks=4, lease_s=5.0)
        assert (await m.target.on_prepare(_prep(sid="a", prefix=0, expected=3 * BLOCK))).status \
            == pb.STATUS_OK
        low = _prep(sid="b", prefix=0, expected=3 * BLOCK)
        low.rank = 1
        refused_low = await m.target.on_prepare(low)          # rank 1 never evicts rank 0
        refused_top = await m.target.on_prepare(_prep(sid="c", prefix=0, expected=3 * BLOCK))
        # rank 2 present but evicting it would not make room: nothing is evicted
        m2, _, _ = _engine(free_blocks=4, lease_s=5.0)
        r2 = _prep(sid="x", prefix=0, expected=BLOCK)
        r2.rank = 2
        await m2.target.on_prepare(r2)
        big = await m2.target.on_prepare(_prep(sid="y", prefix=0, expected=6 * BLOCK))
        return refused_low, refused_top, sorted(m.ctx.inbound), big, sorted(m2.ctx.inbound)

    refused_low, refused_top, held, big, held2 = asyncio.run(run())
    assert refused_low.status == refused_top.status == pb.STATUS_REJECTED and held == ["a"]
    assert big.status == pb.STATUS_REJECTED and held2 == ["x"]


async def _pair(lease_s: float):
    """A source engine "b" serving "s" and a target engine "t" served over gRPC with ``lease_s``."""
    src, _, _ = _engine()
    tgt, _, _ = _engine(lease_s=lease_s)
    tgt.ctx.agent_id = "t"
    server, addr = await serve_peer_transfer(tgt.target, "127.0.0.1:0")
    return src, tgt, server, pb.PeerEndpoint(agent_id="t", address=addr), _serving(src, n_prompt=100)


def test_the_source_renews_while_it_holds_the_attempt_and_a_cancel_releases_it():
    """With no block flowing, the source's renewals move the lease on at the target (three
    renewals seen, each one keeping the attempt past the lease it renewed); a Cancel then
    releases it. Read off the target's clock of the last message (``touched``), not off
    wall-clock sleeps: under a loaded host a renewal may come late, which is the lease's
    business, not this rule's (the sleep-timed form failed at load 29)."""
    async def run():
        src, tgt, server, ep, s = await _pair(lease_s=0.3)
        try:
            assert (await src.trigger("s", 1, ep, split_tokens=96, scheme="no-sm")).status == pb.STATUS_OK
            inb = tgt.ctx.inbound["s"]
            seen = [inb.touched]
            kept = []
            for _ in range(400):                     # at most 20 s; ~0.3 s on a quiet host
                await asyncio.sleep(0.05)
                if inb.touched != seen[-1]:
                    seen.append(inb.touched)
                    # just short of the renewed lease's end: kept; just past it: it would go
                    kept.append(await tgt.target.expire(now=inb.touched + 0.29) == 0
                                and tgt.ctx.inbound.get("s") is inb)
                if len(seen) > 3:
                    break
            out = src.ctx.outbound["s"]
            await src.cancel("s", 1, "new prediction")
            return seen, kept, out.lease_s, sorted(tgt.ctx.inbound), tgt.held()["reserved_bytes"]
        finally:
            await src.close()
            await tgt.close()
            await server.stop(0)

    seen, kept, lease, held, reserved = asyncio.run(run())
    assert len(seen) == 4 and seen == sorted(seen), seen
    assert kept == [True, True, True] and lease == 0.3 and held == [] and reserved == 0


def test_a_lost_lease_ends_the_attempt_and_the_session_serves_on():
    async def run():
        src, tgt, server, ep, s = await _pair(lease_s=0.3)
        try:
            assert (await src.trigger("s", 1, ep, split_tokens=96, scheme="no-sm")).status == pb.STATUS_OK
            out = src.ctx.outbound["s"]
            assert s.state == SessionState.MIGRATING
            await tgt.target.drop_inbound(tgt.ctx.inbound["s"], "test", event="evicted")
            for _ in range(40):
                if out.state == SourceState.FAILED:
                    break
                await asyncio.sleep(0.025)
            return out.state, out.error, "s" in src.ctx.outbound, s.state
        finally:
            await src.close()
            await tgt.close()
            await server.stop(0)

    state, error, still, sstate = asyncio.run(run())
    assert state == SourceState.FAILED and "lease lost" in error
    assert not still and sstate == SessionState.SERVING


def test_a_repeated_trigger_renews_at_once():
    async def run():
        src, tgt, server, ep, s = await _pair(lease_s=30.0)   # the loop alone renews every 10 s
        try:
            first = await src.trigger("s", 1, ep, split_tokens=96, scheme="no-sm")
            t0 = tgt.ctx.inbound["s"].touched
            before = counters()
            await asyncio.sleep(0.05)
            again = await src.trigger("s", 1, ep, split_tokens=96, scheme="no-sm")
            for _ in range(40):
                if tgt.ctx.inbound["s"].touched > t0:
                    break
                await asyncio.sleep(0.01)
            return first, again, tgt.ctx.inbound["s"].touched > t0, delta(before)
        finally:
            await src.close()
            await tgt.close()
            await server.stop(0)

    first, again, renewed, d = asyncio.run(run())
    assert first.status == again.status == pb.STATUS_OK and renewed
    assert d == {"renewed": 1}
