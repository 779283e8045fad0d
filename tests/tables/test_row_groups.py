"""A delivery read of a few offsets decodes only the row groups that hold them: writers bound the
row groups (tables/row_groups.py), and the tail's read prunes them by their offset statistics."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq

from lakebroker.tables.log_tail import TopicLogTail
from lakebroker.tables.row_groups import ROW_GROUP_BYTES
from tests.file_reads import ReadRecorder
from tests.spark_pipeline.topics import create_topic, produce, settings_for, table

ROWS = 60_000  # of 200-byte values: one flush of ~13 MB, as a busy topic's flusher commits


def test_a_large_flush_is_read_a_few_row_groups_at_a_time(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    create_topic(settings, "t", partitions=1)
    produce(settings, "t", 0, ROWS, values=[os.urandom(100).hex().encode() for _ in range(ROWS)])
    [path] = [str(p) for p in (tmp_path / "topics" / "t").rglob("*.parquet")]
    metadata = pq.ParquetFile(path).metadata
    groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
    assert len(groups) >= 3 and max(g.total_byte_size for g in groups) <= 1.1 * ROW_GROUP_BYTES, \
        [g.total_byte_size for g in groups]

    tail = TopicLogTail(str(table(settings, "t").table_uri))
    tail.refresh()
    recorder = ReadRecorder(tail.fs)
    tail.fs = recorder.filesystem()
    start = ROWS // 2
    rows = tail.read(0, start, start + 1000)
    assert sorted(rows["offset"].to_pylist()) == list(range(start, start + 1000))

    offsets = metadata.schema.to_arrow_schema().get_field_index("offset")
    holding = [i for i, g in enumerate(groups) if g.column(offsets).statistics.min < start + 1000
               and g.column(offsets).statistics.max >= start]
    assert recorder.row_groups_read(path) == holding
    assert len(holding) <= 2, f"{len(groups)} row groups of {[g.num_rows for g in groups]} rows"
