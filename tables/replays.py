"""Replays of a subscription's messages by SQL predicate: `_system/replays`, one row per replay and
partition, a small state table (tables/state_table.py) rewritten whole under optimistic concurrency.

A replay is asked for through the API (ingest_api/routes/replays.py), which writes a row per
partition with the offset range to scan: from the asked start to the partition's committed end at
that moment. Whichever delivery worker holds a partition's lease scans its range a chunk at a time
(tables/predicates.py), sends what matches, and advances the row: `next_offset`, the counts, and
`done` once the scan reaches `end_offset`; an advance applies only to the row as its sender last
saw it (`next_offset`), so a late one from a worker that lost the lease changes nothing. The worker
re-reads the row every second (delivery_worker/replay.py), so a cancel (every running row of the
replay set to `cancelled`) stops it within about a second.

Finished replays are kept KEEP_FINISHED: older ones are left out of every read, and dropped from
the table at its next write.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from lakebroker.tables.errors import AlreadyExists, NotFound
from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import REPLAYS_SCHEMA, REPLAYS_SCHEMA_VERSION
from lakebroker.tables.state_table import Rows, StateTable

MAX_RUNNING = 10  # running replays per subscription
KEEP_FINISHED = timedelta(days=7)
_NEVER = datetime.min.replace(tzinfo=UTC)  # a part's times until the table stamps them


class ReplayState(StrEnum):
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass(frozen=True)
class ReplayPart:
    """A replay's work in one partition."""

    replay_id: str
    subscription: str
    topic: str
    topic_id: str
    partition: int
    predicate: str | None
    since: datetime | None
    until: datetime | None
    start_offset: int
    end_offset: int
    next_offset: int
    matched: int = 0
    delivered: int = 0
    failed: int = 0
    state: ReplayState = ReplayState.RUNNING
    error: str | None = None
    created_at: datetime = _NEVER
    updated_at: datetime = _NEVER


@dataclass(frozen=True)
class Replay:
    """A replay as a whole: its parts' counts summed, and one state."""

    parts: tuple[ReplayPart, ...]

    @property
    def state(self) -> ReplayState:
        states = {p.state for p in self.parts}
        for state in (ReplayState.FAILED, ReplayState.CANCELLED, ReplayState.RUNNING):
            if state in states:
                return state
        return ReplayState.DONE

    def public(self) -> dict[str, Any]:
        first = self.parts[0]
        iso = _iso
        return {
            "id": first.replay_id, "subscription": first.subscription, "topic": first.topic,
            "where": first.predicate, "since": iso(first.since), "until": iso(first.until),
            "state": self.state.value, "error": next((p.error for p in self.parts if p.error), None),
            "matched": sum(p.matched for p in self.parts), "delivered": sum(p.delivered for p in self.parts),
            "failed": sum(p.failed for p in self.parts),
            "scanned": sum(p.next_offset - p.start_offset for p in self.parts),
            "to_scan": sum(p.end_offset - p.start_offset for p in self.parts),
            "created_at": iso(first.created_at), "updated_at": iso(max(p.updated_at for p in self.parts)),
            "partitions": [{"partition": p.partition, "next_offset": p.next_offset, "end_offset": p.end_offset,
                            "matched": p.matched, "delivered": p.delivered, "failed": p.failed,
                            "state": p.state.value} for p in self.parts],
        }


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def _kept(rows: Rows, now: datetime) -> Rows:
    """The rows of running replays, and of those finished within KEEP_FINISHED."""
    return [r for r in rows if r["state"] == ReplayState.RUNNING or now - r["updated_at"] < KEEP_FINISHED]


def new_replay_id() -> str:
    return "rpl_" + secrets.token_hex(8)


def _to_row(part: ReplayPart) -> dict[str, Any]:
    row = asdict(part)
    row["state"] = part.state.value
    return row


def _from_row(row: dict[str, Any]) -> ReplayPart:
    return ReplayPart(**{**row, "state": ReplayState(row["state"])})


class ReplayTable:
    def __init__(self, layout: Layout) -> None:
        self._table = StateTable(layout.replays_table, REPLAYS_SCHEMA, REPLAYS_SCHEMA_VERSION)

    def _parts(self) -> list[ReplayPart]:
        return [_from_row(r) for r in _kept(self._table.read(), datetime.now(UTC))]

    def create(self, parts: list[ReplayPart]) -> Replay:
        """Write a new replay's parts (all of one replay, one subscription)."""
        now = datetime.now(UTC)
        parts = [replace(p, created_at=now, updated_at=now) for p in parts]
        sub = parts[0].subscription

        def change(rows: Rows) -> tuple[Rows, Replay]:
            kept = _kept(rows, now)
            running = {r["replay_id"] for r in kept if r["subscription"] == sub and r["state"] == ReplayState.RUNNING}
            if len(running) >= MAX_RUNNING:
                raise AlreadyExists(f"subscription {sub!r} has {len(running)} replays running, the most it may; "
                                    "cancel one (DELETE .../replays/{id}) or wait for one to finish")
            return kept + [_to_row(p) for p in parts], Replay(tuple(parts))

        return self._table.mutate(change)

    def replays(self, subscription: str) -> list[Replay]:
        """The subscription's replays, newest first."""
        by_id: dict[str, list[ReplayPart]] = {}
        for part in self._parts():
            if part.subscription == subscription:
                by_id.setdefault(part.replay_id, []).append(part)
        found = [Replay(tuple(sorted(ps, key=lambda p: p.partition))) for ps in by_id.values()]
        return sorted(found, key=lambda r: r.parts[0].created_at, reverse=True)

    def get(self, subscription: str, replay_id: str) -> Replay:
        found = next((r for r in self.replays(subscription) if r.parts[0].replay_id == replay_id), None)
        if found is None:
            raise NotFound(f"subscription {subscription!r} has no replay {replay_id!r}")
        return found

    def part(self, replay_id: str, partition: int) -> ReplayPart | None:
        return next((p for p in self._parts() if p.replay_id == replay_id and p.partition == partition), None)

    def running(self, subscriptions: set[str]) -> dict[tuple[str, int], ReplayPart]:
        """Per (subscription, partition), the oldest running part: one replay at a time there."""
        out: dict[tuple[str, int], ReplayPart] = {}
        for part in sorted(self._parts(), key=lambda p: p.created_at):
            if part.subscription in subscriptions and part.state is ReplayState.RUNNING:
                out.setdefault((part.subscription, part.partition), part)
        return out

    def cancel(self, subscription: str, replay_id: str) -> Replay:
        self.get(subscription, replay_id)
        self._update(lambda p: p.replay_id == replay_id and p.state is ReplayState.RUNNING,
                     lambda p: replace(p, state=ReplayState.CANCELLED))
        return self.get(subscription, replay_id)

    def forget(self, subscription: str) -> None:
        """A deleted subscription's replays go with it."""
        self._table.mutate(lambda rows: ([r for r in rows if r["subscription"] != subscription], None))

    def advance(self, part: ReplayPart, expected_next: int, next_offset: int, *, matched: int, delivered: int,
                failed: int) -> bool:
        """Record a chunk's progress, from `expected_next` to `next_offset` (a cancelled part's
        counts too: what it sent before it saw the cancel); whether the part is still running. A
        row that moved on meanwhile (its lease's next holder recorded first) is left as it is."""
        done = next_offset >= part.end_offset

        def advanced(p: ReplayPart) -> ReplayPart:
            running = p.state is ReplayState.RUNNING
            # next_offset moves on a cancelled part too, so an advance from where it was counts once
            return replace(p, next_offset=next_offset, matched=p.matched + matched,
                           delivered=p.delivered + delivered, failed=p.failed + failed,
                           state=ReplayState.DONE if running and done else p.state)

        changed = self._update(lambda p: (p.replay_id, p.partition, p.next_offset) == (part.replay_id,
                                                                                        part.partition, expected_next)
                               and p.state in (ReplayState.RUNNING, ReplayState.CANCELLED), advanced)
        return any(p.state is ReplayState.RUNNING for p in changed)

    def fail(self, replay_id: str, error: str) -> None:
        """The replay cannot go on (its predicate fails on a row, its topic was re-created): every part."""
        self._update(lambda p: p.replay_id == replay_id and p.state is ReplayState.RUNNING,
                     lambda p: replace(p, state=ReplayState.FAILED, error=error[:1000]))

    def _update(self, which: Callable[[ReplayPart], bool],
                how: Callable[[ReplayPart], ReplayPart]) -> list[ReplayPart]:
        """Change the parts `which` picks, as `how` says, in one commit; the changed parts as written."""
        now = datetime.now(UTC)

        def change(rows: Rows) -> tuple[Rows, list[ReplayPart]]:
            out, changed = [], []
            for row in _kept(rows, now):
                part = _from_row(row)
                if which(part):
                    part = replace(how(part), updated_at=now)
                    changed.append(part)
                out.append(_to_row(part))
            return out, changed

        return self._table.mutate(change)
