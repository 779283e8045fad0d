"""Delivers one partition of one subscription: read → dispatch in order → retry → commit.

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
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lakebroker.delivery_worker.commit_watch import CommitWatch, Following
from lakebroker.delivery_worker.flow import AdaptiveWindow, ByteBudget, TokenBucket
from lakebroker.delivery_worker.metrics import DeliveryMetrics
from lakebroker.delivery_worker.ordering import DispatchQueue, Unit
from lakebroker.delivery_worker.retry import RetryPolicy
from lakebroker.delivery_worker.sender import Outcome, Sender
from lakebroker.delivery_worker.signer import Signer
from lakebroker.delivery_worker.source import PartitionSource
from lakebroker.tables.dead_letters import DeadLetter, DeadLetterTable
from lakebroker.tables.errors import OffsetGap
from lakebroker.tables.offsets import Fence, OffsetReason, OffsetsTable
from lakebroker.tables.subscriptions import Subscription

log = logging.getLogger(__name__)
READ_AHEAD = 1000  # messages a pipeline reads ahead at most (and bytes: delivery_read_ahead_bytes)
FIRST_READ = 8  # messages in a pipeline's first read, before it knows how large they are


def row_bytes(row: dict[str, Any]) -> int:
    """What a read-ahead row holds in memory, as the read-ahead bounds count it: its value and key."""
    value, key = row["value"], row["key"]
    return 64 + (0 if value is None else len(value)) + (0 if key is None else len(key))


@dataclass
class Endpoint:
    """Flow control shared by every partition of a subscription that this worker delivers."""

    bucket: TokenBucket
    window: AdaptiveWindow
    backing_off_until: float = 0.0

    @classmethod
    def for_subscription(cls, sub: Subscription) -> Endpoint:
        return cls(TokenBucket(sub.rate_limit_per_s), AdaptiveWindow(sub.max_in_flight))


@dataclass
class PipelineStatus:
    committed: int = 0
    position: int = 0
    log_end: int = 0
    in_flight: int = 0
    delivered: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    last_status: int | None = None
    last_error: str | None = None
    state: str = "healthy"  # healthy | backing_off | fenced (lease not renewed: sends wait) | disabled

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "lag": max(0, self.log_end - self.committed)}


class Gone(Exception):
    """The endpoint answered 410: stop delivering to it."""


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
        self.sender = sender
        self.endpoint = endpoint
        self.offsets = offsets
        self.dead_letters = dead_letters
        self.metrics = metrics
        self.poll_s = poll_s
        self.lease_left = lease_left  # seconds this worker may still act on the partition (<= 0: none)
        self._send_deadlines: set[asyncio.Timeout] = set()  # of the sends in progress: moved when the lease is
        self.fence = fence  # carried by every offset commit: a late commit of ours never beats a successor's
        self.on_gone = on_gone
        self.policy = RetryPolicy(sub.retry_schedule_ms, sub.max_attempts)
        self.signer = Signer(sub.secrets)
        self.status = PipelineStatus(committed=start_offset, position=start_offset)
        self._read_pos = start_offset
        self._queue = DispatchQueue(sub.ordering, sub.batch_size)
        self._done: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._running_sends: set[asyncio.Task[None]] = set()  # sends whose body has started
        self._give_backs: set[asyncio.Task[None]] = set()  # window slots of sends that never started
        self._reader: asyncio.Task[bool] | None = None
        # Read ahead is bounded in bytes too, per pipeline and per process (`budget`): 1,000 messages
        # of 1 MiB each would be a GiB a partition.
        self._read_ahead_bytes = read_ahead_bytes
        self._budget = budget or ByteBudget(read_ahead_bytes)
        self._held_bytes = 0  # of the rows read and not yet done (queued, in flight or backing off)
        self._row_bytes = 0.0  # the average row_bytes of the rows read so far (0: none yet)
        self._stopping = False
        self._dead: list[DeadLetter] = []
        self._wake = asyncio.Event()
        self._last_poll = -math.inf  # never polled: not 0.0, which time.monotonic() is near after a boot
        self._commits = commits  # tells of a new commit at once (commit_watch.py); polling stays as the fallback
        self._following: Following | None = None
        self._commit_seen = False
        self._gap = False  # the last read met an OffsetGap: read again only once per poll interval
        self._gone: Gone | None = None
        self._crashed: BaseException | None = None
        # Children bound once: a labels() lookup per message is measurable at thousands a second.
        # Binding also starts each series at zero, so dashboards and alerts see it before any event.
        name, part = sub.name, str(partition)
        self._attempts = {o: metrics.attempts.labels(name, o)
                          for o in ("ok", "retry", "rate_limited", "timeout", "error", "gone")}
        self._delivered = metrics.delivered.labels(name)
        self._dead_lettered = metrics.dead_lettered.labels(name)
        self._in_flight = metrics.in_flight.labels(name)
        self._lag = metrics.lag.labels(name, part)
        self._skipped = metrics.skipped.labels(name, part)
        self._latency = metrics.latency.labels(name)

    # -- the loop -------------------------------------------------------------------------
    async def run(self) -> None:
        """Read and dispatch until stopped. Commits and replays are driven by the worker
        (worker.py), batched across its pipelines, so a Delta commit never stalls dispatch."""
        try:
            while True:
                self._read_ahead()
                self._dispatch()
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that races
                # a wake-up, and then stop() would wait forever.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_s):
                        await self._wake.wait()
                self._wake.clear()
                if self._gone is not None:
                    raise self._gone
                if self._crashed is not None:  # a delivery task hit a bug: the worker restarts this pipeline
                    raise self._crashed
        except Gone as exc:
            self.status.state = "disabled"
            self.on_gone(str(exc))

    async def stop(self) -> None:
        """Cancel outstanding sends (they will be redelivered). What is done stays for the worker
        to commit (`to_commit`), batched with the other pipelines it stops."""
        self._stopping = True
        tasks = list(self._tasks) + ([self._reader] if self._reader is not None else [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._budget.used -= self._held_bytes  # what it held is dropped with it
        self._held_bytes = 0
        if self._following is not None:
            self._following.close()

    def to_commit(self) -> tuple[int | None, list[DeadLetter]]:
        """The position to commit (None if unchanged or the lease is in doubt) and the dead letters
        to write first. Taken together, synchronously: a letter is queued before its offset counts
        as done, so every letter below the position is in the list."""
        if self.lease_left() <= 0:
            return None, []  # another worker may own the partition now: never move its offset
        position = self.status.position
        letters, self._dead = self._dead, []
        self._lag.set(max(0, self.status.log_end - position))
        return (None if position == self.status.committed else position), letters

    def committed(self, position: int) -> None:
        self.status.committed = max(self.status.committed, position)

    def give_back(self, letters: list[DeadLetter]) -> None:
        """Writing the dead letters failed: keep them for the next commit."""
        self._dead = letters + self._dead

    # -- reading --------------------------------------------------------------------------
    def _read_ahead(self) -> None:
        """Keep the buffer topped up in the background, so sends never wait for a Delta read."""
        reader = self._reader
        if reader is not None:
            if not reader.done():
                return
            self._reader = None
            reader.result()  # a failed read stops the pipeline; the worker restarts it
        waiting = self._read_pos >= self.status.log_end or self._gap
        if waiting and not self._commit_seen:
            if time.monotonic() - self._last_poll < self.poll_s:
                return  # looking for new commits reads the Delta log: on a commit, else once per poll interval
            if not self._gap and self.source.known_log_end(self.poll_s) == self.status.log_end:
                self._follow()
                return  # a pipeline sharing this table's tail looked within the interval: nothing new here
        if len(self._queue) < READ_AHEAD // 2 and (self._room() > 0 or not self._held_bytes):
            self._reader = asyncio.create_task(self._fill())
            self._reader.add_done_callback(self._read_done)

    def _read_done(self, reader: asyncio.Task[bool]) -> None:
        if reader.cancelled() or reader.exception() is not None or reader.result() or self._commit_seen:
            self._wake.set()  # new rows to send, an error for run() to raise, or a commit that landed meanwhile

    async def _fill(self) -> bool:
        """Read the next messages into the buffer; False if there was nothing new."""
        if self._read_pos >= self.status.log_end:
            self._last_poll = time.monotonic()
            self._follow()
            self._commit_seen = False  # set again by any commit that lands from here on
            self.status.log_end = await asyncio.to_thread(self.source.log_end)
            if self._read_pos > self.status.log_end and self._read_pos == self.status.position:
                await self._reset_to_log_end(self.status.log_end)
        log_end = self.status.log_end
        if self._read_pos >= log_end:
            return False
        if self._read_pos == self.status.position:
            await self._skip_expired(log_end)
        room = self._room()
        count = FIRST_READ if not self._row_bytes else max(1, min(READ_AHEAD, int(room // self._row_bytes)))
        end = min(self._read_pos + count, log_end)
        try:
            rows, end = await asyncio.to_thread(self.source.read, self._read_pos, end)
        except OffsetGap as gap:
            if not self._gap:
                log.error("subscription %s partition %d: %s", self.sub.name, self.partition, gap.message)
            self._gap, self.status.last_error = True, gap.message
            self._last_poll = time.monotonic()
            return False  # read again after the poll interval; never skip what is missing
        self._gap = False
        rows, end = self._within(rows, end, room)
        present = {r["offset"] for r in rows}
        # Offsets in the range with no row were removed by key compaction: nothing to deliver.
        self._done.update(o for o in range(self._read_pos, end) if o not in present)
        self._queue.extend(rows)
        self._read_pos = end
        self._advance()
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

    def _release(self, rows: list[dict[str, Any]]) -> None:
        size = sum(map(row_bytes, rows))
        self._held_bytes -= size
        self._budget.used -= size

    def _follow(self) -> None:
        if self._commits is not None and (self._following is None or not self._following.active):
            self._following = self._commits.follow(self.source.uri, self._on_commit)

    def _on_commit(self) -> None:
        self._commit_seen = True
        self._wake.set()

    async def _reset_to_log_end(self, log_end: int) -> None:
        """The group is past the table's log end: the data dir was restored from a backup or failed
        over to a replica that is behind. The offsets in between were never in this table, so new
        messages will take them: move back to the log end, as Kafka's offset reset does, and say so
        (waiting instead would skip those new messages without a word)."""
        ahead = self._read_pos
        await self._jump(log_end, OffsetReason.RESET,
                         f"committed offset {ahead} was past the log end {log_end}; reset to {log_end}")

    async def _skip_expired(self, log_end: int) -> None:
        log_start = await asyncio.to_thread(self.source.log_start, log_end)
        if log_start <= self._read_pos:
            return
        skipped = log_start - self._read_pos
        await self._jump(log_start, OffsetReason.RETENTION_SKIP,
                         f"retention removed {skipped} undelivered messages ({self._read_pos}-{log_start - 1})")
        self._skipped.inc(skipped)  # counted once the move is committed, so a failed commit never counts twice
        self.status.skipped += skipped

    async def _jump(self, offset: int, reason: OffsetReason, why: str) -> None:
        """Move the group to `offset` and commit it with the reason, never silently. Called only
        when nothing is buffered, in flight or done past the position, so there is nothing to keep."""
        log.warning("subscription %s partition %d: %s", self.sub.name, self.partition, why)
        await asyncio.to_thread(self.offsets.commit, self.sub.name, self.sub.topic, {self.partition: offset}, reason,
                                fence=self.fence)
        self.status.last_error = why
        self._read_pos = self.status.position = self.status.committed = offset
        self._done.clear()

    # -- dispatching ----------------------------------------------------------------------
    def _fenced(self) -> bool:
        """True while the lease is in doubt: a send now could overlap the next owner's."""
        if self.lease_left() > 0:
            if self.status.state == "fenced":
                self.status.state = "healthy"
            return False
        self.status.state = "fenced"
        return True

    def _dispatch(self) -> None:
        window = self.endpoint.window
        if time.monotonic() < self.endpoint.backing_off_until or self._fenced():
            return
        while window.has_room():
            unit = self._queue.take()  # the ordering rule: delivery_worker/ordering.py
            if unit is None:
                return
            window.in_flight += 1  # taken synchronously, so the loop never oversubscribes
            self.status.in_flight += 1
            self._in_flight.inc()
            task = asyncio.create_task(self._deliver(unit))
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task not in self._running_sends:
            # Cancelled before its first step (a stop right after a dispatch): its body and its
            # `finally` never ran, so the slot and the count taken in _dispatch come back here, or
            # the endpoint's shared window would stay short of a slot for good.
            self.status.in_flight -= 1
            self._in_flight.dec()
            self._give_backs.add(asyncio.get_running_loop().create_task(self.endpoint.window.give_back()))
            self._give_backs = {t for t in self._give_backs if not t.done()}
        self._running_sends.discard(task)
        if not task.cancelled() and task.exception() is not None and self._crashed is None:
            self._crashed = task.exception()  # its key would stay busy forever: let run() fail loudly
        if not self._stopping and self._gone is None:
            self._dispatch()  # the next message goes now, not after a turn of run()'s loop
        self._wake.set()

    async def _deliver(self, unit: Unit) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._running_sends.add(task)  # from here on, the `finally` below gives back what _dispatch took
        window = self.endpoint.window
        attempts = 0
        holding = True
        try:
            while True:
                if not holding:
                    await window.acquire()
                    holding = True
                while self._fenced():  # retries too: never send once the lease may have passed on
                    await asyncio.sleep(self.poll_s)
                await self.endpoint.bucket.take(len(unit.rows))
                outcome = await self._attempt_within_lease(unit.rows)
                if outcome is None:  # the lease ended before or during the send: not an attempt of ours
                    holding = False
                    await window.release(False)
                    continue
                attempts += 1
                self._record(outcome)
                holding = False
                await window.release(outcome.ok)
                if outcome.ok:
                    self._complete(unit, delivered=True)
                    return
                if outcome.gone:
                    raise Gone(f"endpoint answered 410 Gone at offset {unit.rows[0]['offset']}")
                if self.policy.exhausted(attempts):
                    self._dead.extend(
                        DeadLetter.from_exhausted_retries(self.sub.name, self.sub.topic, self.partition,
                                                          r["offset"], attempts, outcome.status, outcome.error)
                        for r in unit.rows
                    )
                    self._complete(unit, delivered=False)
                    return
                delay = self.policy.delay_s(attempts, outcome.retry_after_s)
                self.status.state = "backing_off"
                if outcome.retry_after_s is not None:  # the endpoint asked everyone to wait
                    self.endpoint.backing_off_until = time.monotonic() + outcome.retry_after_s
                await asyncio.sleep(delay)
        except Gone as exc:
            self._gone = exc
            self._wake.set()
        finally:
            if holding:
                await window.release(False)
            self.status.in_flight -= 1
            self._in_flight.dec()

    async def _attempt_within_lease(self, rows: list[dict[str, Any]]) -> Outcome | None:
        """`_attempt`, started only while the lease holds and cut off when it ends (as renewed
        meanwhile: `lease_renewed`), so no send overlaps the next owner's; None if cut off or not begun.
        The receiver may have got a cut-off request: the next owner sends it again, with the same
        webhook-id."""
        left = self.lease_left()  # checked after the rate limiter's wait, right before the send
        if left <= 0:
            return None
        try:
            async with asyncio.timeout(left) as deadline:
                self._send_deadlines.add(deadline)
                try:
                    return await self._attempt(rows)
                finally:
                    self._send_deadlines.discard(deadline)
        except TimeoutError:
            self.status.last_error = "a send was cut off: the partition's lease ended while it ran"
            return None

    def lease_renewed(self) -> None:
        """The worker renewed the lease: sends in progress may run until its new end."""
        if self._send_deadlines:
            when = asyncio.get_running_loop().time() + self.lease_left()
            for deadline in self._send_deadlines:
                if not deadline.expired():  # one that fired is cutting its send off already
                    deadline.reschedule(when)

    async def _attempt(self, rows: list[dict[str, Any]]) -> Outcome:
        """One POST. Whatever goes wrong ends the attempt as a failure, retried by the policy: an
        exception escaping here would kill the task, keep its key busy and stall the partition."""
        try:
            return await self.sender.send(self.sub.url, self.sub.topic, rows, self.signer,
                                          self.sub.timeout_ms / 1000, batch=self.sub.batch_size > 1)
        except Exception as exc:
            log.exception("subscription %s partition %d: delivery attempt failed", self.sub.name, self.partition)
            return Outcome(None, f"internal error: {type(exc).__name__}: {exc}"[:500])

    def _record(self, outcome: Outcome) -> None:
        if outcome.ok:
            label = "ok"
        elif outcome.gone:
            label = "gone"
        elif outcome.status is None:
            label = "timeout" if outcome.error and "timed out" in outcome.error else "error"
        elif outcome.status == 429:
            label = "rate_limited"
        else:
            label = "retry"
        self._attempts[label].inc()
        self.status.last_status = outcome.status
        if not outcome.ok:
            self.status.last_error = outcome.error

    def _complete(self, unit: Unit, *, delivered: bool) -> None:
        self._queue.release(unit)
        self._release(unit.rows)
        now = time.time()
        for row in unit.rows:
            self._done.add(row["offset"])
            if delivered:
                self._latency.observe(max(0.0, now - row["timestamp"].timestamp()))
        if delivered:
            self.status.delivered += len(unit.rows)
            self._delivered.inc(len(unit.rows))
            self.status.state = "healthy"
        else:
            self.status.dead_lettered += len(unit.rows)
            self._dead_lettered.inc(len(unit.rows))
        self._advance()

    def _advance(self) -> None:
        position = self.status.position
        while position in self._done:
            self._done.discard(position)
            position += 1
        self.status.position = position

    # -- replay of dead letters -----------------------------------------------------------
    async def replay(self, offsets: list[int]) -> None:
        """Redeliver dead letters an operator asked to replay."""
        rows = await asyncio.to_thread(self.source.read_offsets, offsets[:100])
        replayed: list[int] = []
        failed: list[tuple[int, Outcome]] = []
        for row in rows:  # one attempt per replay request; a failure leaves the letter dead
            if self._fenced():
                break  # the rest stay requested, for whoever holds the lease next
            await self.endpoint.bucket.take()
            outcome = await self._attempt_within_lease([row])
            if outcome is None:
                break  # the lease ended: the rest stay requested, for whoever holds it next
            self._record(outcome)
            if outcome.gone:
                raise Gone("endpoint answered 410 Gone during a dead-letter replay")
            if outcome.ok:
                replayed.append(row["offset"])
                self._delivered.inc()
            else:
                failed.append((row["offset"], outcome))
        missing = set(offsets[:100]) - {r["offset"] for r in rows}  # removed by retention since
        await asyncio.to_thread(self.dead_letters.mark_replayed, self.sub.name, self.partition,
                                replayed + sorted(missing))
        for offset, outcome in failed:
            await asyncio.to_thread(self.dead_letters.replay_failed, self.sub.name, self.partition, offset,
                                    outcome.status, outcome.error)
