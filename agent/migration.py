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

from pallas_proto import pallas_pb2

ShipBlocks = str  # "suffix" | "all" | "none"


class Migrator:
    """Runs migrations of this agent's sessions (source role) and accepts them (target role).

    Args:
        node: the agent's :class:`agent.node.AgentNode` (sessions, engine, block hub, identity,
            own PeerEndpoint, config).
    """

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
        session/target problems (status REJECTED/ERROR/UNKNOWN_SESSION instead).
        """
        raise NotImplementedError

    async def cancel(self, session_id: str, epoch: int,
                     reason: str = "") -> pallas_pb2.ControlReply:
        """Abandon the migration attempt of ``epoch`` (paper §4.3, step 4).

        The source stops streaming, sends Release to the target (which drops its buffered
        blocks and prefix warm-up), and the session goes back to ``serving``; its decoding
        never stops. Idempotent; a cancel for an epoch older than the newest is STALE_EPOCH,
        a cancel with no migration running answers OK with the current state.
        """
        raise NotImplementedError

    async def commit(self, session_id: str, epoch: int,
                     actual_target: pallas_pb2.PeerEndpoint, *,
                     split_tokens: int | None = None, ship_blocks: ShipBlocks = "suffix",
                     ship_tail: bool = True,
                     scheme: int = pallas_pb2.SCHEME_UNSPECIFIED) -> pallas_pb2.ControlReply:
        """Hand ``session_id`` over to ``actual_target`` at the HO (paper §4.3, step 3).

        The source freezes the session at its current output length n (tokens past n are no
        longer appended; the UE has what it has), makes sure the blocks to ship have left the
        engine, stops its request, and sends Sync: all n token ids, the tail block (if
        ``ship_tail`` and blocks are shipped), the remaining sampling parameters (reduced
        max_tokens/min_tokens). The target submits the resumed request (prompt = the n tokens)
        whose connector claims the prefix from the local prefix cache and the shipped blocks,
        so only the last token is recomputed.

        ``ship_blocks``: "suffix" (blocks from the split on that were not streamed yet),
        "all" (every block from 0), "none" (token ids only; the target recomputes past its
        prefix). ``split_tokens``: the prefix the target recomputes when no trigger prepared
        it (ctHO p; None = prepared split, or :func:`ctho_split` for an unprepared target).
        If ``actual_target`` differs from the prepared target, the prepared one is released and
        the actual one recovers as ctHO. Idempotent for a repeated (session_id, epoch).
        On any failure the source resumes serving the session itself (status ERROR).
        """
        raise NotImplementedError
