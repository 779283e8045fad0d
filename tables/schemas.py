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
# A checkpoint every 10 commits, Delta's own default (delta-rs's is 100). delta-rs builds each
# checkpoint by replaying the log from the previous one, reading every commit file since on a
# blocking thread of its own: at 100, serve grew ~80 threads at each checkpoint of a busy topic
# (tokio keeps them while any gets work), and held their memory. A fresh load of the table
# (tables/delta.py KeptTable, Follower, readers) reads fewer commit files too.
TOPIC_TABLE_PROPERTIES: dict[str, str] = {"delta.checkpointInterval": "10"}
# "true" on a topic table whose topic is or ever was cleanup_policy=compact: key compaction may have
# removed rows, so a hole between offsets is legitimate there. Set before any key compaction can run
# and never unset, so a reader decides from the snapshot it reads, not from a topic config it loaded.
KEY_COMPACTED_PROPERTY = "lakebroker.keyCompacted"
# JSON {"<partition>": [[first, last], ...]} on a topic table: offsets an operator declared lost to
# WAL damage (`lakebroker wal skip`). Set in the same commit that moves the partition's log end
# past them, so a reader of any snapshot knows those holes are the recorded loss, not damage.
LOST_OFFSETS_PROPERTY = "lakebroker.lostOffsets"

TOPICS_SCHEMA_VERSION = 2  # 2: location
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
        pa.field("location", pa.string()),  # the table, relative to the table root; null: topics/<name>
    ]
)

TOKENS_SCHEMA_VERSION = 1
TOKENS_SCHEMA = pa.schema(
    [
        pa.field("token_id", pa.string(), nullable=False),  # public half of `lbk_<id>_<secret>`
        pa.field("name", pa.string()),
        pa.field("scopes", pa.list_(pa.string()), nullable=False),
        pa.field("topics", pa.list_(pa.string())),  # null: every topic; `name*` is a prefix
        pa.field("secret_hash", pa.string(), nullable=False),  # "sha256:<hex>"; the secret is never stored
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("expires_at", pa.timestamp("us", tz="UTC")),
        pa.field("revoked_at", pa.timestamp("us", tz="UTC")),  # revoked rows stay, as the audit trail
    ]
)

# Version 2 added topic_id, epoch and seq (null in rows written before; see tables/offsets.py).
OFFSETS_SCHEMA_VERSION = 2
OFFSETS_SCHEMA = pa.schema(
    [
        pa.field("group", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),  # the next offset to deliver, as in Kafka
        pa.field("committed_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("reason", pa.string()),  # why it moved: ack, seek, retention skip
        pa.field("topic_id", pa.string()),  # the topic incarnation the position belongs to
        pa.field("epoch", pa.int64()),  # the writer's lease epoch (fencing token)
        pa.field("seq", pa.int64()),  # commit order: above every row committed before it
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
        pa.field("last_status", pa.int32()),  # HTTP status of the last attempt; null for a timeout
        pa.field("last_error", pa.string()),
        pa.field("dead_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("replay_requested_at", pa.timestamp("us", tz="UTC")),
        pa.field("replayed_at", pa.timestamp("us", tz="UTC")),
    ]
)

# 2: filter; 3: breaker_failures, breaker_cooldown_ms; 4: disable_after_ms, failing_since;
# 5: breaker_failure_ratio, breaker_window_ms, breaker_min_requests
SUBSCRIPTIONS_SCHEMA_VERSION = 5
SUBSCRIPTIONS_SCHEMA = pa.schema(
    [
        pa.field("name", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("url", pa.string(), nullable=False),
        pa.field("ordering", pa.string(), nullable=False),  # partition | key | none
        pa.field("max_in_flight", pa.int32(), nullable=False),
        pa.field("rate_limit_per_s", pa.float64()),  # null: no limit
        pa.field("max_attempts", pa.int32(), nullable=False),
        pa.field("retry_schedule_ms", pa.list_(pa.int64()), nullable=False),
        pa.field("timeout_ms", pa.int64(), nullable=False),
        pa.field("batch_size", pa.int32(), nullable=False),
        pa.field("secrets", pa.list_(pa.string()), nullable=False),  # newest first; all sign during rotation
        pa.field("paused", pa.bool_(), nullable=False),
        pa.field("disabled_reason", pa.string()),  # set when the endpoint answered 410 Gone
        pa.field("seek_epoch", pa.int64(), nullable=False),
        pa.field("seek_offsets", pa.map_(pa.int32(), pa.int64())),  # newest seek targets; at creation, the start
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("filter", pa.string()),  # null: every message (tables/filters.py)
        pa.field("breaker_failures", pa.int32()),  # null in rows older than the column: the default
        pa.field("breaker_cooldown_ms", pa.int64()),
        pa.field("disable_after_ms", pa.int64()),  # null in older rows: the default
        pa.field("failing_since", pa.timestamp("us", tz="UTC")),  # when a worker's circuit to the endpoint opened
        pa.field("breaker_failure_ratio", pa.float64()),  # null: the circuit opens on runs only
        pa.field("breaker_window_ms", pa.int64()),  # null in older rows: the default
        pa.field("breaker_min_requests", pa.int32()),
    ]
)

# State tables (topics, subscriptions, tokens, leases) are rewritten whole at each change, and the
# lease table at every heartbeat of every worker: left alone, its log and its replaced data files
# grow by tens of thousands a day. No one reads an old version of a state table, so its log is
# kept an hour (delta-rs drops older commit files after each checkpoint, every 100 commits) and
# StateTable vacuums replaced files after an hour.
STATE_TABLE_PROPERTIES: dict[str, str] = {
    "delta.logRetentionDuration": "interval 1 hour",
    "delta.deletedFileRetentionDuration": "interval 1 hour",
    "delta.checkpointInterval": "100",
}

# Written by tables/replays.py: one row per replay of a subscription and partition of its topic.
REPLAYS_SCHEMA_VERSION = 1
REPLAYS_SCHEMA = pa.schema(
    [
        pa.field("replay_id", pa.string(), nullable=False),
        pa.field("subscription", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("topic_id", pa.string(), nullable=False),  # a topic re-created since ends the replay
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("predicate", pa.string()),  # the SQL predicate (tables/predicates.py); null: every message
        pa.field("since", pa.timestamp("us", tz="UTC")),
        pa.field("until", pa.timestamp("us", tz="UTC")),
        pa.field("start_offset", pa.int64(), nullable=False),  # the scan's range: [start_offset, end_offset),
        pa.field("end_offset", pa.int64(), nullable=False),  # end_offset the committed end when it was asked
        pa.field("next_offset", pa.int64(), nullable=False),  # scanned and sent below this
        pa.field("matched", pa.int64(), nullable=False),
        pa.field("delivered", pa.int64(), nullable=False),
        pa.field("failed", pa.int64(), nullable=False),
        pa.field("state", pa.string(), nullable=False),  # running | done | cancelled | failed
        pa.field("error", pa.string()),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("updated_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

# Written by tables/job_slots.py: which process runs a scheduled job, and when it last started one.
JOB_SLOTS_SCHEMA_VERSION = 1
JOB_SLOTS_SCHEMA = pa.schema(
    [
        pa.field("job", pa.string(), nullable=False),
        pa.field("runner", pa.string(), nullable=False),  # host:pid of the scheduler that started the run
        pa.field("started_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("expires_at", pa.timestamp("us", tz="UTC"), nullable=False),  # the run's lease: ends as it finishes
    ]
)

# Written by tables/ownership.py: which ingest node owns which topic partition.
OWNERS_SCHEMA_VERSION = 2  # 2: the node rows' Kafka listener address
OWNERS_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),  # node | partition | pin
        pa.field("node", pa.string()),  # the node's id; a partition's owner (null once released); a pin's node
        pa.field("url", pa.string()),  # node rows: the advertised URL other nodes and clients use
        pa.field("kafka", pa.string()),  # node rows: its Kafka listener's advertised host:port (null: none)
        pa.field("topic_id", pa.string(), nullable=False),  # "" on node rows
        pa.field("topic", pa.string(), nullable=False),  # "" on node rows
        pa.field("partition", pa.int32(), nullable=False),  # -1 on node rows
        pa.field("epoch", pa.int64(), nullable=False),  # bumped at each change of owner; 0 on node rows
        pa.field("since", pa.timestamp("us", tz="UTC"), nullable=False),  # node: started; partition: taken
        pa.field("expires_at", pa.timestamp("us", tz="UTC"), nullable=False),  # the heartbeat's lease
    ]
)

LEASES_SCHEMA_VERSION = 1
LEASES_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),  # member | lease
        pa.field("group", pa.string(), nullable=False),  # "" for member rows
        pa.field("partition", pa.int32(), nullable=False),  # -1 for member rows
        pa.field("owner", pa.string()),  # worker id; null once released
        pa.field("epoch", pa.int64(), nullable=False),  # bumped at each change of owner
        pa.field("expires_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("seek_epoch", pa.int64(), nullable=False),  # newest seek applied to this partition
        pa.field("status", pa.string()),  # JSON status the owner reports: in-flight, last error, state
    ]
)

# Written by tables/job_runs.py: one row per maintenance-job run and table.
JOB_RUNS_SCHEMA_VERSION = 1
JOB_RUNS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("job", pa.string(), nullable=False),  # compaction | retention | key-compaction | ...
        pa.field("target", pa.string(), nullable=False),  # topic name, "_system/<table>", or "" for the run
        pa.field("topic", pa.string()),  # the topic, when the target is one
        pa.field("trigger", pa.string(), nullable=False),  # cli | scheduler | airflow | spark-submit | library
        pa.field("started_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("duration_ms", pa.int64(), nullable=False),
        pa.field("outcome", pa.string(), nullable=False),  # ok | failed | skipped
        pa.field("files_before", pa.int64()),
        pa.field("files_after", pa.int64()),
        pa.field("rows_removed", pa.int64()),
        pa.field("bytes_before", pa.int64()),
        pa.field("bytes_after", pa.int64()),
        pa.field("error", pa.string()),
        pa.field("details", pa.string()),  # JSON: per-job figures (bins, log starts, lag, skips, ...)
    ]
)

# Offsets lost to WAL damage and skipped by an operator (tables/lost_offsets.py).
LOST_OFFSETS_SCHEMA_VERSION = 1
LOST_OFFSETS_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("topic_id", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("first_offset", pa.int64(), nullable=False),
        pa.field("last_offset", pa.int64(), nullable=False),  # inclusive
        pa.field("wal_damage", pa.string(), nullable=False),  # the corrupt spans found at recovery
        pa.field("skipped_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("skipped_by", pa.string(), nullable=False),  # the token (name) or "cli"
    ]
)

# Written by the retention job: a consumer group moved past messages it had not delivered.
RETENTION_SKIPS_SCHEMA_VERSION = 1
RETENTION_SKIPS_SCHEMA = pa.schema(
    [
        pa.field("group", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("from_offset", pa.int64(), nullable=False),  # the group's committed offset before the skip
        pa.field("to_offset", pa.int64(), nullable=False),  # the new log-start offset it was moved to
        pa.field("skipped_messages", pa.int64(), nullable=False),
        pa.field("skipped_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
    ]
)
