"""Retention: Kafka's `retention.ms` / `retention.bytes`, per partition, on topic tables.

How it decides (spark_pipeline/plans.py): in offset order, a partition's oldest file goes while its
newest row is older than `retention_ms`, or while the partition would still hold `retention_bytes`
without it, exactly as Kafka deletes whole segments. Those files are removed whole: the commit only
`remove`s them (no data file is read or rewritten), so retention costs the same for a 10 GB
partition as for a 10 kB one. The file straddling the time cutoff is kept whole unless
`retention_trim_partial_files` is on, in which case it is rewritten without its expired rows.
Like Kafka, `retention_ms` is thus a lower bound: a row can outlive it by at most its file's span.

Then, per partition, the log-start offset (tables/log_start.py: lowest offset still in the table,
or the log end when retention emptied it, judged on the snapshot of the removal commit, so rows
the flusher commits meanwhile are never counted as removed) moves forward, and every consumer
group whose committed offset is now below it is moved to it: an `OffsetReason.RETENTION_SKIP` offsets row, plus a row in
`_system/retention_skips` first (so a crash in between repeats the record rather than losing
it). `lakebroker.tables.retention_skips` reads them; Prometheus and the subscription's status show them.

Topics with `cleanup_policy=compact` keep their data (key compaction is their retention).
Every topic table is then VACUUMed with `vacuum_retention_hours`. With no topic given, the job
also trims `_system/job_runs` and `_system/retention_skips` to `job_runs_retention_days`.

The removal commit registers only the files it removes, so the flusher's appends never conflict
with it; a concurrent compaction that rewrote the same files does, and the partition is re-planned.
The other way round is not free: delta-rs refuses an append whose snapshot a concurrent removal
changed ("a concurrent transaction deleted data"). The flusher keeps those records pending and
commits them on its next attempt, so nothing is lost; each refusal counts in
`lakebroker_flush_errors_total` (tests/spark_pipeline/test_retention.py races the two).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from lakebroker.spark_pipeline.delta_txn import DeltaTxn, table_exists, with_retries
from lakebroker.spark_pipeline.jobs.common import (
    CONFLICT_ATTEMPTS,
    job_tags,
    rewrite_bin,
    select_topics,
    table_stats,
    topic_job_main,
    vacuum,
)
from lakebroker.spark_pipeline.plans import FileEntry, PartitionRetention, by_partition, plan_log_start, plan_retention
from lakebroker.spark_pipeline.results import Progress, Run
from lakebroker.tables import delta
from lakebroker.tables.job_runs import JobName, JobResult, Outcome, TableResult
from lakebroker.tables.layout import Layout
from lakebroker.tables.log_start import log_starts
from lakebroker.tables.logs import exit_without_teardown
from lakebroker.tables.offsets import OffsetReason, OffsetsTable
from lakebroker.tables.retention_skips import RetentionSkip, record_skips
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import CleanupPolicy, TopicConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def run(spark: SparkSession, settings: Settings, topic: str | None = None, *, trigger: str = "library",
        now: datetime | None = None, progress: Progress | None = None) -> JobResult:
    """Apply retention to one topic or every topic; `now` is for tests and replays."""
    layout = Layout.of(settings, for_spark=True)
    topics = select_topics(layout, topic)
    job = Run(JobName.RETENTION, trigger, progress=progress)
    job.expect(len(topics) + (2 if topic is None else 0))
    now_us = int((now or datetime.now(UTC)).timestamp() * 1_000_000)
    for t in topics:
        job.table(t.name, t.name, partial(apply_topic_retention, spark, layout, t, settings,
                                          run_id=job.result.run_id, now_us=now_us))
    if topic is None:
        cutoff_us = now_us - settings.job_runs_retention_days * 86_400_000_000
        for uri, column in ((layout.job_runs_table, "started_at"), (layout.retention_skips_table, "skipped_at")):
            target = "_system/" + uri.rstrip("/").rsplit("/", 1)[-1]
            job.table(target, None, partial(trim_history, spark, uri, column=column, cutoff_us=cutoff_us,
                                            run_id=job.result.run_id))
    return job.finish()


# -- topics ---------------------------------------------------------------------------------------
def apply_topic_retention(spark: SparkSession, layout: Layout, topic: TopicConfig, settings: Settings,
                          result: TableResult, *, run_id: str, now_us: int) -> None:
    uri = layout.topic_table(topic)
    if not table_exists(spark, uri):
        result.outcome = Outcome.SKIPPED
        result.details["reason"] = "no table yet"
        return
    result.files_before, result.bytes_before = table_stats(uri)
    if topic.cleanup_policy is CleanupPolicy.COMPACT:
        result.details["reason"] = "cleanup_policy=compact: key compaction is this topic's retention"
        result.rows_removed = 0
    else:
        policy = {"retention_ms": topic.retention_ms, "retention_bytes": topic.retention_bytes}
        result.details["policy"] = policy

        def plan(files: list[FileEntry], partition: int) -> PartitionRetention:
            return plan_retention(partition, files, now_us=now_us, retention_ms=topic.retention_ms,
                                  retention_bytes=topic.retention_bytes,
                                  trim_partial=settings.retention_trim_partial_files)

        cutoff_us = None if topic.retention_ms is None else now_us - topic.retention_ms * 1000
        applied = with_retries(f"retention of {topic.name}", CONFLICT_ATTEMPTS,
                               lambda: remove_prefixes(spark, uri, topic.partitions, plan, run_id=run_id,
                                                       trim_before_us=cutoff_us))
        result.rows_removed = applied.rows_removed
        result.details.update(applied.details())
        skips = forward_lagging_groups(layout, topic, _log_starts_after(uri, applied, topic.partitions),
                                       run_id=run_id)
        result.details["groups_skipped"] = [
            {"group": s.group, "partition": s.partition, "from": s.from_offset, "to": s.to_offset,
             "skipped": s.skipped_messages} for s in skips]
    vacuum(spark, uri, settings.vacuum_retention_hours)
    result.details["vacuum_retention_hours"] = settings.vacuum_retention_hours
    result.files_after, result.bytes_after = table_stats(uri)


class Applied:
    """What one retention commit did, per partition."""

    def __init__(self) -> None:
        self.plans: dict[int, PartitionRetention] = {}
        self.trimmed_to: dict[int, int] = {}  # partition -> first offset kept in the trimmed file
        self.trimmed_rows = 0
        self.version: int | None = None

    @property
    def rows_removed(self) -> int:
        return sum(p.rows_dropped for p in self.plans.values()) + self.trimmed_rows

    def details(self) -> dict[str, Any]:
        return {
            "files_dropped_whole": sum(len(p.drop) for p in self.plans.values()),
            "files_rewritten": len(self.trimmed_to),
            "rows_trimmed": self.trimmed_rows,
            "commit_version": self.version,
            "partitions": {str(p): {"reason": plan.reason, "files_dropped": len(plan.drop),
                                    "rows_dropped": plan.rows_dropped, "bytes_dropped": plan.bytes_dropped}
                           for p, plan in sorted(self.plans.items()) if plan.drop or p in self.trimmed_to},
        }


PlanFn = Callable[[list[FileEntry], int], PartitionRetention]


def remove_prefixes(spark: SparkSession, uri: str, partitions: int, plan: PlanFn, *, run_id: str,
                    trim_before_us: int | None = None, trim_to: dict[int, int] | None = None,
                    job: JobName = JobName.RETENTION) -> Applied:
    """One commit that removes each partition's planned prefix of whole files (and trims the
    straddling file when the plan says so); `trim_to[p]` trims to an offset, `trim_before_us`
    to a time. Partitions of a partition-less snapshot count as empty."""
    from pyspark.sql import functions as F

    txn = DeltaTxn(spark, uri)
    files = by_partition(txn.files())
    applied = Applied()
    actions: list[Any] = []
    predicates: list[str] = []
    copied: list[int] = []
    for partition in range(partitions):
        plan_ = plan(files.get(partition, []), partition)
        applied.plans[partition] = plan_
        if plan_.drop:
            actions += txn.removes(list(plan_.drop), data_change=True)
            first_kept = plan_.log_start(2**62)
            predicates.append(f"(partition = {partition} AND offset < {first_kept})")
        if plan_.trim is None:
            continue
        straddling = plan_.trim
        frame = txn.read([straddling])
        if trim_to is not None:
            first = trim_to[partition]
        else:
            assert trim_before_us is not None
            # The first offset at or after the cutoff; rows before it go (a prefix, so no hole).
            cutoff = F.timestamp_micros(F.lit(trim_before_us))
            found = frame.where(F.col("timestamp") >= cutoff).agg(F.min("offset")).collect()[0][0]
            first = (straddling.max_offset or 0) + 1 if found is None else int(found)
        applied.trimmed_to[partition] = first

        def keep(frame: DataFrame, first: int = first) -> DataFrame:
            return frame.where(F.col("offset") >= first)

        adds, removes = rewrite_bin(txn, [straddling], "offset", data_change=True, keep=keep)
        kept_rows = sum(f.rows or 0 for f in txn.added_files(adds))
        copied.append(kept_rows)
        applied.trimmed_rows += (straddling.rows or 0) - kept_rows
        actions += adds + removes
        predicates.append(f"(partition = {partition} AND offset < {first})")
    if actions:
        applied.version = txn.commit(actions, txn.delete_op([" OR ".join(predicates)]), tags=job_tags(job, run_id),
                                     metrics={"numDeletedRows": applied.rows_removed,
                                              "numCopiedRows": sum(txn_rows for txn_rows in copied)})
    return applied


def _log_starts_after(uri: str, applied: Applied, partitions: int) -> dict[int, int]:
    """Each partition's log start in the snapshot of this run's removal commit (the newest one when
    it removed nothing), files and log end together: groups move only past what was removed.
    (A log end read later would count rows the flusher committed meanwhile as removed.) Read with
    delta-rs, outside any Spark transaction, so it cannot make a job conflict with the flusher."""
    table = delta.load(uri, applied.version)
    return log_starts(table, partitions)


def forward_lagging_groups(layout: Layout, topic: TopicConfig, log_starts: dict[int, int], *,
                           run_id: str) -> list[RetentionSkip]:
    """Move every group whose committed offset fell below a partition's log start up to it.

    Idempotent: it compares the current state, so a run after a crash finishes the job.
    """
    offsets = OffsetsTable(layout)
    if delta.open_table(offsets.uri) is None:
        return []
    now = datetime.now(UTC)
    skips: list[RetentionSkip] = []
    for (group, name, partition), (offset, _reason) in sorted(offsets.latest().items()):
        start = log_starts.get(partition)
        if name == topic.name and start is not None and offset < start:
            skips.append(RetentionSkip(group, name, partition, offset, start, now, run_id))
    if not skips:
        return []
    record_skips(layout, skips)  # first: a crash after this repeats the record, never loses it
    by_group: dict[str, dict[int, int]] = {}
    for s in skips:
        by_group.setdefault(s.group, {})[s.partition] = s.to_offset
    for group, moved in sorted(by_group.items()):
        offsets.commit(group, topic.name, moved, OffsetReason.RETENTION_SKIP)
    return skips


# -- system tables ----------------------------------------------------------------------------------
def trim_history(spark: SparkSession, uri: str, result: TableResult, *, column: str, cutoff_us: int,
                 run_id: str) -> None:
    """Remove whole files of a history table whose newest row is older than the cutoff."""
    if not table_exists(spark, uri):
        result.outcome = Outcome.SKIPPED
        return
    result.files_before, result.bytes_before = table_stats(uri)

    def once() -> int:
        txn = DeltaTxn(spark, uri)
        expired = [f for f in txn.files() if (f.max_time_us(column) or 2**62) < cutoff_us]
        if not expired:
            return 0
        removes = txn.removes(expired, data_change=True)
        rows = sum(f.rows or 0 for f in expired)
        txn.commit(removes, txn.delete_op([f"{column} < timestamp_micros({cutoff_us})"]),
                   tags=job_tags(JobName.RETENTION, run_id), metrics={"numDeletedRows": rows})
        return rows

    result.rows_removed = with_retries(f"retention of {uri}", CONFLICT_ATTEMPTS, once)
    result.files_after, result.bytes_after = table_stats(uri)


# -- replicas ---------------------------------------------------------------------------------------
def follow_log_starts(spark: SparkSession, uri: str, partitions: int, log_starts: dict[int, int], *,
                      run_id: str) -> Applied:
    """Advance a replica's partitions to the primary's log-start offsets (whole files, plus a trim
    of the one straddling file, so the replica holds exactly the primary's offset range)."""
    return with_retries(f"replica retention of {uri}", CONFLICT_ATTEMPTS, lambda: remove_prefixes(
        spark, uri, partitions, lambda files, p: plan_log_start(p, files, log_starts.get(p, 0)),
        run_id=run_id, trim_to=log_starts, job=JobName.REPLICATION))


def main(argv: list[str] | None = None) -> int:
    return topic_job_main(JobName.RETENTION,
                          "Apply retention_ms / retention_bytes; move lagging consumer groups forward.", run, argv)

if __name__ == "__main__":
    exit_without_teardown(main())  # not sys.exit: Arrow can abort in the teardown (tables/logs.py)
