"""States of one migration attempt, source and target side, and of a session at one agent,
with their transition tables.

An attempt is one (session, epoch). :data:`TRANSITIONS` lists every allowed move; anything else
is a bug (:class:`IllegalTransition`). :data:`SESSION_TRANSITIONS` does the same for a
session's state at one agent (:class:`pallas_common.schemes.SessionState`, enforced by
:meth:`agent.session.Session.set_state`). tests/agent/migration/test_engine.py walks both tables.

The session rules (``FINISHED`` only with vLLM's ``finish_reason``, every vLLM failure
``FAILED`` and terminal) and the one-holder rules of a commit, Sync and Release (issue 25):
docs/architecture.md §5.
"""

from __future__ import annotations

import enum

from pallas_common.schemes import SessionState


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
    T.RESUMED: frozenset({T.RELEASED}),   # after the first token, or the resume undone
    T.RELEASED: frozenset(),
}
TERMINAL = frozenset(k for k, v in TRANSITIONS.items() if not v)

Q = SessionState
SESSION_TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    # FINISHED from NEW: nothing left to generate (a resume with max_tokens reached)
    Q.NEW: frozenset({Q.SERVING, Q.FINISHED, Q.FAILED}),
    Q.PREPARING: frozenset({Q.RESUMED, Q.FINISHED, Q.FAILED}),
    Q.SERVING: frozenset({Q.MIGRATING, Q.COMMITTING, Q.HANDED_OVER, Q.FINISHED, Q.FAILED}),
    Q.MIGRATING: frozenset({Q.SERVING, Q.COMMITTING, Q.HANDED_OVER, Q.FINISHED, Q.FAILED}),
    # back to SERVING/RESUMED: the commit failed; HANDED_OVER: the target took over
    Q.COMMITTING: frozenset({Q.SERVING, Q.RESUMED, Q.HANDED_OVER, Q.FINISHED, Q.FAILED}),
    Q.RESUMED: frozenset({Q.MIGRATING, Q.COMMITTING, Q.HANDED_OVER, Q.FINISHED, Q.FAILED}),
    Q.FINISHED: frozenset({Q.HANDED_OVER}),   # a finished record handed over to be read there
    Q.HANDED_OVER: frozenset(),
    Q.FAILED: frozenset(),
}
SESSION_TERMINAL = frozenset(k for k, v in SESSION_TRANSITIONS.items() if not v)


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


def check_session(old: SessionState, new: SessionState) -> SessionState:
    """``new`` if a session may move ``old -> new`` (:data:`SESSION_TRANSITIONS`; staying in
    the same state is always allowed).

    Raises:
        IllegalTransition: it may not (e.g. out of ``FAILED``).
    """
    if new != old and new not in SESSION_TRANSITIONS[old]:
        raise IllegalTransition(f"session {old.value} -> {new.value}")
    return new
