"""RIC_INDICATION (12050): one E2 indication into the control loop."""

from __future__ import annotations

from typing import Callable

from xapp.control import ControlLoop
from xapp.e2.transport import RmrMessage


class IndicationHandler:
    """Hands the indication's payload, E2 node (RMR MEID), receipt time (Unix s; None when the
    message carries none) and subscription id to :meth:`ControlLoop.on_indication`.

    ``admit``: with several replicas (docs/scale-out.md), ``admit(e2_node)`` says whether this
    replica owns the indication's E2 node (:meth:`xapp.cluster.replica.ClusterReplica.admit`,
    which counts what it refuses); a refused indication is dropped before it is decoded. None:
    every indication is handled."""

    def __init__(self, control: ControlLoop, admit: Callable[[str], bool] | None = None) -> None:
        self.control = control
        self.admit = admit

    def __call__(self, msg: RmrMessage) -> None:
        if self.admit is not None and not self.admit(msg.e2_node):
            return
        self.control.on_indication(msg.payload, msg.e2_node, msg.time if msg.time else None, msg.sub_id)
