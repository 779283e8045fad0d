"""`lakebroker.spark.read_topic_stream` on real local Spark: a streaming query reads topics while
their tables are written, compacted, trimmed by retention and key-compacted: every message it was
still given to read is read once, each partition in offset order, and its group's position follows
it to the log end; a query that fell behind retention reads on from what is left."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from fastapi.testclient import TestClient

from lakebroker.ingest_api.app import create_app
from lakebroker.spark import TableVersion, group_commits, read_topic_stream
from lakebroker.spark_pipeline.jobs import compaction, key_compaction, retention
from lakebroker.tables import storage
from lakebroker.tables.layout import Layout
from lakebroker.tables.offsets import OffsetReason, OffsetsTable, pull_group
from lakebroker.tables.settings import Settings
from tests.spark_pipeline.topics import NOW_US, create_topic, file_count, log_ends, produce, settings_for, table

HOUR_US = 3_600_000_000
IGNORE_MISSING_FILES = "spark.sql.files.ignoreMissingFiles"


class Collected:
    """What a query's micro-batches held: (batch id, partition, offset, value) rows."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, str | None]] = []
        self._lock = threading.Lock()

    def __call__(self, batch: Any, batch_id: int) -> None:
        got = [(batch_id, r["partition"], r["offset"], r["value"]) for r in batch.collect()]
        with self._lock:
            self.rows.extend(got)

    def offsets(self) -> dict[int, list[int]]:
        """Per partition, the offsets in the order the batches gave them (a batch sorted within)."""
        out: dict[int, list[int]] = defaultdict(list)
        for _, partition, offset, _ in sorted(self.rows):
            out[partition].append(offset)
        return dict(out)

    def wait(self, condition: Callable[[], bool], what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"not seen in {timeout}s: {what} (have {self.offsets()})"
            time.sleep(0.2)


def _start(spark: Any, settings: Settings, topic: str, group: str, checkpoint: Path, sink: Collected,
           **options: Any) -> Any:
    stream = read_topic_stream(spark, topic, group=group, settings=settings, **options)
    return stream.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint)) \
        .trigger(processingTime="300 milliseconds").start()


def _group(settings: Settings, group: str, topic: str) -> dict[int, int]:
    return OffsetsTable(Layout.of(settings)).of_topic(pull_group(group), topic)


def test_a_stream_reads_every_message_once_in_order_across_maintenance(spark: Any, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data")
    create_topic(settings, "events", partitions=2, retention_ms=3_600_000)
    create_topic(settings, "users", partitions=1, cleanup_policy="compact")
    old = NOW_US() - 2 * HOUR_US
    for _ in range(3):
        for p in (0, 1):
            produce(settings, "events", p, 10, ts_us=old)  # expired once read: retention removes them
    produce(settings, "users", 0, 6, keys=["a", "b", "a", "c", "b", "a"])
    events, users = Collected(), Collected()
    queries = [_start(spark, settings, "events", "analytics", tmp_path / "cp-events", events, starting="earliest"),
               _start(spark, settings, "users", "profiles", tmp_path / "cp-users", users, starting="earliest")]
    try:
        events.wait(lambda: sum(map(len, events.offsets().values())) == 60, "the first 60 events")
        users.wait(lambda: len(users.rows) == 6, "the first 6 users")
        assert file_count(settings, "events") == 6

        compaction.run(spark, settings, "events")  # rewrites the read files: nothing may come twice
        assert file_count(settings, "events") == 2
        produce(settings, "events", 0, 5)
        retention.run(spark, settings, "events")  # removes the 60 read (expired) ones
        key_compaction.run(spark, settings, "users")  # keeps c, b, a's newest: a rewrite with deletes
        for p in (0, 1):
            produce(settings, "events", p, 7)
        produce(settings, "users", 0, 2, keys=["d", "a"])

        events.wait(lambda: sum(map(len, events.offsets().values())) >= 60 + 5 + 14, "the events after maintenance")
        users.wait(lambda: len(users.rows) >= 8, "the users after key compaction")
        time.sleep(2)  # a few more batches: any row read twice would show now
        assert events.offsets() == {0: list(range(42)), 1: list(range(37))}, "once each, in offset order"
        assert sorted(o for _, _, o, _ in users.rows) == list(range(8))
        ends = {p: e for p, e in log_ends(settings, "events", 2).items() if e is not None}
        events.wait(lambda: _group(settings, "analytics", "events") == ends, "the group at the log end (lag 0)")
        users.wait(lambda: _group(settings, "profiles", "users") == {0: 8}, "the users group at the log end")
    finally:
        for q in queries:
            q.stop()
    with TestClient(create_app(settings)) as broker:  # the groups as the dashboard shows them: no lag
        groups = broker.get("/v1/dashboard").json()["groups"]
    lags = {(g["group"], g["topic"], g["partition"]): g["lag"] for g in groups}
    assert lags == {("analytics", "events", 0): 0, ("analytics", "events", 1): 0, ("profiles", "users", 0): 0}


def test_a_stream_behind_retention_reads_on_from_what_is_left(spark: Any, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data")
    create_topic(settings, "trail", partitions=1, retention_ms=3_600_000)
    old = NOW_US() - 2 * HOUR_US
    produce(settings, "trail", 0, 5, ts_us=old)  # 0-4: read, then expired
    first = Collected()
    query = _start(spark, settings, "trail", "late", tmp_path / "cp", first, starting="earliest")
    try:
        first.wait(lambda: len(first.rows) == 5, "the first 5")
    finally:
        query.stop()
    produce(settings, "trail", 0, 10, ts_us=old)  # 5-14: never read, expired
    produce(settings, "trail", 0, 3)  # 15-17
    trimmed = retention.run(spark, settings, "trail").tables[0]
    assert trimmed.files_before - trimmed.files_after == 2, "0-14 deleted, and vacuumed: retention 0 here"
    again = Collected()
    query = _start(spark, settings, "trail", "late", tmp_path / "cp", again)  # from its checkpoint
    try:
        again.wait(lambda: len(again.rows) >= 3, "what retention left")
        time.sleep(1)
        assert again.offsets() == {0: [15, 16, 17]}, "the expired 5-14 are gone, the query did not fail"
        again.wait(lambda: _group(settings, "late", "trail") == {0: 18}, "the group at the log end")
    finally:
        query.stop()


def test_a_stream_reads_past_a_deleted_file_and_the_sessions_setting_stays(spark: Any, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data")
    create_topic(settings, "swept", partitions=1)
    for _ in range(3):
        produce(settings, "swept", 0, 2)  # offsets 0-1, 2-3, 4-5: a file each
    log = table(settings, "swept")
    uri, newest = log.table_uri, log.version()
    middle = set(DeltaTable(uri, version=newest - 1).file_uris()) - set(DeltaTable(uri, version=newest - 2).file_uris())
    (gone,) = middle
    Path(gone.removeprefix("file://")).unlink()  # as a vacuum after retention, while the log still adds it
    spark.conf.set(IGNORE_MISSING_FILES, "false")
    sink = Collected()
    stream = read_topic_stream(spark, "swept", starting="earliest", settings=settings)
    stream.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "cp")) \
        .trigger(availableNow=True).start().awaitTermination(120)
    assert spark.conf.get(IGNORE_MISSING_FILES) == "false", "the caller's session keeps its own setting"
    assert sink.offsets() == {0: [0, 1, 4, 5]}, "the stream reads on past the deleted file"
    with pytest.raises(Exception, match=r"FILE_NOT_EXIST|does not exist"):
        spark.read.format("delta").load(storage.spark_uri(uri)).collect()  # the session's own reads still fail


def test_a_failed_group_commit_is_logged_counted_and_tried_again(spark: Any, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    settings = settings_for(tmp_path / "data")
    create_topic(settings, "unwritable", partitions=1)
    produce(settings, "unwritable", 0, 3)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError("the offsets table is not writable")

    monkeypatch.setattr(OffsetsTable, "commit", refuse)
    caplog.set_level(logging.INFO, logger="lakebroker.spark_pipeline.topic_streams")
    sink = Collected()
    stream = read_topic_stream(spark, "unwritable", starting="earliest", group="auditors", settings=settings)
    stream.sparkSession.conf.set("spark.sql.streaming.noDataProgressEventInterval", "200")  # idle events, quickly
    query = stream.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "cp")) \
        .trigger(processingTime="300 milliseconds").start()
    try:
        # Counted, then logged (after the count's lock): wait for both.
        sink.wait(lambda: group_commits(spark, "unwritable").failures >= 1
                  and any(r.levelno == logging.ERROR for r in caplog.records), "a failed commit counted and logged")
        failing = group_commits(spark, "unwritable")
        assert (failing.group, failing.committed, failing.pending, failing.commits) == ("auditors", {}, {0: 3}, 0)
        assert failing.last_error == "OSError: the offsets table is not writable"
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert errors and "group 'auditors' could not commit its position {0: 3} on topic 'unwritable'" in \
            errors[0].getMessage()
        assert _group(settings, "auditors", "unwritable") == {}
        assert sink.offsets() == {0: [0, 1, 2]}, "the query itself goes on"

        monkeypatch.undo()  # writable again: the idle query commits what is pending, with no new batch
        sink.wait(lambda: _group(settings, "auditors", "unwritable") == {0: 3}, "the pending position committed")
        recovered = group_commits(stream.sparkSession, "unwritable")
        assert (recovered.committed, recovered.pending, recovered.commits) == ({0: 3}, {}, 1)
        assert recovered.last_error is None and recovered.failures >= failing.failures
        assert any("committed its position on topic 'unwritable' again" in r.getMessage() for r in caplog.records)
    finally:
        query.stop()
    with pytest.raises(ValueError, match="no stream of topic 'nothing' with a group"):
        group_commits(spark, "nothing")


def test_starting_positions_and_a_groups_position(spark: Any, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data")
    create_topic(settings, "pos", partitions=2)
    for p in (0, 1):
        produce(settings, "pos", p, 4)
    version = log_ends(settings, "pos", 2)
    assert version == {0: 4, 1: 4}
    at = table(settings, "pos").version()
    for p in (0, 1):
        produce(settings, "pos", p, 2)

    def read(checkpoint: str, **options: Any) -> dict[int, list[int]]:
        sink = Collected()
        stream = read_topic_stream(spark, "pos", settings=settings, **options)
        stream.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / checkpoint)) \
            .trigger(availableNow=True).start().awaitTermination(120)
        return sink.offsets()

    assert read("a", starting="earliest") == {0: list(range(6)), 1: list(range(6))}
    assert read("b", starting={0: 5}) == {0: [5], 1: list(range(6))}
    assert read("c", starting=TableVersion(at)) == {0: [4, 5], 1: [4, 5]}
    assert read("d") == {}, "latest: only what comes after the query starts"
    OffsetsTable(Layout.of(settings)).commit(pull_group("seeker"), "pos", {0: 3, 1: 5}, OffsetReason.SEEK)
    assert read("e", group="seeker") == {0: [3, 4, 5], 1: [5]}, "a group's position wins over starting"
    with pytest.raises(ValueError, match="one group per topic"):
        read_topic_stream(spark, "pos", settings=settings, group="another")


def test_the_analysts_guide_streaming_example_runs(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "analysts.md").read_text()
    (code,) = [b.split("```", 1)[0] for b in guide.split("```python\n")[1:] if "read_topic_stream(" in b]
    monkeypatch.chdir(tmp_path)  # the example's paths and settings are relative: ./data
    monkeypatch.delenv("LAKEBROKER_DATA_DIR", raising=False)
    settings = settings_for(Path("data"))
    create_topic(settings, "orders", partitions=2)
    for p in (0, 1):
        produce(settings, "orders", p, 3, values=[b'{"total": 1.5}'] * 3)
    output = tmp_path / "order_totals"
    exec(compile(code, "docs/analysts.md", "exec"), {"spark": spark, "output_dir": str(output),
                                                      "checkpoint_dir": str(tmp_path / "checkpoint")})
    out = spark.read.format("delta").load(str(output)).collect()
    assert sorted((r["partition"], r["offset"], r["total"]) for r in out) == [
        (p, o, "1.5") for p in (0, 1) for o in range(3)]
    deadline = time.monotonic() + 30
    while _group(settings, "order-analytics", "orders") != {0: 3, 1: 3}:
        assert time.monotonic() < deadline, _group(settings, "order-analytics", "orders")
        time.sleep(0.2)
