"""UE-side metrics from token arrival times (docs/model.md §7).

- SIT of a handover: from the last token the UE got from the source before the handover to the
  first token of the same session it got after it (at the UE side of the token stream).
- ITL: the gap between consecutive tokens of one session at the UE; the first token of a session
  (TTFT) is not an ITL. SLO 100 ms (MLPerf conversational TPOT).

Times are seconds on one clock (the harness's wall clock). Everything here is pure numpy so that
live runs and ``--simulate`` share it.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

ITL_SLO_S = 0.100


@dataclass
class SessionRecord:
    """One UE session as the UE saw it: every token's id and arrival time (seconds).

    ``times`` and ``token_ids`` have one entry per token the UE received, in order; ``agents``
    names the agent that delivered each token (the serving cell's agent, or a relay under Detour).
    ``relayed`` names the relaying agent per token ("" when served directly).
    ``reference`` is the no-handover token sequence, when known.
    """

    ue_id: str
    session_id: str
    prompt_tokens: int
    max_tokens: int
    start: float
    times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)
    relayed: list[str] = field(default_factory=list)
    error: str = ""
    reference: list[int] | None = None

    @property
    def end(self) -> float:
        return self.times[-1] if self.times else self.start

    def itls(self) -> np.ndarray:
        """Inter-token latencies (s), shape (max(0, n-1),)."""
        t = np.asarray(self.times, dtype=np.float64)
        return np.diff(t) if t.size > 1 else np.zeros(0)

    def matches_reference(self) -> bool | None:
        """True if the received tokens equal the no-handover reference (its first n tokens for
        a session cut short at the end of the replay), None if unknown."""
        if self.reference is None:
            return None
        n = len(self.token_ids)
        if self.error and n < len(self.reference):
            return list(self.token_ids) == list(self.reference[:n])
        return list(self.token_ids) == list(self.reference)


@dataclass(frozen=True)
class Handover:
    """A real handover seen in the trace: the UE's serving cell changed at ``time`` (s)."""

    ue_id: str
    time: float
    from_cell: int
    to_cell: int


@dataclass
class HandoverSIT:
    """A handover's UE-side outcome: the session in flight and its measured SIT (s).

    ``sit`` is NaN when no session was in flight across the handover (none running, or the
    session finished before it); ``last_before``/``first_after`` are token arrival times.
    """

    handover: Handover
    session_id: str = ""
    sit: float = float("nan")
    last_before: float = float("nan")
    first_after: float = float("nan")
    tokens_at_ho: int = 0


def sit_for_handover(ho: Handover, sessions: Sequence[SessionRecord], new_agent: str | None = None,
                     next_handover: float = float("inf")) -> HandoverSIT:
    """The SIT of one handover from the UE's sessions (docs/model.md §7).

    The session in flight is the one of this UE with a token before ``ho.time`` and a token at
    or after it. The SIT is the gap from the last token before the handover to the first token
    after it. When ``new_agent`` is given and the new cell's agent first relays the old one's
    stream (Detour, or while the commit is in flight) and only later serves the session itself,
    the interruption the UE sees is the longest gap between consecutive tokens from the last
    token before the handover up to the first token ``new_agent`` decoded and served directly (before
    ``next_handover``); under Detour, where that never happens, it is the gap at the handover.
    Sessions are those of ``ho.ue_id`` only (others are ignored).

    A session still in its prefill at the handover (opened before it, no token yet) is in
    flight too (issue 13 item 6): its SIT runs from the handover to its first token, the part
    of its wait that the handover's recovery is responsible for (``last_before`` is then the
    handover's time and ``tokens_at_ho`` its prompt).
    """
    out = HandoverSIT(ho)
    for s in sessions:
        if s.ue_id != ho.ue_id or not s.times:
            continue
        t = np.asarray(s.times)
        i = int(np.searchsorted(t, ho.time, side="left"))  # first token at/after the HO
        if i == 0 and s.start < ho.time:
            out.session_id = s.session_id
            j = 0
            if new_agent is not None and len(s.agents) == t.size:
                rel = s.relayed if len(s.relayed) == t.size else [""] * t.size
                local = [k for k in range(t.size) if t[k] < next_handover and s.agents[k] == new_agent and not rel[k]]
                if local:
                    j = local[0]
            gaps = np.diff(np.concatenate(([ho.time], t[:j + 1])))
            k = int(np.argmax(gaps))
            out.last_before = float(ho.time if k == 0 else t[k - 1])
            out.first_after = float(t[k])
            out.sit = float(gaps[k])
            out.tokens_at_ho = s.prompt_tokens
            return out
        if 0 < i < t.size:
            out.session_id = s.session_id
            j = i
            if new_agent is not None and len(s.agents) == t.size:
                rel = s.relayed if len(s.relayed) == t.size else [""] * t.size
                local = [k for k in range(i, t.size) if t[k] < next_handover
                         and s.agents[k] == new_agent and not rel[k]]
                if local:
                    j = local[0]
            gaps = np.diff(t[i - 1:j + 1])
            k = int(np.argmax(gaps))
            out.last_before = float(t[i - 1 + k])
            out.first_after = float(t[i + k])
            out.sit = float(gaps[k])
            out.tokens_at_ho = s.prompt_tokens + i
            return out
    return out


def percentile(x: np.ndarray, q: float) -> float:
    """The q-th percentile (numpy linear), NaN for an empty array."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if x.size else float("nan")


def mean(x: Iterable[float]) -> float:
    a = np.asarray(list(x) if not isinstance(x, np.ndarray) else x, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else float("nan")


#: Bootstrap resamples behind every interval (95%, percentile method).
BOOTSTRAP_N = 2000


def bootstrap_ci(x: Iterable[float], *, stat=np.mean, n_boot: int = BOOTSTRAP_N, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``stat`` over the finite values of ``x``: (lo, hi), the
    unit of ``x``; (NaN, NaN) with fewer than two values. Deterministic for a ``seed``."""
    a = np.asarray(list(x) if not isinstance(x, np.ndarray) else x, dtype=np.float64)
    a = a[np.isfinite(a)]
    if a.size < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, (n_boot, a.size))
    v = stat(a[idx], axis=1)
    q = (1.0 - level) / 2.0
    return float(np.quantile(v, q)), float(np.quantile(v, 1.0 - q))


def ratio_ci(num: Iterable[float], den: Iterable[float], *, n_boot: int = BOOTSTRAP_N, seed: int = 0,
             level: float = 0.95) -> tuple[float, float, float]:
    """mean(num) / mean(den) and its percentile-bootstrap interval, both samples resampled
    independently (two schemes' SITs over the same drive): (ratio, lo, hi); NaNs when either
    has fewer than two finite values or a mean of 0."""
    a = np.asarray(list(num), dtype=np.float64)
    b = np.asarray(list(den), dtype=np.float64)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size < 2 or b.size < 2 or b.mean() == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    ra = a[rng.integers(0, a.size, (n_boot, a.size))].mean(axis=1)
    rb = b[rng.integers(0, b.size, (n_boot, b.size))].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = ra / rb
    r = r[np.isfinite(r)]
    q = (1.0 - level) / 2.0
    return float(a.mean() / b.mean()), float(np.quantile(r, q)), float(np.quantile(r, 1.0 - q))


@dataclass
class SchemeSummary:
    """Per-scheme figures (seconds; shares in [0, 1]).

    ``itl_over_slo`` is the share of ITLs above ``ITL_SLO_S``. ``t_early_mean`` is the mean
    early-preparation exposure (docs/model.md Eq. 7) of the triggers, NaN for reactive schemes.
    ``*_ci``: 95% bootstrap intervals (lo, hi) of the means (:func:`bootstrap_ci`; the ITL's over
    sessions' mean gaps, since a session's gaps are not independent of each other).
    """

    scheme: str
    handovers: int
    handovers_with_session: int
    sit_mean: float
    sit_p50: float
    sit_p99: float
    itl_mean: float
    itl_p99: float
    itl_over_slo: float
    t_early_mean: float
    tokens: int
    sessions: int
    token_exact: int
    token_checked: int
    commits: int = 0
    fallbacks: int = 0
    itl_p90: float = float("nan")
    sit_mean_ci: tuple[float, float] = (float("nan"), float("nan"))
    itl_mean_ci: tuple[float, float] = (float("nan"), float("nan"))

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def gap_between_tokens(sits: Sequence[HandoverSIT]) -> np.ndarray:
    """The SITs (s) that are a gap between two tokens: the largest token gap across each
    handover. Left out: a session still in its prefill at the handover whose SIT is the wait
    from the handover to its first token (``last_before`` is then the handover's time, see
    :func:`sit_for_handover`): no token gap, a part of its time to first token. Shape (n,)."""
    return np.array([h.sit for h in sits if math.isfinite(h.sit) and h.last_before != h.handover.time],
                    dtype=np.float64)


def relay_hops(s: SessionRecord) -> np.ndarray:
    """Per token of ``s`` (n,) int: how many backhaul hops it crossed to reach the UE, as the
    agents' fronts relay (agent/frontend.py ``relay_origin``): 0 when the agent serving the UE
    decoded it; 1 when the serving agent relayed it from the UE's previous agent and that agent
    decoded it (the holder); 2 otherwise (the previous agent relays on from the holder: a front
    relays at most two hops), except that a serving agent that relayed the session before goes
    to the holder directly (it remembers it): 1 (``pallas_eval.simulate.front_relay_hops`` gives
    the model the same). The serving agent is the token's ``relayed`` agent, else its decoder;
    the previous agent is the serving agent before the current run of tokens."""
    n = len(s.times)
    out = np.zeros(n, dtype=np.int64)
    rel = s.relayed if len(s.relayed) == n else [""] * n
    dec = s.agents if len(s.agents) == n else [""] * n
    cur, prev = None, None
    relayed_before: set[str] = set()    # agents that relayed an earlier run of the session
    for i in range(n):
        serving = rel[i] or dec[i]
        if serving != cur:
            if cur is not None and i > 0 and rel[i - 1] and rel[i - 1] != dec[i - 1]:
                relayed_before.add(cur)
            prev, cur = cur, serving
        if rel[i] and rel[i] != dec[i]:
            out[i] = 1 if (prev == dec[i] or rel[i] in relayed_before) else 2
    return out


def itl_by_hops(sessions: Sequence[SessionRecord]) -> dict[int, np.ndarray]:
    """The inter-token gaps (s) of ``sessions`` keyed by the relay hops of the gap's later token
    (:func:`relay_hops`): {hops: gaps (m,)}, only the hop counts that occur."""
    parts: dict[int, list[np.ndarray]] = {}
    for s in sessions:
        g = s.itls()
        if not g.size:
            continue
        h = relay_hops(s)[1:]
        for k in np.unique(h).tolist():
            parts.setdefault(int(k), []).append(g[h == k])
    return {k: np.concatenate(v) for k, v in sorted(parts.items())}


def hop_itl_line(scheme: str, by_hops: dict[int, np.ndarray]) -> str | None:
    """One line of ITL P90 / P99 / share over the SLO per relay hop count, or None when no
    token of the scheme was relayed."""
    if not any(k > 0 for k in by_hops):
        return None
    parts = [f"{k} hop{'s' if k != 1 else ''}: n {g.size}, P90 {percentile(g, 90) * 1000:.0f} ms, "
             f"P99 {percentile(g, 99) * 1000:.0f} ms, >100 ms {float((g > ITL_SLO_S).mean()) * 100:.1f}%"
             for k, g in by_hops.items()]
    return f"{scheme}: ITL by relay hops (gaps by their later token's path): " + "; ".join(parts)


def post_handover_itls(sessions: Sequence[SessionRecord], sits: Sequence[HandoverSIT]) -> np.ndarray:
    """The inter-token gaps (s) a UE sees after its session's first handover, shape (m,).

    A gap counts when its later token arrived after the first handover the session was in flight
    across (``sits`` with its ``session_id`` and a finite SIT). Each handover's own interruption,
    the gap that ends at its ``first_after`` (:func:`sit_for_handover`), is left out: it is that
    handover's SIT, reported apart. What remains is the decoding the UE gets once it has moved:
    at the target for the target-side schemes, over the relay path for Detour (paper §2, Figure
    1: ITL grows with the forwarding hops). Sessions never handed over contribute nothing.
    """
    first: dict[str, float] = {}
    cut: dict[str, set[float]] = {}
    for h in sits:
        if not h.session_id or not math.isfinite(h.sit):
            continue
        first[h.session_id] = min(first.get(h.session_id, math.inf), h.handover.time)
        cut.setdefault(h.session_id, set()).add(h.first_after)
    parts = []
    for s in sessions:
        t0 = first.get(s.session_id)
        if t0 is None or len(s.times) < 2:
            continue
        t = np.asarray(s.times, dtype=np.float64)
        keep = (t[1:] > t0) & ~np.isin(t[1:], list(cut[s.session_id]))
        parts.append(np.diff(t)[keep])
    return np.concatenate(parts) if parts else np.zeros(0)


def itl_stats(gaps: np.ndarray) -> dict:
    """n, mean, P90 and P99 (s) and the share over the ITL SLO of ``gaps`` (s), NaN when empty."""
    g = np.asarray(gaps, dtype=np.float64)
    return {"n": int(g.size), "mean_s": mean(g), "p90_s": percentile(g, 90), "p99_s": percentile(g, 99),
            "over_slo": float((g > ITL_SLO_S).mean()) if g.size else float("nan")}


def itl_line(label: str, gaps: np.ndarray) -> str:
    """``label``: n, mean, P90, P99 (ms) and the share over the ITL SLO of ``gaps`` (s)."""
    if not gaps.size:
        return f"{label}: no gaps"
    return (f"{label}: n {gaps.size}, mean {mean(gaps) * 1000:.0f} ms, P90 {percentile(gaps, 90) * 1000:.0f} ms, "
            f"P99 {percentile(gaps, 99) * 1000:.0f} ms, >100 ms {float((gaps > ITL_SLO_S).mean()) * 100:.1f}%")


def summarize(scheme: str, sits: Sequence[HandoverSIT], sessions: Sequence[SessionRecord],
              t_early: Sequence[float] = (), commits: int = 0, fallbacks: int = 0) -> SchemeSummary:
    """Summary of one scheme's run: SIT over handovers with a session in flight, ITL over all
    sessions' inter-token gaps, T_early over the triggers made."""
    sit = np.array([h.sit for h in sits], dtype=np.float64)
    itl = np.concatenate([s.itls() for s in sessions]) if sessions else np.zeros(0)
    checked = [s.matches_reference() for s in sessions if s.reference is not None]
    per_session = [float(g.mean()) for g in (s.itls() for s in sessions) if g.size]
    return SchemeSummary(
        scheme=scheme,
        handovers=len(sits),
        handovers_with_session=int(np.isfinite(sit).sum()),
        sit_mean=mean(sit), sit_p50=percentile(sit, 50), sit_p99=percentile(sit, 99),
        itl_mean=mean(itl), itl_p99=percentile(itl, 99),
        itl_over_slo=float((itl > ITL_SLO_S).mean()) if itl.size else float("nan"),
        t_early_mean=mean(np.asarray(t_early, dtype=np.float64)),
        tokens=int(sum(len(s.times) for s in sessions)),
        sessions=len(sessions),
        token_exact=int(sum(1 for c in checked if c)),
        token_checked=len(checked),
        commits=commits, fallbacks=fallbacks,
        itl_p90=percentile(itl, 90), sit_mean_ci=bootstrap_ci(sit), itl_mean_ci=bootstrap_ci(per_session),
    )
