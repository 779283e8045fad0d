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


async def test_a_lone_caller_takes_its_turn_without_waiting_a_pass() -> None:
    turns, order = Turns(), []

    async def other() -> None:
        order.append("other")

    asyncio.get_running_loop().create_task(other())  # ready now: it runs in the next pass
    await turns.wait()
    order.append("batch")
    await asyncio.sleep(0)
    assert order == ["batch", "other"]


async def test_a_second_caller_in_the_same_pass_waits_for_the_next() -> None:
    turns, order = Turns(), []

    async def other() -> None:
        order.append("other")

    await turns.wait()  # taken at once: this pass's turn
    asyncio.get_running_loop().create_task(other())
    await turns.wait()  # the same pass: the next pass's turn, after what became ready meanwhile
    order.append("second batch")
    assert order == ["other", "second batch"]


async def test_no_two_turns_run_in_one_pass_when_the_queue_empties() -> None:
    """The last waiter granted runs in the pass after its grant; a caller arriving in that pass
    waits, though nobody is queued any more."""
    turns, runs = Turns(), []
    loop = asyncio.get_running_loop()
    passes = 0

    def count() -> None:
        nonlocal passes
        passes += 1
        if passes < 12:
            loop.call_soon(count)

    async def batch(name: str, delay_passes: int = 0) -> None:
        for _ in range(delay_passes):
            await asyncio.sleep(0)
        await turns.wait()
        runs.append((name, passes))

    loop.call_soon(count)
    await asyncio.gather(batch("a"), batch("b"), batch("late", delay_passes=2), batch("later", delay_passes=3))
    at = [p for _, p in runs]
    assert len(set(at)) == len(at), runs  # one turn per pass
    assert [n for n, _ in runs][:2] == ["a", "b"]
