"""What a Commit does, decided in one pure function (no I/O, no clock; like ``xapp/scheduler``).

:func:`plan_commit` turns what the source knows at the commit point (:class:`CommitInputs`:
whether a prepared attempt is live at this target, the scheme's shipping rule, the prepared
split, the commit-time choice of ``pallas_common.timing.commit_choice`` (docs/model.md §8) and
the measured link and prefill rates) into one :class:`CommitPlan`: whether KV crosses the link
and from which block, whether the last partial block (the tail) goes too, and how long the
target may wait for a warm-up still running before it recomputes. The source role
(``agent/migration/source.py``) then carries the plan out: ships, sends Sync, hands over.

Rules, in order:

1. Full-Copy (``Ship.ALL``) over an attempt whose prefix is already at the target
   (``first_block > 0``) ships only the suffix.
2. The target may wait for its warm-up at most what is left of the deadline; with a choice, at
   most the choice's ``wait_s``. The choice ``ctho`` moves the split to ``ctho_split`` (the
   prefix blocks the target has not prefilled are shipped); ``recompute`` ships nothing and
   waits for nothing (the target recomputes the whole context).
3. Nothing is shipped for a session that finished or failed here (vLLM said so, or its request
   failed): the target continues from the commit point by recomputing what it lacks.
4. A prepared attempt's tail crosses the link only where that beats recomputing it at the
   target, B > s_kv * r_p (docs/model.md §3, Eq. 6); an unprepared (reactive) commit ships it
   whenever it ships.
"""

from __future__ import annotations

from dataclasses import dataclass

from pallas_proto import pallas_pb2

from pallas_common.schemes import SCHEMES, SchemeSpec, Ship
from pallas_common.timing import CommitChoice

__all__ = ["CommitInputs", "CommitPlan", "bridges", "commit_scheme", "plan_commit", "tail_pays"]


def bridges(requested: SchemeSpec, *, request_ended: bool) -> bool:
    """Whether a Commit first bridges (``SchemeSpec.bridge``, docs/model.md §8): the source
    decodes on, relayed by the new agent, until the target holds the state, and the commit then
    hands over at the token boundary the bridge chose instead of the UE's. ``request_ended``:
    the source's request finished or ended (nothing is left to decode, so nothing to bridge)."""
    return requested.bridge and not request_ended


def commit_scheme(requested: SchemeSpec, *, prepared: bool, pinned: SchemeSpec | None,
                  in_prefill: bool) -> tuple[SchemeSpec, str]:
    """The scheme a Commit really runs, and why it is not ``requested`` ("" when it is).

    ``prepared``: a live attempt of this epoch at the actual target; ``pinned``: the session's
    own scheme (None: unknown); ``in_prefill``: the source has decoded no output token yet and
    its request runs on. A proactive scheme with nothing prepared at the actual target (never
    triggered, another target, or an attempt that failed since, which the xApp cannot know)
    falls back to ctHO (docs/model.md §6). ctHO for a session of a proactive scheme still in its
    prefill becomes Recomputation: the source holds no KV to ship yet, and ctHO's split would
    wait for that prefill to make the blocks it ships (measured: a 1,655-token prompt opened
    0.2 s before its handover took 2.4 s by ctHO)."""
    use, why = requested, ""
    if requested.proactive and not prepared:
        use, why = SCHEMES[pallas_pb2.SCHEME_CTHO], "nothing prepared at the actual target for this epoch"
    if use.value == pallas_pb2.SCHEME_CTHO and pinned is not None and pinned.proactive and in_prefill:
        use, why = SCHEMES[pallas_pb2.SCHEME_RECOMPUTATION], "prefill still running at the source"
    return use, why


@dataclass(frozen=True)
class CommitInputs:
    """What the source knows when a Commit reaches it.

    ``prepared``: a live proactive attempt at this target and epoch; ``ship``: the scheme's
    shipping rule; ``split`` (tokens, block-aligned) and ``first_block``: what the attempt
    prepared at the target and the first block it streams; ``block_size`` tokens a block;
    ``deadline_left_s``: what is left of the commit's deadline, s; ``choice``: the commit-time
    choice (None: nothing to choose); ``finished_here`` / ``failed_here``: the source's request
    ended with a finish_reason / failed; ``goodput`` bytes/s, ``s_kv`` bytes per token, ``r_p``
    tokens/s: the measured link goodput and the target's prefill rate (each > 0).
    """

    prepared: bool
    ship: Ship
    split: int
    first_block: int
    block_size: int
    deadline_left_s: float
    choice: CommitChoice | None
    finished_here: bool
    failed_here: bool
    goodput: float
    s_kv: float
    r_p: float


@dataclass(frozen=True)
class CommitPlan:
    """What the Commit does: ``ship`` (the rule after the choice), ``split`` / ``first_block``
    (tokens prepared at the target, the first block to stream), ``warmup_wait_s`` (how long the
    target may wait for its warm-up, s; sent with the Sync), ``shipping`` (any KV crosses the
    link) and ``ship_tail`` (the last partial block crosses too)."""

    ship: Ship
    split: int
    first_block: int
    warmup_wait_s: float
    shipping: bool
    ship_tail: bool


def tail_pays(goodput: float, s_kv: float, r_p: float) -> bool:
    """Whether shipping a token's KV beats recomputing it at the target: the link's goodput
    ``goodput`` (bytes/s) above ``s_kv`` (bytes/token) * ``r_p`` (tokens/s) (Eq. 6)."""
    return goodput > s_kv * r_p


def plan_commit(x: CommitInputs) -> CommitPlan:
    """The Commit's plan (the module's rules 1-4). Pure."""
    ship = Ship.SUFFIX if x.ship == Ship.ALL and x.first_block > 0 else x.ship
    split, first_block = x.split, x.first_block
    wait = max(0.0, x.deadline_left_s)
    c = x.choice
    if c is not None:
        wait = min(wait, c.wait_s)
        if c.option == "ctho":
            split, first_block, ship = c.ctho_split, c.ctho_split // x.block_size, Ship.SUFFIX
        elif c.option == "recompute":
            ship, wait = Ship.NONE, 0.0
    shipping = ship != Ship.NONE and not x.finished_here and not x.failed_here
    ship_tail = shipping and (not x.prepared or tail_pays(x.goodput, x.s_kv, x.r_p))
    return CommitPlan(ship=ship, split=split, first_block=first_block, warmup_wait_s=wait,
                      shipping=shipping, ship_tail=ship_tail)
