"""Recovery schemes: Pallas and the paper's baselines on the same migration machinery.

Every scheme of model.md section 6 (paper section 5, "Baselines" and the ablations) is
expressed as a :class:`SchemeSpec`: what the source does at a Trigger (proactive schemes) and
what it does at the Commit (all schemes). :class:`SchemeRunner` applies a spec through the
migration core (:class:`agent.migration.Migrator`, issue 2) and implements the fallback rule
of model.md section 5/6: a commit to an unprepared or mispredicted target is recovered by
ctHO at the actual target, and by Detour when the target cannot serve the model (admission
refused) or the recovery fails.

| scheme        | at Trigger                                  | at Commit                                   |
| ------------- | ------------------------------------------- | ------------------------------------------- |
| Pallas        | prefix prefill + suffix block stream        | tail + token ids (ship the rest of suffix)  |
| w/o RC        | no prefix: stream every block from block 0  | as Pallas                                   |
| w/o SM        | prefix prefill only, no stream              | token ids; window tokens recomputed         |
| Full-Copy     | nothing                                     | every KV block (split 0)                    |
| Recomputation | nothing                                     | token ids only (split 0, no blocks)         |
| ctHO          | nothing                                     | prefix p* recomputed, blocks >= p* shipped  |
| Detour        | nothing                                     | nothing: the source serves on, the new agent relays |

The ctHO split p* = argmin over block-aligned p of max(p / r_p, (K - p) * s_kv / B)
(model.md section 6) is :func:`ctho_split`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from pallas_proto import pallas_pb2

from agent.obs import MIGRATIONS, get_logger

__all__ = [
    "SchemeSpec",
    "SCHEMES",
    "scheme_value",
    "scheme_name",
    "spec_for",
    "ctho_split",
    "Rates",
    "CommitOutcome",
    "SchemeRunner",
    "MigratorLike",
]

S = pallas_pb2  # enum values live on the module (pallas_pb2.SCHEME_PALLAS, ...)

_log = get_logger("pallas.agent.schemes")


@dataclass(frozen=True)
class SchemeSpec:
    """What one recovery scheme does at Trigger and at Commit.

    Attributes:
        value: the ``pallas.v1.Scheme`` enum value.
        name: CLI/HTTP name (``pallas``, ``full-copy``, ``recomputation``, ``ctho``,
            ``detour``, ``no-rc``, ``no-sm``).
        proactive: works before the handover (Trigger starts preparation).
        stream_suffix: at Trigger, ship each completed suffix KV block as it completes.
        full_transfer: at Trigger, no prefix recompute: the "suffix" starts at block 0.
        commit_ship: blocks shipped at Commit: "suffix" (those after the split not yet
            sent, plus the tail), "all" (every block), "none" (token ids only).
        commit_split: split used at Commit: "keep" (the prepared one), "zero" (no prefix),
            "ctho" (:func:`ctho_split` on the rates at the commit).
        migrates: False only for Detour (the session stays at the source).
    """

    value: int
    name: str
    proactive: bool
    stream_suffix: bool = False
    full_transfer: bool = False
    commit_ship: str = "suffix"
    commit_split: str = "keep"
    migrates: bool = True


SCHEMES: dict[int, SchemeSpec] = {
    s.value: s
    for s in (
        SchemeSpec(S.SCHEME_PALLAS, "pallas", proactive=True, stream_suffix=True),
        SchemeSpec(S.SCHEME_NO_RC, "no-rc", proactive=True, stream_suffix=True, full_transfer=True),
        SchemeSpec(S.SCHEME_NO_SM, "no-sm", proactive=True, stream_suffix=False, commit_ship="none"),
        SchemeSpec(S.SCHEME_FULL_COPY, "full-copy", proactive=False, commit_ship="all", commit_split="zero"),
        SchemeSpec(S.SCHEME_RECOMPUTATION, "recomputation", proactive=False, commit_ship="none", commit_split="zero"),
        SchemeSpec(S.SCHEME_CTHO, "ctho", proactive=False, commit_ship="suffix", commit_split="ctho"),
        SchemeSpec(S.SCHEME_DETOUR, "detour", proactive=False, commit_ship="none", migrates=False),
    )
}
_BY_NAME = {s.name: s.value for s in SCHEMES.values()}
_ALIASES = {"fullcopy": "full-copy", "full_copy": "full-copy", "recompute": "recomputation",
            "no_rc": "no-rc", "norc": "no-rc", "no_sm": "no-sm", "nosm": "no-sm", "ct-ho": "ctho"}


def scheme_value(x: int | str | None, default: int = S.SCHEME_PALLAS) -> int:
    """Normalise a scheme given as enum value, enum name (``SCHEME_CTHO``) or CLI name.

    ``None``, 0 (``SCHEME_UNSPECIFIED``) and "" give ``default``.

    Raises:
        ValueError: unknown scheme.
    """
    if x is None or x == 0 or x == "":
        return default
    if isinstance(x, int):
        if x in SCHEMES:
            return x
        raise ValueError(f"unknown scheme value {x}")
    key = x.strip().lower()
    if key.startswith("scheme_"):
        key = key[len("scheme_"):].replace("_", "-")
    key = _ALIASES.get(key, key)
    if key in _BY_NAME:
        return _BY_NAME[key]
    raise ValueError(f"unknown scheme {x!r}; choose from {sorted(_BY_NAME)}")


def scheme_name(value: int) -> str:
    """CLI name of a scheme value (``"pallas"``, ...); ``"unspecified"`` for 0."""
    spec = SCHEMES.get(value)
    return spec.name if spec else "unspecified"


def spec_for(x: int | str | None, default: int = S.SCHEME_PALLAS) -> SchemeSpec:
    """The :class:`SchemeSpec` of a scheme given in any form accepted by :func:`scheme_value`."""
    return SCHEMES[scheme_value(x, default)]


try:  # the shared timing model (helper C, pallas_common/timing.py) once it is on main
    from pallas_common.timing import ctho_split as _shared_ctho_split
except ImportError:  # pragma: no cover - before the merge
    _shared_ctho_split = None


def ctho_split(k_tokens: int, r_p: float, s_kv: float, goodput: float, block_size: int) -> tuple[int, float]:
    """ctHO's block-aligned prefix/suffix split (model.md section 6, paper ref. 14).

    p* = argmin over p in {0, P, 2P, ..., P*floor(K/P)} of max(p / r_p, (K - p) * s_kv / B):
    the target recomputes the first p tokens by prefill while the source ships the KV of the
    remaining K - p tokens; both run in parallel after the handover. Ties go to the larger p
    (fewer bytes on the link).

    Args:
        k_tokens: K, tokens in the session at the handover.
        r_p: prefill rate at the target, tokens/s (> 0).
        s_kv: KV bytes per token (model.md Eq. 1), bytes (> 0).
        goodput: B, inter-gNB goodput available to the migration, bytes/s (> 0; inf allowed).
        block_size: P, tokens per KV block (> 0).

    Returns:
        (p*, predicted recovery time in seconds, without c_sync).

    Raises:
        ValueError: a non-positive rate, size or block size, or negative K.

    Uses ``pallas_common.timing.ctho_split`` (the shared timing model, also used by the xApp)
    when it is importable; the private grid search below stands in until then (same optimum;
    ties may differ by one block, with the same predicted time).
    """
    if _shared_ctho_split is not None:
        return _shared_ctho_split(k_tokens, block_size, r_p, s_kv, goodput)
    if k_tokens < 0:
        raise ValueError(f"k_tokens must be >= 0, got {k_tokens}")
    if r_p <= 0 or s_kv <= 0 or goodput <= 0 or block_size <= 0:
        raise ValueError(f"rates, s_kv and block_size must be > 0 (r_p={r_p}, s_kv={s_kv}, B={goodput}, P={block_size})")
    p = np.arange(0, k_tokens // block_size + 1, dtype=np.float64) * block_size
    t = np.maximum(p / r_p, (k_tokens - p) * s_kv / goodput)
    best = np.flatnonzero(t == t.min())[-1]
    return int(p[best]), float(t[best])


class MigratorLike(Protocol):
    """The part of :class:`agent.migration.Migrator` (issue 2) the schemes drive."""

    async def trigger(self, session_id: str, epoch: int, target: Any, split_tokens: int = 0, *,
                      stream_suffix: bool = True, proactive: bool = True,
                      recompute_prefix: bool = True, scheme: int = 0) -> Any: ...

    async def cancel(self, session_id: str, epoch: int, reason: str = "") -> Any: ...

    async def commit(self, session_id: str, epoch: int, actual_target: Any, *,
                     split_tokens: int | None = None, ship_blocks: str = "suffix",
                     scheme: int = 0, session_scheme: int = 0) -> Any: ...


@dataclass
class Rates:
    """Rates the ctHO split needs at a commit (SI units; model.md section 2).

    Attributes:
        k_tokens: tokens in the session now (K).
        r_p: target prefill rate, tokens/s.
        s_kv: KV bytes per token.
        goodput: bytes/s to the actual target.
        block_size: tokens per KV block.
    """

    k_tokens: int
    r_p: float
    s_kv: float
    goodput: float
    block_size: int


@dataclass
class _Prepared:
    epoch: int
    target: Any
    scheme: int
    split_tokens: int
    at: float


@dataclass
class CommitOutcome:
    """What :meth:`SchemeRunner.commit` did.

    Attributes:
        status: ``pallas.v1.Status`` value of the final step.
        scheme: the scheme actually used (after any fallback).
        requested: the scheme asked for.
        fallback: True when the prepared path was not used (unprepared/mispredicted target,
            admission refused, or failure).
        split_tokens: the split in force (0 when none).
        message: human-readable account.
        state: the session's migration state afterwards ("committed", "detour", ...).
        reply: the migration core's last reply, if any.
    """

    status: int
    scheme: int
    requested: int
    fallback: bool
    split_tokens: int
    message: str
    state: str
    reply: Any = None


def _status_of(reply: Any) -> int:
    st = getattr(reply, "status", None)
    return int(st) if st is not None else S.STATUS_OK


def _split_of(reply: Any, default: int = 0) -> int:
    v = getattr(reply, "split_tokens", None)
    return int(v) if v else default


def _agent_of(ep: Any) -> str:
    return getattr(ep, "agent_id", "") or getattr(ep, "address", "") or str(ep)


def _same_target(a: Any, b: Any) -> bool:
    """Same peer endpoint: by address when both have one (what the data plane dials), else id."""
    if a is None or b is None:
        return False
    aa, ba = getattr(a, "address", ""), getattr(b, "address", "")
    if aa and ba:
        return aa == ba
    return getattr(a, "agent_id", "") == getattr(b, "agent_id", "")


class SchemeRunner:
    """Applies a recovery scheme to a session through the migration core.

    One per agent. The control service calls :meth:`trigger`, :meth:`cancel` and
    :meth:`commit`; epoch bookkeeping and idempotency live in the control service, this class
    decides what to do and does it once.

    Args:
        migrator: the migration core (:class:`agent.migration.Migrator` or a fake).
        default_scheme: the agent's scheme when neither the call nor the session names one.
        rates: ``rates(session_id, actual_target) -> Rates`` for the ctHO split at a commit.
        detour: ``detour(session_id, target) -> None``: mark the session as served by Detour
            (the source keeps serving it; the new agent relays). Optional.
        carried_scheme: ``carried_scheme(session_id) -> scheme or None``: the scheme a session
            brought from its previous agent (a resumed session's Sync names it). Optional.
    """

    def __init__(
        self,
        migrator: MigratorLike,
        *,
        default_scheme: int | str = S.SCHEME_PALLAS,
        rates: Callable[[str, Any], Rates] | None = None,
        detour: Callable[[str, Any], None] | None = None,
        carried_scheme: Callable[[str], int | str | None] | None = None,
    ) -> None:
        self.migrator = migrator
        self.default_scheme = scheme_value(default_scheme)
        self.rates = rates
        self.detour_hook = detour
        self.carried_scheme = carried_scheme
        self.session_schemes: dict[str, int] = {}
        self._prepared: dict[str, _Prepared] = {}
        self._detoured: dict[str, Any] = {}

    # -- selection
    def set_session_scheme(self, session_id: str, scheme: int | str | None) -> None:
        """Pin a scheme for one session (from the UE front); ``None`` clears it."""
        if scheme in (None, 0, ""):
            self.session_schemes.pop(session_id, None)
        else:
            self.session_schemes[session_id] = scheme_value(scheme)

    def scheme_for(self, session_id: str, requested: int | str | None = None) -> int:
        """Scheme for a call: the call's own, else the session's (pinned here, or carried with
        the session from the agent it came from), else the agent default."""
        if requested not in (None, 0, ""):
            return scheme_value(requested)
        return self.pinned_scheme(session_id) or self.default_scheme

    def pinned_scheme(self, session_id: str) -> int:
        """The scheme pinned for the session (here, or carried from the agent it came from);
        0 (SCHEME_UNSPECIFIED) when none is: what the commit carries to the next agent."""
        if session_id in self.session_schemes:
            return self.session_schemes[session_id]
        if self.carried_scheme is not None:
            try:
                carried = self.carried_scheme(session_id)
                if carried not in (None, 0, ""):
                    return scheme_value(carried)
            except (ValueError, LookupError):
                pass
        return S.SCHEME_UNSPECIFIED

    def prepared(self, session_id: str) -> _Prepared | None:
        """The active preparation of a session, if any."""
        return self._prepared.get(session_id)

    def forget(self, session_id: str) -> None:
        """Drop all bookkeeping for a finished session."""
        self._prepared.pop(session_id, None)
        self._detoured.pop(session_id, None)
        self.session_schemes.pop(session_id, None)

    # -- calls
    async def trigger(self, session_id: str, epoch: int, target: Any, split_tokens: int = 0,
                      scheme: int | str | None = None) -> tuple[Any, int]:
        """Start preparation at ``target`` for a proactive scheme; record it for reactive ones.

        A newer trigger for a session that has an older preparation cancels the old one first
        (model.md section 5: a new target prediction raises the epoch and releases the old
        target's state).

        Returns:
            (the migration core's reply or None, the scheme used).
        """
        value = self.scheme_for(session_id, scheme)
        spec = SCHEMES[value]
        old = self._prepared.get(session_id)
        if old is not None and old.epoch < epoch:
            await self._cancel_prepared(session_id, old, "superseded by epoch %d" % epoch)
        if not spec.proactive:
            # Reactive baselines prepare nothing; remember the prediction for the logs only.
            self._prepared[session_id] = _Prepared(epoch, target, value, 0, time.time())
            MIGRATIONS.labels("source", spec.name, "recorded").inc()
            return None, value
        split = 0 if spec.full_transfer else int(split_tokens)
        reply = await self.migrator.trigger(
            session_id, epoch, target, split, stream_suffix=spec.stream_suffix, proactive=True,
            recompute_prefix=not spec.full_transfer, scheme=value,
        )
        if _status_of(reply) == S.STATUS_OK:
            self._prepared[session_id] = _Prepared(epoch, target, value, _split_of(reply, split), time.time())
            MIGRATIONS.labels("source", spec.name, "triggered").inc()
        else:
            MIGRATIONS.labels("source", spec.name, "rejected").inc()
        return reply, value

    async def cancel(self, session_id: str, epoch: int, reason: str = "") -> Any:
        """Cancel the preparation of ``epoch``: the target releases all it holds for it."""
        prep = self._prepared.get(session_id)
        if prep is not None and prep.epoch <= epoch:
            self._prepared.pop(session_id, None)
            spec = SCHEMES[prep.scheme]
            if not spec.proactive:
                MIGRATIONS.labels("source", spec.name, "cancelled").inc()
                return None
            reply = await self.migrator.cancel(session_id, prep.epoch, reason)
            MIGRATIONS.labels("source", spec.name, "cancelled").inc()
            return reply
        return await self.migrator.cancel(session_id, epoch, reason)

    async def _cancel_prepared(self, session_id: str, prep: _Prepared, reason: str) -> None:
        self._prepared.pop(session_id, None)
        if SCHEMES[prep.scheme].proactive:
            try:
                await self.migrator.cancel(session_id, prep.epoch, reason)
            except Exception as e:  # noqa: BLE001 - a failed release must not block recovery
                _log.warning("cancel_failed", session=session_id, epoch=prep.epoch,
                             peer=_agent_of(prep.target), error=repr(e))

    async def commit(self, session_id: str, epoch: int, actual_target: Any,
                     scheme: int | str | None = None) -> CommitOutcome:
        """Hand the session over to ``actual_target`` with the session's scheme.

        - Proactive scheme prepared at the same target and epoch: the scheme's own commit.
        - Proactive scheme unprepared, prepared for another target or another epoch: the old
          preparation is released and ctHO recovers at the actual target (fallback).
        - Reactive baselines: their own post-handover recovery.
        - Admission refused or recovery failed: Detour (the source keeps serving).
        """
        requested = self.scheme_for(session_id, scheme)
        spec = SCHEMES[requested]
        prep = self._prepared.get(session_id)
        log = _log.bind(session=session_id, epoch=epoch, peer=_agent_of(actual_target))

        if not spec.migrates:
            if prep is not None:
                await self._cancel_prepared(session_id, prep, "detour")
            return self._detour(session_id, actual_target, requested, fallback=False,
                                message="detour: the source serves on, the new agent relays")

        use = spec
        fallback = False
        split: int | None
        if spec.proactive:
            if (prep is not None and prep.epoch == epoch and SCHEMES[prep.scheme].proactive
                    and _same_target(prep.target, actual_target)):
                split = None  # keep the prepared split
            else:
                fallback = True
                use = SCHEMES[S.SCHEME_CTHO]
                why = ("no preparation" if prep is None else
                       "prepared for %s at epoch %d" % (_agent_of(prep.target), prep.epoch))
                log.info("commit_fallback_ctho", reason=why, requested=spec.name)
                if prep is not None and prep.epoch != epoch:
                    await self._cancel_prepared(session_id, prep, "mispredicted")
                split = None
        else:
            split = None
        if use.commit_split == "zero":
            split = 0
        elif use.commit_split == "ctho":
            split = self._ctho(session_id, actual_target)
        ship = use.commit_ship
        try:
            reply = await self.migrator.commit(session_id, epoch, actual_target, split_tokens=split,
                                               ship_blocks=ship, scheme=use.value,
                                               session_scheme=self.pinned_scheme(session_id))
        except Exception as e:  # noqa: BLE001 - the source keeps serving; detour
            log.error("commit_failed", error=repr(e), scheme=use.name)
            MIGRATIONS.labels("source", use.name, "error").inc()
            return self._detour(session_id, actual_target, requested, fallback=True,
                                message=f"{use.name} recovery failed ({e!r}); detour")
        st = _status_of(reply)
        self._prepared.pop(session_id, None)
        if st in (S.STATUS_REJECTED, S.STATUS_ERROR):
            MIGRATIONS.labels("source", use.name, "rejected" if st == S.STATUS_REJECTED else "error").inc()
            msg = getattr(reply, "message", "") or "refused"
            return self._detour(session_id, actual_target, requested, fallback=True,
                                message=f"{use.name} at {_agent_of(actual_target)}: {msg}; detour", reply=reply)
        if st != S.STATUS_OK:
            MIGRATIONS.labels("source", use.name, "error").inc()
            return CommitOutcome(st, use.value, requested, fallback, int(split or 0),
                                 getattr(reply, "message", ""), getattr(reply, "state", "") or "serving", reply)
        # The migration core may itself have fallen back (e.g. a prepared prefix was evicted).
        core_scheme = int(getattr(reply, "scheme", 0) or 0)
        if core_scheme and core_scheme != use.value and core_scheme in SCHEMES:
            fallback = True
            use = SCHEMES[core_scheme]
        MIGRATIONS.labels("source", use.name, "fallback" if fallback else "committed").inc()
        used_split = _split_of(reply, int(split or (prep.split_tokens if prep else 0)))
        msg = f"committed with {use.name}" + (f" (fallback from {spec.name})" if fallback else "")
        if getattr(reply, "message", ""):
            msg += f": {reply.message}"
        log.info("committed", scheme=use.name, fallback=fallback, split=used_split)
        return CommitOutcome(S.STATUS_OK, use.value, requested, fallback, used_split, msg,
                             getattr(reply, "state", "") or "committed", reply)

    def _ctho(self, session_id: str, target: Any) -> int | None:
        """ctHO split from :attr:`rates`; None (the migration core decides) without rates."""
        if self.rates is None:
            return None
        try:
            r = self.rates(session_id, target)
            p, _ = ctho_split(r.k_tokens, r.r_p, r.s_kv, r.goodput, r.block_size)
            return p
        except Exception as e:  # noqa: BLE001 - no rates: let the migration core choose
            _log.warning("ctho_rates_unavailable", session=session_id, error=repr(e))
            return None

    def _detour(self, session_id: str, target: Any, requested: int, *, fallback: bool,
                message: str, reply: Any = None) -> CommitOutcome:
        self._detoured[session_id] = target
        if self.detour_hook is not None:
            self.detour_hook(session_id, target)
        MIGRATIONS.labels("source", "detour", "fallback" if fallback else "committed").inc()
        return CommitOutcome(S.STATUS_OK, S.SCHEME_DETOUR, requested, fallback, 0, message, "detour", reply)

    def detoured(self, session_id: str) -> Any | None:
        """The agent relaying a detoured session, if the session is under Detour."""
        return self._detoured.get(session_id)
