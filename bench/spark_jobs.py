"""Benchmarks of the Spark maintenance jobs; writes docs/benchmarks-spark.md (full mode only).

    python -m bench.spark_jobs            # full: 1,000 files / 5 M rows; a 10 M-row topic
    python -m bench.spark_jobs --quick    # small sizes, for `make bench-quick`: printed, not written

1. Compaction of one partition made of many small files (as the flusher writes them): time, files
   and bytes before and after.
2. Retention on a large topic whose older half is past retention_ms: time, and whether the
   expired files were dropped whole (the commit's operation metrics: files removed, files added,
   rows copied).
3. An analyst query over one partition's offset range: files the scan opened (from the executed
   plan's metrics) against the files in the partition and the table.

`run(quick) -> str` is what bench/run.py calls; the topics are built with delta-rs exactly as the
flusher writes them (one commit per file, the partition's log end as a txn). Only a full run
replaces the fragment file: quick figures never overwrite the full-size ones.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import TOPIC_SCHEMA
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import TopicStore, new_topic

REPO = Path(__file__).resolve().parent.parent
FRAGMENT = REPO / "docs" / "benchmarks-spark.md"
HOUR_US = 3_600_000_000


@dataclass(frozen=True)
class Sizes:
    compaction_files: int
    compaction_rows: int
    retention_files: int
    retention_rows: int
    retention_partitions: int


FULL = Sizes(compaction_files=1000, compaction_rows=5_000_000, retention_files=240, retention_rows=10_000_000,
             retention_partitions=3)
QUICK = Sizes(compaction_files=60, compaction_rows=120_000, retention_files=24, retention_rows=600_000,
              retention_partitions=3)

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
        delta.append(table, data, txns={delta.partition_app_id(p): ends[p]}, metadata={"lakebroker.operation": "flush"})
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
            "files_after": table.files_after, "rows_removed": table.rows_removed,
            "files_dropped_whole": table.details["files_dropped_whole"],
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
    hi = lo + 999
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


def render(mode: str, comp: dict[str, Any], ret: dict[str, Any], query: dict[str, Any]) -> str:
    m = ret["commit_metrics"]
    rewritten = int(m.get("numAddedFiles", "0")) + int(m.get("numCopiedRows", "0"))
    whole = ret["files_rewritten"] == 0 and rewritten == 0
    verdict = "**whole files dropped without any rewrite**" if whole else "some rows were rewritten"
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = "python -m bench.spark_jobs" + (" --quick" if mode == "quick" else "")
    rows = [
        ("compaction of one partition",
         f"{comp['files_before']:,} files, {comp['rows']:,} rows, {_mb(comp['bytes_before'])}",
         f"{comp['seconds']:.1f} s",
         f"{comp['files_before']:,} → {comp['files_after']:,} files ({_mb(comp['bytes_after'])}); "
         f"{comp['bins']} bin(s) in {comp['commits']} commit(s); {comp['rows'] / comp['seconds']:,.0f} rows/s"),
        ("retention (older half expired)",
         f"{ret['rows']:,} rows in {ret['files_before']:,} files, 3 partitions",
         f"{ret['seconds']:.1f} s",
         f"{ret['rows_removed']:,} rows removed; {ret['files_dropped_whole']:,} files dropped whole, "
         f"{ret['files_rewritten']} rewritten; the commit: {m.get('numRemovedFiles', '?')} files removed, "
         f"{m.get('numAddedFiles', '?')} added, {m.get('numCopiedRows', '?')} rows copied: {verdict}"),
        ("analyst query, one partition's offset range", "1,000 offsets of partition 1",
         f"{query['seconds']:.2f} s",
         f"the scan opened **{query['files_read']} file(s)** of {query['files_in_partition']} in the partition "
         f"and {query['files_in_table']} in the table; {query['files_holding_range']} file(s) hold the range"),
    ]
    table = "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)
    return f"""# Spark jobs

Generated by `{command}` ({mode} mode) at {when}, local Spark (`local[*]`, 2 shared cores,
driver memory 1g), Delta 4.4.0. Topics are built with delta-rs exactly as the flusher writes
them: one commit per file, each carrying the partition's log end as a txn.

| benchmark | size | time | result |
|---|---|---|---|
{table}

Setup (not timed above): a warm-up run of each job on a throwaway topic (the JVM's first-use
cost); building the compaction topic took {comp['build_s']:.0f} s, the retention topic
{ret['build_s']:.0f} s (delta-rs appends).

**Compaction** rewrites adjacent small files of a partition into files of about
`compaction_target_file_bytes` (128 MB), each sorted by offset, in `dataChange=false` commits that
the flusher's concurrent appends never conflict with; then it checkpoints the log.

**Retention** walks each partition's files in offset order and removes the prefix whose newest row
is older than `retention_ms` (Kafka's segment rule). The removal is a commit of `remove` actions
only: no data file is read or written, so its cost does not depend on the data's size; the rest
of the time is Spark's planning, the offsets check and VACUUM (`vacuum_retention_hours` =
{ret['vacuum_hours']:g}, which lists the table).

**The query** `{query['query']}` is pruned twice: the `partition` filter selects one directory,
and Delta's data skipping drops every file whose `offset` min/max statistics miss the range,
which is tight because compaction writes offset-sorted, disjoint files. The executed plan's scan:

```
{query['scan']}
```
"""


def measure(quick: bool) -> str:
    """Run the three benchmarks on a throwaway data dir; the report as markdown."""
    from lakebroker.spark_pipeline.sql import spark_for

    sizes = QUICK if quick else FULL
    work = Path(tempfile.mkdtemp(prefix="lakebroker-bench-spark-"))
    try:
        settings = Settings(data_dir=work / "data", vacuum_retention_hours=168.0)
        spark = spark_for(settings, "lakebroker-bench")
        try:
            warm_up(spark, settings)
            comp = bench_compaction(spark, settings, sizes)
            ret = bench_retention(spark, settings, sizes)
            query = bench_query(spark, settings)
        finally:
            spark.stop()
        return render("quick" if quick else "full", comp, ret, query)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(quick: bool) -> str:
    """The report; a full run also writes it to docs/benchmarks-spark.md, a quick one only returns it."""
    markdown = measure(quick)
    if not quick:
        FRAGMENT.write_text(markdown)
    return markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_jobs", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="Small sizes (about a minute). The report is only printed: "
                             "docs/benchmarks-spark.md keeps the full run's figures.")
    args = parser.parse_args(argv)
    print(run(args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
