"""Migration orchestration, source and target side (paper §4.3; architecture.md steps 1-4).

One :class:`Migrator` per agent plays both roles:

- *source* (the agent whose vLLM serves the session): :meth:`Migrator.trigger`,
  :meth:`Migrator.cancel`, :meth:`Migrator.commit`, called by the Control service (xApp).
- *target*: :meth:`Migrator.on_prepare`, :meth:`Migrator.on_block`, :meth:`Migrator.on_sync`,
  :meth:`Migrator.on_release`, called by the PeerTransfer service (agent/transfer.py).

Every scheme of the paper runs on the same machinery; the Control service picks the knobs:

============================  ===================================================================
scheme (pallas_pb2.Scheme)    calls
============================  ===================================================================
Pallas (SCHEME_PALLAS)        ``trigger(sid, e, tgt, split_tokens=P or 0)`` before the HO (target
                              prefills the P-token prefix, source streams each completed suffix
                              block), then ``commit(sid, e, tgt)`` (ship_blocks="suffix": the
                              remaining blocks and the tail, then Sync)
w/o SM (SCHEME_NO_SM)         ``trigger(..., stream_suffix=False)``, then
                              ``commit(..., ship_blocks="none")``: the window's tokens are
                              recomputed after the HO
w/o RC (SCHEME_NO_RC)         ``trigger(..., recompute_prefix=False)`` (split 0: every block is
                              streamed proactively, nothing recomputed), then ``commit(...)``
Full-Copy (SCHEME_FULL_COPY)  no trigger; ``commit(..., split_tokens=0, ship_blocks="all")``
Recomputation                 no trigger; ``commit(..., split_tokens=0, ship_blocks="none")``
(SCHEME_RECOMPUTATION)
ctHO (SCHEME_CTHO)            no trigger; ``commit(..., split_tokens=p, ship_blocks="suffix")``:
                              the target prefills the p-token prefix while the source ships blocks
                              p/bs.. in parallel; p from :func:`ctho_split` (model.md §6); with
                              ``split_tokens=None`` the Migrator computes it from its measured rates
Detour (SCHEME_DETOUR)        no migration (the UE front relays; agent/front.py)
============================  ===================================================================

A commit whose ``actual_target`` differs from the prepared target cancels the prepared one and
recovers at the actual target as ctHO (model.md §6, fallback). A failed or cancelled migration
never stops the source's request: the source decodes on throughout and only stops the request
once the target has accepted the Sync.

After a successful Sync the target holds the session (state ``resumed``) with the source's
outputs, its resumed request running in its own vLLM; it is then a source for the next handover
(A -> B -> A chains). The source keeps the session record in state ``handed_over``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import structlog
from pallas_proto import pallas_pb2

from agent.ipc import BlockHub
from agent.session import Engine, SamplingSpec, Session, SessionState, SessionStore
from agent.transfer import PeerClient, PeerPool, BlockStream, identity_mismatch
from agent.wire import Block
from pallas_common.aio import cancel_and_wait

log = structlog.get_logger("pallas.agent.migration")

ShipBlocks = str  # "suffix" | "all" | "none"
S = pallas_pb2
# After the source's request ended, how long a commit still waits for a block copy in flight
# on the local channel (the worker sends a step's copies before vLLM streams that step's token).
BLOCK_FLUSH_GRACE_S = 0.05


@dataclasses.dataclass
class MigrationConfig:
    """Knobs of the migration machinery (seconds unless noted).

    Attributes:
        resume_deadline_s: how long a resumed request at the target may wait for blocks still
            in flight before vLLM recomputes what is missing.
        block_wait_s: at a commit, how long the source waits for its engine to copy out the
            blocks to ship (normally one decode step).
        warmup_timeout_s: how long Sync waits for the target's prefix warm-up.
        rpc_timeout_s: deadline of Prepare/Sync/Release calls.
        release_timeout_s: deadline of the best-effort Release on cancel/failure.
        kv_headroom: admission requires free KV >= expected bytes * headroom.
        link_rate_mbps: per-peer token-bucket limit on block streams (None = unlimited).
        claim_wait_s: how long Sync waits for the connector's claim report (for reused_tokens).
    """

    resume_deadline_s: float = 20.0
    block_wait_s: float = 10.0
    warmup_timeout_s: float = 300.0
    rpc_timeout_s: float = 60.0
    release_timeout_s: float = 5.0
    kv_headroom: float = 1.0
    link_rate_mbps: float | None = None
    claim_wait_s: float = 5.0


@dataclasses.dataclass(eq=False)
class Outbound:
    """Source-side state of one migration attempt (one session, one epoch)."""

    session: Session
    epoch: int
    target: pallas_pb2.PeerEndpoint
    client: PeerClient
    split: int
    first_block: int
    scheme: int
    proactive: bool
    stream_suffix: bool
    state: str = "planned"  # planned, prepared, streaming, failed, cancelled, committed
    stream: BlockStream | None = None
    full: set[int] = dataclasses.field(default_factory=set)
    tail: tuple[int, int, int, bytes, int] | None = None  # idx, fill, crc, data, computed
    error: str = ""
    changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    t_trigger: float = dataclasses.field(default_factory=time.time)

    def note(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def run_end(self, limit: int | None = None) -> int:
        """The first block index from ``first_block`` on not yet copied out (at most ``limit``):
        blocks ``first_block .. run_end() - 1`` are all here, in one run."""
        j = self.first_block
        while j in self.full and (limit is None or j < limit):
            j += 1
        return j


@dataclasses.dataclass(eq=False)
class Inbound:
    """Target-side state of one incoming migration (one session, one epoch)."""

    session_id: str
    epoch: int
    source: pallas_pb2.PeerEndpoint
    prefix_len: int
    scheme: int
    ue_id: str
    warmup: asyncio.Task | None = None
    claim: asyncio.Future | None = None
    loaded: dict[str, Any] = dataclasses.field(default_factory=dict)
    blocks_in: int = 0
    bytes_in: int = 0
    blocks_rejected: int = 0
    state: str = "preparing"  # preparing, resumed, released


def _reply(status: int, session_id: str, epoch: int, *, message: str = "", state: str = "",
           split: int = 0, scheme: int = 0, moved: pallas_pb2.SyncReply | None = None,
           n_tokens: int = 0) -> pallas_pb2.ControlReply:
    """A ControlReply; with ``moved`` (the target's SyncReply for ``n_tokens`` tokens) it also
    says what the handover moved: blocks and bytes accepted, tokens reused and recomputed."""
    r = pallas_pb2.ControlReply(status=status, message=message, session_id=session_id,
                                epoch=epoch, state=state, split_tokens=split, scheme=scheme)
    if moved is not None:
        r.blocks_moved = moved.blocks_received
        r.kv_bytes_moved = moved.bytes_received
        r.reused_tokens = moved.reused_tokens
        r.recomputed_tokens = max(0, n_tokens - moved.reused_tokens)
    return r


class Migrator:
    """Runs migrations of this agent's sessions (source role) and accepts them (target role).

    Args:
        agent_id: this agent's id (the PeerEndpoint's agent_id).
        peer_address: ``host:port`` of this agent's PeerTransfer service (the source endpoint
            sent in Prepare).
        sessions: the agent's sessions.
        engine: client of the local vLLM server.
        hub: the local channel to the connector (blocks, claims, KV-pool stats).
        identity: returns this server's ModelIdentity (admission).
        config: :class:`MigrationConfig`.
        peers: per-peer clients (shared link-rate limits); default a new pool.
    """

    def __init__(self, *, agent_id: str, peer_address: str, sessions: SessionStore,
                 engine: Engine, hub: BlockHub,
                 identity: Callable[[], pallas_pb2.ModelIdentity],
                 config: MigrationConfig | None = None, peers: PeerPool | None = None) -> None:
        self.agent_id = agent_id
        self.peer_address = peer_address
        self.sessions = sessions
        self.engine = engine
        self.hub = hub
        self.identity = identity
        self.cfg = config or MigrationConfig()
        self.peers = peers or PeerPool(link_rate_mbps=self.cfg.link_rate_mbps,
                                       timeout_s=self.cfg.rpc_timeout_s)
        self.outbound: dict[str, Outbound] = {}
        self.inbound: dict[str, Inbound] = {}
        self._newest_in: dict[str, int] = {}
        self._committed: dict[str, tuple[int, pallas_pb2.ControlReply]] = {}
        # The connector's claim at a resume, by (session, epoch); kept apart from the inbound
        # state, which is released as soon as the first token arrives (maybe before it).
        self._claims: dict[tuple[str, int], asyncio.Future] = {}
        self._lock: dict[str, asyncio.Lock] = {}
        self._bg: set[asyncio.Task] = set()
        # Fault injection for tests: (session_id, block_index) pairs whose data the source
        # zeroes after the checksum was taken (the target must catch them).
        self.corrupt_blocks: set[tuple[str, int]] = set()
        hub.on_block = self._on_local_block
        hub.on_claim = self._on_claim
        hub.on_loaded = self._on_loaded

    # ------------------------------------------------------------------ helpers
    @property
    def endpoint(self) -> pallas_pb2.PeerEndpoint:
        """This agent's PeerEndpoint."""
        return pallas_pb2.PeerEndpoint(agent_id=self.agent_id, address=self.peer_address)

    @property
    def block_size(self) -> int:
        """Tokens per KV block of the local engine."""
        return int(self.identity().block_size)

    def _session_lock(self, sid: str) -> asyncio.Lock:
        lk = self._lock.get(sid)
        if lk is None:
            lk = self._lock[sid] = asyncio.Lock()
        return lk

    def _spawn(self, coro, name: str) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro, name=name)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)
        return t

    def _expected_kv_bytes(self, s: Session) -> int:
        ident = self.identity()
        return int((s.num_tokens + s.remaining_tokens) * ident.kv_bytes_per_token
                   * self.cfg.kv_headroom)

    # ------------------------------------------------------------------ local blocks (source)
    def _on_local_block(self, hdr: dict[str, Any], data: bytes) -> None:
        out = self.outbound.get(hdr["sid"])
        if out is None or out.epoch != int(hdr["epoch"]) or out.state in ("failed", "cancelled"):
            return
        idx, fill = int(hdr["idx"]), int(hdr["fill"])
        if hdr.get("tail"):
            if out.tail is None or int(hdr["computed"]) >= out.tail[4]:
                out.tail = (idx, fill, int(hdr["crc"]), data, int(hdr["computed"]))
        else:
            if idx in out.full:
                return
            out.full.add(idx)
            if (out.session.session_id, idx) in self.corrupt_blocks:
                data = bytes(len(data))
            if out.stream is not None:
                out.stream.send(Block(out.session.session_id, out.epoch, idx, fill,
                                      int(hdr["crc"]), data))
        out.note()

    def _watch_stream(self, out: Outbound) -> None:
        """A failed stream (peer gone) ends the attempt; the session serves on."""
        stream = out.stream
        assert stream is not None

        def done(task: asyncio.Task) -> None:
            if stream.error is not None and out.state in ("streaming", "prepared"):
                out.state = "failed"
                out.error = repr(stream.error)
                self.hub.stop_export(out.session.session_id)
                if self.outbound.get(out.session.session_id) is out:
                    self.outbound.pop(out.session.session_id, None)
                if out.session.state == SessionState.MIGRATING:
                    out.session.set_state(SessionState.SERVING)
                log.warning("migration_failed", session=out.session.session_id,
                            epoch=out.epoch, peer=out.target.address, error=out.error)
                out.note()

        stream.task.add_done_callback(done)

    async def _abandon(self, out: Outbound, reason: str) -> None:
        """Stop an attempt: no more export, stream cancelled, the target released."""
        sid = out.session.session_id
        if self.outbound.get(sid) is out:
            self.outbound.pop(sid, None)
        if out.state in ("cancelled", "committed"):
            return
        out.state = "cancelled"
        self.hub.stop_export(sid)
        if out.stream is not None:
            out.stream.abort()
        out.note()
        try:
            await out.client.release(pallas_pb2.ReleaseRequest(session_id=sid, epoch=out.epoch,
                                                               reason=reason),
                                     timeout_s=self.cfg.release_timeout_s)
        except Exception as exc:  # the peer may be gone: nothing to release there
            log.warning("release_failed", session=sid, epoch=out.epoch,
                        peer=out.target.address, error=repr(exc))

    def _split(self, s: Session, split_tokens: int) -> int:
        bs = self.block_size
        k = s.num_tokens
        p = k if split_tokens <= 0 else min(split_tokens, k)
        return p // bs * bs

    async def _prepare(self, out: Outbound) -> pallas_pb2.PrepareReply:
        s = out.session
        req = pallas_pb2.PrepareRequest(
            session_id=s.session_id, epoch=out.epoch, source=self.endpoint,
            model=self.identity(), prefix_token_ids=s.all_token_ids[:out.split],
            expected_kv_bytes=self._expected_kv_bytes(s), scheme=out.scheme, ue_id=s.ue_id)
        return await out.client.prepare(req)

    # ------------------------------------------------------------------ source role (xApp)
    async def trigger(self, session_id: str, epoch: int, target: pallas_pb2.PeerEndpoint,
                      split_tokens: int = 0, *, stream_suffix: bool = True,
                      proactive: bool = True, recompute_prefix: bool = True,
                      scheme: int = pallas_pb2.SCHEME_PALLAS) -> pallas_pb2.ControlReply:
        """Start preparing ``target`` for the handover of ``session_id`` (paper §4.3, step 1).

        Fixes the block-aligned split P (``split_tokens`` rounded down to the block size, capped
        at the tokens so far; 0 = the source decides: every complete block so far), sends
        Prepare (model identity, admission, the P prefix token ids; the target warms its prefix
        cache by a prefill of exactly those P tokens) and, if ``stream_suffix``, streams every
        suffix KV block to the target as soon as it is complete while the session decodes on.
        ``recompute_prefix=False`` sets P = 0 (w/o RC: the whole cache is streamed).
        ``proactive=False`` only records the target and epoch (nothing moves before commit).

        Idempotent for a repeated (session_id, epoch). An older epoch than the newest seen
        answers STATUS_STALE_EPOCH; a newer one cancels the running attempt first (model.md §5).
        Returns a ControlReply with status, state and the split in force. Never raises for
        session/target problems (status REJECTED/ERROR/UNKNOWN_SESSION/INVALID instead).
        """
        s = self.sessions.get(session_id)
        if s is None:
            return _reply(S.STATUS_UNKNOWN_SESSION, session_id, epoch, message="no such session")
        if not target.address:
            return _reply(S.STATUS_INVALID, session_id, epoch, message="target has no address",
                          state=s.state.value)
        async with self._session_lock(session_id):
            if epoch < s.epoch:
                return _reply(S.STATUS_STALE_EPOCH, session_id, epoch, state=s.state.value,
                              message=f"newest epoch is {s.epoch}")
            out = self.outbound.get(session_id)
            if out is not None and out.epoch == epoch and out.state not in ("failed",
                                                                            "cancelled"):
                return _reply(S.STATUS_OK, session_id, epoch, state=s.state.value,
                              split=out.split, scheme=out.scheme, message="already triggered")
            if out is not None:
                await self._abandon(out, "superseded by a newer epoch")
            if s.state not in (SessionState.SERVING, SessionState.MIGRATING,
                               SessionState.RESUMED):
                return _reply(S.STATUS_INVALID, session_id, epoch, state=s.state.value,
                              message=f"session is {s.state.value}")
            s.epoch = epoch
            split = self._split(s, split_tokens) if recompute_prefix else 0
            bs = self.block_size
            out = Outbound(session=s, epoch=epoch, target=target,
                           client=self.peers.get(target), split=split, first_block=split // bs,
                           scheme=scheme, proactive=proactive, stream_suffix=stream_suffix)
            self.outbound[session_id] = out
            if not proactive:
                return _reply(S.STATUS_OK, session_id, epoch, state=s.state.value, split=split,
                              scheme=scheme, message="recorded; nothing moves before commit")
            blog = log.bind(session=session_id, epoch=epoch, peer=target.address)
            try:
                rep = await self._prepare(out)
            except Exception as exc:
                out.state = "failed"
                self.outbound.pop(session_id, None)
                blog.warning("prepare_failed", error=repr(exc))
                return _reply(S.STATUS_ERROR, session_id, epoch, state=s.state.value,
                              message=f"prepare failed: {exc!r}")
            if rep.status != S.STATUS_OK:
                out.state = "failed"
                self.outbound.pop(session_id, None)
                return _reply(S.STATUS_REJECTED if rep.status == S.STATUS_REJECTED
                              else rep.status, session_id, epoch, state=s.state.value,
                              message=rep.message)
            out.state = "prepared"
            if stream_suffix:
                out.stream = out.client.open_stream(session_id, epoch)
                self._watch_stream(out)
                out.state = "streaming"
                # Full blocks only: the partial tail block is copied out at the commit (one
                # copy, not one every decode step of the source).
                self.hub.export(session_id, epoch, out.first_block, stream=True, tail=False)
            if s.state in (SessionState.SERVING, SessionState.RESUMED):
                s.set_state(SessionState.MIGRATING)
            blog.info("triggered", split=split, stream=stream_suffix)
            return _reply(S.STATUS_OK, session_id, epoch, state=s.state.value, split=split,
                          scheme=scheme)

    async def cancel(self, session_id: str, epoch: int,
                     reason: str = "") -> pallas_pb2.ControlReply:
        """Abandon the migration attempt of ``epoch`` (paper §4.3, step 4).

        The source stops streaming, sends Release to the target (which drops its buffered
        blocks and prefix warm-up), and the session goes back to ``serving``; its decoding
        never stops. Idempotent; a cancel for an epoch older than the newest is STALE_EPOCH,
        a cancel with no migration running answers OK with the current state.
        """
        s = self.sessions.get(session_id)
        if s is None:
            return _reply(S.STATUS_UNKNOWN_SESSION, session_id, epoch, message="no such session")
        async with self._session_lock(session_id):
            if epoch < s.epoch:
                return _reply(S.STATUS_STALE_EPOCH, session_id, epoch, state=s.state.value,
                              message=f"newest epoch is {s.epoch}")
            s.epoch = epoch
            out = self.outbound.get(session_id)
            if out is None:
                return _reply(S.STATUS_OK, session_id, epoch, state=s.state.value,
                              message="no migration running")
            await self._abandon(out, reason or "cancelled")
            if s.state == SessionState.MIGRATING:
                s.set_state(SessionState.SERVING)
            log.info("cancelled", session=session_id, epoch=epoch, peer=out.target.address,
                     reason=reason)
            return _reply(S.STATUS_OK, session_id, epoch, state=s.state.value, split=out.split,
                          scheme=out.scheme)

    async def commit(self, session_id: str, epoch: int,
                     actual_target: pallas_pb2.PeerEndpoint, *,
                     split_tokens: int | None = None, ship_blocks: ShipBlocks = "suffix",
                     ship_tail: bool = True, ue_tokens: int | None = None,
                     scheme: int = pallas_pb2.SCHEME_UNSPECIFIED,
                     session_scheme: int = pallas_pb2.SCHEME_UNSPECIFIED
                     ) -> pallas_pb2.ControlReply:
        """Hand ``session_id`` over to ``actual_target`` at the HO (paper §4.3, step 3).

        The source freezes the session at its current output length (tokens decoded past it
        are held back, not lost), makes sure the blocks to ship have left the engine, and sends
        Sync: all n token ids, the tail block (if ``ship_tail`` and blocks are shipped), the
        remaining sampling parameters (reduced max_tokens/min_tokens). The target submits the
        resumed request (prompt = the n tokens) whose connector claims the prefix from the local
        prefix cache and the shipped blocks, so only the last token is recomputed. Once the
        target accepted the Sync the source stops its own request (state ``handed_over``).

        ``ship_blocks``: "suffix" (blocks from the split on; with a trigger, those not streamed
        yet), "all" (every block from 0; forces the split to 0), "none" (token ids only; the
        target recomputes past its prefix). ``split_tokens``: the prefix the target recomputes
        when no trigger prepared it (ctHO p; None = the prepared split, or for an unprepared
        target :func:`agent.schemes.ctho_split` with the measured rates). If ``actual_target``
        differs from the prepared target, the prepared one is released and the actual one
        recovers as ctHO. ``ue_tokens``: output tokens the UE has received (the commit point;
        default: every token so far). ``scheme``: the scheme this commit runs (Sync.scheme);
        ``session_scheme``: the scheme pinned for the session, carried to the target so the pin
        outlives the handover (0: none). Idempotent for a repeated (session_id, epoch). On any
        failure the source goes on serving the session itself, with no token lost (status
        ERROR).
        """
        if ship_blocks not in ("suffix", "all", "none"):
            return _reply(S.STATUS_INVALID, session_id, epoch,
                          message=f"ship_blocks must be suffix/all/none, got {ship_blocks!r}")
        s = self.sessions.get(session_id)
        if s is None:
            return _reply(S.STATUS_UNKNOWN_SESSION, session_id, epoch, message="no such session")
        async with self._session_lock(session_id):
            done = self._committed.get(session_id)
            if done is not None and done[0] == epoch:
                return done[1]
            if epoch < s.epoch:
                return _reply(S.STATUS_STALE_EPOCH, session_id, epoch, state=s.state.value,
                              message=f"newest epoch is {s.epoch}")
            if s.state not in (SessionState.SERVING, SessionState.MIGRATING,
                               SessionState.RESUMED, SessionState.FINISHED):
                return _reply(S.STATUS_INVALID, session_id, epoch, state=s.state.value,
                              message=f"session is {s.state.value}")
            s.epoch = epoch
            # The commit point: the UE has ue_tokens outputs; later ones are held back.
            s.freeze(ue_tokens)
            try:
                reply = await self._commit_locked(s, epoch, actual_target, split_tokens,
                                                  ship_blocks, ship_tail, scheme, session_scheme)
            except Exception as exc:  # never leave the source frozen
                log.exception("commit_error", session=session_id, epoch=epoch)
                reply = _reply(S.STATUS_ERROR, session_id, epoch, message=repr(exc))
            if reply.status != S.STATUS_OK and s.state != SessionState.HANDED_OVER:
                out = self.outbound.get(session_id)
                if out is not None and not out.proactive:
                    await self._abandon(out, "commit failed")
                s.unfreeze()
                if s.state in (SessionState.MIGRATING, SessionState.COMMITTING):
                    s.set_state(SessionState.SERVING)
                reply.state = s.state.value
            if reply.status == S.STATUS_OK:
                self._committed[session_id] = (epoch, reply)
            return reply

    async def _commit_locked(self, s: Session, epoch: int, target: pallas_pb2.PeerEndpoint,
                             split_tokens: int | None, ship_blocks: str, ship_tail: bool,
                             scheme: int, session_scheme: int) -> pallas_pb2.ControlReply:
        sid = s.session_id
        bs = self.block_size
        blog = log.bind(session=sid, epoch=epoch, peer=target.address)
        t0 = time.time()
        out = self.outbound.get(sid)
        prepared = (out is not None and out.epoch == epoch and out.proactive
                    and out.target.address == target.address
                    and out.state in ("prepared", "streaming"))
        if out is not None and not prepared:
            fallback = out.target.address != target.address
            await self._abandon(out, "mispredicted target" if fallback else "superseded")
            if fallback and scheme == S.SCHEME_UNSPECIFIED:
                scheme = S.SCHEME_CTHO
            out = None
        if not prepared:
            # Post-handover recovery (Full-Copy, Recomputation, ctHO) or a fallback.
            if ship_blocks == "all":
                split = 0
            elif split_tokens is None:
                split = self._ctho_split(s, target)
            else:
                split = self._split(s, split_tokens) if split_tokens > 0 else 0
            out = Outbound(session=s, epoch=epoch, target=target, client=self.peers.get(target),
                           split=split, first_block=split // bs,
                           scheme=scheme or S.SCHEME_CTHO, proactive=False,
                           stream_suffix=ship_blocks != "none")
            self.outbound[sid] = out
            try:
                rep = await self._prepare(out)
            except Exception as exc:
                self.outbound.pop(sid, None)
                blog.warning("prepare_failed", error=repr(exc))
                return _reply(S.STATUS_ERROR, sid, epoch, state=s.state.value,
                              message=f"prepare failed: {exc!r}")
            if rep.status != S.STATUS_OK:
                self.outbound.pop(sid, None)
                return _reply(rep.status, sid, epoch, state=s.state.value, message=rep.message)
            out.state = "prepared"
        assert out is not None
        if scheme == S.SCHEME_UNSPECIFIED:
            scheme = out.scheme
        if ship_blocks == "all" and out.first_block > 0:
            ship_blocks = "suffix"  # a prepared prefix is already at the target
        finished_here = s.state == SessionState.FINISHED or (
            s._task is not None and s._task.done())
        ship = ship_blocks != "none" and not finished_here
        if ship and out.stream is None:
            out.stream = out.client.open_stream(sid, epoch)
            self._watch_stream(out)
            self.hub.export(sid, epoch, out.first_block, stream=True, tail=ship_tail)
            out.state = "streaming"
        elif out.stream is not None and not ship:
            self.hub.stop_export(sid)
        elif ship and ship_tail:
            # A stream is running (full blocks): ask for the tail block now; the engine's next
            # step copies it out. Blocks already here are not asked for again.
            self.hub.export(sid, epoch, out.run_end(), stream=True, tail=True)

        # The commit point (frozen by the caller): n tokens; the target needs KV for
        # positions [0, n-1).
        n_out = len(s.output_token_ids)
        n = len(s.prompt_token_ids) + n_out
        need_end = n - 1
        if ship:
            await self._wait_blocks(out, need_end, ship_tail)
        self.hub.stop_export(sid)
        blog.info("commit_blocks", n_tokens=n, prepared=prepared, ship=ship,
                  first_block=out.first_block, full=sorted(out.full)[-4:],
                  tail=None if out.tail is None else out.tail[:2], state=out.state)
        tail_msg = None
        last_full = need_end // bs  # blocks < last_full must be full
        if ship and ship_tail and need_end % bs and last_full not in out.full and out.tail:
            idx, fill, crc, data, _ = out.tail
            if idx == last_full and fill >= need_end % bs:
                tail_msg = pallas_pb2.KVBlock(session_id=sid, epoch=epoch, block_index=idx,
                                              fill=fill, checksum=crc, data=data)
        streamed = 0
        ack_task = None
        if out.stream is not None:
            # Blocks past the commit point are useless to the target: only count the run
            # from the first block that the engine has emitted.
            streamed = out.run_end((need_end + bs - 1) // bs) - out.first_block
            ack_task = self._spawn(out.stream.finish(self.cfg.rpc_timeout_s), f"ack-{sid}")
        # A request that ended here with the UE holding every token has nothing left to do.
        remaining = 0 if finished_here and not s.held_token_ids else s.remaining_tokens
        sp = s.sampling
        sync = pallas_pb2.SyncRequest(
            session_id=sid, epoch=epoch, token_ids=s.all_token_ids[:n],
            prompt_tokens=len(s.prompt_token_ids), tail=tail_msg, streamed_blocks=streamed,
            sampling=pallas_pb2.SamplingParams(
                max_tokens=remaining,
                temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k,
                min_tokens=s.remaining_min_tokens, stop_token_ids=sp.stop_token_ids,
                ignore_eos=sp.ignore_eos, seed=sp.seed or 0, has_seed=sp.seed is not None),
            scheme=scheme, split_tokens=out.split, ue_id=s.ue_id, session_scheme=session_scheme)
        try:
            rep = await out.client.sync(sync)
            ok = rep.status == S.STATUS_OK
            msg = rep.message
        except Exception as exc:
            ok, msg, rep = False, f"sync failed: {exc!r}", None
        if not ok:
            # The source serves on: publish what was held back, keep decoding.
            await self._abandon(out, "sync failed")
            s.unfreeze()
            if s.state in (SessionState.MIGRATING, SessionState.COMMITTING):
                s.set_state(SessionState.SERVING)
            blog.warning("commit_failed", error=msg)
            return _reply(S.STATUS_ERROR, sid, epoch, state=s.state.value, message=msg,
                          split=out.split, scheme=scheme)
        out.state = "committed"
        self.outbound.pop(sid, None)
        await self.engine.abort(s)
        s.held_token_ids.clear()
        s.info["handover"] = {"target": target.address, "agent_id": target.agent_id,
                              "n_tokens": n, "t_commit": t0,
                              "t_synced": time.time(), "streamed_blocks": streamed,
                              "tail": tail_msg is not None,
                              "reused_tokens": rep.reused_tokens if rep else None}
        s.set_state(SessionState.HANDED_OVER)
        blog.info("committed", n_tokens=n, streamed=streamed, tail=tail_msg is not None,
                  reused=rep.reused_tokens if rep else None, took_s=round(time.time() - t0, 4))
        if ack_task is not None:
            ack_task.add_done_callback(lambda t: None)
        return _reply(S.STATUS_OK, sid, epoch, state=s.state.value, split=out.split,
                      scheme=scheme, message=msg, moved=rep, n_tokens=n)

    async def _wait_blocks(self, out: Outbound, need_end: int, ship_tail: bool) -> None:
        """Wait (bounded) until the engine has copied out what covers positions < need_end.

        Event-driven: wakes on every block the engine copies out (``out.changed``) and on the
        end of the session's request (its task), so it never sleeps past the moment the blocks
        are there or nothing more can come (a finished request takes no more engine steps; what
        is missing then is recomputed by the target, never guessed). Copies from the request's
        last steps may still be on the local channel when it ends: after the end it waits for
        them until ``BLOCK_FLUSH_GRACE_S`` passes with none arriving. Returns at the latest
        after ``cfg.block_wait_s``; a return without everything is logged
        (``blocks_missing_at_commit``).
        """
        bs = self.block_size
        deadline = time.monotonic() + self.cfg.block_wait_s
        last_full = need_end // bs
        rem = need_end % bs
        while True:
            have_full = all(j in out.full for j in range(out.first_block, last_full))
            if rem == 0 or last_full < out.first_block:
                have_tail = True
            else:
                have_tail = (last_full in out.full) or not ship_tail or (
                    out.tail is not None and out.tail[0] == last_full and out.tail[1] >= rem)
            if have_full and have_tail:
                return
            if out.state == "failed":
                return
            task = out.session._task
            ended = task is not None and task.done()
            left = deadline - time.monotonic()
            if left <= 0:
                self._missing(out, need_end, "deadline")
                return
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
                # The request ended here and no copy came within the grace: nothing more will.
                self._missing(out, need_end, "request ended")
                return

    @staticmethod
    def _missing(out: Outbound, need_end: int, why: str) -> None:
        """Log what the commit goes on without (the target recomputes it: still exact)."""
        log.warning("blocks_missing_at_commit", session=out.session.session_id, epoch=out.epoch,
                    why=why, need_end=need_end, first_block=out.first_block,
                    have=sorted(out.full)[-4:], tail=None if out.tail is None else out.tail[:2],
                    engine_tokens=out.session.num_tokens + len(out.session.held_token_ids))

    def _ctho_split(self, s: Session, target: pallas_pb2.PeerEndpoint) -> int:
        """ctHO's p for an unprepared target (model.md §6) from this agent's measured rates."""
        try:
            from agent.schemes import ctho_split
        except Exception:  # B's module not available: recompute nothing, ship everything
            return 0
        ident = self.identity()
        r_p = float(s.info.get("prefill_rate") or 5000.0)
        goodput = self.peers.get(target).goodput_bytes_per_s or 1e9
        try:
            p, _ = ctho_split(s.num_tokens, r_p, float(ident.kv_bytes_per_token), goodput,
                              int(ident.block_size))
        except ValueError:
            return 0
        return int(p)

    # ------------------------------------------------------------------ target role (peer)
    async def on_prepare(self, req: pallas_pb2.PrepareRequest) -> pallas_pb2.PrepareReply:
        """Admission and prefix warm-up for an incoming migration (paper §4.3, step 2)."""
        sid, epoch = req.session_id, req.epoch
        mine = self.identity()
        newest = self._newest_in.get(sid, -1)
        if epoch < newest:
            return pallas_pb2.PrepareReply(status=S.STATUS_STALE_EPOCH, model=mine,
                                           message=f"newest epoch is {newest}")
        inb = self.inbound.get(sid)
        if inb is not None and inb.epoch == epoch:
            return pallas_pb2.PrepareReply(status=S.STATUS_OK, model=mine,
                                           message="already prepared")
        if inb is not None:
            await self._drop_inbound(inb, "superseded")
        mismatch = identity_mismatch(req.model, mine)
        if mismatch:
            return pallas_pb2.PrepareReply(status=S.STATUS_REJECTED, model=mine,
                                           message=f"model identity differs: {mismatch}")
        stats = self.hub.kv_stats()
        free_bytes = int(stats.get("free_blocks", 0)) * int(mine.block_bytes)
        if req.expected_kv_bytes > free_bytes:
            return pallas_pb2.PrepareReply(status=S.STATUS_REJECTED, model=mine,
                                           free_kv_bytes=free_bytes,
                                           message=f"needs {req.expected_kv_bytes} B of KV, "
                                                   f"{free_bytes} B free")
        bs = int(mine.block_size)
        prefix = list(req.prefix_token_ids)
        if len(prefix) % bs:
            return pallas_pb2.PrepareReply(status=S.STATUS_INVALID, model=mine,
                                           message=f"prefix of {len(prefix)} tokens is not "
                                                   f"block-aligned ({bs})")
        self._newest_in[sid] = epoch
        inb = Inbound(session_id=sid, epoch=epoch, source=req.source, prefix_len=len(prefix),
                      scheme=req.scheme, ue_id=req.ue_id)
        if prefix:
            inb.warmup = self._spawn(self.engine.prefill(prefix), f"warmup-{sid}-{epoch}")
        self.inbound[sid] = inb
        log.info("prepared", session=sid, epoch=epoch, peer=req.source.address,
                 prefix=len(prefix))
        return pallas_pb2.PrepareReply(status=S.STATUS_OK, model=mine, free_kv_bytes=free_bytes)

    def on_block(self, blk: Block | pallas_pb2.KVBlock, crc_ok: bool | None = None) -> str:
        """Store one streamed block: "ok", "stale" (no attempt of that epoch) or "bad" (CRC).

        ``crc_ok``: the transport already checked the block's CRC-32C (None: check here).
        """
        inb = self.inbound.get(blk.session_id)
        if inb is None or blk.epoch != inb.epoch or inb.state == "released":
            return "stale"
        verdict = self.hub.put_block(blk.session_id, blk.epoch, blk.block_index, blk.fill,
                                     blk.checksum, blk.data, crc_ok)
        if verdict == "ok":
            inb.blocks_in += 1
            inb.bytes_in += len(blk.data)
        else:
            inb.blocks_rejected += 1
            log.warning("block_rejected", session=blk.session_id, epoch=blk.epoch,
                        block=blk.block_index, verdict=verdict)
        return verdict

    async def on_sync(self, req: pallas_pb2.SyncRequest) -> pallas_pb2.SyncReply:
        """Resume the session here: submit the request (prompt = every token so far)."""
        sid, epoch = req.session_id, req.epoch
        inb = self.inbound.get(sid)
        if inb is None or inb.epoch != epoch:
            newest = self._newest_in.get(sid, -1)
            status = S.STATUS_STALE_EPOCH if epoch < newest else S.STATUS_UNKNOWN_SESSION
            return pallas_pb2.SyncReply(status=status, message="no prepared migration")
        if req.prompt_tokens > len(req.token_ids) or not req.token_ids:
            return pallas_pb2.SyncReply(status=S.STATUS_INVALID, message="bad token counts")
        bs = self.block_size
        t_in = time.time()
        if req.HasField("tail") and req.tail.data:
            self.on_block(req.tail)
        if inb.warmup is not None:
            try:
                await asyncio.wait_for(asyncio.shield(inb.warmup), self.cfg.warmup_timeout_s)
            except Exception as exc:  # a failed warm-up only costs recomputation
                log.warning("warmup_failed", session=sid, epoch=epoch, error=repr(exc))
        tokens = list(req.token_ids)
        n = len(tokens)
        first = int(req.split_tokens) // bs
        last = first + int(req.streamed_blocks) - 1
        if req.HasField("tail") and req.tail.data:
            last = max(last, int(req.tail.block_index))
        sp = req.sampling
        n_prompt = int(req.prompt_tokens)
        outputs = tokens[n_prompt:]
        sampling = SamplingSpec(max_tokens=len(outputs) + int(sp.max_tokens),
                                temperature=sp.temperature, top_p=sp.top_p or 1.0,
                                top_k=sp.top_k or -1, min_tokens=len(outputs) + sp.min_tokens
                                if sp.min_tokens else 0,
                                stop_token_ids=list(sp.stop_token_ids), ignore_eos=sp.ignore_eos,
                                seed=sp.seed if sp.has_seed else None)
        now = time.time()
        warm_s = now - t_in
        session = Session(session_id=sid, ue_id=req.ue_id or inb.ue_id,
                          prompt_token_ids=tokens[:n_prompt], sampling=sampling,
                          output_token_ids=outputs, token_times=[now] * len(outputs),
                          epoch=epoch, state=SessionState.RESUMED, resumed_from=len(outputs))
        if req.session_scheme:
            session.info["scheme"] = int(req.session_scheme)  # the UE's pin goes on with it
        old = self.sessions.get(sid)
        if old is not None and old._task is not None and not old._task.done():
            await self.engine.abort(old)
        self.sessions.add(session)
        inb.state = "resumed"
        if session.remaining_tokens <= 0:
            session.set_state(SessionState.FINISHED, finish_reason="length")
            await self._drop_inbound(inb, "finished at the source")
            return pallas_pb2.SyncReply(status=S.STATUS_OK, message="finished", reused_tokens=0,
                                        blocks_received=inb.blocks_in, bytes_received=inb.bytes_in)
        params = {"pallas": {"sid": sid, "load": {
            "epoch": epoch, "prefix_len": inb.prefix_len, "first_block": first,
            "last_block": last, "deadline": now + self.cfg.resume_deadline_s}}}
        claim_fut = asyncio.get_running_loop().create_future()
        self._claims[(sid, epoch)] = claim_fut
        inb.claim = claim_fut
        self.engine.start(session, kv_transfer_params=params)
        self._spawn(self._release_after_first_token(inb, session), f"drop-{sid}-{epoch}")
        reused = 0
        try:
            claim = await asyncio.wait_for(asyncio.shield(claim_fut),
                                           self.cfg.resume_deadline_s + self.cfg.claim_wait_s)
            reused = int(claim["local"]) + int(claim["external"])
            session.reused_tokens = reused
            session.info["claim"] = claim
        except asyncio.TimeoutError:
            log.warning("no_claim_report", session=sid, epoch=epoch)
        finally:
            self._claims.pop((sid, epoch), None)
        claim_info = session.info.get("claim") or {}
        log.info("resumed", session=sid, epoch=epoch, n_tokens=n, reused=reused,
                 blocks_in=inb.blocks_in, rejected=inb.blocks_rejected,
                 warmup_wait_s=round(warm_s, 4), claim_s=round(time.time() - now, 4),
                 blocks_wait_s=claim_info.get("waited_s"))
        return pallas_pb2.SyncReply(status=S.STATUS_OK, reused_tokens=reused,
                                    blocks_received=inb.blocks_in, bytes_received=inb.bytes_in)

    async def _release_after_first_token(self, inb: Inbound, session: Session) -> None:
        """Buffered blocks are loaded before the first token: release them then."""
        try:
            await session.wait_tokens(session.resumed_from)
        finally:
            await self._drop_inbound(inb, "resumed")

    def _on_claim(self, hdr: dict[str, Any]) -> None:
        fut = self._claims.get((str(hdr.get("sid", "")), int(hdr.get("epoch", -1))))
        if fut is not None and not fut.done():
            fut.set_result(hdr)

    def _on_loaded(self, hdr: dict[str, Any]) -> None:
        inb = self.inbound.get(hdr.get("sid", ""))
        if inb is not None and inb.epoch == int(hdr.get("epoch", -1)):
            inb.loaded = hdr
        s = self.sessions.get(hdr.get("sid", ""))
        if s is not None:
            s.info["loaded"] = hdr

    async def _drop_inbound(self, inb: Inbound, reason: str) -> int:
        if self.inbound.get(inb.session_id) is inb:
            self.inbound.pop(inb.session_id, None)
        await cancel_and_wait(inb.warmup)
        inb.state = "released"
        n = self.hub.drop(inb.session_id) if self.hub.store.epoch(inb.session_id) is not None \
            and self.hub.store.epoch(inb.session_id) <= inb.epoch else 0
        log.info("inbound_released", session=inb.session_id, epoch=inb.epoch, blocks=n,
                 reason=reason)
        return n

    async def on_release(self, req: pallas_pb2.ReleaseRequest) -> pallas_pb2.ReleaseReply:
        """Drop everything held for (session, epoch): blocks, buffers, the prefix warm-up."""
        sid, epoch = req.session_id, req.epoch
        newest = self._newest_in.get(sid, -1)
        if epoch < newest:
            return pallas_pb2.ReleaseReply(status=S.STATUS_STALE_EPOCH,
                                           message=f"newest epoch is {newest}")
        self._newest_in[sid] = max(newest, epoch)
        inb = self.inbound.get(sid)
        if inb is None or inb.state == "resumed":
            return pallas_pb2.ReleaseReply(status=S.STATUS_OK, message="nothing held")
        n = await self._drop_inbound(inb, req.reason or "released")
        return pallas_pb2.ReleaseReply(status=S.STATUS_OK, blocks_released=n)

    # ------------------------------------------------------------------ accounting
    def held(self) -> dict[str, int]:
        """What this agent holds for migrations (the cancel/kill tests check it returns to 0)."""
        return {"inbound": len(self.inbound), "outbound": len(self.outbound),
                "blocks": self.hub.store.num_blocks, "bytes": self.hub.store.num_bytes,
                "streams_queued": sum(o.stream.queued for o in self.outbound.values()
                                      if o.stream is not None)}

    async def close(self) -> None:
        """Abandon every outbound attempt, drop every inbound one, close peer channels."""
        for out in list(self.outbound.values()):
            self.hub.stop_export(out.session.session_id)
            if out.stream is not None:
                out.stream.abort()
        self.outbound.clear()
        for inb in list(self.inbound.values()):
            await self._drop_inbound(inb, "agent closing")
        for t in list(self._bg):
            t.cancel()
        await self.peers.close()
