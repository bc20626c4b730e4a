"""xapp.store: the xApp's durable state in memory and in OSC SDL over a real redis-server.

The SDL tests start a private redis-server (tests/xapp/redis_server.py) and reach it the way an
OSC xApp reaches DBaaS: ``DBAAS_SERVICE_HOST`` / ``DBAAS_SERVICE_PORT``, ricxappframe's
``SDLWrapper``, ricsdl. Each test uses its own SDL namespace.
"""

from __future__ import annotations

import threading
import time

import pytest

from xapp.store import (EPOCH_COUNTER_BITS, InFlightMigration, MemoryStore, MigrationJournal,
                        SdlStore, SessionBinding, StoreError, StoreUnavailable, open_store,
                        recovery_plan, split_epoch)


@pytest.fixture(params=["memory", "sdl"])
def make_store(request, sdl_ns):
    """A factory of stores of one kind; SDL stores made by it share one namespace (restarts)."""
    made = []

    def make():
        s = MemoryStore() if request.param == "memory" else SdlStore(sdl_ns)
        made.append(s)
        return s
    if request.param == "sdl":
        request.getfixturevalue("dbaas")
    yield make
    for s in made:
        s.close()


def test_a_sessions_epochs_increase_and_a_returning_session_id_continues_above(make_store):
    st = make_store()
    g = st.generation
    e = lambda n: (g << EPOCH_COUNTER_BITS) | n  # noqa: E731
    assert [st.allocate_epoch("s1") for _ in range(3)] == [e(1), e(2), e(3)]
    assert [st.allocate_epoch("s2"), st.last_epoch("s1"), st.last_epoch("nobody")] \
        == [e(1), e(3), 0]
    st.end_session("s1")
    assert st.last_epoch("s1") == 0
    assert [st.allocate_epoch("s1"), st.allocate_epoch("s3")] == [e(4), e(4)]
    assert split_epoch(st.allocate_epoch("s2")) == (g, 2)


def test_memory_store_numbers_epochs_from_one_as_test_mode_does_today():
    st = MemoryStore()
    assert (st.generation, [st.allocate_epoch("s") for _ in range(3)]) == (0, [1, 2, 3])


def test_bindings_and_in_flight_migrations_round_trip_and_end_with_the_session(make_store):
    st = make_store()
    b = SessionBinding("s1", "agent-a", ue_id="ue-7", scheme=1, fallback=4, relay_hops=1)
    st.put_binding(b)
    st.put_binding(SessionBinding("s2", "agent-b"))
    assert st.binding("s1") == b and st.binding("zz") is None
    assert set(st.bindings()) == {"s1", "s2"}

    m5 = InFlightMigration("s1", 5, "agent-a", "agent-b", scheme=1, t_ho=12.5, started_at=1.0)
    assert st.put_migration(m5)
    assert not st.put_migration(InFlightMigration("s1", 4, "agent-a", "agent-c"))  # stale
    assert st.migration("s1") == m5
    m6 = InFlightMigration("s1", 6, "agent-a", "agent-b", phase="committing", started_at=2.0)
    assert st.put_migration(m6) and st.migrations() == [m6]
    assert not st.finish_migration("s1", 5) and st.migration("s1") == m6
    assert st.finish_migration("s1", 6) and st.migrations() == []
    assert not st.finish_migration("s1", 6)

    st.put_migration(m5)
    st.end_session("s1")
    assert (st.binding("s1"), st.migration("s1"), list(st.bindings())) == (None, None, ["s2"])


def test_records_reject_a_bad_phase_or_epoch_and_ignore_fields_of_a_newer_xapp(make_store):
    with pytest.raises(StoreError, match="phase"):
        InFlightMigration("s", 1, "a", "b", phase="done")
    with pytest.raises(StoreError, match="positive"):
        InFlightMigration("s", 0, "a", "b")
    st = make_store()
    st._put("binding", "s9", {"session_id": "s9", "agent_id": "a", "cell": "c-1"})
    assert st.binding("s9") == SessionBinding("s9", "a")
    st._put("binding", "s8", {"session_id": "s8"})
    with pytest.raises(StoreError, match="malformed SessionBinding"):
        st.binding("s8")


def test_after_a_restart_epochs_are_larger_and_in_flight_migrations_are_found(dbaas, sdl_ns):
    """Allocate, "restart" (a new store object on the same Redis), allocate again."""
    before = SdlStore(sdl_ns)
    issued = [before.allocate_epoch("s1") for _ in range(5)] + [before.allocate_epoch("s2")]
    before.put_binding(SessionBinding("s1", "agent-a", ue_id="ue-1"))
    prep = InFlightMigration("s1", issued[4], "agent-a", "agent-b", started_at=1.0)
    comm = InFlightMigration("s2", issued[5], "agent-c", "agent-a", phase="committing",
                             started_at=2.0)
    before.put_migration(prep)
    before.put_migration(comm)
    before.close()

    after = SdlStore(sdl_ns)
    assert after.generation > before.generation
    first = [after.allocate_epoch("s1"), after.allocate_epoch("s2")]
    assert min(first) > max(issued)
    assert after.binding("s1") == SessionBinding("s1", "agent-a", ue_id="ue-1")
    assert [(s.action, s.migration) for s in recovery_plan(after)] \
        == [("cancel", prep), ("commit", comm)]
    after.close()


def test_concurrent_allocations_are_unique_across_threads_and_instances(dbaas, sdl_ns):
    shared = SdlStore(sdl_ns)
    barrier = threading.Barrier(8)
    got: dict[int, list[int]] = {}

    def run(i: int) -> None:
        barrier.wait()
        st = shared if i % 2 else SdlStore(sdl_ns)  # half share one store, half start their own
        got[i] = [st.allocate_epoch("hot") for _ in range(200)]
        if st is not shared:
            st.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    every = [e for lst in got.values() for e in lst]
    assert len(got) == 8 and len(every) == 1600 and len(set(every)) == 1600
    assert all(lst == sorted(lst) for lst in got.values())
    gens = {split_epoch(lst[0])[0] for i, lst in got.items() if i % 2 == 0}
    assert len(gens) == 4 and shared.generation not in gens
    shared.close()


def test_concurrent_allocations_in_one_memory_store_are_unique():
    st = MemoryStore()
    got: list[list[int]] = []
    threads = [threading.Thread(target=lambda: got.append([st.allocate_epoch("s")
                                                           for _ in range(500)]))
               for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = sorted(e for lst in got for e in lst)
    assert every == list(range(1, 3001))


def test_a_wiped_redis_still_never_yields_a_smaller_generation(dbaas, sdl_ns):
    """DBaaS restarted without persistence: the wall-clock floor of the next claim is above
    the last generation (the xApp restarted less than once a minute on average)."""
    import redis

    t0 = time.time()
    first = SdlStore(sdl_ns, clock=lambda: t0)
    old = first.allocate_epoch("s")
    first.close()
    redis.Redis(host="127.0.0.1", port=dbaas).flushall()
    later = SdlStore(sdl_ns, clock=lambda: t0 + 120)
    assert later.allocate_epoch("s") > old
    later.close()


def test_an_unreachable_or_unconfigured_dbaas_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("DBAAS_SERVICE_HOST", raising=False)
    with pytest.raises(StoreUnavailable, match="DBAAS_SERVICE_HOST is not set"):
        SdlStore("x")
    assert isinstance(open_store(), MemoryStore)
    with pytest.raises(ValueError, match="one of 'sdl', 'memory'"):
        open_store("etcd")
    from redis_server import _free_port
    monkeypatch.setenv("DBAAS_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("DBAAS_SERVICE_PORT", str(_free_port()))  # nobody listens
    with pytest.raises(StoreUnavailable, match="claiming a generation"):
        open_store()


def test_open_store_picks_sdl_in_a_ric(dbaas, sdl_ns):
    st = open_store(namespace=sdl_ns)
    assert isinstance(st, SdlStore) and st.generation > 0
    st.close()


def test_the_journal_records_orders_and_replies_for_the_restart(make_store):
    from pallas_proto import pallas_pb2 as pb

    from xapp.policy import CallOutcome
    from xapp.scheduler.state import CancelAction, CommitAction, TriggerAction

    st = make_store()
    j = MigrationJournal(st, clock=lambda: 1000.0)
    ok = lambda kind, sid, ep: CallOutcome(kind, "x", sid, ep, pb.ControlReply(  # noqa: E731
        status=pb.STATUS_OK))
    j.opened("s1", "edge-a", ue_id="ue-1", scheme=pb.SCHEME_PALLAS, fallback=pb.SCHEME_CTHO)
    j.opened("s2", "edge-a", ue_id="ue-2")
    trig = TriggerAction("s1", 1, "edge-a", "edge-b", 1005.0, 0.8, 64)
    j.sent(trig)
    j.replied(ok("Trigger", "s1", 1))  # still in flight: prepared, not committed
    assert st.migration("s1") == InFlightMigration("s1", 1, "edge-a", "edge-b", "preparing",
                                                    pb.SCHEME_PALLAS, 1005.0, 1000.0)
    commit = CommitAction("s1", 1, "edge-a", "edge-b", "edge-b", pb.SCHEME_PALLAS, 1005.2)
    j.sent(commit)
    assert [s.action for s in recovery_plan(st)] == ["commit"]
    j.replied(CallOutcome("Commit", "edge-a", "s1", 1, None, "UNAVAILABLE"))  # no answer
    assert st.migration("s1").phase == "committing"
    j.replied(ok("Commit", "s1", 1))
    assert st.migration("s1") is None
    assert st.binding("s1") == SessionBinding("s1", "edge-b", "ue-1", pb.SCHEME_PALLAS,
                                              pb.SCHEME_CTHO, 0)

    j.sent(TriggerAction("s2", 1, "edge-a", "edge-c", 1010.0, 0.5, 32))
    j.sent(CancelAction("s2", 1, "edge-a", "edge-d", "left", only_target=True))
    j.replied(CallOutcome("Cancel", "edge-a", "s2", 1, pb.ControlReply(status=pb.STATUS_OK),
                          target="edge-d"))   # an extra target withdrawn: the epoch's record stays
    assert st.migration("s2").phase == "preparing"
    j.sent(CancelAction("s2", 1, "edge-a", "edge-c", "target changed"))
    assert [s.action for s in recovery_plan(st)] == ["cancel"]
    j.replied(ok("Cancel", "s2", 1))
    j.sent(CommitAction("s2", 2, "edge-a", "edge-d", None, pb.SCHEME_DETOUR, 1011.0))
    j.replied(ok("Commit", "s2", 2))
    assert st.binding("s2") == SessionBinding("s2", "edge-a", "ue-2", relay_hops=1)
    assert recovery_plan(st) == []
    j.ended("s2")
    assert st.binding("s2") is None and list(st.bindings()) == ["s1"]


def test_a_sessions_epoch_counter_takes_its_last_value_and_refuses_one_more():
    st = MemoryStore()
    st._counters["s"] = (1 << EPOCH_COUNTER_BITS) - 2
    assert st.allocate_epoch("s") == (1 << EPOCH_COUNTER_BITS) - 1      # the last n
    with pytest.raises(StoreError, match="exhausted"):
        st.allocate_epoch("s")
    assert st.last_epoch("s") == (1 << EPOCH_COUNTER_BITS) - 1           # nothing handed out
