"""The commit's decision as one pure function (agent/migration/plan.py)."""

import dataclasses

import pytest

from pallas_proto import pallas_pb2 as pb

from agent.migration.plan import CommitInputs, bridges, commit_scheme, plan_commit, tail_pays
from pallas_common.schemes import SCHEMES, Ship
from pallas_common.timing import CommitChoice

BASE = CommitInputs(prepared=True, ship=Ship.SUFFIX, split=256, first_block=8, block_size=32,
                    deadline_left_s=10.0, choice=None, finished_here=False, failed_here=False,
                    goodput=5.0e6, s_kv=2048.0, r_p=1850.0)


def _choice(option, wait_s=0.3, ctho_split=128):
    return CommitChoice(option=option, finish_s=0.2, ctho_s=0.4, ctho_split=ctho_split,
                        recompute_s=0.6, detour_s=0.05, wait_s=wait_s)


def _plan(**kw):
    return plan_commit(dataclasses.replace(BASE, **kw))


def test_a_prepared_commit_without_a_choice_ships_the_suffix_and_its_tail_where_the_link_pays():
    p = _plan()
    assert (p.ship, p.split, p.first_block, p.shipping) == (Ship.SUFFIX, 256, 8, True)
    assert p.ship_tail                         # 5.0e6 > 2048 * 1850 = 3.79e6 B/s
    assert p.warmup_wait_s == 10.0             # all that is left of the deadline


def test_the_tail_stays_where_recomputing_it_is_faster_but_a_reactive_commit_ships_it():
    assert not _plan(goodput=3.0e6).ship_tail
    assert _plan(goodput=3.0e6, prepared=False).ship_tail


def test_full_copy_over_a_prepared_prefix_ships_only_the_suffix():
    assert _plan(ship=Ship.ALL).ship == Ship.SUFFIX
    assert _plan(ship=Ship.ALL, split=0, first_block=0).ship == Ship.ALL


def test_the_choice_ctho_moves_the_split_and_bounds_the_wait():
    p = _plan(choice=_choice("ctho", wait_s=0.25, ctho_split=96))
    assert (p.ship, p.split, p.first_block) == (Ship.SUFFIX, 96, 3)
    assert p.warmup_wait_s == pytest.approx(0.25)


def test_the_choice_recompute_ships_nothing_and_waits_for_nothing():
    p = _plan(choice=_choice("recompute"))
    assert (p.ship, p.shipping, p.ship_tail, p.warmup_wait_s) == (Ship.NONE, False, False, 0.0)


def test_the_choice_finish_waits_at_most_its_wait_and_at_most_the_deadline():
    assert _plan(choice=_choice("finish", wait_s=0.3)).warmup_wait_s == pytest.approx(0.3)
    assert _plan(choice=_choice("finish", wait_s=0.3), deadline_left_s=0.1).warmup_wait_s == pytest.approx(0.1)
    assert _plan(deadline_left_s=-1.0).warmup_wait_s == 0.0


@pytest.mark.parametrize("ended", [{"finished_here": True}, {"failed_here": True}])
def test_nothing_ships_for_a_request_that_ended_here(ended):
    p = _plan(**ended)
    assert not p.shipping and not p.ship_tail
    assert p.split == 256                      # the target still gets the prepared prefix's split


def test_a_scheme_that_ships_nothing_never_ships():
    assert not _plan(ship=Ship.NONE, prepared=False).shipping


def test_tail_pays_is_goodput_above_s_kv_times_r_p():
    assert tail_pays(3.8e6, 2048.0, 1850.0) and not tail_pays(3.7e6, 2048.0, 1850.0)


P, CTHO, RECOMP, FULL = (SCHEMES[v] for v in (pb.SCHEME_PALLAS, pb.SCHEME_CTHO, pb.SCHEME_RECOMPUTATION,
                                             pb.SCHEME_FULL_COPY))


def test_a_prepared_proactive_commit_runs_its_own_scheme():
    assert commit_scheme(P, prepared=True, pinned=P, in_prefill=False) == (P, "")


def test_a_proactive_commit_with_nothing_prepared_falls_back_to_ctho():
    use, why = commit_scheme(P, prepared=False, pinned=P, in_prefill=False)
    assert use is CTHO and "nothing prepared" in why


def test_a_session_of_a_proactive_scheme_still_in_its_prefill_is_recomputed_not_ctho():
    for requested in (P, CTHO):
        use, why = commit_scheme(requested, prepared=False, pinned=P, in_prefill=True)
        assert use is RECOMP and "prefill" in why


def test_reactive_schemes_run_as_asked_even_in_a_prefill_when_the_session_is_not_proactive():
    assert commit_scheme(CTHO, prepared=False, pinned=CTHO, in_prefill=True) == (CTHO, "")
    assert commit_scheme(FULL, prepared=False, pinned=P, in_prefill=True) == (FULL, "")
    assert commit_scheme(CTHO, prepared=False, pinned=None, in_prefill=True) == (CTHO, "")


def test_a_prepared_proactive_commit_keeps_its_scheme_even_while_the_prefill_runs():
    assert commit_scheme(P, prepared=True, pinned=P, in_prefill=True) == (P, "")


def test_a_reactive_commit_never_falls_back_for_want_of_a_prepared_attempt():
    for requested in (CTHO, FULL, RECOMP):
        assert commit_scheme(requested, prepared=False, pinned=requested, in_prefill=False) == (requested, "")


BRIDGE = SCHEMES[pb.SCHEME_PALLAS_BRIDGE]


def test_only_a_bridging_scheme_bridges_and_only_while_the_request_runs():
    assert bridges(BRIDGE, request_ended=False)
    assert not bridges(BRIDGE, request_ended=True)
    for spec in SCHEMES.values():
        if spec is not BRIDGE:
            assert not bridges(spec, request_ended=False), spec.name
