"""Graceful shutdown and the flusher's contiguity check: no interleaving of flushes leaves a gap."""

from __future__ import annotations

import asyncio
import threading

import pytest
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.records import Record
from lakebroker.tables import delta
from lakebroker.tables.errors import OffsetGap
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import new_topic


def _broker(settings: Settings) -> Broker:
    return Broker(settings, IngestMetrics(CollectorRegistry()))


def _offsets_in_delta(broker: Broker, topic: str) -> list[int]:
    table = delta.open_table(broker.layout.topic_table(topic))
    assert table is not None
    return sorted(table.to_pyarrow_table(columns=["offset"])["offset"].to_pylist())


async def test_stop_while_a_flush_is_failing_leaves_no_gap(settings: Settings) -> None:
    """The flusher task's commit of 0-49 hangs and then fails while stop() runs.

    Before the fix, stop() flushed 50-99 beside it (txn end 100) and recovery then dropped
    0-49 as already committed.
    """
    broker = _broker(settings.model_copy(update={"flush_interval_ms": 10}))
    await broker.start()
    await broker.create_topic(new_topic("t", 1))
    entered, release = threading.Event(), threading.Event()
    real_commit = broker.flusher.commits.commit
    calls = 0

    def first_commit_hangs_then_fails(topic, records):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 1:
            entered.set()
            release.wait(30)
            raise OSError("injected: the first flush fails")
        return real_commit(topic, records)

    broker.flusher.commits.commit = first_commit_hangs_then_fails  # type: ignore[method-assign]
    await broker.local.produce("t", [NewMessage(value=b"a%d" % i) for i in range(50)], AckMode.WAL)
    assert await asyncio.to_thread(entered.wait, 30), "the flusher task never started its commit"
    await broker.local.produce("t", [NewMessage(value=b"b%d" % i) for i in range(50)], AckMode.WAL)
    stopping = asyncio.create_task(broker.stop())
    await asyncio.wait({stopping}, timeout=1.0)  # room for a stop() that flushes beside the task
    release.set()
    await stopping

    restarted = _broker(settings)
    await restarted.start()
    try:
        assert _offsets_in_delta(restarted, "t") == list(range(100))
    finally:
        await restarted.stop()


async def test_the_flusher_refuses_a_commit_that_would_leave_a_gap(settings: Settings) -> None:
    broker = _broker(settings)
    await broker.start()
    topic = await broker.create_topic(new_topic("t", 2))
    tid = bytes.fromhex(topic.topic_id)

    def rec(partition: int, offset: int) -> Record:
        return Record("t", tid, partition, offset, 1, None, b"v", "text", None, None, None, None)

    try:
        created = (await asyncio.to_thread(broker.flusher.commits.table, topic)).version()
        with pytest.raises(OffsetGap, match="partition 1: a commit would start at offset 3"):
            await asyncio.to_thread(broker.flusher.commits.commit, topic, [rec(0, 0), rec(1, 3), rec(1, 4)])
        with pytest.raises(OffsetGap, match="partition 0: a commit would start at offset 2"):
            await asyncio.to_thread(broker.flusher.commits.commit, topic, [rec(0, 0), rec(0, 2)])
        table = delta.open_table(broker.layout.topic_table("t"))
        assert table is not None and table.version() == created, "a refused commit wrote"
        ends = await asyncio.to_thread(broker.flusher.commits.commit, topic,
                                       [rec(0, 1), rec(0, 0), rec(0, 0), rec(1, 0)])
        assert ends == {0: 2, 1: 1}
        assert _offsets_in_delta(broker, "t") == [0, 0, 1]
    finally:
        await broker.stop()
