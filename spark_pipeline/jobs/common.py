"""What every job shares: choosing topics, rewriting bins of files, the spark-submit entry point."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakebroker.spark_pipeline.delta_txn import DeltaTxn
from lakebroker.spark_pipeline.plans import FileEntry, by_partition
from lakebroker.tables.errors import LakebrokerError
from lakebroker.tables.job_runs import JobName, JobResult, Outcome
from lakebroker.tables.layout import Layout
from lakebroker.tables.logs import configure_logging
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicConfig, TopicStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

CONFLICT_ATTEMPTS = 5  # re-plans after a concurrent job removed files we planned on


def select_topics(layout: Layout, topic: str | None) -> list[TopicConfig]:
    """The named topic (NotFound / InvalidName if it is not one), or every topic."""
    store = TopicStore(layout)
    if topic is not None:
        return [store.get(topic)]
    return sorted(store.load().values(), key=lambda t: t.name)


def job_tags(job: JobName, run_id: str) -> dict[str, str]:
    """Tags on every commit a job makes (`DESCRIBE HISTORY` shows them)."""
    return {"lakebroker.job": job.value, "lakebroker.runId": run_id}


def rewrite_bin(txn: DeltaTxn, files: Sequence[FileEntry], order_column: str, *, data_change: bool,
                keep: Callable[[DataFrame], DataFrame] | None = None) -> tuple[list[Any], list[Any]]:
    """Rewrite a bin of adjacent files as one file sorted by `order_column` (uncommitted).

    `keep` filters the rows (key compaction, retention trims); None keeps them all (compaction).
    Returns (adds, removes) for the caller to commit.
    """
    frame = txn.read(files)
    if keep is not None:
        frame = keep(frame)
    frame = frame.coalesce(1).sortWithinPartitions(*txn.partition_columns, order_column)
    adds = txn.write(frame, data_change=data_change)
    return adds, txn.removes(files, data_change=data_change)


@dataclass
class RowRemoval:
    """Actions (uncommitted) that remove a set of rows by (partition, offset)."""

    actions: list[Any] = field(default_factory=list)
    rows_removed: int = 0
    rows_copied: int = 0
    tombstones_removed: int = 0
    files_dropped_whole: int = 0
    files_rewritten: int = 0


def remove_rows(txn: DeltaTxn, files: Sequence[FileEntry], doomed: DataFrame, *, target_bytes: int) -> RowRemoval:
    """Plan and write the removal of `doomed` rows (columns partition, offset[, tombstone]) from
    these files of a topic table: a file that loses every row is removed whole, and runs of
    adjacent partly-affected files are rewritten without them, merged up to `target_bytes`, so
    offset ranges stay disjoint and ascending. Kept rows keep their offsets."""
    from pyspark.sql import functions as F

    out = RowRemoval()
    listed = [f for f in files if f.partition is not None and f.min_offset is not None and f.max_offset is not None]
    if not listed:
        return out
    spark = txn.spark
    has_tombstone = "tombstone" in doomed.columns
    ranges = spark.createDataFrame([(f.partition, f.min_offset, f.max_offset, f.path) for f in listed],
                                   "p int, lo long, hi long, path string")
    tombstones = F.sum(F.col("tombstone").cast("int")) if has_tombstone else F.lit(0)
    per_file = {r["path"]: (int(r["n"]), int(r["t"] or 0)) for r in (
        doomed.join(F.broadcast(ranges), (doomed["partition"] == ranges["p"])
                    & doomed["offset"].between(ranges["lo"], ranges["hi"]))
        .groupBy("path").agg(F.count("*").alias("n"), tombstones.alias("t")).collect())}
    if not per_file:
        return out
    drop, bins = plan_row_removal(listed, {path: n for path, (n, _) in per_file.items()}, target_bytes)
    keys = doomed.select("partition", "offset")

    def keep(frame: DataFrame) -> DataFrame:
        return frame.join(keys, ["partition", "offset"], "left_anti")

    out.actions = list(txn.removes(drop, data_change=True)) if drop else []
    for b in bins:
        adds, removes = rewrite_bin(txn, b, "offset", data_change=True, keep=keep)
        out.rows_copied += sum(f.rows or 0 for f in txn.added_files(adds))
        out.actions += adds + removes
    out.rows_removed = sum(n for n, _ in per_file.values())
    out.tombstones_removed = sum(t for _, t in per_file.values())
    out.files_dropped_whole = len(drop)
    out.files_rewritten = sum(len(b) for b in bins)
    return out


def plan_row_removal(files: Sequence[FileEntry], doomed: dict[str, int],
                     target_bytes: int) -> tuple[list[FileEntry], list[list[FileEntry]]]:
    """Files to drop whole, and bins of adjacent partly-affected files to rewrite together."""
    drop: list[FileEntry] = []
    bins: list[list[FileEntry]] = []
    for _, part in sorted(by_partition(files).items(), key=lambda item: item[0] or 0):
        current: list[FileEntry] = []
        size = 0.0
        for f in sorted(part, key=lambda f: f.min_offset or 0):
            removed = doomed.get(f.path, 0)
            if removed and f.rows is not None and removed >= f.rows:
                drop.append(f)  # transparent: its neighbours become adjacent
                continue
            if not removed:
                if current:
                    bins.append(current)
                current, size = [], 0.0
                continue
            after = f.size * (1 - removed / max(f.rows or 1, 1))
            if current and size + after > target_bytes:
                bins.append(current)
                current, size = [], 0.0
            current.append(f)
            size += after
        if current:
            bins.append(current)
    return drop, bins


def vacuum(spark: SparkSession, uri: str, hours: float) -> bool:
    """VACUUM unreferenced files older than `hours` (Delta refuses < 168 h unless told this is
    intended). Returns whether it ran: a table where a listing (delta-rs's dry run) finds nothing
    to delete is left alone, since Spark's VACUUM costs seconds of Spark jobs even then, and most
    scheduled runs of most tables have nothing to delete."""
    from lakebroker.tables import delta

    if delta.vacuum_candidates(uri, hours) == []:
        return False
    check = "spark.databricks.delta.retentionDurationCheck.enabled"
    # VACUUM lists the table with this many tasks (Spark's default is 10000: minutes of
    # scheduling overhead for a small table on a small machine).
    listing = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
    previous = {key: spark.conf.get(key, None) for key in (check, listing)}
    if hours < 168:
        spark.conf.set(check, "false")
    spark.conf.set(listing, str(max(8, 4 * spark.sparkContext.defaultParallelism)))
    try:
        spark.sql(f"VACUUM delta.`{uri}` RETAIN {float(hours)} HOURS").collect()
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    return True


def files_and_bytes(files: Sequence[FileEntry]) -> tuple[int, int]:
    return len(files), sum(f.size for f in files)


def table_stats(uri: str) -> tuple[int, int]:
    """(data files, bytes) of a table's latest version, from its log (delta-rs: no Spark job)."""
    import pyarrow as pa

    from lakebroker.tables import delta

    actions = pa.table(delta.load(uri).get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return 0, 0
    return actions.num_rows, int(pa.compute.sum(actions.column("size_bytes")).as_py() or 0)


# -- the spark-submit / `python -m` entry point ------------------------------------------------
RunFn = Callable[..., JobResult]


def parser(job: JobName, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m lakebroker.spark_pipeline.jobs.{job.value.replace('-', '_')}",
                                description=description)
    p.add_argument("--data-dir", help="Data directory (default: LAKEBROKER_DATA_DIR or ./data).")
    p.add_argument("--master", help="Spark master URL (default: the spark_master setting; under spark-submit, "
                                    "spark-submit's --master).")
    p.add_argument("--trigger", default=None, help="Who started the run, as job_runs records it.")
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    if args.master:
        overrides["spark_master"] = args.master
    return Settings(**overrides)


def default_trigger() -> str:
    from lakebroker.spark_pipeline.session import launched_by_spark_submit

    return "spark-submit" if launched_by_spark_submit() else "cli"


def entry_main(job: JobName, run: RunFn, args: argparse.Namespace, settings: Settings,
               validate: Callable[[], None], **kwargs: Any) -> int:
    """Validate, run on a fresh Spark session, record the run, print it as JSON; 0 unless it failed."""
    from lakebroker.spark_pipeline.sql import spark_for
    from lakebroker.tables import job_runs

    configure_logging(settings)
    try:
        validate()
    except LakebrokerError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    spark = spark_for(settings, f"lakebroker-{job.value}")
    try:
        result = run(spark, settings, trigger=args.trigger or default_trigger(), **kwargs)
    finally:
        spark.stop()
    job_runs.record(Layout.of(settings), result)
    print(json.dumps(result.public(), default=str), flush=True)
    return 1 if result.outcome is Outcome.FAILED else 0


def topic_job_main(job: JobName, description: str, run: RunFn, argv: list[str] | None, *,
                   select: Callable[[Layout, str | None], object] = select_topics,
                   every: str = "every topic") -> int:
    """The entry point of a job that takes `--topic`: the topic is checked (`select`) before Spark starts."""
    p = parser(job, description)
    p.add_argument("--topic", help=f"Only this topic (default: {every}).")
    args = p.parse_args(argv)
    settings = settings_from(args)

    def validate() -> None:
        select(Layout.of(settings), args.topic)

    return entry_main(job, run, args, settings, validate, topic=args.topic)
