"""Read-ahead is bounded in bytes: large messages to a lagging subscription never pile up in the
delivery process (1,000 messages of 1 MiB would be a GiB per partition, and the process would die,
restart, read the same rows and die again)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import pyarrow as pa

from lakebroker.delivery_worker.flow import ByteBudget
from lakebroker.delivery_worker.source import PartitionSource
from lakebroker.tables.layout import Layout
from tests.delivery_worker.inproc import subscribe, until, worker, worker_settings
from tests.receivers import Receiver
from tests.spark_pipeline.topics import create_topic, produce, settings_for

T = TypeVar("T")

MIB = 1 << 20


async def test_large_messages_to_a_lagging_subscription_are_read_ahead_within_the_byte_bounds(tmp_path: Path) -> None:
    """Per partition at most delivery_read_ahead_bytes (4 MiB here), and for the process at most
    delivery_read_ahead_total_bytes (6 MiB for two partitions that would each take 4), plus one
    message a partition may always hold so that it moves."""
    receiver = Receiver(behaviour=lambda n, body: (200, {}, 0.05))  # a slow endpoint: the subscription lags
    data = tmp_path / "data"
    # The default lease TTL (10 s), not the 2 s of the other in-process tests: reading MiB rows keeps
    # a busy host's ticks slow enough to lose 2 s leases, and then every send is cut off.
    settings = worker_settings(data).model_copy(update={"delivery_read_ahead_bytes": 4 * MIB,
                                                        "delivery_read_ahead_total_bytes": 6 * MIB,
                                                        "lease_ttl_s": 10.0})
    create_topic(settings, "t", partitions=2)
    for partition in (0, 1):
        produce(settings, "t", partition, 20, values=[bytes([i]) * MIB for i in range(20)])
    subscribe(data, "t", receiver.url)
    running = worker(settings, "worker-a")
    task = asyncio.create_task(running.run())
    held: list[tuple[int, int]] = []  # rows of 1 MiB held by partitions 0 and 1 at once (queued or in flight)
    try:
        def sample() -> bool:
            pipelines: list[Any] = [running._running[("hooks", p)].pipeline
                                    for p in (0, 1) if ("hooks", p) in running._running]
            if len(pipelines) == 2:
                held.append((len(pipelines[0].queue), len(pipelines[1].queue)))
            return len({(m["partition"], m["offset"]) for m in receiver.messages()}) >= 40

        await until(sample, "all 40 messages are delivered", timeout=120)
        assert held and max(max(h) for h in held) <= 5, f"held by one partition at once: {held}"
        assert max(sum(h) for h in held) <= 8, f"held by the process at once: {held}"
        # at least once: a send cut off by a late lease renewal on a busy host is sent again
        assert sorted({(m["partition"], m["offset"]) for m in receiver.messages()}) == \
            [(p, o) for p in (0, 1) for o in range(20)]
        budget: ByteBudget = running._read_ahead
        await until(lambda: budget.used == 0, "every delivered row gives its bytes back")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        receiver.close()


async def test_reads_running_at_once_in_many_partitions_take_no_more_than_the_process_bound(
        tmp_path: Path) -> None:
    """Each read reserves its bytes before it starts (at the topic's max_message_bytes a message
    until their size is known), so six pipelines starting together do not each take the whole
    room they saw: the process holds its bound, plus the one message each may always hold."""
    receiver = Receiver(behaviour=lambda n, body: (200, {}, 0.1))
    data = tmp_path / "data"
    settings = worker_settings(data).model_copy(update={"delivery_read_ahead_bytes": 4 * MIB,
                                                        "delivery_read_ahead_total_bytes": 3 * MIB,
                                                        "lease_ttl_s": 10.0})
    create_topic(settings, "t", partitions=6)
    for partition in range(6):
        produce(settings, "t", partition, 6, values=[bytes([i]) * (MIB - 100) for i in range(6)])
    subscribe(data, "t", receiver.url)
    running = worker(settings, "worker-a")
    task = asyncio.create_task(running.run())
    held: list[int] = []  # rows of 1 MiB held by the six partitions at once
    try:
        def sample() -> bool:
            pipelines = [r.pipeline for (_, p), r in running._running.items()]
            held.append(sum(len(p.queue) + p.status.in_flight for p in pipelines))
            return len({(m["partition"], m["offset"]) for m in receiver.messages()}) >= 36

        await until(sample, "all 36 messages are delivered", timeout=120)
        assert max(held) <= 3 + 6, f"rows held by the process at once: {sorted(held)[-10:]}"
        await until(lambda: running._read_ahead.used == 0, "every row and body gives its bytes back")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        receiver.close()


def held_at_most(fn: Callable[[], T]) -> tuple[T, int]:
    """fn's result, and the most bytes it held at once in Arrow buffers (Arrow's memory pool, which
    the Parquet reader and compute both allocate from) and Python objects (tracemalloc) together,
    sampled each time one of its calls returns. The garbage collector waits meanwhile: freeing
    something older than fn would hide as much of what fn holds."""
    gc.collect()
    gc.disable()
    tracemalloc.start()
    arrow_before, python_before = pa.total_allocated_bytes(), tracemalloc.get_traced_memory()[0]
    peak = 0

    def sample(frame: FrameType, event: str, arg: object) -> None:
        nonlocal peak
        if event in ("c_return", "return"):
            held = pa.total_allocated_bytes() - arrow_before + tracemalloc.get_traced_memory()[0] - python_before
            peak = max(peak, held)

    sys.setprofile(sample)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
        tracemalloc.stop()
        gc.enable()
    return result, peak


def test_a_read_of_large_values_holds_about_one_copy_of_them(tmp_path: Path) -> None:
    """A read of 48 MiB hands its rows over holding well under two copies of its values at any
    moment: not the decoded table, a sorted copy of it and the rows' Python copies all at once.
    (Arrow's scan frees some of its buffers from its own threads, a little after it returns, so
    the bound leaves room above one copy.)"""
    settings = settings_for(tmp_path)
    topic = create_topic(settings, "t", partitions=1)
    for first in (0, 24):
        produce(settings, "t", 0, 24, values=[bytes([first + i]) * MIB for i in range(24)])
    source = PartitionSource(Layout.of(settings), topic, 0)
    assert source.committed_end() == 48
    source.read(0, 1)  # first use: imports and the table's footers, not what is measured

    (rows, end), held = held_at_most(lambda: source.read(0, 48))
    assert end == 48 and [r["offset"] for r in rows] == list(range(48))
    assert [r["value"] for r in rows] == [bytes([i]) * MIB for i in range(48)]
    assert held < 72 * MIB, f"{held / MIB:.1f} MiB held at once to read 48 MiB"
