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
  every agent's copy (the soak samples every 0.1 s).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

KILLS = ("kill-source", "kill-target")
FAULT_WEIGHTS = {  # kind -> weight among the faults
    "kill-source": 1, "kill-target": 1, "bad-block": 10, "target-full": 5,
    "sync-deadline": 5, "peer-restart": 3}


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
