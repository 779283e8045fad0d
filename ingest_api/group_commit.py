"""Group commit: many produce requests share one WAL write and one fsync.

Requests queue `Pending` messages, or a columnar batch's `PendingChunk`s (one per partition).
Once per loop pass whatever is queued becomes a group, on the loop: each message gets its offset
and timestamp (a chunk a dense run of offsets from its first) and its frame, and the group goes
to the WAL writer thread. The thread writes every group handed to it since its last write with
one write and one fdatasync, then calls back on the loop once for all of them; that callback
answers every request in them: a `then` callback directly, a future for those that await.

Why a thread of its own rather than `to_thread` per group: the next group is handed over while
the last one is being written, and the answer costs one loop pass, not three (executor future,
task wake-up, each request's future callback), each of which waits behind every connection's
reads on a busy loop.

Except when nothing is in flight, the group is only single messages (at most
INLINE_GROUP_BYTES), and the disk has proven fast: then the loop writes and fdatasyncs the group
itself, and answers it in the same pass. A writer thread woken for such a group would wait for the
GIL that a busy loop holds, and its report for the loop's next pass, while every connection in the
group sits idle. The fdatasync releases the GIL, and with nothing in flight there is nothing the
loop could overlap with it but new requests, which join the next group. Batches, and anything
behind a write in flight, still go to the thread, so a large frame never stalls the loop
(docs/decisions/0003-event-loop-writes-idle-wal-groups-itself.md).

When the disk has "proven fast" is disk_trust.py's to say.

Messages nobody waits for (ack=none) are answered at the end of the loop pass that queued them, all
together and before the pass writes anything, so their producers send on while the write runs;
behind a write in flight they wait for its report, so that many share the next one. A group of
such messages only is written without an fdatasync (wal.py says how recovery tells its torn pages
from damage): it promises no durability, so it does not hold the loop (an inline write) for one.
The next synced write, or the clean stop, covers it.

Offsets are assigned on the loop only, in hand-off order, and the thread writes in that order.
A write that fails (disk full) fails its groups, every group handed after them and the items of
their partitions still queued, and the offsets roll back to the first of them, so no gap is left,
nothing sent after a failed item lands before it, and a retry is accepted afresh.

A partition this node claims back after another node committed to it goes on from the claimed end
(`rebase`). Its items given offsets before that carry an older claim (`stale`): a failed write
never rolls the offsets back to them, and a write of them that lands after the claim does not
answer their old offsets: their waiters are told the partition moved, and the broker places them
again.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lakebroker.ingest_api.chunks import Chunk
from lakebroker.ingest_api.dedup import Placed
from lakebroker.ingest_api.disk_trust import INLINE_GROUP_BYTES, DiskTrust
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.records import Record, encode
from lakebroker.ingest_api.wal import PartitionKey, Wal
from lakebroker.ingest_api.wal_writer import WalWriter, wal_pieces
from lakebroker.tables.errors import LakebrokerError, StorageUnavailable

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Pending:
    record: Record  # offset and timestamp are filled in by the committer
    future: asyncio.Future[Placed] | None = field(default=None)  # for whoever awaits it (and the dedup index)
    then: Callable[[], None] | None = field(default=None)  # called on the loop once `outcome` is set
    outcome: Placed | LakebrokerError | None = field(default=None)  # where it went, or why it is not answered
    early: bool = field(default=False)  # ack=none: `then` is called at the end of the loop pass that queued it
    in_order: bool = field(default=False)  # one of a partition's log appended again: never moves ahead

    @property
    def item(self) -> Record:
        return self.record


@dataclass(slots=True)
class PendingChunk:
    chunk: Chunk  # offset and timestamp are filled in by the committer
    future: asyncio.Future[Chunk] | None = field(default=None)

    @property
    def item(self) -> Chunk:
        return self.chunk


Queued = Pending | PendingChunk


@dataclass(slots=True)
class _Group:
    """Items handed to the writer together: their records and frames, and the offsets before them."""

    items: list[Queued]
    records: list[Record | Chunk]
    frames: list[bytes | Chunk]  # a record's frame, or a chunk to encode in the thread (Arrow IPC)
    saved: dict[PartitionKey, int]  # each partition's next offset before this group
    epoch: int  # failures so far: a failed write drops the groups of its epoch handed after it
    rows: int
    size: int
    sync: bool  # someone waits for it (not only ack=none messages): its write is fdatasynced


class GroupCommitter:
    def __init__(
        self,
        wal: Wal,
        next_offsets: dict[PartitionKey, int],
        on_durable: Callable[[list[Record | Chunk]], None],
        metrics: IngestMetrics,
        max_group: int = 65536,
        moved: Callable[[PartitionKey], LakebrokerError] = lambda key: StorageUnavailable("partition moved"),
    ) -> None:
        self._wal = wal
        self.next_offsets = next_offsets
        # Per partition, how often its offsets were rebased; items carry the count they were given
        # offsets under (empty until the first rebase, so the hot path stamps nothing).
        self.claims: dict[PartitionKey, int] = {}
        self._moved = moved
        self._on_durable = on_durable
        self._metrics = metrics
        self._max_group = max_group
        self._queue: list[Queued] = []
        self._unwritten: deque[_Group] = deque()  # handed to the writer, in order, not yet reported
        self._unwritten_rows = 0
        self._writer: WalWriter[_Group] | None = None  # while run() runs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False  # a hand-off is due in this loop pass
        self._closing = False
        self._epoch = 0
        self._last_ts = 0
        self.queued_bytes = 0
        self.disk = DiskTrust()
        self._awaited = False  # something queued since the last hand-off has a waiter
        self._early: list[Pending] = []  # ack=none messages queued in this pass, answered as it hands off

    def submit(self, items: list[Pending] | list[PendingChunk]) -> None:
        self._queue.extend(items)
        self.queued_bytes += sum(p.item.size for p in items)
        if not self._awaited:
            self._awaited = any(map(_waited_for, items))
        self._schedule()

    def submit_one(self, item: Pending) -> None:
        self._queue.append(item)
        self.queued_bytes += item.record.size
        if item.early:
            self._early.append(item)
        elif item.future is not None or item.then is not None:
            self._awaited = True
        if not self._scheduled:
            self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled and self._writer is not None and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._hand_off)

    def _take(self) -> list[Queued]:
        """The next group: queued items in order up to max_group messages (at least one item).
        Single messages queued behind that bound join it, up to max_group of them, so a one-message
        request waits for one group, not for every batch queued before it. They only move ahead of
        other requests' chunks: each request's messages keep their order, so offsets stay in it. A
        message `in_order` (a log appended again) moves ahead of nothing."""
        rows, n = 0, 0
        for p in self._queue:
            if rows >= self._max_group:
                break
            rows += 1 if isinstance(p, Pending) else p.chunk.rows
            n += 1
        group, rest = self._queue[:n], self._queue[n:]
        if rest:
            later: list[Queued] = []
            singles = 0
            for p in rest:
                if type(p) is Pending and not p.in_order and singles < self._max_group:
                    group.append(p)
                    singles += 1
                else:
                    later.append(p)
            rest = later
            self._awaited = True  # what is left goes at the next pass, whatever it is
        self._queue = rest
        return group

    # -- running ------------------------------------------------------------------------
    async def run(self) -> None:
        """Commit groups until close(); returns once the writer has reported every group handed to it."""
        if self._closing:
            return
        self._loop = loop = asyncio.get_running_loop()
        stopped: asyncio.Future[None] = loop.create_future()

        def writer_stopped() -> None:
            if not stopped.done():
                stopped.set_result(None)

        self._writer = writer = WalWriter(self._wal, loop, self._written, writer_stopped)
        writer.start()
        self._schedule()
        try:
            await stopped
        finally:
            if self._writer is writer:  # cancelled rather than closed
                self._writer = None
                writer.groups.put(None)
        writer.join()

    def close(self) -> None:
        """No more hand-offs: the writer finishes what it has and run() returns. What is still queued
        is left for drain()."""
        self._closing = True
        if self._writer is not None:
            self._writer.groups.put(None)
            self._writer = None

    async def drain(self) -> None:
        """Commit whatever is queued now: at shutdown once run() has returned, or with no run() (the CLI)."""
        self._answer_early()
        while self._queue:
            group = self._hand(self._take())
            error: BaseException | None = None
            started = time.perf_counter()
            try:
                await asyncio.to_thread(self._wal.append, wal_pieces(group.frames), group.records)  # synced: a stop
            except BaseException as exc:  # noqa: BLE001 - as the writer thread reports it
                error = exc
            self._written([group], error, time.perf_counter() - started)

    def rebase(self, key: PartitionKey, end: int) -> None:
        """The partition's offsets go on from `end`: another node committed to it since this node gave
        offsets to the items it holds of it, which are now stale."""
        self.claims[key] = self.claims.get(key, 0) + 1
        self.next_offsets[key] = end
        for group in self._unwritten:
            group.saved.pop(key, None)  # a failed write rolls back no further than `end`

    def unwritten(self, key: PartitionKey) -> list[Record | Chunk]:
        """The partition's items handed to the writer whose write is not reported yet."""
        return [r for group in self._unwritten for r in group.records if (r.topic_id, r.partition) == key]

    def queues(self, key: PartitionKey) -> bool:
        """Whether a message of the partition waits for its offset (queued, not yet handed to the WAL)."""
        for p in self._queue:
            item = p.item
            if item.partition == key[1] and item.topic_id == key[0]:
                return True
        return False

    def stale(self, item: Record | Chunk) -> bool:
        """Whether the item was given its offset before its partition's last rebase."""
        return item.claim != self.claims.get((item.topic_id, item.partition), 0)

    def _moved_if_stale(self, item: Record | Chunk) -> LakebrokerError | None:
        return self._moved((item.topic_id, item.partition)) if self.stale(item) else None

    # -- on the loop --------------------------------------------------------------------
    def _hand_off(self) -> None:
        self._scheduled = False
        writer = self._writer
        awaited, self._awaited = self._awaited, False
        if self._early:
            self._answer_early()
        if not awaited and self._unwritten:
            # Nobody waits for these (ack=none): they join the group after the write in flight, whose
            # report hands them off, so that many share a write and an fsync.
            return
        if writer is not None and not self._unwritten and self.disk.writes_inline() and _inline(self._queue):
            group = self._hand(self._take())
            error: BaseException | None = None
            started = time.perf_counter()
            try:
                self._wal.append(wal_pieces(group.frames), group.records, sync=group.sync)
            except BaseException as exc:  # noqa: BLE001 - as the writer thread reports it
                error = exc
            self._written([group], error, time.perf_counter() - started, inline=True)
            return
        # A bound on rows handed but not written: behind it, single messages queue here and move ahead
        # of batches at the next _take, rather than wait behind every batch already handed.
        while self._queue and writer is not None and self._unwritten_rows < self._max_group:
            writer.groups.put(self._hand(self._take()))

    def _answer_early(self) -> None:
        """Answer the ack=none messages queued in this loop pass, all together: before the pass writes
        anything, so their producers send on while the write and fsync run."""
        early, self._early = self._early, []
        for p in early:
            _call(p)

    def _hand(self, items: list[Queued]) -> _Group:
        """`items` as a group: offsets, timestamps and frames assigned; counted as unwritten."""
        records = [p.item for p in items]
        saved = self._assign(records)
        # A single message's frame is encoded here, on the loop: a few µs each, and the thread then
        # needs the GIL for no Python work. A chunk's (Arrow IPC) is written in the thread.
        frames: list[bytes | Chunk] = [encode(r) if isinstance(r, Record) else r for r in records]
        rows = sum(1 if isinstance(r, Record) else r.rows for r in records)
        group = _Group(items, records, frames, saved, self._epoch, rows, sum(r.size for r in records),
                       any(map(_waited_for, items)))
        self._unwritten.append(group)
        self._unwritten_rows += rows
        return group

    def _assign(self, records: list[Record | Chunk]) -> dict[PartitionKey, int]:
        # Log-append time, never going backwards, so seeking by time is monotonic per partition.
        now = max(time.time_ns() // 1000, self._last_ts)
        self._last_ts = now
        saved: dict[PartitionKey, int] = {}
        offsets = self.next_offsets
        claims = self.claims
        for r in records:
            key = (r.topic_id, r.partition)
            nxt = offsets.get(key, 0)
            if key not in saved:
                saved[key] = nxt
            r.offset = nxt
            if claims:
                r.claim = claims.get(key, 0)
            r.timestamp_us = now
            offsets[key] = nxt + (1 if isinstance(r, Record) else r.rows)
        return saved

    def _written(self, groups: list[_Group], error: BaseException | None, took_s: float, *,
                 inline: bool = False) -> None:
        """The report of one write: answer its groups, or fail them and everything after them."""
        if error is not None or any(g.sync for g in groups):  # an unsynced write says nothing of the disk
            self.disk.judge(sum(g.size for g in groups), error, took_s, inline)
        if error is not None:
            if groups[0].epoch == self._epoch:  # the first failure of this epoch: later reports of it are moot
                self._fail(error, len(groups))
        else:
            records: list[Record | Chunk] = []
            for group in groups:
                assert self._unwritten[0] is group, "the writer reports groups in hand-off order"
                self._unwritten.popleft()
                self._unwritten_rows -= group.rows
                self.queued_bytes -= group.size
                records += group.records
                _answer(group.items, moved=self._moved_if_stale if self.claims else None)
            self._metrics.wal_group_size.observe(sum(g.rows for g in groups))  # made durable by one fdatasync
            self._on_durable(records)
        if self._queue:
            self._schedule()

    def _fail(self, exc: BaseException, written: int) -> None:
        """Fail every unwritten group (the failed write's and those handed after it), and roll offsets
        back to before the first of them. The items of their partitions still queued fail too: one
        stored ahead of a failed item sent before it would reorder the partition (and to a Kafka
        producer's sequence check, make the failed item's retry look like a duplicate)."""
        failed = list(self._unwritten)
        self._unwritten.clear()
        self._unwritten_rows = 0
        self._epoch += 1
        for group in reversed(failed):  # the earliest group's saved offsets win
            self.next_offsets.update(group.saved)
        keys = {(r.topic_id, r.partition) for group in failed for r in group.records}
        behind: list[Queued] = []
        kept: list[Queued] = []
        for p in self._queue:
            (behind if (p.item.topic_id, p.item.partition) in keys else kept).append(p)
        self._queue = kept
        reason = "disk full" if isinstance(exc, OSError) and exc.errno == errno.ENOSPC else f"write failed ({exc})"
        log.error("WAL write of %d groups not durable: %s (with the %d groups handed after them, and %d items of "
                  "their partitions queued behind)", written, reason, len(failed) - written, len(behind))
        error = StorageUnavailable(f"WAL {reason}: the message was not accepted; retry once space returns")
        for group in failed:
            self.queued_bytes -= group.size
            _answer(group.items, error)
        if behind:
            self.queued_bytes -= sum(p.item.size for p in behind)
            _answer(behind, error)


def _waited_for(p: Queued) -> bool:
    """Whether someone waits for the item's write (not an ack=none message answered early)."""
    return p.future is not None or (isinstance(p, Pending) and p.then is not None and not p.early)


def _inline(queue: list[Queued]) -> bool:
    """Whether the loop writes this queue itself: single messages only, INLINE_GROUP_BYTES at most."""
    size = 0
    for p in queue:
        if type(p) is not Pending:
            return False
        size += p.record.size
    return 0 < size <= INLINE_GROUP_BYTES


def _answer(items: list[Queued], error: LakebrokerError | None = None, *,
             moved: Callable[[Record | Chunk], LakebrokerError | None] | None = None) -> None:
    """Answer the items' waiters: with their placement, or `error`; an item `moved` gives an
    error for (its partition was rebased after it was given its offset) gets that instead."""
    for p in items:
        failure = error
        if failure is None and moved is not None:
            failure = moved(p.item)
        if isinstance(p, Pending):
            r = p.record
            p.outcome = (r.partition, r.offset, r.timestamp_us) if failure is None else failure
            future = p.future
            if future is not None and not future.done():
                if failure is None:
                    future.set_result(p.outcome)  # type: ignore[arg-type]
                else:
                    future.set_exception(failure)
            if p.then is not None:
                _call(p)
        elif p.future is not None and not p.future.done():
            if failure is None:
                p.future.set_result(p.chunk)
            else:
                p.future.set_exception(failure)


def _call(p: Pending) -> None:
    then = p.then
    if then is not None:
        p.then = None  # it refers to its waiter, which refers to this: no cycle left for the collector
        try:
            then()
        except Exception:  # one request's answer must not keep the group's others from theirs
            log.exception("answering a produced message failed")
