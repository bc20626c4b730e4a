"""Target side of a migration (paper section 4.3; docs/architecture.md §2, steps 2-3).

:class:`Target` (composed by :class:`agent.migration.migration_engine.MigrationEngine` over its
:class:`agent.migration.context.Context`) admits an attempt at Prepare and reserves its KV
memory from this agent's own accounting until the Sync or Release; warms the prefix cache;
buffers streamed blocks within per-attempt and per-agent byte bounds (an oversized block is
refused on arrival); and at Sync resumes the request here.

Every admitted attempt holds a lease of ``lease_s`` (issue 45; docs/architecture.md §5): its KV
reservation lasts while its source renews it. Every message of the attempt from its source
(a block, a Progress, a repeated Prepare, an explicit Renew) renews it; the lease ends at the
commit (the Sync resumes the request: vLLM holds the KV from then), on a Release, or when no
renewal came within ``lease_s`` (:meth:`Target.expire`). A target without the KV memory for a
new attempt evicts attempts of a higher rank (a less likely target of their UE) before it
refuses one; an attempt of rank r is never admitted by evicting one of rank <= r.

Who may touch an attempt (issue 16; docs/architecture.md §5): only its source (with mutual TLS,
one of the calling peer's verified identities), and no call takes over a session that lives
here; anything else is ``STATUS_REJECTED`` and changes nothing.
"""

from __future__ import annotations

import asyncio
import time

import structlog
from pallas_proto import pallas_pb2

from agent.connector.messages import Claim, Loaded
from agent.migration.attempts import Inbound
from agent.migration.context import Context
from agent.states import TargetState
from agent.obs import LEASE_EVENTS, LEASES_HELD, MIGRATIONS, WASTED_PREFILL_TOKENS
from agent.session import Handover, SamplingSpec, Session, SessionState
from agent.meter import Ewma
from agent.transfer import CALL_DEADLINE, CALLER, identity_mismatch
from agent.wire import Block
from pallas_common.aio import cancel_and_wait
from pallas_common.schemes import scheme_name

log = structlog.get_logger("pallas.agent.migration")
S = pallas_pb2

# The target answers a Sync this much (at most a tenth of the source's deadline) before the
# deadline the source sent, so that the answer reaches the source while it still listens.
SYNC_REPLY_MARGIN_S = 0.5

# A warm-up that computed fewer tokens than this (most of its prefix was in the prefix cache)
# measures the request's fixed overhead, not a prefill rate: it is not an r_p sample.
MIN_WARMUP_SAMPLE_TOKENS = 64


def computed_tokens(prompt_tokens: int, usage: dict | None) -> int:
    """Tokens a prefill of ``prompt_tokens`` actually computed: the prompt less what vLLM's
    prefix cache served (``usage.prompt_tokens_details.cached_tokens``, present with
    ``--enable-prompt-tokens-details``); the whole prompt when usage does not say."""
    details = (usage or {}).get("prompt_tokens_details") or {}
    try:
        cached = int(details.get("cached_tokens") or 0)
    except (TypeError, ValueError):
        cached = 0
    return max(0, prompt_tokens - max(0, cached))


def _not_source(source: pallas_pb2.PeerEndpoint) -> str:
    """Why the peer of the call being handled may not act for ``source`` ("" if it may, or if
    the call carries no verified identity: plaintext links, in-process calls)."""
    caller = CALLER.get()
    if caller is None or source.agent_id in caller:
        return ""
    return f"peer {sorted(caller)} is not the attempt's source {source.agent_id!r}"


class Target:
    """The target role of the migration engine, over the engine's :class:`Context`; the
    agent's PeerTransfer handler (:class:`agent.transfer.PeerHandler`).

    ``warmup_rate``: EWMA of this agent's warm-up prefill rates, tokens/s (its r_p).
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.warmup_rate = Ewma(0.3)
        self._claims: dict[tuple[str, int], asyncio.Future] = {}

    def _lives_here(self, sid: str) -> str:
        """Why session ``sid`` may not be taken over by a peer ("" if it may): it lives here
        (served by this agent, not handed over, finished or failed)."""
        s = self.ctx.sessions.get(sid)
        if s is None or s.done:
            return ""
        return f"session {sid} lives at this agent ({s.state.value})"

    def _grant(self, inb: Inbound) -> None:
        inb.leased = True
        LEASES_HELD.inc()
        LEASE_EVENTS.labels("granted").inc()

    def _end_lease(self, inb: Inbound, event: str) -> None:
        """End ``inb``'s lease once: ``event`` is committed, released, expired or evicted; any
        but a commit counts the warm-up's prefill as wasted (the tokens it computed, or the
        whole prefix while it still ran: the engine's step is not cut short)."""
        if not inb.leased:
            return
        inb.leased = False
        LEASES_HELD.dec()
        LEASE_EVENTS.labels(event).inc()
        if event != "committed" and inb.warmup is not None:
            WASTED_PREFILL_TOKENS.inc(inb.computed if inb.computed >= 0 else inb.prefix_len)

    def renew(self, inb: Inbound, now: float | None = None) -> None:
        """A message of the attempt from its source: its lease runs ``lease_s`` from now."""
        inb.touched = time.monotonic() if now is None else now

    def reserved_bytes(self) -> int:
        """KV bytes promised to admitted attempts not yet resumed or released."""
        return sum(i.reserved_bytes for i in self.ctx.inbound.values()
                   if i.state == TargetState.PREPARING)

    def buffered_bytes(self) -> int:
        """KV bytes buffered in this agent for incoming attempts."""
        return sum(i.bytes_in for i in self.ctx.inbound.values())

    async def on_prepare(self, req: pallas_pb2.PrepareRequest) -> pallas_pb2.PrepareReply:
        """Admission, memory reservation and prefix warm-up (paper section 4.3, step 2)."""
        sid, epoch = req.session_id, req.epoch
        mine = self.ctx.identity()
        newest = self.ctx.ledger.newest_in(sid)
        if epoch < newest:
            return pallas_pb2.PrepareReply(status=S.STATUS_STALE_EPOCH, model=mine,
                                           message=f"newest epoch is {newest}")
        why = _not_source(req.source) or self._lives_here(sid)
        inb = self.ctx.inbound.get(sid)
        if not why and inb is not None and inb.epoch == epoch and (
                inb.source.agent_id, inb.source.address) != (req.source.agent_id,
                                                             req.source.address):
            why = f"epoch {epoch} was prepared by {inb.source.agent_id!r}"
        if why:
            log.warning("prepare_refused", session=sid, epoch=epoch, source=req.source.agent_id,
                        why=why)
            return pallas_pb2.PrepareReply(status=S.STATUS_REJECTED, model=mine, message=why)
        if inb is not None and inb.epoch == epoch:
            self.renew(inb)
            return pallas_pb2.PrepareReply(status=S.STATUS_OK, model=mine,
                                           message="already prepared", lease_s=self.ctx.cfg.lease_s)
        if inb is not None:
            await self.drop_inbound(inb, "superseded")
        mismatch = identity_mismatch(req.model, mine)
        if mismatch:
            return pallas_pb2.PrepareReply(status=S.STATUS_REJECTED, model=mine,
                                           message=f"model identity differs: {mismatch}")
        bs = int(mine.block_size)
        prefix = list(req.prefix_token_ids)
        if len(prefix) % bs:
            return pallas_pb2.PrepareReply(status=S.STATUS_INVALID, model=mine,
                                           message=f"prefix of {len(prefix)} tokens is not "
                                                   f"block-aligned ({bs})")
        # Admission by this agent's own accounting: the source's claim is taken only above what
        # the target knows it will hold, the prefix's blocks (a claim of 0 reserves those).
        need = max(int(req.expected_kv_bytes), len(prefix) // bs * int(mine.block_bytes))
        free = int(self.ctx.hub.kv_stats().get("free_blocks", 0)) * int(mine.block_bytes)
        free = max(0, free - self.reserved_bytes())  # what earlier admissions were promised
        rank = int(req.rank)
        if need > free:
            free = await self._evict_for(need, free, rank, sid)
        if need > free:
            log.info("prepare_refused", session=sid, epoch=epoch, source=req.source.agent_id,
                     rank=rank, why="KV memory", need=need, free=free)
            return pallas_pb2.PrepareReply(status=S.STATUS_REJECTED, model=mine,
                                           free_kv_bytes=free,
                                           message=f"needs {need} B of KV, "
                                                   f"{free} B free after reservations")
        self.ctx.ledger.see_in(sid, epoch)
        inb = Inbound(session_id=sid, epoch=epoch, source=req.source, prefix_len=len(prefix),
                      scheme=req.scheme, ue_id=req.ue_id, reserved_bytes=need, rank=rank)
        self._grant(inb)
        if prefix:
            inb.t_warmup = time.monotonic()
            inb.warmup = self.ctx.spawn(self._warm(inb, prefix), f"warmup-{sid}-{epoch}")
        self.ctx.inbound[sid] = inb
        log.info("prepared", session=sid, epoch=epoch, peer=req.source.address,
                 prefix=len(prefix), reserved=need, rank=rank, lease_s=self.ctx.cfg.lease_s)
        return pallas_pb2.PrepareReply(status=S.STATUS_OK, model=mine, free_kv_bytes=free,
                                       lease_s=self.ctx.cfg.lease_s)

    async def _evict_for(self, need: int, free: int, rank: int, sid: str) -> int:
        """Make room for an attempt of ``rank`` that needs ``need`` B with ``free`` B free:
        evict prepared attempts of a higher rank (highest first, then the most recently
        renewed last), only if together they make room; returns the free bytes after."""
        victims = sorted((i for i in self.ctx.inbound.values()
                          if i.state == TargetState.PREPARING and i.rank > rank
                          and i.session_id != sid),
                         key=lambda i: (-i.rank, i.touched))
        if free + sum(i.reserved_bytes for i in victims) < need:
            return free
        for inb in victims:
            if free >= need:
                break
            free += inb.reserved_bytes
            log.info("lease_evicted", session=inb.session_id, epoch=inb.epoch, rank=inb.rank,
                     for_rank=rank, for_session=sid)
            await self.drop_inbound(inb, f"evicted for a rank-{rank} preparation",
                                    event="evicted")
        return free

    async def _warm(self, inb: Inbound, prefix: list[int]) -> None:
        """Prefill exactly the prefix; its duration measures r_p here, under the present load.

        The sample is the tokens the engine *computed* (the prefix less what its prefix cache
        already held, from the response's usage) over the time since the Prepare arrived
        (queueing behind other steps and the HTTP round trip included: the rate a migration
        gets). A warm-up that computed fewer than :data:`MIN_WARMUP_SAMPLE_TOKENS` measures
        overhead, not a rate, and is not a sample (a session coming back to an agent it left
        finds most of its prefix cached, which read as 8,000-9,500 tokens/s against a paced
        1,850)."""
        usage = await self.ctx.vllm_client.prefill(prefix)
        took = time.monotonic() - inb.t_warmup
        computed = inb.computed = computed_tokens(len(prefix), usage)
        if took > 0 and computed >= MIN_WARMUP_SAMPLE_TOKENS:
            self.warmup_rate.update(computed / took)
            self.ctx.observe_prefill(computed, took)

    def on_block(self, blk: Block | pallas_pb2.KVBlock, crc_ok: bool | None = None) -> str:
        """Store one streamed block: "ok", "stale" (no attempt of that epoch), "bad" (CRC),
        "refused" (larger than a block, or over the per-attempt / per-agent byte bound)."""
        inb = self.ctx.inbound.get(blk.session_id)
        if inb is None or blk.epoch != inb.epoch or inb.state != TargetState.PREPARING:
            return "stale"
        if _not_source(inb.source):
            inb.blocks_rejected += 1
            log.warning("block_refused", session=blk.session_id, epoch=blk.epoch,
                        block=blk.block_index, why=_not_source(inb.source))
            return "refused"
        self.renew(inb)
        n = len(blk.data)
        why = ""
        if n > int(self.ctx.identity().block_bytes):
            why = f"{n} B is larger than a block"
        elif inb.bytes_in + n > self.ctx.cfg.max_inbound_session_bytes:
            why = "attempt over max_inbound_session_bytes"
        elif self.buffered_bytes() + n > self.ctx.cfg.max_inbound_bytes:
            why = "agent over max_inbound_bytes"
        if why:
            inb.blocks_rejected += 1
            log.warning("block_refused", session=blk.session_id, epoch=blk.epoch,
                        block=blk.block_index, why=why)
            return "refused"
        verdict = self.ctx.hub.put_block(blk.session_id, blk.epoch, blk.block_index, blk.fill,
                                         blk.checksum, blk.data, crc_ok)
        if verdict == "ok":
            if blk.block_index not in inb.indices:
                inb.indices.add(blk.block_index)
                inb.blocks_in += 1
                inb.bytes_in += n
        else:
            inb.blocks_rejected += 1
            log.warning("block_rejected", session=blk.session_id, epoch=blk.epoch,
                        block=blk.block_index, verdict=verdict)
        return verdict

    async def on_progress(self, req: pallas_pb2.ProgressRequest) -> pallas_pb2.ProgressReply:
        """How far a prepared attempt got (for the source's commit-time choice), and this
        agent's r_p (measured from its warm-ups, else its own prefill figures).

        L_done is the whole prefix once the warm-up finished and 0 before: the engine prefills
        a prefix within its batch budget in one step, which cannot be cut short, so no part of
        it is usable earlier (a time-based estimate let the choice "recompute" from a prefix
        that was not there, and the resumed request then waited for the warm-up anyway).
        """
        r_p = self.warmup_rate.value or self.ctx.prefill_rate()
        inb = self.ctx.inbound.get(req.session_id)
        if inb is None or inb.epoch != req.epoch:  # still says this agent's r_p (ctHO's split)
            return pallas_pb2.ProgressReply(status=S.STATUS_UNKNOWN_SESSION, prefill_rate=r_p)
        self.renew(inb)
        done = inb.warmup is None or (inb.warmup.done() and not inb.warmup.cancelled()
                                      and inb.warmup.exception() is None)
        # The engine prefills the prefix in one step (a prefix within its batch budget) and
        # a step cannot be cut short: nothing of it is usable before the warm-up ends.
        l_done = inb.prefix_len if done else 0
        failed = inb.warmup is not None and inb.warmup.done() and not done
        return pallas_pb2.ProgressReply(status=S.STATUS_OK, prefix_tokens=inb.prefix_len,
                                        prefilled_tokens=l_done, warmup_done=done,
                                        warmup_failed=failed,
                                        blocks_received=self._run(inb, inb.prefix_len),
                                        bytes_received=inb.bytes_in, prefill_rate=r_p)

    def _run(self, inb: Inbound, start_token: int) -> int:
        """Blocks held in one run from the block of ``start_token`` on."""
        j = first = start_token // self.ctx.block_size
        while j in inb.indices:
            j += 1
        return j - first

    async def on_sync(self, req: pallas_pb2.SyncRequest) -> pallas_pb2.SyncReply:
        """Resume the session here: submit the request (prompt = every token so far)."""
        sid, epoch = req.session_id, req.epoch
        inb = self.ctx.inbound.get(sid)
        refused = self._sync_refusal(req, inb)
        if refused is not None:
            return refused
        t_in = time.monotonic()
        # The source gives up at its deadline (and then serves on): every wait here ends
        # before it, so that the answer says who holds the session (issue 25: a Sync that
        # waited past it left a resumed copy here while the source served on).
        budget = float(req.deadline_s) if req.deadline_s > 0 else None
        end = None if budget is None else t_in + budget - min(SYNC_REPLY_MARGIN_S, budget / 10)

        def left(cap: float) -> float:
            return cap if end is None else max(0.0, min(cap, end - time.monotonic()))
        if req.HasField("tail") and req.tail.data:
            self.on_block(req.tail)
        if inb.warmup is not None and not inb.warmup.done():
            try:  # never longer than the source's choice allows (0: do not wait)
                await asyncio.wait_for(asyncio.shield(inb.warmup),
                                       left(min(req.warmup_wait_s, self.ctx.cfg.warmup_timeout_s)))
            except Exception as exc:  # a slow or failed warm-up only costs recomputation
                log.info("warmup_not_awaited", session=sid, epoch=epoch, error=repr(exc))
            await self._abort_warmup(inb)
        warmup_wait = time.monotonic() - t_in
        load = self._load_range(req, inb)
        now = time.time()
        session = self._resumed_session(req, inb, now)
        old = self.ctx.sessions.get(sid)
        if old is not None and old._task is not None and not old._task.done():
            await self.ctx.vllm_client.abort(old)
        self.ctx.sessions.add(session)
        inb.to(TargetState.RESUMED)
        self._end_lease(inb, "committed")  # vLLM holds the KV from here
        if session.remaining_tokens <= 0:
            session.set_state(SessionState.FINISHED, finish_reason="length")
            await self.drop_inbound(inb, "finished at the source")
            return pallas_pb2.SyncReply(status=S.STATUS_OK, message="finished",
                                        blocks_received=inb.blocks_in, bytes_received=inb.bytes_in)
        got = await self._submit_resume(req, inb, session, old, load, now, left, end, budget)
        if isinstance(got, pallas_pb2.SyncReply):
            return got
        log.info("resumed", session=sid, epoch=epoch, n_tokens=len(req.token_ids), reused=got,
                 blocks_in=inb.blocks_in, rejected=inb.blocks_rejected,
                 warmup_wait_s=round(warmup_wait, 4), sync_s=round(time.monotonic() - t_in, 4))
        return pallas_pb2.SyncReply(status=S.STATUS_OK, reused_tokens=got,
                                    blocks_received=inb.blocks_in, bytes_received=inb.bytes_in)

    @staticmethod
    async def _abort_warmup(inb: Inbound) -> None:
        """Stop a warm-up still running when the resumed request is submitted (the source chose
        not to wait for it, or the wait it allowed ran out): the resumed request prefills every
        token the cache lacks itself, and the warm-up would prefill the same prefix tokens
        beside it. vLLM's engine chunks a long prefill (``long_prefill_token_threshold``), so
        both ran in the same steps and the engine computed those tokens twice (measured,
        default replay on efc672d: a 474-token commit chose "recompute" 0.4 s into its 448-token
        warm-up, reused 256 tokens and the Sync took 0.21 s, against 35 ms estimated).
        Cancelling the task closes its HTTP request, which aborts it in vLLM; the whole blocks
        it computed so far stay in vLLM's prefix cache, and the resumed request reuses them."""
        if inb.warmup is None or inb.warmup.done():
            return
        await cancel_and_wait(inb.warmup)
        log.info("warmup_aborted", session=inb.session_id, epoch=inb.epoch,
                 prefix=inb.prefix_len, ran_s=round(time.monotonic() - inb.t_warmup, 4))

    async def _submit_resume(self, req: pallas_pb2.SyncRequest, inb: Inbound, session: Session,
                             old: Session | None, load: tuple[int, int], now: float, left,
                             end: float | None, budget: float | None) -> int | pallas_pb2.SyncReply:
        """Submit the resumed request to load blocks ``load`` (:meth:`_load_range`) and wait for
        its claim (:meth:`_await_claim`, whose answer this returns); ``now`` (time.time()) starts
        the connector's load deadline, ``left(cap)`` caps a wait by the source's deadline."""
        sid, epoch = req.session_id, req.epoch
        first, last = load
        resume_s = min(self.ctx.cfg.resume_deadline_s, max(0.05, req.deadline_s or 1e9))
        params = {"pallas": {"sid": sid, "load": {
            "epoch": epoch, "prefix_len": inb.prefix_len, "first_block": first,
            "last_block": last, "deadline": now + resume_s}}}
        claim_fut = asyncio.get_running_loop().create_future()
        self._claims[(sid, epoch)] = claim_fut
        task = self.ctx.vllm_client.start(session, kv_transfer_params=params)
        self.ctx.spawn(self._release_after_first_token(inb, session), f"drop-{sid}-{epoch}")
        try:
            return await self._await_claim(inb, session, old, claim_fut, task,
                                           left(resume_s + self.ctx.cfg.claim_wait_s), end, budget)
        except asyncio.CancelledError:
            # The call ended before any answer. At its gRPC deadline (e.g. the Sync reached a
            # loaded target late): the source gave up and serves on, so the resume is undone
            # here, in a task of its own that this cancellation cannot cut short (the soak
            # found such resumed copies left for ever). Before its deadline: the source went
            # away (its agent died), so this target keeps the session and serves it.
            at = CALL_DEADLINE.get()
            if at is not None and time.monotonic() >= at - SYNC_REPLY_MARGIN_S / 10:
                self.ctx.spawn(self._hand_back(session, inb, "the Sync's deadline passed before "
                                               "its answer"), f"undo-{sid}-{epoch}")
            raise
        finally:
            self._claims.pop((sid, epoch), None)

    def _sync_refusal(self, req: pallas_pb2.SyncRequest, inb: Inbound | None) -> pallas_pb2.SyncReply | None:
        """Why this Sync cannot resume here (a reply), or None: no prepared attempt of its
        epoch (stale or unknown), a sender that is not the attempt's source or a session that
        lives here already (rejected), or token counts that do not add up (invalid)."""
        sid, epoch = req.session_id, req.epoch
        if inb is None or inb.epoch != epoch or inb.state != TargetState.PREPARING:
            status = (S.STATUS_STALE_EPOCH if epoch < self.ctx.ledger.newest_in(sid)
                      else S.STATUS_UNKNOWN_SESSION)
            return pallas_pb2.SyncReply(status=status, message="no prepared migration")
        why = _not_source(inb.source) or self._lives_here(sid)
        if why:
            log.warning("sync_refused", session=sid, epoch=epoch, why=why)
            return pallas_pb2.SyncReply(status=S.STATUS_REJECTED, message=why)
        if req.prompt_tokens > len(req.token_ids) or not req.token_ids:
            return pallas_pb2.SyncReply(status=S.STATUS_INVALID, message="bad token counts")
        return None

    def _load_range(self, req: pallas_pb2.SyncRequest, inb: Inbound) -> tuple[int, int]:
        """The blocks the resumed request loads, (first, last) block indices (last < first:
        none): only what arrived, a run of blocks from the split on (the source's count is
        checked against it; a block it claims but that never came is recomputed, not
        awaited), and the tail block when it continues that run."""
        bs = self.ctx.block_size
        first = int(req.split_tokens) // bs
        arrived = self._run(inb, first * bs)
        if int(req.streamed_blocks) != arrived:
            log.warning("streamed_blocks_mismatch", session=req.session_id, epoch=req.epoch,
                        claimed=int(req.streamed_blocks), arrived=arrived)
        last = first + min(int(req.streamed_blocks), arrived) - 1
        if req.HasField("tail") and req.tail.data and req.tail.block_index in inb.indices \
                and req.tail.block_index == last + 1:
            last = int(req.tail.block_index)
        return first, last

    @staticmethod
    def _resumed_session(req: pallas_pb2.SyncRequest, inb: Inbound, now: float) -> Session:
        """The session as it resumes here: the prompt and the outputs so far from the Sync,
        the sampling parameters for what is left (max_tokens and min_tokens counted from the
        original prompt), the UE's scheme pin, ``resumed_from`` / ``resumed_agent``."""
        tokens = list(req.token_ids)
        sp = req.sampling
        outputs = tokens[int(req.prompt_tokens):]
        sampling = SamplingSpec(max_tokens=len(outputs) + int(sp.max_tokens),
                                temperature=sp.temperature, top_p=sp.top_p or 1.0,
                                top_k=sp.top_k or -1, min_tokens=len(outputs) + sp.min_tokens
                                if sp.min_tokens else 0,
                                stop_token_ids=list(sp.stop_token_ids), ignore_eos=sp.ignore_eos,
                                seed=sp.seed if sp.has_seed else None)
        session = Session(session_id=req.session_id, ue_id=req.ue_id or inb.ue_id,
                          prompt_token_ids=tokens[:int(req.prompt_tokens)], sampling=sampling,
                          output_token_ids=outputs, token_times=[now] * len(outputs),
                          epoch=req.epoch, state=SessionState.RESUMED, resumed_from=len(outputs),
                          resumed_agent=inb.source.agent_id)
        if req.session_scheme:
            session.scheme = int(req.session_scheme)  # the UE's pin goes on with it
        return session

    async def _await_claim(self, inb: Inbound, session: Session, old: Session | None,
                           claim_fut: asyncio.Future, task: object, wait_s: float,
                           end: float | None, budget: float | None) -> int | pallas_pb2.SyncReply:
        """Wait up to ``wait_s`` for vLLM to take the resumed request up (the connector's claim
        report) or for the request to fail first. Returns the tokens it reused from cache
        (0 without a report), or the non-OK reply when the request failed or vLLM did not take
        it up before the source's deadline ``end`` (the resume is then undone: the source keeps
        the session)."""
        sid, epoch = session.session_id, session.epoch
        waiters = [asyncio.ensure_future(asyncio.shield(claim_fut))]
        if isinstance(task, asyncio.Future):
            waiters.append(task)  # a request that fails before its claim fails the Sync
        await asyncio.wait(waiters, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        if not waiters[0].done():
            waiters[0].cancel()
        if claim_fut.done():
            claim = claim_fut.result()
            session.reused_tokens = claim.local + claim.external
            session.claim = claim
            return session.reused_tokens
        if session.state == SessionState.FAILED:
            return await self._resume_failed(inb, session, old)
        if end is not None and time.monotonic() >= end - 1e-3:
            # vLLM has not taken the request up (all its sequences busy, or a long step)
            # and the source is about to give up: undo the resume, the source serves on.
            await self._hand_back(session, inb, "not admitted by vLLM before the source's "
                                  f"deadline ({budget:.2f} s)")
            return pallas_pb2.SyncReply(
                status=S.STATUS_ERROR,
                message=f"the target's vLLM did not take the resumed request up within the "
                        f"source's deadline ({budget:.2f} s; busy?): resume undone, the "
                        "source keeps the session")
        log.warning("no_claim_report", session=sid, epoch=epoch)
        return 0

    async def _resume_failed(self, inb: Inbound, session: Session,
                             old: Session | None) -> pallas_pb2.SyncReply:
        """The resumed request failed here before it got going (vLLM refused it, or is gone):
        undo the resume (the session record goes, or the one of an earlier stay comes back;
        the attempt's blocks are dropped) and answer the Sync non-OK with the reason, so the
        source keeps the session (one holder)."""
        sid = session.session_id
        if self.ctx.sessions.get(sid) is session:
            self.ctx.sessions.pop(sid)
            if old is not None:
                self.ctx.sessions.add(old)
        await self.drop_inbound(inb, "resume failed")
        MIGRATIONS.labels("target", scheme_name(inb.scheme), "failed").inc()
        log.warning("resume_failed", session=sid, epoch=inb.epoch, error=session.error)
        return pallas_pb2.SyncReply(status=S.STATUS_ERROR,
                                    message=f"the resume failed at the target: {session.error}")

    async def _hand_back(self, session: Session, inb: Inbound | None, why: str) -> None:
        """Undo a resume here (the source serves the session: one holder): the resumed request
        is aborted, the record says the session went back to its source (a UE streaming it
        here is relayed there) and the attempt's blocks are dropped."""
        await self.ctx.vllm_client.abort(session)
        if not session.done:
            session.handover = Handover(target=inb.source.address if inb is not None else "",
                                        agent_id=session.resumed_agent,
                                        n_tokens=session.num_tokens, t_commit=time.time())
            session.set_state(SessionState.HANDED_OVER)
        if inb is not None:
            await self.drop_inbound(inb, f"resume undone: {why}")
        MIGRATIONS.labels("target", scheme_name(inb.scheme) if inb is not None else "",
                          "handed_back").inc()
        log.warning("resume_undone", session=session.session_id, epoch=session.epoch,
                    peer=session.resumed_agent, why=why)

    async def _release_after_first_token(self, inb: Inbound, session: Session) -> None:
        """Buffered blocks are loaded before the first token: release them then."""
        try:
            await session.wait_tokens(session.resumed_from)
        finally:
            await self.drop_inbound(inb, "resumed")

    def on_claim(self, claim: Claim) -> None:
        fut = self._claims.get((claim.sid, claim.epoch))
        if fut is not None and not fut.done():
            fut.set_result(claim)

    def on_loaded(self, loaded: Loaded) -> None:
        """The connector's report of a load; blocks that failed to load (missing, or bad after
        their checksum passed) are recomputed by vLLM (``kv_load_failure_policy=recompute``)
        or fail the request: either way the attempt's buffered blocks are of no more use and
        are released now."""
        s = self.ctx.sessions.get(loaded.sid)
        if s is not None:
            s.loaded = loaded
        inb = self.ctx.inbound.get(loaded.sid)
        if loaded.failed and inb is not None and inb.epoch == loaded.epoch:
            log.warning("blocks_failed_to_load", session=loaded.sid, epoch=loaded.epoch,
                        failed=list(loaded.failed), loaded=len(loaded.blocks))
            self.ctx.spawn(self.drop_inbound(inb, "blocks failed to load"),
                           f"drop-failed-{loaded.sid}-{loaded.epoch}")

    async def drop_inbound(self, inb: Inbound, reason: str, event: str = "released") -> int:
        """Drop an attempt (its blocks, reservation, warm-up); its lease ends as ``event``
        (released, expired, evicted) unless the commit ended it. Returns the blocks dropped."""
        self._end_lease(inb, event)
        if self.ctx.inbound.get(inb.session_id) is inb:
            self.ctx.inbound.pop(inb.session_id, None)
        await cancel_and_wait(inb.warmup)
        if inb.state != TargetState.RELEASED:
            inb.to(TargetState.RELEASED)
        held = self.ctx.hub.store.epoch(inb.session_id)
        n = self.ctx.hub.drop(inb.session_id) if held is not None and held <= inb.epoch else 0
        log.info("inbound_released", session=inb.session_id, epoch=inb.epoch, blocks=n,
                 reason=reason)
        return n

    def _from_source(self, sid: str, epoch: int) -> tuple[int, str, Inbound | None]:
        """The checks a Release and a Renew of (``sid``, ``epoch``) share, before either changes
        anything: ``(STATUS_STALE_EPOCH, why, None)`` for an epoch older than the newest a peer
        named for the session here (docs/model.md §5); ``(STATUS_REJECTED, why, attempt)`` when
        an attempt of the session is held here and the caller is not its source (issue 16);
        else ``(STATUS_OK, "", the attempt held for the session or None)``, of any epoch."""
        newest = self.ctx.ledger.newest_in(sid)
        if epoch < newest:
            return S.STATUS_STALE_EPOCH, f"newest epoch is {newest}", None
        inb = self.ctx.inbound.get(sid)
        why = _not_source(inb.source) if inb is not None else ""
        if why:
            return S.STATUS_REJECTED, why, inb
        return S.STATUS_OK, "", inb

    async def on_release(self, req: pallas_pb2.ReleaseRequest, *,
                         undo_resume: bool = True) -> pallas_pb2.ReleaseReply:
        """Drop everything held for (session, epoch): blocks, buffers, reservation, warm-up.

        From the attempt's source (``undo_resume``), a Release of an epoch that resumed here
        means the source gave the commit up (its Sync failed or timed out there, and it serves
        on): the resume is undone (:meth:`_hand_back`), so one agent holds the session. A
        source never releases an epoch it committed. The xApp's Cancel at the target does not
        undo a resume (it cannot know whether the commit succeeded).
        """
        sid, epoch = req.session_id, req.epoch
        status, why, inb = self._from_source(sid, epoch)   # before the epoch is recorded
        if status != S.STATUS_OK:
            return pallas_pb2.ReleaseReply(status=status, message=why)
        s = self.ctx.sessions.get(sid)
        if undo_resume and s is not None and s.state == SessionState.RESUMED \
                and s.epoch == epoch and s.resumed_agent \
                and not _not_source(pallas_pb2.PeerEndpoint(agent_id=s.resumed_agent)):
            mine = inb if inb is not None and inb.epoch == epoch else None
            blocks = self.ctx.hub.store.num_blocks
            # shielded: a Release whose own deadline passes mid-way still undoes the resume
            await asyncio.shield(self._hand_back(s, mine, f"the source abandoned the commit "
                                                          f"({req.reason or 'no reason given'})"))
            self.ctx.ledger.see_in(sid, epoch)
            return pallas_pb2.ReleaseReply(
                status=S.STATUS_OK, blocks_released=max(0, blocks - self.ctx.hub.store.num_blocks),
                message="resume undone: the source keeps the session")
        self.ctx.ledger.see_in(sid, epoch)
        if inb is None or inb.state != TargetState.PREPARING:
            return pallas_pb2.ReleaseReply(status=S.STATUS_OK, message="nothing held")
        n = await self.drop_inbound(inb, req.reason or "released")
        return pallas_pb2.ReleaseReply(status=S.STATUS_OK, blocks_released=n)

    async def on_renew(self, req: pallas_pb2.RenewRequest) -> pallas_pb2.RenewReply:
        """The source holds the attempt and its prediction holds: the lease runs ``lease_s``
        from now. STALE for an older epoch, REJECTED for a caller that is not the source of the
        attempt held for the session (:meth:`_from_source`, as for a Release), UNKNOWN_SESSION
        when no lease of that epoch is held here (it expired, was evicted or released: the
        source's attempt is lost)."""
        sid, epoch = req.session_id, req.epoch
        status, why, inb = self._from_source(sid, epoch)
        if status != S.STATUS_OK:
            return pallas_pb2.RenewReply(status=status, message=why)
        if inb is None or inb.epoch != epoch or inb.state != TargetState.PREPARING:
            return pallas_pb2.RenewReply(status=S.STATUS_UNKNOWN_SESSION, message="no lease held")
        self.renew(inb)
        LEASE_EVENTS.labels("renewed").inc()
        return pallas_pb2.RenewReply(status=S.STATUS_OK, lease_s=self.ctx.cfg.lease_s)

    async def expire(self, now: float | None = None) -> int:
        """Drop prepared attempts whose lease ran out (no message from their source for
        ``lease_s``); returns how many were dropped (a lost Release or a dead source frees the
        target this way). Each is re-read before it is dropped: a renewal, a Sync or a Release
        that came while an earlier one was dropped keeps it or already ended it."""
        now = time.monotonic() if now is None else now
        stale = [(i, i.touched) for i in self.ctx.inbound.values()
                 if i.state == TargetState.PREPARING and now - i.touched > self.ctx.cfg.lease_s]
        n = 0
        for inb, seen in stale:
            if inb.touched != seen or inb.state != TargetState.PREPARING \
                    or self.ctx.inbound.get(inb.session_id) is not inb:
                continue
            log.info("lease_expired", session=inb.session_id, epoch=inb.epoch,
                     silent_s=round(now - inb.touched, 3))
            await self.drop_inbound(inb, "lease expired: source silent", event="expired")
            n += 1
        return n
