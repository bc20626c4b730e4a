"""What the migration engine owns and its two roles share: one :class:`Context` per agent.

:class:`agent.migration.migration_engine.MigrationEngine` builds it and composes the source role
(:class:`agent.migration.source.Source`) and the target role
(:class:`agent.migration.target.Target`) over it; neither role imports the engine or the other.
Tests replace a part of it (the peers, the vLLM client) with a fake (tests/faults.py,
tests/agent/migration/fakes.py) instead of overriding a role's methods.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable

import structlog
from pallas_proto import pallas_pb2

from agent.ipc import BlockHub
from agent.migration.attempts import Attempts, Inbound
from agent.session import Session, SessionStore, VllmClient
from agent.transfer import PeerPool

log = structlog.get_logger("pallas.agent.migration")
S = pallas_pb2


@dataclasses.dataclass
class MigrationConfig:
    """Knobs of the migration engine (seconds unless noted; agent/app.py sets them from flags).

    Attributes:
        commit_deadline_s: the longest a commit keeps the session frozen at the source.
        bridge_max_s: a bridging commit (``pallas-bridge``): the longest the source decodes on,
            relayed by the new agent, waiting for the target to hold the state; then it hands
            over what the target holds (the rest is recomputed there).
        bridge_poll_s: how often a bridging commit asks the target's progress.
        rpc_timeout_s: deadline of Prepare and of the stream's final ack.
        release_timeout_s: deadline of the best-effort Release on cancel/failure.
        warmup_timeout_s: target: upper bound of Sync's wait for the prefix warm-up.
        resume_deadline_s: target: how long a resumed request waits for blocks in flight.
        claim_wait_s: target: extra wait for the connector's claim report.
        lease_s: target: the lease of an admitted attempt; it expires when no message of the
            attempt came from its source for this long (the source renews every third of it).
        max_inbound_session_bytes / max_inbound_bytes: target: buffered KV bounds, bytes.
        link_rate_mbps: per-peer token-bucket limit on block streams (None = unlimited).
        c_sync_s: c, the expected Sync cost in the commit-time choice.
        relay_hop_s: Detour's expected relay hop (reported in the choice).
        default_prefill_rate: r_p, tokens/s, when nothing was measured yet.
        default_scheme: scheme when neither the call nor the session names one.
        max_ledger: (session, epoch) entries remembered (oldest forgotten first).
    """

    commit_deadline_s: float = 10.0
    bridge_max_s: float = 8.0
    bridge_poll_s: float = 0.02
    rpc_timeout_s: float = 10.0
    release_timeout_s: float = 5.0
    warmup_timeout_s: float = 60.0
    resume_deadline_s: float = 5.0
    claim_wait_s: float = 5.0
    lease_s: float = 10.0
    max_inbound_session_bytes: int = 1 << 30
    max_inbound_bytes: int = 4 << 30
    link_rate_mbps: float | None = None
    c_sync_s: float = 0.01
    relay_hop_s: float = 0.005
    default_prefill_rate: float = 5000.0
    default_scheme: int = S.SCHEME_PALLAS
    max_ledger: int = 10_000


@dataclasses.dataclass
class Entry:
    """The ledger's record of one (session, epoch): its closure and its calls' replies."""

    closed: str = ""  # "" | "cancelled" | "committed"
    # PeerTransfer addresses of targets a targeted Cancel dropped from the epoch (issue 45):
    # a Trigger naming one of them again under this epoch is refused
    dropped: set[str] = dataclasses.field(default_factory=set)
    replies: dict[str, asyncio.Future] = dataclasses.field(default_factory=dict)


class Ledger:
    """Epochs per session, bounded (least recently used forgotten first; docs/model.md §5).

    ``newest(sid)``: the newest epoch a Control call named (source side); ``newest_in(sid)``:
    the newest a peer named (target side); ``entry(sid, epoch)``: the per-attempt record.
    """

    def __init__(self, max_entries: int = 10_000) -> None:
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[tuple[str, int], Entry] = collections.OrderedDict()
        self._newest: collections.OrderedDict[tuple[str, str], int] = collections.OrderedDict()

    def _bump(self, d: collections.OrderedDict, key, value=None):
        if value is not None:
            d[key] = value
        d.move_to_end(key)
        while len(d) > self.max_entries:
            d.popitem(last=False)

    def entry(self, sid: str, epoch: int) -> Entry:
        e = self._entries.get((sid, epoch))
        if e is None:
            e = Entry()
        self._bump(self._entries, (sid, epoch), e)
        return e

    def newest(self, sid: str) -> int:
        return self._newest.get((sid, "out"), 0)

    def see(self, sid: str, epoch: int) -> None:
        self._bump(self._newest, (sid, "out"), max(self.newest(sid), epoch))

    def newest_in(self, sid: str) -> int:
        return self._newest.get((sid, "in"), -1)

    def see_in(self, sid: str, epoch: int) -> None:
        self._bump(self._newest, (sid, "in"), max(self.newest_in(sid), epoch))

    def forget(self, sid: str) -> None:
        for k in [k for k in self._entries if k[0] == sid]:
            del self._entries[k]
        self._newest.pop((sid, "out"), None)
        self._newest.pop((sid, "in"), None)

    def __len__(self) -> int:
        return len(self._entries) + len(self._newest)


@dataclasses.dataclass(eq=False)
class Context:
    """The state the migration engine owns, shared by its source and target roles.

    Attributes:
        agent_id: this agent's id; peer_address: ``host:port`` of its PeerTransfer service
            ("" until the service is bound; agent/app.py sets it then).
        sessions: the agent's sessions.
        vllm_client: client of the local vLLM server (:class:`agent.session.VllmClient`).
        hub: the local channel to the connector (blocks, claims, KV-pool stats).
        identity: returns this server's ModelIdentity.
        cfg: :class:`MigrationConfig`.
        peers: per-peer clients (:class:`agent.transfer.PeerPool`, or a wrapper of one).
        ledger: the epochs (:class:`Ledger`).
        outbound: the source attempts (:class:`agent.migration.attempts.Attempts` of
            :class:`agent.migration.attempts.Outbound`), per session and target.
        inbound: session id -> its target attempt (:class:`agent.migration.attempts.Inbound`).
        prefill_rate: r_p measured at this agent, tokens/s (0: none yet); observe_prefill:
            ``(tokens, seconds)`` of each warm-up run here as a target (agent/app.py: the scraper).
    """

    agent_id: str
    peer_address: str
    sessions: SessionStore
    vllm_client: VllmClient
    hub: BlockHub
    identity: Callable[[], pallas_pb2.ModelIdentity]
    cfg: MigrationConfig
    peers: PeerPool
    ledger: Ledger
    outbound: Attempts = dataclasses.field(default_factory=Attempts)
    inbound: dict[str, Inbound] = dataclasses.field(default_factory=dict)
    prefill_rate: Callable[[], float] = lambda: 0.0
    observe_prefill: Callable[[int, float], None] = lambda tokens, seconds: None
    tasks: set[asyncio.Task] = dataclasses.field(default_factory=set)

    @property
    def endpoint(self) -> pallas_pb2.PeerEndpoint:
        """This agent's PeerEndpoint."""
        return pallas_pb2.PeerEndpoint(agent_id=self.agent_id, address=self.peer_address)

    @property
    def block_size(self) -> int:
        """Tokens per KV block of the local engine."""
        return int(self.identity().block_size)

    def spawn(self, coro, name: str) -> asyncio.Task:
        """Run ``coro`` in the background, held in ``tasks`` until done. A failure nobody awaits
        (a warm-up whose engine died before any Sync looked at it) is logged as
        ``background_task_failed`` and retrieved, not left to asyncio's "exception was never
        retrieved" at collection."""
        t = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(t)
        t.add_done_callback(self._task_done)
        return t

    def _task_done(self, t: asyncio.Task) -> None:
        self.tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.warning("background_task_failed", task=t.get_name(), error=repr(t.exception()))

    def reply(self, status: int, s: Session | str, epoch: int, *, message: str = "",
              split: int = 0, scheme: int = 0) -> pallas_pb2.ControlReply:
        """A ControlReply carrying the session's current state."""
        sid = s if isinstance(s, str) else s.session_id
        sess = self.sessions.get(sid)
        return pallas_pb2.ControlReply(status=status, message=message, session_id=sid,
                                       epoch=epoch, split_tokens=split, scheme=scheme,
                                       state=sess.state.proto if sess is not None else 0)
