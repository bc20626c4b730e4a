"""The pure parts of ``benchmarks/soak.py --faults`` (issue 25 item 5): which fault a hop
carries, what a session's end counts as, and whether two agents decoded one session at once.

- :class:`FaultSchedule`: per hop, no fault or one of :data:`FAULT_WEIGHTS`'s kinds, drawn
  with probability ``share``; the engine kills (a vLLM restart costs about 20 s here) are at most
  ``max_kills`` and only when every agent is up;
- :func:`classify`: a session's end as ``exact`` (its whole output equals the greedy
  reference), ``failed`` (ended with a reason, what it got a prefix of the reference),
  ``short`` (ended without a reason and fewer tokens than asked: a silent truncation),
  ``mismatch`` (tokens differ from the reference) or ``hung`` (never ended within the bound);
- :func:`decoding_at_once`: the sessions decoded by two agents at once, from one sample of
  every agent's copy (the soak samples every 0.1 s);
- :func:`plan_targets` (``--targets K``, issue 45): the targets one hop prepares (ranks 0..K-1,
  one epoch) and the agent the UE then reaches: the rank-0 target with probability
  :data:`P_FIRST`, another prepared one otherwise, an unprepared agent with probability
  :data:`P_UNPREPARED` (the commit falls back to ctHO there and every preparation is released);
- :func:`lease_report`: the target-side lease counters of the run (agent.obs's
  ``pallas_lease_events``) and whether they balance.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

KILLS = ("kill-source", "kill-target")
FAULT_WEIGHTS = {  # kind -> weight among the faults
    "kill-source": 1, "kill-target": 1, "bad-block": 10, "target-full": 5,
    "sync-deadline": 5, "peer-restart": 3}
#: --targets K: the share of hops whose UE reaches the rank-0 target (the predictor's first
#: candidate; issue 45 puts the top-1 prediction at 54-56% on real drives), and the share
#: whose UE reaches an agent no Trigger named (a misprediction of every candidate).
P_FIRST = 0.6
P_UNPREPARED = 0.05


@dataclass
class FaultSchedule:
    """Draws the fault of each hop (None: a fault-free hop).

    ``rng`` the soak's random source, ``share`` the probability that a hop carries a fault
    (0..1), ``max_kills`` how many engine kills at most, ``weights`` kind -> relative weight.
    """

    rng: random.Random
    share: float = 0.25
    max_kills: int = 10
    weights: dict[str, float] = field(default_factory=lambda: dict(FAULT_WEIGHTS))
    kills: int = 0

    def draw(self, all_up: bool) -> str | None:
        """The next hop's fault; ``all_up``: every agent and engine is up (no restart under
        way), else neither a kill nor a peer restart is drawn."""
        if self.rng.random() >= self.share:
            return None
        allowed = {k: w for k, w in self.weights.items() if w > 0
                   and (all_up or (k not in KILLS and k != "peer-restart"))
                   and (k not in KILLS or self.kills < self.max_kills)}
        if not allowed:
            return None
        kinds, weights = zip(*allowed.items())
        kind = self.rng.choices(kinds, weights)[0]
        if kind in KILLS:
            self.kills += 1
        return kind


def classify(out: list[int], ref: list[int], max_tokens: int, ended: bool, error: str | None
             ) -> str:
    """What a session's end counts as (see the module).

    ``out`` the output tokens the UE got, ``ref`` the greedy reference (``max_tokens`` long),
    ``ended`` whether it ended within the soak's bound, ``error`` the reason it ended with
    (None or "" when it finished). Returns one of exact, failed, short, mismatch, hung.
    """
    out = out[:max_tokens]
    if out != ref[:len(out)]:
        return "mismatch"
    if not ended:
        return "hung"
    if len(out) >= max_tokens:
        return "exact"
    return "failed" if error else "short"


def decoding_at_once(sample: list[tuple[str, str, bool, int, int]]) -> set[str]:
    """Sessions that two agents decoded at once, from one sample of every copy.

    ``sample``: (session id, agent id, publishing, tokens at the previous sample, tokens now)
    of each agent's copy of a session, ``publishing`` whether that copy hands new tokens to the
    UE (serving or resumed there, not frozen by a commit, not ended). Returns the session ids
    with copies at two or more agents that published new tokens since the previous sample.
    """
    by: dict[str, set[str]] = {}
    for sid, agent, publishing, before, now in sample:
        if publishing and now > before:
            by.setdefault(sid, set()).add(agent)
    return {sid for sid, agents in by.items() if len(agents) > 1}


@dataclass(frozen=True)
class HopPlan(Generic[T]):
    """One multi-target hop (``soak.py --targets K``): ``prepared`` the targets Triggered, in
    rank order (``prepared[r]`` gets rank r), ``commit`` the agent the Commit names."""

    prepared: tuple[T, ...]
    commit: T

    @property
    def rank(self) -> int | None:
        """The commit target's rank, None when no Trigger named it (a fallback)."""
        return next((r for r, t in enumerate(self.prepared) if t is self.commit), None)

    @property
    def released(self) -> tuple[T, ...]:
        """The prepared targets the commit must leave holding nothing for the session."""
        return tuple(t for t in self.prepared if t is not self.commit)


def plan_targets(rng: random.Random, others: Sequence[T], k: int, *, p_first: float = P_FIRST,
                 p_unprepared: float = P_UNPREPARED, unprepared: bool | None = None
                 ) -> HopPlan[T]:
    """Draw a multi-target hop among ``others`` (the agents up, the source excluded).

    ``k`` (>= 1) targets are prepared, as many as ``others`` has (fewer when agents are down).
    The commit names an agent no Trigger named when ``unprepared`` (drawn with probability
    ``p_unprepared`` when None; only with at least two agents in ``others``: one of them is
    then left unprepared, so with ``len(others) <= k`` such a hop prepares ``len(others) - 1``);
    otherwise the rank-0 target with probability ``p_first``, else one of the other prepared
    ones, uniformly. Raises ValueError for ``k < 1``, no agent, or a probability outside 0..1.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not others:
        raise ValueError("no agent to prepare")
    for name, p in (("p_first", p_first), ("p_unprepared", p_unprepared)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be in 0..1, got {p}")
    if unprepared is None:
        unprepared = len(others) >= 2 and rng.random() < p_unprepared
    if unprepared and len(others) >= 2:
        commit = rng.choice(list(others))
        rest = [o for o in others if o is not commit]
        return HopPlan(tuple(rng.sample(rest, min(k, len(rest)))), commit)
    prepared = tuple(rng.sample(list(others), min(k, len(others))))
    if len(prepared) == 1 or rng.random() < p_first:
        return HopPlan(prepared, prepared[0])
    return HopPlan(prepared, rng.choice(prepared[1:]))


#: The lease events agent.obs counts (``pallas_lease_events{event=...}``); every granted lease
#: ends as one of the last four or is still held.
LEASE_EVENTS = ("granted", "renewed", "committed", "released", "expired", "evicted")
LEASE_ENDS = ("committed", "released", "expired", "evicted")


def lease_report(before: dict[str, float], after: dict[str, float], held: float) -> dict:
    """The lease counters of a run: ``after - before`` per :data:`LEASE_EVENTS` kind (counts;
    a kind missing from a dict counts 0), ``held`` the leases held at the end (the
    ``pallas_leases_held`` gauge), and ``balanced``: every lease granted in the run ended once
    (committed, released, expired or evicted) or is still held (docs/architecture.md §5)."""
    d = {e: int(round(after.get(e, 0.0) - before.get(e, 0.0))) for e in LEASE_EVENTS}
    d["held_end"] = int(round(held))
    d["balanced"] = d["granted"] == sum(d[e] for e in LEASE_ENDS) + d["held_end"]
    return d
