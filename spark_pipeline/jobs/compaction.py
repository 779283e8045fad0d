"""Compaction: ordered bin-packing of small files, then a checkpoint and log cleanup.

Per partition, adjacent small files (in offset order) are merged into files of about
`compaction_target_file_bytes`, each written sorted by offset. Compacted files therefore keep
disjoint, ascending offset ranges: an offset-range read prunes to the files that hold it, and
retention can drop whole files from the front of a partition. (Delta's own OPTIMIZE bins files by
size, not by offset, and ZORDER rewrites a whole partition on every run; neither keeps that.)

Each partition's bins are one commit: `remove` the bin's files, `add` the new ones, all with
`dataChange=false` at snapshot isolation, exactly as OPTIMIZE commits. The flusher keeps
appending meanwhile and never conflicts (see spark_pipeline/delta_txn.py). A crash before the
commit leaves only unreferenced files, which VACUUM removes; a re-run simply plans again.

After the data, the job writes a checkpoint and deletes log files older than the table's
`delta.logRetentionDuration` (30 days by default) that the checkpoint covers: readers replay a
short log, and txn actions live on in the checkpoint.

System tables that grow by small appends (`_system/job_runs`, `_system/retention_skips`) are
compacted the same way, by time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from lakebroker.spark_pipeline.delta_txn import DeltaTxn, maintain_log, table_exists, with_retries
from lakebroker.spark_pipeline.jobs.common import (
    CONFLICT_ATTEMPTS,
    job_tags,
    rewrite_bin,
    select_topics,
    table_stats,
    topic_job_main,
)
from lakebroker.spark_pipeline.plans import by_partition, plan_bins
from lakebroker.spark_pipeline.results import Progress, Run
from lakebroker.tables.job_runs import JobName, JobResult, Outcome, TableResult
from lakebroker.tables.layout import Layout
from lakebroker.tables.logs import exit_without_teardown
from lakebroker.tables.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MAX_BINS_PER_COMMIT = 32  # a first run over a large backlog commits progress as it goes


def run(spark: SparkSession, settings: Settings, topic: str | None = None, *, trigger: str = "library",
        system_tables: bool = True, progress: Progress | None = None) -> JobResult:
    """Compact one topic, or every topic (and the append-only system tables)."""
    layout = Layout.of(settings, for_spark=True)
    topics = select_topics(layout, topic)
    job = Run(JobName.COMPACTION, trigger, progress=progress)
    job.expect(len(topics) + (2 if topic is None and system_tables else 0))

    def work(uri: str, column: str) -> Callable[[TableResult], None]:
        return partial(compact_table, spark, uri, order_column=column, run_id=job.result.run_id,
                       target_bytes=settings.compaction_target_file_bytes, min_files=settings.compaction_min_files)

    for t in topics:
        job.table(t.name, t.name, work(layout.topic_table(t), "offset"))
    if topic is None and system_tables:
        for uri, column in ((layout.job_runs_table, "started_at"), (layout.retention_skips_table, "skipped_at")):
            job.table("_system/" + uri.rstrip("/").rsplit("/", 1)[-1], None, work(uri, column))
    return job.finish()


def compact_table(spark: SparkSession, uri: str, result: TableResult, *, order_column: str, target_bytes: int,
                  min_files: int, run_id: str) -> None:
    if not table_exists(spark, uri):
        result.outcome = Outcome.SKIPPED
        result.details["reason"] = "no table yet"
        return
    result.files_before, result.bytes_before = table_stats(uri)
    commits = bins_done = files_rewritten = 0
    # Bounded: each round commits up to MAX_BINS_PER_COMMIT bins; it stops when none are left.
    for _ in range((result.files_before or 0) // (MAX_BINS_PER_COMMIT * min_files) + 2):
        done = with_retries(f"compaction of {uri}", CONFLICT_ATTEMPTS,
                            lambda: _compact_round(spark, uri, order_column, target_bytes, min_files, run_id))
        if done.bins:
            commits += 1
            bins_done += done.bins
            files_rewritten += done.files
        if not done.more:
            break
    result.details["checkpoint_version"] = maintain_log(uri)
    result.files_after, result.bytes_after = table_stats(uri)
    result.rows_removed = 0  # compaction rewrites rows, it never removes one
    result.details.update({"bins": bins_done, "files_rewritten": files_rewritten, "commits": commits,
                           "target_file_bytes": target_bytes})


@dataclass(frozen=True)
class _Round:
    bins: int
    files: int
    more: bool  # bins were left for another round


def _compact_round(spark: SparkSession, uri: str, order_column: str, target_bytes: int, min_files: int,
                   run_id: str) -> _Round:
    """One commit: the first MAX_BINS_PER_COMMIT bins over all partitions of one snapshot."""
    txn = DeltaTxn(spark, uri)
    listed = txn.files()
    planned = [(partition, b) for partition, files in sorted(by_partition(listed).items(),
                                                              key=lambda item: -1 if item[0] is None else item[0])
               for b in plan_bins(files, target_bytes=target_bytes, min_files=min_files, order_column=order_column)]
    chosen = planned[:MAX_BINS_PER_COMMIT]
    if not chosen:
        return _Round(0, 0, False)
    actions: list[Any] = []
    for _, b in chosen:
        adds, removes = rewrite_bin(txn, b.files, order_column, data_change=False)
        actions += adds + removes
    partitions = sorted({p for p, _ in chosen if p is not None})
    predicate = [f"partition IN ({', '.join(map(str, partitions))})"] if partitions else []
    txn.commit(actions, txn.optimize_op(predicate), tags=job_tags(JobName.COMPACTION, run_id),
               metrics={"numBins": len(chosen), "numBatches": 1, "totalConsideredFiles": len(listed),
                        "totalFilesSkipped": len(listed) - sum(len(b.files) for _, b in chosen)})
    return _Round(len(chosen), sum(len(b.files) for _, b in chosen), len(planned) > len(chosen))


def main(argv: list[str] | None = None) -> int:
    return topic_job_main(JobName.COMPACTION, "Bin-pack small files of topic tables, ordered by offset.", run, argv)

if __name__ == "__main__":
    exit_without_teardown(main())  # not sys.exit: Arrow can abort in the teardown (tables/logs.py)
