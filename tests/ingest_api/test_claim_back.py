"""A partition taken back: this node lost a partition while it still held messages of it, another
node committed to it, and this node claimed it again. Every message it had accepted, wherever it
sat (pending in the flusher, in a flush under way, inside the WAL writer, parked), is stored once
at a new offset after the other node's rows, or failed to its waiter; none is dropped as "already in
the table", and no offset is answered for two messages."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.body import batch_items
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.chunks import CHUNK_SCHEMA, Chunk, chunk_bytes
from lakebroker.ingest_api.columnar import columns_of
from lakebroker.ingest_api.flush_rows import records_to_arrow
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.not_here import NoOwnerYet
from lakebroker.ingest_api.records import Record
from lakebroker.tables import delta, fencing
from lakebroker.tables.errors import StorageUnavailable
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicConfig, new_topic


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    settings = Settings(data_dir=tmp_path / "data", flush_interval_ms=3_600_000)  # flushed only when asked
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        topic = await broker.create_topic(new_topic("t", 1))
        await broker.local.produce("t", [NewMessage(value=b"first", partition=0)], AckMode.WAL)
        assert await broker.flusher.flush_once()
        assert topic.partitions == 1
        yield broker
    finally:
        await broker.stop()


def _rows(uri: str) -> list[tuple[int, bytes]]:
    rows = DeltaTable(uri).to_pyarrow_table(columns=["offset", "value"]).to_pylist()
    return sorted((r["offset"], r["value"]) for r in rows)


def _intruder_commits_one_row(uri: str, topic: TopicConfig) -> None:
    """Another node claims partition 0 (epoch 2) and commits one row at offset 1."""
    fencing.claim(delta.load(uri), {0: 2}, node="intruder")
    row = Record("t", bytes.fromhex(topic.topic_id), 0, 1, 1, None, b"B-row", "binary", None, None, None, None)
    delta.append(delta.load(uri), records_to_arrow([row]), txns=fencing.commit_txns("intruder", {0: 2}, {0: 2}))


async def _claim_back(broker: Broker, key: tuple[bytes, int]) -> None:
    """Lifted above the intruder's epoch, then claimed back (no other node is alive) and opened. A
    claim by the background heartbeat opens in a task of its own, which a loaded machine can keep
    going after the beats asked for here: so beats until it is open, within a deadline."""
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        await broker.cluster.beat()
        if key in broker.ownership.epochs:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the node did not claim partition 0 back within 60 s")


def _key(broker: Broker) -> tuple[bytes, int]:
    return bytes.fromhex(broker.topic("t").topic_id), 0


async def _answers(broker: Broker, values: list[bytes]) -> list[Any]:
    return [(r.partition, r.offset) for r in
            await broker.local.produce("t", [NewMessage(value=v, partition=0) for v in values], AckMode.WAL)]


def _check_each_stored_once(uri: str, moved: list[bytes], after_claim: dict[bytes, int]) -> None:
    """`moved` were taken before the partition moved (placed again, in their order, after the other
    node's row); `after_claim` were acknowledged after the claim, at these offsets."""
    rows = _rows(uri)
    offsets = [o for o, _ in rows]
    assert offsets == list(range(len(rows))), f"dense offsets: {rows}"
    values = [v for _, v in rows]
    assert sorted(values) == sorted([b"first", b"B-row", *moved, *after_claim]), f"every message once: {rows}"
    assert values[:2] == [b"first", b"B-row"]
    assert [v for v in values if v in moved] == moved, f"in the order they were taken: {rows}"
    for value, offset in after_claim.items():
        assert (offset, value) in rows, f"{value!r} was acknowledged at {offset}: {rows}"


async def test_messages_pending_in_the_flusher_are_placed_again_after_the_other_nodes_rows(broker: Broker) -> None:
    uri, key = broker.layout.topic_table("t"), _key(broker)
    async with broker.flusher.commit_lock:  # a slow flush: nothing is committed meanwhile
        old = await _answers(broker, [b"A0", b"A1", b"A2"])
        assert old == [(0, 1), (0, 2), (0, 3)]
        broker.ownership.disown({(broker.topic("t").topic_id, 0)})
        _intruder_commits_one_row(uri, broker.topic("t"))
        await _claim_back(broker, key)
        [(_, n1)] = await _answers(broker, [b"N1"])
    for _ in range(3):
        await asyncio.sleep(0.05)
        assert await broker.flusher.flush_once()
    _check_each_stored_once(uri, [b"A0", b"A1", b"A2"], {b"N1": n1})


@contextlib.contextmanager
def _held_wal(broker: Broker) -> Iterator[threading.Event]:
    """The WAL writer held until the event is set (every group through the writer thread, not
    inline); released and restored on the way out."""
    release = threading.Event()
    real_append = broker.wal.append

    def slow_append(*args: Any, **kwargs: Any) -> Any:
        release.wait(30)
        return real_append(*args, **kwargs)

    broker.wal.append = slow_append  # type: ignore[method-assign]
    broker.committer.disk.never()
    try:
        yield release
    finally:
        release.set()
        broker.wal.append = real_append  # type: ignore[method-assign]


async def test_messages_inside_the_wal_writer_are_placed_again_after_the_other_nodes_rows(broker: Broker) -> None:
    """As above, with A0..A2 given offsets but not yet durable when the partition moves: their write
    lands after the claim, so their producers are told the partition moved (retry with the same id)
    rather than answered at offsets that are the other node's now, and they are placed again."""
    uri, key = broker.layout.topic_table("t"), _key(broker)
    with _held_wal(broker) as release:
        writing = asyncio.ensure_future(_answers(broker, [b"A0", b"A1", b"A2"]))
        await asyncio.sleep(0.1)
        assert not writing.done()
        broker.ownership.disown({(broker.topic("t").topic_id, 0)})
        _intruder_commits_one_row(uri, broker.topic("t"))
        await _claim_back(broker, key)
        n1 = asyncio.ensure_future(_answers(broker, [b"N1"]))
        await asyncio.sleep(0.05)
        release.set()
        with pytest.raises(NoOwnerYet, match="retry with the same id"):
            await writing
        [(_, n1_offset)] = await n1
    for _ in range(3):
        await asyncio.sleep(0.05)
        assert await broker.flusher.flush_once()
    _check_each_stored_once(uri, [b"A0", b"A1", b"A2"], {b"N1": n1_offset})


async def test_a_failed_wal_write_never_rolls_offsets_below_a_claimed_end(broker: Broker) -> None:
    """A write handed before the partition moved fails after it was claimed back: the offsets roll
    back to where the claim left them, never below the other node's rows."""
    uri, key = broker.layout.topic_table("t"), _key(broker)
    release = threading.Event()
    real_append = broker.wal.append
    failed: list[bool] = []

    def failing_append(*args: Any, **kwargs: Any) -> Any:
        release.wait(30)
        if not failed:
            failed.append(True)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(*args, **kwargs)

    broker.wal.append = failing_append  # type: ignore[method-assign]
    broker.committer.disk.never()
    try:
        writing = asyncio.ensure_future(_answers(broker, [b"A0", b"A1", b"A2"]))
        await asyncio.sleep(0.1)
        broker.ownership.disown({(broker.topic("t").topic_id, 0)})
        _intruder_commits_one_row(uri, broker.topic("t"))
        await _claim_back(broker, key)
        release.set()
        with pytest.raises(StorageUnavailable):
            await writing
    finally:
        release.set()
        broker.wal.append = real_append  # type: ignore[method-assign]
    [(_, n1)] = await _answers(broker, [b"N1"])
    assert n1 == 2, "the next offset after the other node's row"
    assert await broker.flusher.flush_once()
    assert _rows(uri) == [(0, b"first"), (1, b"B-row"), (2, b"N1")]


async def test_messages_appended_again_keep_their_order_past_a_full_group(broker: Broker) -> None:
    """A WAL backlog appended again alternates batch chunks and single records: single messages may
    move ahead of other requests' chunks into a group, but these are one partition's log, and
    their order must hold however the groups are cut."""
    topic = broker.topic("t")
    topic_id = bytes.fromhex(topic.topic_id)
    broker.committer._max_group = 4  # a group is full after 4 messages, as after 65,536 in production

    def chunk(first: int, values: list[bytes]) -> Chunk:
        columns = pa.Table.from_pylist([{"value": v, "format": "binary"} for v in values], schema=CHUNK_SCHEMA)
        return Chunk("t", topic_id, 0, first, 1, columns, chunk_bytes(columns))

    def record(offset: int, value: bytes) -> Record:
        return Record("t", topic_id, 0, offset, 1, None, value, "binary", None, None, None, None)

    items: list[Record | Chunk] = [chunk(1, [b"c0", b"c1", b"c2", b"c3", b"c4"]), record(6, b"r5"),
                                   chunk(7, [b"c6", b"c7"]), record(9, b"r8"), record(10, b"r9")]
    broker.ownership._append_again(topic, items, (topic_id, 0), set())
    await asyncio.sleep(0.2)
    assert await broker.flusher.flush_once()
    assert [v for _, v in _rows(broker.layout.topic_table("t"))] == [
        b"first", b"c0", b"c1", b"c2", b"c3", b"c4", b"r5", b"c6", b"c7", b"r8", b"r9"]


async def _retry_while_placed_again(broker: Broker, produce_first: Any) -> None:
    """A0..A2 (with ids) are durable and pending when the partition moves; it is claimed back, and
    while their copies appended again are not yet durable, A1's producer retries at ack=table. The
    retry is answered where A1 is stored now, not at the offset it had before the move (the other
    node's row, or another message, sits there)."""
    uri, key = broker.layout.topic_table("t"), _key(broker)
    async with broker.flusher.commit_lock:
        await produce_first()
        broker.ownership.disown({(broker.topic("t").topic_id, 0)})
        _intruder_commits_one_row(uri, broker.topic("t"))
        with _held_wal(broker) as release:
            await _claim_back(broker, key)
            retry = asyncio.ensure_future(broker.local.produce(
                "t", [NewMessage(value=b"A1", partition=0, message_id="A1")], AckMode.TABLE))
            await asyncio.sleep(0.1)
            release.set()
    for _ in range(20):
        await asyncio.sleep(0.05)
        assert await broker.flusher.flush_once()
        if retry.done():
            break
    [answer] = await asyncio.wait_for(retry, 10)
    assert answer.duplicate
    rows = dict(_rows(uri))
    assert rows.get(answer.offset) == b"A1", f"the retry of A1 was answered at {answer.offset}: {sorted(rows.items())}"
    _check_each_stored_once(uri, [b"A0", b"A1", b"A2"], {})


async def test_a_retry_while_its_message_is_placed_again_is_answered_at_the_new_offset(broker: Broker) -> None:
    async def produce_first() -> None:
        answers = await broker.local.produce(
            "t", [NewMessage(value=v, partition=0, message_id=v.decode()) for v in (b"A0", b"A1", b"A2")],
            AckMode.WAL)
        assert [(r.partition, r.offset) for r in answers] == [(0, 1), (0, 2), (0, 3)]

    await _retry_while_placed_again(broker, produce_first)


async def test_a_retry_while_its_batch_chunk_is_placed_again_is_answered_at_the_new_offset(broker: Broker) -> None:
    async def produce_first() -> None:
        body = orjson.dumps({"messages": [{"value": v, "id": v, "partition": 0} for v in ("A0", "A1", "A2")]})
        batch = columns_of(batch_items("application/json", body))
        assert batch is not None, "a batch the columnar path takes: its messages are one chunk"
        answers = await broker.local.produce_columns("t", batch, AckMode.WAL)
        assert answers.offset.tolist() == [1, 2, 3]

    await _retry_while_placed_again(broker, produce_first)
