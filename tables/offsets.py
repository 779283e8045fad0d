"""Consumer-group offsets: the `_system/consumer_offsets` Delta table.

Rows are appended, never updated: each commit adds one row per partition whose offset
moved, with the reason (ack, seek, retention-skip, reset, start). The offset is the *next*
offset to deliver, as in Kafka; the offsets-compaction job drops superseded rows.

Which row is a group's position (per group, topic and partition):
- only rows of the topic's current incarnation count (`topic_id`), so a topic deleted and
  created again under its name starts its groups afresh instead of mid-log;
- of those, the highest `epoch` wins, then the highest `seq`. The epoch is the writer's lease
  epoch (tables/leases.py), a fencing token: a worker whose lease passed on can still
  land a commit late, but never over its successor's. `seq` is commit order, taken from the
  table under optimistic concurrency, never from a wall clock.
- rows from before schema version 2 have neither: epoch 0, ordered by `committed_at` below
  every newer row, and counted for a topic only if written after the topic was created.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake

from lakebroker.tables import delta
from lakebroker.tables.conflicts import retry_conflicts
from lakebroker.tables.layout import Layout, validate_name
from lakebroker.tables.leases import lease_epochs
from lakebroker.tables.schemas import OFFSETS_SCHEMA, OFFSETS_SCHEMA_VERSION
from lakebroker.tables.topics import TopicConfig, TopicStore

GroupPartition = tuple[str, str, int]  # (group, topic, partition)


PULL_GROUP_PREFIX = "pull:"  # a pull consumer's or a Spark stream's group; a subscription's has none


def pull_group(name: str) -> str:
    """How a consumer group that is no subscription is stored: subscriptions and groups are named apart."""
    return PULL_GROUP_PREFIX + validate_name(name, "group")


def pull_group_lags(committed: Mapping[GroupPartition, tuple[int, str]], topics: Mapping[str, TopicConfig],
                    end: Callable[[TopicConfig, int], int]) -> list[dict[str, Any]]:
    """The groups that are no subscription (pull consumers, Spark streams), from their committed
    positions: per partition, the position, the partition's end (`end`) and the lag between them."""
    out = []
    for (stored, topic_name, partition), (offset, reason) in sorted(committed.items()):
        topic = topics.get(topic_name)
        if not stored.startswith(PULL_GROUP_PREFIX) or topic is None or partition >= topic.partitions:
            continue
        log_end = end(topic, partition)
        out.append({"group": stored.removeprefix(PULL_GROUP_PREFIX), "topic": topic_name, "partition": partition,
                    "committed_offset": offset, "high_watermark": log_end, "lag": max(0, log_end - offset),
                    "log_end_offset": log_end,  # deprecated: high_watermark
                    "reason": reason})
    return out


class OffsetReason(StrEnum):
    ACK = "ack"  # delivered or dead-lettered
    SEEK = "seek"  # moved by an operator
    RETENTION_SKIP = "retention-skip"  # retention deleted messages the group had not delivered
    START = "start"  # where a new group begins
    RESET = "reset"  # the group was past the log end (a restored or failed-over table): moved back to it


@dataclass(frozen=True)
class Fence:
    """Who commits: the topic incarnation the positions belong to, and the writer's lease epoch."""

    topic_id: str
    epoch: int


class Position(NamedTuple):
    group: str
    topic: str
    partition: int
    offset: int
    fence: Fence | None = None  # None: an administrative commit (see OffsetsTable.commit)


@dataclass(frozen=True)
class Committed:
    offset: int
    reason: str
    epoch: int


def _rank(row: Mapping[str, Any]) -> tuple[int, int, datetime]:
    return row["epoch"] or 0, -1 if row["seq"] is None else row["seq"], row["committed_at"]


class OffsetsTable:
    def __init__(self, layout: Layout) -> None:
        self.uri = layout.offsets_table
        self.layout = layout
        self._table = delta.KeptTable(self.uri, functools.partial(
            delta.ensure_table, self.uri, OFFSETS_SCHEMA, partition_by=None, version=OFFSETS_SCHEMA_VERSION))

    def _open(self) -> DeltaTable:
        return self._table.current()

    def commit(self, group: str, topic: str, offsets: Mapping[int, int], reason: OffsetReason, *,
               fence: Fence | None = None) -> None:
        """Commit positions. A worker passes its fence. Without one, the commit is administrative
        (a seek, a start, a retention skip, a pull group's ack): it belongs to the topic's current
        incarnation and takes the highest epoch known for the partition (its lease's, or its newest
        offset's). So a worker whose lease has passed on can never undo it, while the lease holder,
        and any later one, moves on from it by commit order or by a higher epoch."""
        self.commit_many([Position(group, topic, p, o, fence) for p, o in offsets.items()], reason)

    def commit_many(self, positions: Sequence[Position], reason: OffsetReason) -> None:
        """One commit for many positions: a worker commits all it owns at once.

        A retention skip only moves a position forward: judged on the snapshot it commits on, so a
        delivery commit that lands after retention read the positions is never undone by it."""
        if not positions:
            return
        ordered = sorted(positions, key=lambda p: p[:4])
        fences = [p.fence for p in ordered]
        if any(f is None for f in fences):
            fences = self._administrative(ordered)
        candidates = list(zip(ordered, fences, strict=True))

        def once() -> None:
            table = self._open()
            if reason is OffsetReason.RETENTION_SKIP:
                now = self.positions(table=table)
                wanted = [(p, f) for p, f in candidates if (c := now.get(p[:3])) is None or c.offset < p.offset]
                if not wanted:
                    return
            else:
                wanted = candidates
            ordered, fences = [p for p, _ in wanted], [f for _, f in wanted]
            # The row's seq is above every seq and version the snapshot holds; a concurrent commit
            # makes this one fail (no retry inside delta-rs), so seq follows commit order.
            seq = _next_seq(table)
            rows = pa.table(
                {
                    "group": [p.group for p in ordered],
                    "topic": [p.topic for p in ordered],
                    "partition": pa.array([p.partition for p in ordered], pa.int32()),
                    "offset": pa.array([p.offset for p in ordered], pa.int64()),
                    "committed_at": pa.array([datetime.now(UTC)] * len(ordered), pa.timestamp("us", tz="UTC")),
                    "reason": [reason.value] * len(ordered),
                    "topic_id": [f.topic_id if f else None for f in fences],
                    "epoch": pa.array([f.epoch if f else None for f in fences], pa.int64()),
                    "seq": pa.array([seq] * len(ordered), pa.int64()),
                },
                schema=OFFSETS_SCHEMA,
            )
            write_deltalake(table, rows, mode="append", commit_properties=CommitProperties(
                custom_metadata={"lakebroker.operation": f"offsets-{reason.value}"}, max_commit_retries=0),
                post_commithook_properties=delta.commit_hooks(table))

        retry_conflicts(once, what=f"committing offsets to {self.uri}", attempts=100, pause_s=0.005)

    def _administrative(self, positions: Sequence[Position]) -> list[Fence | None]:
        topics = TopicStore(self.layout).load()
        leases = lease_epochs(self.layout)
        current = self.positions(topics=topics)
        out: list[Fence | None] = []
        for p in positions:
            if p.fence is not None:
                out.append(p.fence)
                continue
            topic = topics.get(p.topic)
            known = current.get((p.group, p.topic, p.partition))
            epoch = max(leases.get((p.group, p.partition), 0), known.epoch if known else 0)
            out.append(None if topic is None else Fence(topic.topic_id, epoch))
        return out

    def positions(self, group: str | None = None, *, topics: Mapping[str, TopicConfig] | None = None,
                  table: DeltaTable | None = None) -> dict[GroupPartition, Committed]:
        """The current position, the reason it last moved and its epoch, per (group, topic, partition),
        in `table`'s snapshot (the newest when not given). `topics` is the current topic set (loaded
        when not given): rows of other incarnations are ignored."""
        table = self._open() if table is None else table
        if topics is None:
            topics = TopicStore(self.layout).load()
        flt = None if group is None else pc.field("group") == group
        rows = table.to_pyarrow_dataset().to_table(filter=flt) if flt is not None else table.to_pyarrow_table()
        best: dict[GroupPartition, dict[str, Any]] = {}
        for r in rows.to_pylist():
            topic = topics.get(r["topic"])
            if topic is not None and not _belongs(r, topic):
                continue  # a deleted namesake's position (or a legacy row older than the topic)
            key = (r["group"], r["topic"], r["partition"])
            seen = best.get(key)
            if seen is None or _rank(r) >= _rank(seen):
                best[key] = r
        return {k: Committed(r["offset"], r["reason"] or "", r["epoch"] or 0) for k, r in best.items()}

    def latest(self, group: str | None = None) -> dict[GroupPartition, tuple[int, str]]:
        """The current offset and the reason it last moved, per (group, topic, partition)."""
        return {k: (c.offset, c.reason) for k, c in self.positions(group).items()}

    def of_topic(self, group: str, topic: str) -> dict[int, int]:
        """The group's current offset per partition of `topic` that has one."""
        return {p: offset for (_, t, p), (offset, _) in self.latest(group).items() if t == topic}


def _belongs(row: Mapping[str, Any], topic: TopicConfig) -> bool:
    if row["topic_id"] is None:  # written before schema version 2
        return bool(row["committed_at"] >= topic.created_at)
    return bool(row["topic_id"] == topic.topic_id)


def _next_seq(table: DeltaTable) -> int:
    """Above the snapshot's version and every seq in it. The version alone would do on one table;
    the seqs keep the order when rows were copied from another table (a replica failed over to)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    highest = table.version()
    if "max.seq" in actions.column_names and actions.num_rows:
        top = pc.max(actions.column("max.seq")).as_py()
        if top is not None:
            highest = max(highest, int(top))
    return highest + 1
