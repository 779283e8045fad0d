"""The Spark maintenance jobs on topics built as the flusher writes them: compaction of one partition
made of many small files (time, files and bytes before and after), retention of a topic whose older
half has expired (time, and whether the expired files were dropped whole), and an analyst query over
one partition's offset range (the files its scan opened, against those in the partition and the table).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.result import Check, Mode, Result, Scenario, table
from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import TOPIC_SCHEMA
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicStore, new_topic

HOUR_US = 3_600_000_000
VACUUM_RETENTION_HOURS = 168.0
QUERY_OFFSETS = 1000


@dataclass(frozen=True)
class Sizes:
    compaction_files: int
    compaction_rows: int
    retention_files: int
    retention_rows: int
    retention_partitions: int


SIZES: dict[str, Sizes] = {
    "full": Sizes(compaction_files=1000, compaction_rows=5_000_000, retention_files=240, retention_rows=10_000_000,
                  retention_partitions=3),
    "quick": Sizes(compaction_files=60, compaction_rows=120_000, retention_files=24, retention_rows=600_000,
                   retention_partitions=3),
    "tiny": Sizes(compaction_files=10, compaction_rows=10_000, retention_files=12, retention_rows=24_000,
                  retention_partitions=3),
}

_KEYS = pa.array([f"customer-{i}" for i in range(1000)], pa.string())
_VALUES = pa.array([json.dumps({"order": i, "total": i * 7 % 1000, "note": "x" * (40 + i % 40)}).encode()
                    for i in range(1000)], pa.binary())


def _batch(partition: int, start: int, n: int, ts_from_us: int, ts_step_us: int) -> pa.Table:
    idx = pa.array(np.arange(start, start + n) % 1000)
    return pa.table({
        "partition": pa.array(np.full(n, partition, dtype=np.int32)),
        "offset": pa.array(np.arange(start, start + n, dtype=np.int64)),
        "timestamp": pa.array(ts_from_us + np.arange(n, dtype=np.int64) * ts_step_us, pa.timestamp("us", tz="UTC")),
        "key": pc.take(_KEYS, idx),
        "value": pc.take(_VALUES, idx),
        "format": pa.array(["json"] * n, pa.string()),
        "headers": pa.nulls(n, pa.map_(pa.string(), pa.string())),
        "message_id": pa.nulls(n, pa.string()),
        "producer_id": pa.nulls(n, pa.string()),
        "sequence": pa.nulls(n, pa.int64()),
    }, schema=TOPIC_SCHEMA)


def build_topic(settings: Settings, name: str, partitions: int, files: int, rows: int, *, span_hours: float,
                retention_ms: int | None = None) -> float:
    """Append `files` commits (round-robin over partitions) holding `rows` rows; returns seconds."""
    t0 = time.perf_counter()
    TopicStore(Layout(settings.data_dir)).create(new_topic(name, partitions, retention_ms=retention_ms))
    table = delta.open_table(Layout(settings.data_dir).topic_table(name))
    assert table is not None
    per_file = rows // files
    now = int(time.time() * 1_000_000)
    start_us = now - int(span_hours * HOUR_US)
    step = max(1, int(span_hours * HOUR_US) // rows)
    ends = dict.fromkeys(range(partitions), 0)
    for i in range(files):
        p = i % partitions
        first_row = i * per_file
        data = _batch(p, ends[p], per_file, start_us + first_row * step, step)
        ends[p] += per_file
        delta.append_partitions(table, {p: data}, txns={delta.partition_app_id(p): ends[p]},
                                metadata={"lakebroker.operation": "flush"})
    return time.perf_counter() - t0


def _table_files(uri: str) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    out: list[dict[str, Any]] = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    return out


def _last_commit_metrics(spark: Any, uri: str, operation: str) -> dict[str, str]:
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").where(f"operation = '{operation}'").orderBy(
        "version", ascending=False).limit(1).collect()
    return dict(rows[0].operationMetrics) if rows else {}


def warm_up(spark: Any, settings: Settings) -> None:
    """Load and JIT Spark's and Delta's code paths on a throwaway topic, so the timings below are
    the jobs' and not the JVM's first-use cost."""
    from lakebroker.spark_pipeline.jobs import compaction, retention

    build_topic(settings, "warm_up", 1, 4, 400, span_hours=1, retention_ms=1_800_000)
    compaction.run(spark, settings, "warm_up")
    retention.run(spark, settings, "warm_up")


def bench_compaction(spark: Any, settings: Settings, sizes: Sizes) -> dict[str, Any]:
    from lakebroker.spark_pipeline.jobs import compaction

    build_s = build_topic(settings, "compaction_bench", 1, sizes.compaction_files, sizes.compaction_rows,
                          span_hours=1)
    t0 = time.perf_counter()
    result = compaction.run(spark, settings, "compaction_bench")
    elapsed = time.perf_counter() - t0
    table = result.table("compaction_bench")
    assert result.outcome.value == "ok", result.public()
    return {"build_s": build_s, "seconds": elapsed, "rows": sizes.compaction_rows,
            "files_before": table.files_before, "files_after": table.files_after,
            "bytes_before": table.bytes_before, "bytes_after": table.bytes_after,
            "bins": table.details["bins"], "commits": table.details["commits"]}


def bench_retention(spark: Any, settings: Settings, sizes: Sizes) -> dict[str, Any]:
    from lakebroker.spark_pipeline.jobs import retention

    uri = Layout(settings.data_dir).topic_table("retention_bench")
    build_s = build_topic(settings, "retention_bench", sizes.retention_partitions, sizes.retention_files,
                          sizes.retention_rows, span_hours=10, retention_ms=5 * 3_600_000)
    files_before = len(_table_files(uri))
    t0 = time.perf_counter()
    result = retention.run(spark, settings, "retention_bench")
    elapsed = time.perf_counter() - t0
    table = result.table("retention_bench")
    assert result.outcome.value == "ok", result.public()
    metrics = _last_commit_metrics(spark, uri, "DELETE")
    return {"build_s": build_s, "seconds": elapsed, "rows": sizes.retention_rows, "files_before": files_before,
            "partitions": sizes.retention_partitions, "files_after": table.files_after,
            "rows_removed": table.rows_removed, "files_dropped_whole": table.details["files_dropped_whole"],
            "files_rewritten": table.details["files_rewritten"], "commit_metrics": metrics,
            "vacuum_hours": settings.vacuum_retention_hours}


def bench_query(spark: Any, settings: Settings) -> dict[str, Any]:
    from lakebroker.spark_pipeline.catalog import register_tables
    from lakebroker.spark_pipeline.plan_metrics import scan_metrics

    uri = Layout(settings.data_dir).topic_table("retention_bench")
    register_tables(spark, Layout(settings.data_dir))
    files = _table_files(uri)
    part1 = sorted((f for f in files if f["partition.partition"] == 1), key=lambda f: f["min.offset"])
    middle = part1[len(part1) // 2]
    lo = int(middle["min.offset"]) + 10
    hi = lo + QUERY_OFFSETS - 1
    query = (f"SELECT offset, key, CAST(value AS STRING) AS value FROM retention_bench "
             f"WHERE partition = 1 AND offset BETWEEN {lo} AND {hi}")
    frame = spark.sql(query)
    t0 = time.perf_counter()
    read = scan_metrics(frame)
    elapsed = time.perf_counter() - t0
    plan = frame._jdf.queryExecution().executedPlan().toString()
    scan_line = next((line.strip() for line in plan.splitlines() if "PartitionFilters" in line), "")
    holding = [f for f in part1 if f["min.offset"] <= hi and f["max.offset"] >= lo]
    return {"query": query, "seconds": elapsed, "files_read": read.files_read, "bytes_read": read.bytes_read,
            "rows": read.rows_output, "files_holding_range": len(holding), "files_in_partition": len(part1),
            "files_in_table": len(files), "scan": scan_line[:600]}


def _mb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e6:,.1f} MB"


def result(comp: dict[str, Any], ret: dict[str, Any], query: dict[str, Any]) -> Result:
    """The three benchmarks' figures, read."""
    m = ret["commit_metrics"]
    files_rewritten = ret["files_rewritten"] + int(m.get("numAddedFiles", "0"))
    rows_copied = int(m.get("numCopiedRows", "0"))
    whole = files_rewritten == 0 and rows_copied == 0
    verdict = "whole files dropped without any rewrite" if whole else "some rows were rewritten"
    rows_s = comp["rows"] / comp["seconds"]
    rows = [
        ["compaction of one partition",
         f"{comp['files_before']:,} files, {comp['rows']:,} rows, {_mb(comp['bytes_before'])}",
         f"{comp['seconds']:.1f} s",
         f"{comp['files_before']:,} → {comp['files_after']:,} files ({_mb(comp['bytes_after'])}); "
         f"{comp['bins']} bin(s) in {comp['commits']} commit(s); {rows_s:,.0f} rows/s"],
        ["retention (older half expired)",
         f"{ret['rows']:,} rows in {ret['files_before']:,} files, {ret['partitions']} partitions",
         f"{ret['seconds']:.1f} s",
         f"{ret['rows_removed']:,} rows removed; {ret['files_dropped_whole']:,} files dropped whole, "
         f"{ret['files_rewritten']} rewritten; the commit: {m.get('numRemovedFiles', '?')} files removed, "
         f"{m.get('numAddedFiles', '?')} added, {m.get('numCopiedRows', '?')} rows copied: **{verdict}**"],
        ["analyst query, one partition's offset range", f"{QUERY_OFFSETS:,} offsets of partition 1",
         f"{query['seconds']:.2f} s",
         f"the scan opened **{query['files_read']} file(s)** of {query['files_in_partition']} in the partition "
         f"and {query['files_in_table']} in the table; {query['files_holding_range']} file(s) hold the range"],
    ]
    return Result(
        scenario="spark_jobs",
        checks=[
            Check("retention: files rewritten", files_rewritten, "files", 0, higher_is_better=False,
                  baseline=f"{ret['files_dropped_whole']:,} expired files dropped whole"),
            Check("retention: rows copied", rows_copied, "rows", 0, higher_is_better=False,
                  baseline=f"{ret['rows_removed']:,} rows removed"),
            Check("query: files its scan opened", query["files_read"], "files", query["files_holding_range"],
                  higher_is_better=False,
                  baseline=f"the files holding the range, of {query['files_in_partition']} in the partition and "
                           f"{query['files_in_table']} in the table"),
        ],
        headlines=[f"compaction {comp['files_before']:,} → {comp['files_after']:,} files in {comp['seconds']:.1f} s "
                   f"({rows_s:,.0f} rows/s); retention {ret['seconds']:.1f} s, {verdict}; the query's scan opened "
                   f"{query['files_read']} of {query['files_in_table']} files"],
        tables=[table("", ["benchmark", "size", "time", "result"], rows)],
        notes=[
            f"Retention: **{verdict}**"
            + (f"; its commit reads and writes no data file, so its {ret['seconds']:.1f} s are Spark's planning, "
               f"the offsets check and VACUUM (`vacuum_retention_hours` = {ret['vacuum_hours']:g}, which lists the "
               "table)" if whole else "")
            + f". Building the topics, not timed, took {comp['build_s']:.0f} s (compaction) and {ret['build_s']:.0f} s "
            "(retention) of flusher commits.",
            f"The query `{query['query']}` read {query['rows']:,} rows from {query['files_read']} file(s) "
            f"({_mb(query['bytes_read'])}) in {query['seconds']:.2f} s. The executed plan's scan:\n\n"
            f"```\n{query['scan']}\n```",
        ],
        figures={"compaction": comp, "retention": ret, "query": query},
    )


def measure(mode: Mode, work: Path) -> Result:
    from lakebroker.spark_pipeline.sql import spark_for

    sizes = SIZES[mode]
    settings = Settings(data_dir=work / "data", vacuum_retention_hours=VACUUM_RETENTION_HOURS)
    spark = spark_for(settings, "lakebroker-bench")
    try:
        warm_up(spark, settings)
        comp = bench_compaction(spark, settings, sizes)
        ret = bench_retention(spark, settings, sizes)
        query = bench_query(spark, settings)
    finally:
        spark.stop()
    return result(comp, ret, query)


_FULL = SIZES["full"]
SCENARIO = Scenario(
    name="spark_jobs", title="Spark jobs", measure=measure,
    setup="Local Spark as the jobs run it (`spark_for`: master `local[*]`, driver memory 1g, Delta 4.4.0) on topic "
          "tables built as the flusher writes them (`tables.delta.append_partitions`): one commit per file, each "
          "carrying its "
          "partition's log end as a txn. Each job first runs once on a throwaway topic, so the timings leave out "
          "the JVM's first-use cost; building the topics is not timed.",
    load=f"Compaction of one partition of {_FULL.compaction_files:,} small files ({_FULL.compaction_rows:,} rows, "
         "spanning an hour) into files of about `compaction_target_file_bytes` (128 MB), sorted by offset, in "
         f"`dataChange=false` commits. Retention of a {_FULL.retention_partitions}-partition topic of "
         f"{_FULL.retention_rows:,} rows in {_FULL.retention_files} files spanning 10 hours, with `retention_ms` of "
         "5 hours: each partition's prefix of files whose newest row is older is removed (Kafka's segment rule), "
         f"then VACUUM (`vacuum_retention_hours` = {VACUUM_RETENTION_HOURS:g}). Then a SQL query of "
         f"{QUERY_OFFSETS:,} offsets from the middle of partition 1 of what retention left "
         "(`WHERE partition = 1 AND offset BETWEEN …`). Quick runs use smaller topics.",
    metric="Each job's wall time, with files, rows and bytes before and after; retention's DELETE commit's "
           "operation metrics (files removed and added, rows copied); the files the query's scan opened (from "
           "the executed plan's metrics), against the files whose `offset` statistics meet the range.",
    target="Retention drops expired files whole: no file rewritten, no row copied. The query's scan opens only "
           "the files that hold its range (the `partition` filter picks one directory, data skipping on the "
           "offset-sorted files' `offset` statistics the rest). No target on time.",
)
