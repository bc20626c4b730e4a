"""The migration engine: one per agent, source and target of every scheme (paper section 4.3,
docs/model.md §5-8).

The Control service (xApp) calls :meth:`MigrationEngine.trigger`, :meth:`~MigrationEngine.cancel`
and :meth:`~MigrationEngine.commit`; the PeerTransfer service calls the target role
(:attr:`MigrationEngine.target`). The engine carries out the scheme the call names (or the
session's pinned one, or the agent default; :data:`pallas_common.schemes.SCHEMES`), what each
call does per scheme: docs/architecture.md §5. It owns the shared state
(:class:`agent.migration.context.Context`) and composes the source role
(:class:`agent.migration.source.Source`) and the target role
(:class:`agent.migration.target.Target`) over it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog
from pallas_proto import pallas_pb2

from agent.ipc import BlockHub
from agent.migration.context import Context, Ledger, MigrationConfig
from agent.migration.source import Source
from agent.states import SourceState
from agent.migration.target import Target
from agent.obs import MIGRATIONS
from agent.session import Session, SessionState, SessionStore, VllmClient
from agent.transfer import PeerPool
from pallas_common.schemes import SCHEMES, SchemeSpec, scheme_name, scheme_value

log = structlog.get_logger("pallas.agent.migration")
S = pallas_pb2


class MigrationEngine:
    """Runs migrations of this agent's sessions (source) and accepts them (target).

    The arguments are the :class:`Context` attributes of the same name (``config``: its
    ``cfg``; ``peers``: default a new pool). Attributes: ``ctx`` (the state the roles share),
    ``source`` (:class:`Source`) and ``target`` (:class:`Target`, the PeerTransfer handler).
    """

    def __init__(self, *, agent_id: str, peer_address: str, sessions: SessionStore,
                 vllm_client: VllmClient, hub: BlockHub,
                 identity: Callable[[], pallas_pb2.ModelIdentity],
                 config: MigrationConfig | None = None, peers: PeerPool | None = None) -> None:
        cfg = config or MigrationConfig()
        self.ctx = Context(agent_id=agent_id, peer_address=peer_address, sessions=sessions,
                           vllm_client=vllm_client, hub=hub, identity=identity, cfg=cfg,
                           peers=peers or PeerPool(link_rate_mbps=cfg.link_rate_mbps,
                                                   timeout_s=cfg.rpc_timeout_s),
                           ledger=Ledger(cfg.max_ledger))
        self.source = Source(self.ctx)
        self.target = Target(self.ctx)
        self.session_schemes: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        hub.on_block = self.source.on_local_block
        hub.on_claim = self.target.on_claim
        hub.on_loaded = self.target.on_loaded
        if hasattr(vllm_client, "on_failed"):
            vllm_client.on_failed = self.session_failed

    def set_session_scheme(self, session_id: str, scheme: int | str | None) -> None:
        """Pin a scheme for one session (from the UE front); ``None`` clears it."""
        if scheme in (None, 0, ""):
            self.session_schemes.pop(session_id, None)
        else:
            self.session_schemes[session_id] = scheme_value(scheme)

    def pinned_scheme(self, session_id: str) -> int:
        """The scheme pinned here or carried from the previous agent; 0 when none."""
        if session_id in self.session_schemes:
            return self.session_schemes[session_id]
        s = self.ctx.sessions.get(session_id)
        return s.scheme if s is not None else 0

    def scheme_for(self, session_id: str, requested: int | str | None = None) -> int:
        """The call's scheme, else the session's, else the agent default."""
        if requested not in (None, 0, ""):
            return scheme_value(requested)
        return self.pinned_scheme(session_id) or self.ctx.cfg.default_scheme

    def failed_reply(self, s: Session, epoch: int, scheme: int = 0) -> pallas_pb2.ControlReply:
        """The non-OK reply to a Control call about a session that failed here: STATUS_ERROR
        naming the failure (:attr:`Session.error`)."""
        return self.ctx.reply(S.STATUS_ERROR, s, epoch, scheme=scheme,
                              message=f"session failed at agent {self.ctx.agent_id}: "
                                      f"{s.error or 'no reason recorded'}")

    def session_failed(self, s: Session) -> None:
        """A session's request failed here (:attr:`agent.session.VllmClient.on_failed`): abandon its
        outbound attempts (every target) at once, so each target frees what it holds (nothing
        is left to migrate: a failed session is terminal). A commit in flight keeps its own."""
        for out in self.ctx.outbound.of(s.session_id):
            if out.state not in (SourceState.COMMITTING,):
                MIGRATIONS.labels("source", scheme_name(out.scheme), "failed").inc()
                self.ctx.spawn(self.source.abandon(out, f"the session failed at the source: {s.error}"),
                               f"abandon-failed-{s.session_id}-{out.target.address}")

    def forget(self, session_id: str) -> None:
        """Drop every record of a session that ended here. An attempt still prepared for it (a
        Trigger that no Commit or Cancel followed before the session ended) is abandoned: its
        stream, the connector's export and the target's hold end (found by ``soak.py --faults``:
        they stayed for ever once the session was forgotten, and a late Commit was answered
        UNKNOWN_SESSION). Only a live attempt (prepared or streaming) is: one that a Trigger is
        still preparing or a Commit is carrying out belongs to that call, which ends it either way
        (abandoning it under a commit made the commit fail after the target had resumed, found by
        the same soak). Every target's attempt of the session is."""
        for out in self.ctx.outbound.of(session_id):
            if out.live:
                self.ctx.spawn(self.source.abandon(out, "the session ended here"),
                               f"abandon-ended-{session_id}-{out.target.address}")
        self.ctx.ledger.forget(session_id)
        self.session_schemes.pop(session_id, None)
        self._locks.pop(session_id, None)

    # ------------------------------------------------------------------ calls (xApp)
    async def _once(self, method: str, sid: str, epoch: int,
                    work: Callable[[Session], Awaitable[pallas_pb2.ControlReply]],
                    allow_closed: tuple[str, ...] = ()) -> pallas_pb2.ControlReply:
        """Run ``work`` once per (method, session, epoch) after the epoch checks; retries,
        also concurrent ones, get the first call's reply, except a retry of a commit that
        ended non-OK (the session stayed at the source, nothing was handed over): it runs
        again (issue 25: "a retry of the same commit works")."""
        if not sid:
            return self.ctx.reply(S.STATUS_INVALID, sid, epoch, message="session_id is empty")
        e = self.ctx.ledger.entry(sid, epoch)
        fut = e.replies.get(method)
        if fut is not None and method == "commit" and fut.done() \
                and fut.result().status != S.STATUS_OK:
            del e.replies[method]   # a failed commit left the session here: a retry runs again
        elif fut is not None:
            return await asyncio.shield(fut)
        newest = self.ctx.ledger.newest(sid)
        if epoch < newest:
            return self.ctx.reply(S.STATUS_STALE_EPOCH, sid, epoch, message=f"epoch {epoch} is "
                                  f"older than the newest epoch {newest} seen for this session")
        if e.closed and e.closed not in allow_closed:
            return self.ctx.reply(S.STATUS_STALE_EPOCH, sid, epoch,
                                  message=f"epoch {epoch} was already {e.closed}; use a new epoch")
        s = self.ctx.sessions.get(sid)
        if s is None:
            return self.ctx.reply(S.STATUS_UNKNOWN_SESSION, sid, epoch,
                                  message=f"agent {self.ctx.agent_id} does not serve session {sid}")
        fut = e.replies[method] = asyncio.get_running_loop().create_future()
        self.ctx.ledger.see(sid, epoch)
        lock = self._locks.setdefault(sid, asyncio.Lock())
        try:
            async with lock:
                rep = await work(s)
        except asyncio.CancelledError:
            # The work was cut (agent stopping): callers waiting on this one get an error
            # reply, and a later repeat runs afresh instead of waiting on it for ever.
            if e.replies.get(method) is fut:
                del e.replies[method]
            fut.set_result(self.ctx.reply(S.STATUS_ERROR, sid, epoch,
                                          message=f"{method} was cancelled before it ended"))
            raise
        except Exception as exc:  # noqa: BLE001 - an internal failure is a reply
            log.exception("control_failed", method=method, session=sid, epoch=epoch)
            rep = self.ctx.reply(S.STATUS_ERROR, sid, epoch,
                                 message=f"{method} failed: {exc!r}; the source keeps serving")
        fut.set_result(rep)
        return rep

    async def trigger(self, session_id: str, epoch: int, target: pallas_pb2.PeerEndpoint,
                      split_tokens: int = 0, scheme: int | str | None = None, *, rank: int = 0
                      ) -> pallas_pb2.ControlReply:
        """Start preparing ``target`` for the handover (paper section 4.3, step 1).

        Proactive schemes: Prepare (the block-aligned split P = ``split_tokens`` rounded down,
        0 = every whole block so far; w/o RC: 0) then the suffix stream. Reactive schemes:
        recorded only. A newer epoch abandons the older attempts (docs/model.md §5). ``rank``:
        the target's rank among the UE's candidates (0 = the most likely), sent in the Prepare.
        A Trigger of the same epoch naming another target adds that target (issue 45: the
        session is prepared at each; a commit uses the one the UE reached and releases the
        others); one naming the same target again means the prediction holds: it renews that
        target's lease at once (besides the first call's reply).
        """
        value = self.scheme_for(session_id, scheme)
        spec = SCHEMES[value]
        out = self.ctx.outbound.at(session_id, target.address)
        if out is not None and out.epoch == epoch and out.proactive and out.live:
            out.renew_now.set()

        async def work(s: Session) -> pallas_pb2.ControlReply:
            if s.state == SessionState.FAILED:
                return self.failed_reply(s, epoch, value)
            if target.address in self.ctx.ledger.entry(session_id, epoch).dropped:
                return self.ctx.reply(S.STATUS_STALE_EPOCH, s, epoch, scheme=value,
                                      message=f"target {target.address} was cancelled in epoch "
                                              f"{epoch}; a new epoch prepares it again")
            await self._abandon_current(s, f"superseded by epoch {epoch}",
                                        keep=lambda o: o.epoch == epoch and o.proactive
                                        and o.target.address != target.address)
            s.epoch = epoch
            if not spec.proactive:
                MIGRATIONS.labels("source", spec.name, "recorded").inc()
                return self.ctx.reply(S.STATUS_OK, s, epoch, scheme=value, message=f"{spec.name} "
                                      "prepares nothing before the handover; recorded")
            if s.state not in (SessionState.SERVING, SessionState.MIGRATING,
                               SessionState.RESUMED):
                return self.ctx.reply(S.STATUS_INVALID, s, epoch, message=f"session is {s.state.value}")
            split = 0 if spec.full_transfer else self.source.block_split(s, int(split_tokens))
            rep = await self.source.start_attempt(s, epoch, target, split, value, spec.stream_suffix,
                                                  rank=rank)
            MIGRATIONS.labels("source", spec.name, "triggered" if rep.status == S.STATUS_OK
                              else "rejected").inc()
            return rep

        return await self._once(f"trigger@{target.address}", session_id, epoch, work)

    async def cancel(self, session_id: str, epoch: int, reason: str = "", *,
                     target: pallas_pb2.PeerEndpoint | None = None) -> pallas_pb2.ControlReply:
        """Abandon the attempts of ``epoch``: every target's when ``target`` is None or has no
        address (the epoch is closed), else only the attempt at ``target``
        (:meth:`cancel_target`). Each target abandoned releases all it holds; decoding here
        never stops. OK also when nothing was prepared."""
        if target is not None and target.address:
            return await self.cancel_target(session_id, epoch, target.address, reason)

        async def work(s: Session) -> pallas_pb2.ControlReply:
            self.ctx.ledger.entry(session_id, epoch).closed = "cancelled"
            outs = await self._abandon_current(s, reason or "cancelled")
            if not outs:
                return self.ctx.reply(S.STATUS_OK, s, epoch, message="no migration running")
            out = outs[-1]
            for o in outs:
                MIGRATIONS.labels("source", scheme_name(o.scheme), "cancelled").inc()
            log.info("cancelled", session=session_id, epoch=epoch, reason=reason, targets=len(outs))
            return self.ctx.reply(S.STATUS_OK, s, epoch, split=out.split, scheme=out.scheme,
                                  message=f"epoch {epoch} cancelled ({reason or 'no reason given'})"
                                  + (f" at {len(outs)} targets" if len(outs) > 1 else ""))

        return await self._once("cancel", session_id, epoch, work, allow_closed=("cancelled",))

    async def cancel_target(self, session_id: str, epoch: int, address: str,
                            reason: str = "") -> pallas_pb2.ControlReply:
        """A targeted Cancel (``CancelRequest.target``, issue 45): the attempt of ``epoch`` (or
        an older one) at the target at ``address`` is abandoned, the target releasing what it
        holds; the session's other targets stay prepared and the epoch stays open (a Commit of
        it may still name any of them). The target is dropped from the epoch: a Trigger naming
        it again under ``epoch`` is STATUS_STALE_EPOCH (the xApp prepares it again only under
        a new epoch, docs/model.md §5), and a Commit there is reactive. OK also when nothing
        was prepared there; repeated, it answers as the first time."""
        async def work(s: Session) -> pallas_pb2.ControlReply:
            e = self.ctx.ledger.entry(session_id, epoch)
            e.dropped.add(address)
            e.replies.pop(f"trigger@{address}", None)  # a repeat of that Trigger is refused now
            why = reason or "cancelled"
            outs = await self._abandon_current(
                s, why, keep=lambda o: o.target.address != address or o.epoch > epoch)
            left = sum(o.live for o in self.ctx.outbound.of(session_id))
            for o in outs:
                MIGRATIONS.labels("source", scheme_name(o.scheme), "cancelled").inc()
            log.info("cancelled_target", session=session_id, epoch=epoch, peer=address,
                     reason=reason, abandoned=len(outs), left=left)
            what = (f"epoch {epoch} cancelled at {address} ({reason or 'no reason given'})"
                    if outs else f"nothing prepared at {address} in epoch {epoch}")
            return self.ctx.reply(S.STATUS_OK, s, epoch, message=f"{what}; {left} other "
                                  f"target(s) stay prepared")

        return await self._once(f"cancel@{address}", session_id, epoch, work,
                                allow_closed=("cancelled",))

    async def commit(self, session_id: str, epoch: int, actual_target: pallas_pb2.PeerEndpoint,
                     scheme: int | str | None = None, *, ue_tokens: int | None = None
                     ) -> pallas_pb2.ControlReply:
        """Hand the session over to ``actual_target`` with the named scheme (see the module).

        ``ue_tokens``: output tokens the UE has received (the commit point; default all).
        The session is frozen at most ``commit_deadline_s``; on any failure it serves on here
        with no token lost and the reply is non-OK. Under the session's lock this only checks
        the call (:meth:`_commit_refused`), lets the source open the commit (bridge, scheme
        choice, ctHO split: :meth:`Source.open_commit`), freezes the session, has the source
        hand it over (:meth:`Source.commit`) and settles the outcome (:meth:`_settle_commit`).
        """
        spec = SCHEMES[self.scheme_for(session_id, scheme)]

        async def work(s: Session) -> pallas_pb2.ControlReply:
            refused = await self._commit_refused(s, epoch, spec)
            if refused is not None:
                return refused
            s.epoch = epoch
            opening = await self.source.open_commit(s, epoch, actual_target, spec,
                                                    SCHEMES.get(self.scheme_for(session_id)), ue_tokens)
            if s.state == SessionState.FAILED:   # its request failed while this call waited
                return await self._failed_at_source(s, epoch, opening.scheme)
            deadline = time.monotonic() + self.ctx.cfg.commit_deadline_s
            back = self._freeze(s, opening.freeze_at)
            try:
                rep = await self.source.commit(s, epoch, actual_target, opening,
                                               self.pinned_scheme(session_id), deadline)
            except asyncio.CancelledError:
                # Cut mid-way (the agent stopping, its caller's task cancelled): unless the
                # target took over, the session serves on here unfrozen, so what was held back
                # (tokens past the commit point, a finish) is published, not lost (the K=2
                # soak found a copy left FINISHED with 15 of its tokens still held).
                if s.state != SessionState.HANDED_OVER:
                    self._serve_on(s, back)
                raise
            return self._settle_commit(s, epoch, rep, spec, opening.scheme, back)

        return await self._once("commit", session_id, epoch, work, allow_closed=("cancelled",))

    async def _commit_refused(self, s: Session, epoch: int, spec: SchemeSpec
                              ) -> pallas_pb2.ControlReply | None:
        """The reply of a Commit that hands nothing over, or None when it goes on: a session
        that failed here (non-OK), Detour (OK: the source serves on) or a session in a state
        no commit applies to (STATUS_INVALID)."""
        if s.state == SessionState.FAILED:
            return await self._failed_at_source(s, epoch, spec)
        if not spec.migrates:  # Detour: the source serves on, the new agent relays
            return await self._detour(s, epoch, spec.value)
        if s.state not in (SessionState.SERVING, SessionState.MIGRATING,
                           SessionState.RESUMED, SessionState.FINISHED):
            return self.ctx.reply(S.STATUS_INVALID, s, epoch, message=f"session is {s.state.value}")
        return None

    @staticmethod
    def _freeze(s: Session, at: int | None) -> SessionState:
        """Freeze ``s`` at ``at`` output tokens (None: all so far) and mark it COMMITTING (a
        FINISHED one stays so); returns the state it had, which a failed commit restores."""
        s.freeze(at)
        back = s.state
        if s.state != SessionState.FINISHED:
            s.set_state(SessionState.COMMITTING)
        return back

    async def _abandon_current(self, s: Session, why: str, keep=lambda out: False) -> list:
        """Abandon the session's outbound attempts but those ``keep(attempt)`` is true of (a
        MIGRATING session with none left serves on); returns the abandoned ones
        (:class:`Outbound`), oldest first."""
        outs = [o for o in self.ctx.outbound.of(s.session_id) if not keep(o)]
        await asyncio.gather(*(self.source.abandon(o, why) for o in outs))
        if s.state == SessionState.MIGRATING and not any(o.live for o in self.ctx.outbound.of(s.session_id)):
            s.set_state(SessionState.SERVING)
        return outs

    async def _failed_at_source(self, s: Session, epoch: int, spec: SchemeSpec) -> pallas_pb2.ControlReply:
        """A commit of a session whose request failed here: its attempt is abandoned, the
        reply names the failure (non-OK)."""
        await self._abandon_current(s, "the session failed at the source")
        MIGRATIONS.labels("source", spec.name, "failed").inc()
        return self.failed_reply(s, epoch, spec.value)

    async def _detour(self, s: Session, epoch: int, value: int) -> pallas_pb2.ControlReply:
        """Detour's commit: any attempt is abandoned, the source serves on, the new agent relays."""
        await self._abandon_current(s, "detour")
        MIGRATIONS.labels("source", "detour", "committed").inc()
        return self.ctx.reply(S.STATUS_OK, s, epoch, scheme=value,
                              message="detour: the source serves on, the new agent relays")

    def _settle_commit(self, s: Session, epoch: int, rep: pallas_pb2.ControlReply, spec: SchemeSpec,
                       use: SchemeSpec, back: SessionState) -> pallas_pb2.ControlReply:
        """After the attempt: an OK closes the ledger entry (naming a fallback in the message);
        otherwise the session serves on here in the state it had (``back``), unfrozen (which
        publishes a finish or a failure held during the commit), and the reply says so."""
        if rep.status == S.STATUS_OK:
            if use is not spec:
                rep.message = f"committed with {use.name} (fallback from {spec.name})" + (
                    f": {rep.message}" if rep.message else "")
            self.ctx.ledger.entry(s.session_id, epoch).closed = "committed"
            MIGRATIONS.labels("source", use.name, "fallback" if use is not spec else "committed").inc()
            return rep
        self._serve_on(s, back)
        if s.state == SessionState.FAILED:
            rep.message = f"{rep.message}; the session failed at the source meanwhile: {s.error}"
        rep.state = s.state.proto
        MIGRATIONS.labels("source", use.name, "error").inc()
        return rep

    def _serve_on(self, s: Session, back: SessionState) -> None:
        """A commit that did not hand ``s`` over: it serves on here in the state it had before
        the freeze (``back``; MIGRATING while another target's attempt stays prepared), and
        :meth:`Session.unfreeze` publishes what was held back during the commit."""
        if s.state in (SessionState.MIGRATING, SessionState.COMMITTING):
            s.set_state(SessionState.SERVING if back != SessionState.RESUMED else back)
        if s.state == SessionState.SERVING and any(o.live for o in self.ctx.outbound.of(s.session_id)):
            s.set_state(SessionState.MIGRATING)   # the other targets' attempts stay prepared
        s.unfreeze()

    # ------------------------------------------------------------------ accounting
    def held(self) -> dict[str, int]:
        """What this agent holds for migrations (the cancel/kill tests check it returns to 0)."""
        return {"inbound": len(self.ctx.inbound), "outbound": len(self.ctx.outbound),
                "blocks": self.ctx.hub.store.num_blocks, "bytes": self.ctx.hub.store.num_bytes,
                "reserved_bytes": self.target.reserved_bytes(),
                "streams_queued": sum(o.stream.queued for o in self.ctx.outbound.values()
                                      if o.stream is not None)}

    async def close(self) -> None:
        """Abandon every outbound attempt, drop every inbound one, close peer channels."""
        for out in list(self.ctx.outbound.values()):
            self.ctx.hub.stop_export(out.session.session_id, out.target.address)
            if out.stream is not None:
                out.stream.abort()
        self.ctx.outbound.clear()
        for inb in list(self.ctx.inbound.values()):
            await self.target.drop_inbound(inb, "agent closing")
        for t in list(self.ctx.tasks):
            t.cancel()
        await self.ctx.peers.close()
