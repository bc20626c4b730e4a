"""Observability for the Pallas agent: structured JSON logs and Prometheus metrics.

Logs are structlog events, one JSON object per line; every record about a migration carries
``session``, ``epoch`` and ``peer``. Metrics are prometheus-client objects in the default
registry, SI units in their names; each metric's labels and meaning: docs/architecture.md §7.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any

import structlog
from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["configure_logging", "get_logger", "MIGRATIONS", "SIT_SECONDS", "COMMIT_SECONDS",
           "observe_resumed", "CONTROL_CALLS", "SESSIONS", "RELAYED_TOKENS",
           "SESSION_FAILURES", "BYTES_MOVED", "KV_BLOCKS_HELD", "LEASES_HELD", "LEASE_EVENTS",
           "WASTED_PREFILL_TOKENS", "CallbackCollector",
           "register_collector"]


def configure_logging(level: str = "INFO", *, json: bool = True, stream=None) -> None:
    """Configure structlog (and the stdlib root logger it feeds) once per process.

    Args:
        level: stdlib level name ("DEBUG", "INFO", ...).
        json: render one JSON object per line (production); False gives the console renderer.
        stream: where to write (default stderr).

    Calling it again reconfigures (tests use that to capture output).
    """
    lvl = logging.getLevelName(level.upper()) if isinstance(level, str) else int(level)
    if not isinstance(lvl, int):
        raise ValueError(f"unknown log level {level!r}")
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=stream or _StderrNow()),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=lvl, stream=stream or sys.stderr, format="%(message)s")
    for noisy in ("httpx", "httpcore"):  # one line per HTTP request (the vLLM scraper)
        logging.getLogger(noisy).setLevel(max(lvl, logging.WARNING))


class _StderrNow:
    """A file-like view of whatever ``sys.stderr`` is when a record is written (test runners
    and daemons swap it; a reference taken at configuration time can be closed later)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def get_logger(name: str = "pallas.agent", **initial: Any):
    """A structlog logger with ``component=name`` and any ``initial`` keys.

    Lazy: the logging configuration in force when a record is emitted applies, so module-level
    loggers created before :func:`configure_logging` still follow it."""
    return structlog.get_logger(name, component=name, **initial)


# ------------------------------------------------------------------ metrics (default registry)

MIGRATIONS = Counter(
    "pallas_migrations",
    "Migration control outcomes at this agent.",
    ["role", "scheme", "outcome"],
)
_GAP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 30, 60)
SIT_SECONDS = Histogram(
    "pallas_sit_seconds",
    "Target side of the handover gap: Sync arrival to the first token of the resumed request (s).",
    buckets=_GAP_BUCKETS,
)
COMMIT_SECONDS = Histogram(
    "pallas_commit_seconds", "Duration of a Commit at the source, by the scheme used (s).",
    ["scheme"], buckets=_GAP_BUCKETS,
)
CONTROL_CALLS = Counter(
    "pallas_control_calls",
    "xApp-facing Control calls by method and reply status.",
    ["method", "status"],
)
SESSIONS = Gauge("pallas_sessions", "UE sessions known to this agent, by state.", ["state"])
RELAYED_TOKENS = Counter(
    "pallas_relayed_tokens", "Tokens this agent relayed from another agent (Detour)."
)
SESSION_FAILURES = Counter(
    "pallas_session_failures",
    "Sessions that ended failed at this agent because their vLLM request failed.",
    ["role", "cause"],
)

LEASES_HELD = Gauge(
    "pallas_leases_held",
    "Target side: prepared migrations holding a KV lease here (admitted, not yet resumed or "
    "released).",
)
LEASE_EVENTS = Counter(
    "pallas_lease_events",
    "Target side: lease events (granted, renewed, committed, released, expired, evicted).",
    ["event"],
)
WASTED_PREFILL_TOKENS = Counter(
    "pallas_wasted_prefill_tokens",
    "Target side: prefix tokens prefilled for leases that ended without a commit (released, "
    "expired or evicted).",
)


class CallbackCollector(Collector):
    """A Prometheus collector whose samples come from a callback at scrape time.

    Used for figures that another module already accounts for (bytes moved per peer, KV
    blocks held), so nothing has to be double-counted or pushed.

    Args:
        name: metric family name (without the ``_total`` suffix for counters).
        doc: help text.
        kind: "counter" or "gauge".
        labels: label names.
        fn: returns an iterable of (label values tuple, value); exceptions are swallowed
            (a failing source yields no samples rather than breaking ``/metrics``).
    """

    def __init__(
        self,
        name: str,
        doc: str,
        kind: str,
        labels: Iterable[str],
        fn: Callable[[], Iterable[tuple[tuple[str, ...], float]]] | None = None,
    ) -> None:
        if kind not in ("counter", "gauge"):
            raise ValueError(f"kind must be counter or gauge, not {kind!r}")
        self.name, self.doc, self.kind, self.labels = name, doc, kind, list(labels)
        self.fn = fn

    def collect(self):
        family_cls = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        fam = family_cls(self.name, self.doc, labels=self.labels)
        if self.fn is not None:
            try:
                for values, v in self.fn():
                    fam.add_metric(list(values), float(v))
            except Exception:  # noqa: BLE001 - a scrape must not fail on a bad source
                pass
        yield fam

    def describe(self):
        return []


BYTES_MOVED = CallbackCollector(
    "pallas_bytes_moved",
    "KV bytes moved over the peer block stream, by peer and direction (sent/received).",
    "counter",
    ["peer", "direction"],
)
KV_BLOCKS_HELD = CallbackCollector(
    "pallas_kv_blocks_held", "KV blocks held for incoming migrations.", "gauge", []
)


def register_collector(c: CallbackCollector) -> None:
    """Register ``c`` in the default registry once (idempotent)."""
    try:
        REGISTRY.register(c)
    except ValueError:
        pass  # already registered


register_collector(BYTES_MOVED)
register_collector(KV_BLOCKS_HELD)


def observe_resumed(sessions: Iterable[Any]) -> int:
    """Record ``pallas_sit_seconds`` once for each session resumed here that has produced its
    first own token (attributes of :class:`agent.session.Session`: resumed_from, token_times,
    sit_observed). Returns how many were recorded now."""
    n = 0
    for s in sessions:
        k = getattr(s, "resumed_from", 0)
        if k <= 0 or s.sit_observed or len(s.token_times) <= k:
            continue
        s.sit_observed = True
        SIT_SECONDS.observe(max(0.0, s.token_times[k] - s.token_times[k - 1]))
        n += 1
    return n
