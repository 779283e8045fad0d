"""Replay of dead letters an operator asked for: one attempt each, within the partition's lease;
a failure leaves the letter dead, with its newest status."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from lakebroker.delivery_worker.sender import Outcome
from lakebroker.delivery_worker.sending import Dispatcher, Gone
from lakebroker.delivery_worker.source import PartitionSource
from lakebroker.tables.dead_letters import DeadLetterTable

MAX_OFFSETS = 100  # a replay request's offsets taken at once; the rest stay requested


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
