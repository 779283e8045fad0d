"""The pull-consume read (`GET /v1/topics/{t}/partitions/{p}/messages`) beside the maintenance jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api import reader
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import new_topic
from tests.spark_pipeline.topics import create_topic, produce, settings_for


async def test_a_retention_commit_during_a_read_gives_no_false_gap(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention deletes offsets 0-4 between the read's look at the log start and its read of the
    rows. Read from two snapshots, offsets 0-4 were still the log but no longer in the rows: a 500
    `offset_gap`. Read from one, the answer is that snapshot's rows 0-9."""
    broker = Broker(Settings(data_dir=tmp_path / "data", flush_interval_ms=20), IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        topic = await broker.create_topic(new_topic("t", 1))
        await broker.local.produce("t", [NewMessage(value=b"v%d" % i, partition=0) for i in range(10)], AckMode.TABLE)
        uri = broker.layout.topic_table("t")
        real = reader.partition_logs

        def then_retention_deletes(table: Any, partitions: int) -> Any:
            logs = real(table, partitions)
            current = delta.open_table(uri)
            assert current is not None
            current.delete("\"partition\" = 0 AND \"offset\" < 5")  # the retention job's commit
            return logs

        monkeypatch.setattr(reader, "partition_logs", then_retention_deletes)
        read = reader.read_messages(broker.layout, topic, 0, 0, 100, committed_end=10)
        assert [m["offset"] for m in read["messages"]] == list(range(10))
        assert read["log_start_offset"] == 0 and read["next_offset"] == 10
        monkeypatch.setattr(reader, "partition_logs", real)
        after = reader.read_messages(broker.layout, topic, 0, 5, 100, committed_end=10)
        assert after["log_start_offset"] == 5 and [m["offset"] for m in after["messages"]] == list(range(5, 10))
    finally:
        await broker.stop()


async def test_serve_marks_a_compact_topics_table_an_older_broker_left_unmarked(tmp_path: Path) -> None:
    """Tables of compact topics made before the keyCompacted mark hold key compaction's holes without
    it: serve's start marks them, so a pull read passes those holes instead of answering 500."""
    from dataclasses import replace

    from lakebroker.tables.topics import CleanupPolicy, TopicStore, _to_row

    settings = Settings(data_dir=tmp_path / "data", flush_interval_ms=20)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    await broker.create_topic(new_topic("t", 1))  # an unmarked table, as an older broker made them
    await broker.local.produce("t", [NewMessage(value=b"v%d" % i, partition=0) for i in range(6)], AckMode.TABLE)
    await broker.stop()
    store = TopicStore(broker.layout)
    topic = replace(store.get("t"), cleanup_policy=CleanupPolicy.COMPACT)
    store._table.mutate(lambda rows: ([_to_row(topic)], topic))  # compact in the older broker's config
    table = delta.open_table(broker.layout.topic_table("t"))
    assert table is not None
    table.delete("\"partition\" = 0 AND \"offset\" IN (2, 3)")  # key compaction's removals
    again = Broker(settings, IngestMetrics(CollectorRegistry()))
    await again.start()
    try:
        read = reader.read_messages(again.layout, topic, 0, 0, 100, committed_end=6)
        assert [m["offset"] for m in read["messages"]] == [0, 1, 4, 5]
    finally:
        await again.stop()


def test_a_seek_to_a_moment_finds_a_message_within_the_millisecond_after_its_files_logged_end(tmp_path: Path) -> None:
    """The flusher logs a file's timestamp bounds truncated to the millisecond, as delta-rs does (a
    file whose last message was appended at .0095 says it ends at .009), and relies on delta-rs's
    reader to widen them by a millisecond: a seek to .0092 must find that message, not skip its
    file for the next one."""
    settings = settings_for(tmp_path)
    topic = create_topic(settings, "t", partitions=1)
    base = 1_795_909_900_000_000
    produce(settings, "t", 0, 2, ts_us=[base, base + 9_500])  # offsets 0-1, logged as ending at .009
    produce(settings, "t", 0, 1, ts_us=base + 1_000_000)  # offset 2, a second later
    layout = Layout.of(settings)
    assert reader.offset_for_timestamp(layout, topic, 0, base + 9_200) == 1
    assert reader.offset_for_timestamp(layout, topic, 0, base + 9_501) == 2
    assert reader.offset_for_timestamp(layout, topic, 0, base + 1_000_001) is None
