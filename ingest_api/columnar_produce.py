"""Produce for a batch held as Arrow columns (an Arrow body, or a JSON batch parsed to columns).

The same rules and answers as `Broker.produce` message by message (partitions, dedup, offsets,
acks), with per-message Python only for messages that carry an id: the dedup index is per id.
A batch whose messages carry no id and whose partitions are each one run of the request is
stored as slices of the request (`_produce_runs`), a few array operations per request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from lakebroker.ingest_api.acks import Acks
from lakebroker.ingest_api.admission import Admission
from lakebroker.ingest_api.chunks import (
    BatchResults,
    Chunk,
    ColumnarBatch,
    chunk_bytes,
    one_array,
    spans_by_bytes,
    split_by_bytes,
)
from lakebroker.ingest_api.dedup import DedupIndex, DedupKey, Placed, dedup_ids, spread_ids
from lakebroker.ingest_api.group_commit import GroupCommitter, PendingChunk
from lakebroker.ingest_api.messages import AckMode
from lakebroker.ingest_api.ownership import Ownership, remember_placed
from lakebroker.ingest_api.partitioner import Partitioner
from lakebroker.ingest_api.sequences import SequenceMarks, chunk_marks
from lakebroker.tables.topics import TopicConfig


class ColumnarProduce:
    def __init__(self, *, admission: Admission, partitioner: Partitioner, ownership: Ownership, dedup: DedupIndex,
                 marks: SequenceMarks, committer: GroupCommitter, acks: Acks) -> None:
        self.admission = admission
        self.partitioner = partitioner
        self.ownership = ownership
        self.dedup = dedup
        self.marks = marks
        self.committer = committer
        self.acks = acks

    async def produce(self, topic: TopicConfig, batch: ColumnarBatch, ack: AckMode) -> BatchResults:
        """`Broker.produce` for a batch held as columns: the same answers, partitions, offsets and rows,
        with per-message Python only for messages that carry an id (the dedup index is per id)."""
        sizes = await self.admission.admit_columns(topic, batch)
        started = time.perf_counter()
        n = batch.rows
        producers = one_array(batch.columns.column("producer_id"))
        sequenced = producers.null_count < n  # an Arrow batch's producer_id and sequence columns (sequences.py)
        message_ids = one_array(batch.columns.column("message_id"))
        sequences = one_array(batch.columns.column("sequence"))
        ids = message_ids  # then their dedup ids, null where none
        if sequenced:
            ids = spread_ids(message_ids, producers, sequences)
        elif ids.null_count < n:
            ids = dedup_ids(ids)
        # Every message's partition, duplicates too (they take their turn in the keyless runs
        # as on the per-message path), checked before the dedup index hears of any id.
        everyone = self.partitioner.columns(topic, batch.partitions, one_array(batch.columns.column("key")), sizes,
                                            ids)
        if sequenced:  # a producer's sequences are per partition
            ids = dedup_ids(message_ids, producers, sequences, pa.array(everyone))
        topic_id = bytes.fromhex(topic.topic_id)
        runs = _runs(everyone)
        self.ownership.check_open(topic, topic_id, {p for p, _, _ in runs} if runs is not None else
                         set(np.flatnonzero(np.bincount(everyone)).tolist()))
        if runs is not None and ids.null_count == n:
            return await self._produce_runs(topic, topic_id, batch.columns, everyone, runs, sizes, ack, started)
        results = BatchResults(np.full(n, -1, np.int32), np.full(n, -1, np.int64), np.zeros(n, np.bool_),
                               np.full(n, -1, np.int64))
        keep = np.ones(n, np.bool_)
        waits: list[tuple[int, asyncio.Future[Placed]]] = []  # duplicates of messages in flight
        placing: dict[int, asyncio.Future[Placed]] = {}  # row → its id's future, for new messages with an id
        if ids.null_count < n:
            marks = None
            if sequenced:
                marks = (everyone.tolist(), producers.to_pylist(), batch.columns.column("sequence").to_pylist(),
                         one_array(batch.columns.column("message_id")).is_null().to_pylist())
            self._dedup_columns(topic, ids.to_pylist(), results, keep, waits, placing, marks)
        kept = np.flatnonzero(keep)
        columns = batch.columns if len(kept) == n else batch.columns.take(pa.array(kept))
        parts = everyone if len(kept) == n else everyone[kept]
        results.partition[kept] = parts
        loop = asyncio.get_running_loop()
        order, by_partition = _grouped(parts, columns)
        bounds = np.flatnonzero(np.diff(parts[order])) + 1
        placed: list[tuple[np.ndarray, asyncio.Future[Chunk]]] = []
        kept_sizes = sizes[kept]
        pieces = (piece for run in (np.split(np.arange(len(order)), bounds) if len(order) else [])
                  for piece in split_by_bytes(run, kept_sizes[order[run]]))
        for span in pieces:  # positions in `order`, consecutive
            rows = order[span]
            part = by_partition.slice(int(span[0]), len(span))
            chunk = Chunk(topic.name, topic_id, int(parts[rows[0]]), -1, 0, part, chunk_bytes(part))
            where = kept[rows]  # request positions, in offset order
            mine = [(i, placing[r]) for i, r in enumerate(where.tolist()) if r in placing] if placing else []
            future: asyncio.Future[Chunk] | None = None
            if ack is not AckMode.NONE or mine:
                future = loop.create_future()
                placed.append((where, future))
            if mine:
                assert future is not None
                future.add_done_callback(_settle_ids(mine))
                if sequenced:
                    future.add_done_callback(self._raise_marks())
            self.committer.submit([PendingChunk(chunk, future)])
        self.acks.queued(topic.name, ack.value, len(kept))
        if ack is AckMode.NONE:
            for i, hit in waits:
                if hit.done() and not hit.exception():
                    results.partition[i], results.offset[i], results.timestamp_us[i] = hit.result()
            return results
        await asyncio.gather(*(f for _, f in placed), *(f for _, f in waits), return_exceptions=True)
        for where, done in placed:
            chunk = done.result()  # re-raises StorageUnavailable for a group that failed
            results.offset[where] = np.arange(chunk.offset, chunk.end, dtype=np.int64)
            results.timestamp_us[where] = chunk.timestamp_us
        for i, hit in waits:
            results.partition[i], results.offset[i], results.timestamp_us[i] = hit.result()
        if ack is AckMode.TABLE:
            highest = {int(p): int(results.offset[results.partition == p].max()) for p in np.unique(results.partition)}
            await self.acks.in_table(topic_id, highest)
        self.acks.answered(topic.name, ack.value, started, int(results.duplicate.sum()))
        return results

    async def _produce_runs(self, topic: TopicConfig, topic_id: bytes, columns: pa.Table, partitions: np.ndarray,
                            runs: list[tuple[int, int, int]], sizes: np.ndarray, ack: AckMode,
                            started: float) -> BatchResults:
        """`produce_columns` for a batch whose messages carry no id, each partition's messages one
        run of the request (keyless runs, a batch for one partition): every message is stored, in
        chunks that are slices of the request, and its answers filled in by slices. A few array
        operations per request, each of which lets other threads take the GIL from the event loop."""
        loop = asyncio.get_running_loop()
        spans: list[tuple[int, int, asyncio.Future[Chunk] | None]] = []
        for partition, first, end in runs:
            for start, stop, size in spans_by_bytes(sizes, first, end):
                part = columns.slice(start, stop - start)
                future: asyncio.Future[Chunk] | None = None if ack is AckMode.NONE else loop.create_future()
                self.committer.submit([PendingChunk(Chunk(topic.name, topic_id, partition, -1, 0, part, size), future)])
                spans.append((start, stop, future))
        n = len(partitions)
        self.acks.queued(topic.name, ack.value, n)
        if ack is AckMode.NONE:
            return BatchResults(partitions, np.full(n, -1, np.int64), np.zeros(n, np.bool_), np.full(n, -1, np.int64))
        await asyncio.gather(*(f for _, _, f in spans if f is not None), return_exceptions=True)
        results = BatchResults(partitions, np.empty(n, np.int64), np.zeros(n, np.bool_), np.empty(n, np.int64),
                               complete=True)
        highest: dict[int, int] = {}
        for start, stop, done in spans:  # together they cover the request
            assert done is not None
            chunk = done.result()  # re-raises StorageUnavailable for a group that failed
            results.offset[start:stop] = np.arange(chunk.offset, chunk.end, dtype=np.int64)
            results.timestamp_us[start:stop] = chunk.timestamp_us
            highest[chunk.partition] = chunk.end - 1
        if ack is AckMode.TABLE:
            await self.acks.in_table(topic_id, highest)
        self.acks.answered(topic.name, ack.value, started, 0)
        return results

    def _dedup_columns(self, topic: TopicConfig, ids: list[str | None], results: BatchResults, keep: np.ndarray,
                       waits: list[tuple[int, asyncio.Future[Placed]]],
                       placing: dict[int, asyncio.Future[Placed]],
                       marks: tuple[list[int], list[str | None], list[int | None], list[bool]] | None) -> None:
        """As `produce` does per message: a known id answers with its original placement, an id
        in flight waits for it, a new id is registered before any later message can look it up.
        With `marks` (each message's partition, producer id, sequence, and whether it has no
        message id), an unknown id whose sequence is at or below its producer's mark in its
        partition is a retry too, of a message placed at an offset no longer known (sequences.py)."""
        loop = asyncio.get_running_loop()
        for i, did in enumerate(ids):
            if did is None:
                continue
            key: DedupKey = (topic.topic_id, did)
            hit = self.dedup.lookup(key)
            if hit is None and marks is not None and marks[3][i] and (producer := marks[1][i]) is not None:
                partition, sequence = marks[0][i], marks[2][i]
                assert sequence is not None
                if self.marks.covers((topic.topic_id, partition, producer), sequence):
                    keep[i] = False
                    results.duplicate[i] = True
                    results.partition[i] = partition
                    continue
            if hit is None:
                future: asyncio.Future[Placed] = loop.create_future()
                self.dedup.begin(key, future)
                future.add_done_callback(remember_placed(self.dedup, key))
                placing[i] = future
                continue
            keep[i] = False
            results.duplicate[i] = True
            if isinstance(hit, tuple):
                results.partition[i], results.offset[i], results.timestamp_us[i] = hit
            else:
                waits.append((i, hit))

    def _raise_marks(self) -> Callable[[asyncio.Future[Chunk]], None]:
        """A durable chunk of sequenced messages: its producers' marks in its partition."""

        def done(future: asyncio.Future[Chunk]) -> None:
            if not future.cancelled() and future.exception() is None:
                self.marks.raise_all(chunk_marks(future.result()))

        return done


def _runs(parts: np.ndarray) -> list[tuple[int, int, int]] | None:
    """(partition, start, end) of each run of a request's partitions, when each partition is one
    run (keyless runs, one partition); else None."""
    if len(parts) < 2:
        return [(int(parts[0]), 0, 1)] if len(parts) else []
    starts = np.flatnonzero(parts[1:] != parts[:-1])
    if len(starts) >= 64:
        return None
    bounds = [0, *(starts + 1).tolist(), len(parts)]
    partitions = [int(parts[i]) for i in bounds[:-1]]
    if len(set(partitions)) < len(partitions):
        return None
    return list(zip(partitions, bounds[:-1], bounds[1:], strict=True))


def _grouped(parts: np.ndarray, columns: pa.Table) -> tuple[np.ndarray, pa.Table]:
    """The rows in an order that makes each partition's rows one run, and the columns in it:
    as they are when each partition already is one run (keyless runs, a sorted batch), else
    one stable gather."""
    if _runs(parts) is not None:  # (also nothing kept: every message a duplicate)
        return np.arange(len(parts)), columns
    order = np.argsort(parts, kind="stable")
    return order, columns.take(pa.array(order))


def _settle_ids(ids: list[tuple[int, asyncio.Future[Placed]]]) -> Callable[[asyncio.Future[Chunk]], None]:
    """Once a chunk is durable (or failed), answer the dedup futures of its messages that carry an id."""

    def done(chunk_future: asyncio.Future[Chunk]) -> None:
        failure = chunk_future.exception() if not chunk_future.cancelled() else asyncio.CancelledError()
        if failure is not None:
            for _, future in ids:
                if not future.done():
                    future.set_exception(failure)
            return
        chunk = chunk_future.result()
        for rank, future in ids:
            if not future.done():
                future.set_result((chunk.partition, chunk.offset + rank, chunk.timestamp_us))

    return done


