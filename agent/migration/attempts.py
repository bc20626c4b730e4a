"""The attempts of a migration, as the source and the target each hold them (paper section 4.3;
docs/architecture.md §5).

:class:`Outbound` is the source's record of one attempt (one session, one epoch, one target),
:class:`Inbound` the target's, and :class:`Attempts` the source's table of them per session and
target. They sit below :mod:`agent.migration.context` (whose :class:`~agent.migration.context.
Context` holds them) and the two roles (:mod:`agent.migration.source`,
:mod:`agent.migration.target`), so that the context names their types without an import circle.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from pallas_proto import pallas_pb2

from agent.ipc import LocalBlock
from agent.session import Session
from agent.states import SourceState, TargetState, check
from agent.transfer import BlockStream, PeerClient

__all__ = ["Attempts", "Inbound", "Outbound"]


@dataclasses.dataclass(eq=False)
class Outbound:
    """Source-side state of one attempt (one session, one epoch)."""

    session: Session
    epoch: int
    target: pallas_pb2.PeerEndpoint
    client: PeerClient
    split: int
    first_block: int
    scheme: int
    proactive: bool
    stream_suffix: bool
    state: SourceState = SourceState.PLANNED
    stream: BlockStream | None = None
    full: set[int] = dataclasses.field(default_factory=set)
    tail: LocalBlock | None = None
    error: str = ""
    changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    t_prepared: float = 0.0
    ready: bool = False  # a bridge saw the target hold the state (no commit-time choice left)
    rank: int = 0        # the target's rank among the UE's candidates (0 = the most likely)
    lease_s: float = 0.0  # the target's lease (0: none, nothing to renew)
    renew_now: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def prepared_for(self, epoch: int, target_address: str) -> bool:
        """Whether this attempt is the one prepared for a commit of ``epoch`` at the agent at
        ``target_address``: proactive (a Trigger's, not a commit's own reactive attempt), still
        live, of that epoch, at that target. The one home of this rule: the commit's choice of
        scheme (``plan.commit_scheme``'s ``prepared``), the bridge and the commit's attempt
        all ask it."""
        return self.proactive and self.live and self.epoch == epoch and self.target.address == target_address

    def to(self, new: SourceState) -> None:
        """Move to ``new`` (raises :class:`agent.states.IllegalTransition`)."""
        self.state = check(self.state, new)

    @property
    def live(self) -> bool:
        """Prepared or streaming: usable by a commit."""
        return self.state in (SourceState.PREPARED, SourceState.STREAMING)

    def note(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def run_end(self, limit: int | None = None) -> int:
        """The first block index from ``first_block`` on not yet copied out (at most ``limit``)."""
        j = self.first_block
        while j in self.full and (limit is None or j < limit):
            j += 1
        return j


@dataclasses.dataclass(eq=False)
class Inbound:
    """Target-side state of one incoming attempt (one session, one epoch)."""

    session_id: str
    epoch: int
    source: pallas_pb2.PeerEndpoint
    prefix_len: int
    scheme: int
    ue_id: str
    reserved_bytes: int
    rank: int = 0
    warmup: asyncio.Task | None = None
    computed: int = -1    # tokens the warm-up computed (-1: not finished)
    leased: bool = False  # the lease is held (granted, not yet ended)
    t_warmup: float = 0.0
    blocks_in: int = 0
    bytes_in: int = 0
    blocks_rejected: int = 0
    indices: set[int] = dataclasses.field(default_factory=set)
    touched: float = dataclasses.field(default_factory=time.monotonic)
    state: TargetState = TargetState.PREPARING

    def to(self, new: TargetState) -> None:
        """Move to ``new`` (raises :class:`agent.states.IllegalTransition`)."""
        self.state = check(self.state, new)


class Attempts:
    """The source's attempts, per session and target (issue 45: one session prepared at up to
    K targets of one epoch; docs/architecture.md §5).

    Each attempt (an :class:`Outbound`) is keyed by (session id, its
    target's address); a session has at most one attempt per target. The dict-like reads keep
    the single-target view the rest of the agent had: ``get(sid)`` / ``[sid]`` the session's
    newest attempt, ``in`` whether it has any; ``len``, ``values()`` and ``items()`` count and
    list every attempt (``items()``: (session id, attempt) pairs).
    """

    def __init__(self) -> None:
        self._by_sid: dict[str, dict[str, Outbound]] = {}

    def of(self, sid: str) -> list[Outbound]:
        """Every attempt of ``sid``, oldest first (empty when none)."""
        return list(self._by_sid.get(sid, {}).values())

    def at(self, sid: str, address: str) -> Outbound | None:
        """The attempt of ``sid`` at the target at ``address``, or None."""
        return self._by_sid.get(sid, {}).get(address)

    def put(self, out: Outbound) -> None:
        """Add ``out`` (replacing an attempt of the same session at the same target)."""
        d = self._by_sid.setdefault(out.session.session_id, {})
        d.pop(out.target.address, None)
        d[out.target.address] = out

    def discard(self, out: Outbound) -> bool:
        """Remove ``out`` if it is the one held for its session and target; returns whether."""
        sid, addr = out.session.session_id, out.target.address
        d = self._by_sid.get(sid)
        if d is None or d.get(addr) is not out:
            return False
        del d[addr]
        if not d:
            del self._by_sid[sid]
        return True

    def get(self, sid: str, default: Outbound | None = None) -> Outbound | None:
        """The newest attempt of ``sid`` (the last one put), or ``default``."""
        d = self._by_sid.get(sid)
        return next(reversed(d.values())) if d else default

    def __getitem__(self, sid: str) -> Outbound:
        out = self.get(sid)
        if out is None:
            raise KeyError(sid)
        return out

    def pop(self, sid: str, default: Outbound | None = None) -> Outbound | None:
        """Remove every attempt of ``sid``; returns the newest, or ``default``."""
        d = self._by_sid.pop(sid, None)
        return next(reversed(d.values())) if d else default

    def __contains__(self, sid: object) -> bool:
        return sid in self._by_sid

    def __len__(self) -> int:
        return sum(len(d) for d in self._by_sid.values())

    def values(self) -> list[Outbound]:
        """Every attempt."""
        return [o for d in self._by_sid.values() for o in d.values()]

    def items(self) -> list[tuple[str, Outbound]]:
        """(session id, attempt) for every attempt."""
        return [(sid, o) for sid, d in self._by_sid.items() for o in d.values()]

    def clear(self) -> None:
        self._by_sid.clear()
