"""Turns: batch sections that are ready together run one per pass of the event loop, so a light
request that becomes ready during the first runs before the second, not after all of them."""

from __future__ import annotations

import asyncio

from lakebroker.ingest_api.turns import Turns


async def test_a_light_task_runs_between_two_batches_ready_together() -> None:
    turns, order = Turns(), []

    async def light() -> None:
        order.append("single")

    async def batch(name: str) -> None:
        await turns.wait()
        order.append(name)
        if name == "batch-1":  # a single-message request arrives while the first batch holds the loop
            asyncio.get_running_loop().create_task(light())

    await asyncio.gather(*(batch(f"batch-{i}") for i in range(1, 4)))
    await asyncio.sleep(0)
    assert order == ["batch-1", "single", "batch-2", "batch-3"]


async def test_a_cancelled_waiter_passes_its_turn_on() -> None:
    turns, order = Turns(), []

    async def batch(name: str) -> None:
        await turns.wait()
        order.append(name)

    first, second, third = (asyncio.create_task(batch(n)) for n in ("a", "b", "c"))
    await asyncio.sleep(0)  # all three wait
    second.cancel()
    await asyncio.gather(first, third)
    assert order == ["a", "c"] and second.cancelled()
