"""A node that stops drains first (Membership.drain): it takes no partition back while it hands its
parked messages on, and the nodes that stay get what it lets go (the cluster soak saw a stopping
node claim partitions again and depose the node taking them over, until its messages were left in
its WAL)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import new_topic

HEARTBEAT_S = 0.2


def _node(tmp_path: Path, name: str, port: int) -> Broker:
    settings = Settings(data_dir=tmp_path / name, tables_uri=str(tmp_path / "tables"), port=port,
                        ingest_heartbeat_s=HEARTBEAT_S)
    return Broker(settings, IngestMetrics(CollectorRegistry()))


async def _until(check: object, what: str, within_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not check():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"not within {within_s} s: {what}")
        await asyncio.sleep(0.05)


async def test_a_draining_node_takes_nothing_back_and_the_others_get_what_it_lets_go(tmp_path: Path) -> None:
    a, b = _node(tmp_path, "a", 18311), _node(tmp_path, "b", 18312)
    await a.start()
    await b.start()
    try:
        topic = await a.create_topic(new_topic("t", 4))
        await _until(lambda: len(a.owned_pairs()) == 2 and len(b.owned_pairs()) == 2, "two partitions each", 20)
        kept = sorted(a.owned_pairs())
        a.cluster.drain()
        await a.cluster.beat()
        assert sorted(a.owned_pairs()) == kept, "a keeps what it holds while it drains"
        assert [n.draining for n in b.cluster.table.view().nodes if n.node == a.cluster.node] == [True]

        # One of a's partitions becomes free (its hand-over done): b takes it, a does not take it back,
        # though it was a's share of the plan before a drained.
        freed = kept[0]
        a.disown({freed})
        a.cluster._released.add(freed)
        await a.cluster.beat()
        await _until(lambda: freed in b.owned_pairs(), "b takes the partition a let go", 20)
        for _ in range(5):
            await a.cluster.beat()
        assert freed not in a.owned_pairs() and (bytes.fromhex(topic.topic_id), freed[1]) not in a.epochs
        assert sorted(a.owned_pairs()) == kept[1:]
    finally:
        await a.stop()
        await b.stop()
