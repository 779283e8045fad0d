"""A live owner deposed under it: another node claims a partition in the topic table while this node
still holds messages of it (a paused process, a lease run out). Its next flush must not land them;
it parks them, closes the partition, and tells whoever waits at ack=table to retry."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from deltalake import DeltaTable
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.cluster import NoOwnerYet, NotOwner
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.tables import delta, fencing
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import new_topic


async def test_a_deposed_owner_parks_its_messages_instead_of_committing_them(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", flush_interval_ms=3_600_000)  # flushed only when asked
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        topic = await broker.create_topic(new_topic("t", 2))
        await broker.produce("t", [NewMessage(value=b"first", partition=0)], AckMode.WAL)
        assert await broker.flusher.flush_once()
        await broker.produce("t", [NewMessage(value=b"late%d" % i, partition=p, message_id=f"late-{p}-{i}")
                                   for p in (0, 1) for i in range(3)], AckMode.WAL)
        waiting = asyncio.ensure_future(broker.produce("t", [NewMessage(value=b"w", partition=0)], AckMode.TABLE))
        await asyncio.sleep(0.05)  # in the WAL, waiting for its commit

        uri = broker.layout.topic_table("t")
        key = (bytes.fromhex(topic.topic_id), 0)
        assert broker.epochs[key] == 1
        assert fencing.claim(delta.load(uri), {0: 2}, node="intruder") == {0: 1}  # another node's claim

        assert await broker.flusher.flush_once()
        rows = DeltaTable(uri).to_pyarrow_table(columns=["partition", "offset", "value"]).to_pylist()
        assert sorted((r["partition"], r["offset"], r["value"]) for r in rows) == [
            (0, 0, b"first"), (1, 0, b"late0"), (1, 1, b"late1"), (1, 2, b"late2")], \
            "partition 1 is still this node's; nothing of partition 0 after the claim"
        assert key not in broker.epochs and key not in broker.accepting
        assert [i.offset for i in broker.parked[key]] == [1, 2, 3, 4], "kept, for the new owner"
        with pytest.raises(NoOwnerYet, match="retry with the same id"):
            await waiting
        with pytest.raises((NotOwner, NoOwnerYet)):
            await broker.produce("t", [NewMessage(value=b"more", partition=0)], AckMode.WAL)
        assert fencing.stored_epoch(DeltaTable(uri), 0) == 2
        # The WAL keeps the parked messages' segment: its floor is their first offset.
        assert broker._committed_below()(key) == 1
    finally:
        await broker.stop()
