"""What a delivery read of 1,000 offsets decodes from a partition that compaction made one large file:
pyarrow skips the row groups whose offset statistics miss the range but decodes each one it keeps whole,
so the file's row-group size decides. The same rows are written with one row group (Spark's default
`parquet.block.size` on any compacted file up to 128 MB) and with row groups of ROW_GROUP_BYTES.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import WriterProperties, write_deltalake

from bench.result import Check, Mode, Result, Scenario, table
from lakebroker.tables import delta
from lakebroker.tables.log_tail import TopicLogTail
from lakebroker.tables.parquet_files import ROW_GROUP_BYTES
from lakebroker.tables.schemas import TOPIC_SCHEMA
from lakebroker.tables.topics import ensure_topic_table
from tests.file_reads import ReadRecorder

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

READ = 1000  # rows a delivery read takes at most (delivery_worker/reader.py READ_AHEAD)
SPARK_DEFAULT_BLOCK = 128 * 1024 * 1024
MAX_GROUPS_READ = 2  # a bounded row group holds more than READ rows: READ consecutive offsets span at most two


@dataclass(frozen=True)
class Sizes:
    rows: int
    value_bytes: int
    reads: int  # timed reads of each file
    spark: bool  # the compaction job's files too


SIZES: dict[str, Sizes] = {
    "full": Sizes(300_000, 200, 20, True),
    "quick": Sizes(100_000, 200, 10, False),
    "tiny": Sizes(6_000, 2_000, 2, False),  # 12 MB: three row groups when bounded
}


def topic_rows(start: int, n: int, value_bytes: int) -> pa.Table:
    """Rows of partition 0 as the flusher writes them; values are hex text that barely compresses."""
    now = time.time_ns() // 1000
    columns = {
        "partition": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(start, start + n), pa.int64()),
        "timestamp": pa.array([now] * n, pa.timestamp("us", tz="UTC")),
        "key": pa.array([f"user-{i % 50}" for i in range(start, start + n)], pa.string()),
        "value": pa.array([os.urandom(value_bytes // 2).hex().encode() for _ in range(n)], pa.binary()),
        "format": pa.array(["text"] * n, pa.string()),
    }
    return pa.table({f.name: columns.get(f.name, pa.nulls(n, f.type)) for f in TOPIC_SCHEMA}, schema=TOPIC_SCHEMA)


@dataclass
class Variant:
    name: str
    uri: str
    path: str = ""  # the partition's one data file
    row_groups: int = 0
    file_mb: float = 0.0
    groups_read: int = 0
    rows_decoded: int = 0
    mb_read: float = 0.0
    read_ms: list[float] | None = None
    scan_ms: float = 0.0
    baseline: Variant | None = None  # the same writer's one-row-group file

    @property
    def median_ms(self) -> float:
        return statistics.median(self.read_ms or [0.0])


def _one_file(uri: str) -> str:
    """The table's one live data file (compaction leaves the files it replaced until a VACUUM)."""
    [path] = delta.load(uri).file_uris()
    return str(path).removeprefix("file://")


def write_one_group(uri: str, data: pa.Table) -> None:
    table = ensure_topic_table(uri)
    write_deltalake(table, data, mode="append",
                    writer_properties=WriterProperties(compression="SNAPPY", max_row_group_size=data.num_rows))


def write_bounded(uri: str, data: pa.Table) -> None:
    delta.append_partitions(ensure_topic_table(uri), {0: data}, txns={delta.partition_app_id(0): data.num_rows})


def write_by_compaction(block_size: int | None) -> Callable[[str, pa.Table], None]:
    """Ten flush commits, then the compaction job (one bin: one file), at Spark's `parquet.block.size`
    of `block_size` (None: the session's own, ROW_GROUP_BYTES)."""

    def write(uri: str, data: pa.Table) -> None:
        from lakebroker.spark_pipeline.jobs.compaction import compact_table
        from lakebroker.tables.job_runs import TableResult

        spark = _spark()
        table = ensure_topic_table(uri)
        step = -(-data.num_rows // 10)
        for start in range(0, data.num_rows, step):
            delta.append_partitions(table, {0: data.slice(start, step)},
                                    txns={delta.partition_app_id(0): start + step})
            table.update_incremental()
        if block_size is not None:
            spark.conf.set("parquet.block.size", str(block_size))
        try:
            compact_table(spark, uri, TableResult("bench", None), order_column="offset", target_bytes=1 << 40,
                          min_files=2, run_id="bench")
        finally:
            spark.conf.unset("parquet.block.size")

    return write


def _spark() -> SparkSession:
    from lakebroker.spark_pipeline.session import build_spark_session
    from lakebroker.tables.user_cache import jars_dir

    spark: SparkSession = build_spark_session(master="local[2]", jars_dir=jars_dir(),
                                              app_name="lakebroker-bench-reads")
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def describe(variant: Variant, rows: int) -> None:
    """The file's shape, and what one read of READ rows from its middle decoded."""
    variant.path = _one_file(variant.uri)
    metadata = pq.ParquetFile(variant.path).metadata
    variant.row_groups = metadata.num_row_groups
    variant.file_mb = os.path.getsize(variant.path) / 1e6
    tail = TopicLogTail(variant.uri)
    tail.refresh()
    recorder = ReadRecorder(tail.fs)
    tail.fs = recorder.filesystem()
    got = tail.read(0, rows // 2, rows // 2 + READ)
    assert sorted(got["offset"].to_pylist()) == list(range(rows // 2, rows // 2 + READ)), variant.name
    touched = recorder.row_groups_read(variant.path)
    variant.groups_read = len(touched)
    variant.rows_decoded = sum(metadata.row_group(i).num_rows for i in touched)
    variant.mb_read = sum(n for _, n in recorder.ranges[variant.path]) / 1e6


def read_variants(rows: int, value_bytes: int, reads: int, work: Path, spark: bool = False) -> list[Variant]:
    data = topic_rows(0, rows, value_bytes)
    mib = ROW_GROUP_BYTES >> 20
    writers: list[tuple[str, Callable[[str, pa.Table], None]]] = [  # pairs: a baseline, then the bounded file
        ("delta-rs, one row group (as Spark's default 128 MB `parquet.block.size` writes it)", write_one_group),
        (f"the flusher's writer, row groups of {mib} MiB (`tables.delta.append_partitions`)", write_bounded),
    ]
    if spark:
        writers += [("compaction job, Spark's default 128 MB row groups", write_by_compaction(SPARK_DEFAULT_BLOCK)),
                    (f"compaction job, {mib} MiB row groups (the session's conf)", write_by_compaction(None))]
    variants: list[Variant] = []
    for i, (name, write) in enumerate(writers):
        variant = Variant(name, str(work / f"v{i}"), read_ms=[], baseline=variants[-1] if i % 2 else None)
        write(variant.uri, data)
        describe(variant, rows)
        variants.append(variant)
    tails = []
    for variant in variants:
        tail = TopicLogTail(variant.uri)
        tail.refresh()
        tails.append(tail)
    for k in range(reads):  # interleaved, and in turn reversed: the machine's drift falls on every variant
        order = list(zip(variants, tails, strict=True))
        for variant, tail in order if k % 2 == 0 else reversed(order):
            began = time.perf_counter()
            tail.read(0, rows // 2, rows // 2 + READ)
            assert variant.read_ms is not None
            variant.read_ms.append((time.perf_counter() - began) * 1000)
    for variant in variants:
        scans = []
        for _ in range(3):
            began = time.perf_counter()
            pq.read_table(variant.path)
            scans.append((time.perf_counter() - began) * 1000)
        variant.scan_ms = statistics.median(scans)
    return variants


def result(variants: list[Variant], sizes: Sizes) -> Result:
    mib = ROW_GROUP_BYTES >> 20
    pairs = [(v, v.baseline) for v in variants if v.baseline is not None]
    checks, notes = [], []
    for v, b in pairs:
        by = v.name.split(",")[0]
        checks.append(Check(f"row groups a {READ:,}-row read decodes, {mib} MiB row groups by {by}", v.groups_read,
                            "row groups", MAX_GROUPS_READ, higher_is_better=False,
                            baseline=f"{b.groups_read} of {b.row_groups} ({b.rows_decoded:,} rows) in one row group"))
        notes.append(f"Written by {by} with row groups of {mib} MiB, the read decoded {v.rows_decoded:,} rows "
                     f"({v.mb_read:.1f} MB read) in {v.median_ms:.1f} ms; in one row group, {b.rows_decoded:,} rows "
                     f"({b.mb_read:.1f} MB) in {b.median_ms:.1f} ms: {b.median_ms / v.median_ms:.0f}x the time. A full "
                     f"scan of the file takes {v.scan_ms:.0f} ms and {b.scan_ms:.0f} ms.")
    v, b = pairs[0]
    return Result(
        scenario="read_amplification",
        checks=checks,
        headlines=[f"a {READ:,}-row read decodes {v.rows_decoded:,} rows ({v.mb_read:.1f} MB) with {mib} MiB row "
                   f"groups, {b.rows_decoded:,} ({b.mb_read:.1f} MB) with one: {v.median_ms:.1f} against "
                   f"{b.median_ms:.1f} ms"],
        tables=[table(f"Reading {READ:,} rows from the middle of one partition's one file ({sizes.rows:,} rows of "
                      f"{sizes.value_bytes}-byte values) through `TopicLogTail.read`, median of {sizes.reads} reads:",
                      ["file written by", "size", "row groups", "decoded by the read", "read from disk", "read time",
                       "full scan of the file"],
                      [[x.name, f"{x.file_mb:.1f} MB", x.row_groups, f"{x.groups_read} row group(s), "
                        f"{x.rows_decoded:,} rows", f"{x.mb_read:.1f} MB", f"{x.median_ms:.1f} ms"
                        + ("" if x.baseline is None else
                           f" ({x.baseline.median_ms / x.median_ms:.0f}x less than one row group)"),
                        f"{x.scan_ms:.0f} ms"] for x in variants])],
        notes=notes,
        figures={"variants": [{"name": x.name, "row_groups": x.row_groups, "file_mb": x.file_mb,
                               "groups_read": x.groups_read, "rows_decoded": x.rows_decoded, "mb_read": x.mb_read,
                               "read_ms": x.read_ms, "median_ms": x.median_ms, "scan_ms": x.scan_ms,
                               "baseline": None if x.baseline is None else x.baseline.name} for x in variants]},
    )


def measure(mode: Mode, work: Path) -> Result:
    sizes = SIZES[mode]
    return result(read_variants(sizes.rows, sizes.value_bytes, sizes.reads, work, spark=sizes.spark), sizes)


_FULL = SIZES["full"]
_MIB = ROW_GROUP_BYTES >> 20
SCENARIO = Scenario(
    name="read_amplification", title="Delivery reads from compacted files", measure=measure,
    setup="One partition's rows as one file, as compaction leaves a busy partition (it bin-packs up to "
          "`compaction_target_file_bytes`, 128 MB), written several ways in the same run: by delta-rs as one row "
          "group (what Spark's default `parquet.block.size` of 128 MB makes of any compacted file up to 128 MB), "
          f"and in row groups of `ROW_GROUP_BYTES` ({_MIB} MiB, tables/parquet_files.py) by "
          "`tables.delta.append_partitions`, the flusher's writer (pyarrow), which sizes them in rows from each "
          "batch's Arrow bytes; in a full run also by the "
          "compaction job (Spark local[2]) from ten flush files, at 128 MB and at the session's "
          f"`parquet.block.size` of {_MIB} MiB, which counts encoded bytes.",
    load=f"{_FULL.rows:,} rows of {_FULL.value_bytes}-byte hex values (quick: {SIZES['quick'].rows:,}, without "
         f"the compaction job's files). {_FULL.reads} reads of each file of {READ:,} offsets from its middle through "
         "`TopicLogTail.read`, as a delivery worker reads a partition, the files taken in turn and in alternating "
         "order; then 3 full scans of each file (`pyarrow.parquet.read_table`).",
    metric="The row groups, rows and bytes the read fetched (byte ranges recorded under the filesystem, "
           "tests/file_reads.py, mapped to row groups) and its median time, beside a full scan's.",
    target=f"With row groups of {_MIB} MiB, a {READ:,}-row read decodes at most the {MAX_GROUPS_READ} row groups "
           "that can hold its offsets. No target on time: times move with the machine's load, the counts do not.",
)
