"""Handing a partition over while the node is busy with others: the hand-over waits for the moving
partition's own messages to be committed, never for every partition to fall quiet (which, under
steady load, never happens: a joining node would get no partitions)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import new_topic


async def test_a_partition_is_handed_over_while_another_partitions_write_is_in_flight(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", flush_interval_ms=3_600_000)  # flushed only when asked
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    release = threading.Event()
    real_append = broker.wal.append

    def stuck_for_partition_1(frames: Any, records: Any, **kwargs: Any) -> Any:
        if any(r.partition == 1 for r in records):
            release.wait(30)  # a busy partition: its writes are always in flight
        return real_append(frames, records, **kwargs)

    try:
        topic = await broker.create_topic(new_topic("t", 2))
        await broker.local.produce("t", [NewMessage(value=b"zero", partition=0)], AckMode.WAL)
        broker.wal.append = stuck_for_partition_1  # type: ignore[method-assign]
        broker.committer.disk.never()  # through the writer thread, not inline on the loop
        busy = asyncio.ensure_future(broker.local.produce("t", [NewMessage(value=b"one", partition=1)], AckMode.WAL))
        await asyncio.sleep(0.1)
        assert broker.committer.queued_bytes > 0 and not busy.done()

        assert await broker.ownership.hand_over((topic.topic_id, 0)), "partition 0 has nothing in flight"
        key = (bytes.fromhex(topic.topic_id), 0)
        assert key not in broker.ownership.epochs and key not in broker.ownership.accepting
        rows = DeltaTable(broker.layout.topic_table("t")).to_pyarrow_table(columns=["partition", "value"])
        assert rows.to_pylist() == [{"partition": 0, "value": b"zero"}], "committed before it was let go"
        release.set()
        await busy
    finally:
        release.set()
        broker.wal.append = real_append  # type: ignore[method-assign]
        await broker.stop()
