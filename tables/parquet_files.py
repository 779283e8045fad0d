"""How the tables' Parquet files are laid out: row groups a reader can skip, and how the offset
column is encoded; and the flusher's writer of topic-table files.

Row groups. A reader skips a row group whose offset statistics miss the range it asks for
(pyarrow prunes before decoding), but never part of one: a delivery read of 1,000 offsets decodes
every row group that holds any of them. Spark's default row group is 128 MB (`parquet.block.size`),
so a compacted file would be one row group, decoded whole to read 1,000 rows from its middle.

4 MiB keeps such a read to at most two row groups of a few thousand rows each, which smaller
groups barely improve on, while each group adds footer metadata that every open parses. Scans of
whole files are as fast either way (docs/decisions/0019-parquet-layout-for-tail-reads.md).

The writers measure differently. Spark (spark_pipeline/session.py) counts a row group's encoded,
compressed bytes, so one may decode to more where values compress; delta-rs (`writer_properties`)
and the flusher's pyarrow writer (`write_partition_file`) bound rows only, so the bound becomes
rows at the batch's average Arrow (decoded) size.

The flusher's files. A flush holds each partition's rows apart already (the WAL's chunks), and
delta-rs would sort and copy every column of a commit by partition value before it wrote them, a
large part of its write. So the flusher writes each partition's file itself with pyarrow, in the
layout above, and logs it with the statistics delta-rs would have written (`file_stats`); one
delta-rs commit then adds the files with the partitions' txns (tables/delta.py `append_partitions`).

Offsets. A flush file holds each partition's offsets dense and ascending, which Parquet's
DELTA_BINARY_PACKED stores in a few bits per page. Its default, a dictionary, suits them worst:
every value is new, so the writer hashes each one until the dictionary is full and then falls
back to plain 8-byte values: CPU spent at every flush, for a column that fills most of a file of
small messages (docs/decisions/0019). Every reader of the tables decodes DELTA_BINARY_PACKED
(pyarrow, delta-rs, Spark's vectorized reader), and the column keeps the statistics that prune
row groups.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    from deltalake import WriterProperties

ROW_GROUP_BYTES = 4 * 1024 * 1024
OFFSET_COLUMN = "offset"  # in topic tables; a table without it gets no offset encoding


def writer_properties(data: pa.Table) -> WriterProperties:
    """delta-rs's Parquet settings for writing `data`: its defaults (Snappy), with row groups of
    about ROW_GROUP_BYTES of decoded rows and the offset column delta-encoded."""
    from deltalake import ColumnProperties, WriterProperties

    rows = max(1, ROW_GROUP_BYTES * data.num_rows // max(1, data.nbytes))
    # Given any properties, delta-rs drops its own default compression: Snappy is restated here.
    return WriterProperties(compression="SNAPPY", max_row_group_size=rows, column_properties={
        OFFSET_COLUMN: ColumnProperties(dictionary_enabled=False, encoding="DELTA_BINARY_PACKED"),
    })


# The message payload: nothing prunes on it, so it gets no row-group statistics, whose min/max over
# every value would cost each flush's write for nothing.
PAYLOAD_COLUMN = "value"


@dataclass(frozen=True)
class WrittenFile:
    """A data file written for a commit: what its Delta add action records."""

    path: str  # relative to the table root
    size: int
    partition_values: dict[str, str]
    stats: str  # Delta's per-file statistics JSON
    modification_time: int  # milliseconds since the epoch


def write_partition_file(fs: pafs.FileSystem, root: str, partition_column: str, value: int,
                         data: pa.Table) -> WrittenFile:
    """Write one partition's rows (without the partition column, which Delta keeps in the path and
    the log) as one Parquet file under `root`, laid out as `writer_properties` lays out delta-rs's:
    Snappy, row groups of about ROW_GROUP_BYTES, the offset column delta-encoded.

    The flusher holds each partition's rows apart already; delta-rs would sort and copy every
    column of a flush by partition value before writing."""
    import pyarrow.parquet as pq

    rows = data.drop_columns([partition_column])
    names = rows.column_names
    per_group = max(1, ROW_GROUP_BYTES * rows.num_rows // max(1, rows.nbytes))
    buffer = pa.BufferOutputStream()
    footer: list[pq.FileMetaData] = []
    pq.write_table(
        rows, buffer, row_group_size=per_group, compression="snappy",
        use_dictionary=[n for n in names if n != OFFSET_COLUMN],
        column_encoding={OFFSET_COLUMN: "DELTA_BINARY_PACKED"} if OFFSET_COLUMN in names else None,
        write_statistics=[n for n in names if n != PAYLOAD_COLUMN], metadata_collector=footer,
    )
    written = buffer.getvalue()
    relative = f"{partition_column}={value}/part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    directory = f"{root}/{partition_column}={value}"
    if fs.type_name == "local":  # object stores have no directories to make
        fs.create_dir(directory, recursive=True)
    with fs.open_output_stream(f"{root}/{relative}") as out:
        out.write(written)
    return WrittenFile(relative, written.size, {partition_column: str(value)},
                       file_stats(footer[0], rows), int(time.time() * 1000))


def file_stats(metadata: pq.FileMetaData, rows: pa.Table) -> str:
    """Delta's statistics JSON for the file of `rows`, from its Parquet footer: numRecords, and for
    each top-level column its null count, min and max. Stated as delta-rs states them (timestamps
    to the millisecond, no statistics for binary or nested columns), so both writers' files prune
    alike in delta-rs and Spark. A value over Parquet's statistics size leaves its row group
    without bounds; the column's are then computed from the rows."""
    schema = rows.schema
    minimum: dict[str, Any] = {}
    maximum: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    # Column names from a row group, not `metadata.schema`: that object and the footer refer to each
    # other, a cycle that holds the footer's native memory (~20 KB a file) until a full collection.
    columns = metadata.num_columns if metadata.num_row_groups else 0
    for j in range(columns):
        name = metadata.row_group(0).column(j).path_in_schema
        field = schema.field(name) if name in schema.names else None
        if field is None or not _stats_type(field.type):
            continue
        lows, highs, count, bounded = [], [], 0, True
        for i in range(metadata.num_row_groups):
            stats = metadata.row_group(i).column(j).statistics
            if stats is None or not stats.has_null_count:
                count = -1
                break
            count += stats.null_count
            if stats.has_min_max:
                lows.append(stats.min)
                highs.append(stats.max)
            elif stats.null_count < metadata.row_group(i).num_rows:
                bounded = False  # values without bounds (a string over the writer's statistics size)
        if count < 0:
            continue
        nulls[name] = count
        if not bounded:  # delta-rs would bound it, and its reader takes a missing bound for a null one
            bounds = pc.min_max(rows.column(name))
            lows, highs = [bounds["min"].as_py()], [bounds["max"].as_py()]
        if lows:
            minimum[name] = _json_value(min(lows))
            maximum[name] = _json_value(max(highs))
    return json.dumps({"numRecords": metadata.num_rows, "minValues": minimum, "maxValues": maximum,
                       "nullCount": nulls}, separators=(",", ":"))


def _stats_type(type_: pa.DataType) -> bool:
    return not (pa.types.is_nested(type_) or pa.types.is_binary(type_) or pa.types.is_large_binary(type_))


def _json_value(value: object) -> object:
    if isinstance(value, datetime):  # delta-rs's form: UTC, truncated to the millisecond (none if whole)
        utc = value.astimezone(UTC)
        fraction = f".{utc.microsecond // 1000:03d}" if utc.microsecond else ""
        return f"{utc:%Y-%m-%dT%H:%M:%S}{fraction}Z"
    return value
