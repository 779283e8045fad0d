"""Produce for a batch held as Arrow columns (an Arrow body, or a JSON batch parsed to columns).

The same rules and answers as `Broker.produce` message by message (partitions, dedup, offsets,
acks), with per-message Python only for messages that carry an id: the dedup index is per id.
A batch whose messages carry no id and whose partitions are each one run of the request is
stored as slices of the request (`_produce_runs`), a few array operations per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
from lakebroker.ingest_api.dedup import DedupIndex, DedupKey, Placed, dedup_id, dedup_ids, remember_placed, spread_ids
from lakebroker.ingest_api.group_commit import GroupCommitter, PendingChunk
from lakebroker.ingest_api.messages import AckMode
from lakebroker.ingest_api.ownership import Ownership
from lakebroker.ingest_api.partitioner import Partitioner
from lakebroker.ingest_api.sequences import (
    KAFKA_SEQUENCES,
    Found,
    MarkKey,
    OutOfOrderSequence,
    RunPlacement,
    SequenceMarks,
    chunk_marks,
)
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
        if sequenced:  # what spreads keyless messages without an explicit partition (a retry lands alike)
            ids = spread_ids(message_ids, producers, sequences) if batch.partitions.null_count else message_ids
        elif ids.null_count < n:
            ids = dedup_ids(ids)
        # Every message's partition, duplicates too (they take their turn in the keyless runs
        # as on the per-message path), checked before the dedup index hears of any id.
        everyone = self.partitioner.columns(topic, batch.partitions, one_array(batch.columns.column("key")), sizes,
                                            ids)
        topic_id = bytes.fromhex(topic.topic_id)
        runs = _runs(everyone)
        plans: list[_RunPlan] | None = None
        expected: dict[int, int] = {}  # a Kafka producer's next sequence in each partition, where known
        if sequenced and runs is not None and message_ids.null_count == n:
            if batch.consecutive:
                counted, expected = self._follow_on(topic, runs, producers, sequences)
                if counted is not sequences:
                    sequences = counted
                    batch = dataclasses.replace(batch, columns=batch.columns.set_column(
                        batch.columns.schema.get_field_index("sequence"), "sequence", counted))
            plans = self._plan_runs(topic, runs, producers, sequences)
            if plans is None:  # not one producer's consecutive sequences, or not cleanly new or a retry
                await self._settle_overlaps(topic, runs, producers)
        if sequenced and plans is None:  # a producer's sequences are per partition
            ids = dedup_ids(message_ids, producers, sequences, pa.array(everyone))
        self.ownership.check_open(topic, topic_id, {p for p, _, _ in runs} if runs is not None else
                         set(np.flatnonzero(np.bincount(everyone)).tolist()))
        if plans is not None:
            _check_follow_on(plans, expected)
        if runs is not None and (plans is not None or ids.null_count == n):
            return await self._produce_runs(topic, topic_id, batch.columns, everyone, runs, sizes, ack, started,
                                            plans, batch.queued)
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
        if batch.queued is not None:
            batch.queued.set()
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
                            started: float, plans: list[_RunPlan] | None = None,
                            queued: asyncio.Event | None = None) -> BatchResults:
        """`produce_columns` for a batch whose messages carry no id, each partition's messages one
        run of the request (keyless runs, a batch for one partition): every message is stored, in
        chunks that are slices of the request, and its answers filled in by slices. A few array
        operations per request, each of which lets other threads take the GIL from the event loop.
        With `plans`, each run is one producer's consecutive sequences, deduplicated as one run
        (sequences.py): a retried run is answered from where it was stored, a new one is stored."""
        loop = asyncio.get_running_loop()
        spans: list[tuple[int, int, asyncio.Future[Chunk] | None]] = []
        retries: list[tuple[int, int, _RunPlan]] = []
        n = len(partitions)
        for k, (partition, first, end) in enumerate(runs):
            plan = plans[k] if plans is not None else None
            if plan is not None and plan.retry is not None:
                retries.append((first, end, plan))
                continue
            pieces: list[tuple[int, asyncio.Future[Chunk]]] = []
            for start, stop, size in spans_by_bytes(sizes, first, end):
                part = columns.slice(start, stop - start)
                future: asyncio.Future[Chunk] | None = None
                if ack is not AckMode.NONE or plan is not None:
                    future = loop.create_future()
                    if plan is not None:
                        pieces.append((plan.first + start - first, future))
                self.committer.submit([PendingChunk(Chunk(topic.name, topic_id, partition, -1, 0, part, size), future)])
                spans.append((start, stop, future))
            if plan is not None:
                self.marks.begin_run(plan.key, plan.first, plan.last, _run_placement(pieces))
        if queued is not None:
            queued.set()
        stored = n - sum(end - first for first, end, _ in retries)
        self.acks.queued(topic.name, ack.value, stored)
        results = BatchResults(partitions, np.full(n, -1, np.int64), np.zeros(n, np.bool_), np.full(n, -1, np.int64),
                               complete=not retries)
        for first, end, _ in retries:
            results.duplicate[first:end] = True
        if ack is AckMode.NONE:
            for first, end, plan in retries:
                if isinstance(plan.retry, RunPlacement):
                    results.offset[first:end], results.timestamp_us[first:end] = plan.retry.placed(plan.first,
                                                                                                   plan.last)
            return results
        await asyncio.gather(*(f for _, _, f in spans if f is not None),
                             *(p.retry for _, _, p in retries if isinstance(p.retry, asyncio.Future)),
                             return_exceptions=True)
        highest: dict[int, int] = {}
        for start, stop, done in spans:  # together with the retries they cover the request
            assert done is not None
            chunk = done.result()  # re-raises StorageUnavailable for a group that failed
            results.offset[start:stop] = np.arange(chunk.offset, chunk.end, dtype=np.int64)
            results.timestamp_us[start:stop] = chunk.timestamp_us
            highest[chunk.partition] = max(highest.get(chunk.partition, -1), chunk.end - 1)
        for first, end, plan in retries:
            placement = plan.retry.result() if isinstance(plan.retry, asyncio.Future) else plan.retry
            assert placement is not None
            results.offset[first:end], results.timestamp_us[first:end] = placement.placed(plan.first, plan.last)
            partition = int(partitions[first])
            highest[partition] = max(highest.get(partition, -1), int(results.offset[end - 1]))
        if ack is AckMode.TABLE:
            await self.acks.in_table(topic_id, highest)
        self.acks.answered(topic.name, ack.value, started, n - stored)
        return results

    def _plan_runs(self, topic: TopicConfig, runs: list[tuple[int, int, int]], producers: pa.Array,
                   sequences: pa.Array) -> list[_RunPlan] | None:
        """Each run as one producer's consecutive sequences, new or a retry of one run it sent;
        None when any run is not (the per-message path then sorts it out)."""
        plans: list[_RunPlan] = []
        for partition, first, end in runs:
            who = producers.slice(first, end - first)
            numbers = sequences.slice(first, end - first)
            if who.null_count or numbers.null_count:
                return None
            producer = who[0].as_py()
            if end - first > 1 and pc.count_distinct(who).as_py() != 1:
                return None
            seq = numbers.to_numpy(zero_copy_only=False)
            low, high = int(seq[0]), int(seq[-1])
            if high - low != len(seq) - 1 or (len(seq) > 1 and not bool((np.diff(seq) == 1).all())):
                return None
            key = (topic.topic_id, partition, producer)
            found = self.marks.find_run(key, low, high)
            if found is Found.OVERLAP:
                return None
            if found is Found.NEW:
                # a send of these sequences on the per-message path (an earlier overlap) is in the
                # dedup index, or in flight there
                if any(self.dedup.lookup((topic.topic_id, did)) is not None for did in
                       {dedup_id(None, producer, low, partition), dedup_id(None, producer, high, partition)}
                       if did is not None):
                    return None
                plans.append(_RunPlan(key, low, high, None))
            else:
                plans.append(_RunPlan(key, low, high, found))
        return plans

    def _follow_on(self, topic: TopicConfig, runs: list[tuple[int, int, int]], producers: pa.Array,
                   sequences: pa.Array) -> tuple[pa.Array, dict[int, int]]:
        """A Kafka batch's runs against their producers' marks (sequences.py): each partition's next
        sequence, where known, and the sequences as counted on past Kafka's wrap to 0 after
        2^31 - 1 (the count nearest the next one); `sequences` itself if none wraps."""
        expected: dict[int, int] = {}
        shift: np.ndarray | None = None
        for partition, first, end in runs:
            producer, sequence = producers[first].as_py(), sequences[first].as_py()
            if producer is None or sequence is None:
                continue
            after = self.marks.next_expected((topic.topic_id, partition, producer))
            if after is None:
                continue
            expected[partition] = after
            laps = (after - sequence + KAFKA_SEQUENCES // 2) // KAFKA_SEQUENCES
            if laps:
                if shift is None:
                    shift = np.zeros(len(sequences), np.int64)
                shift[first:end] = laps * KAFKA_SEQUENCES
        return (sequences if shift is None else pc.add(sequences, pa.array(shift))), expected

    async def _settle_overlaps(self, topic: TopicConfig, runs: list[tuple[int, int, int]],
                               producers: pa.Array) -> None:
        """Before a sequenced batch takes the per-message path, its producers' runs in flight settle,
        so that path's marks see them."""
        waits: list[asyncio.Future[RunPlacement]] = []
        for partition, first, end in runs:
            for producer in set(producers.slice(first, end - first).drop_null().to_pylist()):
                waits.extend(self.marks.in_flight((topic.topic_id, partition, producer)))
        if waits:
            await asyncio.gather(*waits, return_exceptions=True)

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


def _check_follow_on(plans: list[_RunPlan], expected: dict[int, int]) -> None:
    """Each new run starts at its producer's next sequence in its partition, where that is known
    (`ColumnarProduce._follow_on`): else OutOfOrderSequence, and nothing of the request is stored."""
    for plan in plans:
        _, partition, producer = plan.key
        if plan.retry is None and partition in expected and plan.first > expected[partition]:
            raise OutOfOrderSequence(f"producer {producer} sent sequence {plan.first} to partition {partition} "
                                     f"before {expected[partition]}: send the runs in order", partition)


@dataclass(frozen=True, slots=True)
class _RunPlan:
    """A run of a request that is one producer's consecutive sequences in a partition: new
    (`retry` None), or a retry of a run stored (its placement) or in flight (its future)."""

    key: MarkKey
    first: int
    last: int
    retry: RunPlacement | asyncio.Future[RunPlacement] | None


def _run_placement(pieces: list[tuple[int, asyncio.Future[Chunk]]]) -> asyncio.Future[RunPlacement]:
    """A future of where a run is stored, from its chunks' futures (each with its first sequence):
    set once every chunk is durable, or failed with the first failure."""
    placed: asyncio.Future[RunPlacement] = asyncio.get_running_loop().create_future()
    left = len(pieces)

    def one_done(_done: asyncio.Future[Chunk]) -> None:
        nonlocal left
        left -= 1
        if left or placed.done():
            return
        for _, chunk_future in pieces:
            failure = chunk_future.exception() if not chunk_future.cancelled() else asyncio.CancelledError()
            if failure is not None:
                placed.set_exception(failure)
                placed.exception()  # retrieved: a retry that waits on it sees it; nobody else need
                return
        chunks = [(sequence, f.result()) for sequence, f in pieces]
        placed.set_result(RunPlacement(tuple((sequence, c.offset, c.rows, c.timestamp_us) for sequence, c in chunks)))

    for _, chunk_future in pieces:
        chunk_future.add_done_callback(one_done)
    return placed


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


