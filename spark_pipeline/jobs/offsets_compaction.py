"""Offsets-table compaction: keep the latest offset per (group, topic, partition).

`_system/consumer_offsets` is append-only (tables/offsets.py): every commit of a group adds rows,
and per (group, topic, partition) and topic incarnation the row with the highest (epoch, seq) wins.
This job rewrites the files it read into one file holding only those rows (ties are all kept, so
the winner is unchanged; rows from before schema version 2 rank by `committed_at`),
sorted by group, topic and partition, and removes what it read, in one commit. Offsets committed
meanwhile land in new files that this commit does not touch, so none is lost; it registers only
the files it read, so the delivery workers' appends never conflict with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lakebroker.spark_pipeline.delta_txn import DeltaTxn, maintain_log, table_exists, with_retries
from lakebroker.spark_pipeline.jobs.common import (
    CONFLICT_ATTEMPTS,
    entry_main,
    job_tags,
    parser,
    settings_from,
    table_stats,
    vacuum,
)
from lakebroker.spark_pipeline.results import Run
from lakebroker.tables import delta, storage
from lakebroker.tables.job_runs import JobName, JobResult, Outcome, TableResult
from lakebroker.tables.layout import Layout
from lakebroker.tables.logs import exit_without_teardown
from lakebroker.tables.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TARGET = "_system/consumer_offsets"
KEY = ["group", "topic", "partition"]
INCARNATION = "topic_id"  # a re-created topic's rows and its deleted namesake's are ranked apart


def run(spark: SparkSession, settings: Settings, topic: str | None = None, *,
        trigger: str = "library") -> JobResult:
    """`topic` is accepted for a uniform signature; the offsets table is compacted as a whole."""
    layout = Layout.of(settings, for_spark=True)
    job = Run(JobName.OFFSETS_COMPACTION, trigger)
    job.table(TARGET, None, lambda r: compact_offsets(spark, layout.offsets_table, r, run_id=job.result.run_id,
                                                      vacuum_hours=settings.vacuum_retention_hours))
    return job.finish()


def latest_offsets(frame: DataFrame) -> DataFrame:
    """The rows that can win in OffsetsTable.latest(), per key and topic incarnation (ties kept)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    newest = Window.partitionBy(*KEY, F.coalesce(F.col(INCARNATION), F.lit(""))).orderBy(
        F.coalesce(F.col("epoch"), F.lit(0)).desc(), F.coalesce(F.col("seq"), F.lit(-1)).desc(),
        F.col("committed_at").desc())
    return frame.withColumn("_rank", F.rank().over(newest)).where(F.col("_rank") == 1).drop("_rank")


def compact_offsets(spark: SparkSession, uri: str, result: TableResult, *, run_id: str,
                    vacuum_hours: float | None = None) -> None:
    if not table_exists(spark, uri):
        result.outcome = Outcome.SKIPPED
        result.details["reason"] = "no offsets committed yet"
        return
    result.files_before, result.bytes_before = table_stats(uri)
    compact = already_compact(uri)
    if compact is not None:
        result.details.update({"rows_removed": 0, "rows_kept": compact, "commit_version": None,
                               "checked_without_spark": True})
    else:
        result.details.update(with_retries("offsets compaction", CONFLICT_ATTEMPTS,
                                           lambda: _compact_once(spark, uri, run_id)))
    result.rows_removed = result.details["rows_removed"]
    result.details["checkpoint_version"] = maintain_log(uri)
    if vacuum_hours is not None:
        vacuum(spark, uri, vacuum_hours)
    result.files_after, result.bytes_after = table_stats(uri)


def already_compact(uri: str) -> int | None:
    """The row count if a compaction would leave the table as it is, else None: at most one file, with
    one row per key and incarnation. Read with delta-rs (the log, and that one small file), so the
    usual scheduled run, and a replication run that copied no new offsets, start no Spark job."""
    import pyarrow.compute as pc

    if not storage.delta_rs_reads(uri):
        return None
    table = delta.load(uri)
    if len(table.file_uris()) > 1:
        return None
    rows = table.to_pyarrow_table(columns=[*KEY, INCARNATION])
    # grouped as latest_offsets ranks them: a null incarnation is the empty one
    rows = rows.set_column(rows.schema.get_field_index(INCARNATION), INCARNATION,
                           pc.fill_null(rows.column(INCARNATION), ""))
    keys = rows.group_by([*KEY, INCARNATION]).aggregate([]).num_rows
    return rows.num_rows if keys == rows.num_rows else None


def _compact_once(spark: SparkSession, uri: str, run_id: str) -> dict[str, Any]:
    txn = DeltaTxn(spark, uri)
    files = txn.files()
    rows_before = sum(f.rows or 0 for f in files)
    latest = latest_offsets(txn.read(files))
    rows_after = latest.count()
    if rows_after == rows_before and len(files) <= 1:
        return {"rows_removed": 0, "rows_kept": rows_after, "commit_version": None}  # nothing to gain
    adds = txn.write(latest.coalesce(1).sortWithinPartitions(*KEY), data_change=True)
    actions = adds + txn.removes(files, data_change=True)
    version = txn.commit(actions, txn.delete_op(["committed_at < current_timestamp()"]),
                         tags=job_tags(JobName.OFFSETS_COMPACTION, run_id),
                         metrics={"numDeletedRows": rows_before - rows_after, "numCopiedRows": rows_after})
    return {"rows_removed": rows_before - rows_after, "rows_kept": rows_after, "commit_version": version}


def main(argv: list[str] | None = None) -> int:
    p = parser(JobName.OFFSETS_COMPACTION, "Keep the latest offset per consumer group and partition.")
    args = p.parse_args(argv)
    return entry_main(JobName.OFFSETS_COMPACTION, run, args, settings_from(args), lambda: None)


if __name__ == "__main__":
    exit_without_teardown(main())  # not sys.exit: Arrow can abort in the teardown (tables/logs.py)
