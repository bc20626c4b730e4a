"""Control service and scheme runner against a fake migration core (no vLLM)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from pallas_proto import pallas_pb2 as pb
from pallas_proto import pallas_pb2_grpc

from agent.control import ControlService, add_control_service
from agent.schemes import SCHEMES, Rates, SchemeRunner, ctho_split, scheme_name, scheme_value
from agent.session import Session, SessionStore
from agent.telemetry import TelemetryCollector

import fakes_agent as fk

B = pb.PeerEndpoint(agent_id="b", address="127.0.0.1:1")
C = pb.PeerEndpoint(agent_id="c", address="127.0.0.1:2")


def make(default="pallas", *, rates=None, reject=()):
    mig = fk.FakeMigrator(reject_targets=set(reject))
    runner = SchemeRunner(mig, default_scheme=default, rates=rates)
    store = SessionStore()
    store.add(Session("s1", "ue1", list(range(100))))
    svc = ControlService(runner, agent_id="a", has_session=lambda sid: sid in store,
                         telemetry=TelemetryCollector("a", lambda: list(store)).report)
    return svc, mig, runner, store


def run(coro):
    return asyncio.run(coro)


# ------------------------------------------------------------------ scheme names and the ctHO split

def test_scheme_names_roundtrip_and_errors():
    for v, spec in SCHEMES.items():
        assert scheme_value(spec.name) == v and scheme_name(v) == spec.name
        assert scheme_value(pb.Scheme.Name(v)) == v
    assert scheme_value(None, pb.SCHEME_CTHO) == pb.SCHEME_CTHO
    with pytest.raises(ValueError):
        scheme_value("teleport")
    with pytest.raises(ValueError):
        scheme_value(99)


def test_ctho_split_matches_brute_force_and_table1():
    # Qwen3-32B, 300 Mbit/s (model.md section 6): shipping a token costs 7 ms, recomputing
    # 0.5 ms, so almost everything is recomputed and ctHO at 4K is about 2 s (paper 2,058 ms).
    s_kv, B_ = 262_144, 300e6 / 8
    p, t = ctho_split(4096, 1900.0, s_kv, B_, 32)
    assert p % 32 == 0 and 3700 < p <= 4096 and 1.9 < t < 2.1
    for k in (0, 1, 31, 32, 33, 500, 1201):
        for r_p, b in ((100.0, 1e6), (5000.0, 1e9), (1900.0, B_)):
            p, t = ctho_split(k, r_p, s_kv, b, 32)
            brute = min(max(q / r_p, (k - q) * s_kv / b) for q in range(0, k // 32 * 32 + 1, 32))
            assert t == pytest.approx(brute) and p % 32 == 0 and p <= k
    # A free link ships everything; an infinitely fast prefill recomputes every whole block.
    assert ctho_split(1000, 1.0, 1.0, float("inf"), 32)[0] == 0
    assert ctho_split(1000, 1e12, 1e6, 1.0, 32)[0] == 992
    with pytest.raises(ValueError):
        ctho_split(10, 0.0, 1.0, 1.0, 32)


# ------------------------------------------------------------------ control calls

def test_trigger_then_commit_is_idempotent_and_uses_prepared_path():
    svc, mig, *_ = make()

    async def go():
        r1 = await svc.Trigger(pb.TriggerRequest(session_id="s1", epoch=1, target=B, split_tokens=64), None)
        r2 = await svc.Trigger(pb.TriggerRequest(session_id="s1", epoch=1, target=B, split_tokens=64), None)
        c1 = await svc.Commit(pb.CommitRequest(session_id="s1", epoch=1, actual_target=B), None)
        c2 = await svc.Commit(pb.CommitRequest(session_id="s1", epoch=1, actual_target=B), None)
        return r1, r2, c1, c2

    r1, r2, c1, c2 = run(go())
    assert r1.status == pb.STATUS_OK and r1 == r2 and r1.split_tokens == 64 and r1.scheme == pb.SCHEME_PALLAS
    assert c1.status == pb.STATUS_OK and c1 == c2 and c1.scheme == pb.SCHEME_PALLAS
    # The commit's reply says what the handover moved, as the migration core reported it.
    assert (c1.blocks_moved, c1.kv_bytes_moved, c1.reused_tokens, c1.recomputed_tokens) == (3, 12288, 96, 1)
    assert mig.ops() == ["trigger", "commit"]  # retries did no work
    commit = mig.calls[1]
    assert commit[4] is None and commit[5]["ship_blocks"] == "suffix"  # prepared split kept


def test_concurrent_retries_share_one_call():
    svc, mig, *_ = make()

    async def go():
        mig.gate = asyncio.Event()
        req = pb.TriggerRequest(session_id="s1", epoch=3, target=B)
        tasks = [asyncio.create_task(svc.Trigger(req, None)) for _ in range(5)]
        await asyncio.sleep(0.05)
        mig.gate.set()
        return await asyncio.gather(*tasks)

    replies = run(go())
    assert all(r == replies[0] for r in replies) and replies[0].status == pb.STATUS_OK
    assert mig.ops() == ["trigger"]


def test_stale_epochs_are_refused_and_do_nothing():
    svc, mig, *_ = make()

    async def go():
        await svc.Trigger(pb.TriggerRequest(session_id="s1", epoch=5, target=B), None)
        old_t = await svc.Trigger(pb.TriggerRequest(session_id="s1", epoch=4, target=C), None)
        old_c = await svc.Cancel(pb.CancelRequest(session_id="s1", epoch=2), None)
        old_m = await svc.Commit(pb.CommitRequest(session_id="s1", epoch=1, actual_target=B), None)
        cancel = await svc.Cancel(pb.CancelRequest(session_id="s1", epoch=5, reason="target changed"), None)
        again = await svc.Trigger(pb.TriggerRequest(session_id="s1", epoch=5, target=B), None)
        return old_t, old_c, old_m, cancel, again

    old_t, old_c, old_m, cancel, again = run(go())
    for r in (old_t, old_c, old_m):
        assert r.status == pb.STATUS_STALE_EPOCH and "older than the newest epoch 5" in r.message
    assert cancel.status == pb.STATUS_OK
    # The cached reply of the epoch-5 trigger still answers a retry of it (idempotence).
    assert again.status == pb.STATUS_OK
    assert mig.ops() == ["trigger", "cancel"]


def test_trigger_for_a_cancelled_epoch_is_stale():
    svc, mig, *_ = make()

    async def go():
        c = await svc.Cancel(pb.CancelRequest(session_id="s1", epoch=7), None)
        t = await svc.Trigger(pb.TriggerRequest(session_id="s1", epoch=7, target=B), None)
        return c, t

    c, t = run(go())
    assert c.status == pb.STATUS_OK and t.status == pb.STATUS_STALE_EPOCH and "cancelled" in t.message


def test_invalid_and_unknown():
    svc, mig, *_ = make()

    async def go():
        return (await svc.Trigger(pb.TriggerRequest(session_id="", epoch=1, target=B), None),
                await svc.Trigger(pb.TriggerRequest(session_id="s1", epoch=1), None),
                await svc.Commit(pb.CommitRequest(session_id="nope", epoch=1, actual_target=B), None))

    empty, no_target, unknown = run(go())
    assert empty.status == pb.STATUS_INVALID and no_target.status == pb.STATUS_INVALID
    assert unknown.status == pb.STATUS_UNKNOWN_SESSION
    assert mig.ops() == []


def test_commit_to_another_target_falls_back_to_ctho_with_the_split():
    rates = lambda sid, tgt: Rates(k_tokens=1200, r_p=160.0, s_kv=196_608, goodput=37.5e6, block_size=32)
    svc, mig, *_ = make(rates=rates)

    async def go():
        await svc.Trigger(pb.TriggerRequest(session_id="s1", epoch=1, target=B), None)
        return await svc.Commit(pb.CommitRequest(session_id="s1", epoch=1, actual_target=C), None)

    r = run(go())
    assert r.status == pb.STATUS_OK and r.scheme == pb.SCHEME_CTHO and "fallback from pallas" in r.message
    op, sid, epoch, tgt, split, kw = mig.calls[-1]
    expect, _ = ctho_split(1200, 160.0, 196_608, 37.5e6, 32)
    assert (op, tgt, split, kw["ship_blocks"]) == ("commit", "c", expect, "suffix")


def test_commit_with_no_trigger_recovers_by_ctho_and_newer_epoch_releases_old():
    svc, mig, *_ = make()

    async def go():
        await svc.Trigger(pb.TriggerRequest(session_id="s1", epoch=1, target=B), None)
        return await svc.Commit(pb.CommitRequest(session_id="s1", epoch=2, actual_target=B), None)

    r = run(go())
    assert r.status == pb.STATUS_OK and r.scheme == pb.SCHEME_CTHO
    assert mig.ops() == ["trigger", "cancel", "commit"] and mig.calls[1][2] == 1


def test_rejected_target_falls_back_to_detour_and_source_serves_on():
    detoured = []
    svc, mig, runner, _ = make(reject={"c"})
    runner.detour_hook = lambda sid, tgt: detoured.append((sid, tgt.agent_id))

    async def go():
        return await svc.Commit(pb.CommitRequest(session_id="s1", epoch=1, actual_target=C), None)

    r = run(go())
    assert r.status == pb.STATUS_OK and r.scheme == pb.SCHEME_DETOUR and r.state == "detour"
    assert "detour" in r.message and detoured == [("s1", "c")]


@pytest.mark.parametrize("name,trigger_kw,commit_kw", [
    ("pallas", dict(stream_suffix=True, recompute_prefix=True), dict(ship_blocks="suffix", split=None)),
    ("no-rc", dict(stream_suffix=True, recompute_prefix=False), dict(ship_blocks="suffix", split=None)),
    ("no-sm", dict(stream_suffix=False, recompute_prefix=True), dict(ship_blocks="none", split=None)),
    ("full-copy", None, dict(ship_blocks="all", split=0)),
    ("recomputation", None, dict(ship_blocks="none", split=0)),
    ("ctho", None, dict(ship_blocks="suffix", split=None)),
    ("detour", None, None),
])
def test_each_scheme_maps_onto_the_migration_core(name, trigger_kw, commit_kw):
    svc, mig, *_ = make(default=name)

    async def go():
        t = await svc.Trigger(pb.TriggerRequest(session_id="s1", epoch=1, target=B), None)
        c = await svc.Commit(pb.CommitRequest(session_id="s1", epoch=1, actual_target=B), None)
        return t, c

    t, c = run(go())
    assert t.status == pb.STATUS_OK and c.status == pb.STATUS_OK
    trig = [x for x in mig.calls if x[0] == "trigger"]
    commit = [x for x in mig.calls if x[0] == "commit"]
    if trigger_kw is None:
        assert trig == []
    else:
        assert {k: trig[0][5][k] for k in trigger_kw} == trigger_kw
    if commit_kw is None:
        assert commit == [] and c.scheme == pb.SCHEME_DETOUR
    else:
        assert commit[0][5]["ship_blocks"] == commit_kw["ship_blocks"] and commit[0][4] == commit_kw["split"]
        assert c.scheme == scheme_value(name)


def test_per_call_scheme_overrides_agent_default():
    svc, mig, *_ = make(default="pallas")

    async def go():
        return await svc.Commit(pb.CommitRequest(session_id="s1", epoch=1, actual_target=B,
                                                 scheme=pb.SCHEME_FULL_COPY), None)

    r = run(go())
    assert r.scheme == pb.SCHEME_FULL_COPY and mig.calls[0][5]["ship_blocks"] == "all"


def test_over_grpc_with_telemetry_stream():
    svc, mig, runner, store = make()
    store.get("s1").output_token_ids.extend([1, 2, 3])
    store.get("s1").token_times.extend([10.0, 10.1, 10.2])

    async def go():
        server = grpc.aio.server()
        add_control_service(server, svc)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = pallas_pb2_grpc.ControlStub(ch)
                t = await stub.Trigger(pb.TriggerRequest(session_id="s1", epoch=1, target=B))
                reports = []
                async for rep in stub.Telemetry(pb.TelemetryRequest(period_ms=20)):
                    reports.append(rep)
                    if len(reports) == 3:
                        break
                return t, reports
        finally:
            await server.stop(0)

    t, reports = run(go())
    assert t.status == pb.STATUS_OK
    assert len(reports) == 3 and reports[0].agent_id == "a"
    s = reports[-1].sessions[0]
    assert (s.session_id, s.tokens, s.prompt_tokens) == ("s1", 103, 100)
    assert s.decode_rate == pytest.approx(10.0, rel=1e-6)
    assert reports[1].time > reports[0].time


def test_target_side_gap_is_observed_once_per_resumed_session():
    from prometheus_client import REGISTRY

    from agent.obs import observe_resumed
    s = Session("r1", "ue", [1, 2, 3], output_token_ids=[7, 8, 9], token_times=[5.0, 5.0, 5.25],
                resumed_from=2)
    fresh = Session("r2", "ue", [1], output_token_ids=[4], token_times=[1.0], resumed_from=1)
    before = REGISTRY.get_sample_value("pallas_sit_seconds_sum") or 0.0
    assert observe_resumed([s, fresh]) == 1 and observe_resumed([s, fresh]) == 0
    assert REGISTRY.get_sample_value("pallas_sit_seconds_sum") - before == pytest.approx(0.25)


def test_scheme_carried_with_a_resumed_session_is_used():
    mig = fk.FakeMigrator()
    carried = {"s9": pb.SCHEME_RECOMPUTATION}
    runner = SchemeRunner(mig, default_scheme="pallas", carried_scheme=carried.get)
    assert runner.scheme_for("s9") == pb.SCHEME_RECOMPUTATION
    assert runner.scheme_for("other") == pb.SCHEME_PALLAS
    runner.set_session_scheme("s9", "ctho")
    assert runner.scheme_for("s9") == pb.SCHEME_CTHO and runner.scheme_for("s9", "detour") == pb.SCHEME_DETOUR


def test_commit_carries_the_sessions_pinned_scheme_to_the_next_agent():
    async def run():
        mig = fk.FakeMigrator()
        carried = {"c": pb.SCHEME_FULL_COPY}
        runner = SchemeRunner(mig, default_scheme="pallas", carried_scheme=carried.get)
        runner.set_session_scheme("p", "recomputation")
        tgt = pb.PeerEndpoint(agent_id="b", address="b:1")
        for sid in ("p", "c", "plain"):
            await runner.commit(sid, 1, tgt)
        sent = {c[1]: c[5]["session_scheme"] for c in mig.calls if c[0] == "commit"}
        # A per-call scheme is not a pin; the agent default is not carried either.
        await runner.commit("q", 1, tgt, scheme="recomputation")
        sent["q"] = [c for c in mig.calls if c[0] == "commit"][-1][5]["session_scheme"]
        assert sent == {"p": pb.SCHEME_RECOMPUTATION, "c": pb.SCHEME_FULL_COPY,
                        "plain": pb.SCHEME_UNSPECIFIED, "q": pb.SCHEME_UNSPECIFIED}
    asyncio.run(run())
