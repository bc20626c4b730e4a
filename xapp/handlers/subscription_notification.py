"""submgr's notification (HTTP POST /ric/v1/subscriptions/response) into the E2 subscription
ledger."""

from __future__ import annotations

from xapp.e2.subscription import SubscriptionLedger


class SubscriptionNotificationHandler:
    """``handler(body)``: the parsed JSON body to :meth:`SubscriptionLedger.notify`; returns
    what it returns. Raises ValueError for a malformed body (the HTTP server answers 400)."""

    def __init__(self, ledger: SubscriptionLedger) -> None:
        self.ledger = ledger

    def __call__(self, body: object) -> int:
        return self.ledger.notify(body)
