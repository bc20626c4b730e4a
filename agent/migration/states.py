"""States of one migration attempt, source and target side, and their one transition table.

An attempt is one (session, epoch). :data:`TRANSITIONS` lists every allowed move; anything else
is a bug (:class:`IllegalTransition`). tests/agent/test_engine.py walks the table.
"""

from __future__ import annotations

import enum


class SourceState(str, enum.Enum):
    """Source side of an attempt (paper section 4.3, steps 1-4)."""

    PLANNED = "planned"        # created; Prepare not answered yet
    PREPARED = "prepared"      # target admitted it (prefix warm-up running there)
    STREAMING = "streaming"    # suffix blocks flow to the target
    COMMITTING = "committing"  # session frozen at the commit point; Sync under way
    COMMITTED = "committed"    # the target serves the session (terminal)
    CANCELLED = "cancelled"    # abandoned by a cancel, a newer epoch or a failed commit (terminal)
    FAILED = "failed"          # Prepare refused or the stream broke (terminal)


class TargetState(str, enum.Enum):
    """Target side of an attempt."""

    PREPARING = "preparing"    # admitted: memory reserved, warm-up running, blocks buffering
    RESUMED = "resumed"        # Sync done: the resumed request runs here (terminal for the attempt)
    RELEASED = "released"      # everything held dropped: Release, expiry, newer epoch (terminal)


S, T = SourceState, TargetState
TRANSITIONS: dict[enum.Enum, frozenset[enum.Enum]] = {
    S.PLANNED: frozenset({S.PREPARED, S.FAILED, S.CANCELLED}),
    S.PREPARED: frozenset({S.STREAMING, S.COMMITTING, S.CANCELLED, S.FAILED}),
    S.STREAMING: frozenset({S.COMMITTING, S.CANCELLED, S.FAILED}),
    S.COMMITTING: frozenset({S.COMMITTED, S.CANCELLED, S.FAILED}),
    S.COMMITTED: frozenset(),
    S.CANCELLED: frozenset(),
    S.FAILED: frozenset(),
    T.PREPARING: frozenset({T.RESUMED, T.RELEASED}),
    T.RESUMED: frozenset({T.RELEASED}),
    T.RELEASED: frozenset(),
}
TERMINAL = frozenset(k for k, v in TRANSITIONS.items() if not v)


class IllegalTransition(RuntimeError):
    """A move the table does not allow."""


def check(old: enum.Enum, new: enum.Enum) -> enum.Enum:
    """``new`` if the move ``old -> new`` is in :data:`TRANSITIONS`.

    Raises:
        IllegalTransition: it is not.
    """
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"{old.value} -> {new.value}")
    return new
