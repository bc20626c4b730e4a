"""One handler per message kind the xApp receives, each in its own module:

    RIC_INDICATION (12050, RMR)             ric_indication.IndicationHandler
    A1_POLICY_REQ (20010, RMR)              a1_policy_request.A1Handler
    an agent's TelemetryReport (gRPC)       agent_telemetry.TelemetryHandler
    submgr's notification (HTTP POST)       subscription_notification.SubscriptionNotificationHandler

:class:`router.MessageRouter` hands each RMR message to the handler of its type and counts the
types it has none for. RIC_HEALTH_CHECK_REQ (100) never gets here: the RMR receive loop answers
it itself (:mod:`xapp.e2.rmrloop`). The composition root (:mod:`xapp.app`) builds them.
"""

from xapp.handlers.a1_policy_request import A1Handler
from xapp.handlers.agent_telemetry import TelemetryHandler
from xapp.handlers.ric_indication import IndicationHandler
from xapp.handlers.router import MessageRouter
from xapp.handlers.subscription_notification import SubscriptionNotificationHandler

__all__ = ["A1Handler", "IndicationHandler", "MessageRouter", "SubscriptionNotificationHandler",
           "TelemetryHandler"]
