"""A topic deleted through one node stays deleted on every node, and its ownership rows go with it.

A node that has not yet seen the delete still serves the topic for up to a heartbeat. Its
heartbeat, its claims and its flusher must not bring back what the delete removed: the table
(re-created by a claim, or a partial log written by a flush) and the rows of
`_system/partition_owners` (which no node would remove again)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.not_here import NoOwnerYet
from lakebroker.tables import delta
from lakebroker.tables.topics import TopicConfig, new_topic
from tests.ingest_api.test_topic_following import _node, _until


def _owner_rows(node: Broker, topic: TopicConfig) -> list[tuple[str, int]]:
    view = node.cluster.table.view()
    return sorted(pair for pair in (*view.owners, *view.pins) if pair[0] == topic.topic_id)


def _unaware(node: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node does not follow the topic table (its follower and its beats alike) until undone."""

    async def not_yet() -> bool:
        return False

    monkeypatch.setattr(node, "follow_topics", not_yet)
    monkeypatch.setattr(node.cluster, "_follow_topics_now", not_yet)  # what the follower and beats call


async def _one_partition_each(a: Broker, b: Broker) -> int:
    await _until(lambda: len(a.ownership.owned_pairs()) == 1 and len(b.ownership.owned_pairs()) == 1,
                 "a partition each", 20)
    [mine] = [p for p in range(2) if b.ownership.owns("t", p)]
    return mine


async def test_a_node_that_missed_the_delete_brings_back_neither_the_table_nor_its_owners(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _node(tmp_path, "a", 18341), _node(tmp_path, "b", 18342)
    await a.start()
    await b.start()
    try:
        topic = await a.create_topic(new_topic("t", 2))
        mine = await _one_partition_each(a, b)
        path = Path(a.layout.topic_table(topic))

        _unaware(b, monkeypatch)
        # b's beats wait from before the delete: a beat between the two would see b's ownership row
        # gone and give the partition up, and its first flush of the topic comes first.
        async with b.cluster._beat_lock:
            await a.delete_topic("t")
            assert not path.exists()
            # Acknowledged by b, which serves the topic until it sees the delete: it goes with the topic.
            await b.local.produce("t", [NewMessage(value=b"late", partition=mine)], AckMode.WAL)
            await b.flusher.flush_round()
            assert not (path / "_delta_log").exists(), "b's flush made the deleted table again"
        await a.stop()  # its leases are free: b's plan gives b every partition of the topic it still serves
        # A claim of a's partition, as a heartbeat that read the topics just before the delete leads to.
        await b.cluster._claim({(topic.topic_id, 1 - mine): 2}, wait=True)
        assert not (path / "_delta_log").exists(), "b's claim made the deleted table again"
        assert not b.ownership.owns("t", 1 - mine)
        await b.cluster.beat()  # a heartbeat and the claims it leads to, with the deleted topic in b's view
        assert not (path / "_delta_log").exists(), "b's heartbeat claimed the deleted topic's partitions"
        assert _owner_rows(b, topic) == [], "b wrote ownership rows of the deleted topic"

        monkeypatch.undo()
        await b.cluster.beat()  # follows the delete
        await b.flusher.flush_round()
        assert "t" not in b.topics
        assert not path.exists(), "what b wrote to the deleted table before it saw the delete is left"
        assert _owner_rows(b, topic) == []
        assert b.flusher.pending_bytes == 0, "b still holds messages of the deleted topic"
        held = (*b.ownership.epochs, *b.ownership.parked)
        assert not [key for key in held if key[0] == bytes.fromhex(topic.topic_id)]
    finally:
        monkeypatch.undo()
        for node in (b, a):
            if node.started:
                await node.stop()


async def test_a_topic_created_again_under_its_name_is_a_new_table_with_only_its_own_owners(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _node(tmp_path, "a", 18343), _node(tmp_path, "b", 18344)
    await a.start()
    await b.start()
    try:
        old = await a.create_topic(new_topic("t", 2))
        mine = await _one_partition_each(a, b)
        await b.local.produce("t", [NewMessage(value=b"old", partition=mine)], AckMode.TABLE)

        _unaware(b, monkeypatch)
        async with b.cluster._beat_lock:  # b still owns its partition and has the deleted table open
            await a.delete_topic("t")
            await b.local.produce("t", [NewMessage(value=b"late", partition=mine)], AckMode.WAL)
            await b.flusher.flush_round()
        new = await a.create_topic(new_topic("t", 2))
        await b.cluster.beat()  # b still knows only the deleted topic
        assert _owner_rows(b, old) == [], "b wrote ownership rows of the deleted topic back"

        monkeypatch.undo()
        await _until(lambda: b.topics.get("t") == new, "b serves the new topic", 10)
        await _until(lambda: len(a.ownership.owned_pairs()) == 1 and len(b.ownership.owned_pairs()) == 1,
                     "a partition each", 20)
        for p in range(2):
            for _ in range(100):  # as a producer does: a partition between owners (a hand-over) is retried
                owner = a if a.ownership.owns("t", p) else b
                try:
                    [placed] = await owner.local.produce("t", [NewMessage(value=f"new-{p}".encode(), partition=p)],
                                                   AckMode.TABLE)
                    break
                except NoOwnerYet:
                    await asyncio.sleep(0.1)
            assert placed.offset == 0
        assert new.topic_id != old.topic_id and new.location != old.location
        rows = delta.load(a.layout.topic_table(new)).to_pyarrow_table()
        assert sorted(rows.column("value").to_pylist()) == [b"new-0", b"new-1"]
        assert not Path(a.layout.topic_table(old)).exists()
        assert _owner_rows(a, old) == []
        assert _owner_rows(a, new) == [(new.topic_id, 0), (new.topic_id, 1)]
    finally:
        monkeypatch.undo()
        for node in (b, a):
            if node.started:
                await node.stop()
