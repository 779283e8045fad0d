"""The Delta log tail against real topic tables, checked against delta-rs's own reading."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from lakebroker.tables import delta
from lakebroker.tables.log_tail import CHECKPOINT_RECHECK_S, TopicLogTail
from lakebroker.tables.schemas import TOPIC_SCHEMA
from lakebroker.tables.settings import Settings
from tests.spark_pipeline.topics import create_topic, produce, settings_for, table


def delta_rs_rows(t: DeltaTable, partition: int, start: int, end: int) -> list[dict[str, object]]:
    t.update_incremental()
    rows = delta.read_rows(t, (pc.field("partition") == partition) & (pc.field("offset") >= start)
                           & (pc.field("offset") < end), TOPIC_SCHEMA.names)
    out: list[dict[str, object]] = rows.sort_by("offset").to_pylist()
    return out


def tail_rows(tail: TopicLogTail, partition: int, start: int, end: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = tail.read(partition, start, end).sort_by("offset").to_pylist()
    return out


def test_follows_appends_commit_by_commit_and_reads_only_the_files_in_range(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    create_topic(settings, "t", partitions=2)
    uri = str(table(settings, "t").table_uri)
    tail = TopicLogTail(uri)
    first = tail.refresh()
    assert tail.txn(delta.partition_app_id(0)) is None

    for _ in range(3):
        produce(settings, "t", 0, 10)
    produce(settings, "t", 1, 4)
    assert tail.refresh() == first + 4
    assert tail.txn(delta.partition_app_id(0)) == 30 and tail.txn(delta.partition_app_id(1)) == 4
    assert [(f.min_offset, f.max_offset) for f in tail.files(0, 12, 18)] == [(10, 19)]
    assert len(tail.files(0)) == 3 and len(tail.files(1)) == 1

    t = table(settings, "t")
    assert tail_rows(tail, 0, 5, 25) == delta_rs_rows(t, 0, 5, 25)
    assert [r["offset"] for r in tail_rows(tail, 0, 5, 25)] == list(range(5, 25))
    assert tail_rows(tail, 1, 0, 4) == delta_rs_rows(t, 1, 0, 4)
    assert tail.read(0, 30, 40).num_rows == 0


def test_a_rewrite_replaces_files_without_duplicating_rows(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    create_topic(settings, "t", partitions=1)
    uri = str(table(settings, "t").table_uri)
    for _ in range(4):
        produce(settings, "t", 0, 25)
    tail = TopicLogTail(uri)
    tail.refresh()
    assert len(tail.files(0)) == 4

    t = table(settings, "t")
    t.optimize.compact()  # remove x4, add x1, in one commit (what compaction does)
    produce(settings, "t", 0, 5)
    tail.refresh()
    assert len(tail.files(0)) == 2
    rows = tail_rows(tail, 0, 0, 105)
    assert [r["offset"] for r in rows] == list(range(105))
    assert rows == delta_rs_rows(t, 0, 0, 105)


def fallen_behind_a_cleaned_checkpoint(tmp_path: Path) -> tuple[Settings, TopicLogTail]:
    """A tail at 10 rows, then 30 more, a checkpoint and a log cleanup: the commit it needs next is gone."""
    settings = settings_for(tmp_path)
    create_topic(settings, "t", partitions=1)
    uri = str(table(settings, "t").table_uri)
    produce(settings, "t", 0, 10)
    tail = TopicLogTail(uri)
    behind = tail.refresh()
    for _ in range(3):
        produce(settings, "t", 0, 10)
    t = table(settings, "t")
    t.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    t.update_incremental()
    t.create_checkpoint()
    t.cleanup_metadata()
    assert not (Path(uri) / "_delta_log" / f"{behind + 1:020d}.json").exists()
    return settings, tail


def test_falling_behind_a_checkpoint_and_log_cleanup_rebuilds_from_delta(tmp_path: Path) -> None:
    settings, tail = fallen_behind_a_cleaned_checkpoint(tmp_path)
    produce(settings, "t", 0, 10)

    assert tail.refresh() == table(settings, "t").version()
    assert tail.txn(delta.partition_app_id(0)) == 50
    assert [r["offset"] for r in tail_rows(tail, 0, 0, 50)] == list(range(50))


def test_an_idle_poll_is_one_read_and_the_checkpoint_is_looked_at_every_30_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A delivery worker polls each topic several times a second: on S3 every read is a GET."""
    settings = settings_for(tmp_path)
    create_topic(settings, "t", partitions=1)
    uri = str(table(settings, "t").table_uri)
    produce(settings, "t", 0, 10)
    now = [0.0]
    tail = TopicLogTail(uri, clock=lambda: now[0])
    version = tail.refresh()
    reads: list[str] = []
    original = tail._read
    monkeypatch.setattr(tail, "_read", lambda relative: reads.append(relative) or original(relative))

    for _ in range(5):
        assert tail.refresh() == version
    checkpoint = "_delta_log/_last_checkpoint"
    assert reads.count(checkpoint) == 1  # the first idle poll looks; the next four only try the next commit
    assert len(reads) == 6
    now[0] += CHECKPOINT_RECHECK_S
    assert tail.refresh() == version
    assert reads.count(checkpoint) == 2

    produce(settings, "t", 0, 10)  # a new commit is read at the next poll, whenever the last look was
    assert tail.refresh() == version + 1
    assert tail.txn(delta.partition_app_id(0)) == 20


def test_a_torn_read_of_last_checkpoint_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On S3, pyarrow reads `_last_checkpoint` as a HEAD and a ranged GET: an overwrite in between
    gives its new bytes cut to the old size (seen on the local S3 server). Taken for "not behind",
    a tail whose next commit the log cleanup removed would notice only at the next look, 30 s on."""
    settings, tail = fallen_behind_a_cleaned_checkpoint(tmp_path)
    original = tail._read
    torn = [1]

    def read(relative: str) -> bytes:
        data = original(relative)
        if relative.endswith("_last_checkpoint") and torn[0]:
            torn[0] -= 1
            return data[: len(data) // 2]
        return data

    monkeypatch.setattr(tail, "_read", read)
    assert tail.refresh() == table(settings, "t").version(), "caught up at this poll, not 30 s later"
    assert torn == [0]


def test_no_table_yet_is_version_minus_one_and_no_rows(tmp_path: Path) -> None:
    tail = TopicLogTail(str(tmp_path / "missing"))
    assert tail.refresh() == -1
    assert tail.files(0) == []
    assert tail.txn(delta.partition_app_id(0)) is None
