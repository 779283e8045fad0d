"""`lakebroker verify-replica`: compare the primary and a replica, and say what explains the gaps.

Per topic partition it compares row counts and offset ranges, and the actual (partition, offset)
sets over the range both hold. A difference is *explained* when it is:

* lag: primary rows past the replica's newest offset (not copied yet; reported in messages and in
  seconds of produce time);
* pending retention: replica rows below the primary's log start (the next run removes them);
* pending key compaction (compact topics): replica rows the primary has compacted away.

Anything else is a problem: a row the replica lacks inside the range it claims to hold, a row the
primary never had, a topic or system table that was never replicated. The offsets table is compared
per (group, topic, partition); the copied system tables by version. With `max_lag_messages`, lag
beyond it is a problem too.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from lakebroker.spark_pipeline.delta_txn import DeltaTxn, app_version, table_exists
from lakebroker.spark_pipeline.jobs.common import parser, select_topics, settings_from
from lakebroker.spark_pipeline.jobs.replication import (
    HOLE_PROPERTIES,
    SNAPSHOT_APP_ID,
    SNAPSHOT_TABLES,
    check_filesystem,
    resolve_replica,
)
from lakebroker.spark_pipeline.results import Progress, TableEvent
from lakebroker.tables import delta, storage
from lakebroker.tables.errors import LakebrokerError
from lakebroker.tables.layout import Layout
from lakebroker.tables.log_start import log_starts
from lakebroker.tables.logs import exit_without_teardown
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import CleanupPolicy, TopicConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass
class PartitionCheck:
    topic: str
    partition: int
    primary_rows: int
    replica_rows: int
    primary_range: tuple[int | None, int | None]  # (lowest, newest) offset
    replica_range: tuple[int | None, int | None]
    lag_messages: int  # primary rows past the replica's newest offset
    lag_seconds: float | None  # produce-time gap between the newest rows
    pending_retention: int  # replica rows below the primary's log start
    pending_compaction: int  # replica rows the primary compacted away (compact topics)
    missing: int  # primary rows the replica lacks inside its range: a problem
    unexpected: int  # replica rows the primary never had: a problem


@dataclass
class Verification:
    partitions: list[PartitionCheck] = field(default_factory=list)
    tables: list[dict[str, Any]] = field(default_factory=list)  # system tables
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def lag_messages(self) -> int:
        return sum(p.lag_messages for p in self.partitions)


def verify(spark: SparkSession, settings: Settings, to: str | None = None, *, topic: str | None = None,
           max_lag_messages: int | None = None, progress: Progress | None = None) -> Verification:
    """`progress` hears of each topic (rows: the primary's rows compared) and of the system tables."""
    layout = Layout.of(settings, for_spark=True)
    replica = resolve_replica(to or settings.replication_uri, settings.data_dir, settings.tables_uri)
    topics = select_topics(layout, topic)
    check_filesystem(spark, replica)
    out = Verification()
    total = len(topics) + (1 if topic is None else 0)  # the system tables are one step
    report = progress or (lambda event: None)
    for number, t in enumerate(topics, 1):
        report(TableEvent(t.name, number, total))
        source, target = layout.topic_table(t), replica.topic_table(t)
        checks: list[PartitionCheck] = []
        if table_exists(spark, source):
            if table_exists(spark, target):
                checks = _check_topic(spark, t, source, target)
                out.problems += _hole_property_problems(spark, t.name, source, target)
            else:
                out.problems.append(f"topic {t.name!r} has no replica table at {target}")
        out.partitions += checks
        report(TableEvent(t.name, number, total, done=True, rows=sum(c.primary_rows for c in checks)))
    for check in out.partitions:
        where = f"{check.topic}[{check.partition}]"
        if check.missing:
            out.problems.append(f"{where}: the replica lacks {check.missing} rows inside the range it holds")
        if check.unexpected:
            out.problems.append(f"{where}: the replica has {check.unexpected} rows the primary never had")
        if max_lag_messages is not None and check.lag_messages > max_lag_messages:
            out.problems.append(f"{where}: lag of {check.lag_messages} messages is over {max_lag_messages}")
    if topic is None:
        report(TableEvent("_system", total, total))
        _check_offsets(spark, layout.offsets_table, replica.system_table("consumer_offsets"), out)
        for name in SNAPSHOT_TABLES:
            _check_snapshot(spark, layout.system_table(name), replica.system_table(name), name, out)
        report(TableEvent("_system", total, total, done=True))
    return out


def _stats(frame: DataFrame) -> dict[int, tuple[int, int, int, datetime | None]]:
    from pyspark.sql import functions as F

    rows = frame.groupBy("partition").agg(F.count("*").alias("n"), F.min("offset").alias("lo"),
                                          F.max("offset").alias("hi"), F.max("timestamp").alias("ts")).collect()
    return {int(r["partition"]): (int(r["n"]), int(r["lo"]), int(r["hi"]), r["ts"]) for r in rows}


def _check_topic(spark: SparkSession, topic: TopicConfig, source: str, target: str) -> list[PartitionCheck]:

    snapshot = delta.load(source)  # the primary's rows and log starts from this one version
    primary = (spark.read.format("delta").option("versionAsOf", snapshot.version()).load(source)
               .select("partition", "offset", "timestamp").cache())
    replica = spark.read.format("delta").load(target).select("partition", "offset", "timestamp").cache()
    try:
        p_stats, r_stats = _stats(primary), _stats(replica)
        starts = log_starts(snapshot, topic.partitions)
        bounds = spark.createDataFrame(
            [(p, starts[p], p_stats.get(p, (0, 0, -1, None))[2], r_stats.get(p, (0, 0, -1, None))[2])
             for p in range(topic.partitions)], "partition int, start long, p_hi long, r_hi long")
        counts = _classify(primary, replica, bounds)
        missing, absent, below, beyond, lag = (
            {p: c[k] for p, c in counts.items()} for k in ("missing", "absent", "below", "beyond", "lag"))
    finally:
        primary.unpersist()
        replica.unpersist()
    compact = topic.cleanup_policy is CleanupPolicy.COMPACT
    out = []
    for p in range(topic.partitions):
        pn, plo, phi, pts = p_stats.get(p, (0, None, None, None))
        rn, rlo, rhi, rts = r_stats.get(p, (0, None, None, None))
        if pts is None:
            lag_s: float | None = 0.0
        elif rts is None:
            lag_s = None  # nothing copied yet
        else:
            lag_s = max(0.0, (pts - rts).total_seconds())
        out.append(PartitionCheck(
            topic=topic.name, partition=p, primary_rows=pn, replica_rows=rn, primary_range=(plo, phi),
            replica_range=(rlo, rhi), lag_messages=lag.get(p, 0), lag_seconds=lag_s,
            # On a compact topic, rows below the first offset were removed by key compaction too.
            pending_retention=0 if compact else below.get(p, 0),
            pending_compaction=absent.get(p, 0) + below.get(p, 0) if compact else 0,
            missing=missing.get(p, 0), unexpected=beyond.get(p, 0) + (0 if compact else absent.get(p, 0))))
    return out


def _classify(primary: DataFrame, replica: DataFrame, bounds: DataFrame) -> dict[int, dict[str, int]]:
    """Per partition, in one join of the two sides' (partition, offset) keys, rows counted with
    their multiplicity on their own side:

    * missing: primary rows up to the replica's newest offset that the replica lacks;
    * absent: replica rows inside the primary's range [log start, newest] that the primary lacks;
    * below / beyond: replica rows under the primary's log start / over its newest offset;
    * lag: primary rows over the replica's newest offset."""
    from pyspark.sql import functions as F

    key = ["partition", "offset"]
    sides = (primary.groupBy(*key).agg(F.count("*").alias("pn"))
             .join(replica.groupBy(*key).agg(F.count("*").alias("rn")), key, "full_outer")
             .join(bounds, "partition"))
    offset, pn, rn = F.col("offset"), F.col("pn"), F.col("rn")

    def total(rows: Any, where: Any) -> Any:
        return F.sum(F.when(where & rows.isNotNull(), rows).otherwise(0))

    rows = sides.groupBy("partition").agg(
        total(pn, rn.isNull() & (offset <= F.col("r_hi"))).alias("missing"),
        total(rn, pn.isNull() & (offset >= F.col("start")) & (offset <= F.col("p_hi"))).alias("absent"),
        total(rn, offset < F.col("start")).alias("below"),
        total(rn, offset > F.col("p_hi")).alias("beyond"),
        total(pn, offset > F.col("r_hi")).alias("lag")).collect()
    names = ("missing", "absent", "below", "beyond", "lag")
    return {int(r["partition"]): {k: int(r[k]) for k in names} for r in rows}


def _check_offsets(spark: SparkSession, source: str, target: str, out: Verification) -> None:
    from lakebroker.spark_pipeline.jobs.offsets_compaction import INCARNATION, KEY, latest_offsets

    if not table_exists(spark, source):
        return
    if not table_exists(spark, target):
        out.problems.append("the offsets table has no replica")
        return
    primary = {tuple(r[k] for k in (*KEY, INCARNATION)): (r["offset"], r["committed_at"]) for r in
               latest_offsets(spark.read.format("delta").load(source)).collect()}
    replica = {tuple(r[k] for k in (*KEY, INCARNATION)): (r["offset"], r["committed_at"]) for r in
               latest_offsets(spark.read.format("delta").load(target)).collect()}
    behind = 0
    for key, (offset, at) in primary.items():
        copy = replica.get(key)
        if copy is None or copy[1] < at:
            behind += 1  # lag: committed after the last replication
        elif copy[1] > at or copy[0] != offset:
            out.problems.append(f"offsets of {key}: replica has {copy[0]} at {copy[1]}, primary {offset} at {at}")
    for key in replica.keys() - primary.keys():
        out.problems.append(f"offsets of {key}: the replica has a position the primary does not")
    out.tables.append({"table": "_system/consumer_offsets", "positions": len(primary), "behind": behind})


def _hole_property_problems(spark: SparkSession, topic: str, source: str, target: str) -> list[str]:
    """A replica that lacks the primary's hole properties would read its legitimate holes as damage."""
    primary, copied = (DeltaTxn(spark, uri).configuration for uri in (source, target))
    return [f"topic {topic!r}: the replica's {name} is {copied.get(name)!r}, the primary's {primary.get(name)!r} "
            "(the next replicate copies it)"
            for name in HOLE_PROPERTIES if primary.get(name) is not None and copied.get(name) != primary.get(name)]


def _check_snapshot(spark: SparkSession, source: str, target: str, name: str, out: Verification) -> None:
    if not table_exists(spark, source):
        return
    if not table_exists(spark, target):
        out.problems.append(f"system table {name} has no replica")
        return
    version = int(delta.load(source).version())
    copied = app_version(spark, target, SNAPSHOT_APP_ID)
    entry: dict[str, Any] = {"table": f"_system/{name}", "version": version, "replicated_version": copied}
    if copied == version:
        rows = (_row_count(spark, source), _row_count(spark, target))
        entry["rows"] = rows
        if rows[0] != rows[1]:
            out.problems.append(f"system table {name}: {rows[1]} rows in the replica, {rows[0]} in the primary")
    out.tables.append(entry)


def _row_count(spark: SparkSession, uri: str) -> int:
    """From the log's statistics where delta-rs reads the table (a Spark count is a job, seconds in a
    cold JVM), else from Spark."""
    counted = delta.row_count(delta.load(uri)) if storage.delta_rs_reads(uri) else None
    return counted if counted is not None else int(spark.read.format("delta").load(uri).count())


def main(argv: list[str] | None = None) -> int:
    import json

    from lakebroker.spark_pipeline.sql import spark_for

    args = parser_for().parse_args(argv)
    settings = settings_from(args)
    try:
        resolve_replica(args.to or settings.replication_uri, settings.data_dir, settings.tables_uri)
        select_topics(Layout.of(settings, for_spark=True), args.topic)
    except LakebrokerError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    spark = spark_for(settings, "lakebroker-verify-replica")
    try:
        result = verify(spark, settings, args.to, topic=args.topic, max_lag_messages=args.max_lag_messages)
    finally:
        spark.stop()
    print(json.dumps({"ok": result.ok, "problems": result.problems, "lag_messages": result.lag_messages,
                      "partitions": [c.__dict__ for c in result.partitions], "tables": result.tables}, default=str))
    return 0 if result.ok else 1


def parser_for() -> Any:
    from lakebroker.tables.job_runs import JobName

    p = parser(JobName.REPLICATION, "Compare the primary and a replica; non-zero exit on unexplained differences.")
    p.prog = "python -m lakebroker.spark_pipeline.jobs.verify_replica"
    p.add_argument("--to", help="Replica location (default: the replication_uri setting).")
    p.add_argument("--topic", help="Only this topic.")
    p.add_argument("--max-lag-messages", type=int, default=None, help="Treat more lag than this as a problem.")
    return p


if __name__ == "__main__":
    exit_without_teardown(main())  # not sys.exit: Arrow can abort in the teardown (tables/logs.py)
