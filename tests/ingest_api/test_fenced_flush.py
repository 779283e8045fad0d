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
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.not_here import NoOwnerYet, NotOwner
from lakebroker.tables import delta, fencing
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import new_topic


async def test_a_deposed_owner_parks_its_messages_instead_of_committing_them(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", flush_interval_ms=3_600_000)  # flushed only when asked
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        topic = await broker.create_topic(new_topic("t", 2))
        await broker.local.produce("t", [NewMessage(value=b"first", partition=0)], AckMode.WAL)
        assert await broker.flusher.flush_once()
        await broker.local.produce("t", [NewMessage(value=b"late%d" % i, partition=p, message_id=f"late-{p}-{i}")
                                   for p in (0, 1) for i in range(3)], AckMode.WAL)
        waiting = asyncio.ensure_future(broker.local.produce("t", [NewMessage(value=b"w", partition=0)], AckMode.TABLE))
        await asyncio.sleep(0.05)  # in the WAL, waiting for its commit

        uri = broker.layout.topic_table("t")
        key = (bytes.fromhex(topic.topic_id), 0)
        assert broker.ownership.epochs[key] == 1
        # No heartbeat from here on: one would claim the partition back above the intruder (this node's
        # lease says it is the owner), and take back what the flush parks, before the checks below.
        await broker.cluster.stop_beating()
        assert fencing.claim(delta.load(uri), {0: 2}, node="intruder") == {0: 1}  # another node's claim

        assert await broker.flusher.flush_once()
        rows = DeltaTable(uri).to_pyarrow_table(columns=["partition", "offset", "value"]).to_pylist()
        assert sorted((r["partition"], r["offset"], r["value"]) for r in rows) == [
            (0, 0, b"first"), (1, 0, b"late0"), (1, 1, b"late1"), (1, 2, b"late2")], \
            "partition 1 is still this node's; nothing of partition 0 after the claim"
        assert key not in broker.ownership.epochs and key not in broker.ownership.accepting
        assert [i.offset for i in broker.ownership.parked[key]] == [1, 2, 3, 4], "kept, for the new owner"
        with pytest.raises(NoOwnerYet, match="retry with the same id"):
            await waiting
        with pytest.raises((NotOwner, NoOwnerYet)):
            await broker.local.produce("t", [NewMessage(value=b"more", partition=0)], AckMode.WAL)
        assert fencing.stored_epoch(DeltaTable(uri), 0) == 2
        # The WAL keeps the parked messages' segment: its floor is their first offset.
        assert broker.ownership.committed_below()(key) == 1
    finally:
        await broker.stop()


async def _two_partition_broker(tmp_path: Path) -> tuple[Broker, str, bytes]:
    settings = Settings(data_dir=tmp_path / "data", flush_interval_ms=3_600_000)  # flushed only when asked
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    topic = await broker.create_topic(new_topic("t", 2))
    await broker.local.produce("t", [NewMessage(value=b"first", partition=p) for p in (0, 1)], AckMode.WAL)
    assert await broker.flusher.flush_once()
    return broker, broker.layout.topic_table("t"), bytes.fromhex(topic.topic_id)


def _stored(uri: str) -> list[tuple[int, int, bytes]]:
    rows = DeltaTable(uri).to_pyarrow_table(columns=["partition", "offset", "value"]).to_pylist()
    return sorted((r["partition"], r["offset"], r["value"]) for r in rows)


async def _partition_0_refuses_a_message(broker: Broker, uri: str, stored: list[tuple[int, int, bytes]]) -> None:
    """A message for partition 0 at ack=table: its flush lands nothing of it (the table holds just
    `stored`), and its producer is told to retry with the same id."""
    waiting = asyncio.ensure_future(broker.local.produce("t", [NewMessage(value=b"zero", partition=0)], AckMode.TABLE))
    await asyncio.sleep(0.05)
    assert await broker.flusher.flush_once()
    assert _stored(uri) == stored, "nothing of partition 0 after another node's claim"
    with pytest.raises(NoOwnerYet):
        await waiting


async def test_a_claim_seen_while_committing_other_partitions_still_fences_the_claimed_one(tmp_path: Path) -> None:
    """The claim is in the snapshot a commit of partition 1 alone is checked on: partition 0, not in
    that commit, must be checked too before a later commit of it is planned on the same snapshot,
    which no concurrent-transaction conflict would stop."""
    broker, uri, _ = await _two_partition_broker(tmp_path)
    try:
        fencing.claim(delta.load(uri), {0: 2}, node="intruder")
        await broker.local.produce("t", [NewMessage(value=b"one", partition=1)], AckMode.WAL)
        assert await broker.flusher.flush_once()
        await _partition_0_refuses_a_message(broker, uri, [(0, 0, b"first"), (1, 0, b"first"), (1, 1, b"one")])
        assert fencing.stored_epoch(DeltaTable(uri), 0) >= 2  # (this node may claim it back: no live intruder)
    finally:
        await broker.stop()


async def test_a_claim_a_commit_was_rebased_over_still_fences_the_claimed_partition(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another node claims partition 0 between this node's snapshot and its commit of partition 1:
    delta-rs retries that commit over the claim (no application id in common), so the version it
    lands at was never checked for partition 0."""
    broker, uri, _ = await _two_partition_broker(tmp_path)
    real_append = delta.append_partitions
    intruded = []

    def append_after_a_claim(*args: object, **kwargs: object) -> None:
        if not intruded:
            intruded.append(fencing.claim(delta.load(uri), {0: 2}, node="intruder"))
        real_append(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(delta, "append_partitions", append_after_a_claim)
    try:
        await broker.local.produce("t", [NewMessage(value=b"one", partition=1)], AckMode.WAL)
        assert await broker.flusher.flush_once()
        assert intruded and _stored(uri)[-1] == (1, 1, b"one")
        await _partition_0_refuses_a_message(broker, uri, [(0, 0, b"first"), (1, 0, b"first"), (1, 1, b"one")])
    finally:
        await broker.stop()


async def test_an_epoch_older_than_ours_in_the_table_is_a_split_brain_and_fences_too(tmp_path: Path) -> None:
    """If the table's newest owner epoch of a partition is older than this node's (a writer that
    should have been fenced committed after this node's claim), this node cannot know which rows
    are its own: it stops writing the partition rather than answer another node's rows as its own."""
    broker, uri, topic_id = await _two_partition_broker(tmp_path)
    try:
        key = (topic_id, 0)
        broker.ownership.epochs[key] = 3  # as if it had claimed epoch 3
        broker.flusher.commits.adopted(broker.topic("t").topic_id)
        await _partition_0_refuses_a_message(broker, uri, [(0, 0, b"first"), (1, 0, b"first")])
    finally:
        await broker.stop()


async def test_a_wait_for_a_commit_begun_after_the_partition_left_fails_instead_of_taking_a_later_offset(
        tmp_path: Path) -> None:
    """An ack=table wait that starts after its partition left this node (its WAL write finished
    late) must not be answered by the partition's committed end: once this node claims it again,
    its message is appended again at a new offset, and the end passing the old one says nothing of
    it (the cluster soak saw a message acknowledged at offset 90 and stored at 91)."""
    broker, _, topic_id = await _two_partition_broker(tmp_path)
    try:
        topic = broker.topic("t")
        broker.ownership.disown({(topic.topic_id, 0)})
        with pytest.raises(NoOwnerYet, match="retry with the same id"):
            await asyncio.wait_for(broker.acks.in_table(topic_id, {0: 1}), 5)
        await asyncio.wait_for(broker.acks.in_table(topic_id, {0: 0}), 5)  # committed before it left: answered
        await asyncio.wait_for(broker.acks.in_table(topic_id, {1: 0}), 5)  # still owned, committed
    finally:
        await broker.stop()


async def test_messages_a_node_claims_back_at_their_own_offsets_keep_the_id_their_hand_off_gave_them(
        tmp_path: Path) -> None:
    """A deposed owner sends its parked messages to the new owner, which may keep a copy in its WAL
    and lose the partition before committing it; the old owner then claims the partition back with
    no commit since its own and commits its copies at their offsets. Both copies must carry the
    same id, or the new owner's copy, appended again later or sent here, is stored a second time
    (the cluster soak saw ten messages of `orders` at offsets 56-65 and again at 107-116)."""
    broker, uri, topic_id = await _two_partition_broker(tmp_path)
    try:
        key = (topic_id, 0)
        [placed] = await broker.local.produce("t", [NewMessage(value=b"no id", partition=0)], AckMode.WAL)
        assert placed.offset == 1
        fencing.claim(delta.load(uri), {0: 2}, node="intruder")
        assert await broker.flusher.flush_once()
        assert key in broker.ownership.parked
        for _ in range(5):  # lifted above the intruder's epoch, then claimed back
            await broker.cluster.beat()
            if key in broker.ownership.epochs:
                break
        assert key in broker.ownership.epochs, "the node claims partition 0 back: no other node is alive"
        assert await broker.flusher.flush_once()
        producer = f"lakebroker-node:{broker.cluster.node}:0"
        rows = DeltaTable(uri).to_pyarrow_table(columns=["partition", "offset", "value", "producer_id", "sequence"])
        assert sorted((r for r in rows.to_pylist() if r["partition"] == 0), key=lambda r: r["offset"]) == [
            {"partition": 0, "offset": 0, "value": b"first", "producer_id": None, "sequence": None},
            {"partition": 0, "offset": 1, "value": b"no id", "producer_id": producer, "sequence": 1}], \
            "committed at its own offset, with the id its hand-off carried"

        # The copy the intruder kept, sent here with that id: known, not stored again.
        [again] = await broker.local.produce("t", [NewMessage(value=b"no id", partition=0, producer_id=producer,
                                                        sequence=1)], AckMode.WAL)
        assert (again.partition, again.offset, again.duplicate) == (0, 1, True)
        assert await broker.flusher.flush_once()
        assert _stored(uri) == [(0, 0, b"first"), (0, 1, b"no id"), (1, 0, b"first")]
    finally:
        await broker.stop()
