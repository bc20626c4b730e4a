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
    every indication is handled. With ``admit``, :attr:`admitted` counts the indications
    handled per E2 node (the replay's check that no node's indication was lost, pallas_eval.failover)."""

    def __init__(self, control: ControlLoop, admit: Callable[[str], bool] | None = None) -> None:
        self.control = control
        self.admit = admit
        self.admitted: dict[str, int] = {}

    def __call__(self, msg: RmrMessage) -> None:
        if self.admit is not None:
            if not self.admit(msg.e2_node):
                return
            self.admitted[msg.e2_node] = self.admitted.get(msg.e2_node, 0) + 1
        self.control.on_indication(msg.payload, msg.e2_node, msg.time if msg.time else None, msg.sub_id)
