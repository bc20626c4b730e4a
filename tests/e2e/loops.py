"""An asyncio loop in a thread, so that sync e2e tests can drive long-lived async agents."""

from __future__ import annotations

import asyncio
import threading


class LoopThread:
    """An asyncio event loop running in a daemon thread; ``run(coro)`` waits for a result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 300.0):
        """Run ``coro`` on the loop and return its result (raises its error; TimeoutError)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Stop the loop and join its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
