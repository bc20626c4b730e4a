"""asyncio helpers shared by the agent and the evaluation harness."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(*tasks: asyncio.Future | None) -> None:
    """Cancel every task in ``tasks`` that is still running, then wait until each has ended.

    ``None`` entries and finished tasks are skipped. Whatever a task raises on its way out
    (``CancelledError`` or its own error) is dropped: the caller is tearing it down. If the
    caller itself is cancelled while it waits, ``CancelledError`` propagates at once (the
    tasks have their cancellation already and end on their own).
    """
    live = [t for t in tasks if t is not None and not t.done()]
    if not live:
        return
    for t in live:
        t.cancel()
    await asyncio.wait(live)  # never cancels what it waits for
    for t in live:
        if not t.cancelled():
            t.exception()  # retrieved: asyncio does not log it as never retrieved
