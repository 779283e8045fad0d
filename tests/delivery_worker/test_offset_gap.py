"""A hole in a topic that is not key-compacted is damage: delivery waits at it, with the error in
the partition's status, and skips nothing. In a compacted topic a hole is a removed key."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lakebroker.delivery_worker.source import PartitionSource
from lakebroker.ingest_api.reader import read_messages
from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import TOPIC_SCHEMA
from lakebroker.tables.topics import TopicStore
from tests.delivery_worker.inproc import subscribe, until, worker, worker_settings
from tests.receivers import Receiver
from tests.spark_pipeline.topics import create_topic, produce


async def _deliver_around_a_hole(tmp_path: Path, receiver: Receiver, policy: str,
                                 monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], str | None]:
    reads: list[int] = []  # the first offset of each read the pipeline makes
    read = PartitionSource.read

    def counted(source: PartitionSource, start: int, end: int) -> tuple[list[dict[str, Any]], int]:
        reads.append(start)
        return read(source, start, end)

    monkeypatch.setattr(PartitionSource, "read", counted)
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
            # Three more tries at the hole (a poll interval apart): nothing past it may go out meanwhile.
            tried = len(reads)
            await until(lambda: len(reads) >= tried + 3, "the pipeline tries the hole again")
        status = running.status("hooks")[0]
        return [m["offset"] for m in receiver.messages()], status.last_error
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_delivery_stops_at_a_hole_in_a_topic_that_is_not_compacted(tmp_path: Path, receiver: Receiver,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    delivered, error = await _deliver_around_a_hole(tmp_path, receiver, "delete", monkeypatch)
    assert sorted(delivered) == [0, 1], f"delivered {delivered}: past the hole, or not up to it"
    assert error is not None and "missing offsets 2-3" in error


async def test_delivery_passes_holes_that_key_compaction_made(tmp_path: Path, receiver: Receiver,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    delivered, _ = await _deliver_around_a_hole(tmp_path, receiver, "compact", monkeypatch)
    assert sorted(delivered) == [0, 1, 4, 5]


async def test_a_patch_from_compact_to_delete_keeps_the_compacted_holes_legitimate(tmp_path: Path,
                                                                                   receiver: Receiver) -> None:
    """Whether a hole is legitimate follows from the table (marked when its topic became compact),
    not from the topic config a reader loaded: after compact -> delete, the holes key compaction
    made are still holes, for a new pipeline and for a pull read."""
    data = tmp_path / "data"
    settings = worker_settings(data)
    create_topic(settings, "t", partitions=1, cleanup_policy="compact")
    produce(settings, "t", 0, 6)
    DeltaTable(Layout(data).topic_table("t")).delete("`offset` IN (2, 3)")  # key compaction's removals
    topic = TopicStore(Layout(data)).update("t", cleanup_policy="delete")
    read = read_messages(Layout(data), topic, 0, 0, 100, committed_end=6)
    assert [m["offset"] for m in read["messages"]] == [0, 1, 4, 5]
    subscribe(data, "t", receiver.url)
    running = worker(settings, "worker-a")
    task = asyncio.create_task(running.run())
    try:
        await until(lambda: len(receiver.messages()) >= 4, "the rows around the holes are delivered")
        assert sorted(m["offset"] for m in receiver.messages()) == [0, 1, 4, 5]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_running_pipeline_passes_holes_made_after_a_patch_from_delete_to_compact(
        tmp_path: Path, receiver: Receiver) -> None:
    """The pipeline started on a delete topic; the topic turns compact and its next commit has holes
    (as after key compaction). The pipeline reads the table's mark from the commit log it follows."""
    data = tmp_path / "data"
    settings = worker_settings(data)
    create_topic(settings, "t", partitions=1)
    produce(settings, "t", 0, 6)
    subscribe(data, "t", receiver.url)
    running = worker(settings, "worker-a")
    task = asyncio.create_task(running.run())
    try:
        await until(lambda: len(receiver.messages()) >= 6, "the first six are delivered")
        await asyncio.to_thread(TopicStore(Layout(data)).update, "t", cleanup_policy="compact")
        table = DeltaTable(Layout(data).topic_table("t"))
        kept = [6, 9, 10, 11]  # 7 and 8 already removed: one commit, so no read can come between
        delta.append(table, pa.table({
            "partition": pa.array([0] * 4, pa.int32()), "offset": pa.array(kept, pa.int64()),
            "timestamp": pa.array([datetime.now(UTC)] * 4, pa.timestamp("us", tz="UTC")),
            "key": pa.array(["k"] * 4), "value": pa.array([b"v%d" % o for o in kept]),
            "format": pa.array(["text"] * 4), "headers": pa.array([None] * 4, pa.map_(pa.string(), pa.string())),
            "message_id": pa.array([None] * 4, pa.string()), "producer_id": pa.array([None] * 4, pa.string()),
            "sequence": pa.array([None] * 4, pa.int64())}, schema=TOPIC_SCHEMA),
            txns={delta.partition_app_id(0): 12})
        await until(lambda: len(receiver.messages()) >= 10, "the rows around the holes are delivered")
        assert sorted(m["offset"] for m in receiver.messages()) == [0, 1, 2, 3, 4, 5, 6, 9, 10, 11]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
