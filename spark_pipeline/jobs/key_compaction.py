"""Key compaction for `cleanup_policy=compact` topics: keep only the latest value per key.

Rules (Kafka's log cleaner, per partition):

* a row is removed when a *later* row of the same partition has the same key;
* a tombstone (null value) that is the latest row of its key is removed once it is older than the
  topic's `tombstone_retention_ms` (Kafka's delete.retention.ms, measured here from the
  tombstone's own timestamp), so consumers that read slower than that still see the delete;
* rows younger than `key_compaction_min_lag_ms` are never touched (Kafka's min.compaction.lag.ms
  and its never-compacted active segment): the tail of every partition stays exactly as produced,
  including the newest row, so a consumer reading near the end never loses a row under its feet;
* rows with a null key are kept (they cannot be compacted; Kafka refuses them on compact topics).

Kept rows keep their offsets (the files are rewritten, the rows are not renumbered), so a
partition has holes, which readers skip on a table marked `lakebroker.keyCompacted` (set when the
topic became compact, and here before compacting a table an older broker left unmarked). A file
whose rows all go is removed whole; the other affected files are rewritten without the removed
rows, adjacent ones merged into files of about `compaction_target_file_bytes`, so offset ranges
stay disjoint and ascending. One commit per topic; the flusher's concurrent appends never conflict
with it. Topics with the default `cleanup_policy=delete` are refused by name and skipped otherwise.
The retention job VACUUMs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from lakebroker.spark_pipeline.delta_txn import DeltaTxn, table_exists, with_retries
from lakebroker.spark_pipeline.jobs.common import (
    CONFLICT_ATTEMPTS,
    job_tags,
    remove_rows,
    select_topics,
    table_stats,
    topic_job_main,
)
from lakebroker.spark_pipeline.results import Run
from lakebroker.tables.errors import InvalidRequest
from lakebroker.tables.job_runs import JobName, JobResult, Outcome, TableResult
from lakebroker.tables.layout import Layout
from lakebroker.tables.logs import exit_without_teardown
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import CleanupPolicy, TopicConfig, mark_key_compacted

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def compact_topics(layout: Layout, topic: str | None) -> list[TopicConfig]:
    topics = select_topics(layout, topic)
    if topic is not None and topics[0].cleanup_policy is not CleanupPolicy.COMPACT:
        raise InvalidRequest(f"topic {topic!r} has cleanup_policy=delete; key compaction applies to "
                             "cleanup_policy=compact topics")
    return [t for t in topics if t.cleanup_policy is CleanupPolicy.COMPACT]


def run(spark: SparkSession, settings: Settings, topic: str | None = None, *, trigger: str = "library",
        now: datetime | None = None) -> JobResult:
    layout = Layout.of(settings, for_spark=True)
    topics = compact_topics(layout, topic)
    tables = Layout.of(settings)  # delta-rs's URIs
    for t in topics:  # a table compacted before it was marked (an older broker's) is marked here first
        mark_key_compacted(tables.topic_table(t))
    job = Run(JobName.KEY_COMPACTION, trigger)
    now_us = int((now or datetime.now(UTC)).timestamp() * 1_000_000)
    for t in topics:
        job.table(t.name, t.name, partial(compact_keys, spark, layout.topic_table(t), t, now_us=now_us,
                                          min_lag_ms=settings.key_compaction_min_lag_ms,
                                          target_bytes=settings.compaction_target_file_bytes,
                                          run_id=job.result.run_id))
    return job.finish()


def compact_keys(spark: SparkSession, uri: str, topic: TopicConfig, result: TableResult, *, now_us: int,
                 min_lag_ms: int, target_bytes: int, run_id: str) -> None:
    if not table_exists(spark, uri):
        result.outcome = Outcome.SKIPPED
        result.details["reason"] = "no table yet"
        return
    result.files_before, result.bytes_before = table_stats(uri)
    outcome = with_retries(f"key compaction of {topic.name}", CONFLICT_ATTEMPTS, lambda: _compact_once(
        spark, uri, topic, now_us=now_us, min_lag_ms=min_lag_ms, target_bytes=target_bytes, run_id=run_id))
    result.rows_removed = outcome["rows_removed"]
    result.details.update(outcome)
    result.files_after, result.bytes_after = table_stats(uri)


def doomed_rows(frame: DataFrame, *, lag_cutoff_us: int, tombstone_cutoff_us: int) -> DataFrame:
    """(partition, offset, tombstone) of every row key compaction removes (see the module doc)."""
    from pyspark.sql import functions as F

    rows = frame.select("partition", "offset", "key", "timestamp", F.col("value").isNull().alias("tombstone"))
    latest = rows.where(F.col("key").isNotNull()).groupBy("partition", "key").agg(F.max("offset").alias("latest"))
    old_enough = F.col("timestamp") < F.timestamp_micros(F.lit(lag_cutoff_us))
    superseded = F.col("offset") < F.col("latest")
    expired_tombstone = (F.col("tombstone") & (F.col("offset") == F.col("latest"))
                         & (F.col("timestamp") < F.timestamp_micros(F.lit(tombstone_cutoff_us))))
    return (rows.join(latest, ["partition", "key"]).where(old_enough & (superseded | expired_tombstone))
            .select("partition", "offset", "tombstone"))


def _compact_once(spark: SparkSession, uri: str, topic: TopicConfig, *, now_us: int, min_lag_ms: int,
                  target_bytes: int, run_id: str) -> dict[str, Any]:
    from pyspark import StorageLevel

    txn = DeltaTxn(spark, uri)
    listed = [f for f in txn.files() if f.partition is not None and f.min_offset is not None]
    summary: dict[str, Any] = {"rows_removed": 0, "tombstones_removed": 0, "files_dropped_whole": 0,
                               "files_rewritten": 0, "commit_version": None, "min_lag_ms": min_lag_ms,
                               "tombstone_retention_ms": topic.tombstone_retention_ms}
    if not listed:
        return summary
    lag_cutoff_us = now_us - min_lag_ms * 1000
    doomed = doomed_rows(txn.read(listed), lag_cutoff_us=lag_cutoff_us,
                         tombstone_cutoff_us=now_us - topic.tombstone_retention_ms * 1000)
    doomed = doomed.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        removal = remove_rows(txn, listed, doomed, target_bytes=target_bytes)
        if not removal.rows_removed:
            return summary
        summary.update({"rows_removed": removal.rows_removed, "tombstones_removed": removal.tombstones_removed,
                        "files_dropped_whole": removal.files_dropped_whole,
                        "files_rewritten": removal.files_rewritten})
        summary["commit_version"] = txn.commit(
            removal.actions, txn.delete_op([f"timestamp < timestamp_micros({lag_cutoff_us})"]),
            tags=job_tags(JobName.KEY_COMPACTION, run_id),
            metrics={"numDeletedRows": removal.rows_removed, "numCopiedRows": removal.rows_copied})
        return summary
    finally:
        doomed.unpersist()


def main(argv: list[str] | None = None) -> int:
    return topic_job_main(JobName.KEY_COMPACTION, "Keep the latest value per key of cleanup_policy=compact topics.",
                          run, argv, select=compact_topics, every="every compact topic")

if __name__ == "__main__":
    exit_without_teardown(main())  # not sys.exit: Arrow can abort in the teardown (tables/logs.py)
