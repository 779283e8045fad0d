"""A worker's pipelines on one topic table share its log tail (delivery_worker/source.py)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from lakebroker.delivery_worker.source import LogTails, PartitionSource
from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import TOPIC_SCHEMA
from tests.file_reads import ReadRecorder
from tests.spark_pipeline.topics import create_topic, produce, settings_for


def test_partitions_share_one_tail_and_see_each_others_refreshes_without_io(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    layout = Layout.of(settings)
    topic = create_topic(settings, "t", partitions=2)
    tails = LogTails()
    uri = layout.topic_table("t")
    p0 = PartitionSource(layout, topic, 0, tails.get(uri, topic.topic_id))
    p1 = PartitionSource(layout, topic, 1, tails.get(uri, topic.topic_id))
    assert p0.tail is p1.tail

    assert p0.committed_end() == 0 and p1.committed_end() == 0
    produce(settings, "t", 0, 7)
    produce(settings, "t", 1, 3)
    assert p0.committed_end() == 7  # one refresh, by partition 0's pipeline, reads both new commits ...
    assert p1.known_committed_end(within_s=60) == 3  # ... and tells partition 1 its log end with no I/O
    assert p1.known_committed_end(within_s=0) is None  # older than the caller's poll interval: look again
    rows, end = p1.read(0, 3)
    assert [r["offset"] for r in rows] == [0, 1, 2] and end == 3

    produce(settings, "t", 1, 2)
    assert p1.committed_end() == 5 and p0.known_committed_end(within_s=60) == 7

    # A re-created topic (a new id) gets its own tail; tails no pipeline reads are dropped.
    assert tails.get(uri, "another-id") is not p0.tail
    tails.retain({(uri, topic.topic_id)})
    assert tails.get(uri, topic.topic_id) is p0.tail
    assert time.monotonic() - p0.tail.refreshed_at < 60


def test_a_read_decodes_without_holding_the_tail(tmp_path: Path) -> None:
    """The other pipelines on the table look for new commits while one pipeline's read decodes."""
    settings = settings_for(tmp_path)
    layout = Layout.of(settings)
    topic = create_topic(settings, "t", partitions=1)
    produce(settings, "t", 0, 50)
    source = PartitionSource(layout, topic, 0, LogTails().get(layout.topic_table("t"), topic.topic_id))
    assert source.committed_end() == 50
    reading, go_on = threading.Event(), threading.Event()

    def pause() -> None:
        reading.set()
        assert go_on.wait(30)

    recorder = ReadRecorder(source.tail._tail.fs, before_read=pause)
    source.tail._tail.fs = recorder.filesystem()
    result: list[tuple[list[dict[str, Any]], int]] = []
    reader = threading.Thread(target=lambda: result.append(source.read(10, 20)))
    reader.start()
    try:
        assert reading.wait(30)
        assert source.known_committed_end(within_s=60) == 50  # None while the read held the tail
    finally:
        go_on.set()
        reader.join(30)
    [(rows, end)] = result
    assert [r["offset"] for r in rows] == list(range(10, 20)) and end == 20


def test_rows_come_in_offset_order_whatever_order_the_index_holds_the_files_in(tmp_path: Path) -> None:
    """A rewrite's file joins the index after newer files: the read still hands rows over in order."""
    settings = settings_for(tmp_path)
    layout = Layout.of(settings)
    topic = create_topic(settings, "t", partitions=1)
    for _ in range(3):
        produce(settings, "t", 0, 10, values=[os.urandom(64) for _ in range(10)])
    source = PartitionSource(layout, topic, 0)
    assert source.committed_end() == 30
    index = source.tail._tail
    index._files = dict(sorted(index._files.items(), key=lambda item: -(item[1].min_offset or 0)))  # newest first
    assert [f.min_offset for f in index.files(0)] == [20, 10, 0]
    rows, end = source.read(0, 30)
    assert [r["offset"] for r in rows] == list(range(30)) and end == 30
    assert [r["value"] for r in rows] == [r["value"] for r in sorted(rows, key=lambda r: r["offset"])]
    assert list(rows[0]) == TOPIC_SCHEMA.names  # the columns in the table's order, as before
