"""`lakebroker.spark.write_to_topic` and `topic_sink` on real local Spark against a real broker
process: every row stored once, with dense offsets, when Spark runs a task again after it failed
mid-send and when a streaming query restarts between sending a batch and committing it."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from deltalake import DeltaTable

from lakebroker.spark import Published, topic_sink, write_to_topic
from lakebroker.tables.layout import Layout
from lakebroker.tables.topics import TopicStore
from tests.servers import ServerProcess

PARTITIONS = 4


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("writes") / "data", env={"LAKEBROKER_FLUSH_INTERVAL_MS": "50"})
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _topic(broker: ServerProcess, name: str) -> None:
    r = httpx.post(f"{broker.url}/v1/topics", json={"name": name, "partitions": PARTITIONS})
    assert r.status_code == 201, r.text


def _stored(broker: ServerProcess, name: str) -> list[dict[str, Any]]:
    layout = Layout(broker.data_dir)
    table = DeltaTable(layout.topic_table(TopicStore(layout).get(name)))
    return table.to_pyarrow_table(columns=["partition", "offset", "key", "value", "message_id"]).to_pylist()


def _assert_once_and_dense(rows: list[dict[str, Any]], expected_values: set[bytes]) -> None:
    values = [bytes(r["value"]) for r in rows]
    assert len(values) == len(set(values)), "a row stored twice"
    assert set(values) == expected_values
    by_partition: dict[int, list[int]] = defaultdict(list)
    for r in rows:
        by_partition[r["partition"]].append(r["offset"])
    for partition, offsets in by_partition.items():
        assert sorted(offsets) == list(range(len(offsets))), f"partition {partition}: offsets not dense"


def test_a_task_that_fails_mid_send_is_run_again_and_every_row_is_stored_once(spark: Any,
                                                                               broker: ServerProcess) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    _topic(broker, "published")
    rows, tasks = 100_000, 8
    per_task = rows // tasks

    def fail_once(n: int) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        # Task 3's first attempt dies after its first 9,000 rows went out in batches of 1,000.
        if context is not None and context.partitionId() == 3 and context.attemptNumber() == 0 \
                and n == 3 * per_task + 9_000:
            raise RuntimeError("injected failure in the middle of a send")
        return f"row-{n}"

    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    try:
        df = spark.range(0, rows, numPartitions=tasks) \
            .withColumn("value", F.udf(fail_once, StringType())("id")) \
            .withColumn("key", F.concat(F.lit("user-"), (F.col("id") % 100).cast("string")))
        published = write_to_topic(df, "published", key="key", broker_url=broker.url, ack="table")
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)

    assert published.messages == rows, "the retried task's answers count; the failed attempt's do not"
    assert published.duplicates >= 1_000, f"the failed attempt had sent rows before it died: {published}"
    stored = _stored(broker, "published")
    _assert_once_and_dense(stored, {f"row-{n}".encode() for n in range(rows)})
    # Kafka's partitioner by key, and within a task a key's rows in the order the task sent them.
    keyed: dict[tuple[str, int], list[tuple[int, int, int]]] = defaultdict(list)
    for r in stored:
        n = int(bytes(r["value"]).decode().removeprefix("row-"))
        keyed[(r["key"], n // per_task)].append((r["partition"], r["offset"], n))
    for (key, task), placed in keyed.items():
        assert len({p for p, _, _ in placed}) == 1, f"key {key} in two partitions"
        assert [n for _, _, n in sorted(placed)] == sorted(n for _, _, n in placed), (key, task)


def test_the_same_write_id_run_again_stores_nothing_twice(spark: Any, broker: ServerProcess) -> None:
    _topic(broker, "rerun")
    df = spark.createDataFrame([(f"v{i}".encode(),) for i in range(500)], "value binary").repartition(3)
    first = write_to_topic(df, "rerun", broker_url=broker.url, write_id="nightly-2026-11-27", ack="table")
    again = write_to_topic(df, "rerun", broker_url=broker.url, write_id="nightly-2026-11-27", ack="table")
    assert first == Published(500, 0) and again == Published(500, 500)
    _assert_once_and_dense(_stored(broker, "rerun"), {f"v{i}".encode() for i in range(500)})


def test_a_rerun_larger_than_the_dedup_index_stores_nothing_twice(spark: Any, tmp_path: Path) -> None:
    # The index holds 1,000 ids: a 5,000-row write's first 4,000 are forgotten by the time it ends.
    small = ServerProcess(tmp_path / "data", env={"LAKEBROKER_FLUSH_INTERVAL_MS": "50",
                                                  "LAKEBROKER_DEDUP_MAX_ENTRIES": "1000"})
    small.start()
    try:
        _topic(small, "big-rerun")
        df = spark.createDataFrame([(f"v{i}".encode(),) for i in range(5_000)], "value binary").repartition(2)
        first = write_to_topic(df, "big-rerun", broker_url=small.url, write_id="backfill-2026-12", ack="table")
        again = write_to_topic(df, "big-rerun", broker_url=small.url, write_id="backfill-2026-12", ack="table")
        stored = _stored(small, "big-rerun")
    finally:
        small.stop()
    assert len(stored) == 5_000, f"{len(stored)} rows stored for a 5,000-row write run twice"
    assert first == Published(5_000, 0) and again == Published(5_000, 5_000)
    _assert_once_and_dense(stored, {f"v{i}".encode() for i in range(5_000)})


def test_an_id_column_makes_rows_their_own_ids(spark: Any, broker: ServerProcess) -> None:
    _topic(broker, "by-id")
    df = spark.createDataFrame([(f"order-{i % 50}", f"v{i % 50}") for i in range(200)], "order string, body string")
    published = write_to_topic(df, "by-id", value="body", id="order", broker_url=broker.url, ack="table")
    assert published == Published(200, 150)
    rows = _stored(broker, "by-id")
    assert sorted(r["message_id"] for r in rows) == sorted(f"order-{i}" for i in range(50))


def test_a_null_id_is_refused_before_its_batch_is_sent(spark: Any, broker: ServerProcess) -> None:
    _topic(broker, "null-ids")
    df = spark.createDataFrame([("order-1", "a"), (None, "b"), ("order-3", "c")], "order string, body string") \
        .coalesce(1)
    with pytest.raises(Exception, match=r"row 1 of Spark partition 0 has a null id \(column 'order'\)"):
        write_to_topic(df, "null-ids", value="body", id="order", broker_url=broker.url, ack="table")
    assert _stored(broker, "null-ids") == [], "a row without an id would be stored again by a re-run"


def test_bad_arguments_are_refused_before_anything_is_sent(spark: Any, broker: ServerProcess) -> None:
    df = spark.createDataFrame([("a",)], "payload string")
    with pytest.raises(ValueError, match="no column 'value'"):
        write_to_topic(df, "nowhere", broker_url=broker.url)
    with pytest.raises(ValueError, match="ack must be"):
        write_to_topic(df, "nowhere", value="payload", broker_url=broker.url, ack="disk")
    with pytest.raises(Exception, match="does not exist"):
        write_to_topic(df, "nowhere", value="payload", broker_url=broker.url)


def test_a_query_restarted_between_sending_a_batch_and_committing_it_stores_it_once(
        spark: Any, broker: ServerProcess, tmp_path: Path) -> None:
    _topic(broker, "streamed")
    source = tmp_path / "source"
    for f in range(6):
        spark.createDataFrame([(f"file{f}-row{i}",) for i in range(1_000)], "value string") \
            .coalesce(1).write.parquet(str(source / f"f{f}"))
    checkpoint = str(tmp_path / "checkpoint")
    sink = topic_sink("streamed", broker_url=broker.url, ack="table")
    crashed: list[int] = []

    def crash_once_after_sending(batch: Any, batch_id: int) -> None:
        sink(batch, batch_id)
        if batch_id == 2 and not crashed:
            crashed.append(batch_id)
            raise RuntimeError("the query dies after sending batch 2, before its commit")

    def run() -> None:
        stream = spark.readStream.schema("value string").option("maxFilesPerTrigger", 1) \
            .option("recursiveFileLookup", "true").parquet(str(source))
        query = stream.writeStream.foreachBatch(crash_once_after_sending) \
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        query.awaitTermination(300)

    with pytest.raises(Exception, match="batch 2"):
        run()
    assert crashed == [2]
    run()  # from the checkpoint: batch 2 again, under the same query id
    _assert_once_and_dense(_stored(broker, "streamed"),
                           {f"file{f}-row{i}".encode() for f in range(6) for i in range(1_000)})


def test_the_analysts_guide_example_publishes_a_frame_and_a_stream(spark: Any, broker: ServerProcess,
                                                                  tmp_path: Path) -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "analysts.md").read_text()
    (code,) = [b.split("```", 1)[0] for b in guide.split("```python\n")[1:] if "write_to_topic(" in b]
    _topic(broker, "daily-totals")
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    (incoming / "a.json").write_text('{"customer": "carol", "total": "3.10"}\n{"customer": "dave", "total": "9"}\n')
    namespace: dict[str, Any] = {"spark": spark, "broker_url": broker.url, "incoming_dir": str(incoming),
                                 "checkpoint_dir": str(tmp_path / "checkpoint")}
    exec(compile(code, "docs/analysts.md", "exec"), namespace)
    assert namespace["published"] == Published(2, 0)
    deadline = time.monotonic() + 30
    while len(rows := _stored(broker, "daily-totals")) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)  # the stream's batches went at ack=wal
    assert sorted((r["key"], bytes(r["value"])) for r in rows) == [
        ("alice", b"42.50"), ("bob", b"7.00"), ("carol", b"3.10"), ("dave", b"9")]
