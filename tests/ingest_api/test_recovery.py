"""Restart after a crash: what the WAL holds reaches Delta, and no partition stops."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.body import batch_items
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.columnar import columns_of
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.records import Record
from lakebroker.ingest_api.wal import Wal
from lakebroker.tables import delta
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import new_topic
from tests.delivery_worker.inproc import until

pytestmark = pytest.mark.fault


async def crash(broker: Broker) -> None:
    """Durable in the WAL, no orderly stop: the tasks end and the WAL is closed as it is."""
    broker.committer.close()
    broker.flusher.close()
    for task in broker._tasks:
        await task
    broker.wal.close()


def offsets_in_delta(broker: Broker, topic: str) -> list[int]:
    table = delta.open_table(broker.layout.topic_table(topic))
    return [] if table is None else sorted(table.to_pyarrow_table(columns=["offset"])["offset"].to_pylist())


async def test_a_batch_chunk_then_more_singles_than_one_flush_takes_all_reach_delta(tmp_path: Path) -> None:
    """One partition: a 50-message batch (offsets 0-49, one columnar chunk in the WAL), then more
    single messages than `flush_max_records`, and a crash before any flush. Recovery used to hand
    the flusher every single record before every chunk; a bounded flush then took singles 50-69,
    was refused for the gap at 0, and put them back in front: the topic never committed again."""
    settings = Settings(data_dir=tmp_path / "data", flush_interval_ms=20, flush_max_records=20)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    await broker.create_topic(new_topic("t", 1))
    broker.flusher.close()  # nothing reaches Delta before the crash
    await broker._tasks[1]
    body = orjson.dumps({"messages": [{"value": f"b{i}"} for i in range(50)]})
    batch = columns_of(batch_items("application/json", body))
    assert batch is not None
    first = await broker.local.produce_columns("t", batch, AckMode.WAL)
    assert first.offset.tolist() == list(range(50))
    for i in range(30):
        [placed] = await broker.local.produce("t", [NewMessage(value=b"s%d" % i)], AckMode.WAL)
        assert placed.offset == 50 + i
    await crash(broker)

    copy = shutil.copytree(broker.layout.wal_dir, tmp_path / "wal-copy")  # recover() opens a segment
    report = await asyncio.to_thread(Wal(copy, segment_bytes=1 << 30, fsync=False).recover)
    assert [(type(r).__name__, r.offset) for r in report.items][:2] == [("Chunk", 0), ("Record", 50)], \
        "recovery hands back the WAL in log order"
    assert all(isinstance(r, Record) for r in report.items[1:])

    again = Broker(settings, IngestMetrics(CollectorRegistry()))
    await again.start()
    try:
        await until(lambda: offsets_in_delta(again, "t") == list(range(80)), "all 80 acknowledged messages in Delta",
                    timeout=20)
        [placed] = await again.local.produce("t", [NewMessage(value=b"after")], AckMode.TABLE)
        assert placed.offset == 80, "the partition keeps moving after the restart"
    finally:
        await again.stop()
