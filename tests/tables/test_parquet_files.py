"""A delivery read of a few offsets decodes only the row groups that hold them: writers bound the
row groups (tables/parquet_files.py), and the tail's read prunes them by their offset statistics.
The flusher's files store offsets delta-encoded, read back exact, and are logged with the
statistics delta-rs would give them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lakebroker.tables import delta
from lakebroker.tables.log_tail import TopicLogTail
from lakebroker.tables.parquet_files import ROW_GROUP_BYTES
from lakebroker.tables.schemas import TOPIC_SCHEMA
from lakebroker.tables.topics import ensure_topic_table
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


def _rows(partition: int, n: int, seconds: int) -> pa.Table:
    """Rows of every column kind: keys with nulls, non-ASCII and repeats, timestamps on whole
    seconds and between milliseconds, headers, and columns that are all null."""
    base = 1_795_909_900_000_000 + seconds * 1_000_000
    return pa.table({
        "partition": pa.array([partition] * n, pa.int32()),
        "offset": pa.array(range(100, 100 + n), pa.int64()),
        "timestamp": pa.array([base + (0 if i == 0 else i * 997) for i in range(n)], pa.timestamp("us", tz="UTC")),
        "key": pa.array([None if i % 4 == 0 else f"ключ-{i % 13}" for i in range(n)], pa.string()),
        "value": pa.array([None if i == 5 else os.urandom(20) for i in range(n)], pa.binary()),
        "format": pa.array(["binary" if i % 2 else "json" for i in range(n)], pa.string()),
        "headers": pa.array([[("h", str(i))] if i % 3 else None for i in range(n)], pa.map_(pa.string(), pa.string())),
        "message_id": pa.array([f"id-{i}" if partition else None for i in range(n)], pa.string()),
        "producer_id": pa.array([None] * n, pa.string()),
        "sequence": pa.array([i if partition else None for i in range(n)], pa.int64()),
    }, schema=TOPIC_SCHEMA)


def _adds(uri: str) -> dict[str, dict[str, Any]]:
    """Each partition's add action in the table's log, by partition value."""
    adds = {}
    for commit in sorted(Path(uri, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                adds[action["add"]["partitionValues"]["partition"]] = action["add"]
    return adds


def test_the_flushers_files_are_logged_with_the_statistics_delta_rs_gives_the_same_rows(tmp_path: Path) -> None:
    """The flusher writes its files with pyarrow and logs them itself: their statistics must be
    the ones delta-rs writes for the same rows, which delta-rs and Spark prune files by."""
    parts = {0: _rows(0, 3000, 0), 1: _rows(1, 50, 7), 2: _rows(2, 1, 9)}
    ours, theirs = ensure_topic_table(str(tmp_path / "ours")), ensure_topic_table(str(tmp_path / "theirs"))
    txns = {delta.partition_app_id(p): 100 + rows.num_rows for p, rows in parts.items()}
    before = ours.version()
    delta.append_partitions(ours, parts, txns=txns)
    delta.append(theirs, pa.concat_tables(parts.values()), txns=txns)
    assert ours.version() == before + 1  # the handle is at its commit, as write_deltalake leaves it

    mine, delta_rs = _adds(str(tmp_path / "ours")), _adds(str(tmp_path / "theirs"))
    assert mine.keys() == delta_rs.keys() == {"0", "1", "2"}
    for p in mine:
        assert json.loads(mine[p]["stats"]) == json.loads(delta_rs[p]["stats"]), p
        assert mine[p]["path"].startswith(f"partition={p}/") and mine[p]["path"].endswith(".snappy.parquet")
        assert mine[p]["size"] == (tmp_path / "ours" / mine[p]["path"]).stat().st_size
        assert mine[p]["dataChange"] is True
    stored = delta.load(str(tmp_path / "ours"))
    assert stored.to_pyarrow_table().sort_by([("partition", "ascending"), ("offset", "ascending")]) \
        .equals(pa.concat_tables(parts.values()))
    assert {p: stored.transaction_version(app) for app, p in ((delta.partition_app_id(p), p) for p in parts)} \
        == {p: 100 + rows.num_rows for p, rows in parts.items()}
    last = sorted(Path(tmp_path, "ours", "_delta_log").glob("*.json"))[-1].read_text().splitlines()
    assert sorted(next(iter(json.loads(line))) for line in last) == ["add", "add", "add", "commitInfo",
                                                                     "txn", "txn", "txn"]  # no metadata change
    # Pruned by those statistics: a read of offsets past partition 0's file opens none of it.
    assert delta.read_offset_range(stored, 0, 3100, 3200).num_rows == 0
    assert delta.read_offset_range(stored, 0, 150, 160)["offset"].to_pylist() == list(range(150, 160))


def test_a_key_longer_than_parquets_statistics_is_still_bounded_as_delta_rs_bounds_it(tmp_path: Path) -> None:
    """Parquet keeps no min/max for a value over its statistics size (4 KiB). delta-rs's reader
    takes a column logged without bounds for one bounded by null, and skips the file for any
    filter on it: the bounds are computed from the rows instead, as delta-rs logs them."""
    rows = _rows(0, 10, 0)
    long_key = "z" * 5000
    rows = rows.set_column(rows.schema.get_field_index("key"), rows.schema.field("key"),
                           pa.array(["a"] * 9 + [long_key], pa.string()))
    table = ensure_topic_table(str(tmp_path / "t"))
    delta.append_partitions(table, {0: rows})
    theirs = ensure_topic_table(str(tmp_path / "theirs"))
    delta.append(theirs, rows)
    stats = json.loads(_adds(str(tmp_path / "t"))["0"]["stats"])
    assert stats == json.loads(_adds(str(tmp_path / "theirs"))["0"]["stats"])
    assert (stats["minValues"]["key"], stats["maxValues"]["key"]) == ("a", long_key)
    found = delta.read_rows(delta.load(str(tmp_path / "t")), pc.field("key") == long_key, ["offset"])
    assert found["offset"].to_pylist() == [109]


def test_commits_one_after_another_on_one_handle(tmp_path: Path) -> None:
    """Each commit plans on the handle the one before left: a handle left at its old version would
    plan the next commit against a log that lacks the last one, whose txns then conflict."""
    table = ensure_topic_table(str(tmp_path / "t"))
    for n in range(1, 4):
        delta.append_partitions(table, {0: _rows(0, 5, n)}, txns={delta.partition_app_id(0): 100 * n})
    stored = delta.load(str(tmp_path / "t"))
    assert stored.transaction_version(delta.partition_app_id(0)) == 300
    assert stored.to_pyarrow_table().num_rows == 15


def test_a_flush_file_leaves_no_footer_for_the_garbage_collector(tmp_path: Path) -> None:
    """serve raises the collector's thresholds and freezes its start-up objects, so a full collection
    is rare: a written file's Parquet footer must be freed when the write returns, not left in a
    reference cycle holding its native memory (about 20 KB a file) until one."""
    import gc

    from lakebroker.tables.parquet_files import write_partition_file

    fs, root = pafs.LocalFileSystem(), str(tmp_path)
    gc.collect()
    gc.disable()
    try:
        written = [write_partition_file(fs, root, "partition", p, _rows(p, 500, 0)) for p in range(3)]
        # type(), not isinstance(): a lazy proxy among the objects (Airflow's) would import on __class__
        footers = [o for o in gc.get_objects() if type(o) in (pq.FileMetaData, pq.ParquetSchema)]
    finally:
        gc.enable()
    assert footers == []
    assert all(json.loads(w.stats)["numRecords"] == 500 for w in written)
