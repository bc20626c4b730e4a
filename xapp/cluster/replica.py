"""This replica's part in a scale-out of the xApp (issue 46, docs/scale-out.md §6): the live
wiring of :class:`xapp.cluster.leases.NodeLeases`.

:class:`ClusterReplica` runs the heartbeat on its own thread (ricsdl's locks keep their token per
thread, so every claim, renewal and release happens there), keeps the E2 subscriptions equal to
the nodes this replica owns (``SubscriptionManager.sync(config, owned=...)``, once per change of
the owned set, on a second thread: a subscription call waits for submgr, up to its timeout, and
the first one encodes with the E2SM codecs, seconds on a busy machine; on the heartbeat thread
that wait would let the leases run out between renewals), admits an indication only from an owned E2 node (the others are dropped and
counted: during a hand-over the subscription manager may still deliver a node's indications to
its old owner, since it merges identical subscriptions) and exports the lease counters as
Prometheus metrics.

    start:             nodes := source.nodes() (before the first heartbeat)
    heartbeat thread:  NodeLeases.heartbeat() --wakes--> subscriber thread
    subscriber thread: every refresh_s: nodes := source.nodes() (None: kept);
                       owned set changed --> subscriptions.sync(config, owned)
    RMR thread:        RIC_INDICATION --admit(MEID)--> control loop | dropped, counted
    reconfigure:       no source: nodes := config.e2_nodes; subscriptions.sync(config, owned)

The shared E2 nodes come from a :class:`xapp.cluster.nodes.NodeSource` (the RIC's nodes: the
trace's in test mode, e2mgr's live; docs/scale-out.md §2), named as the indications' MEIDs;
without one, from the configuration (``XappConfig.e2_nodes``), as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import structlog

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from xapp.cluster.leases import Heartbeat
    from xapp.cluster.nodes import NodeSource
    from xapp.config import XappConfig
    from xapp.ports import SubscriptionPort

log = structlog.get_logger("pallas.xapp.cluster")

__all__ = ["ClusterReplica", "LeaseStore"]


class LeaseStore(Protocol):
    """What :class:`ClusterReplica` needs of :class:`xapp.cluster.leases.NodeLeases` (a test's
    fake fits by shape): ``me`` (the replica id), ``nodes`` (the E2 nodes shared),
    ``counters`` (claims, releases, losses, records_handed_over, cas_conflicts,
    writes_refused {reason: n}), ``heartbeat`` / ``stop`` (one thread), ``owns`` / ``owned``
    (any thread)."""

    me: str
    nodes: tuple[str, ...]
    counters: Any

    def heartbeat(self) -> Heartbeat: ...

    def stop(self) -> tuple[str, ...]: ...

    def owns(self, node: str) -> bool: ...

    def owned(self) -> tuple[str, ...]: ...


class ClusterReplica:
    """The heartbeat, subscriptions and indication admission of one replica (module docstring).

    Args:
        leases: this replica's :class:`~xapp.cluster.leases.NodeLeases` (or a fake).
        heartbeat_s: heartbeat period (s; ``controls.cluster.heartbeat_s``).
        registry: a prometheus-client registry to export the metrics on (:meth:`collect`), or None.
        clock: monotonic clock (s) pacing the heartbeat.
        nodes: where the shared E2 node set comes from (:class:`xapp.cluster.nodes.NodeSource`),
            read at :meth:`start` and every ``refresh_s`` on the subscriber thread; None: the
            configuration's ``e2_nodes``, set by :meth:`follow`.
        refresh_s: how often ``nodes`` is read again (s, > 0).

    :meth:`attach` (by :class:`xapp.app.PallasXapp`) gives it the configuration in force and the
    subscription manager; :meth:`start` / :meth:`stop` run and end the heartbeat thread.
    """

    #: distinct E2 nodes counted by name in :attr:`dropped`; the rest as "other"
    MAX_DROPPED_NODES = 1024

    def __init__(self, leases: LeaseStore, *, heartbeat_s: float,
                 registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 nodes: NodeSource | None = None, refresh_s: float = 10.0) -> None:
        if not heartbeat_s > 0:
            raise ValueError(f"heartbeat_s {heartbeat_s} must be > 0")
        if not refresh_s > 0:
            raise ValueError(f"refresh_s {refresh_s} must be > 0")
        self.source = nodes
        self.refresh_s = float(refresh_s)
        self.node_refreshes = 0                 # reads of the source that changed the set
        self._next_refresh = float("-inf")
        self.leases = leases
        self.heartbeat_s = float(heartbeat_s)
        self.clock = clock
        self.dropped: dict[str, int] = {}       # E2 node (or "other") -> indications dropped
        self.heartbeats = 0
        self.heartbeat_failures = 0
        self.resyncs = 0                        # subscriptions.sync calls for a new owned set
        #: the replica's ``xapp.cluster.arrivals.ArrivalRelay`` (set by the xApp), for metrics
        self.relay: Any = None
        #: called with every heartbeat SDL answered, on the heartbeat thread (set by the xApp:
        #: its ``lease`` events); an exception there is logged, never raised
        self.on_beat: Callable[[Heartbeat], None] | None = None
        self._config: Callable[[], XappConfig] | None = None
        self._subscriptions: SubscriptionPort | None = None
        self._synced: frozenset[str] | None = None   # the owned set the subscriptions follow
        self._sync_mu = threading.Lock()
        self._stop = threading.Event()
        self._first = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._subscriber: threading.Thread | None = None
        if registry is not None:
            registry.register(self)

    @property
    def replica_id(self) -> str:
        return self.leases.me

    # -- wiring -----------------------------------------------------------------------------------
    def attach(self, config: Callable[[], XappConfig],
               subscriptions: SubscriptionPort | None) -> None:
        """``config()``: the configuration in force (read at each resync); ``subscriptions``:
        the subscription manager (live mode) or None (test mode: no submgr)."""
        self._config, self._subscriptions = config, subscriptions

    def admit(self, e2_node: str) -> bool:
        """Whether an indication from ``e2_node`` (its RMR MEID) is this replica's to handle:
        it holds the node's lease now. Otherwise the indication is counted in :attr:`dropped`
        (an empty MEID names no node and is dropped too) and logged on the node's first and
        every 1000th drop."""
        if e2_node and self.leases.owns(e2_node):
            return True
        key = e2_node
        if key not in self.dropped and len(self.dropped) >= self.MAX_DROPPED_NODES:
            key = "other"
        n = self.dropped[key] = self.dropped.get(key, 0) + 1
        if n == 1 or n % 1000 == 0:
            log.info("indication_not_owned", replica=self.replica_id, e2_node=e2_node, count=n)
        return False

    def follow(self, config: XappConfig) -> None:
        """A new configuration (descriptor reload, A1): without a node source, share its E2
        nodes from the next heartbeat (nodes no longer configured are given up then); make the
        subscriptions those of ``config`` at the nodes owned now."""
        if self.source is None:
            self.leases.nodes = tuple(sorted(set(config.e2_nodes)))
        self.sync_subscriptions(config, force=True)

    def refresh_nodes(self, *, force: bool = False) -> bool:
        """Read the node source (when one is given and ``refresh_s`` has passed since the last
        read, or ``force``) and share its set from the next heartbeat (nodes gone from it are
        given up then). Never on the RMR thread: the source may block up to its timeout.
        Returns whether the set changed; a source that does not know (None) or fails keeps it."""
        if self.source is None:
            return False
        now = self.clock()
        if not force and now < self._next_refresh:
            return False
        self._next_refresh = now + self.refresh_s
        try:
            got = self.source.nodes()
        except Exception as e:
            log.error("node_source_failed", replica=self.replica_id, error=repr(e))
            return False
        if got is None or tuple(got) == tuple(self.leases.nodes):
            return False
        log.info("shared_nodes", replica=self.replica_id, nodes=len(got),
                 added=len(set(got) - set(self.leases.nodes)),
                 removed=len(set(self.leases.nodes) - set(got)))
        self.leases.nodes = tuple(got)
        self.node_refreshes += 1
        return True

    def sync_subscriptions(self, config: XappConfig | None = None, *, force: bool = False) -> bool:
        """Sync the subscriptions with the nodes owned now (``config``: default the one in
        force) when the owned set differs from the one last synced, or ``force``. Returns
        whether it synced. Errors of the subscription manager are logged, never raised (the
        next change or heartbeat tries again)."""
        with self._sync_mu:
            owned = frozenset(self.leases.owned())
            if not force and owned == self._synced:
                return False
            if self._subscriptions is not None:
                cfg = config if config is not None else (self._config() if self._config else None)
                if cfg is None:
                    return False
                try:
                    self._subscriptions.sync(cfg, owned=owned)
                except Exception as e:
                    log.error("subscriptions_not_synced", replica=self.replica_id, error=repr(e))
                    return False
                if owned != self._synced:
                    self.resyncs += 1
            self._synced = owned
            return True

    # -- the heartbeat ----------------------------------------------------------------------------
    def beat(self) -> Heartbeat | None:
        """One heartbeat (on the heartbeat thread): ``NodeLeases.heartbeat``, then the
        subscriptions synced if the owned set changed (leases lost by this replica's clock
        while SDL did not answer included): by the subscriber thread once :meth:`start` ran,
        else here. Returns the heartbeat, None when SDL failed (counted in
        :attr:`heartbeat_failures`, logged)."""
        hb = None
        try:
            hb = self.leases.heartbeat()
            self.heartbeats += 1
        except Exception as e:   # SDL unreachable: leases run out by this replica's clock
            self.heartbeat_failures += 1
            log.error("heartbeat_failed", replica=self.replica_id, error=repr(e))
        if hb is not None and self.on_beat is not None:
            try:
                self.on_beat(hb)
            except Exception as e:
                log.error("on_beat_failed", replica=self.replica_id, error=repr(e))
        if self._subscriber is not None:
            self._wake.set()
        else:
            self.sync_subscriptions()
        return hb

    def start(self, wait_s: float | None = None) -> None:
        """Start the heartbeat and subscriber threads; wait for the first heartbeat (up to
        ``wait_s``, default one heartbeat period) so that a replica owns its share of the
        unowned nodes before its transport starts."""
        if self._thread is not None or self._stop.is_set():
            return
        self.refresh_nodes(force=True)
        self._subscriber = threading.Thread(target=self._subscribe_loop,
                                            name=f"cluster-subs-{self.replica_id}", daemon=True)
        self._subscriber.start()
        self._thread = threading.Thread(target=self._run, name=f"cluster-{self.replica_id}",
                                        daemon=True)
        self._thread.start()
        self._first.wait(self.heartbeat_s if wait_s is None else wait_s)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                t0 = self.clock()
                self.beat()
                self._first.set()
                self._stop.wait(max(0.0, self.heartbeat_s - (self.clock() - t0)))
        finally:
            self._give_up()

    def _subscribe_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if not self._stop.is_set():
                self.refresh_nodes()
                self.sync_subscriptions()

    def _give_up(self) -> None:
        try:
            nodes = self.leases.stop()
        except Exception as e:
            log.error("leases_not_released", replica=self.replica_id, error=repr(e))
            return
        log.info("leases_released", replica=self.replica_id, nodes=len(nodes))

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the heartbeat and give up every lease (on the heartbeat thread, which holds the
        locks' tokens), so the other replicas take the nodes at their next heartbeat. The
        subscriptions are the caller's to delete (``SubscriptionManager.delete_all``), after
        this returns: no heartbeat subscribes again. Idempotent."""
        self._stop.set()
        self._wake.set()
        for th in (self._thread, self._subscriber):    # None: never started, nothing was held
            if th is not None and th is not threading.current_thread():
                th.join(timeout_s)
                if th.is_alive():
                    log.warning("cluster_thread_still_running", thread=th.name, waited_s=timeout_s)

    # -- metrics ----------------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        """The replica's lease and admission counters as a prometheus-client collector (read
        at scrape time): ``pallas_xapp_cluster_nodes_owned``,
        ``pallas_xapp_cluster_lease_changes_total{change=claimed|released|lost}``,
        ``pallas_xapp_cluster_records_handed_over_total``,
        ``pallas_xapp_cluster_cas_conflicts_total``,
        ``pallas_xapp_cluster_session_writes_refused_total{reason}``,
        ``pallas_xapp_cluster_indications_not_owned_total{e2_node}``,
        ``pallas_xapp_cluster_heartbeat_failures_total``,
        ``pallas_xapp_cluster_subscription_resyncs_total``,
        ``pallas_xapp_cluster_arrivals_total{way}`` (with a relay)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        c = self.leases.counters
        yield GaugeMetricFamily("pallas_xapp_cluster_nodes_owned",
                                "E2 nodes whose lease this replica holds", value=len(self.leases.owned()))
        changes = CounterMetricFamily("pallas_xapp_cluster_lease_changes",
                                      "E2 node leases claimed, given up and lost", labels=["change"])
        for label, v in (("claimed", c.claims), ("released", c.releases), ("lost", c.losses)):
            changes.add_metric([label], v)
        yield changes
        yield CounterMetricFamily("pallas_xapp_cluster_records_handed_over",
                                  "session records taken over from another replica",
                                  value=c.records_handed_over)
        yield CounterMetricFamily("pallas_xapp_cluster_cas_conflicts",
                                  "session-record compare-and-sets lost to another writer",
                                  value=c.cas_conflicts)
        refused = CounterMetricFamily("pallas_xapp_cluster_session_writes_refused",
                                      "session-record writes refused, by reason", labels=["reason"])
        for reason, v in sorted(dict(c.writes_refused).items()):
            refused.add_metric([reason], v)
        yield refused
        dropped = CounterMetricFamily("pallas_xapp_cluster_indications_not_owned",
                                      "RIC indications dropped: their E2 node is not this "
                                      "replica's", labels=["e2_node"])
        for node, v in sorted(dict(self.dropped).items()):
            dropped.add_metric([node], v)
        yield dropped
        if self.relay is not None:
            arrivals = CounterMetricFamily("pallas_xapp_cluster_arrivals",
                                           "UE arrivals by what became of them: forwarded to "
                                           "the records' owner, received from another replica, "
                                           "unanswered or failed (decided here after the wait or "
                                           "at once), owner_gone (no live owner)", labels=["way"])
            for way, v in sorted(dict(self.relay.counts).items()):
                arrivals.add_metric([way], v)
            yield arrivals
        yield CounterMetricFamily("pallas_xapp_cluster_heartbeat_failures",
                                  "heartbeats that SDL did not answer", value=self.heartbeat_failures)
        yield CounterMetricFamily("pallas_xapp_cluster_subscription_resyncs",
                                  "E2 subscription syncs for a new set of owned nodes",
                                  value=self.resyncs)
