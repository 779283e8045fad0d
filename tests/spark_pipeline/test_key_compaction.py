"""Key compaction and offsets compaction on real tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import write_deltalake

from lakebroker.spark_pipeline.jobs import key_compaction, offsets_compaction
from lakebroker.tables import delta
from lakebroker.tables.errors import InvalidRequest
from lakebroker.tables.job_runs import Outcome
from lakebroker.tables.layout import Layout
from lakebroker.tables.offsets import Fence, OffsetReason, OffsetsTable
from lakebroker.tables.topics import TopicStore, new_topic
from tests.spark_pipeline.topics import NOW_US, create_topic, log_ends, produce, rows, settings_for

pytestmark = pytest.mark.spark

MIN_US = 60_000_000


def test_key_compaction_keeps_latest_value_per_key(spark: Any, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data", key_compaction_min_lag_ms=60_000)
    create_topic(settings, "users", partitions=2, cleanup_policy="compact", tombstone_retention_ms=3_600_000)
    now = NOW_US()
    old = now - 3 * 3_600_000_000  # older than the tombstone retention
    recent = now - 10 * MIN_US  # past the min lag, younger than the tombstone retention
    # partition 0: a@0 a@1 b@2 (old) | c@3 tombstone (old) | a@4 b-tombstone@5 (recent) | a@6 (tail)
    produce(settings, "users", 0, 3, ts_us=old, keys=["a", "a", "b"], values=[b"a0", b"a1", b"b2"])
    produce(settings, "users", 0, 1, ts_us=old, keys=["c"], values=[None])
    produce(settings, "users", 0, 2, ts_us=recent, keys=["a", "b"], values=[b"a4", None])
    produce(settings, "users", 0, 3, ts_us=now, keys=["a", None, "d"], values=[b"a6", b"nokey", b"d8"])
    # partition 1: the same key as in partition 0 is a different key there (per partition)
    produce(settings, "users", 1, 2, ts_us=old, keys=["a", "a"], values=[b"x0", b"x1"])
    ends = log_ends(settings, "users", 2)

    result = key_compaction.run(spark, settings, "users")
    assert result.outcome is Outcome.OK, result.public()
    detail = result.table("users")
    kept = {(r["partition"], r["offset"]): (r["key"], r["value"]) for r in rows(settings, "users")}
    assert kept == {
        # a@0 a@1 a@4 are superseded by a@6 (a@4 is past the min lag, so it may go even though a@6
        # is still inside it); b@2 is superseded by the tombstone b@5; c@3 is a tombstone older
        # than tombstone_retention_ms and the latest of c: gone.
        (0, 5): ("b", None),  # the latest of b, younger than the tombstone retention: stays
        (0, 6): ("a", b"a6"), (0, 7): (None, b"nokey"), (0, 8): ("d", b"d8"),  # the tail is untouched
        (1, 1): ("a", b"x1"),  # keys are per partition
    }
    assert detail.rows_removed == 6
    assert detail.details["tombstones_removed"] == 1
    assert detail.details["files_dropped_whole"] == 2  # a0 a1 b2, and the c tombstone
    assert detail.details["files_rewritten"] == 2  # a4+b5 and partition 1's file
    assert log_ends(settings, "users", 2) == ends

    again = key_compaction.run(spark, settings, "users")
    assert again.table("users").rows_removed == 0
    # An hour later b's tombstone is past tombstone_retention_ms: it goes; a@6 stays the latest of a.
    later = key_compaction.run(spark, settings, "users", now=datetime.now(UTC) + timedelta(hours=1))
    assert later.table("users").rows_removed == 1
    left = {(r["partition"], r["offset"]) for r in rows(settings, "users", ["partition", "offset"])}
    assert left == {(0, 6), (0, 7), (0, 8), (1, 1)}


def test_key_compaction_refuses_delete_topics(spark: Any, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data")
    create_topic(settings, "events", partitions=1)
    with pytest.raises(InvalidRequest, match="cleanup_policy=delete"):
        key_compaction.run(spark, settings, "events")
    assert key_compaction.run(spark, settings).tables == []  # no compact topic: nothing to do


def test_offsets_compaction_keeps_latest_per_group_partition(spark: Any, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data")
    layout = Layout(settings.data_dir)
    offsets = OffsetsTable(layout)
    for n in range(1, 6):
        offsets.commit("g1", "orders", {0: n * 10, 1: n * 5}, OffsetReason.ACK)
    offsets.commit("g2", "orders", {0: 7}, OffsetReason.SEEK)
    offsets.commit("g1", "orders", {1: 3}, OffsetReason.SEEK)
    before = offsets.latest()
    result = offsets_compaction.run(spark, settings)
    table = result.table("_system/consumer_offsets")
    assert result.outcome is Outcome.OK, result.public()
    assert table.rows_removed == 12 - 3  # 5 commits of 2 rows, then 1 and 1; 3 keys
    assert table.files_after == 1
    assert OffsetsTable(layout).latest() == before
    offsets.commit("g2", "orders", {0: 8}, OffsetReason.ACK)  # still appendable by delta-rs
    assert OffsetsTable(layout).latest()[("g2", "orders", 0)] == (8, "ack")
    assert offsets_compaction.run(spark, settings).table("_system/consumer_offsets").rows_removed == 1


def test_offsets_compaction_of_a_compact_table_starts_no_spark_job(spark: Any, tmp_path: Path) -> None:
    """One file with one row per key and incarnation is left alone, decided from the log and that
    file with delta-rs; one file that holds a superseded row is still compacted by Spark."""
    settings = settings_for(tmp_path / "data")
    layout = Layout(settings.data_dir)
    offsets = OffsetsTable(layout)
    offsets.commit("g1", "orders", {0: 10, 1: 5}, OffsetReason.ACK)
    offsets.commit("g1", "orders", {0: 20}, OffsetReason.ACK)
    assert offsets_compaction.run(spark, settings).table("_system/consumer_offsets").rows_removed == 1
    offsets_compaction.run(spark, settings)  # VACUUMs the file the compaction replaced (retention 0 here)
    version = delta.load(layout.offsets_table).version()
    jobs_before = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    again = offsets_compaction.run(spark, settings).table("_system/consumer_offsets")
    assert again.details["checked_without_spark"] is True and again.rows_removed == 0
    assert again.details["rows_kept"] == 2 and delta.load(layout.offsets_table).version() == version
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(None) == jobs_before  # no Spark job ran
    # One file, but two rows for one key (as one append of a replica's stream batch can hold them).
    rows = delta.load(layout.offsets_table).to_pyarrow_table()
    (row,) = rows.filter(pc.equal(rows.column("partition"), 0)).to_pylist()
    newer = pa.Table.from_pylist([{**row, "offset": 30, "seq": (row["seq"] or 0) + 1}], schema=rows.schema)
    write_deltalake(layout.offsets_table, pa.concat_tables([rows, newer]), mode="overwrite")
    assert offsets.latest()[("g1", "orders", 0)][0] == 30
    doubled = offsets_compaction.run(spark, settings).table("_system/consumer_offsets")
    assert doubled.rows_removed == 1 and "checked_without_spark" not in doubled.details
    assert OffsetsTable(layout).latest()[("g1", "orders", 0)][0] == 30


def test_offsets_compaction_keeps_the_newest_owners_position_over_a_later_stale_commit(spark: Any,
                                                                                       tmp_path: Path) -> None:
    """The row a stale worker lands last has the newest wall clock but the older lease epoch: the
    job keeps what OffsetsTable.latest() answers, the newer owner's position (and one row for a
    deleted namesake of the topic is no rival to the current topic's)."""
    settings = settings_for(tmp_path / "data")
    layout = Layout(settings.data_dir)
    topics = TopicStore(layout)
    old = topics.create(new_topic("orders", 1))
    offsets = OffsetsTable(layout)
    offsets.commit("g", "orders", {0: 90}, OffsetReason.ACK, fence=Fence(old.topic_id, 7))
    topics.delete("orders")
    topic = topics.create(new_topic("orders", 1))
    offsets.commit("g", "orders", {0: 10}, OffsetReason.ACK, fence=Fence(topic.topic_id, 2))
    offsets.commit("g", "orders", {0: 5}, OffsetReason.ACK, fence=Fence(topic.topic_id, 1))
    assert offsets.latest() == {("g", "orders", 0): (10, "ack")}
    result = offsets_compaction.run(spark, settings)
    assert result.outcome is Outcome.OK, result.public()
    assert result.table("_system/consumer_offsets").rows_removed == 1  # the stale commit
    assert OffsetsTable(layout).latest() == {("g", "orders", 0): (10, "ack")}
