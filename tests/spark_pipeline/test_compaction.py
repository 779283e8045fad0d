"""Compaction on real topic tables, while the ingest side keeps appending through delta-rs."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakebroker.spark_pipeline.jobs import compaction
from lakebroker.tables import delta
from lakebroker.tables.job_runs import Outcome
from lakebroker.tables.layout import Layout
from lakebroker.tables.parquet_files import ROW_GROUP_BYTES
from tests.spark_pipeline.topics import (
    ConcurrentFlusher,
    commit_infos,
    create_topic,
    file_count,
    log_ends,
    offsets_by_partition,
    produce,
    settings_for,
    table,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _ranges(settings: Any, topic: str) -> dict[int, list[tuple[int, int]]]:
    t = table(settings, topic)
    actions = pa.table(t.get_add_actions(flatten=True)).to_pylist()
    out: dict[int, list[tuple[int, int]]] = {}
    for a in actions:
        out.setdefault(a["partition.partition"], []).append((a["min.offset"], a["max.offset"]))
    return {p: sorted(v) for p, v in out.items()}


def test_compaction_under_concurrent_appends_loses_and_duplicates_nothing(spark: Any, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data", compaction_target_file_bytes=40_000)
    create_topic(settings, "orders", partitions=2)
    for i in range(30):
        produce(settings, "orders", i % 2, 40)
    files_before = file_count(settings, "orders")
    assert files_before == 30

    with ConcurrentFlusher(settings, "orders", 25) as flusher:
        first = compaction.run(spark, settings, "orders")
        second = compaction.run(spark, settings, "orders")
    appended = flusher.appended
    assert not flusher.alive and not flusher.errors, flusher.errors
    assert first.outcome is Outcome.OK, first.public()
    assert second.outcome is Outcome.OK, second.public()
    assert len(appended) >= 5, "the writer must really have run during compaction"

    # No row lost or duplicated: each partition holds exactly 0..end-1, once.
    ends = log_ends(settings, "orders", 2)
    assert all(e is not None for e in ends.values())
    offsets = offsets_by_partition(settings, "orders")
    for p in (0, 1):
        assert offsets[p] == list(range(ends[p] or 0)), f"partition {p}"
    # And each txn log-end is the last one the writer committed.
    for p in (0, 1):
        assert ends[p] == max(end for q, _, end, _ in appended if q == p)

    # No commit lost: every flusher commit is in the log, and versions are contiguous.
    uri = Layout(settings.data_dir).topic_table("orders")
    infos = commit_infos(uri)
    versions = [v for v, _ in infos]
    assert versions == list(range(versions[0], versions[-1] + 1))
    flushes = [c for _, c in infos if c.get("lakebroker.operation") == "flush"]
    assert len(flushes) == 30 + len(appended)
    optimizes = [(v, c) for v, c in infos if c["operation"] == "OPTIMIZE"]
    assert optimizes and all(c["tags"]["lakebroker.job"] == "compaction" for _, c in optimizes)
    assert all(c["isolationLevel"] == "SnapshotIsolation" for _, c in optimizes)
    # The race happened: some OPTIMIZE committed past versions the flusher wrote meanwhile.
    assert any(c["readVersion"] < v - 1 for v, c in optimizes), optimizes

    # Fewer files, and each partition's files still hold disjoint ascending offset ranges.
    table_result = first.table("orders")
    assert table_result.files_before is not None and table_result.files_after is not None
    # (files_after also counts what the writer appended during the run, so compare the rewrite itself:
    # under load the writer can add more files than compaction removes.)
    assert table_result.details["bins"] >= 2
    assert table_result.details["files_rewritten"] > table_result.details["bins"]
    for p, ranges in _ranges(settings, "orders").items():
        for (lo1, hi1), (lo2, _) in itertools.pairwise(ranges):
            assert lo1 <= hi1 < lo2, (p, ranges)


def test_compaction_is_idempotent_and_sorted(spark: Any, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data", compaction_target_file_bytes=1_000_000)
    create_topic(settings, "t", partitions=1)
    for _ in range(12):
        produce(settings, "t", 0, 10)
    first = compaction.run(spark, settings, "t")
    assert first.table("t").files_after == 1
    version = table(settings, "t").version()
    again = compaction.run(spark, settings, "t")
    assert again.outcome is Outcome.OK
    assert again.table("t").details["commits"] == 0
    assert again.table("t").files_after == 1
    t = table(settings, "t")
    assert t.version() == version  # nothing to do: no commit at all (a checkpoint is not a commit)
    # The one file is sorted by offset (the file's row order, not just its statistics).
    path = Path(t.table_uri.removeprefix("file://")) / t.file_uris()[0].split("/t/", 1)[1]
    import pyarrow.parquet as pq

    assert pq.read_table(path, columns=["offset"]).column("offset").to_pylist() == list(range(120))


def test_checkpoint_and_log_cleanup_keep_txns(spark: Any, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data", compaction_target_file_bytes=1_000_000)
    create_topic(settings, "t", partitions=2)
    t = table(settings, "t")
    t.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    for i in range(14):
        produce(settings, "t", i % 2, 5)
    uri = Layout(settings.data_dir).topic_table("t")
    ends = log_ends(settings, "t", 2)
    # Delta expires log files by modification time, rounded down to whole days: age them.
    two_days_ago = time.time() - 2 * 86400
    for f in (Path(uri) / "_delta_log").glob("*.json"):
        os.utime(f, (two_days_ago, two_days_ago))
    result = compaction.run(spark, settings, "t")
    version = result.table("t").details["checkpoint_version"]
    log_dir = Path(uri) / "_delta_log"
    assert (log_dir / f"{version:020d}.checkpoint.parquet").exists()
    remaining = sorted(int(p.name[:20]) for p in log_dir.glob("*.json"))
    assert remaining and remaining[0] >= version  # commits before the checkpoint were cleaned up
    fresh = table(settings, "t")
    assert log_ends(settings, "t", 2) == ends
    assert fresh.to_pyarrow_table().num_rows == 70
    # The flusher's next commit still sees its log end.
    assert produce(settings, "t", 0, 1) == (ends[0], (ends[0] or 0) + 1)
    assert delta.txn_version(table(settings, "t"), delta.partition_app_id(1)) == ends[1]


def test_a_concurrent_job_on_the_same_files_conflicts_and_compaction_replans(spark: Any, tmp_path: Path) -> None:
    from lakebroker.spark_pipeline.delta_txn import DeltaConflict, DeltaTxn
    from lakebroker.spark_pipeline.jobs.common import rewrite_bin

    settings = settings_for(tmp_path / "data", compaction_target_file_bytes=1_000_000)
    create_topic(settings, "t", partitions=1)
    for _ in range(4):
        produce(settings, "t", 0, 10)
    uri = Layout(settings.data_dir).topic_table("t")
    compacting = DeltaTxn(spark, uri)
    files = sorted(compacting.files(), key=lambda f: f.min_offset or 0)
    adds, removes = rewrite_bin(compacting, files, "offset", data_change=False)
    # Meanwhile retention removes the oldest file, and the flusher appends.
    retaining = DeltaTxn(spark, uri)
    retaining.commit(retaining.removes(files[:1], data_change=True), retaining.delete_op(["offset < 10"]))
    produce(settings, "t", 0, 10)
    with pytest.raises(DeltaConflict):
        compacting.commit(adds + removes, compacting.optimize_op([]))
    # The job re-plans from a fresh snapshot: no row comes back, none is lost.
    result = compaction.run(spark, settings, "t")
    assert result.outcome is Outcome.OK and result.table("t").files_after == 1
    assert offsets_by_partition(settings, "t") == {0: list(range(10, 50))}


def test_compacted_files_are_written_in_row_groups_a_reader_can_skip(spark: Any, tmp_path: Path) -> None:
    """Spark's default row group is 128 MB: a compacted file would be one, and a delivery read of
    1,000 rows would decode all of it."""
    import pyarrow.parquet as pq

    settings = settings_for(tmp_path / "data")
    create_topic(settings, "t", partitions=1)
    for _ in range(3):  # ~4 MB each, of values that do not compress
        produce(settings, "t", 0, 16_000, values=[os.urandom(256) for _ in range(16_000)])
    result = compaction.run(spark, settings, "t")
    assert result.table("t").files_after == 1
    t = table(settings, "t")
    path = Path(t.table_uri.removeprefix("file://")) / t.file_uris()[0].split("/t/", 1)[1]
    metadata = pq.ParquetFile(path).metadata
    sizes = [metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups)]
    assert len(sizes) >= 3 and max(sizes) <= 1.1 * ROW_GROUP_BYTES, sizes
    assert pq.read_table(path, columns=["offset"]).column("offset").to_pylist() == list(range(48_000))
