"""Scheduler-side policy of the Pallas connector, free of vLLM types (unit-testable).

Each engine step it decides which KV blocks the worker copies out (source role: every block
that became full once, and the partial tail while the agent's export asks for it) and which
received blocks a resumed request claims and the worker copies in (target role: the longest
run contiguous from the local prefix-cache hit; ``None`` while an expected block is in flight
before the deadline; a missing, bad or evicted block ends the run and vLLM recomputes the
rest). The rules in full: docs/vllm.md §3.4; the vLLM class in ``agent.connector`` only
adapts vLLM's hooks to it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agent.connector.messages import (AgentCommand, Avail, Bad, Claim, Drop, Export, Message,
                                      Reset, Stop)


class SaveOp(NamedTuple):
    """Copy one KV block out of the engine (source): block ``idx`` of the session's sequence,
    in engine block ``block_id``, ``fill`` valid tokens, ``tail`` for a partial last block,
    ``computed`` tokens computed when copied."""

    sid: str
    epoch: int
    idx: int
    block_id: int
    fill: int
    tail: bool
    computed: int


class LoadOp(NamedTuple):
    """Load one received block into engine block ``block_id`` (target) for request ``req_id``:
    block ``idx`` with at least ``need`` valid tokens; ``sync``: before this step's forward, on
    the engine thread (a claim of at most ``SYNC_LOAD_MAX_BLOCKS`` blocks), else beside it."""

    req_id: str
    sid: str
    epoch: int
    idx: int
    block_id: int
    need: int
    sync: bool = False

IDLE_WAIT_S = 0.01  # how long a deferral may block the scheduler when nothing else runs
#: A claim of at most this many blocks is loaded synchronously: the worker copies them in before
#: the step's forward, so vLLM schedules the resumed request in the step that claims it. A larger
#: claim loads asynchronously (vLLM holds the request in WAITING_FOR_REMOTE_KVS until the worker
#: reports the load in ``get_finished``), which costs the request at least one more engine step
#: but never holds the residents' step for a bulk copy. Pallas's and ctHO's resumes claim 0-7
#: blocks (the streamed suffix and the tail), Full-Copy's the whole sequence (docs/vllm.md §3.2).
SYNC_LOAD_MAX_BLOCKS = 8


def pallas_params(kv_transfer_params: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``"pallas"`` entry of a request's kv_transfer_params, or None."""
    if not kv_transfer_params:
        return None
    p = kv_transfer_params.get("pallas")
    return p if isinstance(p, dict) and p.get("sid") else None


@dataclass
class _Export:
    epoch: int
    next_block: int
    stream: bool
    tail: bool
    start: int = 0


@dataclass
class _Avail:
    epoch: int
    blocks: dict[int, int] = field(default_factory=dict)  # index -> fill
    bad: set[int] = field(default_factory=set)


@dataclass
class _Plan:
    sid: str
    epoch: int
    first_block: int
    needs: list[int]  # need_fill per block from first_block
    sync: bool = False  # loaded before the step's forward (SYNC_LOAD_MAX_BLOCKS)


@dataclass
class ScheduledReq:
    """What the policy needs about one request scheduled in this step."""

    req_id: str
    computed_before: int          # num_computed_tokens before this step
    num_scheduled: int            # tokens scheduled this step
    block_ids: Callable[[], list[int]]  # the request's block table (first KV group)


class SchedulerPolicy:
    """Block bookkeeping of the scheduler-side connector (one per engine).

    Args:
        block_size: tokens per KV block (32 on vLLM CPU).
        report: sends a message to the agent (a :class:`Claim`); may be a no-op in tests.
        clock: wall clock in seconds (``time.time``), for the resume deadline.
        sync_max_blocks: claims of at most this many blocks load synchronously (0: none);
            ``SYNC_LOAD_MAX_BLOCKS`` by default.

    Raises:
        ValueError: ``block_size`` not positive or ``sync_max_blocks`` negative.
    """

    def __init__(self, block_size: int, report: Callable[[Message], None] | None = None,
                 clock: Callable[[], float] = time.time,
                 sync_max_blocks: int = SYNC_LOAD_MAX_BLOCKS) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        if sync_max_blocks < 0:
            raise ValueError(f"sync_max_blocks must be >= 0, got {sync_max_blocks}")
        self.bs = block_size
        self.sync_max_blocks = sync_max_blocks
        self._report = report or (lambda hdr: None)
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._exports: dict[str, _Export] = {}
        self._avail: dict[str, _Avail] = {}
        self._sid_of: dict[str, str] = {}          # req_id -> session id
        self._plans: dict[str, _Plan] = {}         # req_id -> load plan
        self._waiting_since: dict[str, float] = {}
        self._claimed: set[str] = set()            # req_ids that claimed once (no more waits)
        self._loads: list[LoadOp] = []             # armed by after_alloc, sent by build
        self._idle = True
        self.saves_emitted = 0
        self.loads_emitted = 0

    # ------------------------------------------------------------------ agent commands
    def on_command(self, cmd: AgentCommand) -> None:
        """Apply one decoded agent command (called from the link thread).

        Raises:
            TypeError: ``cmd`` is not an agent command (the link decodes and filters first).
        """
        with self._lock:
            if isinstance(cmd, Export):
                cur = self._exports.get(cmd.sid)
                if cur is not None and cur.epoch == cmd.epoch:
                    cur.next_block = min(cur.next_block, cmd.start_block)
                    cur.start = min(cur.start, cmd.start_block)
                    cur.stream, cur.tail = cmd.stream, cmd.tail
                else:
                    self._exports[cmd.sid] = _Export(cmd.epoch, cmd.start_block, cmd.stream,
                                                     cmd.tail, cmd.start_block)
            elif isinstance(cmd, Stop):
                self._exports.pop(cmd.sid, None)
            elif isinstance(cmd, (Avail, Bad)):
                cur = self._avail.get(cmd.sid)
                if cur is not None and cmd.epoch < cur.epoch:
                    return  # an old epoch's block: dropped
                if cur is None or cmd.epoch > cur.epoch:
                    cur = self._avail[cmd.sid] = _Avail(cmd.epoch)
                if isinstance(cmd, Avail):
                    cur.blocks[cmd.idx] = max(cmd.fill, cur.blocks.get(cmd.idx, 0))
                    cur.bad.discard(cmd.idx)
                else:
                    cur.blocks.pop(cmd.idx, None)
                    cur.bad.add(cmd.idx)
                self._changed.notify_all()
            elif isinstance(cmd, Drop):
                self._avail.pop(cmd.sid, None)
                self._changed.notify_all()
            elif isinstance(cmd, Reset):
                self._exports.clear()
                self._avail.clear()
                self._changed.notify_all()
            else:
                raise TypeError(f"not an agent command: {cmd!r}")

    def stats(self) -> dict[str, int]:
        """Counters for the scheduler side's hello (:class:`SchedHello` fields of those names)."""
        with self._lock:
            return {"exports": len(self._exports),
                    "avail_blocks": sum(len(a.blocks) for a in self._avail.values()),
                    "tracked_reqs": len(self._sid_of),
                    "saves_emitted": self.saves_emitted, "loads_emitted": self.loads_emitted}

    # ------------------------------------------------------------------ vLLM hooks
    def on_new_request(self, req_id: str, kv_transfer_params: dict[str, Any] | None) -> None:
        """Track a request that belongs to a Pallas session."""
        p = pallas_params(kv_transfer_params)
        if p is not None:
            self._sid_of[req_id] = str(p["sid"])

    def match(self, req_id: str, kv_transfer_params: dict[str, Any] | None, num_tokens: int,
              num_computed: int) -> int | None:
        """Tokens the received blocks add beyond the local hit ``num_computed`` (None = wait).

        Args:
            num_tokens: the request's tokens (n: prompt = everything so far at a resume).
            num_computed: block-aligned local prefix-cache hit, tokens.
        """
        p = pallas_params(kv_transfer_params)
        load = None if p is None else p.get("load")
        if not load:
            return 0
        sid, epoch = str(p["sid"]), int(load["epoch"])
        end = num_tokens - 1  # KV needed for positions [0, n-1); the last token is recomputed
        first_exp = int(load.get("first_block", 0))
        last_exp = int(load.get("last_block", -1))
        deadline = float(load.get("deadline", 0.0))
        bs = self.bs
        with self._lock:
            av = self._avail.get(sid)
            blocks = dict(av.blocks) if av is not None and av.epoch == epoch else {}
            bad = set(av.bad) if av is not None and av.epoch == epoch else set()
        j = num_computed // bs
        cover = num_computed
        needs: list[int] = []
        wait = False
        while cover < end:
            need = min(bs, end - j * bs)
            fill = blocks.get(j)
            if fill is not None and fill >= need:
                needs.append(need)
                cover = j * bs + need
                j += 1
                continue
            if first_exp <= j <= last_exp and j not in bad and self._clock() < deadline \
                    and req_id not in self._claimed:
                wait = True
            break
        if wait:
            self._waiting_since.setdefault(req_id, self._clock())
            if self._idle:
                # Nothing else runs: block briefly for the next arrival instead of letting the
                # engine loop spin.
                with self._lock:
                    self._changed.wait(IDLE_WAIT_S)
            return None
        ext = max(0, cover - num_computed)
        if ext > 0:
            self._plans[req_id] = _Plan(sid, epoch, num_computed // bs, needs,
                                        len(needs) <= self.sync_max_blocks)
        else:
            self._plans.pop(req_id, None)
        waited = self._clock() - self._waiting_since.pop(req_id, self._clock())
        self._claimed.add(req_id)
        self._report(Claim(sid, epoch, int(num_computed), int(ext), int(num_tokens),
                           round(max(0.0, waited), 6), tuple(sorted(bad))))
        return ext

    def loads_async(self, req_id: str) -> bool:
        """Whether the claim :meth:`match` just made for ``req_id`` loads asynchronously (False
        for a small claim, loaded before the step's forward, and for no claim)."""
        plan = self._plans.get(req_id)
        return plan is not None and not plan.sync

    def after_alloc(self, req_id: str, num_external_tokens: int, block_ids: list[int]) -> None:
        """vLLM allocated ``block_ids`` (the request's block table, first KV group) for the
        request: if it claimed tokens, its loads go out with this step's :meth:`build`, flagged
        ``sync`` for a small claim (vLLM schedules the request in this step), else asynchronous
        (vLLM holds it in WAITING_FOR_REMOTE_KVS until the worker reports them in,
        docs/vllm.md §3.2)."""
        plan = self._plans.pop(req_id, None)
        if plan is None or num_external_tokens <= 0:
            return
        for k, need in enumerate(plan.needs):
            j = plan.first_block + k
            if j < len(block_ids):
                self._loads.append(LoadOp(req_id, plan.sid, plan.epoch, j, block_ids[j], need,
                                          plan.sync))

    def build(self, scheduled: list[ScheduledReq], *,
              engine_idle: bool | None = None) -> tuple[list[SaveOp], list[LoadOp]]:
        """Saves and loads for this step (call once per step, before vLLM advances counters).

        ``engine_idle``: the step scheduled no token at all (default: ``not scheduled``); only
        then may a deferral in :meth:`match` block the scheduler thread briefly.
        """
        self._idle = (not scheduled) if engine_idle is None else engine_idle
        with self._lock:
            return self._build_locked(scheduled)

    def _build_locked(self, scheduled: list[ScheduledReq]) -> tuple[list[SaveOp], list[LoadOp]]:
        saves: list[SaveOp] = []
        loads, self._loads = self._loads, []
        bs = self.bs
        exports = self._exports
        for sr in scheduled:
            sid = self._sid_of.get(sr.req_id)
            exp = None if sid is None else exports.get(sid)
            if exp is None:
                continue
            computed = sr.computed_before + sr.num_scheduled
            full = computed // bs
            ids = None
            if exp.stream and exp.next_block < full:
                ids = sr.block_ids()
                while exp.next_block < min(full, len(ids)):
                    j = exp.next_block
                    saves.append(SaveOp(sid, exp.epoch, j, ids[j], bs, False, computed))
                    exp.next_block += 1
            rem = computed - full * bs
            if exp.tail and rem > 0 and full >= exp.start:
                ids = ids if ids is not None else sr.block_ids()
                if full < len(ids):
                    saves.append(SaveOp(sid, exp.epoch, full, ids[full], rem, True, computed))
        self.saves_emitted += len(saves)
        self.loads_emitted += len(loads)
        return saves, loads

    def finished(self, req_id: str) -> None:
        """The request finished or was aborted: forget it."""
        self._sid_of.pop(req_id, None)
        self._plans.pop(req_id, None)
        self._waiting_since.pop(req_id, None)
        self._claimed.discard(req_id)
