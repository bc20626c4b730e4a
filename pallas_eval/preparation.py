"""What the replay's preparations bought and cost: SIT split by whether the right target was
named ahead, and the warm-ups that were never used (issue 43: real roads measured as they are).

Pure functions over the harness's per-handover rows (``pallas_eval.report.HandoverRow`` or their
``summary.json`` dicts) and the xApp's event log (``xapp/dispatch.py``: ``trigger``, ``cancel``,
``commit`` events, trace clock in s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pallas_eval.metrics import bootstrap_ci


def _get(row: Any, key: str, default: Any = float("nan")) -> Any:
    return row.get(key, default) if isinstance(row, Mapping) else getattr(row, key, default)


def _f(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def sit_by_prediction(rows: Iterable[Any], scheme: str) -> dict[str, dict[str, float]]:
    """``scheme``'s SITs (s) split by whether the xApp named the right target before the
    handover (``lead_s`` > 0: "predicted") or not ("unpredicted"); handovers with no session in
    flight (NaN SIT) left out. Per part: n, mean_s with its 95% bootstrap interval (ci_lo_s,
    ci_hi_s), p50_s, and prepared (handovers that ended as a commit on a prepared target)."""
    parts: dict[str, list[tuple[float, bool]]] = {"predicted": [], "unpredicted": []}
    for r in rows:
        if _get(r, "scheme", "") != scheme:
            continue
        sit = _f(_get(r, "sit_s"))
        if not math.isfinite(sit):
            continue
        lead = _f(_get(r, "lead_s"))
        key = "predicted" if math.isfinite(lead) and lead > 0 else "unpredicted"
        parts[key].append((sit, str(_get(r, "outcome", "")) == "commit"))
    out = {}
    for k, v in parts.items():
        x = np.array([s for s, _ in v], dtype=np.float64)
        lo, hi = bootstrap_ci(x)
        out[k] = {"n": int(x.size), "mean_s": float(x.mean()) if x.size else float("nan"), "ci_lo_s": lo,
                  "ci_hi_s": hi, "p50_s": float(np.median(x)) if x.size else float("nan"),
                  "prepared": int(sum(1 for _, p in v if p))}
    return out


@dataclass(frozen=True)
class WastedPreparation:
    """Warm-ups that no commit used, over ``ue_hours`` of replayed drive.

    ``count``: triggers (session, epoch, target) with no prepared commit to that target.
    ``prefill_gpu_s``: their prefixes' prefill time at the target, l_hist / r_p with the rates
    the xApp held at the trigger (docs/model.md Eq. 4's prefill term). ``bytes_streamed``: the
    suffix KV the source streamed while each was held, s_kv x r_d x held time (the newly
    completed blocks). ``vram_gib_s``: the target's KV held, integral of s_kv x (l_hist + r_d t)
    over the held time, GiB x s. ``held_s``: total time from trigger to cancel (or to the
    session's commit elsewhere, or the run's end). Estimates from the event log, not readings
    of the agents; NaN terms where a trigger carried no rates.
    """

    count: int
    triggers: int
    ue_hours: float
    held_s: float
    prefill_gpu_s: float
    bytes_streamed: float
    vram_gib_s: float

    def per_hour(self) -> dict[str, float]:
        """Every figure divided by ``ue_hours`` (NaN without drive time)."""
        h = self.ue_hours if self.ue_hours > 0 else float("nan")
        return {"count": self.count / h, "prefill_gpu_s": self.prefill_gpu_s / h,
                "bytes_streamed": self.bytes_streamed / h, "vram_gib_s": self.vram_gib_s / h}

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "per_hour": self.per_hour()}


def wasted_preparation(events: Sequence[Mapping[str, Any]], ue_hours: float,
                       end_t: float | None = None) -> WastedPreparation:
    """The warm-ups of ``events`` (one scheme's xApp event log, trace clock) that no prepared
    commit used (see :class:`WastedPreparation`). A warm-up is held from its trigger to the
    first of: a cancel of its (session, epoch), a commit of its session, ``end_t`` (default: the
    last event's time)."""
    trig: dict[tuple[str, int], Mapping[str, Any]] = {}
    used: set[tuple[str, int]] = set()
    ends: dict[tuple[str, int], float] = {}
    last = max((_f(e.get("trace_t")) for e in events if math.isfinite(_f(e.get("trace_t")))), default=float("nan"))
    end_t = last if end_t is None else end_t
    commits_by_session: dict[str, list[float]] = {}
    for e in events:
        kind = e.get("kind")
        key = (str(e.get("session")), int(e.get("epoch") or 0))
        if kind == "trigger":
            trig[key] = e
        elif kind == "cancel":
            if e.get("only_target") and key in trig \
                    and e.get("target_agent") != trig[key].get("target_agent"):
                continue   # a targeted Cancel withdrew another target of the epoch
            ends.setdefault(key, _f(e.get("trace_t")))
        elif kind == "commit":
            commits_by_session.setdefault(key[0], []).append(_f(e.get("trace_t")))
            if e.get("prepared") and key in trig and e.get("target_agent") == trig[key].get("target_agent"):
                used.add(key)
    held = prefill = streamed = vram = 0.0
    count = 0
    for key, e in trig.items():
        if key in used:
            continue
        count += 1
        t0 = _f(e.get("trace_t"))
        stops = [ends.get(key, float("inf"))] + [t for t in commits_by_session.get(key[0], []) if t >= t0] + [end_t]
        t1 = min(t for t in stops if math.isfinite(t)) if any(math.isfinite(t) for t in stops) else t0
        dt = max(0.0, t1 - t0)
        l_hist, r_p, r_d, s_kv = (_f(e.get(k)) for k in ("l_hist", "r_p", "r_d", "s_kv"))
        held += dt
        prefill += l_hist / r_p if r_p > 0 else float("nan")
        streamed += s_kv * r_d * dt
        vram += s_kv * (l_hist * dt + r_d * dt * dt / 2.0) / 2 ** 30
    return WastedPreparation(count, len(trig), ue_hours, held, prefill, streamed, vram)


def ue_hours(plan: Mapping[str, Any]) -> float:
    """Replayed drive time summed over the plan's UEs (their first to last report), hours."""
    return sum(max(0.0, _f(u.get("end")) - _f(u.get("start"))) for u in plan.get("ues", [])) / 3600.0


def prediction_lines(split: Mapping[str, Mapping[str, float]], wasted: WastedPreparation | None,
                     scheme: str) -> list[str]:
    """Printable lines: the SIT split and the wasted preparation per UE-hour."""
    def part(k: str) -> str:
        p = split.get(k, {})
        if not p.get("n"):
            return f"{k} 0"
        ci = (f" [{p['ci_lo_s'] * 1000:.0f}-{p['ci_hi_s'] * 1000:.0f}]"
              if math.isfinite(p.get("ci_lo_s", float("nan"))) else "")
        return f"{k} {p['n']} (prepared {p['prepared']}): mean {p['mean_s'] * 1000:.0f}{ci} ms"
    lines = [f"{scheme}: SIT by prediction: {part('predicted')}; {part('unpredicted')}"]
    if wasted is not None and wasted.triggers:
        ph = wasted.per_hour()
        lines.append(f"{scheme}: warm-ups never used {wasted.count} of {wasted.triggers} "
                     f"({ph['count']:.1f} per UE-hour over {wasted.ue_hours:.2f} UE-hours): prefill "
                     f"{wasted.prefill_gpu_s:.1f} GPU-s, {wasted.bytes_streamed / 2 ** 20:.1f} MiB streamed, "
                     f"{wasted.vram_gib_s:.2f} GiB-s of KV held, {wasted.held_s:.0f} s held (model estimates "
                     f"at the triggers' rates)")
    return lines
