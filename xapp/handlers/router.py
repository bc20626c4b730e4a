"""RMR messages to the handler of their type, and a count of the types without one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

import structlog

from xapp.e2.transport import RmrMessage

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

log = structlog.get_logger("pallas.xapp.handlers")

Handler = Callable[[RmrMessage], None]


class MessageRouter:
    """``router(msg)``: the handler of ``msg.mtype`` (:attr:`handlers`, RMR message type ->
    handler), never raising (a handler's exception is logged). A type without a handler is
    counted in :attr:`unknown_types` (type as text -> count; at most ``MAX_UNKNOWN_TYPES``
    distinct types, the rest as ``other``), logged on its first and every 1000th message, and
    exported on ``registry`` as ``pallas_xapp_unknown_messages_total{mtype}``."""

    MAX_UNKNOWN_TYPES = 64

    def __init__(self, handlers: dict[int, Handler] | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.handlers: dict[int, Handler] = dict(handlers or {})
        self.unknown_types: dict[str, int] = {}
        if registry is not None:
            registry.register(self)

    def __call__(self, msg: RmrMessage) -> None:
        handler = self.handlers.get(msg.mtype)
        if handler is None:
            key = str(msg.mtype)
            if key not in self.unknown_types and len(self.unknown_types) >= self.MAX_UNKNOWN_TYPES:
                key = "other"
            n = self.unknown_types[key] = self.unknown_types.get(key, 0) + 1
            if n == 1 or n % 1000 == 0:
                log.warning("rmr_message_type_unknown", mtype=msg.mtype, count=n, bytes=len(msg.payload))
            return
        try:
            handler(msg)
        except Exception as e:  # a bad message never stops the xApp
            log.error("message handling failed", mtype=msg.mtype, error=repr(e))

    def collect(self) -> Iterator[Metric]:
        """The unknown-type counts as a prometheus-client collector (read at scrape time)."""
        from prometheus_client.core import CounterMetricFamily
        c = CounterMetricFamily("pallas_xapp_unknown_messages", "RMR messages of a type the xApp has no "
                                "handler for, by type", labels=["mtype"])
        for k, v in list(self.unknown_types.items()):
            c.add_metric([k], v)
        yield c
