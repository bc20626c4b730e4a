"""Epochs across xApp replicas (issue 46, docs/scale-out.md §3): a replica that takes over a
session whose record's epoch is at or above its own epoch base claims a new generation above
every one claimed so far, so every epoch it numbers afterwards is above every epoch any replica
has issued; never ``record.epoch + 1``.

The rule over its inputs (no Redis), then the claim on the private redis-server
(tests/xapp/conftest.py) beside ``SdlStore``'s claims at a process start.
"""

from __future__ import annotations

import threading

import pytest

from xapp.store import (EPOCH_COUNTER_BITS, MemoryStore, SdlStore, StoreError,
                        needs_new_generation, next_generation, split_epoch)

ORIGIN = 1735689600.0          # 2025-01-01T00:00:00Z


def ep(g: int, n: int) -> int:
    return (g << EPOCH_COUNTER_BITS) | n


def test_a_new_generation_is_above_every_claim_the_pointer_and_the_clock_floor():
    assert next_generation([], 0, ORIGIN) == 1
    assert next_generation([3, 9, 4], 5, ORIGIN) == 10          # above the largest claim
    assert next_generation([3], 12, ORIGIN) == 13               # above the pointer
    assert next_generation([3], 2, ORIGIN + 600.0) == 10        # minutes since 2025 as floor
    assert next_generation(iter([7]), 0, ORIGIN) == 8           # any iterable


@pytest.mark.parametrize("record,gen,needed", [
    (0, 0, True),                  # a record from generation 0 (test mode) at base 0
    (ep(4, 9), 4, True),           # same generation: its next epochs may collide
    (ep(5, 1), 4, True),           # a later generation wrote it
    (ep(3, 2**38 - 1), 4, False),  # every epoch of generation 4 is above it
    (ep(4, 0), 5, False),
])
def test_a_take_over_needs_a_new_generation_when_the_record_is_at_or_above_the_base(record, gen,
                                                                                    needed):
    assert needs_new_generation(record, gen) is needed


def test_an_adopted_generation_numbers_every_later_epoch_above_the_earlier_ones():
    st = MemoryStore()
    before = [st.allocate_epoch("s1"), st.allocate_epoch("s1"), st.allocate_epoch("s2")]
    assert before == [1, 2, 1]
    st.adopt_generation(7)
    after = [st.allocate_epoch("s1"), st.allocate_epoch("s2"), st.allocate_epoch("s3")]
    assert after == [ep(7, 3), ep(7, 2), ep(7, 1)] and min(after) > max(before)
    assert st.last_epoch("s1") == ep(7, 3)
    with pytest.raises(StoreError, match="above 7"):
        st.adopt_generation(7)                          # not above: refused, nothing changes
    with pytest.raises(StoreError, match="2\\^24"):
        st.adopt_generation(1 << 24)
    assert st.generation == 7 and st.allocate_epoch("s1") == ep(7, 4)


def test_last_epoch_keeps_the_generation_a_session_was_numbered_in():
    st = MemoryStore()
    st.allocate_epoch("old")
    st.adopt_generation(2)
    assert st.last_epoch("old") == 1                  # numbered in generation 0
    st.end_session("old")
    assert st.last_epoch("old") == 0


# -- on the real redis-server ---------------------------------------------------------------------

def _leases(rid, ns, nodes=("gnb-a",)):
    from xapp.cluster.leases import NodeLeases, open_sdl
    return NodeLeases(open_sdl(), rid, nodes, namespace=ns, lease_s=5.0)


def test_claims_are_distinct_and_above_every_process_generation(dbaas, sdl_ns):
    store = SdlStore(sdl_ns)                        # a process start claims its generation
    reps = [_leases(f"xapp-{i}", sdl_ns) for i in range(4)]
    got: list[int] = []
    mu = threading.Lock()

    def claim(r):
        g = r.claim_generation()
        with mu:
            got.append(g)
    try:
        threads = [threading.Thread(target=claim, args=(r,)) for r in reps]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(got)) == 4 and min(got) > store.generation
        later = SdlStore(sdl_ns)                    # and a later start claims above them all
        assert later.generation > max(got)
        later.close()
        assert sum(r.counters.generations for r in reps) == 4
    finally:
        store.close()
        for r in reps:
            r.sdl.close()


def test_a_replica_taking_over_numbers_its_orders_above_the_records_epoch(dbaas, sdl_ns):
    """Replica A (an SDL store, a recent generation) orders epochs for a session; replica B
    (test mode's memory store, generation 0; or any older generation) takes the session over:
    its record's epoch is above B's base, so B claims a generation, and its epochs are above
    every epoch A has issued (A's counter went on after the record was written, too)."""
    a_store, b_store = SdlStore(sdl_ns), MemoryStore()
    a, b = _leases("xapp-a", sdl_ns), _leases("xapp-b", sdl_ns)
    try:
        a_epochs = [a_store.allocate_epoch("s") for _ in range(3)]
        b_store.allocate_epoch("s")                 # B numbered the session before, in gen 0
        record = a_epochs[-1]
        assert needs_new_generation(record, b_store.generation)
        b_store.adopt_generation(b.claim_generation())
        a_epochs.append(a_store.allocate_epoch("s"))    # A goes on in its own generation
        b_next = [b_store.allocate_epoch("s") for _ in range(3)]
        assert min(b_next) > max(a_epochs)
        assert split_epoch(b_next[0])[0] > a_store.generation
        assert not needs_new_generation(max(a_epochs), b_store.generation)   # no second claim
    finally:
        a_store.close()
        for r in (a, b):
            r.sdl.close()
