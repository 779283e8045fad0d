"""Delivers one partition of one subscription: read → dispatch in order → retry → commit.

The parts: the read-ahead (reader.py), the sends and their retries (sending.py), where the group
stands (position.py) and replay of dead letters (replay.py). This class wires them, runs their
loop, and gives the worker (worker.py) what to commit.

Position rules (the group's committed offset is the next offset to deliver):
- an offset is *done* once acknowledged by a 2xx or dead-lettered (durably, before the
  offset commit that passes it), or when key compaction left no message there (in any other
  topic a hole is an OffsetGap: the partition waits, with the error in its status, and skips nothing);
- the position advances only over a contiguous run of done offsets, so nothing is skipped;
- if retention removed offsets the group never delivered, the jump is committed with the
  reason `retention-skip`, counted in a metric and shown in the status, never silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lakebroker.delivery_worker.commit_watch import CommitWatch
from lakebroker.delivery_worker.flow import ByteBudget
from lakebroker.delivery_worker.metrics import DeliveryMetrics
from lakebroker.delivery_worker.ordering import DispatchQueue, Unit
from lakebroker.delivery_worker.position import PositionTracker
from lakebroker.delivery_worker.reader import PartitionReader
from lakebroker.delivery_worker.replay import replay, replay_matching
from lakebroker.delivery_worker.sender import Sender
from lakebroker.delivery_worker.sending import Dispatcher, Endpoint, Gone
from lakebroker.delivery_worker.source import PartitionSource
from lakebroker.tables.dead_letters import DeadLetter, DeadLetterTable
from lakebroker.tables.offsets import Fence, OffsetReason, OffsetsTable
from lakebroker.tables.replays import ReplayPart, ReplayTable
from lakebroker.tables.subscriptions import Subscription

log = logging.getLogger(__name__)

@dataclass
class PipelineStatus:
    """What a pipeline reports: live in this process, and through the leases table to the others."""

    tracker: PositionTracker = field(repr=False)
    committed_end: int = 0
    in_flight: int = 0
    delivered: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    last_status: int | None = None
    last_error: str | None = None
    state: str = "healthy"  # healthy | backing_off | fenced (lease not renewed: sends wait) | disabled

    @property
    def committed(self) -> int:
        return self.tracker.committed

    @property
    def position(self) -> int:
        return self.tracker.position

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("tracker", "committed_end")}
        # the leases table keeps this JSON: its keys stay those it has always had
        return {"committed": self.committed, "position": self.position, "log_end": self.committed_end, **out,
                "lag": max(0, self.committed_end - self.committed)}


class PartitionPipeline:
    def __init__(
        self,
        sub: Subscription,
        partition: int,
        start_offset: int,
        *,
        source: PartitionSource,
        sender: Sender,
        endpoint: Endpoint,
        offsets: OffsetsTable,
        dead_letters: DeadLetterTable,
        metrics: DeliveryMetrics,
        poll_s: float,
        lease_left: Callable[[], float],
        fence: Fence,
        on_gone: Callable[[str], None],
        commits: CommitWatch | None = None,
        read_ahead_bytes: int = 16 * 1024 * 1024,
        budget: ByteBudget | None = None,
    ) -> None:
        self.sub = sub
        self.partition = partition
        self.source = source
        self.offsets = offsets
        self.dead_letters = dead_letters
        self.lease_left = lease_left  # seconds this worker may still act on the partition (<= 0: none)
        self.fence = fence  # carried by every offset commit: a late commit of ours never beats a successor's
        self.on_gone = on_gone
        self.tracker = PositionTracker(start_offset)
        self.status = PipelineStatus(self.tracker)
        self.queue = DispatchQueue(sub.ordering, sub.batch_size)
        self._wake = asyncio.Event()
        # Children bound once: a labels() lookup per message is measurable at thousands a second.
        name, part = sub.name, str(partition)
        self._delivered = metrics.delivered.labels(name)
        self._dead_lettered = metrics.dead_lettered.labels(name)
        self._lag = metrics.lag.labels(name, part)
        self._latency = metrics.latency.labels(name)
        self._replayed = {ok: metrics.replayed.labels(name, "delivered" if ok else "failed") for ok in (True, False)}
        skipped = metrics.skipped.labels(name, part)  # starts at zero: dashboards see it before any skip
        self.reader = PartitionReader(
            sub.name, partition, source=source, queue=self.queue, tracker=self.tracker, status=self.status,
            jump=self._jump, wake=self._wake.set, count_skipped=skipped.inc, poll_s=poll_s,
            read_ahead_bytes=read_ahead_bytes, budget=budget, commits=commits)
        self.sending = Dispatcher(
            sub, partition, queue=self.queue, sender=sender, endpoint=endpoint, status=self.status, metrics=metrics,
            poll_s=poll_s, lease_left=lease_left, finished=self._complete, wake=self._wake.set)

    # -- the loop -------------------------------------------------------------------------
    async def run(self) -> None:
        """Read and dispatch until stopped. Commits and replays are driven by the worker
        (worker.py), batched across its pipelines, so a Delta commit never stalls dispatch."""
        try:
            while True:
                self.reader.top_up()
                self.sending.dispatch()
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that races
                # a wake-up, and then stop() would wait forever.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.reader.poll_s):
                        await self._wake.wait()
                self._wake.clear()
                if self.sending.gone is not None:
                    raise self.sending.gone
                if self.sending.crashed is not None:  # a delivery task hit a bug: the worker restarts this pipeline
                    raise self.sending.crashed
        except Gone as exc:
            self.status.state = "disabled"
            self.on_gone(str(exc))

    async def stop(self) -> None:
        """Cancel outstanding sends (they will be redelivered). What is done stays for the worker
        to commit (`to_commit`), batched with the other pipelines it stops."""
        await self.sending.stop()
        await self.reader.stop()

    def lease_renewed(self) -> None:
        self.sending.lease_renewed()

    # -- what the worker commits ----------------------------------------------------------
    def to_commit(self) -> tuple[int | None, list[DeadLetter]]:
        """The position to commit (None if unchanged or the lease is in doubt) and the dead letters
        to write first. Taken together, synchronously: a letter is queued before its offset counts
        as done, so every letter below the position is in the list."""
        if self.lease_left() <= 0:
            return None, []  # another worker may own the partition now: never move its offset
        letters, self.sending.dead = self.sending.dead, []
        self._lag.set(max(0, self.status.committed_end - self.tracker.position))
        return self.tracker.to_commit(), letters

    def committed(self, position: int) -> None:
        self.tracker.was_committed(position)

    def give_back(self, letters: list[DeadLetter]) -> None:
        """Writing the dead letters failed: keep them for the next commit."""
        self.sending.dead = letters + self.sending.dead

    async def replay(self, offsets: list[int]) -> None:
        """Redeliver dead letters an operator asked to replay."""
        await replay(offsets, source=self.source, sending=self.sending, dead_letters=self.dead_letters,
                     delivered=self._delivered.inc)

    async def replay_matching(self, part: ReplayPart, replays: ReplayTable) -> None:
        """Redeliver what a replay's predicate matches in this partition."""
        await replay_matching(part, source=self.source, sending=self.sending, replays=replays,
                              counted=self._count_replayed)

    def _count_replayed(self, delivered: bool, n: int) -> None:
        if n:
            self._replayed[delivered].inc(n)

    # -- the parts' calls back ------------------------------------------------------------
    def _complete(self, unit: Unit, delivered: bool) -> None:
        self.queue.release(unit)
        self.reader.release(unit.rows)
        if delivered:
            now = time.time()
            for row in unit.rows:
                self._latency.observe(max(0.0, now - row["timestamp"].timestamp()))
            self.status.delivered += len(unit.rows)
            self._delivered.inc(len(unit.rows))
            self.status.state = "healthy"
        else:
            self.status.dead_lettered += len(unit.rows)
            self._dead_lettered.inc(len(unit.rows))
        self.tracker.done(row["offset"] for row in unit.rows)

    async def _jump(self, offset: int, reason: OffsetReason, why: str) -> None:
        """Move the group to `offset` and commit it with the reason, never silently. Called only
        when nothing is buffered, in flight or done past the position, so there is nothing to keep."""
        log.warning("subscription %s partition %d: %s", self.sub.name, self.partition, why)
        await asyncio.to_thread(self.offsets.commit, self.sub.name, self.sub.topic, {self.partition: offset}, reason,
                                fence=self.fence)
        self.status.last_error = why
        self.tracker.jump(offset)
        self.reader.moved(offset)
