"""A replica killed mid-replay and what its fail-over cost (issue 46, docs/scale-out.md §4, §6).

``pallas replay --xapp-replicas N --kill-replica I@T`` SIGKILLs replica ``xapp-I`` T seconds
of trace time after the replay's start: its leases are not released, they expire in SDL after
the lease time and the survivors claim its E2 nodes at their next heartbeat. This module reads
what happened from the replicas' merged events (pallas_eval.replicas.merge_events), pure:

- ``lease`` events (``claimed`` / ``released`` / ``lost`` / ``owned`` node lists, wall time
  ``t``; written by each replica when a heartbeat changed what it owns, xapp/app.py): which
  nodes the killed replica held at the kill, and when each was claimed again by a survivor.
  The bound is the lease time plus one heartbeat: the dead replica renewed last at or before
  the kill, so its leases expire at most ``lease_s`` after it, and a survivor claims at its
  first heartbeat after that;
- ``end`` events (the survivors' ``cluster.admitted``: indications handled per E2 node) against
  the trace's indications per node: on a node the killed replica never owned, every indication
  must be handled by exactly one survivor (lost = in the trace, handled by none);
- ``trigger`` / ``commit`` / ``cancel`` (and ``reply``) events: the sessions whose last order
  before the kill came from the killed replica (it owned their records, docs/scale-out.md §3)
  and how each ended;
- the per-handover rows: handovers with no preparation (a commit not prepared, or none) in the
  fail-over window (the kill to the last node owned again) or of the dead replica's sessions.

Every time here is wall time (s since 1970) unless named ``*_s`` (s since the replay's start).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["KillSpec", "parse_kill", "check_within", "owned_at", "failover_report", "failover_lines",
           "ORDERS", "PREPARED"]

#: the events that write a session's record (docs/scale-out.md §3): its orders
ORDERS = ("trigger", "commit", "cancel")
#: the per-handover outcome of a prepared commit (pallas_eval.replay.handover_rows)
PREPARED = "commit"


@dataclass(frozen=True)
class KillSpec:
    """``--kill-replica I@T``: replica index ``replica`` (``xapp-I``), ``at_s`` seconds of trace
    time after the replay's start."""

    replica: int
    at_s: float

    def __str__(self) -> str:
        return f"{self.replica}@{self.at_s:g}"


def parse_kill(spec: str, replicas: int) -> KillSpec:
    """``"I@T"`` as a :class:`KillSpec`, for a run of ``replicas`` replicas.

    Raises ValueError (one line) for another shape, I outside 0..replicas-1 (so also for one
    replica: nothing to fail over to), or T not a finite number > 0."""
    head, at, tail = str(spec).strip().partition("@")
    try:
        i, t = int(head), float(tail)
    except ValueError:
        raise ValueError(f"--kill-replica {spec!r}: REPLICA@SECONDS, e.g. 1@40") from None
    if not at:
        raise ValueError(f"--kill-replica {spec!r}: REPLICA@SECONDS, e.g. 1@40")
    if replicas < 2:
        raise ValueError(f"--kill-replica {spec}: needs --xapp-replicas 2 or more (no replica would survive)")
    if not 0 <= i < replicas:
        raise ValueError(f"--kill-replica {spec}: replica {i} of {replicas} (0..{replicas - 1})")
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"--kill-replica {spec}: the time must be > 0 s")
    return KillSpec(i, t)


def check_within(kill: KillSpec, duration_s: float) -> None:
    """Raises ValueError (one line) when ``kill`` falls at or after the end of a replay of
    ``duration_s`` seconds of trace time."""
    if not kill.at_s < duration_s:
        raise ValueError(f"--kill-replica {kill}: the replay lasts {duration_s:.0f} s of trace time")


def owned_at(events: Sequence[Mapping[str, Any]], replica: str, t: float) -> set[str]:
    """The E2 nodes ``replica`` owned at wall time ``t`` by its ``lease`` events (the last
    ``owned`` list at or before ``t``; none: nothing)."""
    owned: set[str] = set()
    for e in events:
        if e.get("kind") == "lease" and e.get("replica") == replica and float(e.get("t") or 0.0) <= t:
            owned = set(e.get("owned") or ())
    return owned


def _ever_claimed(events: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[float, str]]]:
    """node -> [(wall time, replica)] of every claim, in event order."""
    out: dict[str, list[tuple[float, str]]] = {}
    for e in events:
        if e.get("kind") == "lease":
            for n in e.get("claimed") or ():
                out.setdefault(n, []).append((float(e.get("t") or 0.0), str(e.get("replica"))))
    return out


def _reply(events: Sequence[Mapping[str, Any]], order: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((e for e in events if e.get("kind") == "reply" and e.get("call") == order.get("kind")
                 and e.get("session") == order.get("session") and e.get("epoch") == order.get("epoch")), None)


def _session_end(events: Sequence[Mapping[str, Any]], last_dead: Mapping[str, Any],
                 after: Sequence[Mapping[str, Any]]) -> tuple[str, str, bool]:
    """(how the session ended, by which replica, whether that is a defined state) from the dead
    replica's last order ``last_dead`` and the orders after the kill ``after``."""
    if not after:
        if last_dead["kind"] == "trigger":       # its preparation left open, nobody decided since
            return "open: prepared by the dead replica, never committed nor cancelled", "", False
        return ("committed before the kill" if last_dead["kind"] == "commit" else
                "cancelled before the kill: served at the source"), str(last_dead.get("replica")), True
    last = after[-1]
    by = str(last.get("replica"))
    reply = _reply(events, last)
    refused = reply is not None and not reply.get("ok")
    if last["kind"] == "commit":
        how = "committed (prepared)" if last.get("prepared") else "committed (fallback)"
        return (how + ", refused by the agent: served at the source" if refused else how), by, True
    if last["kind"] == "cancel":
        return "cancelled: served at the source", by, True
    return "open: a trigger after the kill, never committed nor cancelled", by, False


def failover_report(events: Sequence[Mapping[str, Any]], *, killed: str, t_kill: float, start_at: float,
                    lease_s: float, heartbeat_s: float,
                    indications: Mapping[str, Sequence[float]] | None = None,
                    rows: Sequence[tuple[str, float, str, str]] = (),
                    sessions: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """What the fail-over of replica ``killed`` (SIGKILLed at wall time ``t_kill``) cost.

    Args:
        events: every replica's events merged by wall time, each with its ``replica``.
        start_at: the replay's start (wall time of the trace's first record).
        lease_s, heartbeat_s: the replicas' ``controls.cluster`` lease time and heartbeat (s).
        indications: E2 node -> wall times of the trace's RIC indications of that node (the
            trace's record times plus the replay's offset); None: not counted.
        rows: per handover ``(UE, wall time, session id, outcome)`` (outcome ``"commit"``: a
            prepared commit; ``"no-session"``: none to move).
        sessions: session id -> what the UE saw (``error``: str; ``finished``: bool, the UE got
            its whole output, which makes a session nobody decided a defined end;
            ``agents_after_kill``: list of the agents that delivered its tokens after the kill),
            added to its session's line.

    Returns a JSON-ready dict (module docstring): ``nodes`` (per node of the killed replica:
    who owned it again and after how long, indications unhandled meanwhile), ``reowned_max_s``,
    ``bound_s``, ``within_bound``, ``surviving`` (indications lost on the nodes it never owned),
    ``sessions`` and ``sessions_by_end``, ``undefined_sessions``, ``handovers``."""
    bound = float(lease_s) + float(heartbeat_s)
    mine = sorted(owned_at(events, killed, t_kill))
    claims = _ever_claimed(events)
    nodes, gaps, window_end = [], [], t_kill
    for n in mine:
        again = next(((t, r) for t, r in claims.get(n, ()) if t >= t_kill and r != killed), None)
        times = (indications or {}).get(n, ())
        row: dict[str, Any] = {"node": n, "owned_again_by": again[1] if again else None,
                               "gap_s": round(again[0] - t_kill, 3) if again else None}
        if indications is not None:
            row["indications_unhandled"] = sum(1 for x in times if t_kill <= x < (again[0] if again else math.inf))
        if again:
            gaps.append(again[0] - t_kill)
            window_end = max(window_end, again[0])
        nodes.append(row)
    not_again = [r["node"] for r in nodes if r["owned_again_by"] is None]
    out: dict[str, Any] = {
        "replica": killed, "at_s": round(t_kill - start_at, 3), "lease_s": lease_s, "heartbeat_s": heartbeat_s,
        "bound_s": bound, "nodes": nodes, "nodes_not_owned_again": not_again,
        "reowned_min_s": round(min(gaps), 3) if gaps else None,
        "reowned_max_s": round(max(gaps), 3) if gaps else None,
        "within_bound": (not not_again and max(gaps) <= bound) if mine else None,
        "owned_again_by": dict(Counter(r["owned_again_by"] for r in nodes if r["owned_again_by"])),
        "window_s": [round(t_kill - start_at, 3), round(window_end - start_at, 3)]}
    out["surviving"] = _surviving(events, killed, claims, indications)
    out.update(_sessions(events, killed, t_kill, sessions))
    out["handovers"] = _handovers(rows, t_kill, window_end, {s["session"] for s in out["sessions"]})
    return out


def _surviving(events: Sequence[Mapping[str, Any]], killed: str, claims: Mapping[str, list[tuple[float, str]]],
               indications: Mapping[str, Sequence[float]] | None) -> dict[str, Any] | None:
    """Indications of the nodes the killed replica never owned: in the trace, handled by the
    survivors (their ``end`` events' ``cluster.admitted``), lost; nodes with lost indications
    split by whether their lease moved among the survivors (a hand-over: dropped by design) or
    not; nodes no replica ever owned apart. None without the trace's indications or with a
    survivor that wrote no ``end`` event (what it handled is unknown)."""
    if indications is None:
        return None
    ends = {e.get("replica"): (e.get("cluster") or {}).get("admitted") or {} for e in events
            if e.get("kind") == "end"}
    survivors = {e.get("replica") for e in events if e.get("replica") != killed}
    if not survivors or survivors - set(ends):
        return None
    theirs = sorted(n for n in set(indications) | set(claims) if all(r != killed for _, r in claims.get(n, ())))
    lost: dict[str, int] = {}
    moved: dict[str, int] = {}
    never: dict[str, int] = {}
    total = handled = 0
    for n in theirs:
        want = len(indications.get(n, ()))
        got = sum(int(ends[r].get(n, 0)) for r in ends if r != killed)
        total += want
        handled += got
        if n not in claims:
            never[n] = want
        elif got != want:
            (moved if len(claims[n]) > 1 else lost)[n] = want - got
    return {"nodes": len(theirs), "indications": total, "handled": handled,
            "lost": sum(v for v in lost.values() if v > 0), "lost_by_node": lost,
            "dropped_in_handover": moved, "never_owned": never}


def _sessions(events: Sequence[Mapping[str, Any]], killed: str, t_kill: float,
              seen: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """The sessions whose last order before the kill was the killed replica's, and their ends."""
    last: dict[str, Mapping[str, Any]] = {}
    after: dict[str, list[Mapping[str, Any]]] = {}
    for e in events:
        if e.get("kind") not in ORDERS or not e.get("session"):
            continue
        if float(e.get("t") or 0.0) < t_kill:
            last[e["session"]] = e
        else:
            after.setdefault(e["session"], []).append(e)
    rows = []
    for sid, e in sorted(last.items()):
        if e.get("replica") != killed:
            continue
        how, by, ok = _session_end(events, e, after.get(sid, []))
        ue = e.get("ue") or next((x.get("ue") for x in events if x.get("session") == sid and x.get("ue")), "")
        row = {"session": sid, "ue": ue, "at_kill": {"trigger": "open", "commit": "committed",
                                                     "cancel": "cancelled"}[e["kind"]],
               "end": how, "by": by, "defined": ok}
        if seen and sid in seen:
            row.update({k: seen[sid][k] for k in ("error", "agents_after_kill") if k in seen[sid]})
            if not ok and seen[sid].get("finished"):
                # nobody decided, but the UE got its whole output: served to the end where it was
                # (the dead replica's preparation is left to its lease at the target)
                row.update(end=how.split(",")[0] + ", then finished its output: served to the end",
                           defined=True)
        rows.append(row)
    return {"sessions": rows, "sessions_by_end": dict(Counter(r["end"] for r in rows)),
            "undefined_sessions": sum(1 for r in rows if not r["defined"])}


def _handovers(rows: Sequence[tuple[str, float, str, str]], t_kill: float, window_end: float,
               dead_sessions: set[str]) -> dict[str, int]:
    """Handovers with no preparation attributed to the fail-over: in the window (the kill to
    the last node owned again), or the first after the kill of a session the dead replica owned;
    ``cost`` counts each once. ``unprepared_elsewhere`` / ``elsewhere``: the rest of the run."""
    window = cost = unprepared_dead = elsewhere = unprepared_elsewhere = in_window = 0
    first_after: set[str] = set()
    for ue, t, sid, outcome in sorted(rows, key=lambda r: r[1]):
        if outcome == "no-session":
            continue
        unprepared = outcome != PREPARED
        in_w = t_kill <= t <= window_end
        dead = sid in dead_sessions and t >= t_kill and sid not in first_after
        if dead:
            first_after.add(sid)
        in_window += in_w
        window += in_w and unprepared
        unprepared_dead += dead and unprepared
        cost += (in_w or dead) and unprepared
        if not (in_w or dead):
            elsewhere += 1
            unprepared_elsewhere += unprepared
    return {"in_window": in_window, "unprepared_in_window": window, "unprepared_of_dead_sessions": unprepared_dead,
            "cost": cost, "elsewhere": elsewhere, "unprepared_elsewhere": unprepared_elsewhere}


def failover_lines(rep: Mapping[str, Any]) -> list[str]:
    """The report's lines for the replay's output (one fail-over)."""
    nodes = rep.get("nodes") or []
    by = ", ".join(f"{r} ({n})" for r, n in sorted((rep.get("owned_again_by") or {}).items())) or "nobody"
    wb = rep.get("within_bound")
    held = "nothing to take over" if wb is None else "held" if wb else "NOT HELD"
    lo, hi = rep.get("reowned_min_s"), rep.get("reowned_max_s")
    span = "-" if hi is None else f"{lo:.2f}-{hi:.2f} s"
    unhandled = sum(int(r.get("indications_unhandled") or 0) for r in nodes)
    lines = [f"fail-over: {rep['replica']} SIGKILLed at {rep['at_s']:.1f} s holding {len(nodes)} E2 node(s); "
             f"owned again after {span} by {by} (bound: lease {rep['lease_s']:g} s + heartbeat "
             f"{rep['heartbeat_s']:g} s = {rep['bound_s']:g} s: {held}); {unhandled} of their indications "
             f"unhandled meanwhile"]
    if rep.get("nodes_not_owned_again"):
        lines.append(f"  NOT owned again: {', '.join(rep['nodes_not_owned_again'])}")
    s = rep.get("surviving")
    if s is None:
        lines.append("  the other nodes' indications: not counted (a survivor wrote no end event)")
    else:
        lines.append(f"  the other {s['nodes']} node(s): {s['indications']} indications in the trace, "
                     f"{s['handled']} handled by the survivors, {s['lost']} lost"
                     + (f"; dropped in a hand-over among survivors: {s['dropped_in_handover']}"
                        if s["dropped_in_handover"] else "")
                     + (f"; never owned by any replica: {s['never_owned']}" if s["never_owned"] else ""))
    ends = "; ".join(f"{k}: {v}" for k, v in sorted((rep.get("sessions_by_end") or {}).items()))
    lines.append(f"  sessions {rep['replica']} owned at the kill: {len(rep.get('sessions') or [])}"
                 + (f" ({ends})" if ends else "") + f"; in no defined state: {rep.get('undefined_sessions', 0)}")
    h = rep.get("handovers") or {}
    lines.append(f"  handovers with no preparation from the fail-over: {h.get('cost', 0)} "
                 f"({h.get('unprepared_in_window', 0)} of {h.get('in_window', 0)} in the window "
                 f"{rep['window_s'][0]:.1f}-{rep['window_s'][1]:.1f} s, {h.get('unprepared_of_dead_sessions', 0)} "
                 f"of its sessions' first after the kill); elsewhere {h.get('unprepared_elsewhere', 0)} "
                 f"of {h.get('elsewhere', 0)}")
    return lines
