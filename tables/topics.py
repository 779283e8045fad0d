"""Topic metadata: one row per topic in the `_system/topics` Delta table.

Only the process holding the data-dir lock writes it (see tables/lock.py); readers such as
`lakebroker topics list` or Spark jobs read it at any time. Each change rewrites the small
table in one commit, so its history is the audit log of topic configuration.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import pyarrow as pa

from tables import delta
from tables.errors import AlreadyExists, InvalidRequest, NotFound
from tables.layout import Layout, validate_name
from tables.schemas import (
    TOPIC_PARTITION_COLUMNS,
    TOPIC_SCHEMA,
    TOPIC_SCHEMA_VERSION,
    TOPICS_SCHEMA,
    TOPICS_SCHEMA_VERSION,
)

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

    def __post_init__(self) -> None:
        validate_name(self.name)
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
            raise InvalidRequest(
                f"partition {partition} is out of range for topic {self.name!r} "
                f"with {self.partitions} partitions (0-{self.partitions - 1})"
            )

    def public(self) -> dict[str, Any]:
        out = asdict(self)
        out["cleanup_policy"] = self.cleanup_policy.value
        out["created_at"] = self.created_at.isoformat()
        return out


def new_topic(name: str, partitions: int, **config: Any) -> TopicConfig:
    if "cleanup_policy" in config and not isinstance(config["cleanup_policy"], CleanupPolicy):
        try:
            config["cleanup_policy"] = CleanupPolicy(config["cleanup_policy"])
        except ValueError:
            raise InvalidRequest("cleanup_policy must be 'delete' or 'compact'") from None
    return TopicConfig(
        name=name, topic_id=uuid.uuid4().hex, partitions=partitions, created_at=datetime.now(UTC), **config
    )


class TopicStore:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def load(self) -> dict[str, TopicConfig]:
        table = delta.open_table(self.layout.topics_table)
        if table is None:
            return {}
        rows = table.to_pyarrow_table().to_pylist()
        return {r["name"]: _from_row(r) for r in rows}

    def get(self, name: str) -> TopicConfig:
        validate_name(name)
        topic = self.load().get(name)
        if topic is None:
            raise NotFound(f"topic {name!r} does not exist")
        return topic

    def create(self, topic: TopicConfig) -> TopicConfig:
        topics = self.load()
        if topic.name in topics:
            raise AlreadyExists(f"topic {topic.name!r} already exists")
        delta.ensure_table(
            self.layout.topic_table(topic.name),
            TOPIC_SCHEMA,
            partition_by=TOPIC_PARTITION_COLUMNS,
            version=TOPIC_SCHEMA_VERSION,
        )
        topics[topic.name] = topic
        self._save(topics)
        return topic

    def update(self, name: str, **changes: Any) -> TopicConfig:
        topics = self.load()
        if name not in topics:
            raise NotFound(f"topic {name!r} does not exist")
        current = topics[name]
        if "partitions" in changes and changes["partitions"] < current.partitions:
            raise InvalidRequest(
                f"partitions can only grow (topic {name!r} has {current.partitions}); "
                "shrinking would strand committed messages"
            )
        if "cleanup_policy" in changes:
            try:
                changes["cleanup_policy"] = CleanupPolicy(changes["cleanup_policy"])
            except ValueError:
                raise InvalidRequest("cleanup_policy must be 'delete' or 'compact'") from None
        topics[name] = replace(current, **changes)
        self._save(topics)
        return topics[name]

    def delete(self, name: str) -> None:
        topics = self.load()
        if name not in topics:
            raise NotFound(f"topic {name!r} does not exist")
        del topics[name]
        self._save(topics)
        shutil.rmtree(self.layout.topic_table(name), ignore_errors=True)

    def _save(self, topics: dict[str, TopicConfig]) -> None:
        table = delta.ensure_table(
            self.layout.topics_table, TOPICS_SCHEMA, partition_by=None, version=TOPICS_SCHEMA_VERSION
        )
        rows = [_to_row(t) for t in sorted(topics.values(), key=lambda t: t.name)]
        delta.overwrite(table, pa.Table.from_pylist(rows, schema=TOPICS_SCHEMA))


def _to_row(topic: TopicConfig) -> dict[str, Any]:
    row = asdict(topic)
    row["cleanup_policy"] = topic.cleanup_policy.value
    return row


def _from_row(row: dict[str, Any]) -> TopicConfig:
    row = dict(row)
    row["cleanup_policy"] = CleanupPolicy(row["cleanup_policy"])
    return TopicConfig(**row)
