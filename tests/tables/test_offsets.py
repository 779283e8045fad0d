"""Consumer offsets on real Delta tables: the newest position is decided by the writer's lease
epoch, then commit order (never a wall clock), and belongs to one incarnation of a topic."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.offsets import Fence, OffsetReason, OffsetsTable
from lakebroker.tables.schemas import OFFSETS_SCHEMA, OFFSETS_SCHEMA_VERSION, SCHEMA_VERSION_PROPERTY
from lakebroker.tables.topics import TopicStore, new_topic


def test_a_commit_from_an_older_lease_never_wins_over_a_newer_owner(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    topic = TopicStore(layout).create(new_topic("t", 1))
    offsets = OffsetsTable(layout)
    offsets.commit("g", "t", {0: 10}, OffsetReason.ACK, fence=Fence(topic.topic_id, 2))  # the new owner
    offsets.commit("g", "t", {0: 5}, OffsetReason.ACK, fence=Fence(topic.topic_id, 1))  # a late, stale worker
    assert offsets.latest("g") == {("g", "t", 0): (10, "ack")}
    offsets.commit("g", "t", {0: 11}, OffsetReason.ACK, fence=Fence(topic.topic_id, 2))  # same owner: newest wins
    assert offsets.latest("g")[("g", "t", 0)] == (11, "ack")


def test_administrative_commits_outrank_stale_workers_and_yield_to_the_owner(tmp_path: Path) -> None:
    """A commit without a lease (retention skip, seek, pull group) takes the highest epoch known for
    the partition, from the leases table or the offsets: no older owner can undo it, and the
    current or any later owner moves on from it."""
    layout = Layout(tmp_path)
    topic = TopicStore(layout).create(new_topic("t", 1))
    offsets = OffsetsTable(layout)
    offsets.commit("g", "t", {0: 10}, OffsetReason.ACK, fence=Fence(topic.topic_id, 2))
    offsets.commit("g", "t", {0: 40}, OffsetReason.RETENTION_SKIP)
    assert offsets.latest("g")[("g", "t", 0)] == (40, "retention-skip")
    offsets.commit("g", "t", {0: 12}, OffsetReason.ACK, fence=Fence(topic.topic_id, 1))  # stale: ignored
    assert offsets.latest("g")[("g", "t", 0)] == (40, "retention-skip")
    offsets.commit("g", "t", {0: 41}, OffsetReason.ACK, fence=Fence(topic.topic_id, 2))  # the owner moves on
    assert offsets.latest("g")[("g", "t", 0)] == (41, "ack")
    offsets.commit("g", "t", {0: 50}, OffsetReason.ACK, fence=Fence(topic.topic_id, 3))  # a later owner
    assert offsets.latest("g")[("g", "t", 0)] == (50, "ack")
    assert offsets.positions("g")[("g", "t", 0)].epoch == 3


def test_a_recreated_topic_does_not_inherit_the_deleted_ones_offsets(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    topics = TopicStore(layout)
    topics.create(new_topic("t", 2))
    offsets = OffsetsTable(layout)
    offsets.commit("g", "t", {0: 7, 1: 3}, OffsetReason.ACK)
    assert offsets.latest("g") == {("g", "t", 0): (7, "ack"), ("g", "t", 1): (3, "ack")}
    topics.delete("t")
    topics.create(new_topic("t", 2))
    assert offsets.latest("g") == {}, "the new topic's group would start mid-log"
    offsets.commit("g", "t", {1: 1}, OffsetReason.ACK)
    assert OffsetsTable(layout).latest() == {("g", "t", 1): (1, "ack")}


def test_a_version_1_offsets_table_is_migrated_and_keeps_its_positions(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    TopicStore(layout).create(new_topic("t", 1))
    v1 = pa.schema([f for f in OFFSETS_SCHEMA if f.name not in ("topic_id", "epoch", "seq")])
    legacy = delta.ensure_table(layout.offsets_table, v1, partition_by=None, version=1)
    write_deltalake(legacy, pa.table({"group": ["g", "g"], "topic": ["t", "t"],
                                      "partition": pa.array([0, 0], pa.int32()), "offset": pa.array([4, 9], pa.int64()),
                                      "committed_at": pa.array([datetime.now(UTC)] * 2, pa.timestamp("us", tz="UTC")),
                                      "reason": ["ack", "ack"]}, schema=v1).slice(1), mode="append")
    offsets = OffsetsTable(layout)
    assert offsets.latest("g") == {("g", "t", 0): (9, "ack")}  # written after the topic was created: kept
    offsets.commit("g", "t", {0: 12}, OffsetReason.ACK)
    assert offsets.latest("g") == {("g", "t", 0): (12, "ack")}
    table = DeltaTable(layout.offsets_table)
    assert table.metadata().configuration[SCHEMA_VERSION_PROPERTY] == str(OFFSETS_SCHEMA_VERSION) == "2"
    assert {"topic_id", "epoch", "seq"} <= {f.name for f in table.schema().fields}


def test_a_retention_skip_never_moves_a_position_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention reads the positions (the group at 3, below the new log start 5); the worker then
    commits 8; retention commits its skip to 5. With the same epoch and a higher seq, the skip won
    and the group went back to 5: offsets 5-7 delivered twice. A skip only moves a position forward,
    judged on the snapshot it commits on."""
    from lakebroker.spark_pipeline.jobs import retention

    layout = Layout(tmp_path)
    topic = TopicStore(layout).create(new_topic("t", 1))
    offsets = OffsetsTable(layout)
    offsets.commit("g", "t", {0: 3}, OffsetReason.ACK, fence=Fence(topic.topic_id, 1))
    real_latest = OffsetsTable.latest

    def read_then_the_worker_commits(self: OffsetsTable, group: str | None = None) -> Any:
        seen = real_latest(self, group)
        OffsetsTable(layout).commit("g", "t", {0: 8}, OffsetReason.ACK, fence=Fence(topic.topic_id, 1))
        return seen

    monkeypatch.setattr(OffsetsTable, "latest", read_then_the_worker_commits)
    skips = retention.forward_lagging_groups(layout, topic, {0: 5}, run_id="r1")
    monkeypatch.setattr(OffsetsTable, "latest", real_latest)
    assert [(s.from_offset, s.to_offset) for s in skips] == [(3, 5)]  # what retention saw
    assert OffsetsTable(layout).latest("g") == {("g", "t", 0): (8, "ack")}
    # still a skip where the group is behind when it commits
    offsets.commit("g", "t", {0: 2}, OffsetReason.SEEK)
    retention.forward_lagging_groups(layout, topic, {0: 5}, run_id="r2")
    assert OffsetsTable(layout).latest("g") == {("g", "t", 0): (5, "retention-skip")}
