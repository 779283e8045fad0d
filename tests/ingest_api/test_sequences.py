"""Producer sequences on Arrow batches: a batch whose rows carry producer_id and sequence columns
keeps Kafka's idempotent-producer contract, so a re-send of any size within the dedup window stores
nothing twice, even with a dedup index far smaller than the write, and across a restart."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.arrow_batch import parse_arrow_batch
from lakebroker.ingest_api.body import InvalidShape
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.chunks import BatchResults
from lakebroker.ingest_api.messages import AckMode
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.sequences import RunPlacement
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import new_topic

ROWS = 5_000
LIMIT = 32 * 1024 * 1024


def _body(producer: str, first: int, n: int, keyed: bool = False) -> bytes:
    columns = {"value": pa.array([f"v{i}".encode() for i in range(first, first + n)], pa.binary()),
               "producer_id": pa.array([producer] * n), "sequence": pa.array(range(first, first + n), pa.int64())}
    if keyed:
        columns["key"] = pa.array([f"k{i % 7}" for i in range(first, first + n)])
    table = pa.table(columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _broker(tmp_path: Path) -> Broker:
    settings = Settings(data_dir=tmp_path / "data", dedup_max_entries=1_000)  # far below the write
    return Broker(settings, IngestMetrics(CollectorRegistry()))


async def _send(broker: Broker, producer: str, keyed: bool) -> int:
    """The write in requests of 1,000 rows, as a Spark task sends it; how many were duplicates."""
    duplicates = 0
    for first in range(0, ROWS, 1_000):
        body = parse_arrow_batch(_body(producer, first, 1_000, keyed), LIMIT)
        results = await broker.local.produce_columns("t", body, AckMode.WAL)
        duplicates += int(results.duplicate.sum())
    return duplicates


@pytest.mark.parametrize("keyed", [False, True])
async def test_a_resent_write_larger_than_the_dedup_index_stores_nothing_twice(tmp_path: Path, keyed: bool) -> None:
    broker = _broker(tmp_path)
    await broker.start()
    try:
        await broker.create_topic(new_topic("t", 3))
        assert await _send(broker, "write-1:0", keyed) == 0
        assert await _send(broker, "write-1:0", keyed) == ROWS, "every row of the re-send is a retry"
        assert await broker.flusher.flush_once()
    finally:
        await broker.stop()
    broker = _broker(tmp_path)  # the marks come back from the table at start
    await broker.start()
    try:
        assert await _send(broker, "write-1:0", keyed) == ROWS
        assert await _send(broker, "write-2:0", keyed) == 0, "another producer's sequences are its own"
        assert await broker.flusher.flush_once()
        rows = DeltaTable(broker.layout.topic_table("t")).to_pyarrow_table(columns=["producer_id", "sequence"])
    finally:
        await broker.stop()
    assert rows.num_rows == 2 * ROWS
    assert sorted(zip(rows["producer_id"].to_pylist(), rows["sequence"].to_pylist(), strict=True)) == sorted(
        (p, s) for p in ("write-1:0", "write-2:0") for s in range(ROWS))


def test_producer_id_and_sequence_come_together_and_are_checked() -> None:
    with pytest.raises(InvalidShape, match="come together"):
        parse_arrow_batch(_ipc_of({"value": pa.array([b"v"]), "producer_id": pa.array(["p"])}), LIMIT)
    with pytest.raises(InvalidShape, match="come together"):
        parse_arrow_batch(_ipc_of({"value": pa.array([b"v", b"w"]), "producer_id": pa.array(["p", None]),
                                   "sequence": pa.array([1, 2])}), LIMIT)
    with pytest.raises(InvalidShape, match="between 0 and"):
        parse_arrow_batch(_ipc_of({"value": pa.array([b"v"]), "producer_id": pa.array(["p"]),
                                   "sequence": pa.array([-1])}), LIMIT)
    with pytest.raises(InvalidShape, match="between 0 and"):
        parse_arrow_batch(_ipc_of({"value": pa.array([b"v"]), "producer_id": pa.array(["p"]),
                                   "sequence": pa.array([2**64 - 1], pa.uint64())}), LIMIT)
    batch = parse_arrow_batch(_ipc_of({"value": pa.array([b"v"]), "producer_id": pa.array(["p"]),
                                       "sequence": pa.array([7], pa.uint8())}), LIMIT)
    assert batch.columns.column("sequence").to_pylist() == [7]


def _ipc_of(columns: dict[str, pa.Array]) -> bytes:
    table = pa.table(columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _to_partition(partition: int, sequences: list[int]) -> bytes:
    table = pa.table({"value": pa.array([b"p%d-s%d" % (partition, s) for s in sequences], pa.binary()),
                      "partition": pa.array([partition] * len(sequences), pa.int64()),
                      "producer_id": pa.array(["kafka-like"] * len(sequences)),
                      "sequence": pa.array(sequences, pa.int64())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


async def test_a_producers_sequences_run_per_partition_and_restart_in_each(tmp_path: Path) -> None:
    """Sequence 0 to partition 0 and sequence 0 to partition 1 are two messages, as in Kafka, whose
    producers count from 0 in every partition: neither is a duplicate of the other, as Arrow columns
    or one message at a time, and each keeps its own placement. A retry is still one."""
    from lakebroker.ingest_api.messages import NewMessage

    broker = _broker(tmp_path)
    await broker.start()
    try:
        await broker.create_topic(new_topic("t", 2))
        first = await broker.local.produce_columns("t", parse_arrow_batch(_to_partition(0, [0, 1, 2]), LIMIT),
                                                   AckMode.WAL)
        other = await broker.local.produce_columns("t", parse_arrow_batch(_to_partition(1, [0, 1, 2]), LIMIT),
                                                   AckMode.WAL)
        assert (first.partition.tolist(), first.duplicate.tolist()) == ([0, 0, 0], [False] * 3)
        assert (other.partition.tolist(), other.offset.tolist(), other.duplicate.tolist()) == (
            [1, 1, 1], [0, 1, 2], [False] * 3)
        again = await broker.local.produce_columns("t", parse_arrow_batch(_to_partition(1, [1, 2]), LIMIT),
                                                   AckMode.WAL)
        assert (again.partition.tolist(), again.offset.tolist(), again.duplicate.tolist()) == (
            [1, 1], [1, 2], [True, True])

        (one,) = await broker.local.produce("t", [NewMessage(value=b"x", partition=1, producer_id="q", sequence=0)],
                                            AckMode.WAL)
        (two,) = await broker.local.produce("t", [NewMessage(value=b"y", partition=0, producer_id="q", sequence=0)],
                                            AckMode.WAL)
        assert (one.partition, one.duplicate, two.partition, two.offset, two.duplicate) == (1, False, 0, 3, False)
        await broker.flusher.flush_once()
        rows = DeltaTable(str(broker.layout.topic_table(broker.topic("t")))).to_pyarrow_table(
            columns=["partition", "value"]).to_pylist()
        assert sorted((r["partition"], r["value"]) for r in rows) == sorted(
            [(0, b"p0-s%d" % s) for s in range(3)] + [(1, b"p1-s%d" % s) for s in range(3)] + [(1, b"x"), (0, b"y")])
    finally:
        await broker.stop()


async def test_a_run_of_sequences_is_deduplicated_as_one_and_a_retry_gets_its_offsets(tmp_path: Path) -> None:
    """A request whose rows are one producer's consecutive sequences in a partition (a Kafka record
    batch) is one entry, not an id per message: a retry of all or part of it is answered with the
    original offsets and times, a retry sent while the first is in flight waits for it, and a run
    that reaches past a stored one stores only its new sequences."""
    import asyncio

    broker = _broker(tmp_path)
    await broker.start()
    try:
        await broker.create_topic(new_topic("t", 2))

        async def send(sequences: list[int], ack: AckMode = AckMode.WAL) -> BatchResults:
            return await broker.local.produce_columns("t", parse_arrow_batch(_to_partition(0, sequences), LIMIT), ack)

        first = await send([0, 1, 2, 3, 4])
        assert (first.offset.tolist(), first.duplicate.tolist()) == ([0, 1, 2, 3, 4], [False] * 5)
        assert len(broker.dedup) == 0, "a run takes no dedup id per message"
        again = await send([0, 1, 2, 3, 4])
        assert (again.offset.tolist(), again.duplicate.tolist()) == ([0, 1, 2, 3, 4], [True] * 5)
        assert again.timestamp_us.tolist() == first.timestamp_us.tolist()
        part = await send([2, 3], AckMode.NONE)
        assert (part.partition.tolist(), part.offset.tolist(), part.duplicate.tolist()) == (
            [0, 0], [2, 3], [True, True])

        past = await send([3, 4, 5, 6])
        assert (past.duplicate.tolist(), past.offset.tolist()[2:]) == ([True, True, False, False], [5, 6])

        one, other = await asyncio.gather(send([7, 8, 9]), send([7, 8, 9]))
        assert one.offset.tolist() == other.offset.tolist() == [7, 8, 9]
        assert sorted([one.duplicate.tolist(), other.duplicate.tolist()]) == [[False] * 3, [True] * 3]

        await broker.flusher.flush_once()
        rows = DeltaTable(str(broker.layout.topic_table(broker.topic("t")))).to_pyarrow_table(
            columns=["offset", "value"]).sort_by("offset").to_pylist()
        assert [(r["offset"], r["value"]) for r in rows] == [(s, b"p0-s%d" % s) for s in range(10)]
    finally:
        await broker.stop()


def test_a_run_stored_in_several_chunks_answers_each_sequence_with_its_offset() -> None:
    """Other requests' single messages may be placed between a run's chunks: each sequence's
    offset comes from the chunk that holds it."""
    placement = RunPlacement(((10, 100, 3, 7), (13, 105, 2, 9)))
    offsets, times = placement.placed(11, 14)
    assert (offsets.tolist(), times.tolist()) == ([101, 102, 105, 106], [7, 7, 9, 9])
    assert placement.timestamp_us == 9
