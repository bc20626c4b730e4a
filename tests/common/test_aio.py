"""pallas_common.aio.cancel_and_wait."""

from __future__ import annotations

import asyncio

import pytest

from pallas_common.aio import cancel_and_wait


async def _slow_to_end(name: str, ended: list[str], end_s: float) -> None:
    """Sleeps until cancelled, then takes ``end_s`` to end (shielded) and records ``name``."""
    try:
        await asyncio.sleep(30)
    finally:
        await asyncio.shield(asyncio.sleep(end_s))
        ended.append(name)


def test_cancels_running_tasks_waits_for_them_and_drops_their_errors():
    async def run():
        ended = []

        async def raises_on_cancel():
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                raise RuntimeError("cleanup failed") from None

        done = asyncio.ensure_future(asyncio.sleep(0))
        await done
        a, b = asyncio.create_task(_slow_to_end("a", ended, 0.01)), asyncio.create_task(raises_on_cancel())
        await asyncio.sleep(0)
        await cancel_and_wait(a, None, b, done)
        assert ended == ["a"] and a.cancelled() and isinstance(b.exception(), RuntimeError)
        assert done.result() is None
    asyncio.run(run())


def test_a_caller_cancelled_while_it_waits_is_cancelled_and_the_tasks_still_end():
    async def run():
        ended = []
        tasks = [asyncio.create_task(_slow_to_end(n, ended, 0.05)) for n in "xy"]
        await asyncio.sleep(0)
        caller = asyncio.create_task(cancel_and_wait(*tasks))
        await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.sleep(0.2)
        assert sorted(ended) == ["x", "y"] and all(t.done() for t in tasks)
    asyncio.run(run())
