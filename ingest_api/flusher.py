"""The flusher: micro-batches durable WAL records into each topic's Delta table.

A commit happens when the oldest waiting record is `flush_interval_ms` old, or when the
waiting records pass `flush_max_records` / `flush_max_bytes`. Each commit carries, as Delta
txn actions, every touched partition's new log-end offset (lakebroker.tables.delta.partition_app_id).
Before committing, records below the table's recorded log-end are dropped: they are already
in the table (a crash came between the Delta commit and the WAL cleanup), so a replay
neither loses nor duplicates a row. The rest must start exactly at that log-end and be
dense: a commit that would leave a gap is refused (OffsetGap) and retried, so no interleaving
of flushes can make a later commit's txn version cover records that never arrived. Rows are
handled in runs, never one by one (flush_rows.py).

Fairness: a flush commits each topic at most `flush_max_records` rows / `flush_max_bytes` bytes
(whole items, at least one, in arrival order so every partition's prefix is taken), leaving the
rest pending for the next flush, which starts at once; and it commits the topics with the fewest
rows first. So a topic with a few records waits behind at most one bounded commit of a flooded
topic, never behind its whole backlog.

A partition whose WAL lost records to damage has a hole that is never committed around: its items
past the hole are held (wal_damage.py) until an operator skips the lost offsets (`skip_lost`, which
records them in the table's `lakebroker.lostOffsets`). Its other partitions and topics go on.

One flush runs at a time, and each of its topic commits holds `commit_lock`; deleting a topic, or
taking in another node's topic changes, takes the same lock, so no commit lands in a table after
it is deleted, and a change waits for one commit, not for a whole flush. Each commit is written by
topic_commits.py, which keeps the tables by topic id, not name: a re-created topic is a new table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from lakebroker.ingest_api.chunks import Chunk
from lakebroker.ingest_api.commit_waits import CommitWaits
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.records import Record
from lakebroker.ingest_api.topic_commits import Rebased, TopicCommits
from lakebroker.ingest_api.wal import PartitionKey
from lakebroker.ingest_api.wal_damage import HeldItems
from lakebroker.tables import fencing
from lakebroker.tables.errors import NotFound, StorageUnavailable
from lakebroker.tables.layout import Layout
from lakebroker.tables.lost_offsets import skip_in_table
from lakebroker.tables.runtime_priority import RuntimePriority
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicConfig

log = logging.getLogger(__name__)


class Flusher:
    def __init__(
        self,
        settings: Settings,
        layout: Layout,
        topics: Callable[[], dict[str, TopicConfig]],
        metrics: IngestMetrics,
        on_committed: Callable[[], None],
        stale: Callable[[Record | Chunk], bool] = lambda item: False,
        *,
        on_orphans: Callable[[list[Record | Chunk]], None] = lambda items: None,
        on_deposed: Callable[[TopicConfig, frozenset[int]], None] = lambda topic, partitions: None,
        moved: Callable[[PartitionKey], Exception] = lambda key: StorageUnavailable("partition not owned here"),
    ) -> None:
        self._settings = settings
        self._stale = stale  # an item given its offset before its partition was rebased (GroupCommitter.rebase)
        self.commits = TopicCommits(layout, metrics, stale)
        self._layout = layout
        self._topics = topics
        self._metrics = metrics
        self._on_committed = on_committed
        self._pending: list[Record | Chunk] = []
        self._pending_bytes = 0
        self._pending_rows = 0  # rows, not items: a batch chunk holds thousands
        self._flushing_bytes = 0  # taken by the flush in progress: not in the table yet either
        self._in_flush: list[Record | Chunk] = []  # ... and its items
        self._oldest: float | None = None
        self._wake = asyncio.Event()
        self._closing = False
        self.commit_lock = asyncio.Lock()  # one commit at a time: held by each topic's commit of a flush
        self._flushing = asyncio.Lock()  # one flush at a time: its commits keep each partition's order
        self._runtime_priority = RuntimePriority(settings.delta_threads_nice)
        self.committed: dict[PartitionKey, int] = {}  # log-end offsets known to be in Delta
        self._waits = CommitWaits()
        self.healthy = True
        self._held = HeldItems()  # damaged partitions' items past their hole (wal_damage.py)
        # The epochs of the partitions this node owns (ownership.py), shared with its commits. Other
        # partitions' items, and stale ones, go to `on_orphans`; partitions the table shows another
        # owner of go to `on_deposed` first.
        self.epochs = self.commits.epochs
        self.on_orphans = on_orphans
        self.on_deposed = on_deposed
        self.moved = moved  # the error of a wait for a commit on a partition that left this node (or had before)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes + self._flushing_bytes + self._held.bytes

    def hold(self, key: PartitionKey, first_lost: int) -> None:
        """Keep `key`'s items from `first_lost` on out of every flush until `skip_lost`."""
        self._held.hold(key, first_lost)

    def held_items(self, key: PartitionKey) -> int:
        return self._held.count(key)

    def add(self, records: Sequence[Record | Chunk]) -> None:
        if self._held:
            records = self._held.keep_back(records)
        if not records:
            return
        self._pending.extend(records)
        self._pending_bytes += sum(r.size for r in records)
        self._pending_rows += _rows(records)
        if self._oldest is None:
            self._oldest = time.monotonic()
        if self._pending_rows >= self._settings.flush_max_records or (
            self._pending_bytes >= self._settings.flush_max_bytes
        ):
            self._wake.set()

    async def skip_lost(self, topic: TopicConfig, partition: int, last: int, metadata: dict[str, str]) -> None:
        """Commit the partition's log end past its lost offsets (first lost to `last`), naming them
        in the table's lost-offsets property, then flush its held items. Every item before the
        hole is committed first, so the skip covers exactly the lost offsets."""
        key = (bytes.fromhex(topic.topic_id), partition)
        first = self._held.first_lost(key)
        while self._pending and self.committed.get(key, 0) < first:
            if not await self.flush_round():
                raise StorageUnavailable(f"partition {partition} of {topic.name!r}: the commits before its lost "
                                         "offsets are failing (see the log); retry the skip once they succeed")
        async with self.commit_lock:
            try:
                end = await asyncio.to_thread(self._commit_skip, topic, partition, first, last, metadata)
            except fencing.Deposed as exc:
                self.on_deposed(topic, exc.partitions)  # as after a fenced flush: the partition is another's
                raise
            self._mark_committed(topic, {partition: end})
            held = self._held.release(key)
        self.add(held)
        self._wake.set()

    def _commit_skip(self, topic: TopicConfig, partition: int, first: int, last: int,
                     metadata: dict[str, str]) -> int:
        epoch = self.epochs.get((bytes.fromhex(topic.topic_id), partition))
        if epoch is None:
            raise fencing.Deposed(f"partition {partition} of {topic.name!r} is not this node's: nothing skipped",
                                  {partition: 0})
        try:
            return skip_in_table(self.commits.table(topic), topic.name, partition, first, last, metadata,
                                 node=self.commits.node, epoch=epoch)
        finally:
            self.commits.ends_changed(topic.topic_id)

    def wait_committed(self, key: PartitionKey, offset: int) -> asyncio.Future[None]:
        """Until the partition's committed end passes `offset`. On a partition this node no longer
        owns that end says nothing of the message placed there before: the message is parked and
        gets a new offset (here once claimed again, or at the owner), so the wait fails at once as
        fail_waiters fails the waits of a partition when it goes."""
        if self.committed.get(key, 0) <= offset and key in self.epochs:
            return self._waits.add(key, offset)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.committed.get(key, 0) > offset:
            future.set_result(None)
        else:
            future.set_exception(self.moved(key))
        return future

    async def run(self) -> None:
        """Flush until close(); returns between flushes, never in the middle of one."""
        interval = self._settings.flush_interval_ms / 1000
        backoff = 0.0
        while not self._closing:
            wait = interval if self._oldest is None else max(0.0, self._oldest + interval - time.monotonic())
            await self._sleep(max(wait, backoff))
            if self._closing:
                return
            if not self._pending:
                continue
            backoff = 0.0 if await self.flush_round() else min(max(backoff * 2, interval), 5.0)
            self._runtime_priority.refresh()  # the commits may have started runtime threads

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):  # (not wait_for: it can swallow a cancel in 3.11)
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        self._wake.clear()

    def wake(self) -> None:
        """Flush now: partitions went to another node, and what this node holds of them is parked
        (`on_orphans`) at the next flush, to be sent on at once."""
        self._wake.set()

    def close(self) -> None:
        """Ask run() to return once the flush in progress, if any, is done."""
        self._closing = True
        self._wake.set()

    async def forget(self, topic_id: str) -> None:
        """A deleted topic: drop its table handle and fail whoever waits for its commits."""
        key_id = bytes.fromhex(topic_id)
        async with self.commit_lock:
            self.commits.forget(topic_id)
            self._waits.fail_topic(key_id, lambda: NotFound("the topic was deleted before the message was committed"))
            for key in [k for k in self.committed if k[0] == key_id]:
                del self.committed[key]
            self._held.forget_topic(key_id)

    async def flush_once(self) -> bool:
        """Commit everything pending, in bounded rounds; on failure keep it pending and report False.
        For when nothing else adds (start-up, shutdown, benchmarks); run() flushes round by round.
        At least one round, so a flush that run() has in progress is waited for."""
        while await self.flush_round():
            if not self._pending:
                return True
        return False

    async def flush_round(self) -> bool:
        """One flush: each topic's bounded share of what is pending; False if a commit failed."""
        async with self._flushing:
            return await self._flush_locked()

    def _take(self) -> list[tuple[str, list[Record | Chunk]]]:
        """This flush's share of the pending items: per topic a bounded prefix, smallest topic first."""
        by_topic: dict[str, list[Record | Chunk]] = defaultdict(list)
        taken: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # topic -> [rows, bytes]
        full: set[str] = set()
        rest: list[Record | Chunk] = []
        max_rows, max_bytes = self._settings.flush_max_records, self._settings.flush_max_bytes
        for r in self._pending:
            if r.topic in full:
                rest.append(r)
                continue
            by_topic[r.topic].append(r)
            counts = taken[r.topic]
            counts[0] += _row_count(r)
            counts[1] += r.size
            if counts[0] >= max_rows or counts[1] >= max_bytes:
                full.add(r.topic)  # the topic's later items wait for the next flush, in order
        self._pending = rest
        self._pending_bytes = sum(r.size for r in rest)
        self._pending_rows = _rows(rest)
        if not rest:
            self._oldest = None  # else the rest is as old as it was: run() flushes again at once
        return sorted(by_topic.items(), key=lambda item: taken[item[0]][0])

    async def _flush_locked(self) -> bool:
        taken = self._take()
        self._in_flush = [r for _, records in taken for r in records]
        self._flushing_bytes = sum(r.size for r in self._in_flush)
        try:
            return await self._commit_taken(taken)
        finally:
            self._flushing_bytes = 0
            self._in_flush = []

    async def _commit_taken(self, taken: list[tuple[str, list[Record | Chunk]]]) -> bool:
        failed: list[Record | Chunk] = []
        committed_any = False
        for name, records in taken:
            async with self.commit_lock:  # the topics as they are now: one may be gone since the flush began
                committed, kept = await self._commit_topic(self._topics().get(name), name, records)
            committed_any |= committed
            failed += kept
            # Out of the backlog once in the table or parked; failed items stay in it, pending again below.
            self._flushing_bytes -= sum(r.size for r in records) - sum(r.size for r in kept)
        if committed_any:  # one failing topic must not hold every other topic's WAL
            self._on_committed()
        if failed:
            self.healthy = False
            self._pending = failed + self._pending
            self._pending_bytes += sum(r.size for r in failed)
            self._pending_rows += _rows(failed)
            self._oldest = time.monotonic()
            return False
        self.healthy = True
        return True

    async def _commit_topic(self, topic: TopicConfig | None, name: str,
                            records: list[Record | Chunk]) -> tuple[bool, list[Record | Chunk]]:
        """Commit one topic's share: whether it committed, and the items to flush again."""
        live = [r for r in records if topic is not None and r.topic_id == bytes.fromhex(topic.topic_id)]
        if not live:
            return False, []  # the topic was deleted (or re-created) after these were accepted
        assert topic is not None
        live = self._owned(topic, live)
        if not live:
            return False, []
        started = time.perf_counter()
        try:
            try:
                ends = await asyncio.to_thread(self.commits.commit, topic, live)
            except (fencing.Deposed, Rebased) as exc:
                if isinstance(exc, fencing.Deposed):
                    log.warning("%s: partitions %s have another owner now; their messages are kept for it", name,
                                sorted(exc.partitions))
                    self.on_deposed(topic, exc.partitions)
                live = self._owned(topic, live)
                if not live:
                    return False, []
                ends = await asyncio.to_thread(self.commits.commit, topic, live)
        except Exception:
            if await asyncio.to_thread(self.commits.gone, topic):
                # Deleted through another node that this one has not followed yet: its items wait for
                # the follow, which drops them with the topic; no retry writes where the table was.
                log.warning("flush of %d records to topic %r: its table is gone (deleted through another node); "
                            "they go with the topic once this node sees the delete", len(live), name)
            else:
                log.exception("flush of %d records to topic %r failed; will retry", len(live), name)
            self._metrics.flush_errors.labels(name).inc()
            return False, live
        self._metrics.flush_latency.observe(time.perf_counter() - started)
        self._metrics.flush_batch.observe(_rows(live))
        self._mark_committed(topic, ends)
        return True, []

    def _owned(self, topic: TopicConfig, items: list[Record | Chunk]) -> list[Record | Chunk]:
        """The items of partitions this node owns, given their offsets under its current claim; the
        others go to `on_orphans`."""
        epochs, stale = self.epochs, self._stale
        mine = [r for r in items if (r.topic_id, r.partition) in epochs and not stale(r)]
        if len(mine) < len(items):
            kept = set(map(id, mine))
            self.on_orphans([r for r in items if id(r) not in kept])
        return mine

    def own(self, topic: TopicConfig, epoch: int = 1) -> None:
        """Own every partition of `topic` without a claim: for a flusher that is its table's only
        writer (benchmarks, tests); a broker's partitions are claimed (ingest_api/cluster.py)."""
        topic_id = bytes.fromhex(topic.topic_id)
        self.epochs.update({(topic_id, p): epoch for p in range(topic.partitions)})

    def in_flush(self, key: PartitionKey) -> list[Record | Chunk]:
        """The partition's items taken by the flush in progress."""
        return [r for r in self._in_flush if (r.topic_id, r.partition) == key]

    def take_pending(self, key: PartitionKey) -> list[Record | Chunk]:
        """The partition's pending items, out of the flusher (not those of a flush under way)."""
        taken = [r for r in self._pending if (r.topic_id, r.partition) == key]
        if taken:
            self._pending = [r for r in self._pending if (r.topic_id, r.partition) != key]
            self._pending_bytes -= sum(r.size for r in taken)
            self._pending_rows -= _rows(taken)
        return taken

    def fail_waiters(self, key: PartitionKey) -> None:
        """The partition went to another node: whoever waits for its commit here (ack=table) gets
        `moved`'s error; its messages reach the table with new offsets."""
        self._waits.fail(key, lambda: self.moved(key))

    def _mark_committed(self, topic: TopicConfig, ends: dict[int, int]) -> None:
        topic_id = bytes.fromhex(topic.topic_id)
        for partition, end in ends.items():
            key = (topic_id, partition)
            if end > self.committed.get(key, 0):
                self.committed[key] = end
            self._metrics.set_high_watermark(topic.name, partition, self.committed[key])
            self._waits.committed(key, self.committed[key])


def _row_count(item: Record | Chunk) -> int:
    return 1 if isinstance(item, Record) else item.rows


def _rows(items: Sequence[Record | Chunk]) -> int:
    return sum(map(_row_count, items))
