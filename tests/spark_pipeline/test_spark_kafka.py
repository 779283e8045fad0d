"""Spark's own Kafka connector (spark-sql-kafka-0-10 for this pyspark, fetched by `make setup` into
.cache/kafka/spark-connector) against the Kafka listener of a real `serve`: docs/kafka.md's stream
reads a topic produced over HTTP, with its keys, values, headers, partitions and offsets, and
batch writes publish to topics that the HTTP API then reads back. And records a Kafka client
produced reach a webhook, signed, and Spark SQL over the topic's table."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from examples.receiver import create_app
from lakebroker.ingest_api.partitioner import partition_for_key
from lakebroker.spark import read_topic
from lakebroker.tables.settings import Settings
from tests.markdown_blocks import code_blocks
from tests.servers import REPO, AppThread, ServerProcess, create_topic, serving, stored_messages, until

pytestmark = [pytest.mark.timeout(300)]

CONNECTOR = REPO / ".cache" / "kafka" / "spark-connector"
ME = "tests/spark_pipeline/test_spark_kafka.py"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {"LAKEBROKER_FLUSH_INTERVAL_MS": "50", "LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "true"}
    with serving(tmp_path_factory.mktemp("spark-kafka") / "data", env) as node:
        yield node


@pytest.fixture(scope="module")
def kafka_spark(spark: Any) -> Any:
    """The shared session with the connector's jars added (as `--jars` would add them)."""
    jars = sorted(CONNECTOR.glob("*.jar"))
    assert any(j.name.startswith("spark-sql-kafka-0-10_2.13-") for j in jars), f"{CONNECTOR}: run make setup"
    for jar in jars:
        spark.sql(f"ADD JAR '{jar}'")
    return spark


def test_the_guide_s_stream_reads_what_http_produced_and_its_write_publishes(
        kafka_spark: Any, server: ServerProcess, tmp_path: Path) -> None:
    """docs/kafka.md's example, as written there: the stream reads every record HTTP produced, at its
    partition and offset, with its headers; the write's record lands in the table."""
    create_topic(server, "orders", 3)
    sent = [{"key": f"user-{i}", "value": f"order {i}", "headers": {"n": str(i)}} for i in range(30)]
    r = httpx.post(f"{server.url}/v1/topics/orders/batch", params={"ack": "table"}, json={"messages": sent},
                   timeout=30)
    assert r.status_code == 200, r.text
    placed = {m["key"]: (res["partition"], res["offset"]) for m, res in zip(sent, r.json()["results"], strict=True)}

    [block] = [b for b in code_blocks(REPO / "docs" / "kafka.md") if b.tested_by == ME]
    exec(compile(block.text.replace("127.0.0.1:9092", server.kafka), "docs/kafka.md", "exec"),
         {"spark": kafka_spark, "checkpoint": str(tmp_path / "checkpoint")})

    rows = kafka_spark.sql("SELECT CAST(key AS STRING) key, CAST(value AS STRING) value, topic, partition, offset, "
                           "headers FROM orders_from_kafka").collect()
    assert len(rows) == len(sent)
    for row in rows:
        assert (row.partition, row.offset) == placed[row.key], row
        assert row.partition == partition_for_key(row.key, 3)
        assert row.value == f"order {row.key.removeprefix('user-')}"
        assert [(h.key, bytes(h.value).decode()) for h in row.headers] == [("n", row.key.removeprefix("user-"))]
        assert row.topic == "orders"
    partition = partition_for_key("user-7", 3)
    until(lambda: len(stored_messages(server, "orders", partition)) == sum(
        1 for p, _ in placed.values() if p == partition) + 1, "the written record in the table", timeout=30)
    last = stored_messages(server, "orders", partition)[-1]
    assert (last["key"], _text(last)) == ("user-7", '{"amount": 42}')


def test_a_batch_write_publishes_to_a_topic(kafka_spark: Any, server: ServerProcess) -> None:
    create_topic(server, "from-spark", 2)
    frame = kafka_spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(40)], ["key", "value"])
    frame.write.format("kafka").option("kafka.bootstrap.servers", server.kafka).option("topic", "from-spark").save()
    until(lambda: sum(len(stored_messages(server, "from-spark", p)) for p in range(2)) == 40,
          "the 40 rows in the table", timeout=30)
    for p in range(2):
        for m in stored_messages(server, "from-spark", p):
            assert p == partition_for_key(m["key"], 2), m
            assert m["value_b64"] is not None and m["key"].removeprefix("k") == _text(m).removeprefix("v")


def _text(message: dict[str, Any]) -> str:
    return base64.b64decode(message["value_b64"]).decode()


def test_records_a_kafka_client_produced_reach_a_webhook_and_spark_sql(spark: Any, server: ServerProcess) -> None:
    create_topic(server, "kafka-made", 2)
    producer = Producer({"bootstrap.servers": server.kafka, "enable.idempotence": True, "acks": "all",
                         "partitioner": "murmur2_random", "compression.type": "zstd"})
    placed: dict[tuple[int, int], str] = {}

    def report(err: Any, msg: Any) -> None:
        assert err is None, err
        placed[(msg.partition(), msg.offset())] = msg.key().decode()

    for i in range(20):
        producer.produce("kafka-made", key=f"user-{i}", value=f'{{"n": {i}}}'.encode(),
                         headers=[("source", b"kafka")], on_delivery=report)
    assert producer.flush(60) == 0 and len(placed) == 20

    secret = "whsec_" + base64.b64encode(b"k" * 24).decode()
    receiver = AppThread(create_app(secret))
    receiver.start()
    try:
        r = httpx.post(f"{server.url}/v1/subscriptions", timeout=30, json={
            "name": "kafka-made-hook", "topic": "kafka-made", "url": receiver.url + "/hook", "start": "earliest",
            "secret": secret, "retry_schedule_s": [0.2]})
        assert r.status_code == 201, r.text
        delivered = receiver.server.config.app.state.deliveries  # verified by the receiver's WebhookDependency

        until(lambda: sum(len(d.messages) for d in delivered) >= 20, "20 signed deliveries", timeout=60)
        got = {(m.partition, m.offset): m for d in delivered for m in d.messages}
        assert {k: m.key for k, m in got.items()} == placed
        assert all(m.data == f'{{"n": {m.key.removeprefix("user-")}}}'.encode() for m in got.values())
        assert all(m.headers == {"source": "kafka"} for m in got.values())
    finally:
        receiver.stop()

    read_topic(spark, "kafka-made", settings=Settings(data_dir=server.data_dir)).createOrReplaceTempView("kafka_made")
    rows = spark.sql("SELECT partition, offset, key, CAST(value_bytes AS STRING) AS value, headers['source'] AS source "
                     "FROM kafka_made ORDER BY partition, offset").collect()
    assert {(r.partition, r.offset): r.key for r in rows} == placed
    assert all(r.source == "kafka" and r.value == f'{{"n": {r.key.removeprefix("user-")}}}' for r in rows)
