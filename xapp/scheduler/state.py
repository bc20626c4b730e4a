"""The per-session migration state machine (paper §4.2-§4.4; docs/model.md §5).

One :class:`SessionMigration` per LLM session. It does no I/O: each event returns the actions
(:class:`TriggerAction`, :class:`CancelAction`, :class:`CommitAction`) that the xApp's
composition root turns into Control calls (``to_proto``) on the agents.

States (:class:`MigrationState`):

- ``IDLE``: no handover predicted for the session (or the prediction was withdrawn).
- ``PLANNED``: a target agent and t_HO are predicted; the engine re-decides every cycle and
  the session defers until the trigger rule fires (Eq. 9).
- ``PREPARING``: triggered at migration epoch ``epoch``; the target prefills the prefix and
  receives the suffix stream.
- ``COMMITTED``: the handover went to the prepared target and the commit was sent; the target
  agent is now the session's source, so a later handover chains from it.
- ``CANCELLED``: a triggered attempt was cancelled (prediction withdrawn, trigger refused,
  session ended) and no new plan exists.
- ``FALLBACK``: the handover found no usable preparation (none made, target mispredicted or
  infeasible); the actual target recovers reactively (``fallback`` scheme, ctHO by default)
  if it can serve the model, else Detour (the source keeps decoding, the new agent relays).

Epochs: ``epoch`` is the epoch of the attempt being planned or prepared. Every cancel carries
the cancelled attempt's epoch and moves the session to the next one, so an agent that has
seen epoch n+1 drops every later message of epoch n (docs/model.md §5). Commits carry the
prepared epoch (or, for a fallback, a fresh one). Fresh epochs come from the ``epochs``
callable (the xApp passes ``xapp.store.XappStore.allocate_epoch``, so an epoch is never
reissued across restarts: issue 16); a fresh epoch is always above the current one.

Several targets (issue 45; docs/model.md §4.1): while PREPARING, further targets may be
prepared under the same epoch (:meth:`SessionMigration.trigger_extra`, a TriggerAction with
``rank`` > 0); :attr:`SessionMigration.prepared` names every target prepared under the epoch
(the primary, ``target``, and the extras). A handover to any of them is a prepared commit
naming it (the source's agent releases the other attempts); a cancel (new target not prepared,
withdrawal, refusal of the primary, session end) ends every attempt of the epoch (its
CancelRequest names no target). A refused extra is dropped alone (its agent kept nothing); an
extra that leaves the target choice while the primary holds is dropped alone by a targeted
Cancel (:meth:`SessionMigration.drop_extra`, ``CancelRequest.target``): the epoch stays, and
the dropped target joins :attr:`SessionMigration.declined` (the agents refuse to prepare it
again under the epoch).
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import asdict, dataclass, field
from typing import Callable, ClassVar, Union

import structlog

from pallas_common.schemes import PROACTIVE, SCHEMES
from pallas_proto import pallas_pb2

__all__ = [
    "MigrationState",
    "DecidedRates",
    "PreparedTarget",
    "TriggerAction",
    "CancelAction",
    "CommitAction",
    "Action",
    "InvalidTransition",
    "SessionMigration",
]

log = structlog.get_logger(__name__)

class MigrationState(str, enum.Enum):
    """A session's migration state (module docstring)."""

    IDLE = "idle"
    PLANNED = "planned"
    PREPARING = "preparing"
    COMMITTED = "committed"
    CANCELLED = "cancelled"
    FALLBACK = "fallback"


@dataclass(frozen=True)
class DecidedRates:
    """The estimates a decision was made with (docs/model.md §2), carried by its action so that
    what is logged is what the Scheduler Engine used: ``r_p`` the target's prefill rate and
    ``r_d`` the session's decode rate (tokens/s), ``bandwidth`` the source-to-target block
    goodput (bytes/s), ``s_kv`` KV bytes per token, ``block_size`` tokens per KV block. None:
    not known (an action built by hand)."""

    r_p: float | None = None
    r_d: float | None = None
    bandwidth: float | None = None
    s_kv: int | None = None
    block_size: int | None = None

    def fields(self) -> dict[str, float | int | None]:
        """{name: value}, the names the event log writes them under."""
        return asdict(self)


@dataclass(frozen=True)
class PreparedTarget:
    """One target prepared under a session's current epoch: its agent ``target``, its
    ``rank`` among the UE's candidates as sent in the Trigger (0 = the most likely) and the
    ``scheme`` it was prepared with (the session's proactive scheme, or ``SCHEME_NO_SM`` for a
    prefix-only preparation: docs/model.md §4.1, ``Level.PREFIX``), which its commit names."""

    target: str
    rank: int
    scheme: int


@dataclass(frozen=True)
class TriggerAction:
    """Start preparing ``session_id`` at ``target`` (send to the source agent's Control.Trigger).

    ``split_tokens`` 0 lets the source record its own block-aligned split at the trigger
    (paper §4.2); ``predicted_split_tokens`` is the L_hist the decision expected (Eq. 4), for
    logs. ``window_s`` is T_w*; ``predicted_handover_time`` t_HO_hat (s, Unix time).
    ``predicted_sit_s`` / ``predicted_early_s``: the model's T_SIT and T_early at T_w*
    (Eqs. 6-7) when the engine decided, for metrics; None if not given. ``rates``: the
    estimates of that decision (:class:`DecidedRates`). ``rank``: the target's rank among the
    UE's candidates (0 = the most likely; ``TriggerRequest.rank``); a Trigger of rank > 0 adds
    a target to the epoch's attempts (issue 45).
    """

    #: the agents' Control RPC an action of this kind is sent as (to ``source``), and the
    #: field naming the agent whose PeerTransfer address the request carries (None: none)
    rpc: ClassVar[str] = "Trigger"
    peer_field: ClassVar[str | None] = "target"

    session_id: str
    epoch: int
    source: str
    target: str
    predicted_handover_time: float
    window_s: float
    predicted_split_tokens: int
    scheme: int = pallas_pb2.SCHEME_PALLAS
    split_tokens: int = 0
    predicted_sit_s: float | None = None
    predicted_early_s: float | None = None
    rates: DecidedRates = field(default=DecidedRates(), compare=False)   # what was decided, not which order
    rank: int = 0

    def to_proto(self, target_peer_address: str) -> pallas_pb2.TriggerRequest:
        """The TriggerRequest; ``target_peer_address`` is the target's PeerTransfer host:port."""
        return pallas_pb2.TriggerRequest(
            session_id=self.session_id, epoch=self.epoch,
            target=pallas_pb2.PeerEndpoint(agent_id=self.target, address=target_peer_address),
            split_tokens=self.split_tokens, predicted_handover_time=self.predicted_handover_time,
            scheme=self.scheme, window_s=self.window_s, rank=self.rank)


@dataclass(frozen=True)
class CancelAction:
    """Cancel attempt ``epoch`` of ``session_id`` at ``target``.

    Send to the source agent's Control.Cancel (it stops the stream and has the target release
    what it holds); sending it to the target's Control.Cancel as well is harmless (idempotent)
    and releases the target even if the source is unreachable. The source never stops serving.
    ``only_target``: the request names ``target`` (``CancelRequest.target``): that target's
    attempt alone ends and the epoch goes on at the others (issue 45); otherwise it names no
    target and every target's attempt of the epoch ends.
    """

    rpc: ClassVar[str] = "Cancel"

    session_id: str
    epoch: int
    source: str
    target: str
    reason: str
    only_target: bool = False

    @property
    def peer_field(self) -> str | None:
        """The field naming the agent whose PeerTransfer address the request carries: the
        target's for a targeted Cancel, else none."""
        return "target" if self.only_target else None

    def to_proto(self, target_peer_address: str = "") -> pallas_pb2.CancelRequest:
        """The CancelRequest; a targeted one names ``target`` at ``target_peer_address`` (its
        PeerTransfer host:port, by which the source's agent finds the attempt)."""
        req = pallas_pb2.CancelRequest(session_id=self.session_id, epoch=self.epoch,
                                       reason=self.reason)
        if self.only_target:
            req.target.CopyFrom(pallas_pb2.PeerEndpoint(agent_id=self.target,
                                                        address=target_peer_address))
        return req


@dataclass(frozen=True)
class CommitAction:
    """The handover happened: finish (or reactively run) the migration of ``session_id``.

    Send to ``source``'s Control.Commit. ``prepared_target`` is the agent prepared under
    ``epoch`` (None for a fallback without preparation); ``scheme`` how ``actual_target``
    recovers (the proactive scheme when it was prepared, else the fallback or Detour).
    ``rates``: the estimates when the engine decided the commit (:class:`DecidedRates`).
    """

    rpc: ClassVar[str] = "Commit"
    peer_field: ClassVar[str | None] = "actual_target"

    session_id: str
    epoch: int
    source: str
    actual_target: str
    prepared_target: str | None
    scheme: int
    handover_time: float
    rates: DecidedRates = field(default=DecidedRates(), compare=False)   # what was decided, not which order

    def to_proto(self, actual_target_peer_address: str) -> pallas_pb2.CommitRequest:
        """The CommitRequest; the address is the actual target's PeerTransfer host:port."""
        return pallas_pb2.CommitRequest(
            session_id=self.session_id, epoch=self.epoch,
            actual_target=pallas_pb2.PeerEndpoint(agent_id=self.actual_target,
                                                  address=actual_target_peer_address),
            scheme=self.scheme, handover_time=self.handover_time)


Action = Union[TriggerAction, CancelAction, CommitAction]


class InvalidTransition(RuntimeError):
    """An event that the current state does not allow (a bug in the caller)."""


class SessionMigration:
    """The migration state machine of one session (module docstring).

    ``source``: the agent serving the session now. ``scheme``: the proactive scheme
    (Pallas or an ablation); ``fallback``: the reactive scheme for an unprepared target that
    can serve the model (ctHO by default; docs/model.md §6). ``epochs(session_id)``: a
    fresh epoch for the session, larger than every one it returned before (default: a counter
    of this machine, 1, 2, 3, ...; the xApp gives ``XappStore.allocate_epoch``). The first
    attempt's epoch is drawn at construction; each later one is ``max(epochs(), epoch + 1)``,
    so an epoch moved up from an agent's report is never undercut.
    """

    def __init__(self, session_id: str, source: str, *, ue_id: str = "",
                 scheme: int = pallas_pb2.SCHEME_PALLAS,
                 fallback: int = pallas_pb2.SCHEME_CTHO,
                 on_transition: Callable[["SessionMigration", MigrationState], None] | None = None,
                 epochs: Callable[[str], int] | None = None) -> None:
        if scheme not in PROACTIVE:
            raise ValueError(f"scheme {scheme} does not prepare before the handover")
        self.session_id, self.ue_id, self.source = session_id, ue_id, source
        self.scheme, self.fallback = scheme, fallback
        self.state = MigrationState.IDLE
        if epochs is None:
            counter = itertools.count(1)
            epochs = lambda _session: next(counter)  # noqa: E731
        self._epochs = epochs
        self.epoch = int(epochs(session_id))
        self.target: str | None = None          # planned or prepared target agent
        self.t_ho: float | None = None           # predicted handover time, s
        self.window_s: float | None = None       # T_w* at the trigger
        self.trigger_time: float | None = None
        self.relay_hops = 0                      # Detour hops between the source and the UE
        self.last_reason = ""
        # every target prepared under ``epoch`` (the primary and the extras), while PREPARING
        self.prepared: dict[str, PreparedTarget] = {}
        # extra targets whose agents refused the epoch's Trigger: not asked again this epoch
        self.declined: set[str] = set()
        self._on_transition = on_transition

    def __repr__(self) -> str:
        return (f"SessionMigration({self.session_id!r}, state={self.state.value}, "
                f"epoch={self.epoch}, source={self.source!r}, target={self.target!r})")

    def _to(self, state: MigrationState, reason: str) -> None:
        old = self.state
        self.state, self.last_reason = state, reason
        log.debug("migration_transition", session=self.session_id, old=old.value,
                  new=state.value, epoch=self.epoch, source=self.source, target=self.target,
                  reason=reason)
        if self._on_transition is not None:
            self._on_transition(self, old)

    def _next_epoch(self) -> None:
        self.epoch = max(int(self._epochs(self.session_id)), self.epoch + 1)

    def _cancel(self, reason: str) -> CancelAction:
        assert self.target is not None
        act = CancelAction(self.session_id, self.epoch, self.source, self.target, reason)
        self._next_epoch()
        self.prepared, self.declined = {}, set()  # the Cancel ends every attempt of the epoch
        return act

    @property
    def extras(self) -> dict[str, PreparedTarget]:
        """The targets prepared under the epoch besides the primary (``target``)."""
        return {t: p for t, p in self.prepared.items() if t != self.target}

    # -- events -------------------------------------------------------------------------------
    def predict(self, target: str | None, t_ho: float | None) -> list[Action]:
        """A new (target agent, t_HO) prediction; ``target`` None withdraws it.

        Before the trigger this only replans. After it, the same target just updates t_HO
        (earlier: unfinished work lands in the SIT; later: the source keeps streaming), while
        a different target cancels the attempt (epoch + 1) and replans for the new one; a
        withdrawn prediction cancels it. A different target already prepared under the epoch
        (an extra, :meth:`trigger_extra`) becomes the primary without a cancel. A target equal
        to the source (a handover between cells of the same agent) needs no migration and
        counts as no prediction.
        """
        if target == self.source:
            target = None
        if self.state is MigrationState.PREPARING:
            if target == self.target or (target is not None and target in self.prepared):
                self.target, self.t_ho = target, t_ho
                return []
            reason = "target changed" if target is not None else "prediction withdrawn"
            act = self._cancel(reason)
            if target is None:
                self.target, self.t_ho = None, None
                self._to(MigrationState.CANCELLED, reason)
            else:
                self.target, self.t_ho = target, t_ho
                self._to(MigrationState.PLANNED, reason)
            return [act]
        if target is None:
            if self.state is MigrationState.PLANNED:
                self.target, self.t_ho = None, None
                self._to(MigrationState.IDLE, "prediction withdrawn")
            return []
        changed = self.state is not MigrationState.PLANNED or self.target != target
        self.target, self.t_ho = target, t_ho
        if changed:
            self._to(MigrationState.PLANNED, "new prediction")
        return []

    def trigger(self, now: float, window_s: float, predicted_split_tokens: int, *,
                predicted_sit_s: float | None = None,
                predicted_early_s: float | None = None, rates: DecidedRates = DecidedRates()) -> TriggerAction:
        """The trigger rule fired and admission passed: start preparing (PLANNED -> PREPARING).
        ``rates``: the estimates the rule fired with, carried by the action."""
        if self.state is not MigrationState.PLANNED or self.target is None or self.t_ho is None:
            raise InvalidTransition(f"trigger in state {self.state.value}")
        self.window_s, self.trigger_time = window_s, now
        act = TriggerAction(self.session_id, self.epoch, self.source, self.target, self.t_ho,
                            window_s, int(predicted_split_tokens), self.scheme,
                            predicted_sit_s=predicted_sit_s, predicted_early_s=predicted_early_s,
                            rates=rates)
        self.prepared, self.declined = {self.target: PreparedTarget(self.target, 0, self.scheme)}, set()
        self._to(MigrationState.PREPARING, "trigger")
        return act

    def trigger_extra(self, target: str, rank: int, window_s: float, predicted_split_tokens: int, *,
                      scheme: int | None = None, predicted_sit_s: float | None = None,
                      rates: DecidedRates = DecidedRates()) -> TriggerAction:
        """Prepare one more target under the current epoch (issue 45; docs/model.md §4.1): a
        TriggerAction of the same epoch naming ``target`` with ``rank`` (its rank among the
        UE's candidates, >= 1), window ``window_s`` (T_w* for that target, s) and prefix
        ``predicted_split_tokens``. ``scheme``: how it is prepared (None: the session's
        proactive scheme; ``SCHEME_NO_SM``: the prefix only). The state stays PREPARING.

        Raises InvalidTransition outside PREPARING, and ValueError for the source, a target
        already prepared under the epoch, or a rank below 1.
        """
        if self.state is not MigrationState.PREPARING or self.t_ho is None:
            raise InvalidTransition(f"extra trigger in state {self.state.value}")
        if target == self.source or target in self.prepared:
            raise ValueError(f"session {self.session_id}: {target!r} is the source or already prepared")
        if int(rank) < 1:
            raise ValueError(f"an extra target's rank must be >= 1, got {rank!r}")
        scheme = self.scheme if scheme is None else int(scheme)
        self.prepared[target] = PreparedTarget(target, int(rank), scheme)
        log.debug("migration_extra_target", session=self.session_id, epoch=self.epoch,
                  target=target, rank=int(rank), scheme=scheme)
        return TriggerAction(self.session_id, self.epoch, self.source, target, self.t_ho,
                             window_s, int(predicted_split_tokens), scheme,
                             predicted_sit_s=predicted_sit_s, rates=rates, rank=int(rank))

    def refused(self, epoch: int, reason: str, target: str | None = None) -> list[Action]:
        """The agents refused or failed trigger ``epoch`` (a ControlReply other than OK) at
        ``target`` (None: the primary).

        A stale epoch is ignored. An extra target's refusal drops that target alone (the
        source's agent discarded its attempt; the others go on) and records it in
        :attr:`declined`, so the epoch does not ask it again. Otherwise the attempt is
        cancelled (releasing whatever was set up, at every target) and the session waits in
        CANCELLED; the handover then takes the fallback unless a new prediction replans.
        """
        if self.state is not MigrationState.PREPARING or epoch != self.epoch:
            return []
        if target is not None and target != self.target:
            if self.prepared.pop(target, None) is not None:
                self.declined.add(target)
            return []
        act = self._cancel(f"trigger refused: {reason}")
        self._to(MigrationState.CANCELLED, act.reason)
        return [act]

    def drop_extra(self, target: str, reason: str) -> CancelAction:
        """Withdraw the extra target ``target`` alone (it left the target choice while the
        primary holds): a targeted CancelAction of the current epoch; ``target`` leaves
        :attr:`prepared` and joins :attr:`declined` (not prepared again under the epoch: the
        agents refuse it, docs/model.md §5). The epoch and the state stay.

        Raises InvalidTransition outside PREPARING, and ValueError for the primary or a target
        not prepared under the epoch.
        """
        if self.state is not MigrationState.PREPARING:
            raise InvalidTransition(f"drop of an extra target in state {self.state.value}")
        if target == self.target or target not in self.prepared:
            raise ValueError(f"session {self.session_id}: {target!r} is not an extra target")
        del self.prepared[target]
        self.declined.add(target)
        log.debug("migration_extra_dropped", session=self.session_id, epoch=self.epoch,
                  target=target, reason=reason)
        return CancelAction(self.session_id, self.epoch, self.source, target, reason,
                            only_target=True)

    def handover(self, actual_target: str, now: float, target_can_serve: bool,
                 rates: DecidedRates = DecidedRates()) -> list[Action]:
        """E2 shows the UE served by ``actual_target``'s cell: commit or fall back.

        Prepared at ``actual_target`` (the primary or an extra target of the epoch): commit with
        the scheme it was prepared with (COMMITTED); the source's agent releases the epoch's
        other targets. Prepared elsewhere only: cancel the attempts, then commit a fallback at
        the actual target. Not
        prepared: commit a fallback. The fallback is ``self.fallback`` if
        ``target_can_serve`` (compatible model and memory), else Detour (FALLBACK); a bridging
        scheme (``pallas-bridge``) is its own fallback there: the source decodes on through the
        new agent's front while that agent is prepared from scratch (docs/model.md §8). After a
        migration the actual target is the new source; after Detour the source stays and one
        relay hop is added. A handover to the source agent itself needs nothing (and ends a
        Detour relay). ``rates``: the estimates at the decision, carried by the commit.
        """
        if actual_target == self.source:
            self.relay_hops = 0                  # back at the agent that decodes: no relay
            return []
        actions: list[Action] = []
        if self.state is MigrationState.PREPARING and actual_target in self.prepared:
            actions.append(CommitAction(self.session_id, self.epoch, self.source, actual_target,
                                        actual_target, self.prepared[actual_target].scheme, now, rates))
            self._next_epoch()
            self._rebind(actual_target, detour=False)
            self._to(MigrationState.COMMITTED, "handover to the prepared target")
            return actions
        if self.state is MigrationState.PREPARING:
            actions.append(self._cancel("mispredicted target"))
            reason = f"mispredicted target (prepared {self.target})"
        else:
            reason = f"handover in state {self.state.value}"
        scheme = self.fallback if target_can_serve else pallas_pb2.SCHEME_DETOUR
        if target_can_serve and SCHEMES[self.scheme].bridge:
            scheme = self.scheme
        actions.append(CommitAction(self.session_id, self.epoch, self.source, actual_target,
                                    None, scheme, now, rates))
        self._next_epoch()
        self._rebind(actual_target, detour=scheme == pallas_pb2.SCHEME_DETOUR)
        self._to(MigrationState.FALLBACK, reason)
        return actions

    def withdraw(self, reason: str) -> list[Action]:
        """Abandon a running attempt because preparing is no longer wanted (an A1 or descriptor
        rule now forbids it, or the scheme no longer prepares): PREPARING -> CANCELLED with a
        cancel (epoch + 1); nothing in any other state. A later prediction replans."""
        if self.state is not MigrationState.PREPARING:
            return []
        act = self._cancel(reason)
        self.target, self.t_ho = None, None
        self._to(MigrationState.CANCELLED, reason)
        return [act]

    def end(self, reason: str = "session ended") -> list[Action]:
        """The session finished or left: cancel a running attempt; the machine goes IDLE."""
        actions: list[Action] = []
        if self.state is MigrationState.PREPARING:
            actions.append(self._cancel(reason))
        self.target, self.t_ho = None, None
        if self.state is not MigrationState.IDLE:
            self._to(MigrationState.IDLE, reason)
        return actions

    def _rebind(self, actual_target: str, detour: bool) -> None:
        if detour:
            self.relay_hops += 1
        else:
            self.source, self.relay_hops = actual_target, 0
        self.target, self.t_ho, self.window_s, self.trigger_time = None, None, None, None
        self.prepared, self.declined = {}, set()
