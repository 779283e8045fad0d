"""A partition's read-ahead: reads the next messages from the topic table into the dispatch
queue in the background, so a send never waits for a Delta read.

- It reads at most READ_AHEAD messages and `read_ahead_bytes` ahead, and within the process's
  byte budget: 1,000 messages of 1 MiB each would be a GiB a partition.
- It looks for new commits when a commit is seen (commit_watch.py), else once per poll interval.
- An offset in the range read with no row was removed by key compaction: it is done at once. A
  hole anywhere else is an OffsetGap: nothing past it is read, and the error is in the status.
- A group that retention passed, or that is past the table's committed end, is moved by
  `jump` (the pipeline commits the move with its reason) before anything is read.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from lakebroker.delivery_worker.commit_watch import CommitWatch, Following
from lakebroker.delivery_worker.flow import ByteBudget
from lakebroker.delivery_worker.ordering import DispatchQueue
from lakebroker.delivery_worker.position import PositionTracker
from lakebroker.delivery_worker.source import PartitionSource
from lakebroker.tables.errors import OffsetGap
from lakebroker.tables.offsets import OffsetReason

if TYPE_CHECKING:
    from lakebroker.delivery_worker.pipeline import PipelineStatus

log = logging.getLogger(__name__)
READ_AHEAD = 1000  # messages a pipeline reads ahead at most (and bytes: delivery_read_ahead_bytes)
FIRST_READ = 8  # messages in a pipeline's first read, before it knows how large they are

Jump = Callable[[int, OffsetReason, str], Awaitable[None]]


def row_bytes(row: dict[str, Any]) -> int:
    """What a read-ahead row holds in memory, as the read-ahead bounds count it: its value and key."""
    value, key = row["value"], row["key"]
    return 64 + (0 if value is None else len(value)) + (0 if key is None else len(key))


class PartitionReader:
    def __init__(self, name: str, partition: int, *, source: PartitionSource, queue: DispatchQueue,
                 tracker: PositionTracker, status: PipelineStatus, jump: Jump, wake: Callable[[], None],
                 count_skipped: Callable[[int], None],
                 poll_s: float, read_ahead_bytes: int, budget: ByteBudget | None,
                 commits: CommitWatch | None) -> None:
        self.name, self.partition = name, partition
        self.source = source
        self.queue = queue
        self.tracker = tracker
        self.status = status
        self._jump = jump
        self._wake = wake
        self._count_skipped = count_skipped  # the retention-skip metric
        self.poll_s = poll_s
        self.read_pos = tracker.position  # the next offset to read
        self._read_ahead_bytes = read_ahead_bytes
        self._budget = budget or ByteBudget(read_ahead_bytes)
        self._held_bytes = 0  # of the rows read and not yet done (queued, in flight or backing off)
        self._row_bytes = 0.0  # the average row_bytes of the rows read so far (0: none yet)
        self._task: asyncio.Task[bool] | None = None
        self._last_poll = -math.inf  # never polled: not 0.0, which time.monotonic() is near after a boot
        self._commits = commits  # tells of a new commit at once; polling stays as the fallback
        self._following: Following | None = None
        self._commit_seen = False
        self._gap = False  # the last read met an OffsetGap: read again only once per poll interval

    def top_up(self) -> None:
        """Start a background read if the queue runs low and there may be something to read; a
        read that failed raises here (the worker restarts the pipeline)."""
        task = self._task
        if task is not None:
            if not task.done():
                return
            self._task = None
            task.result()
        waiting = self.read_pos >= self.status.committed_end or self._gap
        if waiting and not self._commit_seen:
            if time.monotonic() - self._last_poll < self.poll_s:
                return  # looking for new commits reads the Delta log: on a commit, else once per poll interval
            if not self._gap and self.source.known_committed_end(self.poll_s) == self.status.committed_end:
                self._follow()
                return  # a pipeline sharing this table's tail looked within the interval: nothing new here
        if len(self.queue) < READ_AHEAD // 2 and (self._room() > 0 or not self._held_bytes):
            self._task = asyncio.create_task(self._fill())
            self._task.add_done_callback(self._read_done)

    def moved(self, offset: int) -> None:
        """The group was moved to `offset` (a committed jump): read from there."""
        self.read_pos = offset

    def release(self, rows: list[dict[str, Any]]) -> None:
        """These rows are done: their bytes go back to the bounds."""
        size = sum(map(row_bytes, rows))
        self._held_bytes -= size
        self._budget.used -= size

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._budget.used -= self._held_bytes  # what it held is dropped with it
        self._held_bytes = 0
        if self._following is not None:
            self._following.close()

    def _read_done(self, task: asyncio.Task[bool]) -> None:
        if task.cancelled() or task.exception() is not None or task.result() or self._commit_seen:
            self._wake()  # new rows to send, an error for run() to raise, or a commit that landed meanwhile

    async def _fill(self) -> bool:
        """Read the next messages into the queue; False if there was nothing new."""
        status = self.status
        if self.read_pos >= status.committed_end:
            self._last_poll = time.monotonic()
            self._follow()
            self._commit_seen = False  # set again by any commit that lands from here on
            status.committed_end = await asyncio.to_thread(self.source.committed_end)
            if self.read_pos > status.committed_end and self.read_pos == self.tracker.position:
                await self._reset_to_committed_end(status.committed_end)
        committed_end = status.committed_end
        if self.read_pos >= committed_end:
            return False
        if self.read_pos == self.tracker.position:
            await self._skip_expired(committed_end)
        room = self._room()
        # Before the first read the rows' size is unknown: as large as the topic allows, for its bound.
        size = self._row_bytes or self.source.topic.max_message_bytes
        count = max(1, min(READ_AHEAD if self._row_bytes else FIRST_READ, int(room // size)))
        end = min(self.read_pos + count, committed_end)
        # The read holds what it decodes before `_within` counts it: reserved meanwhile, so reads
        # running at once in several pipelines never take more than the process's bound between them.
        reserved = max(0, min(room, int((end - self.read_pos) * size)))
        self._budget.used += reserved
        try:
            rows, end = await asyncio.to_thread(self.source.read, self.read_pos, end)
        except OffsetGap as gap:
            if not self._gap:
                log.error("subscription %s partition %d: %s", self.name, self.partition, gap.message)
            self._gap, status.last_error = True, gap.message
            self._last_poll = time.monotonic()
            return False  # read again after the poll interval; never skip what is missing
        finally:
            self._budget.used -= reserved
        self._gap = False
        rows, end = self._within(rows, end, room)
        present = {r["offset"] for r in rows}
        self.queue.extend(rows)
        start, self.read_pos = self.read_pos, end
        # Offsets in the range with no row were removed by key compaction: nothing to deliver.
        self.tracker.done(o for o in range(start, end) if o not in present)
        return True

    def _room(self) -> int:
        """Bytes this pipeline may still read ahead: its own bound and the process's."""
        return min(self._read_ahead_bytes - self._held_bytes, self._budget.room())

    def _within(self, rows: list[dict[str, Any]], end: int, room: int) -> tuple[list[dict[str, Any]], int]:
        """The rows that fit in `room` bytes (at least one, so a partition always moves) and the
        end of the range they cover; taken from the budget."""
        kept, size = 0, 0
        for row in rows:
            grown = size + row_bytes(row)
            if kept and grown > room:
                break
            kept, size = kept + 1, grown
        if kept < len(rows):
            rows, end = rows[:kept], rows[kept]["offset"]  # the rest is read again when there is room
        if rows:
            self._row_bytes = size / kept if not self._row_bytes else 0.5 * self._row_bytes + 0.5 * size / kept
        self._held_bytes += size
        self._budget.used += size
        return rows, end

    def _follow(self) -> None:
        if self._commits is not None and (self._following is None or not self._following.active):
            self._following = self._commits.follow(self.source.uri, self._on_commit)

    def _on_commit(self) -> None:
        self._commit_seen = True
        self._wake()

    async def _reset_to_committed_end(self, committed_end: int) -> None:
        """The group is past the table's committed end: the data dir was restored from a backup
        or failed over to a replica that is behind. The offsets in between were never in this
        table, so new messages will take them: move back to the committed end, as Kafka's offset
        reset does, and say so (waiting instead would skip those new messages without a word)."""
        ahead = self.read_pos
        await self._jump(committed_end, OffsetReason.RESET,
                         f"committed offset {ahead} was past the table's committed end {committed_end}; "
                         f"reset to {committed_end}")

    async def _skip_expired(self, committed_end: int) -> None:
        log_start = await asyncio.to_thread(self.source.log_start, committed_end)
        if log_start <= self.read_pos:
            return
        skipped = log_start - self.read_pos
        await self._jump(log_start, OffsetReason.RETENTION_SKIP,
                         f"retention removed {skipped} undelivered messages ({self.read_pos}-{log_start - 1})")
        self._count_skipped(skipped)  # counted once the move is committed, so a failed commit never counts twice
        self.status.skipped += skipped
