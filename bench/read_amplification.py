"""What a delivery read of 1,000 offsets decodes from a partition that compaction made one large file.

A delivery worker reads a partition's next offsets through `TopicLogTail.read`: the log's offset
statistics pick the files, and the offset filter reaches pyarrow's Parquet reader, which skips the
row groups whose statistics miss the range but decodes every row group it keeps whole. This writes
one partition's rows (300,000 of 200-byte values in a full run) as one file, several ways in the
same run, and reads 1,000 rows from the middle of each through `TopicLogTail.read`:

- one row group: what Spark's default `parquet.block.size` (128 MB) makes of every compacted file
  up to 128 MB;
- row groups of `tables.row_groups.ROW_GROUP_BYTES`, written by `tables.delta.append` (the flusher's
  writer, so delta-rs's);
- in a full run (or with `--spark`), the compaction job's own output from ten flush files, at Spark's 128 MB and at the
  session's ROW_GROUP_BYTES (spark_pipeline/session.py).

For each: the row groups and rows the read decoded (the byte ranges it read, recorded under the
filesystem: tests/file_reads.py), its median time over 20 reads (the variants interleaved),
and a full scan of the file for comparison.

    .venv/bin/python -m bench.read_amplification            # full: writes docs/benchmarks-reads.md
    .venv/bin/python -m bench.read_amplification --quick    # no Spark, smaller; only printed
    .venv/bin/python -m bench.read_amplification --rows 1000000 --value-bytes 40 [--reads 20] [--spark]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import WriterProperties, write_deltalake

from lakebroker.tables import delta
from lakebroker.tables.log_tail import TopicLogTail
from lakebroker.tables.row_groups import ROW_GROUP_BYTES
from lakebroker.tables.schemas import TOPIC_SCHEMA
from lakebroker.tables.topics import ensure_topic_table
from tests.file_reads import ReadRecorder

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

READ = 1000  # rows a delivery read takes at most (delivery_worker/reader.py READ_AHEAD)
SPARK_DEFAULT_BLOCK = 128 * 1024 * 1024
FRAGMENT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks-reads.md"


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
    delta.append(ensure_topic_table(uri), data, txns={delta.partition_app_id(0): data.num_rows})


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
            delta.append(table, data.slice(start, step), txns={delta.partition_app_id(0): start + step})
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
    from lakebroker.spark_pipeline.session import DEFAULT_JARS_DIR, build_spark_session

    spark = build_spark_session(master="local[2]", jars_dir=DEFAULT_JARS_DIR, app_name="lakebroker-bench-reads")
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


def measure(rows: int, value_bytes: int, reads: int, work: Path, spark: bool = False) -> list[Variant]:
    data = topic_rows(0, rows, value_bytes)
    mib = ROW_GROUP_BYTES >> 20
    writers: list[tuple[str, Callable[[str, pa.Table], None]]] = [  # pairs: a baseline, then the bounded file
        ("delta-rs, one row group (as Spark's default 128 MB `parquet.block.size` writes it)", write_one_group),
        (f"delta-rs, row groups of {mib} MiB (`tables.delta.append`)", write_bounded),
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


def report(variants: list[Variant], rows: int, value_bytes: int, reads: int) -> str:
    lines = [f"Reading {READ:,} rows from the middle of one partition's one file ({rows:,} rows of "
             f"{value_bytes}-byte values) through `TopicLogTail.read`, median of {reads} reads:", "",
             "| file written by | size | row groups | decoded by the read | read from disk | read time "
             "| full scan of the file |",
             "|---|---|---|---|---|---|---|"]
    for v in variants:
        than = "" if v.baseline is None else f" ({v.baseline.median_ms / v.median_ms:.0f}x less than one row group)"
        lines.append(f"| {v.name} | {v.file_mb:.1f} MB | {v.row_groups} | {v.groups_read} row group(s), "
                     f"{v.rows_decoded:,} rows | {v.mb_read:.1f} MB | {v.median_ms:.1f} ms{than} "
                     f"| {v.scan_ms:.0f} ms |")
    return "\n".join(lines)


def fragment(table: str, mode: str) -> str:
    """The section of docs/benchmarks.md around the report's table."""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""# Delivery reads from compacted files

Generated by `python -m bench.read_amplification` ({mode} mode) at {when}, on the shared 2-core machine.
A delivery worker reads a partition's next offsets (up to {READ:,}) through `TopicLogTail.read`: the log's
offset statistics choose the files, and the offset filter goes down to pyarrow's Parquet reader,
which skips every row group whose offset statistics miss the range and decodes each one it keeps
whole. Here a partition is one file, as compaction leaves a busy partition (it bin-packs up to
`compaction_target_file_bytes`, 128 MB), and the read takes {READ:,} rows from its middle. The counts are
of what the read fetched (byte ranges recorded under the filesystem, mapped to row groups); the
times are medians, the variants read in turn.

{table}

Both writers bound row groups at `ROW_GROUP_BYTES` ({ROW_GROUP_BYTES >> 20} MiB, tables/row_groups.py): the Spark
jobs through the session's `parquet.block.size`, which counts encoded bytes, and delta-rs (the
flusher) through `max_row_group_size`, in rows sized from each batch's Arrow bytes. At Spark's
default of 128 MB, every compacted file up to 128 MB is one row group, and a {READ:,}-row read decodes
all of it (the first and third rows). A full scan of the file (`pyarrow.parquet.read_table`, the
last column) takes about as long either way. The tail's lock is held only while a read is planned
from its log index; the files are read and decoded outside it, so the other pipelines on the table
keep polling meanwhile. Times move with the machine's load; the counts do not.
"""


def run(quick: bool) -> str:
    """The section; a full run (the compaction job's files too) also writes it to docs/benchmarks-reads.md."""
    rows, reads = (100_000, 10) if quick else (300_000, 20)
    with tempfile.TemporaryDirectory(prefix="lakebroker-read-amplification-") as work:
        variants = measure(rows, 200, reads, Path(work), spark=not quick)
    markdown = fragment(report(variants, rows, 200, reads), "quick" if quick else "full")
    if not quick:
        FRAGMENT.write_text(markdown)
    return markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.read_amplification", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 rows, no Spark; the section is only printed")
    parser.add_argument("--rows", type=int, help="rows in the file (only printed, like --quick)")
    parser.add_argument("--value-bytes", type=int, default=200, help="bytes of each value (with --rows)")
    parser.add_argument("--reads", type=int, default=20, help="timed reads of each file (with --rows)")
    parser.add_argument("--spark", action="store_true", help="with --rows: the compaction job's files too")
    args = parser.parse_args(argv)
    if args.rows is None:
        print(run(args.quick))
        return 0
    if not 2 * READ <= args.rows <= 5_000_000 or not 2 <= args.value_bytes <= 100_000 or not 1 <= args.reads <= 1000:
        parser.error(f"--rows: {2 * READ}..5,000,000; --value-bytes: 2..100,000; --reads: 1..1,000")
    with tempfile.TemporaryDirectory(prefix="lakebroker-read-amplification-") as work:
        variants = measure(args.rows, args.value_bytes, args.reads, Path(work), spark=args.spark)
    print(report(variants, args.rows, args.value_bytes, args.reads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
