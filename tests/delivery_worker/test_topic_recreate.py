"""A topic deleted and created again under its name is a new log: a subscription on it starts at
the new topic's log start, not at the offsets it committed on the deleted one."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from lakebroker.tables.layout import Layout
from lakebroker.tables.offsets import OffsetsTable
from lakebroker.tables.topics import TopicStore
from tests.delivery_worker.inproc import subscribe, until, worker, worker_settings
from tests.receivers import Receiver
from tests.spark_pipeline.topics import create_topic, produce


async def test_a_subscription_starts_a_recreated_topic_at_its_log_start(tmp_path: Path, receiver: Receiver) -> None:
    data = tmp_path / "data"
    settings = worker_settings(data)
    create_topic(settings, "t", partitions=1)
    subscribe(data, "t", receiver.url)
    produce(settings, "t", 0, 5, values=[f"old-{i}".encode() for i in range(5)])
    running = worker(settings, "worker-a")
    task = asyncio.create_task(running.run())
    offsets = OffsetsTable(Layout(data))
    try:
        await until(lambda: offsets.latest("hooks").get(("hooks", "t", 0), (0, ""))[0] == 5,
                    "the old topic is delivered and committed")
        topics = TopicStore(Layout(data))
        await asyncio.to_thread(topics.delete, "t")
        await asyncio.to_thread(create_topic, settings, "t", 1)
        await asyncio.to_thread(produce, settings, "t", 0, 3, values=[f"new-{i}".encode() for i in range(3)])

        def values() -> list[str]:
            return [m["value"] for m in receiver.messages()]

        await until(lambda: len(values()) >= 8 or offsets.latest("hooks").get(("hooks", "t", 0), ("", ""))[1]
                    == "reset", "the new topic's messages are delivered (or the group was reset past them)")
        assert values() == [f"old-{i}" for i in range(5)] + [f"new-{i}" for i in range(3)]
        await until(lambda: offsets.latest("hooks").get(("hooks", "t", 0)) == (3, "ack"),
                    "the group commits the new topic's end")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
