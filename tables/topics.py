"""Topic metadata: one row per topic in the `_system/topics` Delta table.

Each change rewrites the small table in one optimistic commit (tables/state_table.py), so
concurrent admins cannot undo each other, and the table's history is the audit log of
topic configuration.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import orjson
from deltalake import DeltaTable

from lakebroker.tables import delta, fencing, storage
from lakebroker.tables.errors import AlreadyExists, InvalidRequest, NoSuchPartition, NotFound
from lakebroker.tables.layout import Layout, validate_name
from lakebroker.tables.schemas import (
    KEY_COMPACTED_PROPERTY,
    LOST_OFFSETS_PROPERTY,
    TOPIC_PARTITION_COLUMNS,
    TOPIC_SCHEMA,
    TOPIC_SCHEMA_VERSION,
    TOPIC_TABLE_PROPERTIES,
    TOPICS_SCHEMA,
    TOPICS_SCHEMA_VERSION,
)
from lakebroker.tables.state_table import Rows, StateTable

log = logging.getLogger(__name__)
MAX_PARTITIONS = 1024
WEEK_MS = 7 * 24 * 3600 * 1000
DAY_MS = 24 * 3600 * 1000


class CleanupPolicy(StrEnum):
    DELETE = "delete"
    COMPACT = "compact"


@dataclass(frozen=True)
class TopicConfig:
    name: str
    topic_id: str
    partitions: int
    retention_ms: int | None = WEEK_MS  # Kafka's default; None keeps data forever
    retention_bytes: int | None = None  # per partition, as in Kafka
    cleanup_policy: CleanupPolicy = CleanupPolicy.DELETE
    max_message_bytes: int = 1024 * 1024
    tombstone_retention_ms: int = DAY_MS  # Kafka's delete.retention.ms
    created_at: datetime = datetime(1970, 1, 1, tzinfo=UTC)
    # Its table, relative to the table root. `topics/<name>` unless a deleted topic of the same name
    # had that location: a job that read the old table may still commit to it, so a new topic never
    # reuses it (TopicStore.create).
    location: str = ""

    def __post_init__(self) -> None:
        validate_name(self.name)
        if not self.location:
            object.__setattr__(self, "location", first_location(self.name))
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise InvalidRequest(f"partitions must be between 1 and {MAX_PARTITIONS}, got {self.partitions}")
        if self.retention_ms is not None and self.retention_ms <= 0:
            raise InvalidRequest("retention_ms must be positive, or null to keep data forever")
        if self.retention_bytes is not None and self.retention_bytes <= 0:
            raise InvalidRequest("retention_bytes must be positive, or null for no size limit")
        if not 1 <= self.max_message_bytes <= 64 * 1024 * 1024:
            raise InvalidRequest("max_message_bytes must be between 1 and 67108864")
        if self.tombstone_retention_ms < 0:
            raise InvalidRequest("tombstone_retention_ms must not be negative")

    def check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partitions:
            raise NoSuchPartition(
                f"partition {partition} is out of range for topic {self.name!r} "
                f"with {self.partitions} partitions (0-{self.partitions - 1})", partition, self.partitions
            )

    def public(self) -> dict[str, Any]:
        out = asdict(self)
        out["cleanup_policy"] = self.cleanup_policy.value
        out["created_at"] = self.created_at.isoformat()
        return out


def first_location(name: str) -> str:
    """Where a topic of this name is first created, relative to the table root (Layout.topic_table)."""
    return f"topics/{name}"


def new_topic(name: str, partitions: int, **config: Any) -> TopicConfig:
    if "cleanup_policy" in config and not isinstance(config["cleanup_policy"], CleanupPolicy):
        try:
            config["cleanup_policy"] = CleanupPolicy(config["cleanup_policy"])
        except ValueError:
            raise InvalidRequest("cleanup_policy must be 'delete' or 'compact'") from None
    return TopicConfig(
        name=name, topic_id=uuid.uuid4().hex, partitions=partitions, created_at=datetime.now(UTC), **config
    )


class TopicGone(NotFound):
    """A topic this node still serves was deleted (through another node, whose delete this one has
    not followed yet): nothing may write its table again."""


def ensure_topic_table(uri: str, *, key_compacted: bool = False) -> DeltaTable:
    """A topic's message table, created if missing, with TOPIC_TABLE_PROPERTIES set, and marked as
    one whose offsets may have holes when its topic is (or becomes) key-compacted."""
    properties = {**TOPIC_TABLE_PROPERTIES, **({KEY_COMPACTED_PROPERTY: "true"} if key_compacted else {})}
    return delta.ensure_table(uri, TOPIC_SCHEMA, partition_by=TOPIC_PARTITION_COLUMNS, version=TOPIC_SCHEMA_VERSION,
                              properties=properties)


def open_topic_table(uri: str) -> DeltaTable:
    """A topic's table as it is, never made: a broker's topic tables are made with their topics
    (TopicStore.create), so a missing one is a deleted topic's."""
    table = delta.open_table(uri)
    if table is None:
        raise TopicGone(f"there is no topic table at {uri}: its topic was deleted")
    return table


def mark_key_compacted(uri: str) -> DeltaTable | None:
    """Mark an existing topic table as one whose offsets may have holes (its topic is compact), if it
    is not yet: before key compaction can run on it, and on a table an older broker left unmarked.
    The table as it is then; None if there is no table."""
    table = delta.open_table(uri)
    if table is None or may_have_holes(table.metadata().configuration):
        return table
    return ensure_topic_table(uri, key_compacted=True)


def may_have_holes(configuration: dict[str, str]) -> bool:
    """Whether a topic table, by its own properties, may lack offsets anywhere below its log end:
    only key compaction removes rows and keeps offsets, and only on a table marked for it."""
    return configuration.get(KEY_COMPACTED_PROPERTY) == "true"


def committed_ends(layout: Layout, topics: Iterable[TopicConfig], *, mark: bool = False,
                   node: str | None = None,
                   table_ends: dict[tuple[bytes, int], int] | None = None) -> dict[tuple[bytes, int], int]:
    """Every partition's committed end, keyed (topic id, partition) as the WAL keys them. With
    `mark`, a compact topic's table is marked key-compacted first (the broker's start: a table an
    older broker left unmarked). With `node`, the end after that node's own newest commit
    (tables/fencing.py) where it has one: what of its WAL the table holds, whoever wrote since;
    `table_ends` then gets the table's own ends too."""
    ends: dict[tuple[bytes, int], int] = {}
    for topic in topics:
        uri = layout.topic_table(topic)
        table = mark_key_compacted(uri) if mark and topic.cleanup_policy is CleanupPolicy.COMPACT \
            else delta.open_table(uri)
        for p in range(topic.partitions):
            end = delta.committed_end(table, p)
            if table_ends is not None:
                table_ends[(bytes.fromhex(topic.topic_id), p)] = end
            if node is not None and table is not None:
                own = fencing.node_end(table, node, p)
                # Never committed to by this node: none of its WAL is in the table, unless no node
                # ever claimed the partition (a table written before ownership: its one writer's).
                end = own if own is not None else (0 if fencing.stored_epoch(table, p) else end)
            ends[(bytes.fromhex(topic.topic_id), p)] = end
    return ends


LostRanges = dict[int, tuple[tuple[int, int], ...]]  # partition -> (first, last) offsets, sorted


@dataclass(frozen=True)
class Holes:
    """Where a topic table may lack offsets below its log end, by its own properties: anywhere
    (key-compacted), or in the ranges an operator declared lost to WAL damage. Any other hole is
    damage to the table."""

    anywhere: bool = False
    lost: LostRanges = field(default_factory=dict)

    @classmethod
    def of(cls, configuration: dict[str, str]) -> Holes:
        raw = configuration.get(LOST_OFFSETS_PROPERTY)
        lost = {int(p): tuple((int(a), int(b)) for a, b in ranges)
                for p, ranges in orjson.loads(raw).items()} if raw else {}
        return cls(may_have_holes(configuration), lost)

    def past_lost(self, partition: int, offset: int) -> int:
        """The first offset at or after `offset` that is not in a lost range."""
        for first, last in self.lost.get(partition, ()):
            if first <= offset <= last:
                offset = last + 1
        return offset

    def lost_between(self, partition: int, start: int, end: int) -> list[tuple[int, int]]:
        """The lost ranges that meet [start, end), clipped to it."""
        return [(max(first, start), min(last, end - 1)) for first, last in self.lost.get(partition, ())
                if first < end and last >= start]


def with_lost(configuration: dict[str, str], partition: int, first: int, last: int) -> str:
    """The lost-offsets property's new value once [first, last] of `partition` is added."""
    raw = configuration.get(LOST_OFFSETS_PROPERTY)
    lost: dict[str, list[list[int]]] = orjson.loads(raw) if raw else {}
    ranges = lost.setdefault(str(partition), [])
    if [first, last] not in ranges:
        ranges.append([first, last])
        ranges.sort()
    return orjson.dumps(lost, option=orjson.OPT_SORT_KEYS).decode()


class TopicStore:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._table = StateTable(layout.topics_table, TOPICS_SCHEMA, TOPICS_SCHEMA_VERSION)

    def load(self) -> dict[str, TopicConfig]:
        return {r["name"]: _from_row(r) for r in self._table.read()}

    def topic_ids(self) -> set[str]:
        """The ids of the topics the store has now (a topic created again under a deleted one's
        name has an id of its own)."""
        return {r["topic_id"] for r in self._table.read()}

    def live_table(self, topic: TopicConfig) -> DeltaTable:
        """The topic's table, for a writer that may not have seen the topic deleted (a claim):
        TopicGone if the store no longer has it, else its table, made again if it is missing."""
        if topic.topic_id not in self.topic_ids():
            raise TopicGone(f"topic {topic.name!r} ({topic.topic_id}) was deleted")
        uri = self.layout.topic_table(topic)
        if delta.exists(uri):
            return delta.load(uri)
        return ensure_topic_table(uri, key_compacted=topic.cleanup_policy is CleanupPolicy.COMPACT)

    def remove_if_deleted(self, topic: TopicConfig) -> bool:
        """Remove a deleted topic's table again, with whatever a node that had not yet seen the
        delete wrote there after the delete removed it (a claim, a flush); whether it is deleted.
        Only on the store's word: a missing store proves nothing, and a location a live topic
        has (one an older version let a new topic reuse) stays."""
        if not delta.exists(self._table.uri):
            return False
        live = self.load().values()
        if any(t.topic_id == topic.topic_id or t.location == topic.location for t in live):
            return False
        storage.remove_tree(self.layout.topic_table(topic))
        return True

    def get(self, name: str) -> TopicConfig:
        validate_name(name)
        topic = self.load().get(name)
        if topic is None:
            raise NotFound(f"topic {name!r} does not exist")
        return topic

    def create(self, topic: TopicConfig) -> TopicConfig:
        if topic.name in self.load():
            raise AlreadyExists(f"topic {topic.name!r} already exists")
        topic = replace(topic, location=self._new_location(topic))
        ensure_topic_table(self.layout.topic_table(topic), key_compacted=topic.cleanup_policy is CleanupPolicy.COMPACT)

        def change(rows: Rows) -> tuple[Rows, TopicConfig]:
            if any(r["name"] == topic.name for r in rows):
                raise AlreadyExists(f"topic {topic.name!r} already exists")
            return sorted([*rows, _to_row(topic)], key=lambda r: r["name"]), topic

        return self._table.mutate(change)

    def update(self, name: str, **changes: Any) -> TopicConfig:
        if "cleanup_policy" in changes:
            try:
                changes["cleanup_policy"] = CleanupPolicy(changes["cleanup_policy"])
            except ValueError:
                raise InvalidRequest("cleanup_policy must be 'delete' or 'compact'") from None
            if changes["cleanup_policy"] is CleanupPolicy.COMPACT:  # marked before key compaction can see it
                mark_key_compacted(self.layout.topic_table(self.get(name)))

        def change(rows: Rows) -> tuple[Rows, TopicConfig]:
            current = _find(rows, name)
            if "partitions" in changes and changes["partitions"] < current.partitions:
                raise InvalidRequest(
                    f"partitions can only grow (topic {name!r} has {current.partitions}); "
                    "shrinking would strand committed messages"
                )
            updated = replace(current, **changes)
            return [_to_row(updated) if r["name"] == name else r for r in rows], updated

        return self._table.mutate(change)

    def _new_location(self, topic: TopicConfig) -> str:
        """`topics/<name>` if no table was ever there, else one of the topic's own (`~` is in no name).
        A Spark job that read a deleted topic's table may commit after the delete: into a new
        topic's table at the same place, its commit would land as the next version of another log
        (and leave a gap no reader gets past)."""
        first = self.layout.topic_table(topic.name)
        if storage.read_small(self.layout.retired_marker(topic.name)) is None and not delta.exists(first):
            return first_location(topic.name)
        return f"{first_location(topic.name)}~{topic.topic_id[:12]}"

    def delete(self, name: str) -> None:
        def change(rows: Rows) -> tuple[Rows, TopicConfig]:
            topic = _find(rows, name)
            return [r for r in rows if r["name"] != name], topic

        topic = self._table.mutate(change)
        if topic.location == first_location(name):  # retired before it is emptied, so no crash can free it
            storage.write_small(self.layout.retired_marker(name), topic.topic_id.encode())
        storage.remove_tree(self.layout.topic_table(topic))


def _find(rows: Rows, name: str) -> TopicConfig:
    for r in rows:
        if r["name"] == name:
            return _from_row(r)
    raise NotFound(f"topic {name!r} does not exist")


def _to_row(topic: TopicConfig) -> dict[str, Any]:
    row = asdict(topic)
    row["cleanup_policy"] = topic.cleanup_policy.value
    return row


def _from_row(row: dict[str, Any]) -> TopicConfig:
    row = dict(row)
    row["cleanup_policy"] = CleanupPolicy(row["cleanup_policy"])
    row["location"] = row.get("location") or ""  # a row from before locations: topics/<name>
    return TopicConfig(**row)
