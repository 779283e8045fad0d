"""A hole in a topic that is not key-compacted is damage: delivery waits at it, with the error in
the partition's status, and skips nothing. In a compacted topic a hole is a removed key."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from deltalake import DeltaTable

from lakebroker.tables.layout import Layout
from tests.delivery_worker.inproc import subscribe, until, worker, worker_settings
from tests.receivers import Receiver
from tests.spark_pipeline.topics import create_topic, produce


async def _deliver_around_a_hole(tmp_path: Path, receiver: Receiver, policy: str) -> tuple[list[int], str | None]:
    data = tmp_path / "data"
    settings = worker_settings(data)
    create_topic(settings, "t", partitions=1, cleanup_policy=policy)
    produce(settings, "t", 0, 6)
    DeltaTable(Layout(data).topic_table("t")).delete("`offset` IN (2, 3)")
    subscribe(data, "t", receiver.url)
    running = worker(settings, "worker-a")
    task = asyncio.create_task(running.run())
    try:
        if policy == "compact":
            await until(lambda: len(receiver.messages()) >= 4, "the rows around the hole are delivered")
        else:
            await until(lambda: "missing offsets" in (getattr(running.status("hooks").get(0), "last_error", None)
                                                      or ""), "the gap is reported in the partition's status")
            await asyncio.sleep(0.3)  # several poll intervals: nothing past the hole may go out meanwhile
        status = running.status("hooks")[0]
        return [m["offset"] for m in receiver.messages()], status.last_error
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_delivery_stops_at_a_hole_in_a_topic_that_is_not_compacted(tmp_path: Path, receiver: Receiver) -> None:
    delivered, error = await _deliver_around_a_hole(tmp_path, receiver, "delete")
    assert sorted(delivered) == [0, 1], f"delivered {delivered}: past the hole, or not up to it"
    assert error is not None and "missing offsets 2-3" in error


async def test_delivery_passes_holes_that_key_compaction_made(tmp_path: Path, receiver: Receiver) -> None:
    delivered, _ = await _deliver_around_a_hole(tmp_path, receiver, "compact")
    assert sorted(delivered) == [0, 1, 4, 5]
