"""Replays an operator asked for, sent beside the partition's live delivery, which they never hold
back: of dead letters (one attempt each; a failure leaves the letter dead, with its newest status),
and of the messages a SQL predicate matches (tables/replays.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from lakebroker.delivery_worker.sender import Outcome
from lakebroker.delivery_worker.sending import Dispatcher, Gone
from lakebroker.delivery_worker.source import PartitionSource
from lakebroker.tables.dead_letters import DeadLetterTable
from lakebroker.tables.predicates import Query
from lakebroker.tables.replays import ReplayPart, ReplayState, ReplayTable

MAX_OFFSETS = 100  # a replay request's offsets taken at once; the rest stay requested
CHUNK_ROWS = 64  # matching messages read at once (1 MiB messages: 64 MiB at most), between progress records
CANCEL_CHECK_S = 1.0  # how often a replay looks for its cancel while it sends a chunk


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
    CANCEL_CHECK_S), or the lease ends (its next holder goes on from the recorded progress; what was
    sent since is sent again, as at-least-once delivery does). A failed message (its retries
    spent) is counted, not dead-lettered: its live delivery is the group's, not the replay's."""
    if part.topic_id != source.topic.topic_id:
        await asyncio.to_thread(replays.fail, part.replay_id,
                                f"topic {part.topic!r} was deleted and created again after the replay was asked for")
        return
    query = Query(source.uri, part.predicate, part.since, part.until, keep=source.keep)  # never what it passes over

    async def cancelled() -> bool:
        current = await asyncio.to_thread(replays.part, part.replay_id, part.partition)
        return current is None or current.state is not ReplayState.RUNNING

    start = part.next_offset
    while start < part.end_offset:
        if await cancelled():
            return
        found = await asyncio.to_thread(query.matching, part.partition, start, part.end_offset, CHUNK_ROWS)
        rows, scanned_to = found.rows, found.next_offset
        delivered = failed = 0
        gone: Gone | None = None
        size = max(1, sending.sub.batch_size)
        looked = time.monotonic()
        for i in range(0, len(rows), size):
            batch = rows[i:i + size]
            if time.monotonic() - looked >= CANCEL_CHECK_S:  # a slow endpoint: a cancel is seen mid-chunk too
                looked = time.monotonic()
                if await cancelled():
                    scanned_to = batch[0]["offset"]
                    break
            outcome = await sending.send_settled(batch)
            if outcome is None or outcome.gone:  # the lease ended, or the endpoint is gone: this batch not sent
                scanned_to = batch[0]["offset"]
                gone = Gone("endpoint answered 410 Gone during a replay") if outcome is not None else None
                break
            if outcome.ok:
                delivered += len(batch)
            else:
                failed += len(batch)
        matched = sum(1 for r in rows if r["offset"] < scanned_to)
        advanced = await asyncio.to_thread(replays.advance, part, scanned_to, matched=matched,
                                           delivered=delivered, failed=failed)
        counted(True, delivered)
        counted(False, failed)
        if gone is not None:
            raise gone
        if not advanced or sending.fenced():
            return
        start = scanned_to
