"""RIC_INDICATION (12050): one E2 indication into the control loop."""

from __future__ import annotations

from xapp.control import ControlLoop
from xapp.e2.transport import RmrMessage


class IndicationHandler:
    """Hands the indication's payload, E2 node (RMR MEID), receipt time (Unix s; None when the
    message carries none) and subscription id to :meth:`ControlLoop.on_indication`."""

    def __init__(self, control: ControlLoop) -> None:
        self.control = control

    def __call__(self, msg: RmrMessage) -> None:
        self.control.on_indication(msg.payload, msg.e2_node, msg.time if msg.time else None, msg.sub_id)
