"""A1_POLICY_REQ (20010): an A1 policy instance created, updated or deleted."""

from __future__ import annotations

from typing import Callable

import structlog

from xapp.config import XappConfig
from xapp.e2.transport import A1_POLICY_RESP, RmrMessage
from xapp.ports import A1Port, Transport

log = structlog.get_logger("pallas.xapp.handlers.a1")


class A1Handler:
    """The A1 policy handler's answer goes back as A1_POLICY_RESP (20011, return to sender); a
    change of the configuration is applied by ``apply`` first (what it raises is logged: the
    answer is sent whatever happens to the change)."""

    def __init__(self, a1: A1Port, transport: Transport, apply: Callable[[XappConfig], None]) -> None:
        self.a1, self.transport, self.apply = a1, transport, apply

    def __call__(self, msg: RmrMessage) -> None:
        out = self.a1.process(msg.payload)
        if out.changed:     # applied before the answer, whatever happens to the answer
            try:
                self.apply(self.a1.config)
            except Exception:
                log.exception("a1_change_not_applied", policy_instance_id=out.policy_instance_id)
        self.transport.rts(msg, A1_POLICY_RESP, out.response)
