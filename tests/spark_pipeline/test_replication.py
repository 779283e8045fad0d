"""Replication to a second location: incremental, resumable, idempotent; verify-replica."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from lakebroker.spark_pipeline.jobs import key_compaction, replication, retention
from lakebroker.spark_pipeline.jobs.verify_replica import verify
from lakebroker.tables import delta
from lakebroker.tables.dead_letters import DeadLetter, DeadLetterTable
from lakebroker.tables.errors import InvalidRequest, Unauthenticated
from lakebroker.tables.job_runs import Outcome
from lakebroker.tables.layout import Layout
from lakebroker.tables.lost_offsets import LostOffsets, lost_offsets, record_loss, skip_in_table
from lakebroker.tables.offsets import OffsetReason, OffsetsTable
from lakebroker.tables.schemas import KEY_COMPACTED_PROPERTY, LOST_OFFSETS_PROPERTY
from lakebroker.tables.tokens import TokenStore
from lakebroker.tables.topics import Holes, TopicStore
from tests.spark_pipeline.topics import NOW_US, create_topic, log_ends, offsets_by_partition, produce, settings_for

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _replica_offsets(replica: Path, topic: str) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for r in DeltaTable(str(replica / "topics" / topic)).to_pyarrow_table(columns=["partition", "offset"]).to_pylist():
        out.setdefault(r["partition"], []).append(r["offset"])
    return {p: sorted(v) for p, v in out.items()}


@pytest.mark.timeout(2400)  # a long chain of Spark jobs: 20 minutes when the suite runs in parallel
def test_replicate_then_verify_after_more_produce(spark: Any, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data", key_compaction_min_lag_ms=0)
    layout = Layout(settings.data_dir)
    replica = tmp_path / "replica"
    create_topic(settings, "orders", partitions=2, retention_ms=3_600_000)
    create_topic(settings, "state", partitions=1, cleanup_policy="compact", tombstone_retention_ms=0)
    old = NOW_US() - 2 * 3_600_000_000
    produce(settings, "orders", 0, 10, ts_us=old)
    for i in range(4):
        produce(settings, "orders", i % 2, 10)
    produce(settings, "state", 0, 6, keys=["a", "b", "a", "c", "b", "a"], ts_us=old)
    OffsetsTable(layout).commit("g", "orders", {0: 3, 1: 4}, OffsetReason.ACK)
    DeadLetterTable(layout).add([DeadLetter.from_exhausted_retries("g", "orders", 0, 1, 5, 500, "boom")])
    kept, kept_text = TokenStore(layout).create(["produce"], name="kept")
    leaked, leaked_text = TokenStore(layout).create(["admin"], name="leaked")

    first = replication.run(spark, settings, to=str(replica))
    assert first.outcome is Outcome.OK, first.public()
    assert first.table("orders").details["rows_copied"] == 50
    check = verify(spark, settings, str(replica))
    assert check.ok and check.lag_messages == 0, check.problems
    assert _replica_offsets(replica, "orders") == offsets_by_partition(settings, "orders")
    # The replica carries the log ends, so it could be promoted and keep assigning offsets.
    replica_table = DeltaTable(str(replica / "topics" / "orders"))
    assert {p: replica_table.transaction_version(delta.partition_app_id(p)) for p in (0, 1)} == \
        log_ends(settings, "orders", 2)
    assert DeltaTable(str(replica / "_system" / "dead_letters")).to_pyarrow_table().num_rows == 1
    # The clients' tokens work on the replica, as they would after a failover onto it.
    on_replica = TokenStore(Layout(replica)).load()
    assert on_replica.authenticate(kept_text).token_id == kept.token_id
    assert on_replica.authenticate(leaked_text).token_id == leaked.token_id

    # More produce: verify reports the lag (explained), then a run catches up.
    produce(settings, "orders", 1, 7)
    OffsetsTable(layout).commit("g", "orders", {0: 20}, OffsetReason.ACK)
    lagging = verify(spark, settings, str(replica))
    assert lagging.ok and lagging.lag_messages == 7
    assert not verify(spark, settings, str(replica), max_lag_messages=0).ok
    TokenStore(layout).revoke(leaked.token_id)
    second = replication.run(spark, settings, to=str(replica))
    assert second.table("orders").details["rows_copied"] == 7
    with pytest.raises(Unauthenticated, match="revoked"):  # a revocation follows with the next run
        TokenStore(Layout(replica)).load().authenticate(leaked_text)
    assert TokenStore(Layout(replica)).load().authenticate(kept_text).token_id == kept.token_id
    assert verify(spark, settings, str(replica), max_lag_messages=0).ok
    # Nothing changed since: a run starts no stream and commits nothing to the replica.
    versions = {t: DeltaTable(str(replica / t)).version() for t in ("topics/orders", "topics/state",
                                                                     "_system/consumer_offsets")}
    idle = replication.run(spark, settings, to=str(replica))
    for name in ("orders", "state", "_system/consumer_offsets"):
        assert idle.table(name).details["caught_up"] is True, idle.table(name).details
        assert idle.table(name).details["batches"] == 0
    assert {t: DeltaTable(str(replica / t)).version() for t in versions} == versions

    # A crash after the replica commit but before the checkpoint's: the batch replays, and is skipped.
    produce(settings, "orders", 0, 5)
    checkpoint = Path(second.table("orders").details["checkpoint"])
    third = replication.run(spark, settings, to=str(replica))
    assert third.table("orders").details["rows_copied"] == 5
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):  # the commit marker and Hadoop's checksum of it
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    # The crashed run never got to record that it caught up: what is recorded is an older run's.
    (checkpoint / replication.CAUGHT_UP).unlink()
    replayed = replication.run(spark, settings, "orders", to=str(replica))
    assert replayed.table("orders").details["batches_skipped"] == 1
    assert replayed.table("orders").details["rows_copied"] == 0
    # Even a lost checkpoint (a fresh stream from the start) duplicates nothing.
    shutil.rmtree(checkpoint)
    fresh = replication.run(spark, settings, "orders", to=str(replica))
    assert fresh.table("orders").details["rows_copied"] == 0
    assert _replica_offsets(replica, "orders") == offsets_by_partition(settings, "orders")

    # Retention and key compaction on the primary: the replica follows.
    retention.run(spark, settings, "orders")
    key_compaction.run(spark, settings, "state")
    assert offsets_by_partition(settings, "orders")[0][0] == 10
    pending = verify(spark, settings, str(replica))
    assert pending.ok
    assert sum(c.pending_retention for c in pending.partitions) == 10
    assert sum(c.pending_compaction for c in pending.partitions) == 3
    replication.run(spark, settings, to=str(replica))
    after = verify(spark, settings, str(replica), max_lag_messages=0)
    assert after.ok, after.problems
    assert sum(c.pending_retention + c.pending_compaction for c in after.partitions) == 0
    assert _replica_offsets(replica, "orders") == offsets_by_partition(settings, "orders")
    assert _replica_offsets(replica, "state") == offsets_by_partition(settings, "state") == {0: [3, 4, 5]}

    # A replica that lost rows is a problem verify-replica reports.
    DeltaTable(str(replica / "topics" / "orders")).delete("partition = 1 AND \"offset\" = 12")
    broken = verify(spark, settings, str(replica))
    assert not broken.ok and any("lacks 1 rows" in p for p in broken.problems)
    # So is a row the primary never had (over its newest offset).
    orders = DeltaTable(str(replica / "topics" / "orders"))
    row = orders.to_pyarrow_table(filters=[("partition", "=", 0)]).slice(0, 1)
    row = row.set_column(row.schema.get_field_index("offset"), "offset", pa.array([10_000], pa.int64()))
    write_deltalake(orders, row, mode="append")
    extra = verify(spark, settings, str(replica))
    assert "orders[0]: the replica has 1 rows the primary never had" in extra.problems, extra.problems
    assert any("lacks 1 rows" in p for p in extra.problems)
    # And a system table whose copy at the same version has other rows (counted from the log).
    letters = replica / "_system" / "dead_letters"
    assert {"table": "_system/dead_letters", "rows": (1, 1)}.items() <= next(
        t for t in extra.tables if t["table"] == "_system/dead_letters").items()
    write_deltalake(str(letters), DeltaTable(str(letters)).to_pyarrow_table(), mode="append")
    assert spark.read.format("delta").load(str(letters)).count() == 2
    doubled = verify(spark, settings, str(replica))
    assert "system table dead_letters: 2 rows in the replica, 1 in the primary" in doubled.problems, doubled.problems


def test_replica_uri_validation(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with pytest.raises(InvalidRequest, match="outside the data dir"):
        replication.resolve_replica(str(data / "replica"), data)
    with pytest.raises(InvalidRequest, match="outside the data dir"):
        replication.resolve_replica(str(tmp_path), data)
    with pytest.raises(InvalidRequest, match="bad replica URI"):
        replication.resolve_replica("s3://", data)
    with pytest.raises(InvalidRequest, match="needs a target"):
        replication.resolve_replica(None, data)
    assert replication.resolve_replica(f"file://{tmp_path}/r", data).root == str(tmp_path / "r")
    assert replication.resolve_replica("s3a://bucket/lake/", data).root == "s3a://bucket/lake"


def test_replica_follows_hole_properties(spark: Any, tmp_path: Path) -> None:
    """Offsets skipped after WAL damage, and a topic turned compact after its replica was made: the
    replica gets the primary's hole properties and its log ends, so it reads (and, promoted, assigns
    offsets) as the primary does, and verify-replica holds it to that."""
    settings = settings_for(tmp_path / "data")
    layout = Layout(settings.data_dir)
    replica = tmp_path / "replica"
    create_topic(settings, "events", partitions=2)
    for p in (0, 1):
        produce(settings, "events", p, 5)
    assert replication.run(spark, settings, to=str(replica)).outcome is Outcome.OK

    # Offsets 5-7 of partition 0 lost to WAL damage and skipped, as `lakebroker wal skip` does.
    record_loss(layout, LostOffsets("events", "t", 0, 5, 7, "00000000.wal bytes 0-10", datetime.now(UTC), "test"))
    assert skip_in_table(delta.load(layout.topic_table("events")), "events", 0, 5, 7, {}, node="test", epoch=1) == 8
    lagging = verify(spark, settings, str(replica), max_lag_messages=0)
    assert any("lakebroker.lostOffsets" in p for p in lagging.problems), lagging.problems
    result = replication.run(spark, settings, to=str(replica))
    assert result.table("events").details["properties_followed"] == [LOST_OFFSETS_PROPERTY]
    assert result.table("events").details["log_ends_moved_past_lost"] == 1
    copy = DeltaTable(str(replica / "topics" / "events"))
    assert copy.transaction_version(delta.partition_app_id(0)) == 8
    assert Holes.of(copy.metadata().configuration).lost == {0: ((5, 7),)}
    assert [(x.first_offset, x.last_offset) for x in lost_offsets(Layout(replica))] == [(5, 7)]
    after = verify(spark, settings, str(replica), max_lag_messages=0)
    assert after.ok, after.problems
    # Rows after the hole copy as any others; an idle run changes nothing.
    produce(settings, "events", 0, 3)
    replication.run(spark, settings, to=str(replica))
    assert _replica_offsets(replica, "events")[0] == [0, 1, 2, 3, 4, 8, 9, 10]
    assert DeltaTable(str(replica / "topics" / "events")).transaction_version(delta.partition_app_id(0)) == 11

    # The topic turns compact: its primary table is marked, and so is the replica's.
    TopicStore(layout).update("events", cleanup_policy="compact")
    assert KEY_COMPACTED_PROPERTY in delta.load(layout.topic_table("events")).metadata().configuration
    produce(settings, "events", 1, 2)
    result = replication.run(spark, settings, to=str(replica))
    assert result.table("events").details["properties_followed"] == [KEY_COMPACTED_PROPERTY]
    assert Holes.of(DeltaTable(str(replica / "topics" / "events")).metadata().configuration).anywhere
    assert verify(spark, settings, str(replica), max_lag_messages=0).ok
