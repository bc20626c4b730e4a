"""Per-session order of control calls around a commit (the session moves between agents).

A commit moves a session from its source agent to the actual target; the move is done when
the source answers (the target resumed it, paper §4.3 step 5). The state machine rebinds the
session to the target as soon as it decides the commit, so an action decided while the commit
is still in flight (the UE hands over again, or a new prediction triggers) names the target as
its source. Sent at once it would reach the target before the session does
(``STATUS_UNKNOWN_SESSION``) and, if the commit then fails, the wrong agent for good. The gate
holds such actions until the commit's reply:

- the commit succeeded: they go out as decided;
- it failed (the session stayed at the commit's source, which keeps serving it): every held
  action whose source is the commit's target is rewritten to the commit's source; a held
  commit back to that agent, or a trigger towards it, is dropped (nothing to move).
"""

from __future__ import annotations

import dataclasses
from typing import Generic, TypeVar

from .state import Action, CommitAction, TriggerAction

C = TypeVar("C")


class CommitGate(Generic[C]):
    """Holds a session's actions while one of its commits is in flight.

    Each action travels with a caller's context ``C`` (the composition root keeps the handover
    it belongs to). Not thread-safe: call it under the caller's lock.
    """

    def __init__(self) -> None:
        self._inflight: dict[str, int] = {}                       # session -> commit epoch
        self._held: dict[str, list[tuple[Action, C]]] = {}

    def admit(self, action: Action, ctx: C) -> bool:
        """True: send ``action`` now. False: it is held until the session's commit settles."""
        sid = action.session_id
        if sid in self._inflight:
            self._held.setdefault(sid, []).append((action, ctx))
            return False
        if isinstance(action, CommitAction):
            self._inflight[sid] = action.epoch
        return True

    def in_flight(self, session_id: str) -> int | None:
        """The epoch of the session's commit in flight, or None."""
        return self._inflight.get(session_id)

    def held(self, session_id: str) -> int:
        """How many of the session's actions wait."""
        return len(self._held.get(session_id, ()))

    def forget(self, session_id: str) -> None:
        """The session ended: drop its commit in flight and what waits behind it."""
        self._inflight.pop(session_id, None)
        self._held.pop(session_id, None)

    def settle(self, commit: CommitAction, ok: bool) -> list[tuple[Action, C]]:
        """The reply to ``commit`` came (``ok``: the session moved). Returns the held actions
        to send now, in order (pass each through :meth:`admit` again); a reply to a commit that
        is not the one in flight releases nothing."""
        sid = commit.session_id
        if self._inflight.get(sid) != commit.epoch:
            return []
        del self._inflight[sid]
        held = self._held.pop(sid, [])
        if ok:
            return held
        out: list[tuple[Action, C]] = []
        for a, ctx in held:
            if getattr(a, "source", None) == commit.actual_target:
                if isinstance(a, CommitAction) and a.actual_target == commit.source:
                    continue              # the UE is back where the session stayed
                if isinstance(a, TriggerAction) and a.target == commit.source:
                    continue
                a = dataclasses.replace(a, source=commit.source)
            out.append((a, ctx))
        return out
