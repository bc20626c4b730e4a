"""Source side of a migration (paper section 4.3; docs/architecture.md §2, steps 1 and 3).

:class:`Source` (composed by :class:`agent.migration.migration_engine.MigrationEngine` over its
:class:`agent.migration.context.Context`) prepares a target, streams each newly completed KV
block of the session while it decodes on, and at the commit freezes the session at the commit
point, ships what is left and sends Sync. A failed or cancelled attempt never stops the
source's request; it is never frozen longer than the commit's deadline
(``MigrationConfig.commit_deadline_s``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import structlog
from pallas_proto import pallas_pb2

from agent.ipc import LocalBlock
from agent.migration.attempts import Outbound
from agent.migration.context import Context
from agent.migration.plan import CommitInputs, CommitPlan, bridges, commit_scheme, plan_commit
from agent.states import SourceState
from agent.session import Handover, Session, SessionState
from agent.wire import Block
from pallas_common.schemes import SchemeSpec, Ship
from pallas_common.timing import CommitChoice, HandoverState, commit_choice, ctho_split

log = structlog.get_logger("pallas.agent.migration")
S = pallas_pb2
# After the source's request ended, how long a commit still waits for a block copy in flight
# on the local channel (the worker sends a step's copies before vLLM streams that step's token).
BLOCK_FLUSH_GRACE_S = 0.05
#: What a warm-up the target reports still running needs at least, s (one engine step): the
#: commit-time choice then finishes the prepared state (timing.commit_choice).
WARMUP_STEP_S = 0.01
#: The source renews a target's lease every this fraction of the lease (so two renewals may
#: be lost before it runs out).
RENEW_FRACTION = 1.0 / 3.0
#: The attempt states in which the source holds the target's lease.
_HELD = (SourceState.PREPARED, SourceState.STREAMING, SourceState.COMMITTING)


def _finished_here(s: Session) -> bool:
    """vLLM finished the session's request here with a finish_reason (published, or held back by
    the commit's freeze): the commit hands over a session with nothing left to decode."""
    return s.state == SessionState.FINISHED or s.held_finish is not None


def held_at(s: Session, target: pallas_pb2.PeerEndpoint) -> int:
    """Tokens of ``s`` whose KV ``target`` computed while it served the session, if it is the
    agent the session came from here (``Session.resumed_agent``), else 0: the prompt and the
    outputs before ``resumed_from`` but the last of them (whose KV is computed only with the
    next decode step). The caller floors it to whole blocks (vLLM caches whole blocks)."""
    if not s.resumed_agent or target.agent_id != s.resumed_agent:
        return 0
    return max(0, len(s.prompt_token_ids) + s.resumed_from - 1)


@dataclasses.dataclass(frozen=True)
class CommitOpening:
    """What :meth:`Source.open_commit` settled before the freeze: ``scheme`` (the scheme the
    commit runs, :func:`agent.migration.plan.commit_scheme`), ``split`` (ctHO's split in tokens,
    None: the scheme's own, see ``SchemeSpec.commit_split``) and ``freeze_at`` (output tokens to
    freeze at, None: every token so far; a bridge chooses its own token boundary)."""

    scheme: SchemeSpec
    split: int | None
    freeze_at: int | None


class Source:
    """The source role of the migration engine, over the engine's :class:`Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    # ------------------------------------------------------------------ local blocks
    def on_local_block(self, blk: LocalBlock) -> None:
        """A block the local worker copied out: to every attempt of the session at its epoch
        (issue 45: one export feeds each target's stream). A full block counts as copied out
        for an attempt only once it went into that attempt's stream: an attempt with none (a
        prefix-only preparation beside a streamed one) ships it at its commit, if it commits."""
        for out in self.ctx.outbound.of(blk.sid):
            if out.epoch != blk.epoch or not (out.live or out.state == SourceState.COMMITTING):
                continue
            if blk.tail:
                if out.tail is None or blk.computed >= out.tail.computed:
                    out.tail = blk
            elif blk.idx not in out.full and out.stream is not None \
                    and blk.idx >= out.first_block:
                out.full.add(blk.idx)
                out.stream.send(Block(out.session.session_id, out.epoch, blk.idx, blk.fill,
                                      blk.crc, blk.data))
            out.note()

    def _watch_stream(self, out: Outbound) -> None:
        """A failed stream (peer gone) ends the attempt; the session serves on."""
        stream = out.stream

        def done(task: asyncio.Task) -> None:
            if stream.error is not None and out.live:
                out.to(SourceState.FAILED)
                out.error = repr(stream.error)
                self._drop(out)
                log.warning("migration_failed", session=out.session.session_id,
                            epoch=out.epoch, peer=out.target.address, error=out.error)
                out.note()

        stream.task.add_done_callback(done)

    def _open_stream(self, out: Outbound, start_block: int, tail: bool) -> None:
        out.stream = out.client.open_stream(out.session.session_id, out.epoch)
        self._watch_stream(out)
        out.to(SourceState.STREAMING)
        self.ctx.hub.export(out.session.session_id, out.epoch, start_block, stream=True, tail=tail,
                            key=out.target.address)

    def _drop(self, out: Outbound) -> None:
        """An attempt that ended: forgotten, its share of the export stopped; the session is
        MIGRATING no more once no live attempt of it is left."""
        s = out.session
        self.ctx.outbound.discard(out)
        self.ctx.hub.stop_export(s.session_id, out.target.address)
        if s.state == SessionState.MIGRATING and not any(o.live for o in self.ctx.outbound.of(s.session_id)):
            s.set_state(SessionState.SERVING)

    def _stop(self, out: Outbound, reason: str = "") -> bool:
        """The local half of :meth:`abandon` (no RPC): returns whether the target is to be
        released (False for an attempt already ended). ``reason`` is kept as ``out.error``."""
        sid = out.session.session_id
        self.ctx.outbound.discard(out)
        if out.state in (SourceState.CANCELLED, SourceState.COMMITTED, SourceState.FAILED):
            return False
        out.to(SourceState.CANCELLED)
        out.error = out.error or reason
        self.ctx.hub.stop_export(sid, out.target.address)
        if out.stream is not None:
            out.stream.abort()
        out.note()
        return True

    async def abandon(self, out: Outbound, reason: str) -> None:
        """Stop an attempt: no more export for it, its stream cancelled, its target released."""
        if not self._stop(out, reason):
            return
        await self._release(out, reason)

    async def abandon_all(self, s: Session, reason: str, *, keep: Outbound | None = None) -> list[Outbound]:
        """:meth:`abandon` every attempt of ``s`` but ``keep``, their Releases concurrently;
        returns them."""
        outs = [o for o in self.ctx.outbound.of(s.session_id) if o is not keep]
        await asyncio.gather(*(self.abandon(o, reason) for o in outs))
        return outs

    def release_others(self, s: Session, keep: Outbound, reason: str) -> list[Outbound]:
        """After a commit at ``keep``'s target: every other attempt of ``s`` stops here at once
        and its target is released in the background (the one-holder rule: only the committed
        target ever resumes; the others never did, so their Release undoes nothing). Returns them."""
        outs = [o for o in self.ctx.outbound.of(s.session_id) if o is not keep]
        for o in outs:
            if self._stop(o, reason):
                self.ctx.spawn(self._release(o, reason),
                               f"release-{s.session_id}-{o.epoch}-{o.target.address}")
        return outs

    async def _release(self, out: Outbound, reason: str) -> None:
        sid = out.session.session_id
        try:
            await out.client.release(pallas_pb2.ReleaseRequest(session_id=sid, epoch=out.epoch,
                                                               reason=reason),
                                     timeout_s=self.ctx.cfg.release_timeout_s)
        except Exception as exc:  # the peer may be gone: its state expires there
            log.warning("release_failed", session=sid, epoch=out.epoch,
                        peer=out.target.address, error=repr(exc))

    async def _release_unanswered(self, out: Outbound, exc: Exception) -> None:
        """A Prepare that raised (its deadline passed, the call was cut, the peer is gone) may
        still have been admitted at the target, its answer lost on the way back: release the
        target's (session, epoch) now, awaited before the caller answers, so the reservation and
        the warm-up end at once instead of at the lease's expiry, and no later Prepare of the
        same epoch at that target can be hit by this Release (issue 45). Best effort: a peer
        that is gone logs ``release_failed`` and its lease expires there."""
        await self._release(out, f"prepare unanswered at the source: {type(exc).__name__}")

    def block_split(self, s: Session, split_tokens: int) -> int:
        """The block-aligned split: ``split_tokens`` (0 = every whole block so far) rounded down."""
        bs = self.ctx.block_size
        p = s.num_tokens if split_tokens <= 0 else min(split_tokens, s.num_tokens)
        return p // bs * bs

    async def _prepare(self, out: Outbound) -> pallas_pb2.PrepareReply | None:
        """Send ``out``'s Prepare and move the attempt by the answer: PREPARED (its lease
        renewed from now on) or FAILED. Returns the target's answer, or None when the attempt
        ended here while the target prepared it (a session failing here or a newer call
        abandoned it: ``out.error`` says why). The Release that ended it may have reached the
        target before the Prepare did, so an attempt the target admitted is released again
        here, before the return (found by ``soak.py --faults --targets 2``: a Trigger racing a
        source engine kill raised ``cancelled -> prepared`` and the target kept the lease
        until it expired)."""
        s = out.session
        ident = self.ctx.identity()
        req = pallas_pb2.PrepareRequest(
            session_id=s.session_id, epoch=out.epoch, source=self.ctx.endpoint, model=ident,
            prefix_token_ids=s.all_token_ids[:out.split],
            expected_kv_bytes=int((s.num_tokens + s.remaining_tokens) * ident.kv_bytes_per_token),
            scheme=out.scheme, ue_id=s.ue_id, rank=out.rank)
        rep = await out.client.prepare(req)
        if out.state != SourceState.PLANNED:
            if rep.status == S.STATUS_OK:
                await self._release(out, f"attempt {out.state.value} while the target prepared "
                                         f"it: {out.error or 'no reason recorded'}")
            log.info("prepare_outlived", session=s.session_id, epoch=out.epoch,
                     peer=out.target.address, state=out.state.value, error=out.error,
                     target_status=S.Status.Name(rep.status))
            return None
        if rep.status == S.STATUS_OK:
            out.to(SourceState.PREPARED)
            out.t_prepared = time.monotonic()
            out.lease_s = float(rep.lease_s)
            if out.lease_s > 0:
                self.ctx.spawn(self._renew(out), f"renew-{s.session_id}-{out.epoch}")
        else:
            out.to(SourceState.FAILED)
        return rep

    async def _renew(self, out: Outbound) -> None:
        """Renew the target's lease every :data:`RENEW_FRACTION` of it (at once when a
        repeated Trigger sets ``renew_now``) while the attempt is held here (prepared,
        streaming or committing). A target that holds no lease any more (expired, evicted,
        released) ends the attempt as a failed stream does: the session serves on here. A
        renewal that gets no answer is retried at the next interval."""
        sid = out.session.session_id
        every = max(0.01, out.lease_s * RENEW_FRACTION)
        while out.state in _HELD:
            try:
                await asyncio.wait_for(out.renew_now.wait(), every)
            except asyncio.TimeoutError:
                pass
            out.renew_now.clear()
            if out.state not in _HELD:
                return
            try:
                rep = await out.client.renew(pallas_pb2.RenewRequest(session_id=sid, epoch=out.epoch),
                                             timeout_s=every)
            except Exception as exc:  # noqa: BLE001 - transient: the next interval retries
                log.info("renew_failed", session=sid, epoch=out.epoch, peer=out.target.address,
                         error=repr(exc))
                continue
            if rep.status == S.STATUS_OK:
                continue
            if out.live:
                self._lost(out, f"lease lost at the target ({S.Status.Name(rep.status)}: "
                                f"{rep.message})")
            return

    def _lost(self, out: Outbound, error: str) -> None:
        """A live attempt ended by the target or the link: failed, export and stream stopped,
        the session serves on here."""
        out.to(SourceState.FAILED)
        out.error = error
        if out.stream is not None:
            out.stream.abort()
        self._drop(out)
        log.warning("migration_failed", session=out.session.session_id, epoch=out.epoch,
                    peer=out.target.address, error=error)
        out.note()

    # ------------------------------------------------------------------ trigger
    async def start_attempt(self, s: Session, epoch: int, target: pallas_pb2.PeerEndpoint, split: int,
                            scheme: int, stream_suffix: bool, *, rank: int = 0) -> pallas_pb2.ControlReply:
        """Prepare ``target`` and start the suffix stream (paper section 4.3, step 1); ``rank``:
        the target's rank among the UE's candidates (0 = the most likely). Other attempts of
        the session (other targets of the epoch, issue 45) go on beside it."""
        sid = s.session_id
        out = Outbound(session=s, epoch=epoch, target=target, client=self.ctx.peers.get(target),
                       split=split, first_block=split // self.ctx.block_size, scheme=scheme,
                       proactive=True, stream_suffix=stream_suffix, rank=rank)
        self.ctx.outbound.put(out)
        try:
            rep = await self._prepare(out)
        except Exception as exc:
            if out.state == SourceState.PLANNED:
                out.to(SourceState.FAILED)
            self.ctx.outbound.discard(out)
            log.warning("prepare_failed", session=sid, epoch=epoch, error=repr(exc))
            await self._release_unanswered(out, exc)
            return self.ctx.reply(S.STATUS_ERROR, s, epoch, message=f"prepare failed: {exc!r}")
        if rep is None:
            return self.ended_reply(out)
        if rep.status != S.STATUS_OK:
            self.ctx.outbound.discard(out)
            return self.ctx.reply(rep.status, s, epoch, message=rep.message)
        if stream_suffix:
            # Full blocks only: the partial tail block is copied out at the commit.
            self._open_stream(out, out.first_block, tail=False)
        if s.state in (SessionState.SERVING, SessionState.RESUMED):
            s.set_state(SessionState.MIGRATING)
        log.info("triggered", session=sid, epoch=epoch, peer=target.address, split=split,
                 stream=stream_suffix, rank=rank, attempts=len(self.ctx.outbound.of(sid)))
        return self.ctx.reply(S.STATUS_OK, s, epoch, split=split, scheme=scheme)

    def ended_reply(self, out: Outbound, when: str = "while the target prepared it",
                    scheme: int = 0) -> pallas_pb2.ControlReply:
        """The non-OK reply of a call whose attempt ``out`` ended under it (``when``), never
        by a call holding the session's lock: a session that failed here meanwhile is
        STATUS_ERROR naming the failure, any other end (the attempt's stream or lease lost, the
        agent closing) STATUS_REJECTED; the message names the attempt's end (``out.error``).
        The session serves on here unless it failed."""
        s = out.session
        why = out.error or "no reason recorded"
        if s.state == SessionState.FAILED:
            return self.ctx.reply(S.STATUS_ERROR, s, out.epoch, scheme=scheme,
                                  message=f"session failed at agent {self.ctx.agent_id} "
                                          f"{when}: {s.error or why}; attempt at "
                                          f"{out.target.address} {out.state.value}")
        return self.ctx.reply(S.STATUS_REJECTED, s, out.epoch, scheme=scheme,
                              message=f"attempt at {out.target.address} {out.state.value} "
                                      f"{when}: {why}; the session serves on here")

    async def split_for_ctho(self, s: Session, target: pallas_pb2.PeerEndpoint) -> int:
        """ctHO's split p (docs/model.md §6) with the *target's* measured r_p (asked with a
        Progress call; this agent's, then the default, when it does not say) and the measured
        goodput to it; 0 (ship everything) without a model identity.

        A target that is the agent this session came from (``Session.resumed_agent``: the UE
        hands back to the cell it left, a ping-pong) still holds in vLLM's prefix cache the
        whole blocks of the tokens it had then (:func:`held_at`); they are not shipped again
        and its prefill of them is a cache hit (``ctho_split``'s ``held_tokens``). Should
        vLLM have evicted them meanwhile, the target recomputes them: slower, never wrong."""
        client = self.ctx.peers.get(target)
        try:
            r_p = (await client.progress(pallas_pb2.ProgressRequest(session_id=s.session_id),
                                         timeout_s=min(1.0, self.ctx.cfg.rpc_timeout_s))).prefill_rate
        except Exception as exc:  # noqa: BLE001 - an unreachable target fails at Prepare
            log.info("target_rate_unknown", session=s.session_id, error=repr(exc))
            r_p = 0.0
        r_p = r_p or self.ctx.prefill_rate() or self.ctx.cfg.default_prefill_rate
        try:
            ident = self.ctx.identity()
            goodput = client.goodput_bytes_per_s or client.bucket.rate or 1e9
            held = held_at(s, target)
            split = int(ctho_split(s.num_tokens, int(ident.block_size), r_p,
                                   float(ident.kv_bytes_per_token), goodput, held)[0])
            if held:
                log.info("ctho_held_at_target", session=s.session_id, target=target.agent_id,
                         held_tokens=held, split=split, tokens=s.num_tokens)
            return split
        except (ValueError, RuntimeError) as exc:
            log.warning("ctho_rates_unavailable", session=s.session_id, error=repr(exc))
            return 0

    def prepared(self, s: Session, epoch: int, address: str) -> Outbound | None:
        """The attempt of ``s`` prepared for a commit of ``epoch`` at ``address``
        (:meth:`Outbound.prepared_for`), or None."""
        out = self.ctx.outbound.at(s.session_id, address)
        return out if out is not None and out.prepared_for(epoch, address) else None

    # ------------------------------------------------------------------ bridging
    async def bridge(self, s: Session, epoch: int, target: pallas_pb2.PeerEndpoint,
                     scheme: int) -> bool:
        """Bridging (``pallas-bridge``, docs/model.md §8): before the commit freezes ``s``, keep
        decoding here (relayed to the UE) until the target holds the state (its warm-up ended
        and every full block up to the current token arrived: its Progress, polled every
        ``bridge_poll_s``), then return right after a token. The attempt prepared at ``target``
        for ``epoch`` is used, else one is started now with ctHO's split. Bounded by
        ``bridge_max_s`` (then, or if the attempt fails or the request ends, the commit goes on
        with what the target holds). Returns True when the target was ready.
        """
        sid, bs = s.session_id, self.ctx.block_size
        out = self.prepared(s, epoch, target.address)
        if out is None:
            await self.abandon_all(s, "mispredicted target")
            split = await self.split_for_ctho(s, target)
            rep = await self.start_attempt(s, epoch, target, split, scheme, stream_suffix=True)
            if rep.status != S.STATUS_OK:
                log.info("bridge_unprepared", session=sid, epoch=epoch, message=rep.message)
                return False
            out = self.ctx.outbound.at(sid, target.address)
        t0 = time.monotonic()
        end = t0 + self.ctx.cfg.bridge_max_s
        ready = False
        while out is not None and out.live and not s.request_done and time.monotonic() < end:
            try:
                prog = await out.client.progress(pallas_pb2.ProgressRequest(
                    session_id=sid, epoch=epoch), timeout_s=max(0.05, min(1.0, end - time.monotonic())))
            except Exception as exc:  # noqa: BLE001 - the commit decides what to do without it
                log.info("bridge_progress_failed", session=sid, error=repr(exc))
                break
            if prog.status != S.STATUS_OK:
                break
            need = (s.num_tokens - 1) // bs - out.first_block  # full blocks before the tail
            if prog.warmup_done and prog.blocks_received >= need:
                ready = out.ready = True
                break
            await asyncio.sleep(self.ctx.cfg.bridge_poll_s)
        if ready and not s.request_done:
            # Hand over right after a token: the UE then waits only for the switch itself.
            n = len(s.output_token_ids)
            await s.wait_tokens(n, timeout=min(1.0, max(0.0, end - time.monotonic()) + 0.2))
        log.info("bridged", session=sid, epoch=epoch, ready=ready,
                 bridged_s=round(time.monotonic() - t0, 4), n_tokens=s.num_tokens)
        return ready

    # ------------------------------------------------------------------ commit
    async def open_commit(self, s: Session, epoch: int, target: pallas_pb2.PeerEndpoint,
                          requested: SchemeSpec, pinned: SchemeSpec | None,
                          ue_tokens: int | None) -> CommitOpening:
        """Everything a Commit at ``target`` does before the freeze: bridge first where the
        scheme does (:func:`agent.migration.plan.bridges`), choose the scheme the commit runs
        (:func:`agent.migration.plan.commit_scheme`; a fallback is logged ``commit_fallback``)
        and, for ctHO, its split (:meth:`split_for_ctho`, which asks the target). ``pinned``:
        the session's own scheme (None: unknown); ``ue_tokens``: the UE's commit point (output
        tokens it received; None: all)."""
        sid, freeze_at = s.session_id, ue_tokens
        if bridges(requested, request_ended=s.state == SessionState.FINISHED or s.request_done):
            await self.bridge(s, epoch, target, requested.value)
            freeze_at = None  # hand over at the token boundary the bridge chose
        use, why = commit_scheme(requested, prepared=self.prepared(s, epoch, target.address) is not None,
                                 pinned=pinned,
                                 in_prefill=not s.output_token_ids and not s.request_done)
        if why:
            log.info("commit_fallback", session=sid, epoch=epoch, requested=requested.name,
                     scheme=use.name, reason=why)
        split = await self.split_for_ctho(s, target) if use.commit_split == "ctho" else None
        return CommitOpening(scheme=use, split=split, freeze_at=freeze_at)

    async def commit(self, s: Session, epoch: int, target: pallas_pb2.PeerEndpoint,
                     opening: CommitOpening, session_scheme: int, deadline: float
                     ) -> pallas_pb2.ControlReply:
        """:meth:`commit_attempt` with the opening's scheme and split, never raising: an
        internal error abandons the attempt at ``target`` (the other targets' attempts stay, as
        on any failed commit) and is a STATUS_ERROR reply, so the caller always unfreezes."""
        use = opening.scheme
        try:
            return await self.commit_attempt(s, epoch, target, opening.split, use.commit_ship,
                                             use.value, session_scheme, deadline)
        except Exception as exc:  # noqa: BLE001 - the frozen session must be settled
            log.exception("commit_error", session=s.session_id, epoch=epoch)
            out = self.ctx.outbound.at(s.session_id, target.address)
            if out is not None:
                await self.abandon(out, "commit error")
            return self.ctx.reply(S.STATUS_ERROR, s, epoch, scheme=use.value, message=repr(exc))

    async def _choose(self, out: Outbound, n: int) -> tuple[CommitChoice | None, float]:
        """The commit-time choice (docs/model.md §8) for a prepared attempt with a warm-up,
        running or done; returns (choice or None when nothing is to choose, the target's r_p).

        A finished warm-up still leaves a choice: the suffix blocks the target has not received
        (in flight on the rate-limited stream, or completed only at the commit point) are
        shipped by "finish" and recomputed by "recompute" (measured, paper regime: a commit that
        waited for one 64 KiB block on the 2.34 Mbit/s link took 140-300 ms, where recomputing
        its 32 tokens fits in the target's first decode step)."""
        if out.split <= 0 or out.ready:
            return None, 0.0
        try:
            prog = await out.client.progress(pallas_pb2.ProgressRequest(
                session_id=out.session.session_id, epoch=out.epoch),
                timeout_s=min(1.0, self.ctx.cfg.commit_deadline_s / 4))
        except Exception as exc:  # no answer: finish the prepared state, bounded as usual
            log.warning("progress_failed", session=out.session.session_id, error=repr(exc))
            return None, 0.0
        if prog.status != S.STATUS_OK:
            return None, prog.prefill_rate
        ident = self.ctx.identity()
        r_p, goodput = self._rates_for(out, prog.prefill_rate)
        # The UE's commit point may lie behind the prepared split (a trigger at a block boundary
        # the UE had not reached yet): only the prefix's whole blocks below n count, and the
        # blocks streamed from the split on are of no use.
        prefix = min(out.split, n // self.ctx.block_size * self.ctx.block_size)
        # The warm-up started when the target answered Prepare; what it still needs at r_p.
        # While the target says it is still running it needs at least one more engine step,
        # however long it has taken so far: a target slower than r_p (busy with other
        # prefills) left the estimate at 0 and the choice then took ctHO from L_done = 0,
        # which queued behind the same warm-up and shipped blocks the target was about to
        # have (measured: a 2.0 s commit of a 1,952-token prefix, 1.6 s after its trigger).
        running = (not prog.warmup_failed and prog.prefilled_tokens < out.split)
        left = max(WARMUP_STEP_S, out.split / r_p - (time.monotonic() - out.t_prepared)) \
            if out.t_prepared and running else 0.0
        st = HandoverState(prefix_tokens=prefix,
                           prefilled_tokens=min(prefix, prog.prefilled_tokens),
                           received_blocks=prog.blocks_received if prefix == out.split else 0,
                           handover_tokens=n,
                           block_size=self.ctx.block_size, s_kv=float(ident.kv_bytes_per_token),
                           r_p=r_p, goodput=goodput, c_sync=self.ctx.cfg.c_sync_s,
                           hop_delay_s=self.ctx.cfg.relay_hop_s,
                           warmup_left_s=left)
        return commit_choice(st), r_p

    async def commit_attempt(self, s: Session, epoch: int, target: pallas_pb2.PeerEndpoint,
                             split: int | None, ship: Ship, scheme: int, session_scheme: int,
                             deadline: float) -> pallas_pb2.ControlReply:
        """Hand ``s`` (frozen by the caller) over to ``target`` (paper section 4.3, step 3).

        A live attempt at the same target and epoch is finished; otherwise the target is
        prepared now (reactive schemes, fallbacks) with ``split``. What crosses the link is
        decided by :func:`agent.migration.plan.plan_commit`; this ships it, sends Sync with
        every token and the remaining sampling parameters, and on success stops the request
        here. Returns before ``deadline`` (time.monotonic()) with a non-OK reply if the target
        did not take over.
        """
        t0 = time.time()
        got = await self._attempt_for(s, epoch, target, split, ship, scheme, deadline)
        if isinstance(got, pallas_pb2.ControlReply):
            return got
        out, prepared = got
        n = s.num_tokens
        choice, r_p = await self._choose(out, n) if prepared else (None, 0.0)
        if not out.live:
            return self._outlived(out, scheme)
        if s.held_error is not None:
            log.warning("commit_after_source_failure", session=s.session_id, epoch=epoch,
                        error=s.held_error[0])
        plan = self._plan(out, s, prepared, ship, choice, r_p, deadline)
        out.split, out.first_block = plan.split, plan.first_block
        out.to(SourceState.COMMITTING)
        tail_msg, streamed = await self._ship(out, plan, n - 1, deadline)
        sync = self._sync_request(s, out, plan, n, tail_msg, streamed, scheme, session_scheme, deadline)
        t_sync = time.monotonic()
        try:
            rep = await out.client.sync(sync, timeout_s=max(0.01, deadline - time.monotonic()))
            ok, msg = rep.status == S.STATUS_OK, rep.message
        except Exception as exc:
            ok, msg, rep = False, f"sync failed: {exc!r}", None
        if not ok:
            await self.abandon(out, "sync failed")
            log.warning("commit_failed", session=s.session_id, epoch=epoch, error=msg)
            return self.ctx.reply(rep.status if rep is not None and rep.status != S.STATUS_OK
                                  else S.STATUS_ERROR, s, epoch, message=msg, split=out.split,
                                  scheme=scheme)
        r = await self._handed_over(s, out, target, rep, sync, n, t0, choice)
        if choice is not None:
            r.choice.CopyFrom(pallas_pb2.CommitChoice(
                option=choice.option, finish_s=choice.finish_s, ctho_s=choice.ctho_s,
                recompute_s=choice.recompute_s, detour_s=choice.detour_s,
                ctho_split_tokens=choice.ctho_split, prefix_tokens=sync.split_tokens,
                handover_tokens=n, prefill_rate=r_p, c_sync_s=self.ctx.cfg.c_sync_s,
                goodput_bytes_per_s=out.client.goodput_bytes_per_s,
                waited_s=time.monotonic() - t_sync))
        return r

    def _outlived(self, out: Outbound, scheme: int) -> pallas_pb2.ControlReply:
        """A commit whose attempt ended while it waited before the freeze took hold of it (its
        stream or lease lost, found by ``soak.py --faults --targets 2``: ``failed ->
        committing`` was raised after :meth:`_choose`): nothing was shipped nor synced, the
        target's hold is released in the background (it may still hold the prepared state),
        and the reply is :meth:`ended_reply`'s (the caller unfreezes; a retry prepares anew)."""
        log.warning("commit_attempt_ended", session=out.session.session_id, epoch=out.epoch,
                    peer=out.target.address, state=out.state.value, error=out.error)
        self.ctx.spawn(self._release(out, f"attempt {out.state.value} before the commit: {out.error}"),
                       f"release-ended-{out.session.session_id}-{out.epoch}-{out.target.address}")
        return self.ended_reply(out, "before the commit took hold of it", scheme)

    async def _attempt_for(self, s: Session, epoch: int, target: pallas_pb2.PeerEndpoint,
                           split: int | None, ship: Ship, scheme: int, deadline: float
                           ) -> tuple[Outbound, bool] | pallas_pb2.ControlReply:
        """The attempt a commit at ``target`` finishes: (the live prepared one, True; the
        session's other attempts stay until the Sync's OK, a failed commit keeps them), or a
        new one prepared now, (it, False) (every other attempt, at another target or of another
        epoch, is abandoned first); a non-OK reply when the target could not be prepared before
        ``deadline``."""
        sid = s.session_id
        out = self.prepared(s, epoch, target.address)
        if out is not None:
            for o in self.ctx.outbound.of(sid):   # an older epoch's attempts are superseded
                if o.epoch != epoch:
                    await self.abandon(o, "superseded")
            return out, True
        await self.abandon_all(s, "mispredicted target")
        split = 0 if ship == Ship.ALL else self.block_split(s, split) if split else 0
        out = Outbound(session=s, epoch=epoch, target=target, client=self.ctx.peers.get(target),
                       split=split, first_block=split // self.ctx.block_size, scheme=scheme,
                       proactive=False, stream_suffix=ship != Ship.NONE)
        self.ctx.outbound.put(out)
        try:
            rep = await asyncio.wait_for(self._prepare(out), deadline - time.monotonic())
        except Exception as exc:
            self.ctx.outbound.discard(out)
            await self._release_unanswered(out, exc)
            return self.ctx.reply(S.STATUS_ERROR, s, epoch, scheme=scheme,
                                  message=f"prepare at the target failed: {exc!r}")
        if rep is None:
            return self.ended_reply(out, scheme=scheme)
        if rep.status != S.STATUS_OK:  # any refusal there is REJECTED here (not the xApp's
            self.ctx.outbound.discard(out)  # stale epoch): the session stays here
            return self.ctx.reply(S.STATUS_REJECTED, s, epoch, scheme=scheme,
                                  message=f"target refused ({S.Status.Name(rep.status)}): {rep.message}")
        return out, False

    def _plan(self, out: Outbound, s: Session, prepared: bool, ship: Ship,
              choice: CommitChoice | None, r_p: float, deadline: float) -> CommitPlan:
        """The plan of this commit (:func:`plan_commit`) from the attempt and the session.

        Finished here only when vLLM said so (a finish_reason, published or held back by the
        freeze); a request that ended without one failed, and the target continues the session
        from the commit point by recomputing what it cannot load (issue 25: a source engine
        that died was read as "finished" and the target ended the session short)."""
        r_p, goodput = self._rates_for(out, r_p)
        return plan_commit(CommitInputs(
            prepared=prepared, ship=ship, split=out.split, first_block=out.first_block,
            block_size=self.ctx.block_size, deadline_left_s=deadline - time.monotonic(), choice=choice,
            finished_here=_finished_here(s),
            failed_here=s.held_error is not None, goodput=goodput,
            s_kv=float(self.ctx.identity().kv_bytes_per_token), r_p=r_p))

    async def _ship(self, out: Outbound, plan: CommitPlan, need_end: int, deadline: float
                    ) -> tuple[pallas_pb2.KVBlock | None, int]:
        """Carry out the plan's shipping (the target needs KV for positions [0, ``need_end``)):
        export what is missing, wait for it within half of what is left of ``deadline`` (the
        stream's end and the Sync need the rest; what is missing then is recomputed), close the
        stream before the Sync (it must not overtake blocks in flight). Returns (the tail block
        to send with the Sync or None, blocks streamed)."""
        sid, epoch, bs = out.session.session_id, out.epoch, self.ctx.block_size
        if plan.shipping and out.stream is None:
            out.stream = out.client.open_stream(sid, epoch)
            self._watch_stream(out)
        if plan.shipping:
            # The engine's next step copies out what is missing from the run and the tail.
            self.ctx.hub.export(sid, epoch, out.run_end(), stream=True, tail=plan.ship_tail,
                                key=out.target.address)
            await self._wait_blocks(out, need_end, time.monotonic() + 0.5 * max(0.0, deadline - time.monotonic()),
                                    tail=plan.ship_tail)
        self.ctx.hub.stop_export(sid, out.target.address)
        tail_msg = None
        last_full, t = need_end // bs, out.tail
        if plan.ship_tail and need_end % bs and last_full not in out.full and t is not None \
                and t.idx == last_full and t.fill >= need_end % bs:
            tail_msg = pallas_pb2.KVBlock(session_id=sid, epoch=epoch, block_index=t.idx,
                                          fill=t.fill, checksum=t.crc, data=t.data)
        streamed = 0
        if out.stream is not None and plan.shipping:
            streamed = out.run_end((need_end + bs - 1) // bs) - out.first_block
            ack = await out.stream.finish(max(0.01, deadline - time.monotonic()))
            if ack is None:
                log.warning("stream_not_acked", session=sid, epoch=epoch)
        elif out.stream is not None:
            # Nothing more goes (the request ended here, or the choice recomputes): close the
            # prepared suffix stream, else its call and the target's handler live on.
            out.stream.abort()
        return tail_msg, streamed

    def _sync_request(self, s: Session, out: Outbound, plan: CommitPlan, n: int,
                      tail_msg: pallas_pb2.KVBlock | None, streamed: int, scheme: int,
                      session_scheme: int, deadline: float) -> pallas_pb2.SyncRequest:
        """The Sync of a commit at token ``n``: every token, the remaining sampling parameters,
        the split (never past the commit point: the prepared split can lie beyond it, a trigger
        at a block boundary the UE had not reached; the target uses whole blocks below n only),
        the warm-up wait and what is left of the deadline."""
        remaining = 0 if _finished_here(s) and not s.held_token_ids else s.remaining_tokens
        sp, bs = s.sampling, self.ctx.block_size
        return pallas_pb2.SyncRequest(
            session_id=s.session_id, epoch=out.epoch, token_ids=s.all_token_ids[:n],
            prompt_tokens=len(s.prompt_token_ids), tail=tail_msg, streamed_blocks=streamed,
            sampling=pallas_pb2.SamplingParams(
                max_tokens=remaining, temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k,
                min_tokens=s.remaining_min_tokens, stop_token_ids=sp.stop_token_ids,
                ignore_eos=sp.ignore_eos, seed=sp.seed or 0, has_seed=sp.seed is not None),
            scheme=scheme, split_tokens=min(out.split, n // bs * bs), ue_id=s.ue_id,
            session_scheme=session_scheme,
            warmup_wait_s=plan.warmup_wait_s, deadline_s=max(0.0, deadline - time.monotonic()))

    async def _handed_over(self, s: Session, out: Outbound, target: pallas_pb2.PeerEndpoint,
                           rep: pallas_pb2.SyncReply, sync: pallas_pb2.SyncRequest, n: int,
                           t0: float, choice: CommitChoice | None) -> pallas_pb2.ControlReply:
        """The target took over at token ``n`` (its Sync answered OK): stop the request here,
        record the handover and answer OK with what moved."""
        sid = s.session_id
        out.to(SourceState.COMMITTED)
        self.ctx.outbound.discard(out)
        others = self.release_others(s, out, f"committed at {target.agent_id or target.address}")
        if others:
            log.info("released_other_targets", session=sid, epoch=out.epoch,
                     targets=[o.target.address for o in others])
        await self.ctx.vllm_client.abort(s)
        s.held_token_ids.clear()
        s.held_error = None   # the target serves on: a failure here after the commit point
        s.held_finish = None  # (or a finish held back) no longer concerns the session
        s.handover = Handover(target=target.address, agent_id=target.agent_id, n_tokens=n,
                              t_commit=t0, streamed_blocks=sync.streamed_blocks,
                              tail=sync.HasField("tail"), reused_tokens=rep.reused_tokens)
        s.set_state(SessionState.HANDED_OVER)
        log.info("committed", session=sid, epoch=out.epoch, n_tokens=n, streamed=sync.streamed_blocks,
                 tail=sync.HasField("tail"), reused=rep.reused_tokens,
                 choice=choice.option if choice else None, took_s=round(time.time() - t0, 4))
        r = self.ctx.reply(S.STATUS_OK, s, out.epoch, split=out.split, scheme=sync.scheme, message=rep.message)
        r.blocks_moved, r.kv_bytes_moved = rep.blocks_received, rep.bytes_received
        r.reused_tokens = rep.reused_tokens
        r.recomputed_tokens = max(0, n - rep.reused_tokens)
        return r

    def _rates_for(self, out: Outbound, r_p: float) -> tuple[float, float]:
        """(r_p, goodput) for a commit's decisions: the target's prefill rate (``r_p``, else
        this agent's measured one, else the configured default), tokens/s; the link's goodput
        (measured, else the rate limit, else unlimited loopback, 1e9), bytes/s."""
        r_p = r_p or self.ctx.prefill_rate() or self.ctx.cfg.default_prefill_rate
        return r_p, out.client.goodput_bytes_per_s or out.client.bucket.rate or 1e9

    async def _wait_blocks(self, out: Outbound, need_end: int, deadline: float, tail: bool = True) -> None:
        """Wait (until ``deadline``, time.monotonic()) for the engine to copy out what covers
        positions < ``need_end``: the full blocks from ``first_block`` and, with ``tail``, the
        tail.

        Event-driven: wakes on every block copied out and on the end of the session's request
        (a finished request copies out nothing more; after it ends the wait keeps only
        ``BLOCK_FLUSH_GRACE_S`` for copies still on the local channel). What is missing at the
        return is recomputed by the target (logged ``blocks_missing_at_commit``).
        """
        bs = self.ctx.block_size
        last_full, rem = need_end // bs, need_end % bs
        while True:
            have_full = all(j in out.full for j in range(out.first_block, last_full))
            have_tail = (not tail or rem == 0 or last_full < out.first_block or last_full in out.full
                         or (out.tail is not None and out.tail.idx == last_full
                             and out.tail.fill >= rem))
            if (have_full and have_tail) or out.state == SourceState.FAILED:
                return
            task = out.session._task
            ended = task is not None and task.done()
            left = deadline - time.monotonic()
            if left <= 0:
                return self._missing(out, need_end, "deadline")
            changed = asyncio.ensure_future(out.changed.wait())
            waiters: list[asyncio.Future] = [changed]
            if task is not None and not ended:
                waiters.append(task)  # asyncio.wait never cancels it; its end wakes this loop
            try:
                done, _ = await asyncio.wait(
                    waiters, timeout=min(left, BLOCK_FLUSH_GRACE_S) if ended else left,
                    return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not changed.done():
                    changed.cancel()
            if ended and not done:
                return self._missing(out, need_end, "request ended")

    @staticmethod
    def _missing(out: Outbound, need_end: int, why: str) -> None:
        log.warning("blocks_missing_at_commit", session=out.session.session_id, epoch=out.epoch,
                    why=why, need_end=need_end, first_block=out.first_block,
                    have=sorted(out.full)[-4:],
                    tail=None if out.tail is None else (out.tail.idx, out.tail.fill))
