"""``--simulate``: the replay's handovers through the timing model only (no engines).

Each handover of the trace with a session in flight becomes one evaluation of docs/model.md's
equations (through ``pallas_common.timing``, the same code the xApp's Scheduler Engine uses):

- Pallas: Eq. 9's decision with T_limit = min(T_max, lead), where ``lead`` is how long before
  the handover the prediction named the right target (T_avail, from the xApp's own events in a
  live run, or a given constant); T_SIT (Eq. 6) and T_early (Eq. 7) at the chosen window. With
  no usable prediction (lead 0 or a wrong target) Pallas falls back to ctHO, as it does live.
- w/o RC, w/o SM: the ablations' SIT at the same window (``sit_no_rc``, ``sit_no_sm``).
- Full-Copy, Recomputation, ctHO: docs/model.md §6 with K = tokens at the handover.
- A target that served the session before (a UE handing back to a cell it left) still holds
  the whole blocks it computed then in vLLM's prefix cache (``cached_tokens``): Recomputation
  and ctHO's prefill skip them. ctHO's split counts them only where the source knows of them
  (``known_held_tokens``: the target is the agent the session came from, as the agent's
  ``agent/migration/source.py:held_at`` sees it).
- Detour: the gap the UE sees across the handover (``timing.detour_switch_gap``): the wait for
  its first token over the new path (a decode step after its last one when the old path was
  direct, else as the new path opens: the stream lags over a relayed path), the new path's
  set-up (one ``relay_request_s`` per HTTP stream request) and the mean of its hop cost over the
  new path's hops (``timing.HopCost.mean_s``: the rates' ``hop_model`` scaled to a first hop of
  ``hop_delay_s``; the live relay draws the same law by each proxy's position,
  ``pallas_eval.relay``). The hops are the live fronts' (:func:`front_relay_paths`: 0 at the
  holder, at most 2) where the handovers come from a replay, else one more at each of the
  session's handovers (the paper's chain of relays).

Every target-side scheme's SIT includes c_sync and the first decode step at the target
(1 / r_d), as Eq. 6 does for Pallas, so the schemes compare like with like.

Rates come from the live run's own measurements (``measured_rates``) or a preset of
``pallas_eval.experiments.presets`` (the one table of the paper's models and GPUs; the replay's
``--rates paper`` is its ``PAPER_QWEN3_32B``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np

from pallas_common import timing
from pallas_common.schemes import (COMPARED, CTHO, DETOUR, FULL_COPY, NAMES, NO_RC, NO_SM, PALLAS,
                                   PALLAS_BRIDGE, PROACTIVE_NAMES, RECOMPUTATION)


@dataclass(frozen=True)
class Rates:
    """The model's inputs that are rates or sizes (docs/model.md §1-3; SI units).

    ``r_p`` prefill tokens/s at the target, ``r_d`` decode tokens/s per request, ``bandwidth``
    inter-gNB goodput bytes/s, ``s_kv`` KV bytes per token, ``block_size`` tokens per block,
    ``c_sync`` seconds per commit, ``hop_delay_s`` the mean cost per token of Detour's first
    forwarding hop, ``hop_model`` the law of the further hops (``timing.HOP_COSTS``),
    ``relay_request_s`` one HTTP stream request of a Detour relay path's set-up, s, and
    ``relay_requests_per_hop`` how many a relay hop makes (``timing.detour_switch_gap``; the
    replay takes its measured control round trip and 2 where its delaying proxies stand in for
    the backhaul, the paper's experiments 0 s: the paper gives no figure).
    """

    name: str
    r_p: float
    r_d: float
    bandwidth: float
    s_kv: float
    block_size: int
    c_sync: float
    hop_delay_s: float
    hop_model: str = timing.DEFAULT_HOP_MODEL
    relay_request_s: float = 0.0
    relay_requests_per_hop: int = 1

    def hop_cost(self) -> timing.HopCost:
        """Detour's hop cost: ``hop_model`` scaled so its first hop costs ``hop_delay_s``."""
        return timing.hop_cost(self.hop_model).with_mean(self.hop_delay_s)

    def describe(self) -> str:
        return (f"{self.name}: r_p {self.r_p:,.0f} tok/s, r_d {self.r_d:.1f} tok/s, "
                f"B {self.bandwidth * 8 / 1e6:,.0f} Mbit/s, s_kv {self.s_kv:,.0f} B/token, "
                f"block {self.block_size}, c_sync {self.c_sync * 1000:.0f} ms, hop {self.hop_delay_s * 1000:.0f} ms")


@dataclass(frozen=True)
class SimHandover:
    """A handover with a session in flight: tokens at the handover K, the prediction lead
    (T_avail, s; 0 if the target was never predicted right) and the session's earlier
    handovers (Detour's hop count grows with them). ``cached_tokens``: tokens of the session the
    target computed when it served the session before (0: never); ``known_held_tokens``: the
    same where the target is the agent the session came from (the source then knows it), else
    0 (see the module docstring). ``relay_hops`` / ``prev_relay_hops``: Detour's relay hops
    after and before this handover where known (:func:`front_relay_paths`); None: the chain,
    ``hops_before + 1`` and ``hops_before``."""

    ue_id: str
    time: float
    from_cell: int
    to_cell: int
    k_ho: int
    lead_s: float
    hops_before: int = 0
    cached_tokens: int = 0
    known_held_tokens: int = 0
    relay_hops: int | None = None
    prev_relay_hops: int = 0


@dataclass
class SimResult:
    """One handover under one scheme in the model: SIT and T_early (s), window (s, NaN if
    none), bytes over the link and tokens prefilled at the target."""

    scheme: str
    handover: SimHandover
    sit_s: float
    t_early_s: float = float("nan")
    window_s: float = float("nan")
    bytes_moved: float = 0.0
    prefill_tokens: float = 0.0
    outcome: str = ""




@dataclass
class SchemeArrays:
    """Many handovers under the schemes at once (:func:`simulate_arrays`); arrays of shape (n,).

    ``sit``, ``bytes_moved``, ``prefill_tokens``: per scheme (s, bytes, tokens). ``window``: the
    window actually used by Pallas and its ablations (trigger to the actual HO, s; NaN where
    Pallas fell back to ctHO); ``chosen``: Eq. 9's T_w* (NaN likewise); ``t_early``: Eq. 7 at the
    window used (NaN on fallback); ``fallback``: True where Pallas fell back to ctHO.
    """

    sit: dict[str, np.ndarray]
    bytes_moved: dict[str, np.ndarray]
    prefill_tokens: dict[str, np.ndarray]
    window: np.ndarray
    chosen: np.ndarray
    t_early: np.ndarray
    fallback: np.ndarray


def simulate_arrays(k_ho, lead_s, rates: Rates, schemes: Iterable[str] = COMPARED, *, hops=1, prev_hops=None,
                    bandwidth=None, est_bandwidth=None, ho_error_s=0.0, r_p=None, est_r_p=None,
                    cached_tokens=0, known_held_tokens=0,
                    alpha: float = 0.8, dt: float = 0.1, t_max: float = 5.0) -> SchemeArrays:
    """Every handover under every scheme, vectorised (the module docstring's rules).

    Per-handover inputs broadcast to shape (n,): ``k_ho`` tokens at the actual HO; ``lead_s``
    the prediction lead (T_avail, s; <= 0: no usable prediction, Pallas falls back to ctHO);
    ``hops`` Detour's forwarding hops after this HO and ``prev_hops`` before it (default
    ``hops - 1``, the chain); ``bandwidth`` the goodput the migration gets
    (bytes/s; default ``rates.bandwidth``) and ``est_bandwidth`` the Scheduler Engine's estimate
    of it when deciding (default: the same); ``r_p``/``est_r_p`` likewise for the target's
    prefill rate; ``ho_error_s`` the actual HO time minus the predicted one (s; > 0: later);
    ``cached_tokens`` / ``known_held_tokens`` what the target holds of the session from serving
    it before, and what of that the source knows (tokens; :class:`SimHandover`).

    Pallas decides Eq. 9 with T_remain_hat = min(lead, T_max) on the estimates and triggers
    T_w* before the predicted HO; the window actually used is T_w* + ho_error (if that is
    negative the HO came before the trigger: fallback to ctHO). T_SIT (Eq. 6) and T_early
    (Eq. 7) are evaluated at the window used with the actual rates; w/o RC and w/o SM at the same
    window. A session younger than the lead (K < r_d lead) has the lead capped at its age K / r_d.
    Full-Copy, Recomputation and ctHO (docs/model.md §6) add the first decode step
    1 / r_d like Eq. 6. Raises ValueError for an unknown scheme.
    """
    schemes = tuple(schemes)
    bad = [s for s in schemes if s not in NAMES]
    if bad:
        raise ValueError(f"unknown scheme(s) {bad}; known: {NAMES}")
    B = rates.bandwidth if bandwidth is None else bandwidth
    k, lead, err, hops, B, rp = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v, dtype=np.float64)) for v in
                                                       (k_ho, lead_s, ho_error_s, hops, B,
                                                        rates.r_p if r_p is None else r_p)))
    B_est = B if est_bandwidth is None else np.broadcast_to(np.asarray(est_bandwidth, dtype=np.float64), k.shape)
    rp_est = rp if est_r_p is None else np.broadcast_to(np.asarray(est_r_p, dtype=np.float64), k.shape)
    n, P, r_d = k.shape[0], rates.block_size, rates.r_d
    first_step = 1.0 / r_d
    nan = np.full(n, np.nan)
    window, chosen, t_early = nan.copy(), nan.copy(), nan.copy()
    fallback = np.ones(n, dtype=bool)
    sit_p, no_rc, no_sm = nan.copy(), nan.copy(), nan.copy()
    bytes_p, pre_p = np.zeros(n), np.zeros(n)
    proactive = any(s in schemes for s in PROACTIVE_NAMES)
    use = np.nonzero(lead > 0)[0] if proactive else np.zeros(0, dtype=np.int64)
    if use.size:
        # A session younger than the lead cannot trigger before it began: cap the usable lead at
        # its age (K / r_d), so that K_trig >= 0 and the tokens at the HO stay K.
        t_rem = np.minimum(np.minimum(lead[use], t_max), np.maximum(k[use] / r_d - err[use], 0.0))
        x = timing.WindowInputs(k_curr=np.maximum(0.0, k[use] - r_d * (t_rem + err[use])), t_remain=t_rem,
                                block_size=P, r_p=rp_est[use], r_d=r_d, bandwidth=B_est[use], s_kv=rates.s_kv,
                                c_sync=rates.c_sync)
        d = timing.decide(x, timing.DecisionParams(alpha=alpha, dt=dt, t_max=t_max))
        used = d.window + err[use]
        ok = used >= 0
        idx = use[ok]
        chosen[idx], window[idx], fallback[idx] = d.window[ok], used[ok], False
        if idx.size:
            w = window[idx]
            xr = timing.WindowInputs(k_curr=np.maximum(0.0, k[idx] - r_d * w), t_remain=w, block_size=P,
                                     r_p=rp[idx], r_d=r_d, bandwidth=B[idx], s_kv=rates.s_kv, c_sync=rates.c_sync)
            c = timing.evaluate_windows(xr, w[:, None], alpha)
            sit_p[idx], t_early[idx] = c.t_sit[:, 0], c.t_early[:, 0]
            bytes_p[idx] = c.n_full[:, 0] * P * rates.s_kv
            pre_p[idx] = c.l_hist[:, 0] + c.n_tail[:, 0]
            if NO_RC in schemes:
                no_rc[idx] = timing.sit_no_rc(xr, w[:, None])[:, 0]
            if NO_SM in schemes:
                no_sm[idx] = timing.sit_no_sm(xr, w[:, None])[:, 0]
    cached = np.minimum(np.floor(np.broadcast_to(np.asarray(cached_tokens, dtype=np.float64), k.shape) / P) * P,
                        np.floor(k / P) * P)
    known = np.minimum(np.broadcast_to(np.asarray(known_held_tokens, dtype=np.float64), k.shape), cached)
    split, _ = timing.ctho_split(k, P, rp, rates.s_kv, B, held_tokens=known)
    # The target's prefill of the split skips what its prefix cache holds, known or not.
    ctho_s = np.maximum(np.maximum(split - cached, 0.0) / rp, (k - split) * (rates.s_kv / B))
    ctho_sit = rates.c_sync + ctho_s + first_step
    sit, moved, pre = {}, {}, {}
    for sch in schemes:
        if sch == PALLAS_BRIDGE:  # the switch's gap, prepared or not (timing.sit_bridge)
            sit[sch] = np.broadcast_to(timing.sit_bridge(P, rp, r_d, rates.c_sync, rates.hop_delay_s), (n,)).copy()
            moved[sch] = np.where(fallback, (k - split) * rates.s_kv, bytes_p)
            pre[sch] = np.where(fallback, split, pre_p)
        elif sch in PROACTIVE_NAMES:
            v = {PALLAS: sit_p, NO_RC: no_rc, NO_SM: no_sm}[sch]
            sit[sch] = np.where(fallback, ctho_sit, v)
            own_b = {PALLAS: bytes_p, NO_RC: k * rates.s_kv, NO_SM: np.zeros(n)}[sch]
            own_p = {PALLAS: pre_p, NO_RC: np.zeros(n), NO_SM: k}[sch]
            moved[sch] = np.where(fallback, (k - split) * rates.s_kv, own_b)
            pre[sch] = np.where(fallback, split, own_p)
        elif sch == CTHO:
            sit[sch], moved[sch], pre[sch] = ctho_sit, (k - split) * rates.s_kv, split.astype(np.float64)
        elif sch == FULL_COPY:
            sit[sch] = timing.sit_full_copy(k, rates.s_kv, B, rates.c_sync) + first_step
            moved[sch], pre[sch] = k * rates.s_kv, np.zeros(n)
        elif sch == RECOMPUTATION:
            sit[sch] = timing.sit_recomputation(k - cached, rp, rates.c_sync) + first_step
            moved[sch], pre[sch] = np.zeros(n), k - cached
        else:   # detour: the gap across the switch of relay paths
            h = hops.astype(np.int64)
            prev = (np.maximum(h - 1, 0) if prev_hops is None
                    else np.broadcast_to(np.asarray(prev_hops, dtype=np.int64), (n,)))
            sit[sch] = timing.detour_switch_gap(r_d, h, prev, rates.hop_cost(), rates.relay_request_s,
                                                rates.relay_requests_per_hop)
            moved[sch], pre[sch] = np.zeros(n), np.zeros(n)
    return SchemeArrays(sit, moved, pre, window, chosen, t_early, fallback)


def simulate(handovers: Sequence[SimHandover], rates: Rates, schemes: Iterable[str] = COMPARED, *,
             alpha: float = 0.8, dt: float = 0.1, t_max: float = 5.0) -> list[SimResult]:
    """Every handover under every scheme (see the module docstring; :func:`simulate_arrays`
    does the work). Raises ValueError for an unknown scheme."""
    schemes = tuple(schemes)
    if not handovers:
        simulate_arrays(np.zeros(0), np.zeros(0), rates, schemes)      # still checks the names
        return []
    a = simulate_arrays([h.k_ho for h in handovers], [h.lead_s for h in handovers], rates, schemes,
                        hops=[h.hops_before + 1 if h.relay_hops is None else h.relay_hops for h in handovers],
                        prev_hops=[h.hops_before if h.relay_hops is None else h.prev_relay_hops for h in handovers],
                        cached_tokens=[h.cached_tokens for h in handovers],
                        known_held_tokens=[h.known_held_tokens for h in handovers], alpha=alpha, dt=dt, t_max=t_max)
    out: list[SimResult] = []
    for i, ho in enumerate(handovers):
        for sch in schemes:
            if sch == PALLAS_BRIDGE:
                outcome = "bridged" if a.fallback[i] else "commit"
            elif sch in PROACTIVE_NAMES:
                outcome = "fallback:ctho" if a.fallback[i] else "commit"
            else:
                outcome = {CTHO: "commit", DETOUR: "relay"}.get(sch, "recovered")
            te = float(a.t_early[i]) if sch == PALLAS else float("nan")
            win = float(a.window[i]) if sch in PROACTIVE_NAMES else float("nan")
            out.append(SimResult(sch, ho, float(a.sit[sch][i]), te, win, float(a.bytes_moved[sch][i]),
                                 float(a.prefill_tokens[sch][i]), outcome))
    return out


def summarize_sim(results: Sequence[SimResult]) -> dict[str, dict]:
    """Per scheme: SIT mean/p50/p99 and T_early mean (s), handovers counted."""
    by: dict[str, list[SimResult]] = {}
    for r in results:
        by.setdefault(r.scheme, []).append(r)
    out = {}
    for sch, rs in by.items():
        sit = np.array([r.sit_s for r in rs])
        te = np.array([r.t_early_s for r in rs])
        te = te[np.isfinite(te)]
        out[sch] = {"handovers": len(rs), "sit_mean": float(sit.mean()), "sit_p50": float(np.percentile(sit, 50)),
                    "sit_p99": float(np.percentile(sit, 99)),
                    "t_early_mean": float(te.mean()) if te.size else float("nan")}
    return out


def measured_rates(*, r_p: float | None, r_d: float | None, bandwidth: float | None, s_kv: float,
                   block_size: int, c_sync: float | None, hop_delay_s: float | None,
                   base: Rates | None = None) -> Rates:
    """Rates from a live run's measurements; a missing (None or non-finite) one is taken from
    ``base`` (default: 5,000 tok/s prefill, 50 tok/s decode, 1 Gbit/s, 20 ms sync, 5 ms hop).
    A Detour relay path's requests each cost the c_sync taken (``Rates.relay_request_s``).
    """
    b = base or Rates("defaults", 5000.0, 50.0, timing.mbit_per_s(1000.0), s_kv, block_size, 0.02, 0.005)

    def pick(v, d):
        return d if v is None or not math.isfinite(v) or v <= 0 else float(v)

    c = pick(c_sync, b.c_sync)
    return replace(b, name="measured (this run)", r_p=pick(r_p, b.r_p), r_d=pick(r_d, b.r_d),
                   bandwidth=pick(bandwidth, b.bandwidth), s_kv=s_kv, block_size=block_size,
                   c_sync=c, hop_delay_s=pick(hop_delay_s, b.hop_delay_s), relay_request_s=c)


def held_from_rows(rows: Sequence) -> list[tuple[int, int]]:
    """(cached_tokens, known_held_tokens) of :class:`SimHandover` for each of a scheme's
    handover rows (``pallas_eval.report.HandoverRow``: session_id, from_server, to_server,
    tokens_at_ho, in time order): what the target computed of the session when it last left
    that server (tokens at that handover, less the last token, whose KV is computed with the
    next step), and the same if the target is the server the session came from to its source.
    Rows without a session, or within one server, count nothing."""
    left: dict[tuple[str, str], int] = {}
    came_from: dict[str, str] = {}
    out = []
    for r in rows:
        sid = r.session_id
        if not sid or r.from_server == r.to_server:     # no session, or it did not move
            out.append((0, 0))
            continue
        cached = left.get((sid, r.to_server), 0)
        known = cached if came_from.get(sid) == r.to_server else 0
        out.append((cached, known))
        left[(sid, r.from_server)] = max(0, int(r.tokens_at_ho) - 1)
        came_from[sid] = r.from_server
    return out


def front_relay_hops(holder: str, relayed: set[str], from_server: str, to_server: str) -> int:
    """The relay hops the live fronts give a Detour stream after a handover from ``from_server``
    to ``to_server`` (agent/frontend.py ``relay_origin``): 0 at the ``holder`` (the session's own
    agent serves it); 1 where the new agent relayed the session before (it remembers the holder)
    or the UE comes from the holder; else 2 (the new agent relays the UE's previous one, which
    relays on from the holder). ``relayed``: the agents that relayed the session so far."""
    if to_server == holder:
        return 0
    return 1 if (to_server in relayed or from_server == holder) else 2


def front_relay_paths(rows: Sequence) -> list[tuple[int, int]]:
    """(relay hops after, relay hops before) of Detour's path at each of a scheme's handover
    rows (``pallas_eval.report.HandoverRow``: session_id, from_server, to_server, in time
    order), by :func:`front_relay_hops`: a session's holder is the server it left at its first
    handover (Detour never moves it). Rows without a session count (0, 0)."""
    holder: dict[str, str] = {}
    relayed: dict[str, set[str]] = {}
    last: dict[str, int] = {}
    out = []
    for r in rows:
        sid = r.session_id
        if not sid:
            out.append((0, 0))
            continue
        hold = holder.setdefault(sid, r.from_server)
        mine = relayed.setdefault(sid, set())
        h = front_relay_hops(hold, mine, r.from_server, r.to_server)
        out.append((h, last.get(sid, 0)))
        last[sid] = h
        if r.to_server != hold:
            mine.add(r.to_server)
    return out
