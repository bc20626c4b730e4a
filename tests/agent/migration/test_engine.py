"""The migration engine (agent/migration/) and its Control servicer, with fakes
(tests/agent/migration/fakes.py): a fake vLLM client, a BlockHub with no connector, and peer
targets served over real gRPC."""

from __future__ import annotations

import asyncio
import time

import pytest
from pallas_proto import pallas_pb2 as pb

from agent.control_service import ControlService
from agent.ipc import LocalBlock, block_crc
from agent.migration import Outbound
from agent.migration.plan import tail_pays
from agent.states import TERMINAL, TRANSITIONS, SourceState, TargetState, check
from agent.session import SamplingSpec, Session, SessionState
from pallas_common.schemes import SCHEMES, scheme_name, scheme_value
from pallas_common.timing import HandoverState, commit_choice, ctho_split
from migration.fakes import IDENT, Target, _blk, _engine, _prep, _served, _serving, walk_table


def test_transition_table_is_walked_and_enforced():
    """Every state reaches a terminal one; every listed move is allowed, every other refused."""
    for enum_ in (SourceState, TargetState):
        walk_table(list(enum_), TRANSITIONS, TERMINAL, check)
    assert TERMINAL == {SourceState.COMMITTED, SourceState.CANCELLED, SourceState.FAILED,
                        TargetState.RELEASED}


def test_scheme_names_roundtrip_and_session_states_match_the_proto():
    for v, spec in SCHEMES.items():
        assert scheme_value(spec.name) == v and scheme_name(v) == spec.name
        assert scheme_value(pb.Scheme.Name(v)) == v
    assert scheme_value(None, pb.SCHEME_CTHO) == pb.SCHEME_CTHO
    with pytest.raises(ValueError):
        scheme_value("teleport")
    assert {"SESSION_" + s.name for s in SessionState} == set(pb.SessionState.keys()) - {"SESSION_UNSPECIFIED"}
    assert SessionState.HANDED_OVER.proto == pb.SESSION_HANDED_OVER


# ------------------------------------------------------------------ the commit-time choice

def _hs(**kw):
    base = dict(prefix_tokens=3200, prefilled_tokens=3200, received_blocks=10, handover_tokens=3540,
                block_size=32, s_kv=2048.0, r_p=2000.0, goodput=1e6, c_sync=0.01)
    base.update(kw)
    return HandoverState(**base)


def test_finished_warmup_commits_the_prepared_state():
    c = commit_choice(_hs())
    # 20 tokens missing at 2 KB over 1 MB/s: 41 ms + c; recomputing 340 tokens: 170 ms.
    assert c.option == "finish" and c.finish_s == pytest.approx(0.01 + 20 * 2048 / 1e6)
    assert c.recompute_s == pytest.approx(0.01 + 340 / 2000)


def test_slow_warmup_picks_the_alternative_and_never_waits_longer_than_it():
    # Only 320 of 3,200 prefix tokens prefilled at 200 tokens/s: finishing takes 14.4 s.
    c = commit_choice(_hs(prefilled_tokens=320, r_p=200.0, goodput=50e6))
    assert c.option == "ctho" and c.ctho_s < c.finish_s and c.ctho_split >= 320
    assert c.wait_s == 0.0
    # Over a slow link shipping the prefix is dear too: recomputation is chosen, keeping the
    # 320 prefilled tokens (never redone).
    c = commit_choice(_hs(prefilled_tokens=3100, received_blocks=0, handover_tokens=3300,
                          r_p=2000.0, goodput=1e3))
    assert c.option == "recompute" and c.recompute_s == pytest.approx(0.01 + (3300 - 3072) / 2000)
    # A finish chosen may wait at most as long as the best alternative would take.
    c = commit_choice(_hs(prefilled_tokens=3136, r_p=2000.0))
    assert c.option == "finish" and 0 < c.wait_s <= min(c.ctho_s, c.recompute_s)
    with pytest.raises(ValueError):
        commit_choice(_hs(prefilled_tokens=4000))


# ------------------------------------------------------------------ target side

def test_prepare_admission_reservation_and_epochs():
    async def run():
        m, hub, eng = _engine(free_blocks=2)
        other = pb.ModelIdentity()
        other.CopyFrom(IDENT)
        other.weights_digest = "cd"
        r = await m.target.on_prepare(_prep(model=other))
        assert r.status == pb.STATUS_REJECTED and "weights_digest" in r.message
        r = await m.target.on_prepare(_prep(expected=10**9))
        assert r.status == pb.STATUS_REJECTED and r.free_kv_bytes == 2 * 65536
        assert (await m.target.on_prepare(_prep(prefix=40))).status == pb.STATUS_INVALID
        assert (await m.target.on_prepare(_prep(epoch=2, expected=65536))).status == pb.STATUS_OK
        assert (await m.target.on_prepare(_prep(epoch=2))).message == "already prepared"
        # The reservation holds until Sync/Release: a second session sees only what is left
        # (nothing: the first one's prefix is 2 blocks, whatever its claim said).
        r = await m.target.on_prepare(_prep(sid="s2", expected=2 * 65536))
        assert r.status == pb.STATUS_REJECTED and r.free_kv_bytes == 0
        await asyncio.sleep(0)
        assert eng.prefills == [list(range(64))]   # warm-up with exactly the prefix
        assert (await m.target.on_prepare(_prep(epoch=1))).status == pb.STATUS_STALE_EPOCH
        assert m.target.on_block(_blk(2, epoch=2)) == "ok"
        assert m.target.on_block(_blk(3, epoch=1)) == "stale"
        assert m.target.on_block(_blk(3, epoch=2, crc=5)) == "bad"
        assert hub.store.num_blocks == 1
        rel = await m.target.on_release(pb.ReleaseRequest(session_id="s", epoch=1))
        assert rel.status == pb.STATUS_STALE_EPOCH and hub.store.num_blocks == 1
        rel = await m.target.on_release(pb.ReleaseRequest(session_id="s", epoch=2))
        assert rel.status == pb.STATUS_OK and rel.blocks_released == 1
        assert m.held()["reserved_bytes"] == 0 and m.held()["blocks"] == 0
        assert (await m.target.on_prepare(_prep(sid="s2", expected=2 * 65536))).status == pb.STATUS_OK
        assert m.target.on_block(_blk(4, epoch=2)) == "stale"   # released: nothing is taken any more
    asyncio.run(run())


def test_oversized_and_over_budget_blocks_are_refused_on_arrival():
    async def run():
        m, hub, eng = _engine(max_inbound_session_bytes=40, max_inbound_bytes=50)
        assert (await m.target.on_prepare(_prep())).status == pb.STATUS_OK
        assert (await m.target.on_prepare(_prep(sid="s2"))).status == pb.STATUS_OK
        assert m.target.on_block(_blk(2, data=b"\x00" * (65536 + 1))) == "refused"
        assert m.target.on_block(_blk(2, data=b"\x01" * 30)) == "ok"
        assert m.target.on_block(_blk(3, data=b"\x01" * 30)) == "refused"          # per attempt
        assert m.target.on_block(_blk(2, sid="s2", data=b"\x01" * 30)) == "refused"  # per agent
        assert hub.store.num_bytes == 30
    asyncio.run(run())


def test_inbound_state_expires_when_the_source_goes_silent():
    async def run():
        m, hub, eng = _engine(lease_s=0.05)
        assert (await m.target.on_prepare(_prep(expected=65536))).status == pb.STATUS_OK
        assert m.target.on_block(_blk(2)) == "ok"
        assert await m.target.expire() == 0
        await asyncio.sleep(0.1)
        assert await m.target.expire() == 1
        assert m.held() == {"inbound": 0, "outbound": 0, "blocks": 0, "bytes": 0,
                            "reserved_bytes": 0, "streams_queued": 0}
    asyncio.run(run())


def test_ledger_is_bounded():
    async def run():
        m, hub, eng = _engine(max_ledger=8)
        for i in range(50):
            await m.target.on_release(pb.ReleaseRequest(session_id=f"s{i}", epoch=1))
            await m.cancel(f"s{i}", 1)
        assert len(m.ctx.ledger._entries) <= 8 and len(m.ctx.ledger._newest) <= 8
    asyncio.run(run())


def test_sync_loads_only_blocks_that_arrived():
    """A streamed_blocks count above what arrived must not make the resume wait for blocks
    that never come: the load range ends at the last block held."""
    async def run():
        m, hub, eng = _engine()
        assert (await m.target.on_prepare(_prep(prefix=64))).status == pb.STATUS_OK
        m.target.on_block(_blk(2))
        tokens = list(range(200))
        rep = await m.target.on_sync(pb.SyncRequest(
            session_id="s", epoch=1, token_ids=tokens, prompt_tokens=170, streamed_blocks=4,
            split_tokens=64, ue_id="ue", sampling=pb.SamplingParams(max_tokens=20)))
        assert rep.status == pb.STATUS_OK
        load = eng.started[0][1]["pallas"]["load"]
        assert (load["first_block"], load["last_block"]) == (2, 2)
    asyncio.run(run())


def test_sync_resumes_with_reduced_sampling_and_load_params():
    async def run():
        m, hub, eng = _engine()
        assert (await m.target.on_prepare(_prep(prefix=64))).status == pb.STATUS_OK
        m.target.on_block(_blk(2))
        tokens = list(range(100))       # 70 prompt + 30 generated
        tail = _blk(3)
        tail.fill = 3
        rep = await m.target.on_sync(pb.SyncRequest(
            session_id="s", epoch=1, token_ids=tokens, prompt_tokens=70, tail=tail,
            streamed_blocks=1, split_tokens=64, ue_id="ue", session_scheme=pb.SCHEME_CTHO,
            sampling=pb.SamplingParams(max_tokens=20, ignore_eos=True)))
        assert rep.status == pb.STATUS_OK
        s, params = eng.started[0]
        assert s.state == SessionState.RESUMED and s.resumed_from == 30
        assert m.pinned_scheme("s") == pb.SCHEME_CTHO   # the UE's pin goes on with the session
        assert (rep.blocks_received, rep.bytes_received) == (2, len(_blk(2).data) + len(tail.data))
        assert s.remaining_tokens == 20 and s.all_token_ids == tokens
        load = params["pallas"]["load"]
        assert (load["first_block"], load["last_block"], load["prefix_len"]) == (2, 3, 64)
        bad = await m.target.on_sync(pb.SyncRequest(session_id="zz", epoch=1, token_ids=[1]))
        assert bad.status == pb.STATUS_UNKNOWN_SESSION
    asyncio.run(run())


def _sync_80(warmup_wait_s: float) -> pb.SyncRequest:
    """The Sync of session "s" (epoch 1) at 80 tokens over a 64-token prefix, allowing the
    target ``warmup_wait_s`` for its warm-up."""
    return pb.SyncRequest(session_id="s", epoch=1, token_ids=list(range(80)), prompt_tokens=70,
                          split_tokens=64, warmup_wait_s=warmup_wait_s,
                          sampling=pb.SamplingParams(max_tokens=5))


def test_sync_waits_for_the_warmup_no_longer_than_the_source_allows():
    async def run():
        m, hub, eng = _engine()
        eng.prefill_s = 5.0
        assert (await m.target.on_prepare(_prep(prefix=64))).status == pb.STATUS_OK
        prog = await m.target.on_progress(pb.ProgressRequest(session_id="s", epoch=1))
        assert prog.status == pb.STATUS_OK and not prog.warmup_done and prog.prefix_tokens == 64
        t0 = asyncio.get_running_loop().time()
        rep = await m.target.on_sync(_sync_80(warmup_wait_s=0.05))
        assert rep.status == pb.STATUS_OK
        assert asyncio.get_running_loop().time() - t0 < 1.0
        assert eng.prefilling_at_start == [0]   # the warm-up it stopped waiting for was aborted
    asyncio.run(run())


@pytest.mark.parametrize("wait_s", [0.0, 0.02])
def test_a_resume_never_prefills_beside_its_own_warmup(wait_s):
    """A Sync that does not wait for the whole warm-up (the source chose recompute, or the
    wait it allowed ran out) aborts it before the resumed request starts: vLLM would otherwise
    prefill the prefix twice, chunk by chunk in the same steps (default replay, efc672d)."""
    async def run():
        m, hub, eng = _engine()
        eng.prefill_s = 5.0
        assert (await m.target.on_prepare(_prep(prefix=64))).status == pb.STATUS_OK
        warmup = m.ctx.inbound["s"].warmup
        rep = await m.target.on_sync(_sync_80(warmup_wait_s=wait_s))
        assert rep.status == pb.STATUS_OK and len(eng.started) == 1
        assert eng.prefilling_at_start == [0] and warmup.cancelled()
        await m.close()
    asyncio.run(run())


def test_a_finished_warmup_is_left_alone_at_the_sync():
    async def run():
        m, hub, eng = _engine()
        eng.prefill_s = 0.0
        assert (await m.target.on_prepare(_prep(prefix=64))).status == pb.STATUS_OK
        warmup = m.ctx.inbound["s"].warmup
        await warmup
        rep = await m.target.on_sync(_sync_80(warmup_wait_s=0.0))
        assert rep.status == pb.STATUS_OK and not warmup.cancelled()
        await m.close()
    asyncio.run(run())


# ------------------------------------------------------------------ source side and Control

def test_control_idempotent_stale_and_unknown():
    async def run():
        m, hub, eng = _engine()
        target = Target()
        server, tgt = await _served(target)
        ctl = ControlService(m, agent_id="b")
        s = _serving(m, n_prompt=100)
        try:
            req = pb.TriggerRequest(session_id="s", epoch=5, target=tgt, split_tokens=64)
            r1, r2 = await asyncio.gather(ctl.Trigger(req, None), ctl.Trigger(req, None))
            old = await ctl.Trigger(pb.TriggerRequest(session_id="s", epoch=4, target=tgt), None)
            unknown = await ctl.Trigger(pb.TriggerRequest(session_id="x", epoch=1, target=tgt), None)
            empty = await ctl.Trigger(pb.TriggerRequest(session_id="s", epoch=6), None)
            c = await ctl.Cancel(pb.CancelRequest(session_id="s", epoch=5), None)
            again = await ctl.Trigger(pb.TriggerRequest(session_id="s", epoch=5, target=tgt), None)
        finally:
            await m.close()
            await server.stop(0)
        assert r1 == r2 and r1.status == pb.STATUS_OK and r1.split_tokens == 64
        assert target.ops().count("prepare") == 1            # the retry did no work
        assert old.status == pb.STATUS_STALE_EPOCH and "newest epoch 5" in old.message
        assert unknown.status == pb.STATUS_UNKNOWN_SESSION and empty.status == pb.STATUS_INVALID
        assert c.status == pb.STATUS_OK and s.state == SessionState.SERVING
        assert again == r1                                   # the cached reply, no new prepare
    asyncio.run(run())


@pytest.mark.parametrize("refuse_prepare,sync_status", [(True, pb.STATUS_OK),
                                                         (False, pb.STATUS_ERROR)])
def test_a_commit_the_target_refuses_or_fails_is_not_ok_and_the_source_serves_on(
        refuse_prepare, sync_status):
    """Issue 12 fault 1: the xApp moves a session back only on a non-OK reply."""
    async def run():
        m, hub, eng = _engine()
        target = Target(refuse_prepare=refuse_prepare, sync_status=sync_status)
        server, tgt = await _served(target)
        s = _serving(m, outputs=(5, 6, 7, 8))
        try:
            r = await m.commit("s", 1, tgt, pb.SCHEME_RECOMPUTATION, ue_tokens=2)
        finally:
            await m.close()
            await server.stop(0)
        return r, s

    r, s = asyncio.run(run())
    assert r.status in (pb.STATUS_REJECTED, pb.STATUS_ERROR) and r.scheme == pb.SCHEME_RECOMPUTATION
    assert s.state == SessionState.SERVING and s.frozen_at is None
    assert s.output_token_ids == [5, 6, 7, 8] and r.state == pb.SESSION_SERVING


def test_a_target_that_hangs_freezes_the_source_no_longer_than_the_commit_deadline():
    """Issue 12 fault 6: the Sync used to wait out a fixed 60 s RPC timeout, session frozen."""
    async def run():
        m, hub, eng = _engine(commit_deadline_s=0.5)
        server, tgt = await _served(Target(sync_delay_s=30.0))
        s = _serving(m)
        t0 = asyncio.get_running_loop().time()
        try:
            r = await m.commit("s", 1, tgt, pb.SCHEME_FULL_COPY)
        finally:
            took = asyncio.get_running_loop().time() - t0
            await m.close()
            await server.stop(0)
        return r, s, took

    r, s, took = asyncio.run(run())
    assert r.status == pb.STATUS_ERROR and s.state == SessionState.SERVING
    assert took < 1.5, took


def test_commit_sends_the_sync_the_target_needs_and_reports_what_moved():
    async def run():
        m, hub, eng = _engine()
        target = Target()
        server, tgt = await _served(target)
        s = _serving(m)
        m.set_session_scheme("s", "ctho")
        try:
            r = await m.commit("s", 1, tgt, pb.SCHEME_RECOMPUTATION)
            again = await m.commit("s", 1, tgt, pb.SCHEME_RECOMPUTATION)
        finally:
            await m.close()
            await server.stop(0)
        assert r.status == pb.STATUS_OK and again == r, r
        (sync,) = [c[1] for c in target.calls if c[0] == "sync"]
        assert list(sync.token_ids) == list(range(40)) + [5, 6, 7] and sync.prompt_tokens == 40
        assert sync.sampling.max_tokens == 47 and sync.scheme == pb.SCHEME_RECOMPUTATION
        assert sync.session_scheme == pb.SCHEME_CTHO
        assert (r.blocks_moved, r.kv_bytes_moved, r.reused_tokens, r.recomputed_tokens) == (1, 65536, 40, 3)
        assert s.state == SessionState.HANDED_OVER
    asyncio.run(run())


def test_detour_moves_nothing_and_releases_a_prepared_target():
    async def run():
        m, hub, eng = _engine()
        target = Target()
        server, tgt = await _served(target)
        s = _serving(m, n_prompt=100)
        try:
            assert (await m.trigger("s", 1, tgt)).status == pb.STATUS_OK
            r = await m.commit("s", 2, tgt, "detour")
        finally:
            await m.close()
            await server.stop(0)
        assert r.status == pb.STATUS_OK and r.scheme == pb.SCHEME_DETOUR
        assert target.ops() == ["prepare", "release"] and s.state == SessionState.SERVING
    asyncio.run(run())


async def _triggered():
    """Engine "b" serving session "s" (100-token prompt), triggered (epoch 1, split 96) to a
    served :class:`Target`; returns (engine, hub, target, server, endpoint, session)."""
    m, hub, _ = _engine()
    target = Target()
    server, tgt = await _served(target)
    s = _serving(m, n_prompt=100)
    assert (await m.trigger("s", 1, tgt, split_tokens=96)).status == pb.STATUS_OK
    return m, hub, target, server, tgt, s


def test_a_session_forgotten_with_a_prepared_attempt_releases_it():
    """soak.py --faults: a Trigger, then the session ends here and is forgotten (housekeeping)
    with no Commit or Cancel: the attempt, its export and the target's hold must end too."""
    async def run():
        m, hub, target, server, tgt, s = await _triggered()
        try:
            s.set_state(SessionState.FINISHED, finish_reason="length")
            m.ctx.sessions.pop("s")
            m.forget("s")
            for _ in range(100):
                if "release" in target.ops():
                    break
                await asyncio.sleep(0.02)
            held = m.held()
        finally:
            await m.close()
            await server.stop(0)
        assert held["outbound"] == 0 and "s" not in hub._exports, (held, hub._exports)
        assert target.ops() == ["prepare", "release"], target.ops()
    asyncio.run(run())


def test_a_session_forgotten_while_its_commit_runs_leaves_the_attempt_to_the_commit():
    """soak.py --faults: housekeeping forgot a finished session whose commit was in flight and
    abandoned the attempt under it (IllegalTransition cancelled -> committed, the target's resume
    undone); an attempt that is committing belongs to the commit."""
    async def run():
        m, hub, target, server, tgt, s = await _triggered()
        try:
            out = m.ctx.outbound["s"]
            out.to(SourceState.COMMITTING)
            m.forget("s")
            await asyncio.sleep(0.1)
            ops, still = target.ops(), m.ctx.outbound.get("s")
        finally:
            await m.close()
            await server.stop(0)
        assert still is out and out.state == SourceState.COMMITTING, (still, out.state)
        assert ops == ["prepare"], ops
    asyncio.run(run())


def test_prepared_commit_with_a_failed_warmup_takes_the_choice_and_reports_it():
    """Issue 13 item 4: the source asks the target's progress and commits the fastest way; a
    warm-up that ended without caching the prefix leaves the alternatives to compete."""
    async def run():
        m, hub, eng = _engine()
        m.ctx.prefill_rate = lambda: 100.0
        target = Target(progress=pb.ProgressReply(status=pb.STATUS_OK, prefix_tokens=96,
                                                  prefilled_tokens=0, warmup_done=False,
                                                  warmup_failed=True, prefill_rate=10.0))
        server, tgt = await _served(target)
        s = _serving(m, n_prompt=100)
        try:
            assert (await m.trigger("s", 1, tgt, split_tokens=96)).status == pb.STATUS_OK
            s._task = asyncio.ensure_future(asyncio.sleep(0))   # request ended: nothing to wait on
            await asyncio.sleep(0.01)
            r = await m.commit("s", 1, tgt)
        finally:
            await m.close()
            await server.stop(0)
        assert r.status == pb.STATUS_OK and r.HasField("choice")
        ch = r.choice
        assert ch.option in ("ctho", "recompute") and ch.finish_s > max(0.0, min(ch.ctho_s, ch.recompute_s))
        assert ch.prefix_tokens in (96, ch.ctho_split_tokens) and ch.handover_tokens == 103
        (sync,) = [c[1] for c in target.calls if c[0] == "sync"]
        assert sync.warmup_wait_s == 0.0       # it does not wait on a warm-up it chose against
    asyncio.run(run())


def test_a_warmup_running_past_its_estimate_is_finished_not_redone_by_ctho():
    """Found in the default replay: a target slower than its r_p (busy with other prefills)
    was still warming 1.6 s after the trigger, beyond split / r_p; the estimate of what the
    warm-up had left was 0, the choice took ctHO from L_done = 0 (queued behind the same
    warm-up, then shipping blocks the target was about to have) and the commit took 2.0 s.
    A warm-up the target reports running is at least one more step: finishing wins."""
    async def run():
        m, hub, eng = _engine()
        target = Target(progress=pb.ProgressReply(status=pb.STATUS_OK, prefix_tokens=96,
                                                  prefilled_tokens=0, warmup_done=False,
                                                  prefill_rate=10.0))
        server, tgt = await _served(target)
        s = _serving(m, n_prompt=100)
        try:
            assert (await m.trigger("s", 1, tgt, split_tokens=96)).status == pb.STATUS_OK
            m.ctx.outbound["s"].t_prepared -= 100.0          # 96 / 10 tok/s = 9.6 s, long past
            s._task = asyncio.ensure_future(asyncio.sleep(0))
            await asyncio.sleep(0.01)
            r = await m.commit("s", 1, tgt)
        finally:
            await m.close()
            await server.stop(0)
        assert r.status == pb.STATUS_OK, r.message
        assert r.HasField("choice") and r.choice.option == "finish", r.choice
        (sync,) = [c[1] for c in target.calls if c[0] == "sync"]
        assert sync.split_tokens == 96
    asyncio.run(run())


@pytest.mark.parametrize("link_bytes_per_s, option, streamed", [(2048.0, "recompute", 0),
                                                                 (1e9, "finish", 1)])
def test_a_finished_warmup_still_chooses_between_shipping_and_recomputing_the_suffix(
        link_bytes_per_s, option, streamed):
    """Found in the default replay (paper regime, 2.34 Mbit/s): with the warm-up done there was
    no choice, and a commit waited for a 64 KiB suffix block still on the link (140-300 ms)
    where recomputing its tokens fitted in the target's first step. Over a slow link the
    suffix is recomputed and the stream closed unsent; over a fast one it is shipped."""
    async def run():
        m, hub, eng = _engine()
        target = Target(progress=pb.ProgressReply(status=pb.STATUS_OK, prefix_tokens=96,
                                                  prefilled_tokens=96, warmup_done=True,
                                                  prefill_rate=1850.0))
        server, tgt = await _served(target)
        m.ctx.peers.get(tgt).bucket.rate = link_bytes_per_s
        s = _serving(m, n_prompt=100)
        try:
            assert (await m.trigger("s", 1, tgt, split_tokens=96)).status == pb.STATUS_OK
            stream = m.ctx.outbound["s"].stream
            data = bytes(65536)   # block 3 (tokens 96-127) completes at the commit point
            m.source.on_local_block(LocalBlock("s", 1, 3, 32, block_crc(data), data, False, 128))
            s._task = asyncio.ensure_future(asyncio.sleep(0))
            await asyncio.sleep(0.01)
            r = await m.commit("s", 1, tgt)
        finally:
            await m.close()
            await server.stop(0)
        assert r.status == pb.STATUS_OK and r.HasField("choice"), r
        assert r.choice.option == option and r.choice.handover_tokens == 103, r.choice
        (sync,) = [c[1] for c in target.calls if c[0] == "sync"]
        assert sync.streamed_blocks == streamed and sync.split_tokens == 96
        assert stream.task.done()
    asyncio.run(run())


def test_a_commit_point_behind_the_prepared_split_still_commits():
    """Found by benchmarks/soak.py: the UE's commit point (``ue_tokens``) can lie behind the
    split the trigger prepared (the trigger came at a block boundary the UE had not reached);
    the commit-time choice raised ValueError (L_hist > K_HO) and the commit failed with
    STATUS_ERROR. It chooses over the part of the prefix below the commit point."""
    async def run():
        m, hub, eng = _engine()
        m.ctx.prefill_rate = lambda: 100.0
        target = Target(progress=pb.ProgressReply(status=pb.STATUS_OK, prefix_tokens=128,
                                                  prefilled_tokens=40, warmup_done=False,
                                                  prefill_rate=10.0))
        server, tgt = await _served(target)
        s = _serving(m, n_prompt=100, outputs=list(range(30)))   # n = 130
        try:
            assert (await m.trigger("s", 1, tgt, split_tokens=128)).split_tokens == 128
            s._task = asyncio.ensure_future(asyncio.sleep(0))
            await asyncio.sleep(0.01)
            r = await m.commit("s", 1, tgt, ue_tokens=20)            # K_HO = 120 < 128
        finally:
            await m.close()
            await server.stop(0)
        assert r.status == pb.STATUS_OK, r.message
        assert r.HasField("choice") and r.choice.handover_tokens == 120
        # the warm-up of 128 is still running: every option waits for it and finishing wins
        assert r.choice.ctho_split_tokens <= 96 and r.choice.prefix_tokens <= 96, r.choice
        (sync,) = [c[1] for c in target.calls if c[0] == "sync"]
        assert len(sync.token_ids) == 120 and sync.split_tokens <= 120
    asyncio.run(run())


def test_a_commit_that_ships_nothing_closes_the_prepared_suffix_stream():
    """Found by benchmarks/soak.py (live tasks and 64 KiB blocks grew with every migration):
    a prepared attempt committed without shipping (its request already ended here, or the
    commit-time choice recomputes) left its suffix stream open for ever; the call, the
    target's handler and the last block sent stayed alive."""
    async def run():
        m, hub, target, server, tgt, s = await _triggered()
        try:
            stream = m.ctx.outbound["s"].stream
            assert stream is not None and not stream.task.done()
            s._task = asyncio.ensure_future(asyncio.sleep(0))
            s.set_state(SessionState.FINISHED, finish_reason="length")   # it ended here first
            r = await m.commit("s", 1, tgt)
            await asyncio.sleep(0.2)
            closed = stream.task.done()
        finally:
            await m.close()
            await server.stop(0)
        assert r.status == pb.STATUS_OK and s.state == SessionState.HANDED_OVER
        assert closed
    asyncio.run(run())


def test_commit_block_wait_ends_with_the_request_not_at_a_poll_timeout():
    async def run():
        m, hub, eng = _engine()
        s = Session("s", "ue", list(range(40)), SamplingSpec(max_tokens=50))
        s._task = asyncio.ensure_future(asyncio.sleep(0.02))
        out = Outbound(session=s, epoch=1, target=pb.PeerEndpoint(agent_id="b", address="x:1"),
                       client=None, split=32, first_block=1, scheme=pb.SCHEME_PALLAS,
                       proactive=True, stream_suffix=True)
        out.full.add(1)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.wait_for(m.source._wait_blocks(out, 70, loop.time() + 10), 5.0)
        assert loop.time() - t0 < 0.3 and out.tail is None
        # A tail copied out after the request ended is still taken.
        s._task = asyncio.ensure_future(asyncio.sleep(30))
        loop.call_later(0.02, lambda: (setattr(out, "tail", LocalBlock("s", 1, 2, 6, 0, b"t", True, 70)),
                                       out.note()))
        t0 = loop.time()
        await asyncio.wait_for(m.source._wait_blocks(out, 70, loop.time() + 10), 5.0)
        assert loop.time() - t0 < 0.3 and out.tail.idx == 2 and not s._task.done()
        s._task.cancel()
    asyncio.run(run())


async def _ctho_commit_split(setup, outputs=(), max_tokens=50):
    """Commit session "s" (300 prompt tokens, ``outputs``) by the ctHO scheme to a target that
    measures r_p 50 tok/s over a 4-blocks/s link; ``setup(m, s, tgt)`` runs first. Returns
    (the split the Sync carried, what ``setup`` returned)."""
    m, hub, eng = _engine(commit_deadline_s=4.0)   # no block comes: waits half of it
    target = Target(progress=pb.ProgressReply(status=pb.STATUS_UNKNOWN_SESSION,
                                              prefill_rate=50.0))
    server, tgt = await _served(target)
    m.ctx.peers.get(tgt).bucket.rate = 65536.0 * 4     # B: 4 blocks/s
    s = _serving(m, n_prompt=300, outputs=outputs, max_tokens=max_tokens)
    m.session_schemes["s"] = pb.SCHEME_CTHO        # the ctHO scheme's own session
    extra = setup(m, s, tgt)
    try:
        r = await m.commit("s", 1, tgt, "ctho")
    finally:
        await m.close()
        await server.stop(0)
    assert r.status == pb.STATUS_OK
    (sync,) = [c[1] for c in target.calls if c[0] == "sync"]
    return sync.split_tokens, extra


def test_ctho_split_uses_the_targets_measured_prefill_rate():
    """Issue 13 item 3: the split used the source's (never written, 5,000 tokens/s) rate."""
    def fast_source(m, s, tgt):
        m.ctx.prefill_rate = lambda: 1e6                    # the source prefills fast

    split, _ = asyncio.run(_ctho_commit_split(fast_source))
    want, _ = ctho_split(300, 32, 50.0, 2048.0, 65536.0 * 4)
    assert split == want and want < ctho_split(300, 32, 1e6, 2048.0, 65536.0 * 4)[0]


def test_ctho_back_to_the_agent_the_session_came_from_ships_only_what_it_lacks():
    """A ping-pong: the session came here from agent "t" and hands back to it; "t" still holds
    the blocks it computed (vLLM's prefix cache), so ctHO's split starts after them
    (docs/model.md §8) instead of shipping blocks "t" has; to any other agent it is plain."""
    from agent.migration.source import held_at

    def came_from(agent):
        def setup(m, s, tgt):
            s.resumed_agent, s.resumed_from = agent, 30     # it took over after output 30
            return held_at(s, tgt)
        return setup

    split, held = asyncio.run(_ctho_commit_split(came_from("t"), tuple(range(1, 41)), 100))
    assert held == 300 + 30 - 1
    want, _ = ctho_split(340, 32, 50.0, 2048.0, 65536.0 * 4, held_tokens=held)
    assert split == want and want >= 320 > ctho_split(340, 32, 50.0, 2048.0, 65536.0 * 4)[0]
    assert asyncio.run(_ctho_commit_split(came_from("elsewhere"), tuple(range(1, 41)), 100)) \
        == (ctho_split(340, 32, 50.0, 2048.0, 65536.0 * 4)[0], 0)


def test_goodput_counts_time_spent_sending_not_waiting_for_blocks():
    """Issue 13 item 3: B was bytes over the gap between sends (the decode rate, here 5
    blocks/s); over loopback the link itself is far faster."""
    from agent.transfer import PeerClient

    async def run():
        server, tgt = await _served(Target())
        client = PeerClient(tgt.address)
        stream = client.open_stream("s", 1)
        data = b"\x01" * 65536
        for i in range(4):
            stream.send(pb.KVBlock(session_id="s", epoch=1, block_index=i, fill=32,
                                   checksum=block_crc(data), data=data))
            await asyncio.sleep(0.2)
        await stream.finish(5)
        b = client.goodput_bytes_per_s
        measured_at = client.telemetry("t").measured_at
        await client.close()
        await server.stop(0)
        return b, measured_at

    b, measured_at = asyncio.run(run())
    assert b > 20 * 65536 / 0.2, b       # not 65536 B / 0.2 s
    assert measured_at > 0


def test_a_proactive_commit_with_nothing_prepared_there_recovers_by_ctho():
    """The xApp cannot know that a prepared attempt failed since, or was never made: the
    engine recovers by ctHO at the actual target and says so in the reply."""
    async def run():
        m, hub, eng = _engine(commit_deadline_s=4.0)   # no block comes: waits half of it
        target = Target()
        server, tgt = await _served(target)
        _serving(m, n_prompt=100)
        try:
            r = await m.commit("s", 1, tgt)           # the agent default: pallas
        finally:
            await m.close()
            await server.stop(0)
        (sync,) = [c[1] for c in target.calls if c[0] == "sync"]
        assert r.status == pb.STATUS_OK and r.scheme == pb.SCHEME_CTHO == sync.scheme
        assert "fallback from pallas" in r.message
    asyncio.run(run())


def test_pallas_fallback_for_a_session_still_in_its_prefill_recomputes_at_the_target():
    """A ctHO fallback of a Pallas session whose prompt is still being prefilled here (no output
    yet): no KV exists to ship, so the target computes the prompt (Recomputation, nothing
    streamed); the ctHO scheme itself, and a Pallas session with outputs, keep ctHO."""
    async def run(outputs, pin):
        m, hub, eng = _engine(commit_deadline_s=4.0)
        target = Target()
        server, tgt = await _served(target)
        s = _serving(m, n_prompt=100, outputs=outputs)
        m.session_schemes["s"] = pin
        try:
            r = await m.commit("s", 1, tgt, pb.SCHEME_CTHO)   # the xApp's fallback
        finally:
            await m.close()
            await server.stop(0)
        (sync,) = [c[1] for c in target.calls if c[0] == "sync"]
        return r, sync
    r, sync = asyncio.run(run((), pb.SCHEME_PALLAS))
    assert r.status == pb.STATUS_OK and sync.scheme == pb.SCHEME_RECOMPUTATION
    assert sync.streamed_blocks == 0 and not sync.HasField("tail")
    r, sync = asyncio.run(run((), pb.SCHEME_CTHO))
    assert sync.scheme == pb.SCHEME_CTHO
    r, sync = asyncio.run(run((5, 6, 7), pb.SCHEME_PALLAS))
    assert sync.scheme == pb.SCHEME_CTHO


def test_the_tail_crosses_the_link_only_where_that_beats_recomputing_it():
    """docs/model.md Eq. 6: the partial last block is recomputed at the target unless shipping its
    KV is faster (B > s_kv * r_p). s_kv 2,048 B/token at r_p 1,850 tokens/s: 3.8 MB/s."""
    from types import SimpleNamespace as NS

    m, hub, eng = _engine()

    def pays(goodput, limit):   # as the commit's plan decides it (Source._plan)
        r_p, b = m.source._rates_for(NS(client=NS(goodput_bytes_per_s=goodput, bucket=NS(rate=limit))),
                                     1850.0)
        return tail_pays(b, float(IDENT.kv_bytes_per_token), r_p)
    assert not pays(0.0, 2.34e6 / 8)     # the paper regime's scaled link
    assert not pays(3.0e6, 0.0)          # measured, just below s_kv * r_p
    assert pays(5.0e6, 0.0)              # measured, above it
    assert pays(0.0, 0.0)                # unlimited loopback, nothing measured


def test_warmup_rate_counts_only_the_tokens_the_engine_computed():
    """Issue 13 item 3: a warm-up whose prefix was mostly in the prefix cache (a session back at
    an agent it left) is not an r_p sample; a fresh one is, at computed tokens / time taken."""
    async def run():
        m, hub, eng = _engine()
        eng.prefill_s = 0.05
        eng.cached = 320 - 32          # 1 block of 10 computed: below the sample floor
        assert (await m.target.on_prepare(_prep(prefix=320, expected=65536))).status == pb.STATUS_OK
        await m.ctx.inbound["s"].warmup
        assert m.target.warmup_rate.value is None or m.target.warmup_rate.value == 0
        eng.cached = 64                # 256 of 320 computed in ~0.05 s: about 5,000 tokens/s
        assert (await m.target.on_prepare(_prep(sid="s2", prefix=320, expected=65536))).status == pb.STATUS_OK
        await m.ctx.inbound["s2"].warmup
        await m.close()
        assert 256 / 0.2 < m.target.warmup_rate.value <= 256 / 0.05 + 1, m.target.warmup_rate.value
    asyncio.run(run())


def test_progress_reports_no_prefix_before_the_warmup_step_ends():
    """Issue 13 item 4: the prefix is one engine step; until it ends nothing of it is cached,
    so the progress reply says L_done = 0 (a time-based guess let "recompute" reuse a prefix
    that was not there yet), and the whole prefix once it is done."""
    async def run():
        m, hub, eng = _engine()
        m.target.warmup_rate.update(100_000.0)   # a fast measured rate must not invent progress
        eng.prefill_s = 0.3
        assert (await m.target.on_prepare(_prep(prefix=320, expected=65536))).status == pb.STATUS_OK
        await asyncio.sleep(0.05)
        early = await m.target.on_progress(pb.ProgressRequest(session_id="s", epoch=1))
        await m.ctx.inbound["s"].warmup
        late = await m.target.on_progress(pb.ProgressRequest(session_id="s", epoch=1))
        await m.close()
        assert (early.prefilled_tokens, early.warmup_done) == (0, False)
        assert (late.prefilled_tokens, late.warmup_done) == (320, True)
    asyncio.run(run())


async def _decode(s, every_s=0.03, tok=9):
    """Append a token to ``s`` every ``every_s`` (the source's engine decoding on)."""
    while True:
        await asyncio.sleep(every_s)
        if s.frozen_at is None:
            s.append_tokens([tok])


async def _bridged_commit(m, target, epoch, before=None):
    """Serve a decoding session "s" at ``m``, run ``before(tgt)`` then a pallas-bridge commit to
    ``target``; returns (reply, seconds the commit took, session, tokens before the commit)."""
    server, tgt = await _served(target)
    s = _serving(m, n_prompt=96)
    s._task = asyncio.ensure_future(asyncio.sleep(30))          # the request runs on
    dec = asyncio.ensure_future(_decode(s))
    try:
        if before is not None:
            await before(tgt)
        n0 = s.num_tokens
        t0 = time.monotonic()
        r = await m.commit("s", epoch, tgt, "pallas-bridge")
        return r, time.monotonic() - t0, s, n0
    finally:
        dec.cancel()
        s._task.cancel()
        await m.close()
        await server.stop(0)


def test_bridge_decodes_on_until_the_target_holds_the_state_then_hands_over_after_a_token():
    """Issue 13 item 5 (pallas-bridge): the commit does not freeze the session while the target
    is not ready; the source keeps producing tokens (relayed to the UE by the new agent) and
    hands over once the target's warm-up ended and every full block arrived."""
    async def run():
        m, hub, eng = _engine(bridge_poll_s=0.01)
        target = Target(progress=pb.ProgressReply(status=pb.STATUS_OK, warmup_done=False))

        async def ready_later():
            # ready once the commit polls and the source has decoded 5 more tokens since (read
            # off the session, not a wall-clock sleep: a loaded host decodes fewer per second)
            while "progress" not in target.ops():
                await asyncio.sleep(0.01)
            s = m.ctx.sessions.get("s")
            n1 = s.num_tokens
            while s.num_tokens < n1 + 5:
                await asyncio.sleep(0.01)
            target.progress = pb.ProgressReply(status=pb.STATUS_OK, warmup_done=True, blocks_received=10)

        async def trigger(tgt):
            assert (await m.trigger("s", 1, tgt, split_tokens=96, scheme="pallas-bridge")).status == pb.STATUS_OK
            asyncio.ensure_future(ready_later())

        r, took, s, n0 = await _bridged_commit(m, target, 1, trigger)
        assert r.status == pb.STATUS_OK and r.scheme == pb.SCHEME_PALLAS_BRIDGE, r
        (sync,) = [c[1] for c in target.calls if c[0] == "sync"]
        # decoded on while the target was not ready (5 tokens at least, a token every 30 ms)
        assert took >= 0.1 and len(sync.token_ids) >= n0 + 5, (took, len(sync.token_ids), n0)
        assert target.ops().count("progress") >= 3
        assert s.state == SessionState.HANDED_OVER
    asyncio.run(run())


def test_bridge_unprepared_prepares_with_ctho_split_and_is_bounded_by_bridge_max_s():
    """With nothing prepared at the actual target, bridging starts an attempt there (ctHO's
    split, prefix prefilled, blocks streamed) and relays meanwhile; a target that never gets
    ready is handed over anyway after bridge_max_s (the rest is recomputed there)."""
    async def run():
        # a slow link (1 Mbit/s): ctHO recomputes the whole-block prefix rather than ship it
        m, hub, eng = _engine(bridge_poll_s=0.01, bridge_max_s=0.25, link_rate_mbps=1.0,
                              commit_deadline_s=1.0)
        target = Target(progress=pb.ProgressReply(status=pb.STATUS_OK, warmup_done=False,
                                                  prefill_rate=2000.0))
        r, took, s, n0 = await _bridged_commit(m, target, 3)
        assert r.status == pb.STATUS_OK, r
        ops = target.ops()
        assert ops[0] == "progress" and "prepare" in ops and ops[-1] == "sync"   # ctHO rate, then prepare
        (prep,) = [c[1] for c in target.calls if c[0] == "prepare"]
        assert len(prep.prefix_token_ids) > 0 and len(prep.prefix_token_ids) % 32 == 0
        assert 0.25 <= took < 0.25 + 1.0 + 0.5, took   # bridge bound + the commit's own deadline
    asyncio.run(run())


def test_choice_waits_for_a_running_warmup_since_every_option_queues_behind_it():
    """docs/model.md §8 as measured: a warm-up still running is one engine step the target
    cannot cut short, so recompute and ctHO would wait for it too; with it cached afterwards,
    finishing the prepared state is never worse, and the wait is bounded by the alternatives."""
    running = commit_choice(_hs(prefilled_tokens=0, received_blocks=10, warmup_left_s=0.5))
    assert running.option == "finish"
    assert running.finish_s <= min(running.ctho_s, running.recompute_s)
    assert 0.5 <= running.wait_s <= min(running.ctho_s, running.recompute_s)
    done = commit_choice(_hs(prefilled_tokens=3200, received_blocks=10))
    assert done.option == "finish" and done.finish_s < running.finish_s
    with pytest.raises(ValueError):
        commit_choice(_hs(warmup_left_s=-1.0))


def test_a_background_failure_nobody_awaits_is_logged_and_retrieved():
    """A warm-up whose engine fails before any Sync reads it: logged with its task's name, and
    its exception retrieved (asyncio then reports nothing at the task's collection)."""
    from structlog.testing import capture_logs
    m, _, _ = _engine()

    async def boom():
        raise RuntimeError("engine died")

    async def run():
        with capture_logs() as logs:
            t = m.ctx.spawn(boom(), "warmup-s-1")
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        return t, logs

    t, logs = asyncio.run(run())
    assert t.done() and t not in m.ctx.tasks
    failed = [e for e in logs if e["event"] == "background_task_failed"]
    assert failed and failed[0]["task"] == "warmup-s-1" and "engine died" in failed[0]["error"]
    assert t._log_traceback is False  # retrieved: asyncio's "never retrieved" will not fire


def test_corrupting_peers_zero_the_chosen_blocks_and_keep_their_checksums():
    """tests/faults.py's CorruptingPeers, installed in the engine's context, zeroes in flight
    the data of the blocks it is given (the checksum stays the original's) and nothing else:
    what the e2e checksum tests rely on."""
    from tests.faults import CorruptingPeers

    class Recording(Target):
        def __init__(self):
            super().__init__()
            self.blocks: dict[int, tuple[bytes, int]] = {}

        def on_block(self, blk, crc_ok=None):
            self.blocks[blk.block_index] = (bytes(blk.data), blk.checksum)
            return "ok"

    async def run():
        m, hub, eng = _engine()
        target = Recording()
        server, tgt = await _served(target)
        _serving(m, n_prompt=40, outputs=tuple(range(60)))
        m.ctx.peers = CorruptingPeers(m.ctx.peers, {("s", 2)})
        data = {i: bytes([i + 1]) * 16 for i in (1, 2, 3)}
        try:
            rep = await m.trigger("s", 1, tgt, split_tokens=32, scheme="pallas")
            for i, d in data.items():
                m.source.on_local_block(LocalBlock("s", 1, i, 32, block_crc(d), d))
            out = m.ctx.outbound["s"]
            await out.stream.finish(5.0)
        finally:
            await m.close()
            await server.stop(0)
        return rep, target.blocks, data

    rep, got, data = asyncio.run(run())
    assert rep.status == pb.STATUS_OK and sorted(got) == [1, 2, 3]
    assert got[1] == (data[1], block_crc(data[1])) and got[3] == (data[3], block_crc(data[3]))
    assert got[2] == (bytes(16), block_crc(data[2]))
