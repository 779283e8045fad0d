"""The broker: one object that owns a data dir's WAL, offsets, dedup index and flusher.

Data flows one way: `produce` admits (admission.py: the rules every front door shares), picks
partitions (partitioner.py), deduplicates (dedup.py) → GroupCommitter (WAL, fsync, offsets) →
Flusher (Delta) → WAL segments released. At start, recovery.py rebuilds the partitions' ends and
the dedup index from the WAL and the tables. The HTTP routes, the fast path and the embedded CLI
all drive this class; it knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from lakebroker.ingest_api.acks import Acks, highest_offsets
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
from lakebroker.ingest_api.cluster import Membership, NoOwnerYet
from lakebroker.ingest_api.dedup import DedupIndex, DedupKey, Placed, dedup_id, dedup_ids
from lakebroker.ingest_api.flusher import Flusher
from lakebroker.ingest_api.group_commit import GroupCommitter, Pending, PendingChunk
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.ownership import Ownership, remember_placed
from lakebroker.ingest_api.partitioner import Partitioner
from lakebroker.ingest_api.records import RECORD_OVERHEAD, Record
from lakebroker.ingest_api.recovery import recover
from lakebroker.ingest_api.sequences import SequenceMarks, chunk_marks
from lakebroker.ingest_api.table_ends import TableEnds
from lakebroker.ingest_api.turns import Turns
from lakebroker.ingest_api.wal import PartitionKey, Wal, delete_segments
from lakebroker.ingest_api.wal_damage import HeldPartitions
from lakebroker.tables.errors import (
    LakebrokerError,
    NotFound,
    TableUnreadable,
)
from lakebroker.tables.layout import Layout, validate_name
from lakebroker.tables.lost_offsets import LostOffsets, record_loss
from lakebroker.tables.offsets import OffsetsTable
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicConfig, TopicStore

log = logging.getLogger(__name__)
# A topic's creation waits this long for its partitions' owners: a heartbeat busy claiming another
# node's share can take far longer on a loaded machine, and the topic exists either way.
OWNERS_WAIT_S = 10.0



_NONE, _TABLE = AckMode.NONE, AckMode.TABLE  # a member lookup costs the hot path ~0.3 µs on Python 3.11


@dataclass(slots=True)
class ProduceResult:
    partition: int
    offset: int | None
    duplicate: bool = False
    timestamp_us: int | None = None  # log-append time; None while the offset is


@dataclass(slots=True)
class OneMessage:
    """A single message `Broker.start_one` took: what `finish_one` needs to answer it."""

    topic: str
    topic_id: bytes
    ack: AckMode
    started: float  # perf_counter, for the latency metric
    result: ProduceResult  # so far
    queued: Pending | None  # its WAL record; None for a duplicate
    original: asyncio.Future[Placed] | None  # a duplicate of a message in flight: that message's placement

    def waits(self) -> bool:
        """True until `finish_one` can answer: with ack=none, only until the end of the loop pass
        that queued it, where the group committer calls its `then` (if it has one)."""
        if self.ack is _NONE:
            return self.queued is not None and self.queued.then is not None
        if self.queued is not None:
            return self.queued.outcome is None
        return self.original is not None and not self.original.done()


class Broker:
    def __init__(self, settings: Settings, metrics: IngestMetrics) -> None:
        self.settings = settings
        self.layout = Layout.of(settings)
        self.metrics = metrics
        self.store = TopicStore(self.layout)
        self.topics: dict[str, TopicConfig] = {}
        self.dedup: DedupIndex  # at start: its ring file is the data dir's, so only the lock's holder opens it
        self.partitioner = Partitioner()
        self.marks = SequenceMarks(settings.dedup_window_s)  # producers' sequences per partition (Arrow batches)
        self.admission = Admission(settings.max_backlog_bytes, lambda: self.backlog_bytes, metrics,
                                   settings.backpressure_wait_ms / 1000)
        self._topic_ids: dict[str, bytes] = {}  # a topic id's bytes, for the single-message path
        self.wal = Wal(self.layout.wal_dir, segment_bytes=settings.wal_segment_bytes, fsync=settings.wal_fsync)
        self.committer = GroupCommitter(self.wal, {}, self._durable, metrics, moved=_moved)
        self.flusher = Flusher(settings, self.layout, lambda: self.topics, metrics, self._release_wal,
                               stale=self.committer.stale)
        self.acks = Acks(self.flusher, metrics)
        self.batch_turns = Turns()  # batch requests' CPU, one per loop pass (fairness to single messages)
        self._tasks: list[asyncio.Task[None]] = []
        self._deleting: set[asyncio.Future[None]] = set()  # released WAL segments being deleted
        self._following = asyncio.Lock()  # the heartbeat and the topic follower both take changes in
        self.damage = HeldPartitions(self.flusher.hold, metrics)  # partitions WAL damage holds, until skipped
        self.group_offsets = OffsetsTable(self.layout)  # followed between /metrics scrapes (group lag)
        self.table_ends = TableEnds(self.layout)  # the ends of partitions other nodes own
        self.cluster: Membership
        self.ownership: Ownership  # at start, with the cluster's leases and the dedup index
        self.flusher.moved = _moved
        self.started = False

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self.layout.data_dir.mkdir(parents=True, exist_ok=True)
        self.dedup = DedupIndex(window_s=self.settings.dedup_window_s, max_entries=self.settings.dedup_max_entries,
                                directory=self.layout.dedup_dir)
        self.topics = await asyncio.to_thread(self.store.load)
        self.cluster = Membership(self, self.settings)
        self.ownership = Ownership(leases=self.cluster, committer=self.committer, flusher=self.flusher,
                                   partitioner=self.partitioner, wal=self.wal, dedup=self.dedup,
                                   topics=lambda: self.topics, metrics=self.metrics,
                                   dedup_window_s=self.settings.dedup_window_s, release_wal=self._release_wal)
        self.flusher.on_orphans = self.ownership.orphaned
        self.flusher.on_deposed = self.ownership.deposed
        self.flusher.node = self.cluster.node
        recovered = await asyncio.to_thread(recover, self.wal, self.layout, list(self.topics.values()), self.dedup,
                                            self.metrics, dedup_window_s=self.settings.dedup_window_s,
                                            node=self.cluster.node, marks=self.marks)
        for damage in recovered.damage:
            self.damage.add(damage)
        self.committer.next_offsets = recovered.assigned
        self.flusher.committed = dict(recovered.committed)
        self.ownership.unreadable = dict(recovered.unreadable)
        self.ownership.park(recovered.unflushed)  # until the first heartbeat says which partitions are ours
        self._tasks = [asyncio.create_task(self.committer.run()), asyncio.create_task(self.flusher.run())]
        await self.cluster.join()
        if self.flusher.pending_bytes:
            await self.flusher.flush_once()
        self._release_wal()
        self.started = True

    # -- WAL damage ---------------------------------------------------------------------
    def lost_offsets(self, topic: TopicConfig, partition: int) -> int:
        """Offsets WAL damage cost the partition that no skip has recorded yet."""
        return self.damage.lost((bytes.fromhex(topic.topic_id), partition))

    async def skip_lost(self, topic_name: str, partition: int, by: str) -> LostOffsets:
        """Let a partition held at WAL damage move on: record its first lost range in
        `_system/lost_offsets`, then commit its committed end past it (Flusher.skip_lost)."""
        topic = self.topic(topic_name)
        key = (bytes.fromhex(topic.topic_id), partition)
        damage = self.damage.first(key)
        if damage is None:
            raise NotFound(f"partition {partition} of {topic_name!r} has no WAL damage to skip")
        if key not in self.ownership.epochs:  # before the loss is recorded: a skip that cannot land leaves no record
            raise self.ownership.not_here(topic, partition)
        loss = LostOffsets(topic.name, topic.topic_id, partition, damage.first, damage.last, damage.spans,
                           datetime.now(UTC), by)
        await asyncio.to_thread(record_loss, self.layout, loss)
        await self.flusher.skip_lost(topic, partition, damage.last, {"lakebroker.skippedBy": by})
        log.warning("skipped %s (by %s)", damage.describe(), by)
        self.damage.skipped(key)
        return loss

    async def stop(self) -> None:
        # The tasks stop first, each between two groups or flushes, so the drain below is the
        # only writer: a drain beside a running committer or flusher could interleave with it.
        self.ownership.close_all()
        await self.cluster.stop_beating()  # a beat would open partitions, and fill the dedup index closed below
        self.committer.close()
        self.flusher.close()
        for task in self._tasks:
            await task
        await self.committer.drain()
        if self.flusher.pending_bytes:
            await self.flusher.flush_once()
        await asyncio.gather(*self._deleting)
        self.wal.close(self.ownership.committed_below() if not self.flusher.pending_bytes else None)
        self.dedup.close()
        if not self.flusher.pending_bytes:  # all committed: the partitions go to other nodes at once
            await self.cluster.leave()
        self.started = False

    # -- topics -------------------------------------------------------------------------
    def topic(self, name: str) -> TopicConfig:
        topic = self.topics.get(name)
        if topic is None:
            validate_name(name)  # a precise InvalidName; never a read of storage, which a burst would queue
            raise NotFound(f"topic {name!r} does not exist")
        return topic

    async def create_topic(self, topic: TopicConfig) -> TopicConfig:
        created = await asyncio.to_thread(self.store.create, topic)
        self.topics = {**self.topics, created.name: created}
        await self.cluster.beat_for(OWNERS_WAIT_S)  # its partitions get owners before the answer, mostly
        return created

    async def follow_topics(self) -> bool:
        """Take in what other nodes changed in the topic table: new, changed and deleted topics.
        Whether anything changed."""
        async with self._following:
            current = await asyncio.to_thread(self.store.load)
            if current == self.topics:
                return False
            gone = [t for name, t in self.topics.items() if current.get(name, t).topic_id != t.topic_id
                    or name not in current]
            async with self.flusher.commit_lock:
                self.topics = current
            for topic in gone:
                await self._forget_topic(topic)
                # No flush of it comes after the swap above: what this node's flushes wrote where the
                # deleted table was, before it saw the delete (a partial log), goes now.
                await asyncio.to_thread(self.store.remove_if_deleted, topic)
            return True

    async def update_topic(self, name: str, **changes: object) -> TopicConfig:
        self.topic(name)
        updated = await asyncio.to_thread(self.store.update, name, **changes)
        self.topics = {**self.topics, name: updated}
        if "partitions" in changes:
            await self.cluster.beat_for(OWNERS_WAIT_S)  # the new partitions get owners before the answer, mostly
        return updated

    async def delete_topic(self, name: str) -> None:
        topic = self.topic(name)
        async with self.flusher.commit_lock:  # no flush may land in the table once it is gone
            await asyncio.to_thread(self.store.delete, name)
            self.topics = {k: v for k, v in self.topics.items() if k != name}
        await self._forget_topic(topic)
        await asyncio.to_thread(self.cluster.table.forget_topic, topic.topic_id)

    async def _forget_topic(self, topic: TopicConfig) -> None:
        self.partitioner.forget(topic)
        self._topic_ids.pop(topic.topic_id, None)
        await self.flusher.forget(topic.topic_id)
        self.damage.forget_topic(topic.name)
        self.table_ends.forget(topic.topic_id)
        self.marks.forget_topic(topic.topic_id)
        self.ownership.forget_topic(bytes.fromhex(topic.topic_id))

    # A partition has two ends. The assigned end is the next offset produce will give (what the WAL
    # holds); the committed end is the next offset the Delta table will hold (what readers see).
    # The API calls the first `log_end_offset`, as Kafka does, and the second `committed_offset`.
    # Only the owner knows the assigned end; another node answers with the end in the table, as of
    # its last `follow_ends`.
    def assigned_end(self, topic: TopicConfig, partition: int) -> int:
        key = (bytes.fromhex(topic.topic_id), partition)
        if key in self.ownership.epochs:
            return self.committer.next_offsets.get(key, 0)
        return self.table_ends.committed_end(topic, partition)

    def committed_end(self, topic: TopicConfig, partition: int) -> int:
        key = (bytes.fromhex(topic.topic_id), partition)
        if key in self.ownership.epochs:
            return self.flusher.committed.get(key, 0)
        return self.table_ends.committed_end(topic, partition)

    async def follow_ends(self, *topics: TopicConfig) -> None:
        """Before answering with ends: read those of the topics' partitions other nodes own from
        their tables (no I/O for a topic whose partitions are all this node's)."""
        for topic in topics:
            topic_id = bytes.fromhex(topic.topic_id)
            if any((topic_id, p) not in self.ownership.epochs for p in range(topic.partitions)):
                await self.table_ends.follow(topic)

    async def follow_all_ends(self) -> None:
        """`follow_ends` of every topic whose table reads (an overview shows the others as unavailable)."""
        for topic in list(self.topics.values()):
            with contextlib.suppress(TableUnreadable):
                await self.follow_ends(topic)

    # -- produce ------------------------------------------------------------------------
    @property
    def backlog_bytes(self) -> int:
        return self.committer.queued_bytes + self.flusher.pending_bytes

    async def produce(self, topic_name: str, messages: list[NewMessage], ack: AckMode,
                      partitions: list[int] | None = None) -> list[ProduceResult]:
        """`partitions`: the ones ingest_api/router.py picked, having admitted the messages already
        (else admitted and picked here)."""
        topic = self.topic(topic_name)
        sizes = await self.admission.admit(topic, messages) if partitions is None else []
        started = time.perf_counter()
        topic_id = bytes.fromhex(topic.topic_id)
        results: list[ProduceResult] = []
        waits: list[tuple[int, asyncio.Future[Placed]]] = []
        pending: list[Pending] = []
        if partitions is None:
            partitions = self.partitioner.each(topic, messages, sizes)
        self.ownership.check_open(topic, topic_id, set(partitions))
        for i, m in enumerate(messages):
            result, queued, original = self._place(topic, topic_id, m, partitions[i], awaited=ack is not _NONE)
            results.append(result)
            if queued is not None:
                pending.append(queued)
            future = original if queued is None else queued.future
            if future is not None:
                waits.append((i, future))
        if pending:
            self.committer.submit(pending)
        self.acks.queued(topic.name, ack, len(pending))
        if ack is _NONE:
            for i, future in waits:
                if results[i].duplicate and future.done() and not future.exception():
                    p, o, ts = future.result()
                    results[i] = ProduceResult(p, o, True, ts)
            return results
        await asyncio.gather(*(f for _, f in waits), return_exceptions=True)
        for i, future in waits:
            p, o, ts = future.result()  # re-raises StorageUnavailable for a group that failed
            results[i] = ProduceResult(p, o, results[i].duplicate, ts)
        if ack is _TABLE:
            await self.acks.in_table(topic_id, highest_offsets((r.partition, r.offset or 0) for r in results))
        self.acks.answered(topic.name, ack, started, sum(1 for r in results if r.duplicate))
        return results

    async def produce_one(self, topic_name: str, message: NewMessage, ack: AckMode) -> ProduceResult:
        """`produce` of one message: the same answer, metrics and WAL record, with no lists."""
        return await self.settle_one(self.start_one(topic_name, message, ack))

    async def settle_one(self, one: OneMessage) -> ProduceResult:
        """The second half of `produce_one`: waits for the WAL group (and with ack=table the Delta commit)."""
        if one.waits():
            future = one.original if one.queued is None else one.queued.future
            assert future is not None, "start_one gives an awaited message a future"
            with contextlib.suppress(LakebrokerError):  # finish_one raises it
                await future
        result = self.finish_one(one)
        if one.ack is _TABLE:
            assert result.offset is not None
            await self.acks.in_table(one.topic_id, {result.partition: result.offset})
            self.acks.timed(one.ack, one.started)
        return result

    def start_one(self, topic_name: str, message: NewMessage, ack: AckMode,
                  then: Callable[[], None] | None = None) -> OneMessage:
        """The first half of `produce_one`, which never waits: the message validated, deduplicated and
        queued for the WAL. `finish_one` answers it once `waits()` is false: a caller that gives `then`
        has it called on the loop at that moment (no future, no task): for ack=wal once its WAL write
        is durable, for ack=none at the end of the loop pass; others await `settle_one`, as ack=table must."""
        topic = self.topic(topic_name)
        size = self.admission.check_one(topic, message)
        started = time.perf_counter()
        topic_id = self._topic_ids.get(topic.topic_id) or self._topic_id(topic)
        partition = self.partitioner.one(topic, message)
        if (topic_id, partition) not in self.ownership.accepting:
            raise self.ownership.not_here(topic, partition)
        result, queued, original = self._place(topic, topic_id, message, partition,
                                               awaited=then is None and ack is not _NONE, size=size)
        if queued is not None:
            queued.then = then
            queued.early = ack is _NONE
            self.committer.submit_one(queued)
        elif then is not None and ack is not _NONE and original is not None and not original.done():
            original.add_done_callback(lambda _: then())
        # (`ack` is a str: it labels metrics as `ack.value` does, without the enum's slow property.)
        self.acks.queued(topic.name, ack, 0 if queued is None else 1)
        return OneMessage(topic.name, topic_id, ack, started, result, queued, original)

    def finish_one(self, one: OneMessage) -> ProduceResult:
        """`start_one`'s result once it waits no more; raises StorageUnavailable for a failed group."""
        original = one.original
        if one.ack is _NONE:
            if original is not None and original.done() and not original.exception():
                p, o, ts = original.result()
                return ProduceResult(p, o, True, ts)
            return one.result
        if one.queued is not None:
            outcome = one.queued.outcome
            if isinstance(outcome, LakebrokerError):
                raise outcome
            assert outcome is not None, "finish_one before the message's group was written"
            result = ProduceResult(outcome[0], outcome[1], False, outcome[2])
        elif original is not None:
            p, o, ts = original.result()  # re-raises the original's StorageUnavailable
            result = ProduceResult(p, o, True, ts)
        else:
            result = one.result  # a duplicate of a message already durable
        self.acks.answered(one.topic, one.ack, one.started, 1 if result.duplicate else 0, timed=one.ack is not _TABLE)
        return result

    def _place(self, topic: TopicConfig, topic_id: bytes, m: NewMessage, partition: int, awaited: bool,
               size: int = -1) -> tuple[ProduceResult, Pending | None, asyncio.Future[Placed] | None]:
        """One message's result so far, what it queues for the WAL (None: a duplicate), and for a
        duplicate of a message still in flight, that message's future (it waits for it). A queued
        message gets a future if it is `awaited` or carries an id (later sends of the id wait on it).
        `partition` was picked before the dedup check, so a duplicate takes its turn in the keyless
        runs on every produce path alike."""
        did = dedup_id(m.message_id, m.producer_id, m.sequence)
        key: DedupKey | None = None if did is None else (topic.topic_id, did)
        if key is not None:
            hit = self.dedup.lookup(key)
            if isinstance(hit, tuple):
                return ProduceResult(hit[0], hit[1], True, hit[2]), None, None
            if hit is not None:
                return ProduceResult(-1, None, duplicate=True), None, hit
        record = Record(topic.name, topic_id, partition, -1, 0, m.key, m.value, m.format, m.headers,
                        m.message_id, m.producer_id, m.sequence, -1 if size < 0 else RECORD_OVERHEAD + size)
        future: asyncio.Future[Placed] | None = None
        if awaited or key is not None:
            future = asyncio.get_running_loop().create_future()
            if key is not None:
                self.dedup.begin(key, future)
                future.add_done_callback(remember_placed(self.dedup, key))
        return ProduceResult(partition, None), Pending(record, future), None

    def _topic_id(self, topic: TopicConfig) -> bytes:
        topic_id = self._topic_ids[topic.topic_id] = bytes.fromhex(topic.topic_id)
        return topic_id

    async def produce_columns(self, topic_name: str, batch: ColumnarBatch, ack: AckMode) -> BatchResults:
        """`produce` for a batch held as columns: the same answers, partitions, offsets and rows,
        with per-message Python only for messages that carry an id (the dedup index is per id)."""
        topic = self.topic(topic_name)
        sizes = await self.admission.admit_columns(topic, batch)
        started = time.perf_counter()
        n = batch.rows
        producers = one_array(batch.columns.column("producer_id"))
        sequenced = producers.null_count < n  # an Arrow batch's producer_id and sequence columns (sequences.py)
        ids = one_array(batch.columns.column("message_id"))  # then their dedup ids, null where none
        if sequenced:
            ids = dedup_ids(ids, producers, one_array(batch.columns.column("sequence")))
        elif ids.null_count < n:
            ids = dedup_ids(ids)
        # Every message's partition, duplicates too (they take their turn in the keyless runs
        # as on the per-message path), checked before the dedup index hears of any id.
        everyone = self.partitioner.columns(topic, batch.partitions, one_array(batch.columns.column("key")), sizes,
                                            ids)
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

    # -- pipeline callbacks -------------------------------------------------------------
    def _durable(self, records: list[Record | Chunk]) -> None:
        if self.committer.claims:
            records = self.ownership.placed_again_if_stale(records)
        self.flusher.add(records)

    def _release_wal(self) -> None:
        released = self.wal.release(self.ownership.committed_below())
        if released:  # off the loop: unlinking a full segment holds a thread for milliseconds
            deleting = asyncio.get_running_loop().run_in_executor(None, delete_segments, released)
            self._deleting.add(deleting)
            deleting.add_done_callback(self._deleted)
        self.metrics.wal_segments.set(self.wal.segment_count())
        self.metrics.wal_backlog_bytes.set(self.backlog_bytes)
        self.admission.made_room()

    def _deleted(self, deleting: asyncio.Future[None]) -> None:
        self._deleting.discard(deleting)
        if not deleting.cancelled() and deleting.exception() is not None:
            log.error("WAL: could not delete released segments (they are skipped at the next start)",
                      exc_info=deleting.exception())


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


def _moved(key: PartitionKey) -> NoOwnerYet:
    """What a wait for a message's commit gets when its partition left this node first."""
    return NoOwnerYet(f"partition {key[1]} moved to another node before this message's commit; it is kept and "
                      "committed again with a new offset: retry with the same id to get it", 1.0)
