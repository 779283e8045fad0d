"""Replays an operator asked for, sent beside the partition's live delivery, which they never hold
back: of dead letters (one attempt each; a failure leaves the letter dead, with its newest status),
and of the messages a SQL predicate matches (tables/replays.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from lakebroker.delivery_worker.sender import Outcome
from lakebroker.delivery_worker.sending import Dispatcher, Gone
from lakebroker.delivery_worker.source import PartitionSource
from lakebroker.tables.dead_letters import DeadLetterTable
from lakebroker.tables.predicates import InvalidPredicate, Query, check
from lakebroker.tables.replays import ReplayPart, ReplayState, ReplayTable

MAX_OFFSETS = 100  # a replay request's offsets taken at once; the rest stay requested
CHUNK_ROWS = 64  # matching messages read at once (1 MiB messages: 64 MiB at most), between progress records
CANCEL_CHECK_S = 1.0  # how often a replay looks for its cancel while it sends
T = TypeVar("T")
P = ParamSpec("P")
log = logging.getLogger(__name__)


async def replay(offsets: list[int], *, source: PartitionSource, sending: Dispatcher,
                 dead_letters: DeadLetterTable, delivered: Callable[[], None]) -> None:
    sub, partition = sending.sub, sending.partition
    rows = await asyncio.to_thread(source.read_offsets, offsets[:MAX_OFFSETS])
    replayed: list[int] = []
    failed: list[tuple[int, Outcome]] = []
    for row in rows:
        if sending.fenced():
            break  # the rest stay requested, for whoever holds the lease next
        await sending.endpoint.bucket.take()
        outcome = await sending.attempt_within_lease([row])
        if outcome is None:
            break  # the lease ended: the rest stay requested, for whoever holds it next
        sending.record(outcome)
        if outcome.gone:
            raise Gone("endpoint answered 410 Gone during a dead-letter replay")
        if outcome.ok:
            replayed.append(row["offset"])
            delivered()
        else:
            failed.append((row["offset"], outcome))
    missing = set(offsets[:MAX_OFFSETS]) - {r["offset"] for r in rows}  # removed by retention since
    await asyncio.to_thread(dead_letters.mark_replayed, sub.name, partition, replayed + sorted(missing))
    for offset, outcome in failed:
        await asyncio.to_thread(dead_letters.replay_failed, sub.name, partition, offset, outcome.status,
                                outcome.error)


async def replay_matching(part: ReplayPart, *, source: PartitionSource, sending: Dispatcher, replays: ReplayTable,
                          counted: Callable[[bool, int], None]) -> None:
    """Send what `part`'s predicate matches in its partition, in offset order, a chunk at a time,
    recording progress after each, until its range is scanned, the replay is cancelled (seen within
    CANCEL_CHECK_S, a send in progress cut off), or the lease ends (its next holder goes on from
    the recorded progress; what was sent since is sent again, as at-least-once delivery does). A
    failed message (its retries spent) is counted, not dead-lettered: its live delivery is the
    group's, not the replay's. Each webhook-id ends in `_<replay id>`, so a receiver that drops
    the ids it has seen still takes the replay. Scans and table writes run in a thread of their
    own, so a long scan never holds up the live pipelines' reads and lease renewals."""
    if part.topic_id != source.topic.topic_id:
        await _in_thread(replays.fail, part.replay_id,
                         f"topic {part.topic!r} was deleted and created again after the replay was asked for")
        return
    try:
        predicate = None if part.predicate is None else await _in_thread(check, part.predicate)
        await _matching(part, Query(source.uri, predicate, part.since, part.until, keep=source.keep),
                        sending, replays, counted)
    except InvalidPredicate as exc:  # a cast that fails on some row's value: the replay's own error
        log.warning("replay %s of %s failed: %s", part.replay_id, part.subscription, exc.message)
        await _in_thread(replays.fail, part.replay_id, exc.message)


async def _matching(part: ReplayPart, query: Query, sending: Dispatcher, replays: ReplayTable,
                    counted: Callable[[bool, int], None]) -> None:
    """The chunks, beside a watcher that sees the replay cancelled."""

    async def cancelled() -> bool:
        # A small read, in the default pool: behind other replays' scans in the replay thread, a
        # cancel would wait for all of them.
        current = await asyncio.to_thread(replays.part, part.replay_id, part.partition)
        return current is None or current.state is not ReplayState.RUNNING

    stopped = asyncio.Event()  # set once the replay is seen cancelled

    async def watch() -> None:
        while not stopped.is_set():
            await asyncio.sleep(CANCEL_CHECK_S)
            try:
                if await cancelled():
                    stopped.set()
            except Exception:  # a table unreadable for a moment: the next look tries again
                log.warning("replay %s: could not look for its cancel", part.replay_id, exc_info=True)

    watcher = asyncio.create_task(watch())
    try:
        await _chunks(part, query, sending, replays, counted, stopped, cancelled)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _chunks(part: ReplayPart, query: Query, sending: Dispatcher, replays: ReplayTable,
                  counted: Callable[[bool, int], None], stopped: asyncio.Event,
                  cancelled: Callable[[], Awaitable[bool]]) -> None:
    start, suffix = part.next_offset, "_" + part.replay_id
    while start < part.end_offset:
        if stopped.is_set() or await cancelled():
            return
        found = await _in_thread(query.matching, part.partition, start, part.end_offset, CHUNK_ROWS)
        if found.next_offset <= start or any(not start <= r["offset"] < found.next_offset for r in found.rows):
            raise RuntimeError(f"replay {part.replay_id}: a scan of [{start}, {part.end_offset}) answered outside it")
        rows, scanned_to = found.rows, found.next_offset
        delivered = failed = 0
        gone: Gone | None = None
        size = max(1, sending.sub.batch_size)
        for i in range(0, len(rows), size):
            batch = rows[i:i + size]
            outcome = await _unless(sending.send_settled(batch, suffix), stopped)
            if outcome is None or outcome.gone:  # the lease ended, a cancel, or the endpoint is gone: not sent
                scanned_to = batch[0]["offset"]
                gone = Gone("endpoint answered 410 Gone during a replay") if outcome is not None else None
                break
            if outcome.ok:
                delivered += len(batch)
            else:
                failed += len(batch)
        matched = sum(1 for r in rows if r["offset"] < scanned_to)
        running = await _in_thread(replays.advance, part, start, scanned_to, matched=matched,
                                   delivered=delivered, failed=failed)
        counted(True, delivered)
        counted(False, failed)
        if gone is not None:
            raise gone
        if not running or sending.fenced() or scanned_to <= start:
            return
        start = scanned_to


async def _unless(send: Coroutine[Any, Any, Outcome | None], stopped: asyncio.Event) -> Outcome | None:
    """`send`'s outcome, or None if `stopped` is set first (the send is cut off: a probe or a
    retry's wait ends with it)."""
    task = asyncio.ensure_future(send)
    waiting = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        return task.result() if task.done() else None
    finally:
        for pending in (task, waiting):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending


# One thread for every replay's scans and table writes: beside the default pool the live pipelines
# use, never in it.
_REPLAY_THREAD = ThreadPoolExecutor(1, thread_name_prefix="lakebroker-replay")


async def _in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await asyncio.get_running_loop().run_in_executor(_REPLAY_THREAD, functools.partial(fn, *args, **kwargs))
