"""A delivery read of a few offsets decodes only the row groups that hold them: writers bound the
row groups (tables/parquet_files.py), and the tail's read prunes them by their offset statistics.
The flusher's files store offsets delta-encoded, and read back exact."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq

from lakebroker.tables.log_tail import TopicLogTail
from lakebroker.tables.parquet_files import ROW_GROUP_BYTES
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


def test_a_flush_file_stores_its_offsets_delta_encoded(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    create_topic(settings, "t", partitions=1)
    produce(settings, "t", 0, 20_000, values=[b"x" * 10] * 20_000)
    [path] = [str(p) for p in (tmp_path / "topics" / "t").rglob("*.parquet")]
    file = pq.ParquetFile(path)
    offsets = file.metadata.schema.to_arrow_schema().get_field_index("offset")
    for i in range(file.metadata.num_row_groups):
        column = file.metadata.row_group(i).column(offsets)
        assert "DELTA_BINARY_PACKED" in column.encodings and "RLE_DICTIONARY" not in column.encodings, column
        assert column.statistics.has_min_max  # what row-group pruning reads
    assert file.read(columns=["offset"]).column(0).to_pylist() == list(range(20_000))
    # 20,000 dense offsets in a few bytes, where plain 8-byte values took ~160 KB before compression
    assert sum(file.metadata.row_group(i).column(offsets).total_compressed_size
               for i in range(file.metadata.num_row_groups)) < 4_000
