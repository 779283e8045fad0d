"""The broker: the parts one data dir's node runs, built, started and stopped together.

Data flows one way: a produce (local_produce.py: admission, partitions, dedup) → GroupCommitter
(WAL, fsync, offsets) → Flusher (Delta) → WAL segments released. Which partitions this node takes
is the ownership part's (ownership.py), which the cluster's leases drive (cluster.py). At start,
recovery.py rebuilds the partitions' ends and the dedup index from the WAL and the tables. The
HTTP routes, the fast path and the embedded CLI all drive it; it knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime

from lakebroker.ingest_api.acks import Acks
from lakebroker.ingest_api.admission import Admission
from lakebroker.ingest_api.chunks import (
    Chunk,
)
from lakebroker.ingest_api.cluster import Membership
from lakebroker.ingest_api.dedup import DedupIndex
from lakebroker.ingest_api.flusher import Flusher
from lakebroker.ingest_api.group_commit import GroupCommitter
from lakebroker.ingest_api.local_produce import LocalProduce
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.not_here import NoOwnerYet
from lakebroker.ingest_api.ownership import Leases, Ownership
from lakebroker.ingest_api.partitioner import Partitioner
from lakebroker.ingest_api.records import Record
from lakebroker.ingest_api.recovery import recover
from lakebroker.ingest_api.sequences import SequenceMarks
from lakebroker.ingest_api.table_ends import TableEnds
from lakebroker.ingest_api.turns import Turns
from lakebroker.ingest_api.wal import PartitionKey, Wal, delete_segments
from lakebroker.ingest_api.wal_damage import HeldPartitions
from lakebroker.tables.errors import (
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
        self.wal = Wal(self.layout.wal_dir, segment_bytes=settings.wal_segment_bytes, fsync=settings.wal_fsync)
        self.committer = GroupCommitter(self.wal, {}, self._durable, metrics, moved=_moved)
        # What a flush leaves out goes to the ownership part, which the node builds at start.
        self.flusher = Flusher(settings, self.layout, lambda: self.topics, metrics, self._release_wal,
                               stale=self.committer.stale, moved=_moved,
                               on_orphans=lambda items: self.ownership.orphaned(items),
                               on_deposed=lambda topic, partitions: self.ownership.deposed(topic, partitions))
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
        self.local: LocalProduce  # at start: it deduplicates, on the partitions the ownership part opens
        self.started = False

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self.layout.data_dir.mkdir(parents=True, exist_ok=True)
        self.dedup = DedupIndex(window_s=self.settings.dedup_window_s, max_entries=self.settings.dedup_max_entries,
                                directory=self.layout.dedup_dir)
        self.topics = await asyncio.to_thread(self.store.load)
        dedup = self.dedup

        def ownership(leases: Leases) -> Ownership:
            return Ownership(leases=leases, committer=self.committer, flusher=self.flusher,
                             partitioner=self.partitioner, wal=self.wal, dedup=dedup, topics=lambda: self.topics,
                             metrics=self.metrics, dedup_window_s=self.settings.dedup_window_s,
                             release_wal=self._release_wal)

        self.cluster = Membership(self.settings, store=self.store, topics=lambda: self.topics,
                                  follow_topics=self.follow_topics, marks=self.marks, metrics=self.metrics,
                                  ownership=ownership)
        self.ownership = self.cluster.ownership
        self.local = LocalProduce(topic=self.topic, admission=self.admission, partitioner=self.partitioner,
                                  ownership=self.ownership, dedup=self.dedup, marks=self.marks,
                                  committer=self.committer, acks=self.acks)
        self.flusher.commits.node = self.cluster.node
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
        self.local.forget(topic)
        await self.flusher.forget(topic.topic_id)
        self.damage.forget_topic(topic.name)
        self.table_ends.forget(topic.topic_id)
        self.marks.forget_topic(topic.topic_id)
        self.ownership.forget_topic(bytes.fromhex(topic.topic_id))

    # A partition has two ends. The assigned end is the next offset produce will give (what the WAL
    # holds); the committed end is the next offset the Delta table will hold (what readers see).
    # The API calls the first `log_end_offset` and the second `high_watermark`, as Kafka does.
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

    # -- produce (local_produce.py) ------------------------------------------------------
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


def _moved(key: PartitionKey) -> NoOwnerYet:
    """What a wait for a message's commit gets when its partition left this node first."""
    return NoOwnerYet(f"partition {key[1]} moved to another node before this message's commit; it is kept and "
                      "committed again with a new offset: retry with the same id to get it", 1.0)
