"""Taking over a busy partition: before it opens, the new owner learns the ids other nodes
committed to it within the dedup window (a retry of a message the old owner acknowledged must get
its first answer). With millions of ids that takes seconds, and it must not hold the heartbeat
that renews this node's other leases: the loop's beat claims, the learning runs beside the beats,
and the partition opens once it is done."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api import cluster as cluster_module
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.not_here import NoOwnerYet
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import new_topic


async def test_a_slow_learning_of_ids_runs_beside_the_heartbeats_and_opens_the_partition_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(data_dir=tmp_path / "data", ingest_lease_ttl_s=2, ingest_heartbeat_s=60)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    learning = threading.Event()
    release = threading.Event()
    real = cluster_module.placed_by_others
    claims: list[str] = []
    real_claim = cluster_module.claim_partitions

    def slow(*args: Any, **kwargs: Any) -> pa.Table:
        learning.set()
        release.wait(30)  # millions of ids to read
        return real(*args, **kwargs)

    def counted(store: Any, topic: Any, epochs: dict[int, int], **kw: Any) -> Any:
        claims.append(topic.name)
        return real_claim(store, topic, epochs, **kw)

    try:
        await broker.create_topic(new_topic("kept", 1))
        await broker.create_topic(new_topic("busy", 1))
        busy = broker.topic("busy")
        pair = (busy.topic_id, 0)
        monkeypatch.setattr(cluster_module, "placed_by_others", slow)
        monkeypatch.setattr(cluster_module, "claim_partitions", counted)
        broker.ownership.disown({pair})  # as after a lost lease: the heartbeat gives it back, to be claimed

        await asyncio.wait_for(broker.cluster.beat(wait=False), 10)
        assert await asyncio.to_thread(learning.wait, 10)
        assert pair not in broker.ownership.owned_pairs(), "closed while its ids are learnt"
        with pytest.raises(NoOwnerYet):
            await broker.local.produce("busy", [NewMessage(value=b"early", partition=0)], AckMode.WAL)
        for _ in range(3):  # the loop's beats go on, renewing the other leases, and claim it once
            await asyncio.wait_for(broker.cluster.beat(wait=False), 10)
        assert claims == ["busy"]
        assert (broker.topic("kept").topic_id, 0) in broker.ownership.owned_pairs()

        release.set()
        for _ in range(100):
            if pair in broker.ownership.owned_pairs():
                break
            await asyncio.sleep(0.05)
        assert pair in broker.ownership.owned_pairs(), "open once its ids are learnt"
        [placed] = await broker.local.produce("busy", [NewMessage(value=b"after", partition=0)], AckMode.WAL)
        assert placed.partition == 0 and placed.offset == 0
    finally:
        release.set()
        await broker.stop()
