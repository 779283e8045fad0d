"""Arrow schemas of every lakebroker table, defined once and versioned.

A table records its schema version in the table property `lakebroker.schemaVersion`, so a
later release can tell which layout it is reading and migrate it.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION_PROPERTY = "lakebroker.schemaVersion"

# Topic tables are written by delta-rs on the hot path. These properties keep off every
# table feature that delta-rs cannot write or its reader rejects (deletion vectors, row
# tracking, in-commit timestamps, clustering, domain metadata). Spark sessions also default
# them off (spark_pipeline/session.py), and tests/tables assert the protocol stays writable.
# (delta-rs refuses to even name rowTracking or inCommitTimestamps, so they stay unset.)
HOT_PATH_TABLE_PROPERTIES: dict[str, str] = {"delta.enableDeletionVectors": "false"}

FORBIDDEN_WRITER_FEATURES = frozenset(
    {"deletionVectors", "rowTracking", "inCommitTimestamp", "clustering", "domainMetadata"}
)

TOPIC_SCHEMA_VERSION = 1
TOPIC_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("key", pa.string()),
        pa.field("value", pa.binary()),  # null is a tombstone for compacted topics
        pa.field("format", pa.string(), nullable=False),  # json | text | binary
        pa.field("headers", pa.map_(pa.string(), pa.string())),
        pa.field("message_id", pa.string()),
        pa.field("producer_id", pa.string()),
        pa.field("sequence", pa.int64()),
    ]
)
TOPIC_PARTITION_COLUMNS = ["partition"]

TOPICS_SCHEMA_VERSION = 1
TOPICS_SCHEMA = pa.schema(
    [
        pa.field("name", pa.string(), nullable=False),
        pa.field("topic_id", pa.string(), nullable=False),
        pa.field("partitions", pa.int32(), nullable=False),
        pa.field("retention_ms", pa.int64()),
        pa.field("retention_bytes", pa.int64()),
        pa.field("cleanup_policy", pa.string(), nullable=False),
        pa.field("max_message_bytes", pa.int32(), nullable=False),
        pa.field("tombstone_retention_ms", pa.int64(), nullable=False),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

OFFSETS_SCHEMA_VERSION = 1
OFFSETS_SCHEMA = pa.schema(
    [
        pa.field("group", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),  # the next offset to deliver, as in Kafka
        pa.field("committed_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("reason", pa.string()),  # why it moved: ack, seek, retention skip
    ]
)

DEAD_LETTERS_SCHEMA_VERSION = 1
DEAD_LETTERS_SCHEMA = pa.schema(
    [
        pa.field("group", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("attempts", pa.int32(), nullable=False),
        pa.field("last_status", pa.int32()),
        pa.field("last_error", pa.string()),
        pa.field("dead_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
